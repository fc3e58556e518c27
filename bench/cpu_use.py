"""The cores each service of a running system keeps busy, from the kernel's accounting of its processes.

bench.spy says where threads spend and wait; this says how the machine's CPU is shared out. Over the
end-to-end window, each service's CPU seconds (user + system, all its threads) divided by the window is
the cores it used, and divided by the agent steps made, its CPU cost per agent step: the figure that has
to fall for more frames per second on a machine whose cores are all busy. Cores nobody used mean the
system waits somewhere (a serial loop, a limiter) rather than computes, or that the hypervisor ran someone
else on them: a VM's kernel counts that as steal time (stolen_seconds), which no process of the VM is charged
and which its processes' CPU seconds therefore leave out.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import psutil

from bench.spy import service_name


def _service_processes(root_pid: int) -> Iterator[tuple[str, psutil.Process]]:
    """`root_pid` (the launcher) and each process under it, with its service's name (bench.spy.service_name:
    `actor_svc 0`, `learner_svc`, ...); processes that end before they are named are skipped."""
    root = psutil.Process(root_pid)
    for proc in (root, *root.children(recursive=True)):
        try:
            name = service_name(" ".join(proc.cmdline()))
        except psutil.NoSuchProcess:
            continue
        yield name, proc


def service_cpu_seconds(root_pid: int) -> dict[str, float]:
    """CPU seconds used so far by `root_pid` (the launcher) and each process under it, summed per service
    (_service_processes). Processes that end meanwhile are skipped."""
    seconds: dict[str, float] = defaultdict(float)
    for name, proc in _service_processes(root_pid):
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        seconds[name] += times.user + times.system
    return dict(seconds)


def service_thread_seconds(root_pid: int) -> dict[str, dict[int, tuple[float, float]]]:
    """Per service (_service_processes), each thread's seconds so far on a core and waiting on a run queue
    (runnable, no core free for it), from the kernel's /proc/<pid>/task/<tid>/schedstat: the second says whether a
    thread that bounds the system waits for its neighbours' cores. Empty where the kernel keeps no schedstat (not
    Linux, or built without CONFIG_SCHED_INFO); threads and processes that end meanwhile are skipped."""
    threads: dict[str, dict[int, tuple[float, float]]] = defaultdict(dict)
    for name, proc in _service_processes(root_pid):
        try:
            tasks = list(Path(f"/proc/{proc.pid}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                ran_ns, waited_ns = (int(x) for x in (task / "schedstat").read_text().split()[:2])
            except (OSError, ValueError):
                continue
            threads[name][int(task.name)] = (ran_ns * 1e-9, waited_ns * 1e-9)
    return dict(threads)


def busiest_threads(start: dict[str, dict[int, tuple[float, float]]], end: dict[str, dict[int, tuple[float, float]]],
                    seconds: float) -> dict[str, tuple[float, float]]:
    """Per service, its busiest thread between two service_thread_seconds readings `seconds` apart: (the share of
    the window it ran, the share it waited for a core). A thread that bounds the system and waits for a core
    loses that share of the system's speed to its neighbours; one that neither runs nor waits is asleep
    (waiting for data, a lock, the network)."""
    busiest: dict[str, tuple[float, float]] = {}
    for name, threads in end.items():
        before = start.get(name, {})
        shares = []
        for tid, (ran, waited) in threads.items():
            ran_before, waited_before = before.get(tid, (0.0, 0.0))   # a thread started within the window: from 0
            shares.append(((ran - ran_before) / seconds, (waited - waited_before) / seconds))
        if shares:
            busiest[name] = max(shares)
    return busiest


def stolen_seconds() -> float:
    """CPU seconds the hypervisor has taken from this machine's cores so far, all cores summed (the kernel's steal
    time; 0 where it keeps none: bare metal, or not Linux)."""
    return float(getattr(psutil.cpu_times(), "steal", 0.0))


def steal_mark() -> tuple[float, float]:
    """(wall clock, stolen_seconds) now, for stolen_cores_since."""
    return time.perf_counter(), stolen_seconds()


def stolen_cores_since(mark: tuple[float, float]) -> float:
    """The cores the hypervisor took on average since steal_mark's `mark` (steal seconds per second of wall time)."""
    start, stolen = mark
    return (stolen_seconds() - stolen) / max(time.perf_counter() - start, 1e-9)


SHOWN_CORES = 0.005   # a service busier than this has a row (the launcher and an idle bandit do not)


def cores_by_service(start: dict[str, float], end: dict[str, float], seconds: float) -> dict[str, float]:
    """The cores each service kept busy between two service_cpu_seconds readings `seconds` apart."""
    return {name: (end[name] - start.get(name, 0.0)) / seconds for name in end}


def cpu_table(start: dict[str, float], end: dict[str, float], seconds: float, agent_steps_per_s: float,
              cores: int, stolen: float = 0.0, threads: dict[str, tuple[float, float]] | None = None) -> list[str]:
    """Per service, the cores it kept busy between two service_cpu_seconds readings `seconds` apart and its
    CPU milliseconds per agent step at `agent_steps_per_s`, with `threads` (busiest_threads) the share of the
    window its busiest thread ran and waited for a core; then the total, the cores the hypervisor took
    (`stolen`, in cores over the same window) and the cores left idle."""
    used = cores_by_service(start, end, seconds)
    rows = ["service                   cores busy   CPU ms per agent step"
            + ("   busiest thread: ran, waited for a core" if threads else "")]
    for name, busy in sorted(used.items(), key=lambda item: -item[1]):
        if busy >= SHOWN_CORES:
            row = f"{name:24} {busy:10.2f} {busy / agent_steps_per_s * 1e3:16.3f}"
            if threads and name in threads:
                row += f"   {threads[name][0]:17.2f} {threads[name][1]:6.2f}"
            rows.append(row)
    total = sum(used.values())
    rows.append(f"{'all services':24} {total:10.2f} {total / agent_steps_per_s * 1e3:16.3f}")
    if stolen > 0.0:
        rows.append(f"{'taken by the hypervisor':24} {stolen:10.2f}   of {cores} cores (steal time)")
    rows.append(f"{'idle':24} {max(cores - total - stolen, 0.0):10.2f}   of {cores} cores")
    return rows


# ceiling_gap's parts: what the ceiling charges an agent step, then what a window spends beyond it (records keep
# their keys sorted, so pictures and lines take the order from here)
CHARGED = ("games and inference alone", "learner alone")
BEYOND = ("actors over their stages alone", "learner over its stage alone", "evaluator", "replay", "other services",
          "taken by the hypervisor", "idle cores")


def ceiling_gap(cores_used: dict[str, float], cores: int, agent_steps_per_s: float, acting_ms: float,
                learning_ms: float, stolen: float = 0.0) -> dict[str, float]:
    """Where achieved / ceiling goes, in CPU milliseconds an agent step, for a CPU learner.

    bench.throughput.ceiling_rate charges each agent step `acting_ms` (its games and its inference at their rates
    alone, 1/env + 1/inference) and `learning_ms` (replay_ratio samples at the learner's rate alone), so

        achieved / ceiling = (acting_ms + learning_ms) / (cores / agent_steps_per_s)

    and the denominator is what the window had: the ceiling's charges, the actors' and the learner's CPU over
    their stages alone, the services the ceiling leaves out (the evaluator, replay, the bandit, the launcher), the
    cores the hypervisor took (`stolen`, cores over the window: steal time, which no service is charged) and cores
    nobody used. `cores_used` as cores_by_service gives it; the parts sum to cores / agent_steps_per_s where no
    more than `cores` were busy or taken. Acting is every actor_svc process but the evaluator (with remote
    inference, the inference service too)."""
    ms = ms_by_role(cores_used, agent_steps_per_s)
    acting, learning, evaluator, replay = ms["actors"], ms["learner"], ms["evaluator"], ms["replay"]
    return {"games and inference alone": acting_ms, "learner alone": learning_ms,
            "actors over their stages alone": acting - acting_ms,
            "learner over its stage alone": learning - learning_ms, "evaluator": evaluator, "replay": replay,
            "other services": ms["all services"] - acting - learning - evaluator - replay,
            "taken by the hypervisor": stolen / agent_steps_per_s * 1e3,
            "idle cores": max(cores - sum(cores_used.values()) - stolen, 0.0) / agent_steps_per_s * 1e3}


def ms_by_role(cores_used: dict[str, float], agent_steps_per_s: float) -> dict[str, float]:
    """CPU milliseconds an agent step of the actors (every actor_svc process but the evaluator), the learner (its
    replicas too), the evaluator, replay and all services together, from cores_by_service's cores."""
    ms = {name: busy / agent_steps_per_s * 1e3 for name, busy in cores_used.items()}
    return {"actors": sum(v for name, v in ms.items() if name.startswith("actor_svc") and name != "actor_svc eval"),
            "learner": sum(v for name, v in ms.items() if name.startswith("learner_svc")),
            "evaluator": ms.get("actor_svc eval", 0.0), "replay": ms.get("replay_svc", 0.0),
            "all services": sum(ms.values())}


def ceiling_gap_line(gap: dict[str, float]) -> str:
    """ceiling_gap as one printed line: the ceiling's charges against the window's, part by part."""
    charged = sum(gap[name] for name in CHARGED)
    spent = sum(gap.values())
    extra = ", ".join(f"{name} {gap[name]:+.3f}" for name in BEYOND)
    line = (f"achieved / ceiling = {charged:.3f} / {spent:.3f} ms of CPU an agent step = {charged / spent:.2f}: the "
            f"ceiling charges games and inference {gap['games and inference alone']:.3f} and the learner "
            f"{gap['learner alone']:.3f}; the window also spent: {extra}")
    if gap["taken by the hypervisor"] > 0.0:
        line += f"; on the cores the hypervisor left, {ratio_on_cores_left(gap):.2f}"
    return line


def ratio_on_cores_left(gap: dict[str, float]) -> float:
    """Achieved / ceiling as if the window had had only the cores the hypervisor left it: ceiling_gap's charges
    against what the window spent less the steal time. The ceiling assumes whole cores; on a host that takes a
    share of them back this says how much of the rest the system turned into frames. Records before session 66
    lack the steal part and read as none taken."""
    charged = sum(gap[name] for name in CHARGED)
    return charged / (sum(gap.values()) - gap.get("taken by the hypervisor", 0.0))
