"""One learner step: burn-in from the stored recurrent state, then every policy's losses.

`Trainer` owns the model, the optimiser and the schedules; it knows nothing about transports.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from lbc.config import Config, LearnerConfig
from lbc.envs import env_spec
from lbc.losses import LossScales, lbc_policy_loss
from lbc.nets import LBCNet, build_net
from lbc.rewards import REWARD_SHAPING


def schedule_factor(step: int, warmup: int, anneal: int) -> float:
    """LBC Table 3: linear warm-up over `warmup` steps, then linear annealing to 0 at `anneal`."""
    warm = min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0
    return warm * max(0.0, 1.0 - step / anneal)


@dataclass
class StepStats:
    loss: float
    per_policy: list[dict[str, float]]   # v, q, pi, entropy per policy
    grad_norm: float
    learning_rate: float
    priorities: np.ndarray               # [B] eta max_t |TD| + (1 - eta) mean_t |TD|, max over policies (R2D2)


PER_SEQUENCE = ("h0", "c0", "param_version", "key", "weight")   # [B, ...], not per time step


def to_time_major(batch: dict[str, np.ndarray], device: torch.device | None = None) -> dict[str, torch.Tensor]:
    """[B, T, ...] numpy arrays to [T, B, ...] tensors on `device`; h0/c0 stay [B, H]."""
    out: dict[str, torch.Tensor] = {}
    for name, arr in batch.items():
        t = torch.from_numpy(np.ascontiguousarray(arr))
        if device is not None and device.type != "cpu":
            t = t.pin_memory().to(device, non_blocking=True)
        out[name] = t if name in PER_SEQUENCE else t.transpose(0, 1)
    return out


def pick_device(setting: str) -> torch.device:
    if setting == "cuda" and not torch.cuda.is_available():
        raise SystemExit("learner.device=cuda but no CUDA device is visible")
    if setting == "auto":
        setting = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(setting)


def build_optimiser(model: torch.nn.Module, lc: LearnerConfig) -> torch.optim.Optimizer:
    if lc.optimiser == "rmsprop":
        return torch.optim.RMSprop(model.parameters(), lr=lc.learning_rate, alpha=lc.rmsprop_decay,
                                   eps=lc.rmsprop_eps, momentum=lc.rmsprop_momentum, weight_decay=lc.weight_decay)
    return torch.optim.AdamW(model.parameters(), lr=lc.learning_rate, betas=lc.adam_betas, eps=lc.adam_eps,
                             weight_decay=lc.weight_decay)


class Trainer:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        spec = env_spec(cfg.env)
        torch.manual_seed(cfg.learner.seed)
        self.device = pick_device(cfg.learner.device)
        self.model: LBCNet = build_net(cfg, spec.obs_shape, spec.num_actions).set_channels_last(True).to(self.device)
        lc = cfg.learner
        self.optimiser = build_optimiser(self.model, lc)
        self.scales = LossScales(v=lc.v_loss_scale, q=lc.q_loss_scale, pi=lc.pi_loss_scale,
                                 entropy=lc.entropy_cost, rho_bar=lc.rho_bar, c_bar=lc.c_bar, lam=lc.trace_lambda)
        self.shaping = [REWARD_SHAPING[p.reward_shaping] for p in cfg.policies]
        self.gammas = [p.gamma for p in cfg.policies]
        self.step = 0

    def _target_tau(self, psi: torch.Tensor, policy: int) -> torch.Tensor | None:
        """tau_i per step [T+1, B] for target_policy=behaviour_temperature; psi is [T, B, 2N] with tau
        first. The bootstrap row repeats the last step's (across an episode end it is discounted to 0)."""
        if self.cfg.learner.target_policy == "softmax":
            return None
        tau = psi[:, :, policy].clamp_min(self.cfg.learner.min_target_tau)
        return torch.cat([tau, tau[-1:]], dim=0)

    def train_step(self, batch: dict[str, np.ndarray]) -> StepStats:
        lc = self.cfg.learner
        factor = schedule_factor(self.step, lc.warmup_steps, lc.anneal_steps)
        for group in self.optimiser.param_groups:
            group["lr"] = lc.learning_rate * factor
            group["weight_decay"] = lc.weight_decay * max(0.0, 1.0 - self.step / lc.anneal_steps)

        b = to_time_major(batch, self.device)
        burn = self.cfg.sequence.burn_in
        state = (b["h0"], b["c0"])
        inputs = ("obs", "prev_action", "prev_reward", "reset")
        obs, prev_action, prev_reward, reset = (b[k] for k in inputs)
        prev_action = prev_action.long()
        if burn > 0:
            with torch.no_grad():
                state = self.model(obs[:burn], prev_action[:burn], prev_reward[:burn], reset[:burn], state).state
        out = self.model(obs[burn:], prev_action[burn:], prev_reward[burn:], reset[burn:], state)

        actions = b["action"][burn:].long()
        raw_reward = b["reward"][burn:]
        not_done = 1.0 - b["done"][burn:].float()
        mu = b["behaviour_prob"][burn:]
        total = torch.zeros((), device=self.device)
        per_policy = []
        priorities = torch.zeros(actions.shape[1], device=self.device)
        weights = b.get("weight")
        eta = self.cfg.replay.priority_eta
        for i, (shape, gamma) in enumerate(zip(self.shaping, self.gammas, strict=True)):
            loss = lbc_policy_loss(out.adv[:, :, i], out.value[:, :, i], actions, mu, shape(raw_reward),
                                   gamma * not_done, self.scales, self._target_tau(b["psi"][burn:], i), weights)
            total = total + loss.total
            per_policy.append({"v": loss.v.item(), "q": loss.q.item(), "pi": loss.pi.item(),
                               "entropy": loss.entropy.item()})
            priorities = torch.maximum(priorities, eta * loss.abs_td.max(0).values + (1 - eta) * loss.abs_td.mean(0))

        if lc.loss_reduction == "sum":
            total = total * (actions.shape[0] * actions.shape[1])   # every term is a mean over [T, B]
        self.optimiser.zero_grad(set_to_none=True)
        total.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), lc.clip_norm)
        self.optimiser.step()
        self.step += 1
        return StepStats(loss=total.item(), per_policy=per_policy, grad_norm=float(grad_norm),
                         learning_rate=lc.learning_rate * factor, priorities=priorities.cpu().numpy())
