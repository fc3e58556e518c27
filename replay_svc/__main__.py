"""replay_svc: takes sequences from any number of actors (ZeroMQ PULL), stores them in a bounded
buffer (uniform, or prioritised as in R2D2), and serves batches to the learner (ZeroMQ ROUTER)
under a rate limiter; the learner sends sequence priorities back on the same socket."""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import numpy as np
import zmq
from prometheus_client import Counter, Gauge

from lbc import codec
from lbc.config import Config
from lbc.files import remove_stale_temporaries
from lbc.security import secure_server_socket
from lbc.sequences import sequence_layout, socket_buffer_bytes, stack, validate_sequence
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
    zmq_bind_address,
)
from replay_svc import snapshot
from replay_svc.buffer import PrioritisedSequenceBuffer, RateLimiter, SequenceBuffer

SIZE = Gauge("lbc_replay_sequences", "Sequences stored")
BYTES = Gauge("lbc_replay_bytes", "Bytes stored")
CAPACITY = Gauge("lbc_replay_capacity_sequences", "Sequence capacity")
RATIO = Gauge("lbc_replay_ratio", "The replay ratio the rate limiter holds: samples drawn per sample inserted")
INSERTED = Counter("lbc_replay_inserted_total", "Sequences accepted")
SAMPLED = Counter("lbc_replay_sampled_total", "Sequences served to the learner")
BATCHES = Counter("lbc_replay_batches_total", "Batches served")
EVICTED = Counter("lbc_replay_evicted_total", "Sequences dropped to stay within capacity")
REJECTED = Counter("lbc_replay_rejected_total", "Messages rejected", ["reason"])
SNAPSHOTS = Counter("lbc_replay_snapshots_total", "Snapshots of the buffer written to disk")
PRIORITY_UPDATES = Counter("lbc_replay_priority_updates_total", "Sequence priorities set by the learner")
INSERT_BLOCKED = Gauge("lbc_replay_insert_blocked", "1 while the rate limiter holds actors back")
SAMPLE_BLOCKED = Gauge("lbc_replay_sample_blocked", "1 while a learner request waits for data")
PENDING = Gauge("lbc_replay_pending_requests", "Batch requests from learners waiting for data (one per slot)")
# Which side waits on the other, as time: what the actor autoscaler sizes the actor replicas by.
INSERT_BLOCKED_SECONDS = Counter("lbc_replay_insert_blocked_seconds_total",
                                 "Seconds the rate limiter held actors back (too few samples taken)")
SAMPLE_BLOCKED_SECONDS = Counter("lbc_replay_sample_blocked_seconds_total",
                                 "Seconds a learner request waited for data (too few sequences inserted)")


class RejectLog:
    """Count every rejection under its reason (a fixed set, codec.REASONS); log at most one line per
    reason a minute, with how many were refused since, so a bad peer can flood neither metrics nor log."""

    EVERY_S = 60.0

    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self.last: dict[str, float] = {}
        self.unlogged: dict[str, int] = {}

    def __call__(self, source: str, exc: codec.CodecError) -> None:
        REJECTED.labels(exc.reason).inc()
        now = time.monotonic()
        if now - self.last.get(exc.reason, -self.EVERY_S) < self.EVERY_S:
            self.unlogged[exc.reason] = self.unlogged.get(exc.reason, 0) + 1
            return
        self.last[exc.reason] = now
        more = self.unlogged.pop(exc.reason, 0)
        self.log.warning("rejected a message from %s (%s): %s%s", source, exc.reason, str(exc)[:200],
                         f" (and {more} more of this kind since the last line)" if more else "")


def largest_frame_bytes(cfg: Config) -> int:
    """The largest frame a valid sequence message has: its largest array, or a generous header."""
    arrays = max(np.dtype(dtype).itemsize * math.prod(shape) for dtype, shape in sequence_layout(cfg).values())
    return max(arrays, 1 << 16)


MAX_REQUEST_SLOTS = 16   # a learner's requests in flight at once (learner.requests_in_flight is at most this)


def request_slot(meta: dict[str, str]) -> int:
    """The slot a batch request names (0 when it names none): a learner's requests in flight are told apart
    by it, and a request sent again on the same slot (replay restarted, or slow) replaces the first."""
    slot = codec.meta_int(meta, "slot", 0)
    if slot is None or not 0 <= slot < MAX_REQUEST_SLOTS:
        raise codec.CodecError(f"slot must be in [0, {MAX_REQUEST_SLOTS})", "request")
    return slot


def check_priorities(arrays: dict[str, np.ndarray], capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """A learner's priority update: int64 keys and finite, non-negative float32 priorities, same length."""
    keys, priorities = arrays.get("key"), arrays.get("priority")
    if keys is None or priorities is None or set(arrays) != {"key", "priority"}:
        raise codec.CodecError(f"priorities message needs exactly 'key' and 'priority', got {sorted(arrays)[:4]}",
                               "request")
    if keys.dtype != np.int64 or priorities.dtype != np.float32 or keys.ndim != 1 or keys.shape != priorities.shape:
        raise codec.CodecError("priorities: key int64 [n] and priority float32 [n] expected", "request")
    if len(keys) > capacity or not np.all(np.isfinite(priorities)) or np.any(priorities < 0):
        raise codec.CodecError("priorities: too many, or not finite and non-negative", "request")
    return keys, priorities


def _snapshot(path: Path, buffer: SequenceBuffer, limiter: RateLimiter, log: logging.Logger) -> None:
    """Write the snapshot; the loop waits meanwhile (about a second per GB on a local disk)."""
    started = time.monotonic()
    size = snapshot.save(path, buffer, limiter)
    SNAPSHOTS.inc()
    log.info("snapshot of %d sequences (%.2f GB) in %.1f s", len(buffer), size / 1e9, time.monotonic() - started)


def main(argv: list[str] | None = None) -> int:
    parser = base_parser("replay_svc", __doc__)
    args = parser.parse_args(argv)
    cfg: Config = config_from_args(args)
    log = setup_logging("replay", args.log_level)
    stop = stop_event()
    rc = cfg.replay

    # keys from the clock's microseconds: above every key an earlier run of this replay gave (it cannot have
    # stored a million sequences a second), so none names two sequences to the learner
    first_key = time.time_ns() // 1000
    buffer = (PrioritisedSequenceBuffer(rc.capacity_sequences, rc.capacity_bytes, rc.priority_exponent,
                                        rc.importance_exponent, first_key=first_key)
              if rc.prioritised else SequenceBuffer(rc.capacity_sequences, rc.capacity_bytes, first_key))
    limiter = RateLimiter(rc.replay_ratio, rc.min_sequences, rc.ratio_tolerance)
    rng = np.random.default_rng(cfg.env.seed + 7)
    reject = RejectLog(log)
    CAPACITY.set(rc.capacity_sequences)
    RATIO.set(rc.replay_ratio)

    snapshot_path = Path(cfg.run_dir) / "replay" / "snapshot.bin"
    if rc.snapshot_every_s:
        remove_stale_temporaries(snapshot_path.parent, log)
        started = time.monotonic()
        restored = snapshot.load(snapshot_path, cfg, buffer, limiter, log)
        if restored:
            log.info("restored %d sequences from %s in %.1f s", restored, snapshot_path, time.monotonic() - started)
    SIZE.set(len(buffer))   # true from the moment the service reports healthy, not from its loop's first pass
    last_snapshot = time.monotonic()

    ctx = zmq.Context.instance()
    ingest = ctx.socket(zmq.PULL)
    ingest.setsockopt(zmq.RCVHWM, 16)
    ingest.setsockopt(zmq.RCVBUF, socket_buffer_bytes(cfg))   # what the limiter holds back waits at the actors
    # ZeroMQ bounds each frame, not a message: bound frames by the layout's largest array, so that a
    # message of many frames (one per array is all a sequence has) cannot hold gigabytes before decode
    ingest.setsockopt(zmq.MAXMSGSIZE, min(rc.max_message_bytes, largest_frame_bytes(cfg)))
    ingest.setsockopt(zmq.LINGER, 0)
    secure_server_socket(ingest, cfg)
    ingest.bind(zmq_bind_address(cfg.endpoints.replay_ingest, cfg.endpoints.bind_host))
    serve = ctx.socket(zmq.ROUTER)
    serve.setsockopt(zmq.LINGER, 0)
    serve.setsockopt(zmq.MAXMSGSIZE, 1 << 16)
    secure_server_socket(serve, cfg)
    serve.bind(zmq_bind_address(cfg.endpoints.replay_serve, cfg.endpoints.bind_host))

    server, health = grpc_server(listen_address(cfg.endpoints.replay_health, cfg.endpoints.bind_host), workers=2)
    server.start()
    set_serving(health, ["lbc.v1.Replay"])
    start_metrics(cfg.endpoints.replay_metrics, cfg.endpoints.bind_host)
    log.info("replay up: ingest %s, serve %s, capacity %d sequences / %.1f GB, ratio %.2f",
             cfg.endpoints.replay_ingest, cfg.endpoints.replay_serve, rc.capacity_sequences,
             rc.capacity_bytes / 1e9, rc.replay_ratio)

    pending: dict[tuple[bytes, int], int] = {}   # (learner identity, request slot) -> batch size asked for
    last_log = time.monotonic()
    loop_start, insert_blocked = time.monotonic(), False
    while not stop.is_set():
        now = time.monotonic()
        elapsed, loop_start = now - loop_start, now   # the state set last pass held for this long
        if pending:
            SAMPLE_BLOCKED_SECONDS.inc(elapsed)
        if insert_blocked:
            INSERT_BLOCKED_SECONDS.inc(elapsed)
        poller = zmq.Poller()
        poller.register(serve, zmq.POLLIN)
        can_insert = limiter.can_insert()
        insert_blocked = not can_insert
        INSERT_BLOCKED.set(int(insert_blocked))
        if can_insert:
            poller.register(ingest, zmq.POLLIN)
        events = dict(poller.poll(100))

        if ingest in events:
            for _ in range(64):
                if not limiter.can_insert():
                    break
                try:
                    frames = ingest.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                try:
                    msg = codec.decode(frames, max_bytes=rc.max_message_bytes, expected_kind="sequence")
                    validate_sequence(msg.arrays, cfg)
                except codec.CodecError as exc:
                    reject("an actor", exc)
                    continue
                evicted_before = buffer.evicted
                buffer.add(msg.arrays, msg.param_version)
                limiter.insert()
                INSERTED.inc()
                EVICTED.inc(buffer.evicted - evicted_before)

        if serve in events:
            while True:
                try:
                    identity, *frames = serve.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                except ValueError:
                    continue
                try:
                    req = codec.decode(frames, max_bytes=1 << 16)
                    if req.kind == "priorities":
                        keys, priorities = check_priorities(req.arrays, rc.capacity_sequences)
                        PRIORITY_UPDATES.inc(buffer.update_priorities(keys, priorities))
                        continue
                    if req.kind != "batch_request":
                        raise codec.CodecError(f"kind {req.kind[:40]!r}, expected 'batch_request' or 'priorities'",
                                               "request")
                    size = codec.meta_int(req.meta, "batch_size", 0)
                    if size is None or not 1 <= size <= rc.capacity_sequences:
                        raise codec.CodecError("batch_size missing or out of range", "request")
                    slot = request_slot(req.meta)
                except codec.CodecError as exc:
                    reject("learner", exc)
                    continue
                pending[identity, slot] = size

        for (identity, slot), size in list(pending.items()):
            if not limiter.can_sample(size, len(buffer)):
                continue
            sample = buffer.sample(size, rng)
            arrays = stack([it.arrays for it in sample.items])
            arrays["param_version"] = np.array([it.param_version for it in sample.items], dtype=np.int64)
            arrays["key"] = np.array([it.key for it in sample.items], dtype=np.int64)
            arrays["weight"] = sample.weights
            frames = codec.encode("batch", arrays, sender="replay", param_version=int(arrays["param_version"].max()),
                                  meta={"slot": str(slot)})
            serve.send_multipart([identity, *frames], copy=False)
            limiter.sample(size)
            del pending[identity, slot]
            SAMPLED.inc(size)
            BATCHES.inc()
        SAMPLE_BLOCKED.set(1 if pending else 0)
        PENDING.set(len(pending))
        SIZE.set(len(buffer))
        BYTES.set(buffer.nbytes)

        if rc.snapshot_every_s and time.monotonic() - last_snapshot > rc.snapshot_every_s:
            _snapshot(snapshot_path, buffer, limiter, log)
            last_snapshot = time.monotonic()

        if time.monotonic() - last_log > 30:
            last_log = time.monotonic()
            log.info("stored %d sequences (%.2f GB), inserted %d, sampled %d, evicted %d",
                     len(buffer), buffer.nbytes / 1e9, limiter.inserted, limiter.sampled, buffer.evicted)

    set_serving(health, ["lbc.v1.Replay"], serving=False)
    if rc.snapshot_every_s:
        _snapshot(snapshot_path, buffer, limiter, log)
    ingest.close()
    serve.close()
    server.stop(grace=0.5).wait()
    log.info("replay stopped")
    return 0


if __name__ == "__main__":
    exit_service(main())
