"""The ParameterService the learner hosts: the latest parameter blob and its version."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import grpc
from prometheus_client import Counter, Gauge

from lbc.param_stream import assemble, chunks
from lbc.params import check_blob
from lbcproto import lbc_pb2, lbc_pb2_grpc

log = logging.getLogger("learner")

PULLS = Counter("lbc_param_pulls_total", "Parameter pulls served", ["result"])
PUSHES = Counter("lbc_param_pushes_total", "Parameter pushes received over gRPC", ["result"])
STORE_VERSION = Gauge("lbc_param_store_version", "Version held by the parameter service")


class ParameterStore:
    """Thread-safe holder of (version, blob); versions only go up."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._version = -1
        self._blob = b""

    def set(self, version: int, blob: bytes) -> bool:
        with self._lock:
            if version <= self._version:
                return False
            self._version, self._blob = version, blob
        STORE_VERSION.set(version)
        return True

    def get(self) -> tuple[int, bytes]:
        with self._lock:
            return self._version, self._blob


class ParameterServicer(lbc_pb2_grpc.ParameterServiceServicer):
    def __init__(self, store: ParameterStore, expected_shapes: dict[str, tuple[int, ...]],
                 accept_pushes: bool = False, max_push_bytes: int = 1 << 31) -> None:
        self.store = store
        self.expected_shapes = expected_shapes
        self.accept_pushes = accept_pushes
        self.max_push_bytes = max_push_bytes

    def Pull(self, request: lbc_pb2.PullRequest, context: grpc.ServicerContext) -> Iterator[lbc_pb2.ParamChunk]:
        version, blob = self.store.get()
        if version < 0:
            PULLS.labels("unavailable").inc()
            context.abort(grpc.StatusCode.UNAVAILABLE, "no parameters published yet")
        if request.min_version < 0:
            PULLS.labels("invalid").inc()
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"min_version {request.min_version} is negative")
        if request.have_version == version:
            PULLS.labels("current").inc()
            return
        if version < request.min_version:   # e.g. the evaluator, between evaluations: nothing it would use yet
            PULLS.labels("not_yet").inc()
            return
        PULLS.labels("sent").inc()
        yield from chunks(version, blob)

    def Push(self, request_iterator: Iterator[lbc_pb2.ParamChunk], context: grpc.ServicerContext) -> lbc_pb2.PushReply:
        if not self.accept_pushes:   # refused before a byte of the stream is read
            PUSHES.labels("refused").inc()
            context.abort(grpc.StatusCode.PERMISSION_DENIED,
                          "this learner publishes its own parameters (learner.accept_pushes=false)")
        try:
            got = assemble(request_iterator, self.max_push_bytes)
        except ValueError as exc:
            PUSHES.labels("invalid").inc()
            return lbc_pb2.PushReply(accepted=False, version=self.store.get()[0], reason=str(exc))
        if got is None:
            PUSHES.labels("invalid").inc()
            return lbc_pb2.PushReply(accepted=False, version=self.store.get()[0], reason="empty push")
        version, blob = got
        try:
            check_blob(blob, self.expected_shapes)
        except ValueError as exc:
            PUSHES.labels("invalid").inc()
            return lbc_pb2.PushReply(accepted=False, version=self.store.get()[0], reason=str(exc))
        if not self.store.set(version, blob):
            PUSHES.labels("stale").inc()
            return lbc_pb2.PushReply(accepted=False, version=self.store.get()[0],
                                     reason=f"version {version} is not newer than the store's")
        PUSHES.labels("accepted").inc()
        return lbc_pb2.PushReply(accepted=True, version=version)
