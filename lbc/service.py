"""What every service shell shares: command line, logging, SIGTERM, metrics and health endpoints."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import os
import signal
import sys
import threading
import time
from concurrent import futures
from typing import NoReturn

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import start_http_server

from lbc.config import PRESETS, Config, endpoint_port, load_config


def base_parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description=description,
        epilog="Configuration: a preset, then LBC_* environment variables (nested keys joined by '__', "
               "e.g. LBC_LEARNER__BATCH_SIZE=32), then --set overrides. See README 'Configuration'.")
    parser.add_argument("--preset", default=None,
                        help=f"one of {', '.join(sorted(PRESETS))} (default: $LBC_PRESET or 'cpu')")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one setting, e.g. --set learner.batch_size=32 (repeatable)")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="default INFO")
    return parser


def config_from_args(args: argparse.Namespace) -> Config:
    try:
        cfg = load_config(args.preset, args.overrides)
    except Exception as exc:  # pydantic's message names the field; show it and stop
        raise SystemExit(f"invalid configuration:\n{exc}") from None
    if cfg.security.enabled:
        from lbc.security import check_certificates
        try:
            check_certificates(cfg.certs_path)
        except ValueError as exc:
            raise SystemExit(str(exc)) from None
    return cfg


def setup_logging(name: str, level: str) -> logging.Logger:
    logging.basicConfig(level=level, format=f"%(asctime)s {name} %(levelname)s %(message)s",
                        datefmt="%H:%M:%S")
    return logging.getLogger(name)


def exit_service(code: int) -> NoReturn:
    """End a service whose main has returned: flush the logs and standard streams, then leave without the
    interpreter's teardown. With torch loaded that teardown is about a second of CPU in every process (its
    modules' finalisation, nothing of ours), which every stop and restart of the system waits for. By then
    main has closed its sockets and servers and written its checkpoint or snapshot; nothing registers an
    atexit hook of its own. An exception out of main still takes the ordinary path, with its traceback."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def stdout_gone() -> None:
    """After a BrokenPipeError (the pipe reading our output closed, as `| head` does): point stdout at /dev/null so
    that the interpreter's last flush at exit raises nothing more, and the command ends without a traceback."""
    with contextlib.suppress(OSError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def stop_event() -> threading.Event:
    """Set on SIGTERM or SIGINT so main loops can finish their step and shut down cleanly.

    The handler itself only writes the signal's number to a pipe; a thread of its own reads it, logs it and
    sets the event. Python runs a handler in the main thread between two bytecodes, and one that takes a
    lock deadlocks whenever the main thread was holding it: Event.set() takes the lock that the main loop's
    stop.wait(timeout) holds for a moment each time it wakes, so some SIGTERMs were never acted on (one
    in seven in a loop waking every 0.1 ms; a bandit in CI ignored its SIGTERM until it was killed)."""
    event = threading.Event()
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)

    def _handler(signum: int, _frame: object) -> None:
        with contextlib.suppress(OSError):   # a full pipe: the stop it would ask for is already on its way
            os.write(write_end, bytes([signum]))

    def _act_on_signals() -> None:
        while data := os.read(read_end, 64):
            for signum in data:
                logging.getLogger("lbc").info("received %s, shutting down", signal.Signals(signum).name)
            event.set()

    threading.Thread(target=_act_on_signals, name="lbc-signals", daemon=True).start()
    signal.signal(signal.SIGTERM, _handler)
    signal.signal(signal.SIGINT, _handler)
    exit_with_launcher()
    return event


# Set by lbc.launch in its children's environment; absent on Kubernetes, where the kubelet owns processes.
LAUNCHER_PID_VAR = "LBC_LAUNCHER_PID"
_PR_SET_PDEATHSIG = 1
# loaded at import, so that signal_on_parent_death can run between fork and exec (subprocess's preexec_fn)
# without the dynamic loader, whose lock another thread of the parent may have held at the fork
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def signal_on_parent_death(signum: int = signal.SIGTERM) -> bool:
    """Have the kernel send this process `signum` when the thread that started it exits, however it exits
    (Linux's PR_SET_PDEATHSIG; it survives exec). Also a `preexec_fn` for subprocess: the child then dies with the
    caller. False where the request is not possible (not Linux) or was refused."""
    if _LIBC is None:
        return False
    return _LIBC.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0


def exit_with_launcher() -> None:
    """Under the local launcher, have the kernel send this process SIGTERM when the launcher dies, however
    it dies (SIGKILL, a closed terminal, a crash), so no service trains on unowned and holding its ports.
    Linux's PR_SET_PDEATHSIG; elsewhere the launcher's own signal handling is all there is."""
    launcher = os.environ.get(LAUNCHER_PID_VAR)
    if not launcher or _LIBC is None:
        return
    if not signal_on_parent_death(signal.SIGTERM):
        logging.getLogger("lbc").warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
    if os.getppid() != int(launcher):   # the launcher died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def start_metrics(port: int, host: str) -> None:
    """Prometheus /metrics on `host` (endpoints.bind_host; process memory and CPU come with the default
    registry)."""
    start_http_server(port, addr=host)


def grpc_bind_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def listen_address(endpoint: str, host: str) -> str:
    """Listen on `host` (endpoints.bind_host) at the endpoint's port (the endpoint is what peers dial)."""
    return grpc_bind_address(host, endpoint_port(endpoint))


def zmq_bind_address(endpoint: str, host: str) -> str:
    """Bind a ZeroMQ socket on `host` (endpoints.bind_host) at the endpoint's port."""
    return f"tcp://{'*' if host in ('0.0.0.0', '::') else host}:{endpoint_port(endpoint)}"


def grpc_server(address: str, workers: int = 8,
                credentials: grpc.ServerCredentials | None = None) -> tuple[grpc.Server, health.HealthServicer]:
    """A gRPC server with the standard health service registered; call set_serving() once ready. With
    credentials (lbc.security) it speaks only mutual TLS."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    if port == 0:
        raise SystemExit(f"cannot listen on {address}")
    return server, health_servicer


def set_serving(health_servicer: health.HealthServicer, services: list[str], serving: bool = True) -> None:
    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    for name in ["", *services]:
        health_servicer.set(name, status)


class Backoff:
    """Exponential backoff with a cap, for retrying a peer without busy-waiting or crashing: either
    blocking (`wait`) or, for a loop that must go on, as a time before which not to retry (`fail`,
    `ready`)."""

    def __init__(self, initial: float = 0.2, cap: float = 10.0) -> None:
        self.initial, self.cap, self.delay = initial, cap, initial
        self.retry_at = 0.0

    def wait(self, stop: threading.Event) -> None:
        stop.wait(self.delay)
        self.delay = min(self.cap, self.delay * 2)

    def fail(self, now: float | None = None) -> None:
        """A failed attempt at `now`: no retry before now + delay, and the next delay doubles."""
        self.retry_at = (time.monotonic() if now is None else now) + self.delay
        self.delay = min(self.cap, self.delay * 2)

    def ready(self, now: float | None = None) -> bool:
        return (time.monotonic() if now is None else now) >= self.retry_at

    def reset(self) -> None:
        self.delay = self.initial
