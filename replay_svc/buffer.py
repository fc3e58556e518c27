"""The replay buffer and its rate limiter: pure data structures, no transport."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np


@dataclass
class Stored:
    arrays: dict[str, np.ndarray]
    param_version: int
    nbytes: int


class SequenceBuffer:
    """FIFO of sequences bounded both in count and in bytes; the oldest go first."""

    def __init__(self, capacity_sequences: int, capacity_bytes: int) -> None:
        self.capacity_sequences = capacity_sequences
        self.capacity_bytes = capacity_bytes
        self._items: deque[Stored] = deque()
        self.nbytes = 0
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._items)

    def add(self, arrays: dict[str, np.ndarray], param_version: int) -> None:
        nbytes = sum(a.nbytes for a in arrays.values())
        if nbytes > self.capacity_bytes:
            raise ValueError(f"one sequence of {nbytes} bytes exceeds the buffer's {self.capacity_bytes}")
        self._items.append(Stored(arrays, param_version, nbytes))
        self.nbytes += nbytes
        while len(self._items) > self.capacity_sequences or self.nbytes > self.capacity_bytes:
            old = self._items.popleft()
            self.nbytes -= old.nbytes
            self.evicted += 1

    def sample(self, batch_size: int, rng: np.random.Generator) -> list[Stored]:
        """batch_size distinct sequences drawn uniformly."""
        idx = rng.choice(len(self._items), size=batch_size, replace=False)
        return [self._items[i] for i in idx]


class RateLimiter:
    """Holds samples / inserts at `ratio` within +-tolerance samples (like Reverb's SampleToInsertRatio).

    Inserts below `min_size` owe nothing, so the buffer can fill before training starts. Sampling
    waits while the learner is ahead of the actors; inserting waits while the actors are ahead,
    which stalls them through ZeroMQ backpressure instead of growing a queue.
    Requires tolerance >= batch + ratio so that one of the two is always allowed.
    """

    def __init__(self, ratio: float, min_size: int, tolerance: float) -> None:
        self.ratio = ratio
        self.min_size = min_size
        self.tolerance = tolerance
        self.inserted = 0
        self.sampled = 0

    def _owed(self, inserted: int) -> float:
        return self.ratio * max(0, inserted - self.min_size) - self.sampled

    def can_insert(self) -> bool:
        return self._owed(self.inserted + 1) <= self.tolerance

    def can_sample(self, batch_size: int, stored: int) -> bool:
        return stored >= max(self.min_size, batch_size) and self._owed(self.inserted) - batch_size >= -self.tolerance

    def insert(self) -> None:
        self.inserted += 1

    def sample(self, batch_size: int) -> None:
        self.sampled += batch_size
