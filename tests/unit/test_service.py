"""lbc.service in processes of its own: a SIGTERM is acted on however the main loop happens to be waiting when it
comes."""

import random
import select
import signal
import subprocess
import sys
import textwrap
import time

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

