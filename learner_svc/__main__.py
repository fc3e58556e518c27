"""learner_svc: trains every policy (or NGU's Q-network and its auxiliary networks) from replay
batches and hosts the ParameterService."""

from __future__ import annotations

import argparse
import logging
import os
import threading
import time
from collections.abc import Iterator, MutableMapping
from pathlib import Path

import torch
from prometheus_client import Counter, Gauge

from lbc.config import Config
from lbc.devices import limit_mps_share, pick_device, set_gpu_wait
from lbc.files import remove_stale_temporaries
from lbc.params import shapes, to_blob
from lbc.security import server_credentials_of
from lbc.service import (
    base_parser,
    config_from_args,
    exit_service,
    grpc_server,
    listen_address,
    set_serving,
    setup_logging,
    start_metrics,
    stop_event,
)
from lbcproto import lbc_pb2_grpc
from learner_svc import checkpoint
from learner_svc.batches import BatchFetcher
from learner_svc.param_server import ParameterServicer, ParameterStore
from learner_svc.replicas import GroupBroken, ReplicaGroup
from learner_svc.step_time import LoopTime
from learner_svc.training import StepStats, Trainer

STEPS = Counter("lbc_learner_steps_total", "Learner optimiser steps")
SAMPLES = Counter("lbc_learner_samples_total", "Time steps trained on (batch x learning length)")
VERSION = Gauge("lbc_learner_param_version", "Version of the parameters last published")
LOSS = Gauge("lbc_learner_loss", "Loss terms per policy (means over the last batch)", ["policy", "term"])
TOTAL_LOSS = Gauge("lbc_learner_total_loss", "Total loss of the last batch")
GRAD_NORM = Gauge("lbc_learner_grad_norm", "Gradient norm before clipping")
LR = Gauge("lbc_learner_learning_rate", "Current learning rate")
LAG = Gauge("lbc_learner_policy_lag", "Learner version minus the batch's trajectory versions", ["stat"])
CHECKPOINTS = Counter("lbc_learner_checkpoints_total", "Checkpoints written")
DEAD_UNITS = Gauge("lbc_learner_dead_units_ratio", "Share of a torso ReLU layer's units positive on none of a "
                   "batch's frames (they get no gradient; all dead: the net is blind)", ["layer"])
RECYCLED = Counter("lbc_learner_recycled_units_total", "Dormant torso units given fresh weights (ReDo)", ["layer"])
SKIPPED = Counter("lbc_learner_skipped_steps_total", "Batches skipped because the loss or a gradient was not finite")


def build_parser() -> argparse.ArgumentParser:
    parser = base_parser("learner_svc", __doc__)
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in run_dir")
    parser.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: run until stopped)")
    parser.add_argument("--rank", type=int, default=int(os.environ.get("LBC_LEARNER_RANK", "0")),
                        help="this replica's number when learner.replicas > 1 (default $LBC_LEARNER_RANK or 0); "
                             "replica 0 publishes parameters and writes checkpoints")
    parser.add_argument("--metrics-port", type=int, default=0,
                        help="serve the Prometheus metrics on this port (default: endpoints.learner_metrics for "
                             "replica 0, endpoints.learner_replica_metrics_base + r for replica r, as replicas "
                             "that share a host need; replicas in pods of their own pass one port to all)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cfg: Config = config_from_args(args)
    log = setup_logging("learner" if args.rank == 0 else f"learner-{args.rank}", args.log_level)
    stop = stop_event()
    torch.set_num_threads(cfg.learner.threads)
    set_gpu_wait(cfg.learner.gpu_wait)
    if limit_mps_share(cfg.learner.mps_share, os.environ):
        log.info("learner.mps_share: under MPS, the learner's kernels occupy at most %d%% of the GPU's threads",
                 cfg.learner.mps_share)
    kernels = keep_compiled_kernels(cfg, os.environ)
    if kernels is not None:
        log.info("learner.compile: the recurrence compiles in the first steps (minutes on a CPU the first time); "
                 "kernels kept in %s", kernels)
    if args.rank > 0:
        return follow(cfg, args, stop, log)

    group = join_group(cfg, 0, log)
    trainer = Trainer(cfg, group)
    counters = checkpoint.Counters()
    ckpt_dir = Path(cfg.run_dir) / "checkpoints"
    remove_stale_temporaries(ckpt_dir, log)
    if args.resume:
        loaded = checkpoint.load_newest(ckpt_dir, trainer.agent, trainer.optimiser, trainer.checkpointed_modules(), log)
        if loaded is None:
            log.warning("--resume given but no checkpoint in %s loads; starting fresh", ckpt_dir)
        else:
            found, counters = loaded
            trainer.step = counters.step
            STEPS.inc(counters.step)   # the counter says the learner's step, so curves go on from it
            counters.version = max(counters.version, checkpoint.published_version(ckpt_dir)) + 1
            log.info("resumed from %s at step %d; publishing as version %d", found, counters.step, counters.version)
    if group is not None:
        group.share_state(trainer.agent, trainer.optimiser)   # the replicas start from what this one holds

    store = ParameterStore()
    blob = to_blob(trainer.agent)
    store.set(counters.version, blob)
    VERSION.set(counters.version)
    # metrics first: whoever sees the new parameters can also read the version and step they come with
    start_metrics(args.metrics_port or cfg.endpoints.learner_metrics, cfg.endpoints.bind_host)
    server, health = grpc_server(listen_address(cfg.endpoints.params, cfg.endpoints.bind_host),
                                 credentials=server_credentials_of(cfg))
    servicer = ParameterServicer(store, shapes(trainer.agent), cfg.learner.accept_pushes,
                                 max_push_bytes=2 * len(blob) + (1 << 20))
    lbc_pb2_grpc.add_ParameterServiceServicer_to_server(servicer, server)
    server.start()
    set_serving(health, ["lbc.v1.ParameterService"])
    fetcher = BatchFetcher(cfg, stop, pin=trainer.device.type == "cuda")
    fetcher.start()
    log.info("learner up: params on %s, replay %s, %d policies, batch %d x %d (+%d burn-in), preset %s, "
             "device %s, %s (learner.precision=%s)",
             cfg.endpoints.params, cfg.endpoints.replay_serve, cfg.num_policies, cfg.learner.batch_size,
             cfg.sequence.length, cfg.sequence.burn_in, cfg.preset, trainer.device, trainer.precision,
             cfg.learner.precision)
    if trainer.native_unroll:
        log.info("the LayerNorm-LSTM unrolls by lbc.native's C++ (learner.native_unroll)")
    blocks = trainer.model.blocks_on(trainer.device.type)
    if blocks > 1:
        natively = trainer.model.writes_stacks_natively(trainer.device.type)
        log.info("frames read in %dx%d blocks, the first convolution a stride-1 one over them (learner.frame_blocks); "
                 "their stacks written by %s (learner.native_stacks)", blocks, blocks,
                 "lbc.native" if natively else "torch")

    last_log = time.monotonic()
    steps = training_steps(cfg, trainer, fetcher, stop, log)
    while True:
        try:
            batch, stats = next(steps)
        except StopIteration:
            break
        except GroupBroken as exc:
            # a replica stopped: keep what this step had not yet changed, and let the group start again
            checkpoint.save(ckpt_dir, trainer.agent, trainer.optimiser, counters, trainer.checkpointed_modules())
            log.error("learner replica group broken at step %d (%s); checkpoint saved, exiting so that every "
                      "replica starts again from it", trainer.step, exc)
            return 1
        counters.step = trainer.step
        counters.samples += cfg.learner.batch_size * cfg.sequence.length
        lag = counters.version - batch["param_version"]
        LAG.labels("mean").set(float(lag.mean()))
        LAG.labels("max").set(float(lag.max()))
        TOTAL_LOSS.set(stats.loss)
        GRAD_NORM.set(stats.grad_norm)
        LR.set(stats.learning_rate)
        for i, terms in enumerate(stats.per_policy):
            for term, value in terms.items():
                LOSS.labels(str(i + 1), term).set(value)
        if cfg.learner.recycle_every and trainer.step % cfg.learner.recycle_every == 0:
            recycled = trainer.recycle_dormant(batch)
            for layer, n in recycled.items():
                RECYCLED.labels(layer).inc(n)
            log.info("step %d: recycled dormant units %s", trainer.step, recycled)
        if cfg.learner.diagnose_every and (trainer.step % cfg.learner.diagnose_every == 0 or trainer.step == 1):
            for layer, share in trainer.torso_dead_units(batch).items():
                DEAD_UNITS.labels(layer).set(share)
        due = trainer.step % cfg.learner.push_every == 0 or trainer.step % cfg.learner.checkpoint_every == 0
        if due and not trainer.parameters_finite():
            # finite losses and gradients cannot make this; if it happens anyway, serve and save nothing
            log.error("parameters are not finite at step %d: nothing published or saved; restarting from the "
                      "newest checkpoint", trainer.step)
            return 1
        if trainer.step % cfg.learner.push_every == 0:
            counters.version += 1
            store.set(counters.version, to_blob(trainer.agent))
            VERSION.set(counters.version)
            checkpoint.record_version(ckpt_dir, counters.version)
        if trainer.step % cfg.learner.checkpoint_every == 0:
            path = checkpoint.save(ckpt_dir, trainer.agent, trainer.optimiser, counters, trainer.checkpointed_modules())
            CHECKPOINTS.inc()
            log.info("checkpoint %s", path)
        if time.monotonic() - last_log > 30:
            last_log = time.monotonic()
            log.info("step %d version %d loss %.4f grad-norm %.2f lag %.1f%s", trainer.step, counters.version,
                     stats.loss, stats.grad_norm, float(lag.mean()),
                     "".join("; " + part for part in trainer.describe_work()))
        if args.max_steps and trainer.step >= args.max_steps:
            break

    set_serving(health, ["lbc.v1.ParameterService"], serving=False)
    for part in trainer.describe_work():
        log.info("%s", part)
    if trainer.step > 0 and trainer.parameters_finite():
        checkpoint.save(ckpt_dir, trainer.agent, trainer.optimiser, counters, trainer.checkpointed_modules())
        log.info("final checkpoint at step %d", trainer.step)
    server.stop(grace=1.0).wait()
    stop.set()
    if group is not None:
        group.close()
    log.info("learner stopped")
    return 0


def training_steps(cfg: Config, trainer: Trainer, fetcher: BatchFetcher, stop: threading.Event,
                   log: logging.Logger) -> Iterator[tuple[dict, StepStats]]:
    """Every replica's loop until `stop`: the next batch from replay, one training step on it, its priorities
    back to replay and the step counted; yields each step that changed the parameters with its batch (replay's
    keys and versions stay in it: the loss keeps target outputs by them, lbc.target_cache). A step whose loss
    or gradient is not finite is counted as skipped and not yielded; GroupBroken (a replica stopped) propagates."""
    samples_per_batch = cfg.learner.batch_size * cfg.sequence.length
    loop_time = LoopTime()
    while not stop.is_set():
        with loop_time.waiting_for_batch():
            batch, upcoming = fetcher.next_pair()
        if batch is None:
            continue
        stats = trainer.train_step(batch, upcoming)
        loop_time.trained()
        if stats.skipped:
            SKIPPED.inc()
            log.warning("skipped a batch: loss %s, gradient norm %s (not finite); parameters unchanged",
                        stats.loss, stats.grad_norm)
            continue
        if cfg.replay.prioritised:
            fetcher.send_priorities(batch["key"], stats.priorities)
        STEPS.inc()
        SAMPLES.inc(samples_per_batch)
        yield batch, stats


def keep_compiled_kernels(cfg: Config, environ: MutableMapping[str, str]) -> str | None:
    """With learner.compile, where torch keeps the kernels it compiles: the run folder's compile-cache unless
    TORCHINDUCTOR_CACHE_DIR names a place already. torch's default is under /tmp, which a restarted pod does
    not keep, and compiling again takes minutes; from the cache a restart loads them in seconds."""
    if not cfg.learner.compile:
        return None
    return environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(cfg.run_dir) / "compile-cache"))


def join_group(cfg: Config, rank: int, log: logging.Logger) -> ReplicaGroup | None:
    """This learner's replica group (None when learner.replicas is 1). Every replica waits here for the
    others, up to two minutes."""
    n = cfg.learner.replicas
    if n == 1:
        return None
    host, port = cfg.endpoints.learner_group.rsplit(":", 1)
    log.info("replica %d of %d: meeting the others at %s", rank, n, cfg.endpoints.learner_group)
    group = ReplicaGroup(rank, n, host, int(port), pick_device(cfg.learner.device, "learner.device"),
                         backend=cfg.learner.group_backend)
    log.info("replica %d of %d: group formed", rank, n)
    return group


def follow(cfg: Config, args: argparse.Namespace, stop: threading.Event, log: logging.Logger) -> int:
    """Replica r > 0: trains on its own batches with the group's averaged gradients; it publishes and saves
    nothing (replica 0 does), and serves its metrics at endpoints.learner_replica_metrics_base + r (or
    --metrics-port). When a
    replica dies the others' next step fails, and every one of them starts again from replica 0's
    checkpoint."""
    if args.rank >= cfg.learner.replicas:
        raise SystemExit(f"--rank {args.rank} but learner.replicas={cfg.learner.replicas}")
    group = join_group(cfg, args.rank, log)
    trainer = Trainer(cfg, group)
    group.share_state(trainer.agent, trainer.optimiser)
    start_metrics(args.metrics_port or cfg.endpoints.learner_replica_metrics_base + args.rank, cfg.endpoints.bind_host)
    fetcher = BatchFetcher(cfg, stop, pin=trainer.device.type == "cuda")
    fetcher.start()
    try:
        for _, stats in training_steps(cfg, trainer, fetcher, stop, log):
            TOTAL_LOSS.set(stats.loss)
            if args.max_steps and trainer.step >= args.max_steps:
                break
    except GroupBroken as exc:
        log.error("learner replica group broken at step %d (%s); exiting to meet the group again", trainer.step, exc)
        return 1
    group.close()
    log.info("learner replica %d stopped", args.rank)
    return 0


if __name__ == "__main__":
    exit_service(main())
