"""Which torso reads which observations: net.torso=auto's choice and the checks config validation makes.
Free of torch, so that validating a config (the launcher, the bandit) does not import it."""

from __future__ import annotations

TORSO_NAMES = ("small", "deep", "minatar", "mlp")   # lbc.nets.TORSOS holds their classes
MIN_CONV_IMAGE = 36       # the small and deep torsos' convolutions need at least 36x36 pixels
MAX_MLP_INPUTS = 4096     # beyond, flattening is the wrong torso (an Atari stack is 28,224 values)


def resolve_torso(torso: str, obs_shape: tuple[int, ...]) -> str:
    """net.torso=auto picks by the observation: an MLP for vectors, MinAtar's conv for small boards, IMPALA's
    small conv for frames of 36 pixels and more."""
    if torso != "auto":
        return torso
    if len(obs_shape) != 3:
        return "mlp"
    return "small" if min(obs_shape[1:]) >= MIN_CONV_IMAGE else "minatar"


def torso_problem(torso: str, obs_shape: tuple[int, ...]) -> str | None:
    """Why `torso` cannot read observations of `obs_shape` ([C, H, W] images or [N] vectors), or None."""
    torso = resolve_torso(torso, obs_shape)
    if torso not in TORSO_NAMES:
        return f"unknown torso {torso!r}; one of {', '.join(['auto', *TORSO_NAMES])}"
    size = 1
    for d in obs_shape:
        size *= d
    if torso == "mlp":
        if size > MAX_MLP_INPUTS:
            return (f"net.torso=mlp flattens the {'x'.join(map(str, obs_shape))} observation into {size:,} inputs; "
                    f"use a convolutional torso (net.torso=small, deep or auto)")
        return None
    if len(obs_shape) != 3:
        return f"net.torso={torso} reads images [C, H, W]; these observations are {list(obs_shape)}: use net.torso=mlp"
    if torso in ("small", "deep") and min(obs_shape[1:]) < MIN_CONV_IMAGE:
        return (f"net.torso={torso} needs images of at least {MIN_CONV_IMAGE}x{MIN_CONV_IMAGE} pixels, these are "
                f"{obs_shape[1]}x{obs_shape[2]}: use net.torso=minatar or mlp (or auto)")
    return None
