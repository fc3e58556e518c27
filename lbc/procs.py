"""The launcher's services as processes: which child runs which service now (a restart changes the
pid) and how much memory each holds (psutil); used by `make soak` and the chaos test."""

from __future__ import annotations

import psutil

_MODULES = {"learner_svc": "learner", "replay_svc": "replay", "bandit_svc": "bandit"}


def service_name(argv: list[str]) -> str | None:
    """The launcher's name for the service a command line runs (lbc.launch.build_children's names)."""
    if "-m" not in argv or argv.index("-m") + 1 >= len(argv):
        return None
    module = argv[argv.index("-m") + 1]
    if module in _MODULES:
        return _MODULES[module]
    if module == "actor_svc":
        if "--mode" in argv and argv[argv.index("--mode") + 1:][:1] == ["eval"]:
            return "evaluator"
        if "--actor-id" in argv and argv.index("--actor-id") + 1 < len(argv):
            return argv[argv.index("--actor-id") + 1]
    return None


def services(launcher_pid: int) -> dict[str, int]:
    """Service name -> pid of the launcher's children running now."""
    found = {}
    try:
        children = psutil.Process(launcher_pid).children()
    except psutil.NoSuchProcess:
        return found
    for child in children:
        try:
            name = service_name(child.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue   # gone meanwhile
        if name is not None:
            found[name] = child.pid
    return found


def rss_mb(pid: int) -> float | None:
    """Resident memory of `pid` in MB, or None when it is gone."""
    try:
        return psutil.Process(pid).memory_info().rss / 2**20
    except psutil.NoSuchProcess:
        return None
