"""End-to-end throughput against the machine's ceiling (`make bench`).

Measures, each alone on one core: environment steps/s (the actor's vector env), inference samples/s
(the actor's batched forward + behaviour mixture + sampling; for NGU also its intrinsic reward) and
learner samples/s (one training step of the preset's batch; with a target network, its outputs kept for
the share of sequences replay would draw again before the next copy). Combines them into the ceiling

    ceiling = cores / (1/env + 1/inference + replay_ratio/learner)     [agent steps/s]

(with the learner on a GPU its term leaves the cores' sum and bounds on its own: min(cores / (1/env +
1/inference), learner / replay_ratio)), then runs the whole system (bench.system) with the launcher and prints
achieved / ceiling, split for a CPU learner into the CPU an agent step the ceiling charges and what each service
spent beyond it (bench.cpu_use.ceiling_gap), and the cores each service kept busy; then it measures the stages
alone again, as the host may drift within the hour, and prints the ceiling after the window too and achieved
against the two ceilings' mean. On a CPU machine it starts as many actors as keep the cores busy at the ceiling
(an actor's loop is serial, one core at most: actors_to_fill). It also splits one learner step into its parts
(copy to the device, forward and loss, backward, optimiser), counts the operations an eager step dispatches (each
a kernel launch on a GPU), and on a GPU machine reports peak memory and nvidia-smi's utilisation; --actor-scaling
1,2,4,8,12 runs the whole system per actor count against linear growth from the smallest count. For NGU presets it
prints what the intrinsic reward costs per agent step, by how full the episodic memories are; --levers measures
each speed lever on its stage and the whole system with the actors' other inference (local or central, decision
68), and --profile samples the running services with py-spy (bench.spy) to show where each thread is busy and
where it waits.
Figures are printed, never asserted: this is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import shutil
import signal
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bench.cpu_use import (
    ceiling_gap,
    ceiling_gap_line,
    cores_by_service,
    cpu_table,
    ratio_on_cores_left,
    steal_mark,
    stolen_cores_since,
)
from bench.record import write as write_record
from bench.system import GpuSampler, end_to_end
from lbc.acting import CoreInputs, acting_agent, forward, frame_ring
from lbc.agents import Acting, family_of, make_acting
from lbc.behaviour import EpisodeBehaviour, sample_actions
from lbc.config import PRESETS, Config, load_config
from lbc.devices import compute_precision, cpu_computes_bf16, pick_device, pinned
from lbc.envs import env_spec, make_envs, resizes_natively
from lbc.launch import SERVICE_ENV_DEFAULTS
from lbc.nets import LBCNet, build_net, policy_net
from lbc.psi import Psi
from lbc.sequences import sequence_layout
from learner_svc.training import Trainer, to_time_major, unrolls_natively


def samples_per_second(step: Callable[[], None], samples: int, seconds: float) -> float:
    """Samples per second of wall time of `step`, `samples` a call, called for `seconds`."""
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        done += samples
    return done / (time.perf_counter() - start)


def env_rate(cfg: Config, seconds: float) -> float:
    """Agent steps per second of the preset's games (games_step)."""
    return samples_per_second(games_step(cfg), cfg.env.num_envs, seconds)


def games_step(cfg: Config) -> Callable[[], None]:
    """One step of the preset's vector of games with random actions (after 20 to warm up); the games close when
    the step is dropped."""
    envs = make_envs(cfg.env, cfg.env.num_envs, seed=0)
    envs.reset()
    rng = np.random.default_rng(0)
    n = envs.spec.num_actions

    def step() -> None:
        envs.step(rng.integers(0, n, cfg.env.num_envs))

    for _ in range(20):
        step()
    return step


def _actor_parts(cfg: Config) -> tuple[np.ndarray, torch.nn.Module, Acting]:
    """A real observation with a full stack (the games' first one stacks zeros), the actor's network on
    actor.device and its family's acting part, every environment in an episode of tau = 1 and equal weights."""
    envs = make_envs(cfg.env, cfg.env.num_envs, seed=0)
    obs = envs.reset()
    for _ in range(envs.spec.frame_stack - 1):
        obs = envs.step(np.zeros(cfg.env.num_envs, np.int64)).obs
    envs.close()
    device = pick_device(cfg.actor.device, "actor.device")
    agent = acting_agent(cfg, envs.spec.obs_shape, envs.spec.num_actions, device)
    acting = make_acting(cfg, agent, cfg.env.num_envs)
    n = cfg.num_components
    for e in range(cfg.env.num_envs):
        acting.begin_episode(e, EpisodeBehaviour("", Psi.uniform(1.0, n)))
    return obs, policy_net(agent), acting


def acting_step(cfg: Config) -> Callable[[], None]:
    """The actor's acting step (lbc.acting.forward, the behaviour, sampling) on one real observation, each call
    one step of the vector of games, its recurrent state carried on."""
    obs, net, acting = _actor_parts(cfg)
    inputs = CoreInputs.start(net, cfg.env.num_envs)
    inputs.reset[:] = False
    ring = frame_ring(cfg, net, cfg.env.num_envs)   # as the actor reads its stacks

    def step() -> None:
        x = obs if ring is None else ring.push(obs)
        out = forward(net, x, inputs, acting.extra_inputs(acting.observe(obs, inputs.reset)))
        sample_actions(acting.behaviour(out))
        inputs.state = out.state
    return step


def inference_rate(cfg: Config, seconds: float) -> float:
    """Samples per second of the actor's acting step (acting_step)."""
    return samples_per_second(acting_step(cfg), cfg.env.num_envs, seconds)


def intrinsic_cost(cfg: Config, fills: tuple[int, ...], steps: int = 50) -> dict[int, float]:
    """Microseconds per agent step of NGU's intrinsic reward (embedding and RND forward passes, the
    k-nearest-neighbour search, the modulator) with every episodic memory holding `fill` embeddings."""
    obs, _, ngu = _actor_parts(cfg)   # an NguActing
    rng = np.random.default_rng(0)
    reset = np.zeros(cfg.env.num_envs, bool)
    out = {}
    for fill in fills:
        memories = ngu.rewards.memories   # every game's episode `fill` steps long so far
        memories.reset(slice(None))
        for _ in range(min(fill, memories.capacity)):
            memories.add(rng.normal(size=memories.slots.shape[::2]))
        ngu.observe(obs, reset)
        start = time.perf_counter()
        for _ in range(steps):
            ngu.observe(obs, reset)
        out[fill] = (time.perf_counter() - start) / (steps * cfg.env.num_envs) * 1e6
    return out


def _learner_batch(cfg: Config) -> dict[str, np.ndarray]:
    """A batch as replay sends it; for a GPU learner in pinned host memory, as the service's batch fetcher
    leaves it on its own thread (learner_svc.batches)."""
    rng = np.random.default_rng(0)
    batch: dict[str, np.ndarray] = {}
    for name, (dtype, shape) in sequence_layout(cfg).items():
        full = (cfg.learner.batch_size, *shape)
        if dtype == "uint8":
            batch[name] = rng.integers(0, 255, full, dtype=np.uint8)
        elif dtype == "bool":
            batch[name] = np.zeros(full, bool)
        elif dtype == "int32":
            batch[name] = rng.integers(0, 3, full).astype(np.int32)
        else:
            batch[name] = np.zeros(full, np.float32)
    batch["behaviour_prob"][:] = 0.3
    return pinned(batch) if pick_device(cfg.learner.device, "learner.device").type == "cuda" else batch


def target_repeat_share(capacity: int, inserted_per_step: float, batch: int, period: int) -> float:
    """The expected share of a uniform FIFO replay's draws that repeat a sequence already drawn since the last
    copy into the target network, whose target outputs the learner keeps (lbc.target_cache).

    A full replay of C sequences takes I new ones per learner step and draws B distinct ones, so a sequence
    stays L = C / I steps and is drawn in a step with probability B / C. A draw at step t of a period of P
    steps (t in [0, P)) finds a sequence of age a (uniform in [0, L), as uniform sampling sees ages), which
    was in replay for min(t, a) of the period's earlier steps:

        share = mean over t, a of 1 - (1 - B / C) ** min(t, a)"""
    if period <= 0:
        return 0.0
    life = max(1, math.ceil(capacity / inserted_per_step))
    steps = np.minimum.outer(np.arange(period), np.arange(life))
    return float(np.mean(1.0 - (1.0 - batch / capacity) ** steps))


def _target_period(cfg: Config) -> int:
    """Learner steps between copies into the target network whose outputs the learner keeps (0: none)."""
    if not cfg.learner.target_cache:
        return 0
    return cfg.ngu.target_update_every if family_of(cfg) == "ngu" else cfg.learner.target_update_every


def expected_target_repeats(cfg: Config) -> float:
    """target_repeat_share for the preset's replay (its replay is uniform in every preset with a target
    network; a prioritised one repeats its likeliest sequences more often than this)."""
    lc, rc = cfg.learner, cfg.replay
    return target_repeat_share(rc.capacity_sequences, lc.batch_size / rc.replay_ratio, lc.batch_size,
                               _target_period(cfg))


def _replay_keyed(batch: dict[str, np.ndarray], repeat: float, seed: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """The bench's batch under new replay keys each step, where a `repeat` share of the rows (at random
    places) keep the keys of the step before: sequences replay draws again while the target network is
    unchanged, as the learner sees them in the system (expected_target_repeats)."""
    rng = np.random.default_rng(seed)
    size = len(batch["reset"])
    again = round(repeat * size)
    keys = np.arange(size, dtype=np.int64)
    versions = np.zeros(size, np.int64)
    while True:
        yield {**batch, "key": keys, "param_version": versions}
        new = np.arange(keys.max() + 1, keys.max() + 1 + size, dtype=np.int64)
        kept = rng.choice(size, again, replace=False)
        new[kept] = keys[kept]
        keys = new


def _one_part_trainer(cfg: Config) -> Trainer:
    """The preset's learner on one core: the batch is not split across threads (with learner.prepare_ahead a
    second thread prepares the next batch)."""
    return Trainer(cfg.model_copy(update={"learner": cfg.learner.model_copy(update={"split_batch": 1})}))


def learner_step(cfg: Config) -> tuple[Trainer, Callable[[], None]]:
    """The preset's learner on one core (_one_part_trainer) and one training step of it per call, on batches as
    replay sends them; with a target network its outputs kept for the share of sequences replay would draw
    again (expected_target_repeats)."""
    batches = _replay_keyed(_learner_batch(cfg), expected_target_repeats(cfg))
    trainer = _one_part_trainer(cfg)
    pair = [next(batches), next(batches)]   # the batch and the one after it (learner.prepare_ahead reads it)

    def step() -> None:
        trainer.train_step(*pair)
        pair[:] = [pair[1], next(batches)]
    return trainer, step


def learner_rate(cfg: Config, seconds: float) -> float:
    """Learning samples per second of one core: batch x learning length per step (burn-in is extra work, not
    counted), by learner_step. With learner.prepare_ahead a CPU learner prepares each next batch in a second
    thread, and the rate is per second of CPU time over both threads (the ceiling counts cores); a GPU
    learner's is per second of wall clock either way."""
    trainer, step = learner_step(cfg)
    clock = time.process_time if cfg.learner.prepare_ahead and trainer.device.type == "cpu" else time.perf_counter
    step()   # warm-up
    steps, start, wall = 0, clock(), time.perf_counter()
    while time.perf_counter() - wall < seconds:
        step()
        steps += 1
    if trainer.device.type == "cuda":
        torch.cuda.synchronize()
    return steps * cfg.learner.batch_size * cfg.sequence.length / (clock() - start)


def cpu_timed(step: Callable[[], None]) -> Callable[[], float]:
    """`step` returning the CPU seconds it took, every thread of the process counted (learner.prepare_ahead)."""
    def timed() -> float:
        start = time.process_time()
        step()
        return time.process_time() - start
    return timed


def cpu_block(step: Callable[[], float], block_seconds: float) -> float:
    """Seconds per step of `step` (cpu_timed) over a block of `block_seconds` of what it returns, after one step
    not counted: the first after a switch from another read or setting warms the allocator for it."""
    step()
    spent, steps = 0.0, 0
    while spent < block_seconds:
        spent += step()
        steps += 1
    return spent / steps


def stage_step(cfg: Config, stage: str) -> tuple[Callable[[], float], int]:
    """One step of `stage` as bench.throughput measures it alone, returning the CPU seconds it took (every thread
    of this process: learner.prepare_ahead's too), and the samples a step makes."""
    if stage == "learner":
        return cpu_timed(learner_step(cfg)[1]), cfg.learner.batch_size * cfg.sequence.length
    if stage == "environment":
        return cpu_timed(games_step(cfg)), cfg.env.num_envs
    return cpu_timed(acting_step(cfg)), cfg.env.num_envs


def stage_figures(step: Callable[[], float], samples: int, block_seconds: float) -> dict[str, float]:
    """A block of `step` (stage_step) of `block_seconds` CPU seconds, after one step to warm up after the other
    arm's block: samples per CPU second and CPU milliseconds a step."""
    seconds = cpu_block(step, block_seconds)
    return {"samples_per_cpu_s": samples / seconds, "cpu_ms_per_step": 1e3 * seconds}


def in_turn(arms: list[tuple[Callable[[], float], int]], seconds: float) -> list[float]:
    """Samples per CPU second of each of two stage steps (stage_step: the preset's and a lever's), measured in four
    blocks of `seconds` / 2 CPU seconds taking turns, A B B A: a drift of the host steady over the minutes the levers
    take moves both alike. Measured one after the other, a lever read the hour as well as itself (session 60: the
    acting step alone 7,043 samples/s before the levers, 4,519 minutes later)."""
    per_step: list[list[float]] = [[], []]
    for arm in (0, 1, 1, 0):
        per_step[arm].append(cpu_block(arms[arm][0], seconds / 2))
    return [samples / statistics.fmean(times) for (_, samples), times in zip(arms, per_step, strict=True)]


def learner_parts(cfg: Config, steps: int = 10) -> dict[str, float]:
    """Milliseconds per learner step in its parts, waiting for the device after each: the batch's copy to
    the learner's device, forward and loss (copy excluded), backward, clipping and the optimiser step; on a
    GPU also the peak memory allocated (MiB). Target outputs are kept as in learner_rate."""
    batches = _replay_keyed(_learner_batch(cfg), expected_target_repeats(cfg))
    trainer = _one_part_trainer(cfg)
    cuda = trainer.device.type == "cuda"

    def wait() -> float:
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    totals = dict.fromkeys(("copy", "forward+loss", "backward", "optimiser"), 0.0)
    for i in range(steps + 2):   # two warm-up steps
        batch = next(batches)
        t0 = wait()
        to_time_major(batch, trainer.device)
        t1 = wait()
        out = trainer._loss(batch)
        t2 = wait()
        out.total.backward()
        t3 = wait()
        trainer._clip_gradients()
        trainer.optimiser.step()
        trainer.optimiser.zero_grad(set_to_none=True)
        trainer.step += 1
        trainer.loss.after_step(trainer.step)   # the target network's copies, as in train_step
        t4 = wait()
        if i >= 2:
            for part, dt in zip(totals, (t1 - t0, t2 - t1 - (t1 - t0), t3 - t2, t4 - t3), strict=True):
                totals[part] += dt * 1e3 / steps
    if cuda:
        totals["peak MiB"] = torch.cuda.max_memory_allocated() / 2**20
    return totals


# views and allocations: no kernel runs for them
_NO_KERNEL = frozenset({
    "view", "_unsafe_view", "as_strided", "select", "slice", "t", "transpose", "expand", "unsqueeze", "squeeze",
    "split", "split_with_sizes", "chunk", "unbind", "permute", "reshape", "alias", "detach", "_reshape_alias",
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh", "_local_scalar_dense",
    "is_same_size"})


class _OperationCount(TorchDispatchMode):
    """Counts the ATen operations dispatched under it that run a kernel."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: torch._ops.OpOverload, types: object, args: tuple = (),
                           kwargs: dict | None = None) -> object:
        if func._schema.name.split("::")[-1] not in _NO_KERNEL:
            self.count += 1
        return func(*args, **(kwargs or {}))


def learner_operations(cfg: Config, batch_size: int = 2) -> int:
    """Operations one eager learner step dispatches, forward, loss, backward and optimiser, each at least one
    kernel launch on a GPU, where launching is what bounds the paper preset's step (docs/speed.md). Counted on
    the CPU with learner.compile and cuda_graphs off, the unroll as a GPU runs it (not lbc.native's), one part,
    nothing prepared ahead and every target unrolled, so that the count is the same from step to step; it does not
    depend on the batch size, so a batch of two makes it."""
    cfg = cfg.model_copy(update={"learner": cfg.learner.model_copy(update={
        "device": "cpu", "compile": False, "cuda_graphs": False, "native_unroll": False, "prepare_ahead": False,
        "target_cache": False, "split_batch": 1, "batch_size": batch_size})})
    batch = _learner_batch(cfg)
    trainer = Trainer(cfg)
    trainer.train_step(batch)   # the optimiser's state is made in the first step
    counter = _OperationCount()
    with counter:
        trainer.train_step(batch)
    return counter.count


# Settings that change how fast a stage runs and not what is learnt per frame (bf16: decisions 40 and 63, its
# loss terms within 2% of fp32's, tests/unit/test_devices.py), each measured on the stage it acts on.
def learner_levers(cfg: Config) -> dict[str, tuple[str, list[str]]]:
    """The learner's levers against what the preset runs: batches prepared ahead or not, whichever it does not
    (a row read backwards where it does), and, where it keeps a target network's outputs (lbc.target_cache),
    not keeping them (read backwards: what keeping them gives); where it reads frames in blocks, has lbc.native
    write their stacks or unrolls its LSTM natively, not doing so. A lever the preset cannot use (a target cache
    without a target network) is no row: it would measure the preset again."""
    ahead = cfg.learner.prepare_ahead
    levers = {f"batches {'not ' if ahead else ''}prepared ahead": ("learner", [f"learner.prepare_ahead={not ahead}"])}
    if cfg.learner.target_update_every > 0 and cfg.learner.target_cache:
        levers["target outputs not kept"] = ("learner", ["learner.target_cache=false"])
    net, device = learner_net(cfg), pick_device(cfg.learner.device, "learner.device").type
    if net.blocks_on(device) > 1:
        levers["frames not in blocks"] = ("learner", ["learner.frame_blocks=false"])
    if net.writes_stacks_natively(device):
        levers["stacks by torch's passes"] = ("learner", ["learner.native_stacks=false"])
    if learner_unrolls_natively(cfg):
        levers["LSTM by TorchScript"] = ("learner", ["learner.native_unroll=false"])
    return levers


def learner_unrolls_natively(cfg: Config) -> bool:
    """Whether the preset's learner has a LayerNorm-LSTM and unrolls it by lbc.native's C++ (decision 90)."""
    return cfg.net.core == "layernorm_lstm" and unrolls_natively(cfg, pick_device(cfg.learner.device,
                                                                                   "learner.device"))


def learner_net(cfg: Config) -> LBCNet:
    """The preset's network set to read frames as its learner does (decisions 83, 92, 96): in blocks where set so
    and its first convolution can, their stacks written by lbc.native where set so."""
    spec = env_spec(cfg.env)
    return build_net(cfg, spec.obs_shape, spec.num_actions).set_frame_blocks(cfg.learner.frame_blocks,
                                                                              cfg.learner.native_stacks)


def actor_levers(cfg: Config) -> dict[str, tuple[str, list[str]]]:
    """Where the preset's actors read their stacks through a frame ring (lbc.acting.frame_ring, decision 85), the
    stacks read whole at every step instead, and where lbc.native pushes the ring (decision 97), torch's passes
    instead; on the inference stage (rows read backwards)."""
    spec = env_spec(cfg.env)
    agent = acting_agent(cfg, spec.obs_shape, spec.num_actions, pick_device(cfg.actor.device, "actor.device"))
    ring = frame_ring(cfg, policy_net(agent), 1)
    if ring is None:
        return {}
    levers = {"stacks read whole": ("inference", ["actor.frame_ring=false"])}
    if ring.pushed_by == "lbc.native":
        levers["ring pushed by torch's passes"] = ("inference", ["actor.native_ring=false"])
    return levers


def env_levers(cfg: Config) -> dict[str, tuple[str, list[str]]]:
    """Where the preset's Atari screens are resized by lbc.native (decision 94), resized by ALE's own code instead,
    on the games' stage (a row read backwards)."""
    if cfg.env.kind != "atari" or not resizes_natively(cfg.env):
        return {}
    return {"screens resized by ALE": ("environment", ["env.native_resize=false"])}


# measured on a GPU learner only, where launching the recurrence's small kernels bounds the step (decision 56)
GPU_LEVERS: dict[str, tuple[str, list[str]]] = {
    "recurrence as CUDA graphs": ("learner", ["learner.cuda_graphs=true"]),
    "recurrence compiled": ("learner", ["learner.compile=true"]),
}


def core_seconds_per_step(env: float, inference: float, learner: float, replay_ratio: float) -> tuple[float, float]:
    """Seconds of one core an agent step costs with each stage at its rate alone: acting (an actor steps its
    games and then runs inference in one loop, so the two add) and learning (replay_ratio samples trained per
    agent step)."""
    return 1 / env + 1 / inference, replay_ratio / learner


def ceiling_rate(cores: int, env: float, inference: float, learner: float, replay_ratio: float,
                 learner_on_gpu: bool) -> float:
    """Agent steps/s the machine could reach with each stage at its rate alone: a CPU learner takes cores from
    the acting, a GPU learner bounds the rate by itself."""
    acting, learning = core_seconds_per_step(env, inference, learner, replay_ratio)
    if learner_on_gpu:
        return min(cores / acting, 1 / learning)
    return cores / (acting + learning)


def learner_bound_frames(cfg: Config, learner_steps_per_s: float) -> float:
    """Frames/s the learner's steps keep up with at the replay ratio. A step trains on batch_size sequences per
    replica, each of sequence.length new agent steps (sequences overlap by the burn-in), and each sequence is
    trained on replay_ratio times: agent steps/s = steps/s x batch_size x replicas x length / replay_ratio.
    A window's frames/s above it were held in the rate limiter's slack and the queues to replay, not trained on
    at the ratio: the system cannot keep that rate for longer than those buffers last."""
    sequences = cfg.learner.batch_size * cfg.learner.replicas
    return (learner_steps_per_s * sequences * cfg.sequence.length * cfg.env.frames_per_step
            / cfg.replay.replay_ratio)


def precision_lever(cfg: Config) -> dict[str, tuple[str, list[str]]]:
    """The learner and the actors' inference each in the precision the preset does not run in on this machine
    (precision=auto is bf16 on a CPU that computes in bfloat16, else fp32): a row reads forwards for bf16,
    backwards for fp32."""
    levers = {}
    for stage, section in (("learner", "learner"), ("inference", "actor")):
        settings = getattr(cfg, section)
        running = compute_precision(settings.precision, pick_device(settings.device, f"{section}.device"))
        other = "fp32" if running == "bf16" else "bf16"
        levers[f"{section} in {other}"] = (stage, [f"{section}.precision={other}"])
    return levers


def stage_on_cpu(cfg: Config, stage: str) -> bool:
    """Whether the inference or learner stage of `cfg` runs on the CPU, where in_turn's CPU seconds measure it (the
    games always do)."""
    if stage == "environment":
        return True
    section = "learner" if stage == "learner" else "actor"
    return pick_device(getattr(cfg, section).device, f"{section}.device").type == "cpu"


def lever_rows(preset: Config, cfg_of: dict[str, tuple[str, Config]], base: dict[str, float], cores: int,
               seconds: float) -> Iterator[dict]:
    """One row per lever, as it is measured: the stage it acts on measured with it ("rate"), its gain over the
    preset, and the ceiling the whole machine would have with it (frames/s): the preset's stages with this one's
    rate scaled by the gain. On the CPU the gain is against the preset's stage measured in turn with the lever's
    (in_turn, over 2 x `seconds`; "preset_rate" is that measure of the preset); elsewhere against the preset's rate
    in `base`, measured before the levers."""
    rates = {"environment": env_rate, "inference": inference_rate, "learner": learner_rate}
    preset_steps: dict[str, tuple[Callable[[], float], int]] = {}   # built once a stage, measured beside each lever
    for lever, (stage, cfg) in cfg_of.items():
        preset_rate = None
        if stage_on_cpu(cfg, stage) and stage_on_cpu(preset, stage):
            if stage not in preset_steps:
                preset_steps[stage] = stage_step(preset, stage)
            preset_rate, rate = in_turn([preset_steps[stage], stage_step(cfg, stage)], seconds)
            gain = rate / preset_rate
        else:
            rate = rates[stage](cfg, seconds)
            gain = rate / base[stage]
        with_lever = {**base, stage: base[stage] * gain}
        ceiling = ceiling_rate(cores, with_lever["environment"], with_lever["inference"], with_lever["learner"],
                               cfg.replay.replay_ratio, pick_device(cfg.learner.device, "learner.device").type == "cuda"
                               ) * cfg.env.frames_per_step
        yield {"lever": lever, "stage": stage, "rate": rate, "gain": gain, "ceiling_frames_per_s": ceiling,
               "preset_rate": preset_rate}


LEVER_HEADER = "lever                      stage        alone/s  preset/s    gain   ceiling frames/s"


def lever_line(row: dict) -> str:
    preset = "-" if row.get("preset_rate") is None else f"{row['preset_rate']:,.0f}"
    return (f"{row['lever']:26} {row['stage']:11} {row['rate']:9,.0f} {preset:>9} {row['gain']:6.2f}x "
            f"{row['ceiling_frames_per_s']:12,.0f}")


def actors_to_fill(cores: int, env: float, inference: float, learner: float, replay_ratio: float) -> int:
    """Actor processes a machine with a CPU learner needs to reach its ceiling. An actor steps its games and
    runs inference in turn, so it keeps at most one core busy; at the ceiling acting takes
    cores x (1/env + 1/inference) / (1/env + 1/inference + ratio/learner) of the cores. Fewer actors leave
    cores idle; more only add processes. A tenth of a core short is not worth another actor."""
    acting, learning = core_seconds_per_step(env, inference, learner, replay_ratio)
    return max(1, math.ceil(cores * acting / (acting + learning) - 0.1))


def apply_machine_defaults(args: argparse.Namespace, gpu: bool) -> None:
    """What a plain `make bench` measures: on a GPU machine the paper's preset with the actors' inference on
    the GPU and the actor-scaling curve (issue 11); on a CPU machine the embedded default, with the actors
    its stages say fill the cores (actors_to_fill, once they are measured: args.actors stays None)."""
    paper_on_gpu = gpu and args.preset is None
    if args.preset is None:
        args.preset = "lbc-bm" if gpu else "cpu"
    if paper_on_gpu and not any(o.startswith("actor.device=") for o in args.overrides):
        args.overrides.append("actor.device=cuda")
    if args.actors is None and paper_on_gpu:
        args.actors = 12
    if args.actor_scaling is None:
        args.actor_scaling = "1,2,4,8,12" if paper_on_gpu else ""


def preset_config(preset: str, game: str | None, overrides: list[str]) -> tuple[Config, str]:
    """The preset's configuration with `game` (None: the preset's own) and the overrides, and the name of the game
    to pass to the launcher's --game. Raises ValueError (pydantic's ValidationError among them) naming the field."""
    cfg = load_config(preset, [*([f"env.game={game}"] if game else []), *overrides])
    return cfg, game or ("catch" if cfg.env.kind == "catch" else cfg.env.game)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.throughput", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS),
                        help="default: lbc-bm (the paper's scale) where a GPU is visible, else cpu")
    parser.add_argument("--game", default=None, help="default: the preset's own (pong for the Atari presets, "
                        "breakout for minatar, catch for catch)")
    parser.add_argument("--actors", type=int, help="default: 12 for lbc-bm on a GPU, else as many as the "
                        "stages say keep the cores busy at the ceiling (1 for cpu, 2 for impala on 2 cores)")
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--stage-seconds", type=float, default=10.0, help="length of each stage measured alone")
    parser.add_argument("--seconds", type=float, default=120.0, help="end-to-end measuring window")
    parser.add_argument("--warmup", type=float, default=30.0,
                        help="end-to-end seconds of the running system discarded before the window, from when every "
                             "service answers at its metrics port")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--stages-only", action="store_true", help="measure the stages alone, not the whole system")
    parser.add_argument("--end-to-end-only", action="store_true",
                        help="run the whole system without measuring the stages first (no ceiling; needs --actors): "
                             "for A/B runs of settings where each minute counts, as on a lent GPU")
    parser.add_argument("--levers", action="store_true",
                        help="also measure each speed lever on the stage it acts on: the learner's and the actors' "
                        "other precision, batches prepared ahead or not (whichever the preset does not), the target "
                        "network's outputs not kept (where it keeps them)"
                        + "; and where the stages chose more than one actor, the whole system with one actor; the "
                        "whole system with the actors' other inference (actor.inference local or remote)")
    parser.add_argument("--profile", action="store_true",
                        help="sample every service with py-spy right after the end-to-end window (bench.spy; within "
                             "it, py-spy's own CPU would count against the figures): where each thread is busy and "
                             "where it waits")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="also write every figure to DIR/bench.json and the story in pictures to DIR/bench.png "
                             "(bench.record; `make bench` writes runs/bench/<time>)")
    parser.add_argument("--actor-scaling", metavar="N,N,...",
                        help="also run the whole system with each of these actor counts, e.g. 1,2,4,8,12 "
                             "(default: those for lbc-bm on a GPU, none otherwise)")
    return parser


def describe_cpu(cpuinfo: str, capability: str, bf16: bool) -> str:
    """The CPU as /proc/cpuinfo names it (model name, family and model: the same VM kind has come as AMD EPYC
    hosts of different generations, which /proc/cpuinfo's name alone does not tell apart), the widest vector
    instructions torch's kernels use on it, and whether it computes bfloat16 in hardware, which decides the
    presets' precision (lbc.devices.compute_precision): figures from hosts that differ here do not compare."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name") or platform.processor() or platform.machine()
    generation = ""
    if "cpu family" in fields and "model" in fields:
        generation = f" (family {fields['cpu family']} model {fields['model']})"
    return f"{name}{generation}, {capability}, {'bf16 in hardware' if bf16 else 'no bf16 in hardware'}"


def under_mps(environ: Mapping[str, str]) -> bool:
    """Whether NVIDIA's MPS control daemon listens where this process's CUDA would look for it (its pipe
    directory, CUDA_MPS_PIPE_DIRECTORY or /tmp/nvidia-mps): the services' kernels then share the GPU instead of
    time-slicing it, which moved the paper's preset from learner-bound to actor-bound (docs/speed.md)."""
    return (Path(environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps") / "control").exists()


def describe_machine() -> str:
    """describe_cpu for this machine, and its GPU where one is visible, with whether MPS shares it."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    cpu = describe_cpu(cpuinfo, torch.backends.cpu.get_cpu_capability(), cpu_computes_bf16())
    if not torch.cuda.is_available():
        return cpu
    return f"{cpu}, {torch.cuda.get_device_name()}{' under MPS' if under_mps(os.environ) else ''}"


def allocate_as_services(module: str) -> None:
    """Run `python -m module` again with the services' environment unless it has it: glibc reads its tunables
    at start, and the stages measured in this process should allocate as the services do."""
    if any(name not in os.environ for name in SERVICE_ENV_DEFAULTS):
        env = {**SERVICE_ENV_DEFAULTS, **os.environ}
        os.execve(sys.executable, [sys.executable, "-m", module, *sys.argv[1:]], env)


def argument_problem(args: argparse.Namespace) -> str:
    """Why these parsed arguments cannot run together ('' when they can)."""
    if args.end_to_end_only and (args.stages_only or args.levers or args.actors is None):
        return ("--end-to-end-only needs --actors (without the stages nothing chooses them) and runs no stage: "
                "not with --stages-only or --levers")
    return ""


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    if problem := argument_problem(args):
        parser.error(problem)
    allocate_as_services("bench.throughput")
    signal.signal(signal.SIGTERM, signal.default_int_handler)   # a kill stops the system under test too
    apply_machine_defaults(args, torch.cuda.is_available())

    try:
        cfg, args.game = preset_config(args.preset, args.game, args.overrides)
    except ValueError as exc:   # pydantic's ValidationError is one
        parser.error(str(exc))
    torch.set_num_threads(1)
    machine = describe_machine()
    print(f"machine: {machine}, {args.cores} cores, torch {torch.__version__}; "
          f"preset {args.preset}, game {args.game}, {cfg.env.num_envs} envs/actor, batch {cfg.learner.batch_size} x "
          f"{cfg.sequence.length} (+{cfg.sequence.burn_in} burn-in), replay ratio {cfg.replay.replay_ratio}",
          flush=True)
    print("process environment: " + ", ".join(f"{name}={os.environ[name]}" for name in sorted(SERVICE_ENV_DEFAULTS)),
          flush=True)
    record: dict = {"machine": machine, "cores": args.cores, "preset": args.preset, "game": args.game,
                    "settings": args.overrides, "torch": torch.__version__, "time": time.time()}
    try:
        if args.end_to_end_only:
            env = inf = learn = ceiling = None
        else:
            env, inf, learn, ceiling = stages(args, cfg, record)
        if not args.stages_only:
            end_to_end_lines(args, cfg, env, inf, learn, ceiling, record)
    except BaseException:   # an error or Ctrl-C late in a long run: what it measured so far is kept
        if args.out is not None:
            data, picture = write_record(record, args.out)
            print(f"wrote what was measured before the error to {data} and {picture}", flush=True)
        raise
    if args.out is not None:
        data, picture = write_record(record, args.out)
        print(f"wrote {data} and {picture}", flush=True)
    return 0


def stages(args: argparse.Namespace, cfg: Config, record: dict) -> tuple[float, float, float, float]:
    """Each stage alone, the learner's parts and, with --levers, each lever on its stage, printed and kept in
    `record` (bench.record); returns (environment agent steps/s, inference samples/s, learner samples/s,
    ceiling agent steps/s)."""
    frame_skip = cfg.env.frames_per_step
    mark = steal_mark()
    env = env_rate(cfg, args.stage_seconds)
    print(f"environment alone (1 core): {env:10,.0f} agent steps/s ({env * frame_skip:,.0f} frames/s)",
          flush=True)
    inf = inference_rate(cfg, args.stage_seconds)
    inference_precision = compute_precision(cfg.actor.precision, pick_device(cfg.actor.device, "actor.device"))
    print(f"inference alone   (1 core, {cfg.actor.device} device, {inference_precision}): {inf:10,.0f} samples/s",
          flush=True)
    if family_of(cfg) == "ngu":
        costs = intrinsic_cost(cfg, (1, 1_000, 5_000, cfg.ngu.memory_capacity))
        print("NGU intrinsic reward per agent step, by episodic memory fill: "
              + ", ".join(f"{fill:,}: {us:,.0f} us" for fill, us in costs.items())
              + f" (the whole inference stage: {1e6 / inf:,.0f} us at fill 1)", flush=True)
    learn = learner_rate(cfg, args.stage_seconds)
    learner_device = pick_device(cfg.learner.device, "learner.device").type
    precision = compute_precision(cfg.learner.precision, torch.device(learner_device))
    print(f"learner alone     (1 core, {learner_device} device, {precision}): {learn:10,.0f} samples/s", flush=True)
    if cfg.learner.prepare_ahead and learner_device == "cpu":
        print("  per second of CPU time: the next batch prepared in a second thread (learner.prepare_ahead)",
              flush=True)
    if _target_period(cfg):
        print(f"  the target network's outputs kept for {expected_target_repeats(cfg):.0%} of the sequences (what "
              "replay would draw again before the next copy; lbc.target_cache)", flush=True)
    parts = learner_parts(cfg)
    print("learner step, ms:  " + ", ".join(f"{part} {ms:,.1f}" for part, ms in parts.items()), flush=True)
    operations = learner_operations(cfg)
    print(f"learner step, operations dispatched (eager, counted on the CPU): {operations:,}", flush=True)
    ratio = cfg.replay.replay_ratio
    on_gpu = learner_device == "cuda"
    ceiling = ceiling_rate(args.cores, env, inf, learn, ratio, on_gpu)
    formula = (f"min({args.cores} / (1/env + 1/inference), learner/{ratio})" if on_gpu
               else f"{args.cores} / (1/env + 1/inference + {ratio}/learner)")
    print(f"ceiling = {formula} = {ceiling:,.0f} agent steps/s = {ceiling * frame_skip:,.0f} frames/s", flush=True)
    stolen = stolen_cores_since(mark)
    print(steal_line(stolen, args.cores), flush=True)
    record["stages"] = {"environment_agent_steps_per_s": env, "inference_samples_per_s": inf,
                        "learner_samples_per_s": learn, "learner_step_ms": parts, "operations": operations,
                        "ceiling_frames_per_s": ceiling * frame_skip, "stolen_cores": stolen}
    if args.levers:
        settings = (precision_lever(cfg) | learner_levers(cfg) | actor_levers(cfg) | env_levers(cfg)
                    | (GPU_LEVERS if on_gpu else {}))
        levers = {name: (stage, load_config(args.preset, [f"env.game={args.game}", *args.overrides, *sets]))
                  for name, (stage, sets) in settings.items()}
        base = {"environment": env, "inference": inf, "learner": learn}
        print("levers: each CPU stage's gain against the preset's measured in turn with it (A B B A blocks of CPU "
              "time); the ceiling with the preset's stages and this one's scaled by the gain", flush=True)
        print(LEVER_HEADER, flush=True)
        record["levers"] = []
        for row in lever_rows(cfg, levers, base, args.cores, args.stage_seconds):
            print(lever_line(row), flush=True)
            record["levers"].append(row)
    return env, inf, learn, ceiling


def stages_again(args: argparse.Namespace, cfg: Config, before: float, achieved: float, on_gpu: bool) -> dict:
    """The three stages measured alone again right after the preset's window, and achieved against the mean of the
    ceilings before and after it: the 2-core VM's host drifts by 10-30% within an hour (docs/speed.md), so a
    ceiling measured minutes before the window may belong to another hour than the window. Printed, and returned
    for `record`."""
    mark = steal_mark()
    env, inf, learn = (env_rate(cfg, args.stage_seconds), inference_rate(cfg, args.stage_seconds),
                       learner_rate(cfg, args.stage_seconds))
    stolen = stolen_cores_since(mark)
    after = ceiling_rate(args.cores, env, inf, learn, cfg.replay.replay_ratio, on_gpu)
    frame_skip = cfg.env.frames_per_step
    print(f"the stages alone again after the window: environment {env:,.0f} agent steps/s, inference {inf:,.0f} "
          f"samples/s, learner {learn:,.0f} samples/s; " + drift_line(before, after, achieved, frame_skip), flush=True)
    print("  " + steal_line(stolen, args.cores), flush=True)
    return {"environment_agent_steps_per_s": env, "inference_samples_per_s": inf, "learner_samples_per_s": learn,
            "ceiling_frames_per_s": after * frame_skip, "ratio_to_mean_ceiling": ratio_to_mean(achieved, before, after),
            "stolen_cores": stolen}


def steal_line(stolen: float, cores: int) -> str:
    """What the hypervisor took while the stages alone were measured: the games' and inference's rates are per
    second of wall time, so steal time lowers them; the learner's, per CPU second, leaves it out."""
    return (f"while the stages ran the hypervisor took {stolen:.2f} of the {cores} cores (steal time: it lowers the "
            "games' and inference's rates, per second of wall time, not the learner's, per CPU second)")


def ratio_to_mean(achieved: float, before: float, after: float) -> float:
    """Achieved against the mean of the ceilings before and after the window (agent steps/s each)."""
    return achieved / ((before + after) / 2)


def drift_line(before: float, after: float, achieved: float, frame_skip: int) -> str:
    """The ceiling after the window against the one before (agent steps/s each), and achieved against their mean."""
    mean_ratio = ratio_to_mean(achieved, before, after)
    return (f"ceiling {after * frame_skip:,.0f} frames/s (before the window {before * frame_skip:,.0f}: "
            f"{after / before - 1:+.0%}); achieved / the two ceilings' mean = {mean_ratio:.2f}")


def split_line(what: str, unit: str, split: dict[str, float]) -> str:
    """One part-by-part line of milliseconds (bench.system's learner_step_split, actor_loop_split)."""
    line = (f"{what} in the system, ms ({unit}, {sum(split.values()):,.1f} in all): "
            + ", ".join(f"{part} {ms:,.1f}" for part, ms in split.items()))
    if split.get("the rest", 0.0) < 0:   # a part's counter is added to when the part ends
        line += (" (the rest below zero: waits that began before the window ended inside it; the system was "
                 "still starting)")
    return line


def end_to_end_lines(args: argparse.Namespace, cfg: Config, env: float | None, inf: float | None,
                     learn: float | None, ceiling: float | None, record: dict) -> None:
    """The whole system with each actor count, a line each; for args.actors also achieved / ceiling (where
    the stages ran) and the CPU by service; each kept in `record` (bench.record) too."""
    frame_skip, ratio = cfg.env.frames_per_step, cfg.replay.replay_ratio
    on_gpu = pick_device(cfg.learner.device, "learner.device").type == "cuda"
    scaling_counts = {int(n) for n in args.actor_scaling.split(",") if n}
    if args.actors is None:
        args.actors = (1 if on_gpu else actors_to_fill(args.cores, env, inf, learn, ratio))
        print(f"actors: {args.actors} (an actor keeps at most one core busy; at the ceiling acting takes "
              f"{ceiling * core_seconds_per_step(env, inf, learn, ratio)[0]:.2f} of the {args.cores} cores)",
              flush=True)
        if args.levers and args.actors > 1:   # the actor count as a lever: the whole system with one actor too
            scaling_counts.add(1)
    gpu = shutil.which("nvidia-smi") is not None and torch.cuda.is_available()
    # smallest first: scaling is each count's frames/s against linear growth from the smallest
    counts = sorted({args.actors, *scaling_counts})
    first = None
    preset_fps = None
    for actors in counts:
        sampler = GpuSampler() if gpu else None
        e2e = end_to_end(args.preset, args.game, actors, args.seconds, args.warmup, args.overrides,
                         profile=args.profile and actors == args.actors)
        achieved = e2e["frames_per_s"] / frame_skip
        bound = learner_bound_frames(cfg, e2e["learner_steps_per_s"])
        first = first or (actors, e2e["frames_per_s"])
        scaling = e2e["frames_per_s"] / (first[1] * actors / first[0])
        line = (f"end to end ({actors} actor(s), {e2e['seconds']:.0f} s after {args.warmup:.0f} s warm-up): "
                f"{e2e['frames_per_s']:,.0f} frames/s = {achieved:,.0f} agent steps/s, "
                f"learner {e2e['learner_steps_per_s']:.2f} steps/s (they keep up with {bound:,.0f} frames/s), "
                f"lag {e2e['lag']}")
        held, waited = e2e["waits"]
        line += f", replay held the actors back {held:.0%} of the time and the learner waited for data {waited:.0%}"
        if e2e["target_repeats"] is not None:
            line += f", target outputs kept for {e2e['target_repeats']:.0%} of the sequences"
        if sampler is not None:
            util, memory = sampler.stop()
            line += f", GPU {util:.0f}% busy, {memory:,.0f} MiB"
        run = {"actors": actors, "frames_per_s": e2e["frames_per_s"], "learner_steps_per_s": e2e["learner_steps_per_s"],
               "learner_bound_frames_per_s": bound, "lag": e2e["lag"], "held": held, "waited": waited,
               "scaling": scaling}
        if sampler is not None:
            run |= {"gpu_busy_percent": util, "gpu_memory_mib": memory}
        record.setdefault("end_to_end", []).append(run)
        if actors != first[0]:
            line += (f", {e2e['frames_per_s'] / first[1]:.2f}x the frames/s of {first[0]} actor(s), {scaling:.2f} of "
                     f"linear")
        print(line, flush=True)
        if bound > 0 and e2e["frames_per_s"] > 1.05 * bound:   # no step in the window: nothing to compare
            print(f"  the window's frames/s are {e2e['frames_per_s'] / bound:.2f}x what the learner's steps kept up "
                  "with: the rest filled the rate limiter's slack and the queues to replay, which cannot go on. The "
                  "rate the system keeps lies between the two (on shared cores the learner speeds up once the "
                  "actors are held); a longer --seconds measures it", flush=True)
        if actors == args.actors:
            preset_fps = e2e["frames_per_s"]
            record |= {"actors": actors, "agent_steps_per_s": achieved, "learner_step_ms": e2e["learner_step_ms"],
                       "actor_loop_ms": e2e["actor_loop_ms"], "inference_passes": e2e["inference_passes"],
                       "cpu": cores_by_service(*e2e["cpu"], e2e["seconds"]), "stolen_cores": e2e["stolen_cores"],
                       "busiest_threads": e2e["threads"]}
            if ceiling is not None:
                record["ratio"] = achieved / ceiling
                if on_gpu:
                    print(f"achieved / ceiling = {achieved / ceiling:.2f}", flush=True)
                else:   # the ratio as the CPU the ceiling charges an agent step against what the window spent
                    acting, learning = core_seconds_per_step(env, inf, learn, ratio)
                    gap = ceiling_gap(record["cpu"], args.cores, achieved, acting * 1e3, learning * 1e3,
                                      e2e["stolen_cores"])
                    record["ceiling_gap_ms"] = gap
                    record["ratio_on_cores_left"] = ratio_on_cores_left(gap)
                    print(ceiling_gap_line(gap), flush=True)
                record["stages_after"] = stages_again(args, cfg, ceiling, achieved, on_gpu)
            for what, unit, key in (("learner step", "the training thread", "learner_step_ms"),
                                    ("an actor's loop", f"its {cfg.env.num_envs} games stepped once", "actor_loop_ms")):
                if e2e[key]:
                    print(split_line(what, unit, e2e[key]), flush=True)
            print_inference_passes(e2e["inference_passes"])
            print(f"CPU by service over {e2e['seconds']:.0f} s of that window:", flush=True)
            for row in cpu_table(*e2e["cpu"], e2e["seconds"], achieved, args.cores, e2e["stolen_cores"],
                                 e2e["threads"]):
                print(row, flush=True)
            for row in e2e["profile"]:
                print(row, flush=True)
    other = other_inference(cfg)
    if args.levers and other is not None:
        e2e = end_to_end(args.preset, args.game, args.actors, args.seconds, args.warmup,
                         [*args.overrides, f"actor.inference={other}"])
        print(f"end to end with actor.inference={other} ({args.actors} actor(s)): {e2e['frames_per_s']:,.0f} "
              f"frames/s, {e2e['frames_per_s'] / preset_fps:.2f}x the preset's, learner "
              f"{e2e['learner_steps_per_s']:.2f} steps/s, lag {e2e['lag']}", flush=True)
        record["other_inference"] = {"inference": other, "frames_per_s": e2e["frames_per_s"],
                                     "x": e2e["frames_per_s"] / preset_fps,
                                     "inference_passes": e2e["inference_passes"]}
        print_inference_passes(e2e["inference_passes"])


def print_inference_passes(passes: dict[str, float]) -> None:
    """The inference service's line (bench.system.inference_passes), where the run had one."""
    if passes:
        print("the inference service: " + ", ".join(f"{v:,.1f} {k}" for k, v in passes.items()), flush=True)


def other_inference(cfg: Config) -> str | None:
    """The actors' other way of inference than the preset's (actor.inference, decision 68), as a lever of the
    whole system; None where the family acts only locally (NGU)."""
    if cfg.ngu.enabled:
        return None
    return "local" if cfg.actor.inference == "remote" else "remote"


if __name__ == "__main__":
    raise SystemExit(main())
