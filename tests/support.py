"""What the tests share: starting real service processes on free loopback ports for integration and end-to-end
tests, and comparing two sets of games step by step."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lbc.launch import scrape, value
from lbc.preflight import port_is_free
from lbc.service import signal_on_parent_death

REPO = Path(__file__).resolve().parent.parent


# Ports are drawn below the kernel's ephemeral range (32768 and up on Linux): a port the kernel hands
# out for bind(0) can be taken as the local port of some outgoing connection before the service
# binds it (seen in CI: "Address already in use" on a port found free a moment before).
_PORT_RANGE = (20_000, 32_000)
_given: set[int] = set()
_rng = random.Random()


def free_port(span: int = 1) -> int:
    """A free port outside the ephemeral range, not handed out before in this session; with `span` > 1 the first of
    that many in a row, all free and all reserved: a base port from which the n-th actor or replica takes base + n
    (session 61 saw actor 1's health port drawn again as the inference service's metrics port)."""
    for _ in range(1000):
        port = _rng.randint(_PORT_RANGE[0], _PORT_RANGE[1] - span)
        block = range(port, port + span)
        if not _given.intersection(block) and all(port_is_free(p) for p in block):
            _given.update(block)
            return port
    raise RuntimeError(f"no {span} free ports in a row in {_PORT_RANGE}")


BASE_SPAN = 16   # ports reserved from each *_base endpoint: actors or learner replicas a test starts, at most


def endpoint_overrides(run_dir: Path) -> list[str]:
    """--set values giving every endpoint a fresh port, so tests never collide."""
    p = {name: free_port() for name in ("params", "bandit", "ingest", "serve", "health", "lm", "rm", "bm")}
    return [
        f"run_dir={run_dir}",
        f"endpoints.params=127.0.0.1:{p['params']}", f"endpoints.bandit=127.0.0.1:{p['bandit']}",
        f"endpoints.replay_ingest=tcp://127.0.0.1:{p['ingest']}", f"endpoints.replay_serve=tcp://127.0.0.1:{p['serve']}",
        f"endpoints.replay_health=127.0.0.1:{p['health']}", f"endpoints.learner_metrics={p['lm']}",
        f"endpoints.replay_metrics={p['rm']}", f"endpoints.bandit_metrics={p['bm']}",
        f"endpoints.actor_metrics_base={free_port(BASE_SPAN)}", f"endpoints.actor_health_base={free_port(BASE_SPAN)}",
        f"endpoints.eval_metrics={free_port()}", f"endpoints.eval_health=127.0.0.1:{free_port()}",
        f"endpoints.learner_group=127.0.0.1:{free_port()}",
        f"endpoints.learner_replica_metrics_base={free_port(BASE_SPAN)}",
        f"endpoints.inference=tcp://127.0.0.1:{free_port()}", f"endpoints.inference_health=127.0.0.1:{free_port()}",
        f"endpoints.inference_metrics={free_port()}",
    ]


def launcher_endpoint_args(run_dir: Path) -> list[str]:
    """The launcher's --set flags for fresh ports (it names the run folder itself, from --runs-dir/--name)."""
    return [arg for o in endpoint_overrides(run_dir) if not o.startswith("run_dir=") for arg in ("--set", o)]


def flat_overrides(tree: dict, prefix: str = "") -> list[str]:
    """A nested settings dict as ["a.b=<json>", ...] overrides."""
    out = []
    for key, val in tree.items():
        out += flat_overrides(val, f"{prefix}{key}.") if isinstance(val, dict) else [f"{prefix}{key}={json.dumps(val)}"]
    return out


def overrides_dict(overrides: list[str]) -> dict[str, str]:
    return dict(item.split("=", 1) for item in overrides)


class Service:
    def __init__(self, module: str, preset: str, overrides: list[str], log_dir: Path, *extra: str) -> None:
        argv = [sys.executable, "-m", module, "--preset", preset, *(a for o in overrides for a in ("--set", o)), *extra]
        self._init(module, argv, log_dir, env=None, cwd=REPO)

    @classmethod
    def from_argv(cls, name: str, argv: list[str], log_dir: Path, env: dict[str, str], cwd: Path) -> Service:
        """Any command with exactly this environment (e.g. a container's, from a manifest)."""
        service = cls.__new__(cls)
        service._init(name, argv, log_dir, env=env, cwd=cwd)
        return service

    def _init(self, name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None, cwd: Path) -> None:
        self.module = name
        self.argv = argv
        self.env, self.cwd = env, cwd
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{name}-{time.monotonic_ns()}.log"
        self.proc: subprocess.Popen | None = None

    def start(self, *extra: str) -> Service:
        log = self.log_path.open("ab")
        # SIGTERM to the service when pytest dies, however it dies: a killed `make test` leaves no service
        # training on unowned, holding the ports the next run's fixtures need
        self.proc = subprocess.Popen([*self.argv, *extra], cwd=self.cwd, env=self.env, stdout=log,
                                     stderr=subprocess.STDOUT, preexec_fn=signal_on_parent_death)
        log.close()
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 20.0) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"{self.module} ignored SIGTERM; log: {self.log()}") from None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""


def wait_healthy(address: str, service: str = "", timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=1.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    raise AssertionError(f"{address} not healthy within {timeout}s")


def metric(port: int, name: str, **labels: str) -> float:
    return value(scrape(port), name, **labels) or 0.0


def process_running(pid: int) -> bool:
    """Running, as opposed to gone or a zombie nobody has reaped yet."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_for(predicate, timeout: float, what: str, interval: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def resume_learner(learner: Service, overrides: dict[str, str], timeout: float = 120.0) -> int:
    """Start a killed learner again with --resume and return the first version it publishes, once it serves
    parameters. It publishes above every version published before it died, so whatever a peer reports at
    or above this version came from the resumed learner, not from a pull of the old one before its kill."""
    learner.start("--resume")
    wait_healthy(overrides["endpoints.params"], "lbc.v1.ParameterService", timeout=timeout)
    return int(metric(int(overrides["endpoints.learner_metrics"]), "lbc_learner_param_version"))


def run_folder_with_checkpoint(run: Path, cfg, step: int, version: int) -> None:
    """A run folder as the launcher leaves it, holding one checkpoint of a fresh agent (cfg: Config with
    run_dir=run): what `lbc play` and `lbc export` read."""
    from lbc.envs import env_spec
    from lbc.nets import build_agent
    from learner_svc import checkpoint
    from learner_svc.training import build_optimiser

    run.mkdir(parents=True, exist_ok=True)
    (run / "config.json").write_text(cfg.model_dump_json())
    spec = env_spec(cfg.env)
    agent = build_agent(cfg, spec.obs_shape, spec.num_actions)
    checkpoint.save(run / "checkpoints", agent, build_optimiser(agent, cfg.learner),
                    checkpoint.Counters(step, version, 0))


STEP_FIELDS = ("obs", "reward", "done", "truncated", "life_lost")


def assert_same_step(a, b, fields: tuple[str, ...] = STEP_FIELDS) -> None:
    """Two lbc.envs.StepResults equal field by field (the field named where they differ)."""
    import numpy as np

    for field in fields:
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)


def same_play(a, b, steps: int, seed: int):
    """Two sets of games (lbc.envs) reset and then stepped by the same random actions, their observations at the
    reset and each step's results equal (assert_same_step); yields each step's two results."""
    import numpy as np

    np.testing.assert_array_equal(a.reset(), b.reset())
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        actions = rng.integers(0, a.spec.num_actions, a.num_envs)
        first, second = a.step(actions), b.step(actions)
        assert_same_step(first, second)
        yield first, second
