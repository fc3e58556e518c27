"""`lbc export RUN`: a run's acting network as a file another program can serve (ONNX or TorchScript),
with a JSON that says what goes in, what comes out, how frames are prepared and how to act on the heads.

What is exported is one acting step for a batch of B environments, the step the actors and the evaluator
take (lbc.acting.forward):
  in:  obs [B, *obs_shape] uint8, prev_action [B] int64, prev_reward [B] float32 (raw; the net clips it),
       reset [B] bool (x starts an episode: the state is zeroed first), h [B, H], c [B, H] float32,
       and for NGU extra [B, num_mixtures + 1] (one-hot j, then the intrinsic reward);
  out: adv [B, N, A] (every head's mean-centred advantages), value [B, N], h_out, c_out [B, H].
B is free. Frame centring (net.centre_frames) happens inside the network; the emulator-side
preprocessing is listed in the JSON. NGU's embedding and RND networks (its intrinsic reward) are not in
the file: the exported network takes that reward as an input.
"""

from __future__ import annotations

import argparse
import json
import logging
import warnings
from pathlib import Path

import torch
from torch import nn

from lbc.acting import evaluation_policy
from lbc.config import Config
from lbc.envs import env_spec
from lbc.family import family_traits
from lbc.nets import LBCNet, build_agent, policy_net
from lbc.run_folder import find_checkpoint, load_config_of

FORMATS = ("onnx", "torchscript")
OUTPUTS = ["adv", "value", "h_out", "c_out"]


class ActingStep(nn.Module):
    """LBCNet for one time step, with flat tensors in and out (no tuples or optional arguments), as
    exporters and runtimes want them."""

    def __init__(self, net: LBCNet) -> None:
        super().__init__()
        self.net = net

    def forward(self, obs: torch.Tensor, prev_action: torch.Tensor, prev_reward: torch.Tensor,
                reset: torch.Tensor, h: torch.Tensor, c: torch.Tensor,
                extra: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        out = self.net(obs[None], prev_action[None], prev_reward[None], reset[None], (h, c),
                       None if extra is None else extra[None])
        return out.adv[0], out.value[0], out.state[0], out.state[1]


def input_names(net: LBCNet) -> list[str]:
    names = ["obs", "prev_action", "prev_reward", "reset", "h", "c"]
    return names + ["extra"] if net.extra_inputs else names


def example_inputs(net: LBCNet, obs_shape: tuple[int, ...], batch: int,
                   generator: torch.Generator | None = None) -> tuple[torch.Tensor, ...]:
    """Inputs of the exported step for `batch` environments: random frames, actions, rewards, resets and
    states (tracing and the tests' comparisons want every path exercised, so not only zeros)."""
    g = generator or torch.Generator().manual_seed(0)
    h, c = (torch.randn(batch, net.lstm_size, generator=g) for _ in range(2))
    inputs = (torch.randint(0, 256, (batch, *obs_shape), generator=g, dtype=torch.uint8),
              torch.randint(0, net.num_actions, (batch,), generator=g),
              torch.randn(batch, generator=g),
              torch.rand(batch, generator=g) < 0.5, h, c)
    if net.extra_inputs:
        inputs += (torch.rand(batch, net.extra_inputs, generator=g),)
    return inputs


def export_network(net: LBCNet, obs_shape: tuple[int, ...], fmt: str, path: Path) -> None:
    """Write `net`'s acting step to `path` as ONNX (torch.onnx's dynamo exporter, batch axis dynamic, the
    weights inside the file) or
    TorchScript (traced; the batch size is read from the inputs at run time)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; one of {', '.join(FORMATS)}")
    step = ActingStep(net).eval()
    net.set_median_by_sort(True)         # the same lower median, in ops ONNX has
    inputs = example_inputs(net, obs_shape, 2)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        if fmt == "onnx":
            batch = torch.export.Dim("batch", min=1, max=65_536)
            # the exporter's notes (torchvision absent, deprecations inside torch) are not the user's business
            logging.getLogger("torch.onnx").setLevel(logging.ERROR)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.onnx.export(step, inputs, str(path), input_names=input_names(net), output_names=OUTPUTS,
                                  dynamic_shapes=[{0: batch}] * len(inputs), dynamo=True, external_data=False,
                                  verbose=False)
        else:
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)   # torch.jit: still the format C++ loads
                torch.jit.trace(step, inputs, check_trace=False).save(str(path))
    finally:
        net.set_median_by_sort(False)


def describe(cfg: Config, net: LBCNet, fmt: str, file: str, version: int, step: int) -> dict:
    """The JSON written beside the exported file."""
    spec = env_spec(cfg.env)
    env = cfg.env
    if env.kind == "atari":
        preprocessing = {
            "emulator": f"ale-py, game {env.game}, full action set of {spec.num_actions}, repeat_action_probability "
                        f"{env.repeat_action_probability}, up to {env.noop_max} no-ops at a start, "
                        f"{env.max_episode_frames}-frame cap",
            "frames": f"frame skip {env.frameskip} (the action repeated, the reward summed), the max of the last two "
                      f"frames, greyscale, resized to {env.image_size}x{env.image_size}, a stack of the last "
                      f"{env.stack} (blank before an episode's first), uint8 0-255",
        }
    else:
        preprocessing = {"emulator": "lbc's built-in Catch (lbc.envs.CatchEnvs)", "frames": "the board, uint8 0/255"}
    preprocessing["inside the network"] = (("each frame less its median grey, " if cfg.net.centre_frames else "")
                                           + "scaled by 1/255; prev_reward clipped to [-1, 1]")
    return {
        "format": fmt, "file": file, "run": cfg.run_dir, "parameter_version": version, "learner_step": step,
        "inputs": {
            "obs": {"shape": ["B", *spec.obs_shape], "dtype": "uint8"},
            "prev_action": {"shape": ["B"], "dtype": "int64", "meaning": "the action taken before obs; 0 at a start"},
            "prev_reward": {"shape": ["B"], "dtype": "float32", "meaning": "the raw reward before obs; 0 at a start"},
            "reset": {"shape": ["B"], "dtype": "bool", "meaning": "obs starts an episode (state zeroed first)"},
            "h": {"shape": ["B", net.lstm_size], "dtype": "float32", "meaning": "recurrent state; zeros at first"},
            "c": {"shape": ["B", net.lstm_size], "dtype": "float32", "meaning": "recurrent state; zeros at first"},
            **({"extra": {"shape": ["B", net.extra_inputs], "dtype": "float32",
                          "meaning": f"NGU: one-hot mixture index j ({cfg.ngu.num_mixtures}), then the intrinsic "
                                     "reward before obs"}} if net.extra_inputs else {}),
        },
        "outputs": {
            "adv": {"shape": ["B", net.num_policies, net.num_actions],
                    "meaning": "each policy head's advantages, mean-centred over actions"},
            "value": {"shape": ["B", net.num_policies], "meaning": "each policy head's value"},
            "h_out": {"shape": ["B", net.lstm_size], "meaning": "the next state (feed back as h)"},
            "c_out": {"shape": ["B", net.lstm_size], "meaning": "the next state (feed back as c)"},
        },
        "core": cfg.net.core,
        "preprocessing": preprocessing,
        "policies": [{"gamma": p.gamma, "reward_shaping": p.reward_shaping} for p in cfg.policies],
        "behaviour": {
            "family": family_traits(cfg).behaviour,
            "components": cfg.components,
            "evaluation_policy": evaluation_policy(cfg),
            "evaluation_epsilon": cfg.eval.epsilon,
            "fixed_tau": cfg.behaviour.fixed_tau,
            "how to act": "greedy: argmax of the components' mean advantage, a uniform action with probability "
                          "evaluation_epsilon; sample: draw from the mean over the components of "
                          "softmax(fixed_tau * adv) (lbc.acting.evaluation_probs)",
        },
    }


def export_cli(args: argparse.Namespace) -> int:
    run_dir = Path(args.run)
    cfg = load_config_of(run_dir, "export")
    ckpt, state = find_checkpoint(run_dir, args.version, "export")
    spec = env_spec(cfg.env)
    agent = build_agent(cfg, spec.obs_shape, spec.num_actions).eval()
    agent.load_state_dict(state["model"])
    net = policy_net(agent)
    version, step = int(state["version"]), int(state["step"])
    suffix = ".onnx" if args.format == "onnx" else ".pt"
    out = Path(args.out) if args.out else run_dir / "export" / f"policy-v{version}{suffix}"
    print(f"exporting {ckpt.name} (version {version}, learner step {step}) as {args.format} to {out}", flush=True)
    export_network(net, spec.obs_shape, args.format, out)
    meta = out.with_suffix(".json")
    meta.write_text(json.dumps(describe(cfg, net, args.format, out.name, version, step), indent=2) + "\n")
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB) and {meta}")
    return 0
