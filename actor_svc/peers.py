"""The actor's view of its peers: parameter pulls, behaviour choices and the replay stream.

Each one degrades instead of failing: a dead learner means acting on the last parameters, a dead
bandit means a default psi for the episode (not reported), a dead or saturated replay means the
actor waits on send (backpressure). All retry with backoff and pick up when the peer is back.
"""

from __future__ import annotations

import logging
import threading
import time

import grpc
import numpy as np
import torch
import zmq
from prometheus_client import Counter, Gauge

from lbc import codec
from lbc.behaviour import EpisodeBehaviour
from lbc.config import Config
from lbc.params import load_blob
from lbc.peers import BanditClient, ParameterClient
from lbc.psi import Psi, psi_problem
from lbc.security import channel_credentials_of, secure_client_socket
from lbc.service import Backoff

log = logging.getLogger("actor")

PULLS = Counter("lbc_actor_param_pulls_total", "Parameter pulls", ["result"])
VERSION = Gauge("lbc_actor_param_version", "Parameter version the actor acts with")
FALLBACKS = Counter("lbc_actor_bandit_fallbacks_total", "Episodes run with the default psi (bandit unreachable)")
REPORTS = Counter("lbc_actor_bandit_reports_total", "Episode returns reported to the bandit", ["result"])
SENT = Counter("lbc_actor_sequences_sent_total", "Sequences sent to replay")
SEND_BLOCKED = Counter("lbc_actor_send_blocked_seconds_total", "Seconds waiting on replay (backpressure)")


class ParamPuller:
    def __init__(self, cfg: Config, actor_id: str, model: torch.nn.Module) -> None:
        self.client = ParameterClient(cfg.endpoints.params, actor_id, cfg.endpoints.rpc_timeout_s,
                                      channel_credentials_of(cfg))
        self.model = model
        self.version = -1
        self.backoff = Backoff(initial=0.5)

    def pull(self) -> bool:
        """One attempt; True when the model holds parameters afterwards."""
        now = time.monotonic()
        if not self.backoff.ready(now):
            return self.version >= 0
        try:
            got = self.client.pull(self.version)
        except (grpc.RpcError, ValueError) as exc:
            PULLS.labels("error").inc()
            self.backoff.fail(now)
            detail = exc.code().name if isinstance(exc, grpc.RpcError) else str(exc)
            log.warning("parameter pull failed (%s); acting on version %d", detail, self.version)
            return self.version >= 0
        self.backoff.reset()
        if got is None:
            PULLS.labels("current").inc()
            return True
        version, blob = got
        try:
            load_blob(self.model, blob)
        except ValueError as exc:   # e.g. non-finite values: keep acting on the last good parameters
            PULLS.labels("refused").inc()
            self.backoff.fail(now)
            log.error("refused parameters of version %d (%s); acting on version %d", version, exc, self.version)
            return self.version >= 0
        self.version = version
        VERSION.set(version)
        PULLS.labels("updated").inc()
        return True


def check_behaviour(tau: list[float], omega: list[float], components: int, tau_max: float,
                    mixture: int | None = None, num_mixtures: int = 0) -> str:
    """Why a psi from the network cannot be used ('' if it can): K tau in [0, tau_max] and K weights in
    [0, 1] summing to 1, and when the bandit chooses NGU's j (num_mixtures > 0), a j in [0, N)."""
    if num_mixtures and (mixture is None or not 0 <= mixture < num_mixtures):
        return f"mixture {mixture} outside [0, {num_mixtures})"
    if len(tau) != components or len(omega) != components:
        return f"{len(tau)} tau and {len(omega)} omega for {components} behaviour components"
    return psi_problem(np.array(tau, np.float64), np.array(omega, np.float64), tau_max)


class BehaviourSource:
    def __init__(self, cfg: Config, actor_id: str) -> None:
        self.actor_id = actor_id
        n = cfg.num_components
        self.num_components = n
        self.tau_max = cfg.tau_max
        # Agent57: the bandit chooses j, so a reply without a valid one is refused
        self.num_mixtures = cfg.ngu.num_mixtures if cfg.bandit.algorithm == "sliding_window_ucb" else 0
        self.default = EpisodeBehaviour("", Psi.uniform(cfg.behaviour.fixed_tau, n))
        self.client = BanditClient(cfg.endpoints.bandit, min(cfg.endpoints.rpc_timeout_s, 1.0),
                                   channel_credentials_of(cfg)) \
            if cfg.behaviour.controlled else None
        self.backoff = Backoff(initial=0.5)

    def _available(self) -> bool:
        return self.client is not None and self.backoff.ready()

    def _failed(self, what: str, exc: grpc.RpcError) -> None:
        self.backoff.fail()
        log.warning("bandit %s failed (%s); default psi until it answers", what, exc.code().name)

    def next(self) -> EpisodeBehaviour:
        if not self._available():
            if self.client is not None:
                FALLBACKS.inc()
            return self.default
        try:
            b = self.client.select(self.actor_id)
        except grpc.RpcError as exc:
            self._failed("select", exc)
            FALLBACKS.inc()
            return self.default
        self.backoff.reset()
        mixture = b.mixture if b.HasField("mixture") else None
        problem = check_behaviour(list(b.tau), list(b.omega), self.num_components, self.tau_max, mixture,
                                  self.num_mixtures)
        if problem:
            log.error("bandit answered an invalid psi (%s); default psi for this episode", problem)
            FALLBACKS.inc()
            return self.default
        return EpisodeBehaviour(b.episode_id, Psi(tuple(b.tau), tuple(b.omega)), mixture)

    def report(self, episode_id: str, episode_return: float) -> None:
        if not episode_id or not self._available():
            return
        try:
            reply = self.client.report(self.actor_id, episode_id, episode_return)
        except grpc.RpcError as exc:
            REPORTS.labels("error").inc()
            self._failed("report", exc)
            return
        REPORTS.labels("accepted" if reply.accepted else "refused").inc()
        if not reply.accepted:
            log.warning("bandit refused a return: %s", reply.reason)


class SequenceSender:
    """PUSH to replay with a small high-water mark: when replay is slow or gone, send() waits."""

    def __init__(self, cfg: Config, actor_id: str, stop: threading.Event) -> None:
        self.sock = zmq.Context.instance().socket(zmq.PUSH)
        self.sock.setsockopt(zmq.SNDHWM, 8)
        self.sock.setsockopt(zmq.IMMEDIATE, 1)   # queue only to a live connection
        self.sock.setsockopt(zmq.LINGER, 0)
        secure_client_socket(self.sock, cfg)
        self.sock.connect(cfg.endpoints.replay_ingest)
        self.actor_id = actor_id
        self.stop = stop

    def send(self, sequence: dict, version: int) -> bool:
        frames = codec.encode("sequence", sequence, sender=self.actor_id, param_version=version)
        started = None
        while not self.stop.is_set():
            try:
                self.sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
                SENT.inc()
                if started is not None:
                    SEND_BLOCKED.inc(time.monotonic() - started)
                return True
            except zmq.Again:
                if started is None:
                    started = time.monotonic()
                self.sock.poll(100, zmq.POLLOUT)
        return False

    def close(self) -> None:
        self.sock.close()
