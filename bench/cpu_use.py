"""The cores each service of a running system keeps busy, from the kernel's accounting of its processes.

bench.spy says where threads spend and wait; this says how the machine's CPU is shared out. Over the
end-to-end window, each service's CPU seconds (user + system, all its threads) divided by the window is
the cores it used, and divided by the agent steps made, its CPU cost per agent step: the figure that has
to fall for more frames per second on a machine whose cores are all busy. Cores nobody used mean the
system waits somewhere (a serial loop, a limiter) rather than computes.
"""

from __future__ import annotations

from collections import defaultdict

import psutil

from bench.spy import service_name


def service_cpu_seconds(root_pid: int) -> dict[str, float]:
    """CPU seconds used so far by `root_pid` (the launcher) and each process under it, summed per service
    (bench.spy.service_name: `actor_svc 0`, `learner_svc`, ...). Processes that end meanwhile are skipped."""
    root = psutil.Process(root_pid)
    seconds: dict[str, float] = defaultdict(float)
    for proc in (root, *root.children(recursive=True)):
        try:
            with proc.oneshot():
                times = proc.cpu_times()
                name = service_name(" ".join(proc.cmdline()))
        except psutil.NoSuchProcess:
            continue
        seconds[name] += times.user + times.system
    return dict(seconds)


SHOWN_CORES = 0.005   # a service busier than this has a row (the launcher and an idle bandit do not)


def cores_by_service(start: dict[str, float], end: dict[str, float], seconds: float) -> dict[str, float]:
    """The cores each service kept busy between two service_cpu_seconds readings `seconds` apart."""
    return {name: (end[name] - start.get(name, 0.0)) / seconds for name in end}


def cpu_table(start: dict[str, float], end: dict[str, float], seconds: float, agent_steps_per_s: float,
              cores: int) -> list[str]:
    """Per service, the cores it kept busy between two service_cpu_seconds readings `seconds` apart and its
    CPU milliseconds per agent step at `agent_steps_per_s`; then the total and the cores left idle."""
    used = cores_by_service(start, end, seconds)
    rows = ["service                   cores busy   CPU ms per agent step"]
    for name, busy in sorted(used.items(), key=lambda item: -item[1]):
        if busy >= SHOWN_CORES:
            rows.append(f"{name:24} {busy:10.2f} {busy / agent_steps_per_s * 1e3:16.3f}")
    total = sum(used.values())
    rows.append(f"{'all services':24} {total:10.2f} {total / agent_steps_per_s * 1e3:16.3f}")
    rows.append(f"{'idle':24} {max(cores - total, 0.0):10.2f}   of {cores} cores")
    return rows
