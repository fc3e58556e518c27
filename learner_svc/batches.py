"""Batches from replay over ZeroMQ (DEALER -> replay's ROUTER), fetched ahead on a thread.

The learner keeps up to learner.requests_in_flight requests at replay, each on a slot of its own that the
answer names; replay answers each when its rate limiter allows. With one request at a time a batch came once
per round trip (replay stacking 218 MB for lbc-bm, sending it, the learner checking and pinning it: about 200 ms
on two cores), slower than a GPU step; requests in flight overlap the round trips. Batches fetched and asked
for stay within learner.prefetch + 1, as with one request (the queue full and one more). A request that goes
unanswered (replay restarted) is sent again on its slot after a timeout; replay keeps one request per slot.
Sequence priorities go back to replay on the same socket (ZeroMQ sockets belong to one thread: they are
queued for it).
"""

from __future__ import annotations

import logging
import queue
import threading
import time

import numpy as np
import zmq
from prometheus_client import Counter, Histogram

from lbc import codec
from lbc.config import Config
from lbc.devices import pinned
from lbc.security import secure_client_socket
from lbc.sequences import validate_batch

log = logging.getLogger("learner")

AHEAD_WAIT_S = 0.02   # a thread switch or two: what the fetcher takes to put a batch it holds
REJECTED = Counter("lbc_learner_batches_rejected_total", "Batches that failed validation", ["reason"])
WAIT = Histogram("lbc_learner_batch_wait_seconds", "Time waiting for replay per batch",
                 buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))


class BatchFetcher:
    def __init__(self, cfg: Config, stop: threading.Event, request_timeout_s: float = 10.0,
                 pin: bool = False) -> None:
        """pin: copy each batch into pinned host memory here (lbc.devices.pinned), for a learner on a GPU."""
        self.cfg = cfg
        self.pin = pin
        self.stop = stop
        self.timeout_ms = int(request_timeout_s * 1000)
        self.batch_size = cfg.learner.batch_size
        # prepare_ahead: the learner holds the next batch out of the queue, so batches ahead stay `prefetch`
        self.ahead = cfg.learner.prepare_ahead
        self.queue: queue.Queue[dict[str, np.ndarray]] = queue.Queue(
            maxsize=max(1, cfg.learner.prefetch - self.ahead))
        self.slots = cfg.learner.requests_in_flight
        self.ahead_limit = self.queue.maxsize + 1   # batches queued and asked for, as with one request at a time
        self._held: dict[str, np.ndarray] | None = None
        self.outgoing: queue.Queue[list[bytes | memoryview]] = queue.Queue(maxsize=64)
        self.thread = threading.Thread(target=self._run, name="batch-fetcher", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def get(self, timeout: float = 0.5) -> dict[str, np.ndarray] | None:
        """A batch ([B, ...] arrays, with the per-sequence "param_version"), or None after timeout."""
        try:
            return self.queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def next_pair(self, timeout: float = 0.5, ahead_wait: float = AHEAD_WAIT_S
                  ) -> tuple[dict[str, np.ndarray] | None, dict[str, np.ndarray] | None]:
        """(the batch to train on now, or None after timeout; with learner.prepare_ahead the batch after it
        when it arrives within `ahead_wait`, else None). The second is the first of the next call."""
        batch, self._held = self._held, None
        if batch is None:
            batch = self.get(timeout)
        if batch is not None and self.ahead:
            try:   # the fetcher may hold the next batch already, waiting to put it into the queue just freed
                self._held = self.queue.get(timeout=ahead_wait)
            except queue.Empty:
                pass
        return batch, self._held

    def send_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> None:
        """Queue a priority update for the sequences `keys`; dropped if replay is far behind."""
        frames = codec.encode("priorities", {"key": keys.astype(np.int64),
                                             "priority": priorities.astype(np.float32)}, sender="learner")
        try:
            self.outgoing.put_nowait(frames)
        except queue.Full:
            log.warning("priority updates are backing up; dropping one")

    def _run(self) -> None:
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        secure_client_socket(sock, self.cfg)
        sock.connect(self.cfg.endpoints.replay_serve)
        requests = [codec.encode("batch_request", {}, meta={"batch_size": str(self.batch_size), "slot": str(slot)})
                    for slot in range(self.slots)]
        sent_at: dict[int, float] = {}   # slot -> when its request went
        while not self.stop.is_set():
            while not self.outgoing.empty():
                sock.send_multipart(self.outgoing.get_nowait())
            now = time.monotonic()
            for slot, sent in sent_at.items():
                if now - sent > self.timeout_ms / 1000:   # replay may have restarted: ask again on the slot
                    sock.send_multipart(requests[slot])
                    sent_at[slot] = now
            for slot in range(self.slots):
                if len(sent_at) + self.queue.qsize() >= self.ahead_limit:
                    break
                if slot not in sent_at:
                    sock.send_multipart(requests[slot])
                    sent_at[slot] = now
            if not sock.poll(200):
                continue
            frames = sock.recv_multipart(copy=False)
            try:
                msg = codec.decode(frames, max_bytes=self.cfg.replay.max_message_bytes * self.batch_size,
                                   expected_kind="batch")
                sent = sent_at.pop(codec.meta_int(msg.meta, "slot", 0), None)   # 0 from a replay naming none
                if sent is not None:
                    WAIT.observe(time.monotonic() - sent)
                validate_batch(msg.arrays, self.cfg, self.batch_size)
            except codec.CodecError as exc:
                REJECTED.labels(exc.reason).inc()
                log.warning("rejected a batch from replay (%s): %s", exc.reason, str(exc)[:200])
                continue
            arrays = pinned(msg.arrays) if self.pin else msg.arrays
            while not self.stop.is_set():
                try:
                    self.queue.put(arrays, timeout=0.5)
                    break
                except queue.Full:
                    continue
        sock.close()
