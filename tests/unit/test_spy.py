"""bench.spy: py-spy's samples read per service thread, busy and waiting shares, and a real sampling run."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bench.spy import parse_raw, record, service_name, thread_table

LAUNCH = 'process 10:"python -m lbc.launch --preset cpu"'
LEARNER = 'process 12:"/v/bin/python -m learner_svc --preset cpu --set a=b"'
ACTOR = 'process 13:"/v/bin/python -m actor_svc --preset cpu --index 1 --actor-id actor-1"'
EVAL = 'process 14:"/v/bin/python -m actor_svc --preset cpu --mode eval"'
PART = f"{LAUNCH};{LEARNER};thread (21): learner-part_0"
STEP = "train_step (learner_svc/training.py:160)"

# every sample (--idle): 100 possible per thread in the window
EVERY = textwrap.dedent(f"""\
    {PART};{STEP};backward (torch/_tensor.py:600) 60
    {PART};{STEP};_conv_forward (torch/nn/modules/conv.py:560) 30
    {PART};_worker (concurrent/futures/thread.py:90) 10
    {LAUNCH};{ACTOR};thread (31): MainThread;main (actor_svc/__main__.py:140);step (ale_py/vector_env.py:212) 50
    {LAUNCH};{ACTOR};thread (31): MainThread;main (actor_svc/__main__.py:130);poll (zmq/sugar/poll.py:106) 40
    {LAUNCH};{ACTOR};thread (31): MainThread;main (actor_svc/__main__.py:135);forward (lbc/acting.py:50) 10
    {LAUNCH};{EVAL};thread (41): MainThread;run (lbc/evaluator.py:10);sleep (time.py) 99
    {LAUNCH};{EVAL};thread (41): MainThread;run (lbc/evaluator.py:10);play (lbc/evaluator.py:20) 1
    """)
# running samples only
BUSY = textwrap.dedent(f"""\
    {PART};{STEP};backward (torch/_tensor.py:600) 55
    {PART};{STEP};_conv_forward (torch/nn/modules/conv.py:560) 30
    {LAUNCH};{ACTOR};thread (31): MainThread;main (actor_svc/__main__.py:140);step (ale_py/vector_env.py:212) 20
    {LAUNCH};{ACTOR};thread (31): MainThread;main (actor_svc/__main__.py:135);forward (lbc/acting.py:50) 10
    {LAUNCH};{EVAL};thread (41): MainThread;run (lbc/evaluator.py:10);play (lbc/evaluator.py:20) 1
    """)


def test_service_names_come_from_the_command_line() -> None:
    assert service_name("/v/bin/python -m learner_svc --preset cpu") == "learner_svc"
    assert service_name("/v/bin/python -m actor_svc --preset cpu --index 1 --actor-id actor-1") == "actor_svc 1"
    assert service_name("/v/bin/python -m actor_svc --preset cpu --mode eval") == "actor_svc eval"
    assert service_name("/usr/bin/prometheus --config.file=x") == "prometheus"


def test_samples_are_counted_per_innermost_process_and_thread() -> None:
    threads = parse_raw(EVERY)
    assert set(threads) == {("learner_svc", "learner-part_0"), ("actor_svc 1", "MainThread"),
                            ("actor_svc eval", "MainThread")}
    learner = threads["learner_svc", "learner-part_0"]
    assert learner.total == 100
    assert learner.by_function == {"backward (_tensor.py)": 60, "_conv_forward (conv.py)": 30,
                                   "_worker (thread.py)": 10}
    assert threads["actor_svc 1", "MainThread"].by_function["poll (poll.py)"] == 40


def test_the_table_gives_busy_and_waiting_shares_and_where() -> None:
    rows = thread_table(parse_raw(BUSY), parse_raw(EVERY), window=100)
    assert rows[0].split()[:4] == ["service", "thread", "busy", "waits"]
    body = rows[1:]
    # busiest first; the evaluator (1% busy) falls under the 2% floor
    assert [r.split()[0] for r in body] == ["learner_svc", "actor_svc"]
    learner, actor = body
    assert " 85%   15%" in learner   # 55 + 30 running of 100; 15 present but not running
    assert "backward (_tensor.py) 55%, _conv_forward (conv.py) 30%" in learner
    assert learner.endswith("_worker (thread.py) 10%, backward (_tensor.py) 5%")   # where it waits
    assert " 30%   70%" in actor
    assert actor.endswith("poll (poll.py) 40%, step (vector_env.py) 30%")


SPINNER = textwrap.dedent("""\
    import threading, time

    def nap():
        while True:
            time.sleep(0.05)

    def spin():
        x = 0
        while True:
            x += 1

    threading.Thread(target=nap, name="napper", daemon=True).start()
    threading.Thread(target=spin, name="spinner", daemon=True).start()
    time.sleep(60)
    """)


def test_a_real_sampling_run_tells_a_busy_thread_from_a_sleeping_one(tmp_path: Path) -> None:
    script = tmp_path / "spinner.py"
    script.write_text(SPINNER)
    child = subprocess.Popen([sys.executable, str(script)])
    try:
        time.sleep(0.5)
        try:
            busy, every = record(child.pid, seconds=2, rate=50)
        except RuntimeError as e:
            if "permission" in str(e).lower() or "not permitted" in str(e).lower():   # no ptrace rights here
                pytest.skip(f"py-spy cannot attach here: {e}")
            raise
    finally:
        child.kill()
        child.wait()
    running, present = parse_raw(busy), parse_raw(every)
    spinner = [v for (_, thread), v in running.items() if thread == "spinner"]
    assert spinner and spinner[0].total >= 50   # of ~100 possible: it never sleeps
    assert spinner[0].by_function.most_common(1)[0][0] == "spin (spinner.py)"
    napper_running = sum(v.total for (_, thread), v in running.items() if thread == "napper")
    napper_present = sum(v.total for (_, thread), v in present.items() if thread == "napper")
    assert napper_present >= 50 and napper_running <= 0.2 * napper_present
