"""One learner step, the same for every algorithm: the configured family's loss (lbc.agents: burn-in from the
stored recurrent state, then every policy's losses) on parts of the batch, clipping, the optimiser step.

`Trainer` owns the model, the optimiser and the schedules; it knows nothing about transports.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass

import numpy as np
import torch
from prometheus_client import Counter

from lbc import native
from lbc.agents import LossOutput, Prepared, make_loss
from lbc.config import Config, LearnerConfig
from lbc.devices import compute_precision, pick_device, to_device, to_host, wait_for_gpu
from lbc.envs import env_spec
from lbc.frame_stacks import observations_at
from lbc.nets import LayerNormLSTM, LBCNet, build_agent, policy_net
from lbc.optimisers import RMSpropTF
from learner_svc.replicas import ReplicaGroup
from learner_svc.step_time import timed

PREPARED_AHEAD = Counter("lbc_learner_batches_prepared_ahead_total", "Steps whose batch was prepared while the step "
                         "before trained (learner.prepare_ahead)")


def schedule_factor(step: int, warmup: int, anneal: int) -> float:
    """LBC Table 3: linear warm-up over `warmup` steps, then linear annealing to 0 at `anneal`."""
    warm = min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0
    return warm * max(0.0, 1.0 - step / anneal)


@dataclass
class StepStats:
    loss: float
    per_policy: list[dict[str, float]]   # Trainer.terms per policy
    grad_norm: float
    learning_rate: float
    priorities: np.ndarray               # [B] eta max_t |TD| + (1 - eta) mean_t |TD|, max over policies (R2D2)
    skipped: bool = False                # the loss or a gradient was not finite: no parameter changed


CPU = torch.device("cpu")
PER_SEQUENCE = ("h0", "c0", "param_version", "key", "weight")   # [B, ...], not per time step
# replay's names for the sequences: read on the host (lbc.target_cache), where a GPU copy would cost a sync
ON_HOST = ("param_version", "key")


def to_time_major(batch: dict[str, np.ndarray], device: torch.device = CPU) -> dict[str, torch.Tensor]:
    """[B, T, ...] numpy arrays to [T, B, ...] tensors on `device` (replay's keys and versions on the host);
    h0/c0 stay [B, H]. A batch of single frames (lbc.sequences) stays one: frames [T + S - 1, B, ...] and
    stack_start [T, B], a quarter of the bytes; the networks read their stacks from them (LBCNet.sequence_input,
    lbc.frame_stacks.observations)."""
    out: dict[str, torch.Tensor] = {}
    for name, arr in batch.items():
        t = to_device(arr, CPU if name in ON_HOST else device)
        out[name] = t if name in PER_SEQUENCE else t.transpose(0, 1)
    return out


def build_optimiser(model: torch.nn.Module, lc: LearnerConfig) -> torch.optim.Optimizer:
    """RMSProp as torch makes it or as TensorFlow 1 made it (lbc.optimisers), or AdamW as one fused kernel over all
    parameters: the same update as torch's default AdamW within float rounding, about 3x less CPU a step on the CPU
    and one kernel where a GPU ran a dozen list operations (docs/decisions.md 59). A checkpoint keeps the setting it
    was made with."""
    if lc.optimiser == "rmsprop":
        return torch.optim.RMSprop(model.parameters(), lr=lc.learning_rate, alpha=lc.rmsprop_decay,
                                   eps=lc.rmsprop_eps, momentum=lc.rmsprop_momentum, weight_decay=lc.weight_decay)
    if lc.optimiser == "rmsprop_tf":
        return RMSpropTF(model.parameters(), lr=lc.learning_rate, decay=lc.rmsprop_decay, eps=lc.rmsprop_eps,
                         momentum=lc.rmsprop_momentum, weight_decay=lc.weight_decay)
    return torch.optim.AdamW(model.parameters(), lr=lc.learning_rate, betas=lc.adam_betas, eps=lc.adam_eps,
                             weight_decay=lc.weight_decay, fused=True)


def unrolls_natively(cfg: Config, device: torch.device) -> bool:
    """Whether a learner of `cfg` on `device` unrolls its LayerNorm-LSTM by lbc.native's C++ (decision 90): asked to
    (learner.native_unroll), on a CPU, and the library loads here (where it is not built or does not load,
    lbc.native logs why, once)."""
    return cfg.learner.native_unroll and device.type == "cpu" and native.ln_lstm_ops() is not None


class Trainer:
    """The model, the optimiser and the schedules around the configured family's loss (lbc.agents)."""

    def __init__(self, cfg: Config, group: ReplicaGroup | None = None) -> None:
        self.cfg = cfg
        self.group = group   # learner replicas that average gradients (learner_svc.replicas); None: alone
        spec = env_spec(cfg.env)
        torch.manual_seed(cfg.learner.seed)
        self.device = pick_device(cfg.learner.device, "learner.device")
        self.precision = compute_precision(cfg.learner.precision, self.device)
        # agent: what is published and checkpointed; model: the network the RL loss trains
        self.agent = build_agent(cfg, spec.obs_shape, spec.num_actions).to(self.device)
        lc = cfg.learner
        self.model: LBCNet = policy_net(self.agent).set_channels_last(True)
        self.model.set_frame_blocks(lc.frame_blocks, lc.native_stacks)
        if lc.cuda_graphs and self.device.type != "cuda":
            raise SystemExit("learner.cuda_graphs needs a GPU learner, and learner.device=auto found no GPU")
        native_unroll = unrolls_natively(cfg, self.device)
        self.native_unroll = False   # the LayerNorm-LSTM unrolls by lbc.native's C++ (learner.native_unroll)
        for module in self.agent.modules():   # before make_loss copies the target network
            if isinstance(module, LayerNormLSTM):
                if lc.compile:
                    module.compile_unroll()
                if lc.cuda_graphs:
                    module.graph_unroll()
                if native_unroll:
                    module.native_unroll()
                    self.native_unroll = True
        self.loss = make_loss(cfg, self.agent, self.device)
        self.optimiser = build_optimiser(self.model, lc)
        for group in self.loss.param_groups():
            self.optimiser.add_param_group(group)
        self.step = 0
        # split_batch > 1: the parts run in threads with one intra-op thread each; unlike intra-op
        # parallelism they need no barrier, so a core shared with an actor is not left waiting
        self.pool = ThreadPoolExecutor(lc.split_batch, thread_name_prefix="learner-part") \
            if lc.split_batch > 1 else None
        # prepare_ahead: the next batch's Loss.prepare runs here while a step trains; (that batch, its parts)
        self.ahead = ThreadPoolExecutor(1, thread_name_prefix="learner-prepare") if lc.prepare_ahead else None
        # on a GPU that thread copies the next batch on a stream of its own, so the copy overlaps the step's
        # kernels instead of queueing between them on the stream they share
        self.copy_stream = torch.cuda.Stream(self.device) if self.ahead is not None and self.device.type == "cuda" \
            else None
        self._prepared: tuple[dict[str, np.ndarray], list[Prepared]] | None = None
        self.prepared_ahead = 0   # steps whose batch was prepared ahead

    @property
    def parameters(self) -> list[torch.nn.Parameter]:
        """Every parameter the optimiser steps, in its order."""
        return [p for group in self.optimiser.param_groups for p in group["params"]]

    @property
    def terms(self) -> tuple[str, ...]:
        """The loss terms reported per policy."""
        return self.loss.TERMS

    def describe_work(self) -> list[str]:
        """What the learner saved itself so far (kept target outputs, batches prepared ahead), for its log."""
        parts = [] if self.loss.target_cache is None else [self.loss.target_cache.describe()]
        if self.ahead is not None:
            parts.append(f"{self.prepared_ahead} of {self.step} steps trained on batches prepared ahead")
        return parts

    def checkpointed_modules(self) -> dict[str, torch.nn.Module]:
        """Modules besides the agent whose state a checkpoint must keep."""
        return self.loss.checkpointed()

    def _autocast(self) -> AbstractContextManager:
        # no cast cache: torch keeps one for all threads and empties it when any thread leaves autocast, so with
        # split_batch or prepare_ahead a weight could be cast once or twice in a part's graph and its gradient
        # summed in a different order from run to run; without it the step is deterministic, and no slower
        return torch.autocast(self.device.type, torch.bfloat16, enabled=self.precision == "bf16", cache_enabled=False)

    def _loss(self, batch: dict[str, np.ndarray]) -> LossOutput:
        """The family's loss for (part of) a batch: (total as a mean over time and batch, terms
        [N, len(terms)], priorities [B])."""
        with self._autocast():
            return self.loss(self.model, self.loss.prepare(self.model, to_time_major(batch, self.device)))

    def _on_device(self, batch: dict[str, np.ndarray]) -> list[dict[str, torch.Tensor]]:
        """The batch's `split_batch` parts, time-major on the learner's device."""
        size = next(iter(batch.values())).shape[0]
        bounds = np.linspace(0, size, self.cfg.learner.split_batch + 1).astype(int)
        return [to_time_major({k: v[lo:hi] for k, v in batch.items()}, self.device)
                for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]

    def _copied_aside(self, batch: dict[str, np.ndarray]) -> list[dict[str, torch.Tensor]]:
        """_on_device with the copies on copy_stream, waited for here (the preparing thread's wait, not the
        step's; asleep, lbc.devices.wait_for_gpu). The tensors are then read on the default stream: recorded
        there, so that their memory is not handed to copy_stream's next batch before the kernels that read them
        have run."""
        with torch.cuda.stream(self.copy_stream):
            parts = self._on_device(batch)
        wait_for_gpu(self.copy_stream)
        default = torch.cuda.default_stream(self.device)
        for part in parts:
            for t in part.values():
                if t.is_cuda:
                    t.record_stream(default)
        return parts

    def prepare(self, batch: dict[str, np.ndarray], aside: bool = False) -> list[Prepared]:
        """Loss.prepare of each of the batch's `split_batch` parts: what the online parameters do not change.
        aside: copy the batch to the GPU on copy_stream (the preparing thread does, where there is one)."""
        parts = self._copied_aside(batch) if aside and self.copy_stream is not None else self._on_device(batch)
        with self._autocast():
            return [self.loss.prepare(self.model, part) for part in parts]

    def _prepared_parts(self, batch: dict[str, np.ndarray]) -> list[Prepared]:
        """The batch's parts as prepared ahead, when they were and the target network has not changed since;
        otherwise prepared now."""
        ahead, self._prepared = self._prepared, None
        if ahead is not None and ahead[0] is batch and all(p.target_version == self.loss.target_version
                                                           for p in ahead[1]):
            self.prepared_ahead += 1
            PREPARED_AHEAD.inc()
            return ahead[1]
        return self.prepare(batch)

    def _probe_frames(self, batch: dict[str, np.ndarray], frames: int = 256) -> torch.Tensor:
        """Up to `frames` of the batch's learned-on frames (after burn-in), spread over the batch."""
        burn = self.cfg.sequence.burn_in
        learned = batch["reset"].shape[1] - burn   # observations per sequence after burn-in
        flat = np.arange(len(batch["reset"]) * learned)
        flat = flat[:: max(1, len(flat) // frames)][:frames]
        obs = observations_at(batch, flat // learned, burn + flat % learned)
        return torch.from_numpy(np.ascontiguousarray(obs)).to(self.device)

    def torso_dead_units(self, batch: dict[str, np.ndarray]) -> dict[str, float]:
        """The torso's dead units (lbc.nets.dead_units) on the batch's frames."""
        return self.model.torso_dead_units(self._probe_frames(batch))

    def recycle_dormant(self, batch: dict[str, np.ndarray]) -> dict[str, int]:
        """ReDo (lbc.recycling) on the torso, scored on the batch's frames: units recycled per layer."""
        return self.model.recycle_dormant(self._probe_frames(batch), self.cfg.learner.recycle_threshold,
                                          self.optimiser)

    def _clip_gradients(self) -> torch.Tensor:
        """Clip the gradients' global norm, the model's and apart from it each group the loss names; returns
        the norms before clipping, [model's, *each group's apart], on the device (read with the step's other
        figures by one lbc.devices.to_host)."""
        clip = self.cfg.learner.clip_norm
        apart = [torch.nn.utils.clip_grad_norm_(params, clip) for params in self.loss.clipped_apart()]
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        return torch.stack([n.to(self.device) for n in (norm, *apart)])

    def parameters_finite(self) -> bool:
        """Whether every published tensor (parameters and buffers) is finite: checked before a push or a
        checkpoint, so a broken model is never served nor saved."""
        flags = [torch.isfinite(t).all() for t in self.agent.state_dict().values() if t.is_floating_point()]
        return bool(to_host(torch.stack(flags).all())[0])   # one wait for the device, not one per tensor

    def _split_backward(self, parts: list[Prepared]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Loss and backward on the batch's prepared parts at once, in threads (the parts' gradients, weighted
        by their share of the batch, accumulate into .grad). Returns (loss, terms, priorities), on the device."""
        sizes = [p.batch["action"].shape[1] for p in parts]
        size = sum(sizes)

        def part(i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            with self._autocast():
                total, terms, priorities = self.loss(self.model, parts[i])
            share = sizes[i] / size   # the part's means weigh by its share of the batch
            weight = share * (self.cfg.sequence.length * size if self.cfg.learner.loss_reduction == "sum" else 1)
            (total * weight).backward()
            return total.detach() * weight, terms * share, priorities

        if self.pool is None:
            results = [part(i) for i in range(len(parts))]
        else:
            results = list(self.pool.map(part, range(len(parts))))
        return (sum(r[0] for r in results), sum(r[1] for r in results),
                torch.cat([r[2] for r in results]))

    def train_step(self, batch: dict[str, np.ndarray], upcoming: dict[str, np.ndarray] | None = None) -> StepStats:
        """One optimiser step on `batch`. With learner.prepare_ahead, `upcoming` (the batch the next call will
        get) is prepared in a thread of its own meanwhile; its target outputs are made again if this step
        copies the model into the target network."""
        with timed("prepare"):
            parts = self._prepared_parts(batch)
        ahead: Future | None = None
        if self.ahead is not None and upcoming is not None:
            ahead = self.ahead.submit(self.prepare, upcoming, aside=True)
        try:
            stats = self._optimise(parts)
        finally:   # before after_step: the target network must not change under the upcoming batch's unroll
            # a preparation that failed is made again in its batch's own step, which raises where it trains
            with timed("ahead_wait"):
                if ahead is not None and ahead.exception() is None:
                    self._prepared = (upcoming, ahead.result())
        if not stats.skipped:
            self.step += 1
            with timed("optimiser"):
                self.loss.after_step(self.step)
        return stats

    def _optimise(self, parts: list[Prepared]) -> StepStats:
        """Loss, gradients, clipping and the optimiser's step on the prepared parts of one batch."""
        lc = self.cfg.learner
        factor = schedule_factor(self.step, lc.warmup_steps, lc.anneal_steps)
        for group in self.optimiser.param_groups:
            if group.get("fixed_lr", False):   # NGU's auxiliary networks: a constant rate
                continue
            group["lr"] = lc.learning_rate * factor
            group["weight_decay"] = lc.weight_decay * max(0.0, 1.0 - self.step / lc.anneal_steps)

        with timed("loss_backward"):
            self.optimiser.zero_grad(set_to_none=True)
            loss, terms, priorities = self._split_backward(parts)
            finite = torch.isfinite(loss)
            if self.group is not None:   # a replica's loss not finite: every replica skips this step
                finite = self.group.average_gradients(self.parameters, finite)
            norms = self._clip_gradients()
        # the step's one wait for the device: the optimiser's kernels below then run while the host goes on
        with timed("device_wait"):
            loss_h, finite_h, norms_h, terms_h, priorities_h = to_host(loss, finite, norms, terms, priorities)
        loss_value = float(loss_h) if finite_h else float("nan")
        # the model's norm, or the first group's apart that is not finite (the skip below relies on a
        # non-finite norm exactly when a gradient is not finite)
        grad_norm = float(next((n for n in norms_h[1:] if not np.isfinite(n)), norms_h[0]))
        if not (np.isfinite(loss_value) and np.isfinite(grad_norm)):
            # one batch must not destroy the model: skip it whole (and leave the optimiser's moments alone)
            self.optimiser.zero_grad(set_to_none=True)
            return StepStats(loss=loss_value, per_policy=[], grad_norm=grad_norm,
                             learning_rate=lc.learning_rate * factor, priorities=np.zeros(0, np.float32),
                             skipped=True)
        with timed("optimiser"):
            self.optimiser.step()
        per_policy = [dict(zip(self.terms, row.tolist(), strict=True)) for row in terms_h]
        return StepStats(loss=loss_value, per_policy=per_policy, grad_norm=grad_norm,
                         learning_rate=lc.learning_rate * factor, priorities=priorities_h)
