"""bandit_svc: the meta-controller. Picks psi for every episode of every actor (population-based
UCB bandits, LBC App. E.4; DiCE's and GDI's bandits vote; or NGU's j by Agent57's sliding-window
UCB), learns from the returns, and snapshots its state to disk."""

from __future__ import annotations

from pathlib import Path

import grpc
from prometheus_client import Counter, Gauge

from bandit_svc.state import BanditState, UnknownEpisode
from lbc.config import Config
from lbc.peers import MAX_BEHAVIOURS_PER_EXCHANGE, MAX_RETURNS_PER_EXCHANGE
from lbc.psi import Psi
from lbc.security import server_credentials_of
from lbc.service import (
    base_parser,
    config_from_args,
    exit_service,
    grpc_server,
    listen_address,
    set_serving,
    setup_logging,
    start_metrics,
    stop_event,
)
from lbcproto import lbc_pb2, lbc_pb2_grpc

SELECTIONS = Counter("lbc_bandit_selections_total", "Voted arm per dimension of psi", ["dimension", "arm"])
PSI = Gauge("lbc_bandit_psi", "Last chosen value per dimension of psi", ["dimension"])
EPISODES = Counter("lbc_bandit_episodes_total", "Returns reported and learned from")
RETURNS = Gauge("lbc_bandit_last_return", "Last episode return reported")
REPORT_REJECTED = Counter("lbc_bandit_reports_rejected_total", "Reports for unknown episodes")
ACTORS = Gauge("lbc_bandit_actors", "Actors with a bandit population")
EVICTED = Gauge("lbc_bandit_actors_evicted", "Actors forgotten since the start, least recently seen first "
                                             "(bandit.max_actors)")
SNAPSHOTS = Counter("lbc_bandit_snapshots_total", "State snapshots written")


def _check_actor_id(actor_id: str, context: grpc.ServicerContext) -> None:
    if not actor_id or len(actor_id) > 128:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "actor_id must be 1 to 128 characters")


class BanditServicer(lbc_pb2_grpc.BanditServiceServicer):
    def __init__(self, state: BanditState) -> None:
        self.state = state
        self.names = state.dimension_names

    def SelectBehavior(self, request: lbc_pb2.SelectRequest, context: grpc.ServicerContext) -> lbc_pb2.Behavior:
        _check_actor_id(request.actor_id, context)
        return self._select(request.actor_id)

    def ReportReturn(self, request: lbc_pb2.ReturnReport, context: grpc.ServicerContext) -> lbc_pb2.ReportReply:
        return self._report(request.actor_id, request.episode_id, request.episode_return)

    def Exchange(self, request: lbc_pb2.ExchangeRequest, context: grpc.ServicerContext) -> lbc_pb2.ExchangeReply:
        _check_actor_id(request.actor_id, context)
        if len(request.returns) > MAX_RETURNS_PER_EXCHANGE or request.behaviours > MAX_BEHAVIOURS_PER_EXCHANGE:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"at most {MAX_RETURNS_PER_EXCHANGE} returns and {MAX_BEHAVIOURS_PER_EXCHANGE} behaviours "
                          f"per exchange, got {len(request.returns)} and {request.behaviours}")
        reports = [self._report(request.actor_id, r.episode_id, r.episode_return) for r in request.returns]
        behaviours = [self._select(request.actor_id) for _ in range(request.behaviours)]
        return lbc_pb2.ExchangeReply(reports=reports, behaviours=behaviours)

    def _select(self, actor_id: str) -> lbc_pb2.Behavior:
        episode_id, choice = self.state.select(actor_id)
        for name, arm in zip(self.names, choice.arms, strict=True):
            SELECTIONS.labels(name, str(arm)).inc()
        for name, value in Psi(choice.tau, choice.omega).named(self.state.cfg.behaviour.family).items():
            PSI.labels(name).set(value)
        ACTORS.set(len(self.state.controllers))
        EVICTED.set(self.state.evicted)
        if choice.mixture is not None:
            PSI.labels("mixture").set(choice.mixture)
        return lbc_pb2.Behavior(episode_id=episode_id, tau=choice.tau, omega=choice.omega, arms=choice.arms,
                                mixture=choice.mixture)

    def _report(self, actor_id: str, episode_id: str, episode_return: float) -> lbc_pb2.ReportReply:
        bound = self.state.cfg.env.max_abs_return
        if not abs(episode_return) <= bound:   # False for NaN too
            REPORT_REJECTED.inc()
            return lbc_pb2.ReportReply(accepted=False,
                                       reason=f"episode_return not finite or beyond env.max_abs_return={bound:g}")
        try:
            self.state.report(actor_id, episode_id, episode_return)
        except UnknownEpisode:
            REPORT_REJECTED.inc()
            return lbc_pb2.ReportReply(accepted=False, reason=f"unknown episode {episode_id!r}")
        EPISODES.inc()
        RETURNS.set(episode_return)
        return lbc_pb2.ReportReply(accepted=True)

    def GetStats(self, request: lbc_pb2.StatsRequest, context: grpc.ServicerContext) -> lbc_pb2.BanditStats:
        out = lbc_pb2.BanditStats()
        for aid, s in self.state.stats(request.actor_id).items():
            actor = out.actors.add(actor_id=aid, episodes=s["episodes"])
            for d in s["dimensions"]:
                actor.dimensions.add(name=d["name"], selections=d["selections"], mean_return=d["mean_return"])
        return out


def main(argv: list[str] | None = None) -> int:
    parser = base_parser("bandit_svc", __doc__)
    args = parser.parse_args(argv)
    cfg: Config = config_from_args(args)
    log = setup_logging("bandit", args.log_level)
    stop = stop_event()

    state = BanditState(cfg)
    snapshot = Path(cfg.run_dir) / "bandit" / "state.json"
    try:
        if state.restore(snapshot, log):
            log.info("restored %d actor populations from %s", len(state.controllers), snapshot)
    except (ValueError, KeyError) as exc:
        raise SystemExit(f"cannot restore bandit snapshot {snapshot}: {exc}") from None

    server, health = grpc_server(listen_address(cfg.endpoints.bandit, cfg.endpoints.bind_host),
                                 credentials=server_credentials_of(cfg))
    lbc_pb2_grpc.add_BanditServiceServicer_to_server(BanditServicer(state), server)
    server.start()
    set_serving(health, ["lbc.v1.BanditService"])
    start_metrics(cfg.endpoints.bandit_metrics, cfg.endpoints.bind_host)
    log.info("bandit up on %s: %s over %s, %d behaviour components, population %d, top-D %d",
             cfg.endpoints.bandit, cfg.bandit.algorithm, ", ".join(state.dimension_names), cfg.num_components,
             cfg.bandit.population, cfg.bandit.top_d)

    while not stop.wait(cfg.bandit.snapshot_every_s):
        state.save(snapshot)
        SNAPSHOTS.inc()
    set_serving(health, ["lbc.v1.BanditService"], serving=False)
    server.stop(grace=1.0).wait()
    state.save(snapshot)
    log.info("bandit stopped; state saved to %s", snapshot)
    return 0


if __name__ == "__main__":
    exit_service(main())
