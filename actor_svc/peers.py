"""The actor's view of its peers: parameter pulls, behaviour choices and the replay stream.

Each one degrades instead of failing: a dead learner means acting on the last parameters, a dead
bandit means a default psi for each episode begun meanwhile (not reported; the returns of episodes it
chose wait in a queue until it is back), a dead or saturated replay means the actor waits on send
(backpressure). All retry with backoff and pick up when the peer is back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

import grpc
import numpy as np
import torch
import zmq
from prometheus_client import Counter, Gauge

from lbc import codec
from lbc.behaviour import EpisodeBehaviour
from lbc.config import Config
from lbc.params import load_blob
from lbc.peers import MAX_BEHAVIOURS_PER_EXCHANGE, MAX_RETURNS_PER_EXCHANGE, BanditClient, ParameterClient
from lbc.psi import Psi, psi_problem
from lbc.security import channel_credentials_of, secure_client_socket
from lbc.sequences import socket_buffer_bytes
from lbc.service import Backoff
from lbcproto import lbc_pb2

log = logging.getLogger("actor")

PULLS = Counter("lbc_actor_param_pulls_total", "Parameter pulls", ["result"])
VERSION = Gauge("lbc_actor_param_version", "Parameter version the actor acts with")
FALLBACKS = Counter("lbc_actor_bandit_fallbacks_total", "Episodes run with the default psi (bandit unreachable)")
REPORTS = Counter("lbc_actor_bandit_reports_total", "Episode returns reported to the bandit", ["result"])
SENT = Counter("lbc_actor_sequences_sent_total", "Sequences sent to replay")
SEND_BLOCKED = Counter("lbc_actor_send_blocked_seconds_total", "Seconds waiting on replay (backpressure)")

MAX_QUEUED_RETURNS = 4096   # returns waiting for the bandit while it is away


class ParamPuller:
    def __init__(self, cfg: Config, actor_id: str, model: torch.nn.Module) -> None:
        self.client = ParameterClient(cfg.endpoints.params, actor_id, cfg.endpoints.rpc_timeout_s,
                                      channel_credentials_of(cfg))
        self.model = model
        self.version = -1
        self.backoff = Backoff(initial=0.5)

    def pull(self, min_version: int = 0) -> bool:
        """One attempt; True when the model holds parameters afterwards. Parameters older than `min_version` are
        not sent (the server streams nothing): the model keeps what it holds."""
        now = time.monotonic()
        if not self.backoff.ready(now):
            return self.version >= 0
        try:
            got = self.client.pull(self.version, min_version)
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
    """The episodes' behaviours from the bandit, and their returns back to it, off the acting loop.

    A thread of its own keeps up to `ahead` behaviours chosen in advance (one per environment: Catch's
    episodes end together) and trades the returns queued since its last call for new choices in one
    Exchange call (docs/decisions.md 70), so the loop waits on the bandit only when that stock is empty. A
    chosen-ahead behaviour was picked before the returns of the last `ahead` episodes reached the bandit
    (decision 69). One round trip per episode took 1.3 ms on two cores, 28% of an agent57 Catch actor's loop,
    where episodes last 9 steps."""

    def __init__(self, cfg: Config, actor_id: str, ahead: int = 0) -> None:
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
        self.ahead = min(ahead, MAX_BEHAVIOURS_PER_EXCHANGE)
        self.stock: deque[EpisodeBehaviour] = deque()
        # the loop appends while the thread takes: every use holds the lock (an iteration over a deque that
        # another thread appends to fails, and did: "deque mutated during iteration" killed the thread)
        self.returns: deque[tuple[str, float]] = deque(maxlen=MAX_QUEUED_RETURNS)
        self.returns_lock = threading.Lock()
        self.wake, self.closing = threading.Event(), threading.Event()
        self.worker = None
        if self.client is not None:
            self.worker = threading.Thread(target=self._work, name="bandit", daemon=True)
            self.worker.start()

    def next(self) -> EpisodeBehaviour:
        """The next episode's behaviour: one chosen ahead, else asked for now, else the default psi."""
        self.wake.set()
        try:
            return self.stock.popleft()
        except IndexError:
            pass
        chosen = self._exchange([], 1)
        if not chosen:
            if self.client is not None:
                FALLBACKS.inc()
            return self.default
        return chosen[0]

    def report(self, episode_id: str, episode_return: float) -> None:
        """Queue an episode's return for the bandit (the oldest dropped beyond MAX_QUEUED_RETURNS)."""
        if not episode_id or self.client is None:
            return
        with self.returns_lock:
            if len(self.returns) == self.returns.maxlen:
                REPORTS.labels("dropped").inc()
            self.returns.append((episode_id, episode_return))
        self.wake.set()

    def close(self, timeout: float = 2.0) -> None:
        """Send the queued returns (for at most `timeout` seconds) and stop the thread."""
        if self.worker is not None:
            self.closing.set()
            self.wake.set()
            self.worker.join(timeout)

    def _work(self) -> None:
        while True:
            self.wake.wait(0.5)
            self.wake.clear()
            while self._available():
                returns = self._take_returns()
                wanted = 0 if self.closing.is_set() else max(self.ahead - len(self.stock), 0)
                if not returns and not wanted:
                    break
                chosen = self._exchange(returns, wanted)
                if chosen is None:
                    self._give_back(returns)   # kept for the bandit's return
                    break
                self.stock.extend(chosen)
                if len(chosen) < wanted:
                    break   # invalid choices: asked again at the next wake, not in a tight loop
            if self.closing.is_set():
                return

    def _take_returns(self) -> list[tuple[str, float]]:
        """The oldest queued returns, at most MAX_RETURNS_PER_EXCHANGE, out of the queue."""
        with self.returns_lock:
            return [self.returns.popleft() for _ in range(min(len(self.returns), MAX_RETURNS_PER_EXCHANGE))]

    def _give_back(self, returns: list[tuple[str, float]]) -> None:
        """Returns the bandit did not take, back at the front of the queue in their order; beyond
        MAX_QUEUED_RETURNS the oldest are dropped, as report drops them."""
        with self.returns_lock:
            keep = returns[max(len(returns) - (self.returns.maxlen - len(self.returns)), 0):]
            if len(keep) < len(returns):
                REPORTS.labels("dropped").inc(len(returns) - len(keep))
            self.returns.extendleft(reversed(keep))

    def _available(self) -> bool:
        return self.client is not None and self.backoff.ready()

    def _exchange(self, returns: list[tuple[str, float]], wanted: int) -> list[EpisodeBehaviour] | None:
        """Send returns and ask for `wanted` behaviours: the valid ones, or None when the bandit did not
        answer (the returns are to be sent again)."""
        if not self._available():
            return None
        try:
            reply = self.client.exchange(self.actor_id, returns, wanted)
        except grpc.RpcError as exc:
            REPORTS.labels("error").inc(len(returns))
            self.backoff.fail()
            log.warning("bandit exchange failed (%s); default psi until it answers", exc.code().name)
            return None
        self.backoff.reset()
        if len(reply.reports) != len(returns) or len(reply.behaviours) > wanted:
            log.error("bandit answered %d reports for %d returns and %d behaviours for %d; ignored",
                      len(reply.reports), len(returns), len(reply.behaviours), wanted)
            return []
        for r in reply.reports:
            REPORTS.labels("accepted" if r.accepted else "refused").inc()
            if not r.accepted:
                log.warning("bandit refused a return: %s", r.reason)
        return [c for c in map(self._checked, reply.behaviours) if c is not None]

    def _checked(self, b: lbc_pb2.Behavior) -> EpisodeBehaviour | None:
        mixture = b.mixture if b.HasField("mixture") else None
        problem = check_behaviour(list(b.tau), list(b.omega), self.num_components, self.tau_max, mixture,
                                  self.num_mixtures)
        if problem:
            log.error("bandit answered an invalid psi (%s); default psi for this episode", problem)
            return None
        return EpisodeBehaviour(b.episode_id, Psi(tuple(b.tau), tuple(b.omega)), mixture)


class SequenceSender:
    """PUSH to replay with a small high-water mark: when replay is slow or gone, send() waits."""

    def __init__(self, cfg: Config, actor_id: str, stop: threading.Event) -> None:
        self.sock = zmq.Context.instance().socket(zmq.PUSH)
        self.sock.setsockopt(zmq.SNDHWM, 8)
        self.sock.setsockopt(zmq.SNDBUF, socket_buffer_bytes(cfg))   # held sequences wait here, not in the kernel
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
