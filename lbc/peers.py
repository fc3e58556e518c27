"""Clients for the gRPC services, with deadlines; callers retry with lbc.service.Backoff."""

from __future__ import annotations

import grpc

from lbc.param_stream import assemble, chunks
from lbcproto import lbc_pb2, lbc_pb2_grpc

_OPTIONS = [("grpc.max_receive_message_length", 8 << 20), ("grpc.enable_retries", 1),
            ("grpc.keepalive_time_ms", 20_000)]


def open_channel(address: str, credentials: grpc.ChannelCredentials | None = None) -> grpc.Channel:
    """A channel to `address`: mutual TLS with credentials (lbc.security), plain without."""
    if credentials is None:
        return grpc.insecure_channel(address, options=_OPTIONS)
    return grpc.secure_channel(address, credentials, options=_OPTIONS)


class ParameterClient:
    def __init__(self, address: str, caller: str, timeout_s: float,
                 credentials: grpc.ChannelCredentials | None = None) -> None:
        self.channel = open_channel(address, credentials)
        self.stub = lbc_pb2_grpc.ParameterServiceStub(self.channel)
        self.caller = caller
        self.timeout_s = timeout_s

    def pull(self, have_version: int, min_version: int = 0) -> tuple[int, bytes] | None:
        """The newest (version, blob), or None when have_version is current or the newest version is below
        min_version. Raises grpc.RpcError or ValueError (corrupt stream)."""
        stream = self.stub.Pull(lbc_pb2.PullRequest(caller=self.caller, have_version=have_version,
                                                    min_version=min_version), timeout=self.timeout_s)
        return assemble(stream)

    def push(self, version: int, blob: bytes) -> lbc_pb2.PushReply:
        return self.stub.Push(chunks(version, blob), timeout=self.timeout_s)

    def close(self) -> None:
        self.channel.close()


# An Exchange's bounds, checked by bandit_svc: no more returns than the episodes it keeps open per actor
# (bandit_svc.state.MAX_PENDING_PER_ACTOR), no more behaviours than an actor keeps chosen ahead
MAX_RETURNS_PER_EXCHANGE = 1024
MAX_BEHAVIOURS_PER_EXCHANGE = 256


class BanditClient:
    def __init__(self, address: str, timeout_s: float, credentials: grpc.ChannelCredentials | None = None) -> None:
        self.channel = open_channel(address, credentials)
        self.stub = lbc_pb2_grpc.BanditServiceStub(self.channel)
        self.timeout_s = timeout_s

    def select(self, actor_id: str) -> lbc_pb2.Behavior:
        return self.stub.SelectBehavior(lbc_pb2.SelectRequest(actor_id=actor_id), timeout=self.timeout_s)

    def report(self, actor_id: str, episode_id: str, episode_return: float) -> lbc_pb2.ReportReply:
        return self.stub.ReportReturn(lbc_pb2.ReturnReport(actor_id=actor_id, episode_id=episode_id,
                                                           episode_return=episode_return),
                                      timeout=self.timeout_s)

    def exchange(self, actor_id: str, returns: list[tuple[str, float]], behaviours: int) -> lbc_pb2.ExchangeReply:
        """The returns of ended episodes (episode id, return), then `behaviours` new choices, in one call."""
        reports = [lbc_pb2.ReturnReport(actor_id=actor_id, episode_id=e, episode_return=r) for e, r in returns]
        return self.stub.Exchange(lbc_pb2.ExchangeRequest(actor_id=actor_id, returns=reports, behaviours=behaviours),
                                  timeout=self.timeout_s)

    def stats(self, actor_id: str = "") -> lbc_pb2.BanditStats:
        return self.stub.GetStats(lbc_pb2.StatsRequest(actor_id=actor_id), timeout=self.timeout_s)

    def close(self) -> None:
        self.channel.close()
