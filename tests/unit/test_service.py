"""lbc.service in processes of its own: a SIGTERM is acted on however the main loop happens to be waiting when it
comes."""

import os
import random
import select
import signal
import subprocess
import sys
import textwrap
import time

from tests.support import process_running

# The child's main thread wakes from stop.wait() every 0.1 ms, as a service's loop does now and then; each
# round this test sends it a SIGTERM at a random moment and waits for it to say it stopped. The handler that
# set the event itself deadlocked on the event's lock, held by the waking main thread, in about one round
# in seven.
LOOP = textwrap.dedent("""
    import logging, sys
    from lbc.service import stop_event
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    stop = stop_event()
    for _ in sys.stdin:
        stop.clear()
        print("waiting", flush=True)
        while not stop.wait(0.0001):
            pass
        print("stopped", flush=True)
""")


def _line(child: subprocess.Popen, timeout: float) -> bytes:
    ready, _, _ = select.select([child.stdout], [], [], timeout)
    return child.stdout.readline() if ready else b"(nothing in %.0f s)" % timeout


def test_every_sigterm_stops_a_main_loop_waiting_on_the_event():
    rounds = 200
    child = subprocess.Popen([sys.executable, "-c", LOOP], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, bufsize=0)
    try:
        for i in range(rounds):
            child.stdin.write(b"go\n")
            assert _line(child, 30.0) == b"waiting\n"
            time.sleep(random.uniform(0.0, 0.002))
            child.send_signal(signal.SIGTERM)
            assert _line(child, 5.0) == b"stopped\n", f"round {i}: the SIGTERM was not acted on"
        child.stdin.close()
        assert child.wait(timeout=10) == 0
        # Each signal is logged, by the thread that reads them.
        assert child.stderr.read().decode().count("received SIGTERM, shutting down") == rounds
    finally:
        child.kill()
        child.wait()


# A parent that starts a sleeping child, with or without signal_on_parent_death as its preexec_fn, prints the
# child's pid and then sleeps until it is killed.
PARENT = textwrap.dedent("""
    import subprocess, sys, time
    from lbc.service import signal_on_parent_death
    asked = sys.argv[1] == "asked"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                             preexec_fn=signal_on_parent_death if asked else None)
    print(child.pid, flush=True)
    time.sleep(120)
""")


def _orphan_after_a_killed_parent(mode: str) -> int:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, mode], stdout=subprocess.PIPE, bufsize=0)
    try:
        line = _line(parent, 30.0)
        pid = int(line)
        assert process_running(pid)
    finally:
        parent.kill()
        parent.wait()
    return pid


def test_a_child_started_with_signal_on_parent_death_dies_with_a_killed_parent():
    """What tests.support.Service relies on: services a killed pytest started do not train on, unowned."""
    asked = _orphan_after_a_killed_parent("asked")
    # the same child started without it lives on (what made the ask necessary)
    plain = _orphan_after_a_killed_parent("plain")
    try:
        deadline = time.monotonic() + 10
        while process_running(asked) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not process_running(asked), "the child outlived its SIGKILLed parent"
        assert process_running(plain)
    finally:
        for pid in (asked, plain):
            if process_running(pid):
                os.kill(pid, signal.SIGKILL)
