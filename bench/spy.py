"""Where the running services spend their time and where they wait: py-spy samples of every process.

The stages measured alone (bench.throughput) give a ceiling; this shows what the whole system does
instead. Two py-spy samplers watch the launcher and all its children at once for the same window:
one counts only samples in which a thread is running (busy), the other every sample (--idle). Per
service thread the table gives the busy and the waiting share of the window and the functions that
take most of each, so "the actor waits on the learner" reads as the actor's main thread waiting in
the sender while the learner's threads are busy in backward.

    python -m bench.spy --pid PID --seconds 20    # any running lbc.launch (or one service)

`make bench` runs it on its end-to-end window (bench.throughput --profile).
Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

_PROCESS = re.compile(r'^process \d+:"(?P<cmd>.*)"$')
_THREAD = re.compile(r"^thread \(\d+\)(?:: (?P<name>.*))?$")
_SERVICE = re.compile(r"-m (?P<module>[\w.]+)")
_MODE = re.compile(r"--(?:mode (?P<mode>\w+)|index (?P<index>\d+))")
_FRAME = re.compile(r"^(?P<fn>.*) \((?P<file>[^:()]*)(?::\d+)?\)$")


@dataclass
class ThreadSamples:
    """One thread's samples: how many, and by the innermost Python function they were taken in."""
    total: int = 0
    by_function: Counter = field(default_factory=Counter)


def service_name(command: str) -> str:
    """A short name for a process from its command line: the module it runs (`-m actor_svc`), with the
    actor's index or the evaluator's mode, else the program."""
    module = _SERVICE.search(command)
    if module is None:
        return Path(command.split()[0]).name if command else "?"
    name = module["module"]
    for match in _MODE.finditer(command):
        name += f" {match['mode']}" if match["mode"] else f" {match['index']}"
    return name


def parse_raw(text: str) -> dict[tuple[str, str], ThreadSamples]:
    """py-spy's raw (collapsed-stack) output, recorded with --threads (and --subprocesses), to samples per
    (service, thread): each line is `frame;frame;...;innermost count`, whose leading frames name the
    process and the thread."""
    threads: dict[tuple[str, str], ThreadSamples] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():   # a command line with newlines in it (python -c) breaks its stacks' lines
            continue
        service, thread, functions = "?", "?", []
        for frame in stack.split(";"):
            if (p := _PROCESS.match(frame)) is not None:
                service = service_name(p["cmd"])   # the innermost process frame is the sampled one
            elif (t := _THREAD.match(frame)) is not None:
                thread = t["name"] or "?"
            else:
                functions.append(frame)
        samples = threads.setdefault((service, thread), ThreadSamples())
        samples.total += int(count)
        samples.by_function[_short(functions[-1]) if functions else "(no Python frame)"] += int(count)
    return threads


def _short(frame: str) -> str:
    """`Conv2d._conv_forward (torch/nn/modules/conv.py:560)` -> `Conv2d._conv_forward (conv.py)`."""
    m = _FRAME.match(frame)
    return f"{m['fn']} ({Path(m['file']).name})" if m else frame


def _top(counter: Counter, window: int, k: int) -> str:
    return ", ".join(f"{fn} {100 * n / window:.0f}%" for fn, n in counter.most_common(k) if n >= 0.005 * window)


def thread_table(busy: dict[tuple[str, str], ThreadSamples], every: dict[tuple[str, str], ThreadSamples],
                 window: int, min_share: float = 0.02, k: int = 3) -> list[str]:
    """Per thread, busiest first: the busy share of the window (samples running / samples possible), the
    waiting share (samples present but not running), and the functions that take most of each. Threads
    busy for less than `min_share` of the window are left out."""
    rows = [f"{'service':16} {'thread':26} {'busy':>5} {'waits':>5}  where busy / where waiting"]
    for key in sorted(busy, key=lambda key: -busy[key].total):
        running = busy[key]
        if running.total < min_share * window:
            continue
        present = every.get(key, ThreadSamples())
        waiting = present.by_function - running.by_function   # Counter difference drops what is not > 0
        service, thread = key
        rows.append(f"{service:16} {thread[:26]:26} {100 * running.total / window:4.0f}% "
                    f"{100 * max(0, present.total - running.total) / window:4.0f}%  "
                    f"{_top(running.by_function, window, k)} / {_top(waiting, window, 2) or '-'}")
    return rows


def record(pid: int, seconds: float, rate: int = 50) -> tuple[str, str]:
    """Two py-spy samplers on `pid` and its children for `seconds` at `rate` Hz, side by side: (running
    samples only, every sample). Non-blocking: the services are never paused."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    with tempfile.TemporaryDirectory() as tmp:
        outs = [Path(tmp, "busy.txt"), Path(tmp, "all.txt")]
        procs = [subprocess.Popen([spy, "record", "--pid", str(pid), "--subprocesses", "--threads", "--nonblocking",
                                   "--format", "raw", "--rate", str(rate), "--duration", str(int(seconds)),
                                   "--output", str(out), *extra],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for out, extra in zip(outs, ([], ["--idle"]), strict=True)]
        for proc in procs:
            _, err = proc.communicate(timeout=seconds + 60)
            if proc.returncode != 0:
                raise RuntimeError(f"py-spy failed ({proc.returncode}): {err.strip()[-500:]} (it needs ptrace "
                                   "rights on the process: root, or CAP_SYS_PTRACE in a container)")
        return outs[0].read_text(), outs[1].read_text()


def profile_lines(pid: int, seconds: float, rate: int = 50) -> list[str]:
    """The table for a running process tree, with a header that says what was sampled."""
    busy, every = record(pid, seconds, rate)
    window = int(seconds * rate)
    return [f"where the services spend and wait (py-spy, {seconds:.0f} s at {rate} Hz; share of the window per "
            "thread; a thread waits while it sleeps on I/O, a lock or a queue):",
            *thread_table(parse_raw(busy), parse_raw(every), window)]


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.spy", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pid", type=int, required=True, help="a running lbc.launch, or any one service")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=int, default=50, help="samples per second per thread")
    args = parser.parse_args()
    for line in profile_lines(args.pid, args.seconds, args.rate):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
