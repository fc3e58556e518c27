"""The acting step every player of the game shares: the actor, the evaluator, `lbc play` and `bench/`.

Per vector step: one batched forward pass of the recurrent network over every environment's newest
observation, then a policy over its heads (the hybrid behaviour for actors, the evaluation policy for
the evaluator), then one action per environment. `CoreInputs` carries what the core sees besides the
frame (previous action and reward, where an episode restarts, the recurrent state) from one step to
the next, so that each caller only decides what counts as an episode boundary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import nn

from lbc.behaviour import boltzmann_mixture, epsilon_greedy
from lbc.config import Config
from lbc.devices import compute_precision, to_device, to_host
from lbc.envs import StepResult
from lbc.family import family_traits
from lbc.frame_ring import FrameRing
from lbc.lstm_bptt import GraphCache
from lbc.nets import Frames, LBCNet, NetOutput, build_agent, policy_net


@dataclass
class CoreInputs:
    """What the recurrent core takes with x_t, for E environments."""

    prev_action: np.ndarray                      # [E] int64, a_{t-1} (0 at an episode start)
    prev_reward: np.ndarray                      # [E] float32, r_{t-1} (0 at an episode start)
    reset: np.ndarray                            # [E] bool, x_t starts an episode: the state is zeroed first
    state: tuple[torch.Tensor, torch.Tensor]     # (h, c) before x_t, [E, H] each

    @classmethod
    def start(cls, net: LBCNet, num_envs: int) -> CoreInputs:
        return cls(np.zeros(num_envs, np.int64), np.zeros(num_envs, np.float32), np.ones(num_envs, bool),
                   net.initial_state(num_envs))

    def advance(self, actions: np.ndarray, rewards: np.ndarray, boundary: np.ndarray,
                state: tuple[torch.Tensor, torch.Tensor]) -> None:
        """After a step: where `boundary` (an episode end as the learner sees it) the next x starts afresh."""
        self.prev_action = np.where(boundary, 0, actions)
        self.prev_reward = np.where(boundary, 0.0, rewards).astype(np.float32)
        self.reset = boundary
        self.state = state


def set_precision(net: LBCNet, precision: Literal["fp32", "bf16"]) -> None:
    """bf16: the acting network's convolutions and linear layers keep bfloat16 weights, so that `forward` runs
    them in bfloat16 without casting every weight at every step (bf16 autocast alone casts them each call:
    1.1-1.2x fp32's samples/s at batch 16 on one core, against 1.25-1.55x with the weights kept, docs/speed.md).
    A parameter pull converts into them once (load_state_dict copies). Layer norms, the recurrent state and
    the outputs stay float32. Decision 64."""
    if precision == "bf16":
        for module in net.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                module.to(torch.bfloat16)


def acting_agent(cfg: Config, obs_shape: tuple[int, ...], num_actions: int,
                 device: torch.device | None = None) -> nn.Module:
    """The agent as every player holds it (actors, the evaluator, lbc evaluate, lbc play): in eval mode on
    `device` (default the CPU), its policy network in the precision actor.precision resolves to there."""
    device = torch.device("cpu") if device is None else device
    agent = build_agent(cfg, obs_shape, num_actions).eval().to(device)
    set_precision(policy_net(agent), compute_precision(cfg.actor.precision, device))
    return agent


def acting_graphs(cfg: Config, device: torch.device) -> GraphCache | None:
    """The CUDA graphs the acting pass replays on `device` (actor.cuda_graphs) in an actor or, with
    actor.inference=remote, in the inference service; None where it runs eagerly. Refuses where actor.device or
    inference.device, set to auto, found no GPU (the configuration already refuses cpu)."""
    if not cfg.actor.cuda_graphs:
        return None
    if device.type != "cuda":
        where = "inference.device" if cfg.actor.inference == "remote" else "actor.device"
        raise SystemExit(f"actor.cuda_graphs needs the acting pass on a GPU, and {where}=auto found no GPU")
    return GraphCache()


def precision_of(net: LBCNet) -> Literal["fp32", "bf16"]:
    """The precision set_precision left the acting network in."""
    return "bf16" if net.heads.weight.dtype == torch.bfloat16 else "fp32"


def frame_ring(cfg: Config, net: LBCNet, num_envs: int) -> FrameRing | None:
    """The ring (lbc.frame_ring, decisions 85 and 92) through which a player's acting pass reads its games' stacks
    where it pays: actor.frame_ring, the network on a CPU (in bf16 or float32, set_precision: the ring holds its
    frames in that), a first convolution that reads frames in blocks; pushed by lbc.native where actor.native_ring
    and the library loads (decision 97). It puts the network's torso in the
    channels-last layout the ring's Frames come in. None elsewhere: the pass reads the stacks as the games give
    them."""
    blocks = net.input_blocks()
    if not cfg.actor.frame_ring or net.heads.weight.device.type != "cpu" or blocks == 1:
        return None
    net.set_channels_last(True)
    dtype = torch.bfloat16 if precision_of(net) == "bf16" else torch.float32
    return FrameRing(num_envs, net.obs_shape, blocks, net.centre_frames, dtype, cfg.actor.native_ring)


def _network_pass(net: LBCNet, obs: torch.Tensor | Frames, prev_action: torch.Tensor, prev_reward: torch.Tensor,
                  reset: torch.Tensor, h: torch.Tensor, c: torch.Tensor, extra: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(adv, value, h, c) of one step on the network's device, adv and value float32: what forward runs, eagerly
    or as a CUDA graph. A network in bf16 (set_precision) runs under bf16 autocast."""
    bf16 = precision_of(net) == "bf16"
    with torch.autocast(h.device.type, dtype=torch.bfloat16, enabled=bf16, cache_enabled=False):
        out = net(obs[None], prev_action[None], prev_reward[None], reset[None], (h, c), extra)
    return out.adv.float(), out.value.float(), *out.state


@torch.no_grad()
def forward(net: LBCNet, obs: np.ndarray | Frames, inputs: CoreInputs, extra: torch.Tensor | None = None,
            state_to_host: bool = False, graphs: GraphCache | None = None) -> NetOutput:
    """One time step of the network for every environment: obs [E, *obs_shape] uint8, or a frame ring's Frames of
    them (frame_ring). The outputs keep a leading time axis of 1 (adv [1, E, N, A]); adv and value come back to the
    CPU, where actions are drawn, by one copy after one wait (lbc.devices.to_host), while the recurrent state stays
    on the network's device (actor.device) unless `state_to_host` (the inference service sends it on), when it comes
    back in the same copy. A network in bf16 (set_precision) runs under bf16 autocast; its adv and value come back
    as float32. With `graphs` on a GPU the pass replays a CUDA graph captured at its first call (actor.cuda_graphs):
    one launch for its hundred-odd operations, the same kernels on the same weights (a pull copies into them)."""
    device = net.heads.weight.device
    frames = obs if isinstance(obs, Frames) else to_device(obs, device)
    tensors = (frames, to_device(inputs.prev_action, device), to_device(inputs.prev_reward, device),
               to_device(inputs.reset, device), *inputs.state, *(() if extra is None else (extra.to(device),)))

    def network_pass(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return _network_pass(net, *tensors)

    graphed = graphs is not None and device.type == "cuda"
    adv, value, h, c = graphs.run(network_pass, tensors) if graphed else network_pass(*tensors)
    if device.type == "cpu":
        return NetOutput(adv=adv, value=value, state=(h, c))
    if state_to_host:
        adv, value, h, c = to_host(adv, value, h, c)
        return NetOutput(adv=torch.from_numpy(adv), value=torch.from_numpy(value),
                         state=(torch.from_numpy(h), torch.from_numpy(c)))
    adv, value = to_host(adv, value)
    return NetOutput(adv=torch.from_numpy(adv), value=torch.from_numpy(value), state=(h, c))


# One acting step of the network for every environment: forward(net, ...) bound to a network, or the inference
# service's (actor_svc.remote.RemoteNetwork.forward).
Step = Callable[[np.ndarray, CoreInputs, "torch.Tensor | None"], NetOutput]


@torch.no_grad()
def cut_episode_values(step: Step, result: StepResult, actions: np.ndarray, state: tuple[torch.Tensor, torch.Tensor],
                       extra: torch.Tensor | None = None) -> np.ndarray | None:
    """[E, N] float32: each policy's V of the last observation of the episodes the frame cap cut in this
    step (result.truncated), 0 elsewhere; None where no episode was cut. The learner bootstraps those steps
    from it (lbc.losses.vtrace). The network reads that observation as the step after x_t would have been
    read: after action a_t and reward r_t, from the state after x_t."""
    if result.final_obs is None or not result.truncated.any():
        return None
    inputs = CoreInputs(actions.astype(np.int64), result.reward.astype(np.float32), np.zeros(len(actions), bool),
                        state)
    values = step(result.final_obs, inputs, extra).value[0].numpy().copy()
    values[~result.truncated] = 0.0
    return values


def evaluation_policy(cfg: Config) -> str:
    """The evaluation policy `eval.policy` resolves to (docs/decisions.md 28): `sample` from the target
    policy where the behaviour is a fixed Boltzmann policy (IMPALA, dice-fixed), else `greedy`."""
    return family_traits(cfg).evaluation_policy if cfg.eval.policy == "auto" else cfg.eval.policy


def evaluation_probs(cfg: Config, out: NetOutput, policy: str) -> torch.Tensor:
    """pi_eval [E, A] from one step's network output.

    greedy: eps-greedy (eval.epsilon) on the mean of the behaviour components' advantages, the limit of
    the uniform-weight mixture as every tau grows (NGU: its one head, fed j = 0, is Q(., j=0) up to V).
    sample: the target policy softmax(fixed_tau A) averaged over the components with equal weights.
    """
    adv = out.adv[0][:, cfg.components]                          # [E, K, A]
    if policy == "greedy":
        return epsilon_greedy(adv.mean(1), cfg.eval.epsilon)
    k = adv.shape[1]
    tau = torch.full(adv.shape[:2], cfg.behaviour.fixed_tau)
    return boltzmann_mixture(adv, tau, torch.full(adv.shape[:2], 1.0 / k))
