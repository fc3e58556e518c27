"""A parameter blob (lbc.params) as the ParameterService streams it: chunks of at most CHUNK bytes, the
first carrying the whole blob's SHA-256. Without torch, so that the gRPC clients (lbc.peers) need none."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

from lbcproto import lbc_pb2

CHUNK = 1 << 20


def chunks(version: int, blob: bytes) -> Iterator[lbc_pb2.ParamChunk]:
    digest = hashlib.sha256(blob).hexdigest()
    for index, start in enumerate(range(0, max(len(blob), 1), CHUNK)):
        yield lbc_pb2.ParamChunk(version=version, total_bytes=len(blob), index=index,
                                 data=blob[start:start + CHUNK], sha256=digest if index == 0 else "")


def assemble(stream: Iterator[lbc_pb2.ParamChunk], max_bytes: int = 1 << 31) -> tuple[int, bytes] | None:
    """Join a chunk stream into (version, blob); None for an empty stream. Raises ValueError when
    chunks are out of order, versions disagree, the size or checksum is wrong."""
    parts: list[bytes] = []
    version = total = -1
    digest = ""
    for expected_index, chunk in enumerate(stream):
        if chunk.index != expected_index:
            raise ValueError(f"chunk {chunk.index} arrived where {expected_index} was expected")
        if expected_index == 0:
            version, total, digest = chunk.version, chunk.total_bytes, chunk.sha256
            if total > max_bytes:
                raise ValueError(f"blob of {total} bytes exceeds {max_bytes}")
        elif chunk.version != version:
            raise ValueError("chunks of different versions in one stream")
        parts.append(chunk.data)
    if not parts:
        return None
    blob = b"".join(parts)
    if len(blob) != total:
        raise ValueError(f"blob has {len(blob)} bytes, header said {total}")
    if hashlib.sha256(blob).hexdigest() != digest:
        raise ValueError("blob checksum mismatch")
    return version, blob
