"""The launcher's services as processes: which child runs which service now (a restart changes the
pid) and how much memory each holds. Linux only (reads /proc); used by `make soak` and the chaos test."""

from __future__ import annotations

from pathlib import Path

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
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = [a.decode() for a in (entry / "cmdline").read_bytes().split(b"\0") if a]
        except (OSError, IndexError, ValueError):
            continue   # gone meanwhile
        if ppid == launcher_pid and (name := service_name(argv)) is not None:
            found[name] = int(entry.name)
    return found


def rss_mb(pid: int) -> float | None:
    """Resident memory of `pid` in MB (VmRSS), or None when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None
