"""Parameters on the wire and in the ParameterService: a safetensors blob (no code runs on load),
streamed in chunks of at most CHUNK bytes."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from lbcproto import lbc_pb2

CHUNK = 1 << 20


def to_blob(model: torch.nn.Module) -> bytes:
    return st_save({k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()})


def shapes(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def check_blob(blob: bytes, expected: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """Parse a blob and check its tensors' names, shapes and finiteness; raises ValueError saying what is wrong."""
    try:
        state = st_load(blob)
    except Exception as exc:
        raise ValueError(f"parameter blob does not parse as safetensors: {exc}") from None
    if set(state) != set(expected):
        raise ValueError(f"parameter names differ: missing {sorted(set(expected) - set(state))[:5]}, "
                         f"unexpected {sorted(set(state) - set(expected))[:5]}")
    for name, tensor in state.items():
        if tuple(tensor.shape) != expected[name]:
            raise ValueError(f"parameter {name}: shape {tuple(tensor.shape)}, model has {expected[name]}")
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"parameter {name} has non-finite values")
    return state


def load_blob(model: torch.nn.Module, blob: bytes) -> None:
    """Load a blob into model; raises ValueError if its tensors don't match the model's."""
    model.load_state_dict(check_blob(blob, shapes(model)))


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
