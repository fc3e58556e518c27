"""What the launcher checks before it starts any service: each failure is one line that names what to
change, instead of a service crash-looping with the cause in its log."""

from __future__ import annotations

import socket
from pathlib import Path

from lbc.config import Config, endpoint_port, unknown_name


class PreflightError(Exception):
    """A run that cannot start as asked; the message says what to change."""


def check_game(cfg: Config, asked: str | None) -> str:
    """The game the run really plays: Catch for env.kind=catch, the Gymnasium id or MinAtar game (the
    configuration has checked them), else an Atari ROM ale-py holds."""
    if cfg.env.kind == "minatar":             # --game has set env.game, which the configuration checked
        return cfg.env.name
    if cfg.env.kind == "gymnasium":
        if asked is not None:
            raise PreflightError(f"--game names an Atari or MinAtar game; env.kind=gymnasium plays env.id "
                                 f"({cfg.env.id}): --set env.id=... chooses another")
        return cfg.env.name
    if cfg.env.kind == "catch":
        if asked not in (None, "catch"):
            raise PreflightError(f"preset '{cfg.preset}' plays the built-in Catch (env.kind=catch); "
                                 f"--game {asked} needs an Atari preset (e.g. --preset cpu)")
        return "catch"
    game = cfg.env.game
    if game == "catch":
        raise PreflightError(f"catch is the built-in game of --preset catch; preset '{cfg.preset}' plays Atari")
    from ale_py.roms import get_all_rom_ids  # heavy import, only for Atari runs

    roms = get_all_rom_ids()
    if game not in roms:
        raise PreflightError(unknown_name("Atari game", game, sorted(roms)))
    return game


def local_ports(cfg: Config, actors: int) -> dict[str, int]:
    """Every port a local run listens on, by the setting that holds it."""
    e = cfg.endpoints
    ports = {f"endpoints.{name}": endpoint_port(getattr(e, name))
             for name in ("params", "bandit", "replay_ingest", "replay_serve", "replay_health")}
    ports |= {"endpoints.learner_metrics": e.learner_metrics, "endpoints.replay_metrics": e.replay_metrics,
              "endpoints.bandit_metrics": e.bandit_metrics}
    if cfg.learner.replicas > 1:
        ports["endpoints.learner_group"] = endpoint_port(e.learner_group)
        for r in range(1, cfg.learner.replicas):
            ports[f"endpoints.learner_replica_metrics_base (+{r}, learner-{r})"] = e.learner_replica_metrics_base + r
    for i in range(actors):
        ports[f"endpoints.actor_health_base (+{i}, actor-{i})"] = e.actor_health_base + i
        ports[f"endpoints.actor_metrics_base (+{i}, actor-{i})"] = e.actor_metrics_base + i
    if cfg.eval.enabled:
        ports["endpoints.eval_health"] = endpoint_port(e.eval_health)
        ports["endpoints.eval_metrics"] = e.eval_metrics
    if cfg.actor.inference == "remote":
        ports |= {"endpoints.inference": endpoint_port(e.inference),
                  "endpoints.inference_health": endpoint_port(e.inference_health),
                  "endpoints.inference_metrics": e.inference_metrics}
    return ports


def _bindable(family: socket.AddressFamily, host: str, port: int) -> bool:
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as gRPC and ZeroMQ bind
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def port_is_free(port: int) -> bool:
    """Free on the IPv4 and IPv6 wildcards, where the services listen (a listener on any address, or a
    connection's local port, makes it busy; the TIME_WAIT of a run just stopped does not)."""
    return _bindable(socket.AF_INET, "0.0.0.0", port) and (
        not socket.has_ipv6 or _bindable(socket.AF_INET6, "::", port))


def check_ports(ports: dict[str, int]) -> None:
    """Every port distinct and free."""
    holders: dict[int, str] = {}
    for setting, port in ports.items():
        if port in holders:
            raise PreflightError(f"{setting} and {holders[port]} both use port {port}")
        holders[port] = setting
    for setting, port in ports.items():
        if not port_is_free(port):
            raise PreflightError(f"port {port} ({setting}) is in use: another run or program holds it; "
                                 f"--port-base P moves every endpoint, --set {setting.split()[0]}=... one")


def check_run_dir(run_dir: Path, resume: bool, overwrite: bool) -> None:
    """A run folder is continued only on purpose and replaced only on purpose. It deletes nothing: the
    launcher replaces a folder only once every other check has passed."""
    checkpoints = list((run_dir / "checkpoints").glob("ckpt-*.pt"))
    if resume and overwrite:
        raise PreflightError("--resume continues a run and --overwrite deletes it: choose one")
    if resume:
        if not checkpoints:
            raise PreflightError(f"--resume: {run_dir} holds no checkpoint to continue from "
                                 f"(is the run name right? runs are folders of {run_dir.parent})")
        return
    if run_dir.exists() and any(run_dir.iterdir()):
        if not overwrite:
            raise PreflightError(f"{run_dir} already holds a run: --resume continues it, --overwrite replaces it, "
                                 f"--name NAME starts another")
