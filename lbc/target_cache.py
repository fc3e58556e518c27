"""The target network's outputs per replayed sequence, kept while the target network is unchanged.

Between two copies into the target network its outputs over a sequence depend only on that sequence (its
frames, previous actions and rewards, resets, stored LSTM state and the family's extra inputs): a sequence
replay draws again within one target period gets the same outputs, so the learner keeps them instead of
unrolling the target network over it again. The online network's outputs change every step and are always
computed. With the `cpu` preset's replay (2,000 sequences, 8 in and 16 out per learner step) a good part of
the draws repeat a sequence within the 250 steps of a period (docs/speed.md).

Sequences are named by replay's keys, which are unique across replay's restarts (replay_svc.buffer), and
each entry also keeps the sequence's parameter version as a second check. The cache is emptied at every copy
into the target network; entries beyond `max_entries` go oldest first, as replay evicts.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch
from prometheus_client import Counter

from lbc.nets import Frames, LBCNet, gather_rows, unroll_after_burn_in

LOOKUPS = Counter("lbc_learner_target_cache_lookups_total", "Sequences whose target-network outputs were needed")
HITS = Counter("lbc_learner_target_cache_hits_total", "Sequences whose target-network outputs were kept")

# what unroll_after_burn_in reads of a batch, time-major [T, B] or per sequence [B, H]
_UNROLL_INPUTS = ("prev_action", "prev_reward", "reset")
_STATE = ("h0", "c0")

Outputs = tuple[torch.Tensor, torch.Tensor]   # (adv [T, N, A], value [T, N]) of one sequence
MAX_BYTES = 256 * 2**20   # what the kept outputs may take at most


class TargetOutputCache:
    """Target-network outputs per sequence key. Thread-safe: the learner's batch parts (learner.split_batch)
    look up and store at once."""

    def __init__(self, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries}")
        self.max_entries = max_entries
        self._rows: OrderedDict[int, tuple[int, Outputs]] = OrderedDict()
        self._lock = threading.Lock()
        self.lookups = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self._rows)

    def describe(self) -> str:
        """How many looked-up sequences were served, for the learner's log."""
        share = 100.0 * self.hits / self.lookups if self.lookups else 0.0
        return f"target network's outputs kept for {self.hits} of {self.lookups} sequences drawn ({share:.0f}%)"

    def clear(self) -> None:
        """Forget every entry: the target network has changed."""
        with self._lock:
            self._rows.clear()

    def lookup(self, keys: list[int], versions: list[int]) -> list[Outputs | None]:
        """Each sequence's kept outputs, or None where there are none for this key and parameter version."""
        with self._lock:
            rows = [self._rows.get(k) for k in keys]
            found = [row[1] if row is not None and row[0] == v else None for row, v in zip(rows, versions, strict=True)]
            hits = sum(f is not None for f in found)
            self.lookups += len(keys)
            self.hits += hits
        LOOKUPS.inc(len(keys))
        HITS.inc(hits)
        return found

    def store(self, keys: list[int], versions: list[int], adv: torch.Tensor, value: torch.Tensor) -> None:
        """Keep the outputs adv [T, B, N, A] and value [T, B, N] of the sequences `keys` (batch axis 1)."""
        with self._lock:
            for i, (key, version) in enumerate(zip(keys, versions, strict=True)):
                self._rows[key] = (version, (adv[:, i].clone(), value[:, i].clone()))
                self._rows.move_to_end(key)
            while len(self._rows) > self.max_entries:
                self._rows.popitem(last=False)


def _sequences(b: dict[str, torch.Tensor], index: torch.Tensor) -> dict[str, torch.Tensor]:
    """What an unroll reads of the sequences `index` of batch b."""
    picked = {name: b[name].index_select(1, index) for name in _UNROLL_INPUTS}
    picked.update({name: b[name].index_select(0, index) for name in _STATE})
    return picked


def target_outputs(net: LBCNet, frames: torch.Tensor | Frames, b: dict[str, torch.Tensor], burn: int,
                   cache: TargetOutputCache | None, extra: torch.Tensor | None = None) -> Outputs:
    """The target network's (adv [T, B, N, A], value [T, B, N]) over the batch's learning steps, as
    unroll_after_burn_in(net, frames, b, burn, grad=False, extra) gives them, unrolling only the sequences
    the cache does not hold. Without a cache, or a batch without replay's keys, every sequence is unrolled."""
    if cache is None or "key" not in b or "param_version" not in b:
        out = unroll_after_burn_in(net, frames, b, burn, grad=False, extra=extra)
        return out.adv, out.value
    keys = b["key"].tolist()
    versions = b["param_version"].tolist()
    kept = cache.lookup(keys, versions)
    missing = [i for i, row in enumerate(kept) if row is None]
    if missing:
        if len(missing) < len(keys):   # only the sequences not kept, gathered (all of them need no copy)
            index = torch.tensor(missing, device=b["h0"].device)
            frames = frames.take(index) if isinstance(frames, Frames) else gather_rows(frames, index)
            extra = None if extra is None else extra.index_select(1, index)
            b = _sequences(b, index)
        out = unroll_after_burn_in(net, frames, b, burn, grad=False, extra=extra)
        cache.store([keys[i] for i in missing], [versions[i] for i in missing], out.adv, out.value)
        if len(missing) == len(keys):
            return out.adv, out.value
        for j, i in enumerate(missing):
            kept[i] = (out.adv[:, j], out.value[:, j])
    return (torch.stack([row[0] for row in kept], dim=1), torch.stack([row[1] for row in kept], dim=1))


def make_target_cache(enabled: bool, capacity_sequences: int, model: LBCNet, steps: int) -> TargetOutputCache | None:
    """The cache for a target network over `steps` learning steps (+1 bootstrap step is the caller's to count):
    as many entries as replay holds sequences, within MAX_BYTES; None when not enabled."""
    if not enabled:
        return None
    entry_bytes = 4 * steps * model.num_policies * (model.num_actions + 1)
    return TargetOutputCache(max(1, min(capacity_sequences, MAX_BYTES // entry_bytes)))
