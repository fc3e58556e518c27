"""The replay buffers and the rate limiter: pure data structures, no transport."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np


@dataclass
class Stored:
    arrays: dict[str, np.ndarray]
    param_version: int
    nbytes: int
    key: int = 0            # unique for the buffer's lifetime: how the learner names it in priority updates
    priority: float = 1.0


@dataclass
class Sample:
    items: list[Stored]
    weights: np.ndarray     # [B] float32 importance weights (all 1 for uniform sampling)


class SequenceBuffer:
    """FIFO of sequences bounded both in count and in bytes; the oldest go first. Uniform sampling
    of distinct sequences."""

    def __init__(self, capacity_sequences: int, capacity_bytes: int, first_key: int = 0) -> None:
        """first_key: the first sequence's key, the next ones counting up from it. The service starts it at
        the wall clock's microseconds, so that a restarted replay never gives a key the learner has seen
        name another sequence (its priority updates and kept target outputs go by key)."""
        self.capacity_sequences = capacity_sequences
        self.capacity_bytes = capacity_bytes
        self._items: deque[Stored] = deque()
        self._next_key = first_key
        self.nbytes = 0
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._items)

    def add(self, arrays: dict[str, np.ndarray], param_version: int) -> Stored:
        nbytes = sum(a.nbytes for a in arrays.values())
        if nbytes > self.capacity_bytes:
            raise ValueError(f"one sequence of {nbytes} bytes exceeds the buffer's {self.capacity_bytes}")
        item = Stored(arrays, param_version, nbytes, key=self._next_key)
        self._next_key += 1
        self._items.append(item)
        self.nbytes += nbytes
        while len(self._items) > self.capacity_sequences or self.nbytes > self.capacity_bytes:
            self._evict(self._items.popleft())
        return item

    def _evict(self, old: Stored) -> None:
        self.nbytes -= old.nbytes
        self.evicted += 1

    def items(self) -> list[Stored]:
        """The stored sequences, oldest first."""
        return list(self._items)

    def restore_priority(self, item: Stored, priority: float) -> None:
        """Give a sequence read back from a snapshot its saved priority (uniform replay has none)."""

    def sample(self, batch_size: int, rng: np.random.Generator) -> Sample:
        """batch_size distinct sequences drawn uniformly."""
        idx = rng.choice(len(self._items), size=batch_size, replace=False)
        return Sample([self._items[i] for i in idx], np.ones(batch_size, np.float32))

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> int:
        """Uniform replay has no priorities: nothing is updated."""
        return 0


class PrioritisedSequenceBuffer(SequenceBuffer):
    """Prioritised sequence replay (Schaul et al. 2016; R2D2, Kapturowski et al. 2019).

    P(i) = p_i^alpha / sum_k p_k^alpha, drawn with replacement; importance weights
    w_i = (n P(i))^-beta / max_j w_j over the batch. New sequences enter at the largest priority
    seen so far, so each is trained on soon. The learner sends p_i = eta max_t |delta_t| +
    (1 - eta) mean_t |delta_t| back for the sequences it trained on; keys already evicted are ignored.
    """

    def __init__(self, capacity_sequences: int, capacity_bytes: int, alpha: float, beta: float,
                 min_priority: float = 1e-6, first_key: int = 0) -> None:
        super().__init__(capacity_sequences, capacity_bytes, first_key)
        self.alpha, self.beta, self.min_priority = alpha, beta, min_priority
        self._by_key: dict[int, Stored] = {}
        self.max_priority = 1.0

    def add(self, arrays: dict[str, np.ndarray], param_version: int) -> Stored:
        item = super().add(arrays, param_version)
        item.priority = self.max_priority
        self._by_key[item.key] = item
        return item

    def _evict(self, old: Stored) -> None:
        super()._evict(old)
        self._by_key.pop(old.key, None)

    def restore_priority(self, item: Stored, priority: float) -> None:
        item.priority = max(priority, self.min_priority)
        self.max_priority = max(self.max_priority, item.priority)

    def probabilities(self) -> np.ndarray:
        p = np.fromiter((it.priority for it in self._items), np.float64, len(self._items)) ** self.alpha
        return p / p.sum()

    def sample(self, batch_size: int, rng: np.random.Generator) -> Sample:
        probs = self.probabilities()
        idx = rng.choice(len(probs), size=batch_size, replace=True, p=probs)
        weights = (len(probs) * probs[idx]) ** -self.beta
        return Sample([self._items[i] for i in idx], (weights / weights.max()).astype(np.float32))

    def update_priorities(self, keys: np.ndarray, priorities: np.ndarray) -> int:
        updated = 0
        for key, priority in zip(keys.tolist(), priorities.tolist(), strict=True):
            item = self._by_key.get(int(key))
            if item is not None:
                item.priority = max(float(priority), self.min_priority)
                self.max_priority = max(self.max_priority, item.priority)
                updated += 1
        return updated


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
