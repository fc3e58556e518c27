"""`make image-smoke`: start one container per service from the lbc image with podman, locked down
as in the pods (user 10001, read-only root filesystem, every capability dropped, no privilege
escalation), and check that each answers its gRPC health check from inside its container."""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time

# service -> (module, health address, health name)
SERVICES = {
    "bandit": ("bandit_svc", "127.0.0.1:50052", "lbc.v1.BanditService"),
    "replay": ("replay_svc", "127.0.0.1:50053", "lbc.v1.Replay"),
    "learner": ("learner_svc", "127.0.0.1:50051", "lbc.v1.ParameterService"),
    "actor": ("actor_svc", "127.0.0.1:50060", "lbc.v1.Actor"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.image_smoke", description=__doc__)
    parser.add_argument("--image", required=True)
    parser.add_argument("--podman", default="podman")
    parser.add_argument("--run-flags", default="")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds for every service to be healthy")
    args = parser.parse_args(argv)
    podman = shlex.split(args.podman)
    locked = ["--network", "host", "--read-only", "--tmpfs", "/tmp:rw,mode=1777", "--tmpfs", "/data:rw,mode=1777",
              "--cap-drop", "ALL", "--security-opt", "no-new-privileges", *shlex.split(args.run_flags)]
    names = {svc: f"lbc-smoke-{svc}" for svc in SERVICES}
    subprocess.run([*podman, "rm", "-f", *names.values()], capture_output=True)
    results: dict[str, str] = {}
    try:
        for svc, (module, _, _) in SERVICES.items():
            subprocess.run([*podman, "run", "-d", "--name", names[svc], *locked, args.image, "python", "-m", module],
                           check=True, capture_output=True)
            print(f"started {names[svc]}: python -m {module}", flush=True)
        deadline = time.monotonic() + args.timeout
        for svc, (_, address, health_name) in SERVICES.items():
            wait = max(1.0, deadline - time.monotonic())
            out = subprocess.run([*podman, "exec", names[svc], "lbc", "health", address, "--service", health_name,
                                  "--wait", f"{wait:.0f}"], capture_output=True, text=True)
            results[svc] = (out.stdout + out.stderr).strip()
            print(f"{svc:8s} {results[svc]}", flush=True)
        user = subprocess.run([*podman, "exec", names["learner"], "id", "-u"], capture_output=True, text=True)
        print(f"learner runs as uid {user.stdout.strip()}")
        failed = [svc for svc, line in results.items() if not line.endswith("SERVING")]
        if user.stdout.strip() != "10001":
            failed.append("non-root user")
    finally:
        for svc, name in names.items():
            if svc in results and not results[svc].endswith("SERVING"):
                logs = subprocess.run([*podman, "logs", name], capture_output=True, text=True)
                print(f"--- {name} log ---\n{(logs.stdout + logs.stderr)[-2000:]}")
        subprocess.run([*podman, "stop", "-t", "10", *names.values()], capture_output=True)
        subprocess.run([*podman, "rm", "-f", *names.values()], capture_output=True)
    if failed:
        print(f"image smoke FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"image smoke passed: {args.image} runs all four services healthy")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
