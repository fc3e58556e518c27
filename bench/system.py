"""The whole system under the launcher, read from its own services: frames/s, learner steps/s, each service's
CPU, which side of replay's rate limiter waits, the learner's step by part, and on a GPU machine nvidia-smi's
utilisation (bench.throughput prints them against the stages alone)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.cpu_use import busiest_threads, service_cpu_seconds, service_thread_seconds, stolen_seconds
from bench.spy import profile_lines
from lbc.config import Endpoints, load_config
from lbc.launch import scrape, value
from learner_svc.step_time import PARTS, STEP_SECONDS_NAME


class GpuSampler:
    """nvidia-smi's utilisation and memory, sampled every second in the background (GPU machines only)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits", "-l", "1"],
            stdout=subprocess.PIPE, text=True)

    def stop(self) -> tuple[float, float]:
        """(mean utilisation %, peak memory used MiB) over the samples."""
        self.proc.terminate()
        rows = [line.split(",") for line in self.proc.communicate()[0].splitlines() if "," in line]
        util = [float(r[0]) for r in rows]
        return (float(np.mean(util)) if util else float("nan"), max((float(r[1]) for r in rows), default=float("nan")))


def end_to_end(preset: str, game: str, actors: int, seconds: float, warmup: float, overrides: list[str],
               profile: bool = False, cwd: Path | None = None) -> dict:
    """The whole system under the launcher: frames/s and learner steps/s over `seconds` after `warmup` seconds of
    the system up (every service answering at its metrics port), each service's CPU seconds at the window's start
    and end ("cpu", over "seconds", for bench.cpu_use.cpu_table), the cores the hypervisor took meanwhile
    ("stolen_cores", steal time), each service's busiest thread's shares of the window running and waiting for a
    core ("threads", bench.cpu_use.busiest_threads), all read from the services themselves at the same two
    moments; with `profile`, py-spy's table of where each service thread spends and waits (bench.spy) under
    "profile", sampled after that window so that the sampler's own CPU (a tenth to a fifth of a core) does not
    count against the figures. With
    `cwd` the system runs from that checkout of lbc (its services import its code; bench.ab's LABEL@DIR arms), its
    run folder there."""
    name = f"bench-{preset}-{game}"
    run_dir = Path(cwd or ".") / "runs" / name
    shutil.rmtree(run_dir, ignore_errors=True)
    span = min(20.0, seconds / 2) if profile else 0.0
    # stopped once the window (and the profile) is read; the duration only bounds a run whose reader went away
    duration = STARTUP_S + warmup + seconds + 5.0 + (span + 5.0 if profile else 0.0)
    argv = [sys.executable, "-m", "lbc.launch", "--preset", preset, "--game", game, "--actors", str(actors),
            "--name", name, "--duration", str(duration), "--progress-every", "5"]
    for o in overrides:
        argv += ["--set", o]
    launcher = subprocess.Popen(argv, stdout=subprocess.DEVNULL, cwd=cwd)
    try:
        return _window(launcher, argv, run_dir, preset, game, actors, seconds, warmup, overrides, span)
    except BaseException:   # an error or Ctrl-C: no system left running to skew whatever runs next
        stop_launcher(launcher)
        raise


def stop_launcher(launcher: subprocess.Popen, grace: float = 30.0) -> None:
    """Stop a launcher as Ctrl-C does (it stops its services in turn), killing it after `grace` seconds."""
    if launcher.poll() is not None:
        return
    launcher.send_signal(signal.SIGINT)
    try:
        launcher.wait(grace)
    except subprocess.TimeoutExpired:
        launcher.kill()
        launcher.wait()


def _window(launcher: subprocess.Popen, argv: list[str], run_dir: Path, preset: str, game: str, actors: int,
            seconds: float, warmup: float, overrides: list[str], span: float) -> dict:
    """end_to_end's readings of the running launcher."""
    profile = span > 0
    cfg = load_config(preset, [f"env.game={game}", *overrides])
    endpoints = cfg.endpoints
    table: list[str] = []
    remote = cfg.actor.inference == "remote"
    _wait_until_up(launcher, run_dir, endpoints, actors, remote)
    time.sleep(warmup)
    if launcher.poll() is not None:
        raise RuntimeError(f"the launcher exited with {launcher.returncode} before the end-to-end window: see what "
                           f"it printed above and {run_dir}/logs")
    start = _system_reading(launcher.pid, endpoints, actors, remote)
    time.sleep(max(start.time + seconds - time.perf_counter(), 0.0))
    end = _system_reading(launcher.pid, endpoints, actors, remote)
    if profile:
        try:
            table = profile_lines(launcher.pid, span)
        except RuntimeError as e:   # no ptrace rights: the figures still count
            table = [f"profile: {e}"]
    stop_launcher(launcher)
    if launcher.returncode != 0:
        raise subprocess.CalledProcessError(launcher.returncode, argv)
    frames_per_s, steps_per_s = window_rates(start, end)
    return {"frames_per_s": frames_per_s, "learner_steps_per_s": steps_per_s, "seconds": end.time - start.time,
            "lag": end.lag, "profile": table, "cpu": (start.cpu, end.cpu),
            "stolen_cores": (end.stolen - start.stolen) / (end.time - start.time),
            "threads": busiest_threads(start.threads, end.threads, end.time - start.time),
            "target_repeats": _share(start.target_cache, end.target_cache),
            "waits": replay_waits(start.replay_waits, end.replay_waits, end.time - start.time),
            "learner_step_ms": learner_step_split(start, end),
            "actor_loop_ms": actor_loop_split(start, end, actors, cfg.env.num_envs * cfg.env.frames_per_step),
            "inference_passes": inference_passes(start, end)}


@dataclass(frozen=True)
class SystemReading:
    """What the running services count at one moment (end_to_end reads two)."""
    time: float                          # time.perf_counter() midway through the reading
    frames: float                        # emulator frames the actors played (lbc_actor_frames_total, summed)
    learner_steps: float
    lag: float | None                    # the learner's mean policy lag
    cpu: dict[str, float]                # CPU seconds by service (bench.cpu_use)
    target_cache: tuple[float, ...]      # TARGET_CACHE
    replay_waits: tuple[float, ...]      # REPLAY_WAITS
    learner_seconds: dict[str, float]    # the training thread's seconds by part (learner_svc.step_time)
    actor_seconds: tuple[float, ...]     # ACTOR_SECONDS, summed over the actors
    inference: tuple[float, ...] = ()    # INFERENCE_COUNTS of the inference service (actor.inference=remote)
    stolen: float = 0.0                  # CPU seconds the hypervisor took from the machine (bench.cpu_use)
    threads: dict[str, dict[int, tuple[float, float]]] = field(default_factory=dict)   # service_thread_seconds


class NotUp(RuntimeError):
    """A service of the system under test did not answer at its metrics port."""


# how long the services may take to answer at their metrics ports before the warm-up starts: on a slow 2-core
# host two 64-game actors, the evaluator and the inference service took more than 30 s (session 66)
STARTUP_S = 180.0


def _wait_until_up(launcher: subprocess.Popen, run_dir: Path, endpoints: Endpoints, actors: int, remote: bool,
                   limit: float = STARTUP_S) -> None:
    """Return once every service the window reads answers at its metrics port, so that the warm-up is the running
    system's whatever its start took; raise where the launcher exits first or `limit` seconds pass."""
    deadline = time.monotonic() + limit
    while True:
        if launcher.poll() is not None:
            raise RuntimeError(f"the launcher exited with {launcher.returncode} while its services started: see "
                               f"what it printed above and {run_dir}/logs")
        try:
            _system_reading(launcher.pid, endpoints, actors, remote)
            return
        except NotUp as e:
            if time.monotonic() > deadline:
                raise NotUp(f"{e} after {limit:.0f} s: see {run_dir}/logs") from None
        time.sleep(1.0)


def _system_reading(launcher_pid: int, endpoints: Endpoints, actors: int, remote: bool = False) -> SystemReading:
    before = time.perf_counter()
    cpu, stolen, threads = service_cpu_seconds(launcher_pid), stolen_seconds(), service_thread_seconds(launcher_pid)
    actor_metrics = [scrape(endpoints.actor_metrics_base + i, timeout=5.0) for i in range(actors)]
    actor_frames = [value(m, "lbc_actor_frames_total") for m in actor_metrics]
    learner = scrape(endpoints.learner_metrics, timeout=5.0)
    replay = scrape(endpoints.replay_metrics, timeout=5.0)
    missing = [f"actor {i}" for i, f in enumerate(actor_frames) if f is None]
    if value(learner, "lbc_learner_steps_total") is None:
        missing.append("learner")
    inference = scrape(endpoints.inference_metrics, timeout=5.0) if remote else {}
    if remote and value(inference, "lbc_inference_passes_total") is None:
        missing.append("the inference service")
    if missing:
        raise NotUp(f"{', '.join(missing)} did not answer at its metrics port: the end-to-end window cannot be "
                    "counted")
    return SystemReading(time=(before + time.perf_counter()) / 2, frames=sum(actor_frames),
                         learner_steps=value(learner, "lbc_learner_steps_total"),
                         lag=value(learner, "lbc_learner_policy_lag", stat="mean"), cpu=cpu, stolen=stolen,
                         threads=threads,
                         target_cache=tuple(value(learner, n) or 0.0 for n in TARGET_CACHE),
                         replay_waits=tuple(value(replay, n) or 0.0 for n in REPLAY_WAITS),
                         learner_seconds={labels["part"]: v for labels, v in learner.get(STEP_SECONDS_NAME, [])},
                         actor_seconds=tuple(sum(value(m, n) or 0.0 for m in actor_metrics) for n in ACTOR_SECONDS),
                         inference=tuple(value(inference, n) or 0.0 for n in INFERENCE_COUNTS) if remote else ())


def actor_loop_split(start: SystemReading, end: SystemReading, actors: int, frames_per_loop: int
                     ) -> dict[str, float]:
    """Milliseconds an actor's loop (its games stepped once, `frames_per_loop` frames) spent on average between
    two readings: stepping the games, inference (on a GPU with its wait for the device), waiting for replay to
    take a sequence (its rate limiter), and the rest of the loop, which with them adds up to the window's wall
    time; empty without a loop."""
    loops = (end.frames - start.frames) / frames_per_loop
    if loops <= 0:
        return {}
    seconds = [b - a for a, b in zip(start.actor_seconds, end.actor_seconds, strict=True)]
    parts = {name: 1e3 * s / loops for name, s in zip(ACTOR_PARTS, seconds, strict=True)}
    wall = 1e3 * (end.time - start.time) * actors / loops
    return {**parts, "the rest": wall - sum(parts.values())}


def inference_passes(start: SystemReading, end: SystemReading) -> dict[str, float]:
    """The inference service's passes between two readings: passes a second, requests and games a pass, and
    milliseconds of forward pass a pass; empty without the service or a pass."""
    if not end.inference:
        return {}
    passes, requests, games, seconds = (b - a for a, b in zip(start.inference, end.inference, strict=True))
    if passes <= 0:
        return {}
    return {"passes/s": passes / (end.time - start.time), "requests a pass": requests / passes,
            "games a pass": games / passes, "forward ms a pass": 1e3 * seconds / passes}


def learner_step_split(start: SystemReading, end: SystemReading) -> dict[str, float]:
    """Milliseconds per learner step that the training thread spent in each part of its loop between two
    readings (learner_svc.step_time.PARTS); empty without a step."""
    steps = end.learner_steps - start.learner_steps
    if steps <= 0:
        return {}
    return {part: 1e3 * (end.learner_seconds[part] - start.learner_seconds.get(part, 0.0)) / steps
            for part in PARTS if part in end.learner_seconds}


def window_rates(start: SystemReading, end: SystemReading) -> tuple[float, float]:
    """(frames/s, learner steps/s) between two readings. A count that went down means a service restarted in
    the window (its counters start again from zero), and the window does not measure the system."""
    if end.frames < start.frames or end.learner_steps < start.learner_steps:
        raise RuntimeError("a service restarted within the end-to-end window (a count went down); see its log "
                           "under runs/")
    seconds = end.time - start.time
    return (end.frames - start.frames) / seconds, (end.learner_steps - start.learner_steps) / seconds


# an actor's loop: its games, its inference, its waits for replay to take a sequence
ACTOR_SECONDS = ("lbc_actor_env_seconds_total", "lbc_actor_inference_seconds_total",
                 "lbc_actor_send_blocked_seconds_total")
ACTOR_PARTS = ("games", "inference", "waiting for replay")
# the inference service's passes, requests answered, games stepped and seconds in its forward pass
INFERENCE_COUNTS = ("lbc_inference_passes_total", "lbc_inference_requests_total", "lbc_inference_games_total",
                    "lbc_inference_forward_seconds_total")
# (hits, lookups) of the learner's kept target outputs (lbc.target_cache), 0 where not kept
TARGET_CACHE = ("lbc_learner_target_cache_hits_total", "lbc_learner_target_cache_lookups_total")
# seconds replay's rate limiter held the actors back, and a learner's request waited for data
REPLAY_WAITS = ("lbc_replay_insert_blocked_seconds_total", "lbc_replay_sample_blocked_seconds_total")


def replay_waits(start: tuple[float, float], end: tuple[float, float], seconds: float) -> tuple[float, float]:
    """(actors held back, learner waiting for data) as shares of a window of `seconds`, from two readings of
    REPLAY_WAITS: which side of the rate limiter waits on the other. The actors held back most of the time
    means the learner bounds the system; the learner waiting, the actors."""
    return ((end[0] - start[0]) / seconds, (end[1] - start[1]) / seconds)


def _share(start: tuple[float, ...], end: tuple[float, ...]) -> float | None:
    """hits / lookups between two readings of TARGET_CACHE; None without lookups."""
    lookups = end[1] - start[1]
    return (end[0] - start[0]) / lookups if lookups > 0 else None

