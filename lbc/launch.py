"""Local launcher (`make run`): every service as a supervised child process on 127.0.0.1.

Checks the game, the ports and the run folder before starting anything. Prints a progress line every
few seconds from the services' own /metrics, appends it to runs/<name>/metrics.jsonl and to
TensorBoard event files in runs/<name>/tensorboard, restarts a service that dies (the learner from its
last checkpoint), and stops everything on Ctrl-C, SIGTERM, SIGHUP (a closed terminal) or its own
failure; if the launcher itself is killed, the kernel stops the services (lbc.service.exit_with_launcher).
Configuration: --preset (default $LBC_PRESET or cpu), then LBC_* environment variables, then --set.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from lbc.bandit import Discretisation
from lbc.config import PRESETS, Config, endpoints_from_base, load_config, unknown_name
from lbc.family import family_traits
from lbc.preflight import PreflightError, check_game, check_ports, check_run_dir, local_ports
from lbc.run_folder import last_record
from lbc.scores import human_normalised
from lbc.service import LAUNCHER_PID_VAR, stdout_gone
from lbc.tensorboard import TensorBoardLog

# What every service process gets unless the caller's environment sets it (the image sets the same):
# - idle OpenMP threads sleep instead of spinning: the services share the machine's cores;
# - glibc's malloc asks for transparent huge pages for its large blocks (glibc 2.35+, THP in madvise or
#   always mode; elsewhere it does nothing). A learner step allocates tens of MB of fresh tensors, and
#   faulting them in 4 KiB pages cost the 2-core `cpu` learner 15-30% of its step (docs/speed.md);
# - and keeps what it frees for the next step: no block is mmap'd of its own (an `impala` batch's 38 MB of
#   bfloat16 stacks was, and was given back each step), the heap's top is kept (up to 4 GB) and grown 256 MB
#   at a time. On a VM whose host takes back the pages a guest frees, faulting them in again cost an `impala`
#   learner 6-7 ms of system time a step (docs/decisions.md 81).
SERVICE_MALLOC = ("glibc.malloc.hugetlb=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4000000000"
                  ":glibc.malloc.top_pad=268435456")
SERVICE_ENV_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE", "GLIBC_TUNABLES": SERVICE_MALLOC}

MAX_RESTARTS = 5          # within RESTART_WINDOW_S; more means something is wrong, not transient
RESTART_WINDOW_S = 120.0
QUICK_FAILURE_S = 30.0    # a service that fails this soon after starting, twice alike, will not get better


@dataclass
class Child:
    name: str
    argv: list[str]
    log_path: Path
    proc: subprocess.Popen | None = None
    restarts: list[float] = field(default_factory=list)
    started_at: float = 0.0
    last_cause: str | None = None   # how it ended last time, when that was right after a start

    def start(self, resume: bool = False) -> None:
        self.started_at = time.monotonic()
        argv = self.argv + (["--resume"] if resume and self.name == "learner" else [])
        log = self.log_path.open("ab")
        env = {**SERVICE_ENV_DEFAULTS, **os.environ, LAUNCHER_PID_VAR: str(os.getpid())}
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        log.close()


def scrape(port: int, timeout: float = 1.0) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Metric samples of one service: name -> [(labels, value)]; empty when it does not answer, or its answer is
    cut short or unreadable (a service killed while it answers: the launcher carries on and restarts it)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as resp:
            text = resp.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out.setdefault(sample.name, []).append((sample.labels, sample.value))
    except (OSError, http.client.HTTPException, ValueError):
        return {}
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


class RunningTotal:
    """A count summed over processes whose counters start again from zero when they restart (a drop is
    a reset, as Prometheus's increase() reads one), on top of what earlier launches of the run counted.
    A process that does not answer keeps its last value."""

    def __init__(self, start: float = 0.0) -> None:
        self.base = start
        self.last: dict[int, float] = {}

    def update(self, counts: list[float | None]) -> float:
        for key, count in enumerate(counts):
            if count is None:
                continue
            previous = self.last.get(key, 0.0)
            if count < previous:
                self.base += previous
            self.last[key] = count
        return self.base + sum(self.last.values())


class Progress:
    """Turns scraped metrics into the progress line and the metrics log record. Frames and episodes
    go on across service restarts and from `resumed` (the run's last record before a --resume)."""

    def __init__(self, cfg: Config, actors: int, resumed: dict | None = None) -> None:
        self.cfg = cfg
        self.actors = actors
        self.last: tuple[float, float, float] | None = None  # (time, frames, learner steps)
        resumed = resumed or {}
        self.frames = RunningTotal(resumed.get("frames") or 0.0)
        self.episodes = RunningTotal(resumed.get("episodes") or 0.0)
        self.steps = resumed.get("learner_steps") or 0.0
        b = cfg.behaviour
        self.tau_dim = Discretisation(*b.tau_range, b.tau_accuracy)
        self.omega_dim = Discretisation(*b.omega_range, b.omega_accuracy)

    def record(self) -> dict:
        e = self.cfg.endpoints
        actor_metrics = [scrape(e.actor_metrics_base + i) for i in range(self.actors)]
        learner, replay, bandit = scrape(e.learner_metrics), scrape(e.replay_metrics), scrape(e.bandit_metrics)
        evaluator = scrape(e.eval_metrics) if self.cfg.eval.enabled else {}
        evaluated = bool(value(evaluator, "lbc_eval_evaluations_total"))
        frames = self.frames.update([value(m, "lbc_actor_frames_total") for m in actor_metrics])
        episodes = self.episodes.update([value(m, "lbc_actor_episodes_total") for m in actor_metrics])
        mean_return, return_window = pooled(actor_metrics, "lbc_actor_return")
        exploit_return, exploit_window = pooled(actor_metrics, "lbc_actor_exploit_return")
        # the learner's counter starts at its restored step; while it does not answer, keep the last one
        steps = self.steps = value(learner, "lbc_learner_steps_total") or self.steps
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
            "dead_units": {labels["layer"]: v for labels, v in learner.get("lbc_learner_dead_units_ratio", [])},
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
        """One line of at most ~120 columns; the bandit's choices, losses and episodes are in the metrics log."""
        def f(x: float | None, fmt: str) -> str:
            return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)

        frames = f(r["frames"], ",.0f") if (r["frames"] or 0) < 1e6 else f"{r['frames'] / 1e6:.2f}M"
        fill = r.get("replay_fill")
        return (f"frames {frames} {f(r['fps'], ',.0f')}/s | return100 {f(r['mean_return_100'], '.2f')}"
                + (f" (j=0 {f(r['exploit_return_100'], '.2f')})" if r.get("exploit_return_100") is not None else "")
                + f" HNS {f(r['hns'], '.3f')} | eval {f(r.get('eval_score'), '.2f')}"
                + (f" v{f(r['eval_version'], '.0f')}" if r.get("eval_version") is not None else "")
                + f" | learner {f(r['learner_steps'], '.0f')} steps {f(r['learner_sps'], '.2f')}/s"
                f" v{f(r['version'], '.0f')} lag {f(r['lag'], '.1f')}"
                + (f" | replay {fill:.0%}" if fill is not None and fill < 1.0 else ""))


def build_children(args: argparse.Namespace, overrides: list[str], run_dir: Path, cfg: Config) -> list[Child]:
    common = ["--log-level", args.log_level] + (["--preset", args.preset] if args.preset else [])  # else $LBC_PRESET
    for item in [f"run_dir={run_dir}", *overrides]:
        common += ["--set", item]
    logs = run_dir / "logs"
    py = sys.executable
    children = [
        Child("bandit", [py, "-m", "bandit_svc", *common], logs / "bandit.log"),
        Child("replay", [py, "-m", "replay_svc", *common], logs / "replay.log"),
        Child("learner", [py, "-m", "learner_svc", *common], logs / "learner.log"),
    ]
    children += [Child(f"learner-{r}", [py, "-m", "learner_svc", *common, "--rank", str(r)], logs / f"learner-{r}.log")
                 for r in range(1, cfg.learner.replicas)]
    if cfg.actor.inference == "remote":
        children.append(Child("inference", [py, "-m", "actor_svc", *common, "--mode", "infer"], logs / "inference.log"))
    children += [Child(f"actor-{i}", [py, "-m", "actor_svc", *common, "--index", str(i), "--actor-id", f"actor-{i}"],
                       logs / f"actor-{i}.log") for i in range(args.actors)]
    if cfg.eval.enabled:
        children.append(Child("evaluator", [py, "-m", "actor_svc", *common, "--mode", "eval"], logs / "evaluator.log"))
    return children


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def _preset(text: str) -> str:
    if text not in PRESETS:
        raise argparse.ArgumentTypeError(unknown_name("preset", text, sorted(PRESETS)))
    return text


def _port_base(text: str) -> int:
    value = int(text)
    try:
        endpoints_from_base(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m lbc.launch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default=None, type=_preset, metavar="PRESET",
                        help=f"the system to run: {', '.join(sorted(PRESETS))} (default: $LBC_PRESET, else cpu)")
    parser.add_argument("--game", default=None,
                        help="ALE game name, e.g. pong, breakout (default: $LBC_ENV__GAME, else pong; catch for "
                             "--preset catch)")
    parser.add_argument("--actors", type=_positive_int, default=1, help="actor processes (default 1)")
    parser.add_argument("--name", default=None, help="run name: state goes to runs/<name> (default preset-game)")
    parser.add_argument("--runs-dir", type=Path, default=Path("runs"),
                        help="folder holding the runs (default ./runs): metrics, logs, checkpoints per run name")
    parser.add_argument("--resume", action="store_true", help="continue the learner from runs/<name>'s checkpoint")
    parser.add_argument("--overwrite", action="store_true", help="delete an existing runs/<name> and start afresh")
    parser.add_argument("--port-base", type=_port_base, default=None, metavar="P",
                        help="every endpoint on 127.0.0.1 from port P (services P..P+9, actors P+100+i and "
                             "P+200+i), so runs side by side need one flag (default: the configured endpoints)")
    parser.add_argument("--duration", type=_non_negative, default=0.0,
                        help="stop after this many seconds (default 0: until Ctrl-C)")
    parser.add_argument("--until-return", type=float, default=None,
                        help="stop once the mean return of the last 100 episodes reaches this")
    parser.add_argument("--until-eval", type=float, default=None,
                        help="stop once an evaluation (fixed policy, whole games) scores at least this mean")
    parser.add_argument("--until-frames", type=float, default=None,
                        help="stop once the actors played this many emulator frames (a learning curve's budget)")
    parser.add_argument("--until-learner-steps", type=int, default=None,
                        help="stop once the learner made this many steps (and, with a bandit, a return came back)")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="every service's log level, in runs/<name>/logs (default INFO)")
    parser.add_argument("--progress-every", type=_positive, default=5.0,
                        help="seconds between progress lines (default 5)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="configuration override passed to every service (repeatable)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        base = endpoints_from_base(args.port_base) if args.port_base is not None else []
        overrides = [*base, *([f"env.game={args.game}"] if args.game else []), *args.overrides]
        cfg = load_config(args.preset, overrides)
        game = check_game(cfg, args.game)
        name = args.name or f"{cfg.preset}-{game.replace('/', '-')}"
        run_dir = args.runs_dir / name
        cfg = load_config(args.preset, [*overrides, f"run_dir={run_dir}"])
        check_run_dir(run_dir, args.resume, args.overwrite)   # before the ports: it depends on no other program
        check_ports(local_ports(cfg, args.actors))
    except PreflightError as exc:
        print(f"lbc: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:   # pydantic's message names the field
        print(f"invalid configuration:\n{exc}", file=sys.stderr)
        return 2
    if args.overwrite and run_dir.exists():
        shutil.rmtree(run_dir)
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(cfg.model_dump_json(indent=2))
    if cfg.security.enabled:
        from lbc.security import check_certificates, make_certificates

        if not cfg.certs_path.exists():
            make_certificates(cfg.certs_path)
            print(f"lbc: made the run's certificate authority, certificates and CURVE keys in {cfg.certs_path}",
                  flush=True)
        try:
            check_certificates(cfg.certs_path)
        except ValueError as exc:
            print(f"lbc: {exc}", file=sys.stderr)
            return 2
    children = build_children(args, overrides, run_dir, cfg)

    stopping = False

    def _stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _stop)

    try:
        return supervise(args, cfg, name, game, run_dir, children, lambda: stopping)
    except BrokenPipeError:
        stdout_gone()   # the terminal or pipe reading the progress went away: stop quietly, like a closed terminal
        return 1
    finally:
        shutdown(children)
        with contextlib.suppress(OSError):
            print("lbc: stopped", flush=True)


def supervise(args: argparse.Namespace, cfg: Config, name: str, game: str, run_dir: Path, children: list[Child],
              stop_requested: Callable[[], bool]) -> int:
    """Start the services, restart the ones that die, report progress until a stop condition; the caller
    stops the services whatever happens here."""
    print(f"lbc: run '{name}' ({cfg.preset}, {game}, {args.actors} actor(s)); logs in {run_dir}/logs, "
          f"metrics log {run_dir}/metrics.jsonl", flush=True)
    for child in children:
        child.start(resume=args.resume)
        print(f"lbc: started {child.name} (pid {child.proc.pid})", flush=True)

    resumed = last_record(run_dir / "metrics.jsonl") if args.resume else None
    if resumed:
        print(f"lbc: resuming at {resumed['frames']:,.0f} frames, learner step {resumed['learner_steps']:,.0f} "
              f"(the learner continues from its newest checkpoint that loads)", flush=True)
    progress = Progress(cfg, args.actors, resumed)
    started = time.monotonic()
    next_report = started + args.progress_every
    exit_code = 0
    # closed however supervision ends (a broken pipe included), so the event files keep every record
    with contextlib.closing(TensorBoardLog(run_dir / "tensorboard")) as tensorboard, \
            (run_dir / "metrics.jsonl").open("a") as metrics_log:
        while not stop_requested():
            time.sleep(0.2)
            for child in children:
                code = child.proc.poll()
                if code is None:
                    continue
                now = time.monotonic()
                child.restarts = [t for t in child.restarts if now - t < RESTART_WINDOW_S] + [now]
                cause = last_error(child.log_path)
                quick_cause = _untimed(cause) if now - child.started_at < QUICK_FAILURE_S else None
                same_again = quick_cause is not None and child.last_cause == quick_cause
                if len(child.restarts) > MAX_RESTARTS or same_again:
                    why = "failed the same way twice on starting" if same_again else "keeps dying"
                    print(f"lbc: {child.name} {why} (exit {code}): {cause}\n  see {child.log_path}. Stopping.",
                          file=sys.stderr, flush=True)
                    exit_code = 1
                    break
                child.last_cause = quick_cause
                print(f"lbc: {child.name} exited with {code}: {cause}\n  restarting (see {child.log_path})",
                      flush=True)
                child.start(resume=True)
            if exit_code:
                break
            if time.monotonic() >= next_report:
                next_report += args.progress_every
                record = progress.record()
                metrics_log.write(json.dumps(record) + "\n")
                metrics_log.flush()
                tensorboard.write(record)
                print(f"[{time.monotonic() - started:6.0f}s] {Progress.line(record)}", flush=True)
                key, window = family_traits(cfg).score
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
    return exit_code


def _untimed(line: str) -> str:
    """A log line without its leading clock time, to compare one failure with the next."""
    return re.sub(r"^\d\d:\d\d:\d\d ", "", line)


def last_error(log_path: Path, tail_bytes: int = 8192) -> str:
    """The last non-empty line of a service's log: for a crash, the exception that ended it."""
    try:
        with log_path.open("rb") as log:
            log.seek(max(0, log_path.stat().st_size - tail_bytes))
            lines = [line.strip() for line in log.read().decode(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "(no log)"
    return lines[-1] if lines else "(empty log)"


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
