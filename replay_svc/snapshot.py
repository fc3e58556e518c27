"""Replay's snapshot on disk: the stored sequences and the rate limiter's counts, so that a restarted
replay serves the learner at once instead of starving it until the actors refill the buffer.

The file holds each sequence in the wire format (lbc.codec, no pickle), so what is read back goes
through the same decoding and validation as a message from an actor: a snapshot from another layout,
or a damaged one, loses the sequences that do not pass and nothing else.

    b"LBCREPLAY1\\n", then a JSON line {"inserted": n, "sampled": n, "sequences": n},
    then per sequence: uint32 frame count, then per frame: uint64 length and the bytes.
"""

from __future__ import annotations

import json
import logging
import math
import struct
from pathlib import Path
from typing import BinaryIO

from lbc import codec
from lbc.config import Config
from lbc.files import write_atomically
from lbc.sequences import validate_sequence
from replay_svc.buffer import RateLimiter, SequenceBuffer

MAGIC = b"LBCREPLAY1\n"
_COUNT = struct.Struct("<I")
_LENGTH = struct.Struct("<Q")
MAX_HEADER = 4096


def save(path: Path, buffer: SequenceBuffer, limiter: RateLimiter) -> int:
    """Write every stored sequence (oldest first, priorities kept) and the limiter's counts, atomically
    (lbc.files). Returns the bytes written."""
    items = list(buffer.items())

    def write(f: BinaryIO) -> None:
        f.write(MAGIC)
        head = {"inserted": limiter.inserted, "sampled": limiter.sampled, "sequences": len(items)}
        f.write(json.dumps(head).encode() + b"\n")
        for item in items:
            frames = codec.encode("sequence", item.arrays, sender="replay-snapshot", param_version=item.param_version,
                                  meta={"priority": repr(float(item.priority))})
            f.write(_COUNT.pack(len(frames)))
            for frame in frames:
                data = memoryview(frame).cast("B")
                f.write(_LENGTH.pack(data.nbytes))
                f.write(data)

    write_atomically(path, write)
    return path.stat().st_size


def load(path: Path, cfg: Config, buffer: SequenceBuffer, limiter: RateLimiter, log: logging.Logger) -> int:
    """Fill an empty `buffer` and `limiter` from the snapshot at `path`; returns the sequences restored.

    A missing file restores nothing. A sequence that does not decode or validate under `cfg` is
    skipped; a file cut short keeps what came before the cut."""
    if not path.exists():
        return 0
    restored = skipped = 0
    limit = cfg.replay.max_message_bytes
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            log.warning("%s is not a replay snapshot; starting empty", path)
            return 0
        try:
            head = json.loads(f.readline(MAX_HEADER))
            inserted, sampled, count = (int(head[k]) for k in ("inserted", "sampled", "sequences"))
        except (ValueError, KeyError, TypeError):
            log.warning("%s: header does not read; starting empty", path)
            return 0
        for _ in range(count):
            frames = _read_frames(f, limit)
            if frames is None:
                log.warning("%s ends early: %d sequences read of %d", path, restored + skipped, count)
                break
            try:
                msg = codec.decode(frames, max_bytes=limit, expected_kind="sequence")
                validate_sequence(msg.arrays, cfg)
                priority = float(msg.meta.get("priority", "1.0")[:32])
                if not (math.isfinite(priority) and priority >= 0):
                    raise ValueError("priority not finite and non-negative")
            except (codec.CodecError, ValueError):
                skipped += 1
                continue
            item = buffer.add(msg.arrays, msg.param_version)
            buffer.restore_priority(item, priority)
            restored += 1
    if skipped:
        log.warning("%s: %d sequences did not validate under this configuration and were dropped", path, skipped)
    # the limiter goes on from where it stopped, less what was not restored
    limiter.inserted = max(0, inserted - (count - restored))
    limiter.sampled = sampled
    return restored


def _read_frames(f: BinaryIO, limit: int) -> list[bytes] | None:
    """One sequence's frames, or None at a cut (a short read or a length beyond any valid message)."""
    raw = f.read(_COUNT.size)
    if len(raw) < _COUNT.size:
        return None
    (n,) = _COUNT.unpack(raw)
    if n > 64:
        return None
    frames, total = [], 0
    for _ in range(n):
        raw = f.read(_LENGTH.size)
        if len(raw) < _LENGTH.size:
            return None
        (length,) = _LENGTH.unpack(raw)
        total += length
        if total > limit:
            return None
        data = f.read(length)
        if len(data) < length:
            return None
        frames.append(data)
    return frames
