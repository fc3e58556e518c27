"""Local launcher (`make run`): every service as a supervised child process on 127.0.0.1.

Prints a progress line every few seconds from the services' own /metrics, appends it to
runs/<name>/metrics.jsonl and to TensorBoard event files in runs/<name>/tensorboard, restarts a
service that dies (the learner from its last checkpoint),
and stops everything on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from lbc.bandit import Discretisation
from lbc.config import PRESETS, Config, load_config
from lbc.scores import human_normalised
from lbc.tensorboard import TensorBoardLog

MAX_RESTARTS = 5          # within RESTART_WINDOW_S; more means something is wrong, not transient
RESTART_WINDOW_S = 120.0


@dataclass
class Child:
    name: str
    argv: list[str]
    log_path: Path
    proc: subprocess.Popen | None = None
    restarts: list[float] = field(default_factory=list)

    def start(self, resume: bool = False) -> None:
        argv = self.argv + (["--resume"] if resume and self.name == "learner" else [])
        log = self.log_path.open("ab")
        # Idle OpenMP threads sleep instead of spinning: the services share the machine's cores.
        env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        log.close()


def scrape(port: int, timeout: float = 1.0) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Metric samples of one service: name -> [(labels, value)]; empty when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def pooled(actor_metrics: list[dict], prefix: str) -> tuple[float | None, float]:
    """The actors' <prefix>_mean100 gauges pooled by their <prefix>_window sizes: (mean, episodes)."""
    window = [(value(m, f"{prefix}_mean100"), value(m, f"{prefix}_window")) for m in actor_metrics]
    weighted = [(r * n, n) for r, n in window if r is not None and n]
    episodes = sum(n for _, n in weighted)
    return (sum(a for a, _ in weighted) / episodes if weighted else None), episodes


def value(samples: dict, name: str, **labels: str) -> float | None:
    for got, v in samples.get(name, []):
        if all(got.get(k) == want for k, want in labels.items()):
            return v
    return None


class Progress:
    """Turns scraped metrics into the progress line and the metrics log record."""

    def __init__(self, cfg: Config, actors: int) -> None:
        self.cfg = cfg
        self.actors = actors
        self.last: tuple[float, float, float] | None = None  # (time, frames, learner steps)
        b = cfg.behaviour
        self.tau_dim = Discretisation(*b.tau_range, b.tau_accuracy)
        self.omega_dim = Discretisation(*b.omega_range, b.omega_accuracy)

    def record(self) -> dict:
        e = self.cfg.endpoints
        actor_metrics = [scrape(e.actor_metrics_base + i) for i in range(self.actors)]
        learner, replay, bandit = scrape(e.learner_metrics), scrape(e.replay_metrics), scrape(e.bandit_metrics)
        evaluator = scrape(e.eval_metrics) if self.cfg.eval.enabled else {}
        evaluated = bool(value(evaluator, "lbc_eval_evaluations_total"))
        frames = sum(value(m, "lbc_actor_frames_total") or 0.0 for m in actor_metrics)
        episodes = sum(value(m, "lbc_actor_episodes_total") or 0.0 for m in actor_metrics)
        mean_return, return_window = pooled(actor_metrics, "lbc_actor_return")
        exploit_return, exploit_window = pooled(actor_metrics, "lbc_actor_exploit_return")
        steps = value(learner, "lbc_learner_steps_total") or 0.0
        now = time.monotonic()
        fps = sps = None
        if self.last is not None:
            dt = now - self.last[0]
            fps, sps = (frames - self.last[1]) / dt, (steps - self.last[2]) / dt
        self.last = (now, frames, steps)
        size = value(replay, "lbc_replay_sequences")
        cap = value(replay, "lbc_replay_capacity_sequences")
        return {
            "time": time.time(), "frames": frames, "fps": fps, "episodes": episodes,
            "mean_return_100": mean_return,
            "return_window": return_window,
            "exploit_return_100": exploit_return,   # NGU: episodes of the member j = 0
            "exploit_window": exploit_window,
            "hns": (human_normalised(self.cfg.env.game, mean_return)
                    if mean_return is not None and self.cfg.env.kind == "atari" else None),
            "learner_steps": steps, "learner_sps": sps,
            "version": value(learner, "lbc_learner_param_version"),
            "lag": value(learner, "lbc_learner_policy_lag", stat="mean"),
            "replay_fill": size / cap if size is not None and cap else None,
            "bandit_episodes": value(bandit, "lbc_bandit_episodes_total"),
            "bandit_top": self._top_arms(bandit),
            # the evaluator's last score (fixed evaluation policy, whole games) and the version it played
            "eval_score": value(evaluator, "lbc_eval_score", stat="mean") if evaluated else None,
            "eval_version": value(evaluator, "lbc_eval_param_version") if evaluated else None,
            "losses": {f"{labels['policy']}/{labels['term']}": v for labels, v in learner.get("lbc_learner_loss", [])},
            "grad_norm": value(learner, "lbc_learner_grad_norm"),
        }

    def _top_arms(self, bandit: dict) -> dict[str, str]:
        counts: dict[str, dict[int, float]] = {}
        for labels, v in bandit.get("lbc_bandit_selections_total", []):
            counts.setdefault(labels["dimension"], {})[int(labels["arm"])] = v
        top = {}
        for dim, arms in sorted(counts.items()):
            if dim == "mixture":   # Agent57: the most chosen j
                top[dim] = f"=j{max(arms, key=arms.get)}"
                continue
            lo, hi = self._region(dim, max(arms, key=arms.get))
            top[dim] = f"[{lo:.1f},{hi:.1f})" if dim.startswith("tau") else f"[{lo:.2f},{hi:.2f})"
        return top

    def _region(self, dim: str, arm: int) -> tuple[float, float]:
        """The psi values an arm covers. BVA tiles are in x = log(1 + tau) (tau dimensions) or in eps."""
        bc = self.cfg.bandit
        if bc.algorithm != "bva":
            return (self.tau_dim if dim.startswith("tau") else self.omega_dim).region(arm)
        if dim == "epsilon":
            return arm * bc.bva_epsilon_accuracy, (arm + 1) * bc.bva_epsilon_accuracy
        x0 = math.log1p(self.cfg.behaviour.tau_range[0])
        return math.expm1(x0 + arm * bc.bva_accuracy), math.expm1(x0 + (arm + 1) * bc.bva_accuracy)

    @staticmethod
    def line(r: dict) -> str:
        def f(x: float | None, fmt: str) -> str:
            return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)

        top = " ".join(f"{k}{v}" for k, v in r["bandit_top"].items() if not k.startswith("omega")) or "-"
        return (f"frames {f(r['frames'], ',.0f')} | {f(r['fps'], ',.0f')} f/s | episodes {f(r['episodes'], '.0f')} | "
                f"return100 {f(r['mean_return_100'], '.2f')}"
                + (f" (j=0: {f(r['exploit_return_100'], '.2f')})" if r.get("exploit_return_100") is not None else "")
                + f" | HNS {f(r['hns'], '.3f')} | eval {f(r.get('eval_score'), '.2f')}"
                + (f" (v{f(r['eval_version'], '.0f')})" if r.get("eval_version") is not None else "") + " | "
                f"learner {f(r['learner_steps'], '.0f')} steps {f(r['learner_sps'], '.2f')}/s | "
                f"version {f(r['version'], '.0f')} lag {f(r['lag'], '.1f')} | replay {f(r['replay_fill'], '.0%')} | "
                f"bandit {top}")


def build_children(args: argparse.Namespace, run_dir: Path, cfg: Config) -> list[Child]:
    common = ["--preset", args.preset, "--set", f"run_dir={run_dir}", "--set", f"env.game={args.game}"]
    for item in args.overrides:
        common += ["--set", item]
    logs = run_dir / "logs"
    py = sys.executable
    children = [
        Child("bandit", [py, "-m", "bandit_svc", *common], logs / "bandit.log"),
        Child("replay", [py, "-m", "replay_svc", *common], logs / "replay.log"),
        Child("learner", [py, "-m", "learner_svc", *common], logs / "learner.log"),
    ]
    children += [Child(f"actor-{i}", [py, "-m", "actor_svc", *common, "--index", str(i), "--actor-id", f"actor-{i}"],
                       logs / f"actor-{i}.log") for i in range(args.actors)]
    if cfg.eval.enabled:
        children.append(Child("evaluator", [py, "-m", "actor_svc", *common, "--mode", "eval"], logs / "evaluator.log"))
    return children


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lbc.launch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="cpu", choices=sorted(PRESETS))
    parser.add_argument("--game", default="pong", help="ALE game name (e.g. pong, breakout)")
    parser.add_argument("--actors", type=int, default=1, help="actor processes")
    parser.add_argument("--name", default=None, help="run name: state goes to runs/<name> (default preset-game)")
    parser.add_argument("--runs-dir", type=Path, default=Path("runs"),
                        help="folder holding the runs (default ./runs): metrics, logs, checkpoints per run name")
    parser.add_argument("--resume", action="store_true", help="continue the learner from runs/<name>'s checkpoint")
    parser.add_argument("--duration", type=float, default=0.0, help="stop after this many seconds (0: until Ctrl-C)")
    parser.add_argument("--until-return", type=float, default=None,
                        help="stop once the mean return of the last 100 episodes reaches this")
    parser.add_argument("--until-eval", type=float, default=None,
                        help="stop once an evaluation (fixed policy, whole games) scores at least this mean")
    parser.add_argument("--until-frames", type=float, default=None,
                        help="stop once the actors played this many emulator frames (a learning curve's budget)")
    parser.add_argument("--until-learner-steps", type=int, default=None,
                        help="stop once the learner made this many steps (and, with a bandit, a return came back)")
    parser.add_argument("--progress-every", type=float, default=5.0, help="seconds between progress lines")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="configuration override passed to every service (repeatable)")
    args = parser.parse_args(argv)

    name = args.name or f"{args.preset}-{args.game}"
    run_dir = args.runs_dir / name
    try:
        cfg = load_config(args.preset, [f"env.game={args.game}", f"run_dir={run_dir}", *args.overrides])
    except Exception as exc:
        print(f"invalid configuration:\n{exc}", file=sys.stderr)
        return 2
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(cfg.model_dump_json(indent=2))
    children = build_children(args, run_dir, cfg)

    stopping = False

    def _stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)

    print(f"lbc: run '{name}' ({args.preset}, {args.game}, {args.actors} actor(s)); logs in {run_dir}/logs, "
          f"metrics log {run_dir}/metrics.jsonl", flush=True)
    for child in children:
        child.start(resume=args.resume)
        print(f"lbc: started {child.name} (pid {child.proc.pid})", flush=True)

    progress = Progress(cfg, args.actors)
    tensorboard = TensorBoardLog(run_dir / "tensorboard")
    started = time.monotonic()
    next_report = started + args.progress_every
    exit_code = 0
    with (run_dir / "metrics.jsonl").open("a") as metrics_log:
        while not stopping:
            time.sleep(0.2)
            for child in children:
                code = child.proc.poll()
                if code is None:
                    continue
                now = time.monotonic()
                child.restarts = [t for t in child.restarts if now - t < RESTART_WINDOW_S] + [now]
                if len(child.restarts) > MAX_RESTARTS:
                    print(f"lbc: {child.name} keeps dying (exit {code}); see {child.log_path}. Stopping.",
                          file=sys.stderr, flush=True)
                    stopping, exit_code = True, 1
                    break
                print(f"lbc: {child.name} exited with {code}; restarting (see {child.log_path})", flush=True)
                child.start(resume=True)
            if time.monotonic() >= next_report:
                next_report += args.progress_every
                record = progress.record()
                metrics_log.write(json.dumps(record) + "\n")
                metrics_log.flush()
                tensorboard.write(record)
                print(f"[{time.monotonic() - started:6.0f}s] {Progress.line(record)}", flush=True)
                # NGU's own measure is its exploitative member's return (its others explore on purpose)
                key, window = (("exploit_return_100", "exploit_window") if cfg.ngu.enabled
                               else ("mean_return_100", "return_window"))
                if args.until_return is not None and record[window] >= 100 and record[key] >= args.until_return:
                    print(f"lbc: mean return reached {args.until_return}", flush=True)
                    break
                if args.until_eval is not None and (record["eval_score"] or -math.inf) >= args.until_eval:
                    print(f"lbc: evaluation score reached {args.until_eval} (version {record['eval_version']:.0f})",
                          flush=True)
                    break
                if args.until_frames is not None and record["frames"] >= args.until_frames:
                    print(f"lbc: reached {args.until_frames:,.0f} frames", flush=True)
                    break
                if (args.until_learner_steps is not None and (record["learner_steps"] or 0) >= args.until_learner_steps
                        and (not cfg.behaviour.controlled or (record["bandit_episodes"] or 0) >= 1)):
                    print(f"lbc: learner reached {args.until_learner_steps} steps", flush=True)
                    break
            if args.duration and time.monotonic() - started >= args.duration:
                break

    print("lbc: stopping services", flush=True)
    tensorboard.close()
    shutdown(children)
    print("lbc: stopped", flush=True)
    return exit_code


def shutdown(children: list[Child], grace_s: float = 20.0) -> None:
    """SIGTERM every child (actors first, so the learner's final checkpoint is the last word), then
    SIGKILL whatever is left after the grace period."""
    for child in reversed(children):
        if child.proc and child.proc.poll() is None:
            child.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for child in children:
        if child.proc is None:
            continue
        try:
            child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(child.proc.pid, signal.SIGKILL)
            child.proc.wait()


if __name__ == "__main__":
    raise SystemExit(main())
