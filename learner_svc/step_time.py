"""Where the training thread's time goes, by part of its loop (`lbc_learner_step_seconds_total{part}`).

Alone, a learner step's parts are what `bench.throughput` times; in the running system they show whether the
learner waits for replay, for the batch prepared ahead, for the device (on a GPU the step's one wait, which
holds whatever the GPU has not finished, shared with the actors' inference) or computes. The parts add up to
the thread's wall time, so rate(...) of each over a window is its share of that window.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

from prometheus_client import Counter

PARTS = {
    "batch": "waiting for replay's next batch",
    "prepare": "its frames, stacks and target outputs, where they were not prepared ahead",
    "loss_backward": "the loss and its gradients (with replicas, their average) and the clipping",
    "device_wait": "the step's one wait for its results from the device",
    "optimiser": "the optimiser's step and the target network's copy",
    "ahead_wait": "waiting for the thread that prepares the next batch (learner.prepare_ahead)",
    "after": "metrics, publishing parameters, checkpoints",
}
STEP_SECONDS_NAME = "lbc_learner_step_seconds_total"   # as exported (bench.system reads it)
STEP_SECONDS = Counter(STEP_SECONDS_NAME, "Seconds of the learner's training thread by part of its "
                       "loop: " + "; ".join(f"{part}: {what}" for part, what in PARTS.items()), ["part"])
for _part in PARTS:
    STEP_SECONDS.labels(_part)   # each part exported from the start, at 0


@contextmanager
def timed(part: str) -> Iterator[None]:
    """Counts the wall time of the block under `part`."""
    start = time.perf_counter()
    try:
        yield
    finally:
        STEP_SECONDS.labels(part).inc(time.perf_counter() - start)


class LoopTime:
    """The training loop's own parts: waiting for a batch, and everything between one step's end and the
    wait for the next batch ("after")."""

    def __init__(self) -> None:
        self._trained: float | None = None

    def waiting_for_batch(self) -> AbstractContextManager[None]:
        if self._trained is not None:
            STEP_SECONDS.labels("after").inc(time.perf_counter() - self._trained)
            self._trained = None
        return timed("batch")

    def trained(self) -> None:
        """Call when a step ends: the time until the next wait for a batch counts as "after"."""
        self._trained = time.perf_counter()
