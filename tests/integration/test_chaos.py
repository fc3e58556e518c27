"""Chaos: during a Catch run, SIGKILL every service once at random moments (the seed is printed, and
LBC_CHAOS_SEED replays it). The launcher restarts each, the learner resumes from its newest checkpoint,
and training goes on: frames keep rising, and learner steps fall back at most to the checkpoint."""

import itertools
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from lbc.procs import services
from lbc.service import signal_on_parent_death
from tests.support import REPO, launcher_endpoint_args, wait_for

CHECKPOINT_EVERY = 20
SERVICES = ("learner", "replay", "bandit", "actor-0", "evaluator")


def _records(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_sigkill_of_any_service_at_random_moments_does_not_stop_training(tmp_path):
    seed = int(os.environ.get("LBC_CHAOS_SEED", random.SystemRandom().randrange(2**31)))
    print(f"chaos seed {seed} (LBC_CHAOS_SEED={seed} replays it)")
    rng = random.Random(seed)
    run = tmp_path / "runs" / "catch-catch"
    argv = [sys.executable, "-m", "lbc.launch", "--runs-dir", str(tmp_path / "runs"), "--preset", "catch",
            "--duration", "400", "--progress-every", "1", *launcher_endpoint_args(tmp_path),
            "--set", f"learner.checkpoint_every={CHECKPOINT_EVERY}"]
    launcher = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                preexec_fn=signal_on_parent_death)
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(launcher.stdout), daemon=True)
    reader.start()

    def steps() -> float:
        records = _records(run)
        return records[-1]["learner_steps"] or 0 if records else 0

    try:
        wait_for(lambda: steps() > 40, 150, "40 learner steps")
        order = list(SERVICES)
        rng.shuffle(order)
        killed_at: dict[str, float] = {}
        newest_checkpoint = None
        for name in order:
            time.sleep(rng.uniform(0.5, 4.0))   # the learner takes about 10 steps a second: 5 to 40 steps apart
            pid = services(launcher.pid).get(name)
            assert pid is not None, f"no running {name}; launcher said:\n{''.join(out)[-3000:]}"
            if name == "learner":
                newest_checkpoint = max((run / "checkpoints").glob("ckpt-*.pt"))
            os.kill(pid, signal.SIGKILL)
            killed_at[name] = steps()
        before = max(killed_at.values())
        wait_for(lambda: steps() > before + 30, 150, "30 learner steps after the last kill")
        frames = _records(run)[-1]["frames"]
        wait_for(lambda: _records(run)[-1]["frames"] > frames, 60, "frames after the last kill")
        assert launcher.poll() is None, "".join(out)[-3000:]
        for name in SERVICES:
            assert f"lbc: {name} exited with -9" in "".join(out), f"{name} was not restarted"
        learner_log = (run / "logs" / "learner.log").read_text()
        # from the newest checkpoint there was when it died (or one written between that look and the kill)
        resumed = [int(s) for s in re.findall(r"resumed from .*ckpt-0*(\d+)\.pt", learner_log)]
        assert resumed and resumed[-1] >= int(newest_checkpoint.stem.split("-")[1]), (resumed, newest_checkpoint)
        records = _records(run)
        frame_counts = [r["frames"] for r in records]
        assert frame_counts == sorted(frame_counts)
        # a killed learner loses at most the steps since its newest checkpoint, never the run's
        counts = [r["learner_steps"] for r in records if r["learner_steps"] is not None]
        assert all(b >= a - CHECKPOINT_EVERY for a, b in itertools.pairwise(counts)), counts
    finally:
        if launcher.poll() is None:
            launcher.send_signal(signal.SIGINT)
        launcher.wait(timeout=60)
        reader.join(timeout=5)
    assert launcher.returncode == 0, "".join(out)[-3000:]
