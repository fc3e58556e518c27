"""Soak (`make soak`): the whole system for a while, each service's memory sampled, its growth reported.

Runs the launcher (by default the Catch game, which learns in minutes and so exercises every path) on
its own ports and run folder, samples each service's resident memory every `--every` seconds (by its
name: a restarted service is followed to its new pid), and after a warm-up fits a least-squares line
per service. Prints RSS at the start and end of the fit and the slope in MB/min, and writes the
samples and slopes to <run>/soak.json. Figures are printed, never asserted: a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from lbc.procs import rss_mb, services

REPO = Path(__file__).resolve().parent.parent


def slope_mb_per_min(times_s: list[float], rss: list[float]) -> float:
    """Least-squares slope of RSS (MB) against time, in MB per minute."""
    t = np.asarray(times_s) / 60.0
    return float(np.polyfit(t, np.asarray(rss), 1)[0]) if len(t) >= 2 and np.ptp(t) > 0 else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0, help="how long to run (default 30)")
    parser.add_argument("--warmup", type=float, default=5.0,
                        help="minutes left out of the fit while buffers fill (default 5)")
    parser.add_argument("--every", type=float, default=10.0, help="seconds between samples (default 10)")
    parser.add_argument("--preset", default="catch", help="preset (default catch)")
    parser.add_argument("--game", default=None, help="game (default: the preset's)")
    parser.add_argument("--name", default="soak", help="run name under runs/ (default soak; overwritten)")
    parser.add_argument("--port-base", type=int, default=43000, help="ports from here (default 43000)")
    args = parser.parse_args(argv)
    if args.warmup >= args.minutes:
        parser.error("--warmup must be shorter than --minutes")

    cmd = [sys.executable, "-m", "lbc.launch", "--preset", args.preset, "--name", args.name, "--overwrite",
           "--port-base", str(args.port_base), "--duration", str(int(args.minutes * 60) + 30),
           "--progress-every", "60", *(["--game", args.game] if args.game else [])]
    print(f"soak: {' '.join(cmd[1:])}\n  {args.minutes:g} min, fit after {args.warmup:g} min, a sample every "
          f"{args.every:g} s; {os.cpu_count()} cores, {platform.processor() or platform.machine()}", flush=True)
    launcher = subprocess.Popen(cmd, cwd=REPO)
    samples: dict[str, list[tuple[float, float]]] = {}
    started = time.monotonic()
    try:
        while time.monotonic() - started < args.minutes * 60:
            time.sleep(args.every)
            if launcher.poll() is not None:
                print(f"soak: the launcher stopped early (exit {launcher.returncode})", file=sys.stderr)
                return 1
            now = time.monotonic() - started
            for name, pid in sorted(services(launcher.pid).items()):
                if (mb := rss_mb(pid)) is not None:
                    samples.setdefault(name, []).append((now, mb))
    finally:
        if launcher.poll() is None:
            launcher.send_signal(signal.SIGINT)
            launcher.wait(timeout=120)

    report = {"minutes": args.minutes, "warmup_minutes": args.warmup, "preset": args.preset,
              "cores": os.cpu_count(), "services": {}}
    print(f"\n{'service':<12} {'RSS after warm-up':>18} {'RSS at the end':>15} {'slope MB/min':>13}")
    for name, points in sorted(samples.items()):
        fit = [(t, mb) for t, mb in points if t >= args.warmup * 60]
        if len(fit) < 2:
            continue
        slope = slope_mb_per_min([t for t, _ in fit], [mb for _, mb in fit])
        report["services"][name] = {"slope_mb_per_min": slope, "rss_start_mb": fit[0][1], "rss_end_mb": fit[-1][1],
                                    "samples": points}
        print(f"{name:<12} {fit[0][1]:>15.0f} MB {fit[-1][1]:>12.0f} MB {slope:>13.3f}")
    out = REPO / "runs" / args.name / "soak.json"
    out.write_text(json.dumps(report, indent=1))
    print(f"\nsamples and slopes: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
