"""ZeroMQ wire format: a protobuf FrameHeader frame, then one raw frame per array.

Arrays travel as their bytes (no pickle, no copy on the sending side with zmq copy=False; the
receiver wraps the frames with np.frombuffer). decode() rejects anything malformed, oversized, of
another schema version, or whose frames disagree with the header, raising CodecError with the
reason; the receiving service counts it and goes on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from lbcproto import lbc_pb2

SCHEMA_VERSION = 1
ALLOWED_DTYPES = frozenset({"uint8", "int32", "int64", "float32", "bool"})
# numpy works out dtype.name anew on every read (2-3 us, twice an array: 60% of encoding a sequence); dtypes hash
_DTYPE_NAMES = {np.dtype(name): name for name in ALLOWED_DTYPES}
_DTYPES = {name: np.dtype(name) for name in ALLOWED_DTYPES}
MAX_DIMS = 8
# The reasons a message is refused, a fixed set: metrics label by them, so a peer cannot grow the label set.
REASONS = ("size", "header", "frames", "layout", "value", "request")


class CodecError(ValueError):
    """A message that cannot be accepted; str(error) says why, `reason` (one of REASONS) says what kind."""

    def __init__(self, message: str, reason: str = "frames") -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown rejection reason {reason!r}")
        super().__init__(message)
        self.reason = reason


@dataclass
class Message:
    kind: str
    sender: str
    param_version: int
    arrays: dict[str, np.ndarray]
    meta: dict[str, str] = field(default_factory=dict)


def meta_int(meta: Mapping[str, str], name: str, default: int) -> int | None:
    """A header's meta field read as an integer: `default` where absent, None where it is not one (at most
    its first 12 characters are read, so a peer's long string costs nothing)."""
    try:
        return int(meta.get(name, str(default))[:12])
    except ValueError:
        return None


def encode(kind: str, arrays: Mapping[str, np.ndarray], *, sender: str = "", param_version: int = 0,
           meta: Mapping[str, str] | None = None) -> list[bytes | memoryview]:
    header = lbc_pb2.FrameHeader(schema_version=SCHEMA_VERSION, kind=kind, sender=sender,
                                 param_version=param_version, meta=dict(meta or {}))
    frames: list[bytes | memoryview] = []
    for name, arr in arrays.items():
        dtype_name = _DTYPE_NAMES.get(arr.dtype)
        if dtype_name is None:
            raise CodecError(f"array {name!r} has dtype {arr.dtype.name}, not one of {sorted(ALLOWED_DTYPES)}")
        arr = np.ascontiguousarray(arr)
        header.arrays.add(name=name, dtype=dtype_name, shape=list(arr.shape))
        frames.append(memoryview(arr).cast("B"))
    return [header.SerializeToString(), *frames]


def _as_buffer(frame: object) -> memoryview:
    # zmq.Frame exposes .buffer; bytes and memoryviews are buffers already.
    return memoryview(getattr(frame, "buffer", frame))


def decode(frames: Sequence[object], *, max_bytes: int, expected_kind: str | None = None) -> Message:
    if not frames:
        raise CodecError("empty message", "header")
    total = sum(_as_buffer(f).nbytes for f in frames)
    if total > max_bytes:
        raise CodecError(f"message of {total} bytes exceeds the limit of {max_bytes}", "size")
    header = lbc_pb2.FrameHeader()
    try:
        header.ParseFromString(bytes(_as_buffer(frames[0])))
    except Exception as exc:  # protobuf raises DecodeError, but be strict about anything
        raise CodecError(f"header does not parse: {exc}", "header") from None
    if header.schema_version != SCHEMA_VERSION:
        raise CodecError(f"schema version {header.schema_version}, this service speaks {SCHEMA_VERSION}", "header")
    if expected_kind is not None and header.kind != expected_kind:
        raise CodecError(f"kind {header.kind[:40]!r}, expected {expected_kind!r}", "header")
    if len(header.arrays) != len(frames) - 1:
        raise CodecError(f"header lists {len(header.arrays)} arrays but {len(frames) - 1} frames follow")
    arrays: dict[str, np.ndarray] = {}
    for spec, frame in zip(header.arrays, frames[1:], strict=True):
        if spec.dtype not in ALLOWED_DTYPES:
            raise CodecError(f"array {spec.name[:40]!r}: dtype {spec.dtype[:20]!r} not allowed")
        if spec.name in arrays:
            raise CodecError(f"array {spec.name[:40]!r} appears twice")
        if len(spec.shape) > MAX_DIMS or any(d < 0 for d in spec.shape):
            raise CodecError(f"array {spec.name[:40]!r}: shape {list(spec.shape)[:MAX_DIMS + 1]} has a negative "
                             f"dimension or more than {MAX_DIMS}")
        dtype = _DTYPES[spec.dtype]
        # exact integers: a product taken in int64 wraps (2**32 x 2**32 reads as 0 bytes)
        expected = math.prod(int(d) for d in spec.shape) * dtype.itemsize
        buf = _as_buffer(frame)
        if buf.nbytes != expected:
            raise CodecError(f"array {spec.name[:40]!r}: {buf.nbytes} bytes for shape {list(spec.shape)} "
                             f"{spec.dtype} (needs {expected})")
        try:
            arr = np.frombuffer(buf, dtype=dtype).reshape(tuple(spec.shape))
        except ValueError:   # an empty array whose other dimensions multiply past what numpy indexes
            raise CodecError(f"array {spec.name[:40]!r}: shape {list(spec.shape)} is beyond numpy's sizes") from None
        if dtype == np.bool_ and arr.size and arr.view(np.uint8).max() > 1:
            raise CodecError(f"array {spec.name[:40]!r}: bool bytes other than 0 and 1")
        arrays[spec.name] = arr
    return Message(kind=header.kind, sender=header.sender, param_version=header.param_version,
                   arrays=arrays, meta=dict(header.meta))


Layout = dict[str, tuple[str, tuple[int, ...]]]


def layout_bytes(layout: Layout) -> int:
    """The bytes of one record's arrays in this layout, a message's header aside."""
    return sum(np.dtype(dtype).itemsize * math.prod(shape) for dtype, shape in layout.values())


def check_layout(arrays: Mapping[str, np.ndarray], layout: Layout, leading: tuple[int, ...] = ()) -> None:
    """Every array of the layout present with its dtype and shape (after `leading` dims), no others."""
    missing = set(layout) - set(arrays)
    extra = set(arrays) - set(layout)
    if missing or extra:
        raise CodecError(f"arrays do not match the layout: missing {sorted(missing)}, "
                         f"unexpected {sorted(name[:40] for name in extra)[:5]}", "layout")
    for name, (dtype, shape) in layout.items():
        arr = arrays[name]
        if arr.dtype.name != dtype:
            raise CodecError(f"array {name!r}: dtype {arr.dtype.name}, expected {dtype}", "layout")
        if arr.shape != leading + shape:
            raise CodecError(f"array {name!r}: shape {arr.shape}, expected {leading + shape}", "layout")
