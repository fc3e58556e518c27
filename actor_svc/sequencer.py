"""Cuts the stream of every environment into fixed-length sequences that overlap by the burn-in.

All environments of an actor advance in lockstep, so one time index serves them all. Per step:
observe(x_t, ...) then act(a_t, ...). When observation L = burn_in + length has been written,
one sequence per environment is complete (L steps, L + 1 observations); its last burn_in steps and
observation L are kept as the start of the next one.

The fields and their shapes are those of the sequence layout (lbc.sequences.sequence_fields): a field
whose leading length is L + 1 is recorded per observation, one of length L per step, and h0/c0 are the
recurrent state recorded with the first observation. Observation fields beyond obs, prev_action,
prev_reward and reset (NGU's mixture and intrinsic reward) are the `extras` of observe().

Where the layout has `frames` instead of `obs` (stacked frames, lbc.sequences), observe() still takes the
stacks: it keeps the first observation's whole stack and each later one's newest frame, and flags
`stack_start` where a stack's older frames are all zeros (a game's first observation).
"""

from __future__ import annotations

import numpy as np

from lbc.codec import Layout
from lbc.frame_stacks import starts_afresh

CORE_OBSERVATION_FIELDS = ("prev_action", "prev_reward", "reset")   # and obs, or frames and stack_start
OBSERVATION_FORMS = ({"obs"}, {"stack_start"})   # the per-observation field(s) the observation itself fills
STEP_FIELDS = ("action", "reward", "done", "truncated", "bootstrap", "behaviour_prob", "psi")
STATE_FIELDS = {"h0": "h", "c0": "c"}   # the state before obs[0], from the state recorded per observation


class SequenceBuilder:
    def __init__(self, num_envs: int, burn_in: int, layout: Layout) -> None:
        steps = layout["action"][1][0]
        self.burn_in, self.steps = burn_in, steps
        if not 0 <= burn_in < steps:
            raise ValueError(f"burn_in {burn_in} must be below the sequence's {steps} steps")
        timed = {name: shape for name, (_, shape) in layout.items() if name not in STATE_FIELDS and name != "frames"}
        per_observation = {name for name, shape in timed.items() if shape[:1] == (steps + 1,)}
        per_step = {name for name, shape in timed.items() if shape[:1] == (steps,)}
        form = OBSERVATION_FORMS[1] if "frames" in layout else OBSERVATION_FORMS[0]
        if per_step != set(STEP_FIELDS) or not set(CORE_OBSERVATION_FIELDS) | form <= per_observation \
                or set(layout) - {"frames"} != per_observation | per_step | set(STATE_FIELDS):
            raise ValueError(f"not a sequence layout: {sorted(layout)}")

        def buffer(name: str, length: int, shape: tuple[int, ...]) -> np.ndarray:
            return np.zeros((num_envs, length, *shape), layout[name][0])

        self.observed = {name: buffer(name, steps + 1, layout[name][1][1:]) for name in sorted(per_observation)}
        for field, state in STATE_FIELDS.items():
            self.observed[state] = buffer(field, steps + 1, layout[field][1])
        self.acted = {name: buffer(name, steps, layout[name][1][1:]) for name in STEP_FIELDS}
        self.extras = sorted(per_observation - set(CORE_OBSERVATION_FIELDS) - form)
        # [N, L + S, ...]: obs[0]'s S frames, then each later observation's newest (lbc.frame_stacks.stacked_frames)
        self.frames = (buffer("frames", layout["frames"][1][0], layout["frames"][1][1:]) if "frames" in layout
                       else None)
        # the stack of the observation the next sequence starts with: its older frames may precede a fresh
        # stack flagged only in this sequence, so it is kept whole rather than read back from the frames
        self.next_first = (np.zeros((num_envs, layout["frames"][1][0] - steps, *layout["frames"][1][1:]),
                                    layout["frames"][0]) if "frames" in layout else None)
        self.version = np.zeros(steps + 1, np.int64)
        self.t = 0

    def observe(self, obs: np.ndarray, prev_action: np.ndarray, prev_reward: np.ndarray, reset: np.ndarray,
                h: np.ndarray, c: np.ndarray, version: int,
                extras: dict[str, np.ndarray] | None = None) -> list[tuple[dict[str, np.ndarray], int]]:
        """Record x_t and the recurrent state before it. Returns the completed (sequence, version) pairs."""
        given = extras or {}
        if set(given) != set(self.extras):
            raise ValueError(f"observe() needs the extra fields {self.extras}, got {sorted(given)}")
        values = {"prev_action": prev_action, "prev_reward": prev_reward, "reset": reset, "h": h, "c": c, **given}
        t = self.t
        if self.frames is None:
            values["obs"] = obs
        else:
            values["stack_start"] = starts_afresh(obs)
            if t == 0:
                self.frames[:, : obs.shape[1]] = obs
            else:
                self.frames[:, t + obs.shape[1] - 1] = obs[:, -1]
            if t == self.steps - self.burn_in:   # the next sequence's first observation: its stack as it is
                self.next_first[:] = obs
        for name, arr in self.observed.items():
            arr[:, t] = values[name]
        self.version[t] = version
        if t < self.steps:
            return []
        done = [(self._sequence(e), int(self.version.min())) for e in range(obs.shape[0])]
        self._shift()
        return done

    def act(self, action: np.ndarray, reward: np.ndarray, done: np.ndarray, behaviour_prob: np.ndarray,
            psi: np.ndarray, truncated: np.ndarray | None = None, bootstrap: np.ndarray | None = None) -> None:
        """Record a_t and what followed it; `truncated` and `bootstrap` (the frame cap's cut and the cut
        episode's last values, lbc.sequences.sequence_fields) are none and 0 when not given."""
        values = {"action": action, "reward": reward, "done": done, "behaviour_prob": behaviour_prob, "psi": psi,
                  "truncated": False if truncated is None else truncated, "bootstrap": 0.0 if bootstrap is None
                  else bootstrap}
        for name, arr in self.acted.items():
            arr[:, self.t] = values[name]
        self.t += 1

    def _sequence(self, e: int) -> dict[str, np.ndarray]:
        seq = {name: arr[e].copy() for name, arr in (*self.observed.items(), *self.acted.items())
               if name not in STATE_FIELDS.values()}
        seq.update({field: self.observed[state][e, 0].copy() for field, state in STATE_FIELDS.items()})
        if self.frames is not None:
            seq["frames"] = self.frames[e].copy()
        return seq

    def _shift(self) -> None:
        """Keep steps L-b..L-1 and observations L-b..L as the next sequence's first ones."""
        b, s = self.burn_in, self.steps
        for arr in self.observed.values():
            arr[:, : b + 1] = arr[:, s - b: s + 1]
        if self.frames is not None:   # obs[s - b] becomes obs[0]: its stack whole, then the newest frames after it
            self.frames[:, : self.frames.shape[1] - s + b] = self.frames[:, s - b:]
            self.frames[:, : self.next_first.shape[1]] = self.next_first
        self.version[: b + 1] = self.version[s - b: s + 1]
        for arr in self.acted.values():
            arr[:, :b] = arr[:, s - b: s]
        self.t = b
