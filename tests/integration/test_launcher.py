"""The launcher off the happy path: runs it cannot start are refused before any service starts, with one
line naming what to change; whatever stops it (a closed terminal, SIGKILL), no service outlives it."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from lbc.config import load_config
from lbc.preflight import local_ports
from lbc.service import signal_on_parent_death
from tests.support import REPO, free_port, launcher_endpoint_args, process_running


def _argv(tmp_path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "lbc.launch", "--runs-dir", str(tmp_path / "runs"), *extra]


def _refused(tmp_path, *extra: str) -> str:
    """The launcher's refusal on fresh ports, so that a program holding a default port elsewhere on the
    machine changes no refusal."""
    argv = _argv(tmp_path, *launcher_endpoint_args(tmp_path / "runs"), *extra)
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "started" not in proc.stdout
    return proc.stderr


@pytest.mark.parametrize("extra, says", [
    (["--actors", "0"], "argument --actors: must be at least 1, got 0"),
    (["--duration", "-5"], "argument --duration: must be 0 or more"),
    (["--port-base", "80"], "argument --port-base: must lie in [1024,"),
    (["--game", "pongg"], "unknown Atari game 'pongg': did you mean pong?"),
    (["--preset", "cpuu"], "argument --preset: unknown preset 'cpuu': did you mean cpu?"),
    (["--preset", "cpu", "--game", "catch"], "catch is the built-in game of --preset catch"),
    (["--preset", "catch", "--game", "breakout"], "--game breakout needs an Atari preset"),
    (["--resume", "--name", "never-ran"], "never-ran holds no checkpoint to continue from"),
], ids=["no-actors", "negative-duration", "low-port-base", "misspelt-game", "misspelt-preset", "catch-on-atari",
        "atari-on-catch", "resume-nothing"])
def test_runs_that_cannot_start_are_refused_before_starting(tmp_path, extra, says):
    assert says in _refused(tmp_path, *extra)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_the_launcher_reads_lbc_variables_like_the_services(tmp_path, monkeypatch):
    monkeypatch.setenv("LBC_ENV__GAME", "breakoutt")
    assert "unknown Atari game 'breakoutt': did you mean breakout?" in _refused(tmp_path)
    monkeypatch.setenv("LBC_PRESET", "catch")    # Catch ignores the game: the name and header say catch
    monkeypatch.setenv("LBC_ENV__GAME", "breakout")
    run_dir = tmp_path / "runs" / "catch-catch"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("{}\n")
    assert f"{run_dir} already holds a run" in _refused(tmp_path)


def test_a_busy_port_is_named_by_its_setting(tmp_path):
    port = free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        err = _refused(tmp_path, "--set", f"endpoints.bandit=127.0.0.1:{port}")
    assert f"port {port} (endpoints.bandit) is in use" in err and "--port-base" in err


def test_an_existing_run_is_refused_unless_resumed_or_overwritten(tmp_path):
    run_dir = tmp_path / "runs" / "catch-catch"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("{}\n")
    err = _refused(tmp_path, "--preset", "catch")
    assert "already holds a run: --resume continues it, --overwrite replaces it" in err
    assert "--overwrite deletes it: choose one" in _refused(tmp_path, "--preset", "catch", "--resume", "--overwrite")
    port = free_port()
    with socket.socket() as holder:   # --overwrite replaces a run only once the new one can start
        holder.bind(("127.0.0.1", port))
        holder.listen()
        busy = ["--set", f"endpoints.bandit=127.0.0.1:{port}"]
        assert "already holds a run" in _refused(tmp_path, "--preset", "catch", *busy)   # the run, then the ports
        err = _refused(tmp_path, "--preset", "catch", "--overwrite", *busy)
    assert f"port {port} (endpoints.bandit) is in use" in err
    assert (run_dir / "metrics.jsonl").read_text() == "{}\n"


def _start(tmp_path, *extra: str, sets: list[str] | None = None,
           stderr: int = subprocess.STDOUT) -> tuple[subprocess.Popen, dict[str, int]]:
    """A Catch run with every service started; returns the launcher and the services' pids by name."""
    if sets is None:
        sets = launcher_endpoint_args(tmp_path)
    launcher = subprocess.Popen(_argv(tmp_path, "--preset", "catch", "--duration", "120", *sets, *extra), cwd=REPO,
                                stdout=subprocess.PIPE, stderr=stderr, text=True, preexec_fn=signal_on_parent_death)
    pids: dict[str, int] = {}
    for line in launcher.stdout:
        if found := re.match(r"lbc: started (\S+) \(pid (\d+)\)", line):
            pids[found[1]] = int(found[2])
        if "evaluator" in pids:
            return launcher, pids
    raise AssertionError(f"the launcher ended before starting its services (exit {launcher.wait()})")


def _wait_all_gone(pids: dict[str, int], timeout: float = 30.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [name for name, pid in pids.items() if process_running(pid)]
        if not left:
            return []
        time.sleep(0.2)
    return left


def _listeners(port: int) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp* has them) of the sockets listening on `port`."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in list(rows)[1:]:
                local, state = row.split()[1], row.split()[3]
                address, hex_port = local.rsplit(":", 1)
                if state == "0A" and int(hex_port, 16) == port:   # 0A: LISTEN
                    found.add(address)
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc/net are Linux's")
def test_services_listen_on_loopback_and_die_with_a_killed_launcher(tmp_path):
    """A local run is reachable from this machine only. SIGKILL leaves the launcher no chance to clean up:
    the kernel's parent-death signal stops the services."""
    sets = launcher_endpoint_args(tmp_path)
    launcher, pids = _start(tmp_path, "--progress-every", "1", sets=sets)
    for line in launcher.stdout:   # the first progress line: every service is up and listening
        if line.startswith("["):
            break
    # every port this run listens on (the learner group's only with learner.replicas > 1)
    ports = set(local_ports(load_config("catch", [s for s in sets if s != "--set"]), actors=1).values())
    assert len(ports) == 12   # five services, the evaluator and one actor
    loopback = {"0100007F", "0000000000000000FFFF00000100007F"}   # 127.0.0.1, as IPv4 and as v4-mapped IPv6
    deadline = time.monotonic() + 20.0
    while not all(_listeners(port) for port in ports) and time.monotonic() < deadline:
        time.sleep(0.2)
    for port in sorted(ports):
        assert _listeners(port) and _listeners(port) <= loopback, f"port {port} listens on {_listeners(port)}"
    launcher.kill()
    launcher.wait()
    assert _wait_all_gone(pids) == [], "services outlived a killed launcher"


def _records(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "runs" / "catch-catch" / "metrics.jsonl").open()]


def test_a_closed_terminal_stops_every_service_and_the_run_resumes_where_it_was(tmp_path):
    """SIGHUP (the terminal went away) stops the run like Ctrl-C: services stopped, final checkpoint.
    --resume then goes on from there: frames and learner steps continue instead of restarting at 0."""
    sets = launcher_endpoint_args(tmp_path)
    saved_step = 0
    for resume in ([], ["--resume"]):
        launcher, pids = _start(tmp_path, "--progress-every", "1", *resume, sets=sets)
        for line in launcher.stdout:   # until the learner has stepped (after its checkpoint, on resuming)
            if (steps := re.search(r"learner (\d+) steps", line)) and int(steps[1]) > saved_step:
                break
        os.kill(launcher.pid, signal.SIGHUP)
        out, _ = launcher.communicate(timeout=60)
        assert launcher.returncode == 0 and "lbc: stopped" in out, out
        assert _wait_all_gone(pids, timeout=5.0) == []
        checkpoints = sorted((tmp_path / "runs" / "catch-catch" / "checkpoints").glob("ckpt-*.pt"))
        assert checkpoints
        if not resume:
            first = _records(tmp_path)
            saved_step = int(checkpoints[-1].stem.split("-")[1])   # the final checkpoint
            assert saved_step >= first[-1]["learner_steps"] > 0
    records = _records(tmp_path)
    frames, steps = [r["frames"] for r in records], [r["learner_steps"] for r in records]
    assert frames == sorted(frames) and steps == sorted(steps), (frames, steps)   # never back to 0
    assert len(records) > len(first) and records[-1]["learner_steps"] > saved_step


def test_a_service_that_fails_alike_twice_on_starting_stops_the_run_with_its_error(tmp_path):
    """The cause is in the terminal at once, and an identical failure is not retried five times."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA, so that learner.device=cuda fails")
    sets = launcher_endpoint_args(tmp_path)
    started = time.monotonic()
    proc = subprocess.run(_argv(tmp_path, "--preset", "catch", "--set", "learner.device=cuda", *sets), cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "lbc: learner exited with 1: learner.device=cuda but no CUDA device is visible" in proc.stdout
    assert "learner failed the same way twice on starting" in proc.stderr
    assert time.monotonic() - started < 60 and "lbc: stopped" in proc.stdout


def test_a_reader_that_goes_away_stops_the_run(tmp_path):
    """`python -m lbc.launch ... | head -1`: the next progress line finds the pipe closed; the launcher
    stops every service instead of dying with a BrokenPipeError and leaving them."""
    launcher, pids = _start(tmp_path, "--progress-every", "1", stderr=subprocess.PIPE)
    launcher.stdout.close()
    assert launcher.wait(timeout=60) == 1
    assert "Traceback" not in launcher.stderr.read()
    assert _wait_all_gone(pids, timeout=5.0) == []
