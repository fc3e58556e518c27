"""`lbc`: operating commands. `lbc scale actors N` sets the actor replicas; `lbc autoscale` keeps them
sized to the learner's appetite (lbc.scaling), logging every decision; `lbc health ADDRESS` asks a
service's gRPC health check. Training on one machine is `make run` (python -m lbc.launch)."""

from __future__ import annotations

import argparse
import json
import logging
import threading
import time
import urllib.request
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from kubernetes.client.exceptions import ApiException
from prometheus_client import Counter, Gauge

from lbc import kube
from lbc.scaling import Autoscaler, ReplayRates, ScalePolicy, parse_replay_metrics
from lbc.service import setup_logging, start_metrics, stdout_gone, stop_event

DESIRED = Gauge("lbc_autoscaler_replicas", "Actor replicas the autoscaler last saw or set")
TARGET = Gauge("lbc_autoscaler_balanced_replicas", "Balanced actor count n* from replay's rates")
DECISIONS = Counter("lbc_autoscaler_decisions_total", "Autoscaler decisions", ["action"])
ERRORS = Counter("lbc_autoscaler_errors_total", "Failed reads or patches", ["what"])


class _DefaultsHelp(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each default, unless the help already says it or there is none to show."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def _cluster_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--namespace", default=None, help="default: the pod's namespace in a cluster, else 'lbc'")
    parser.add_argument("--deployment", default="lbc-actor", help="the actor Deployment (default lbc-actor)")
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, else ~/.kube/config)")
    parser.add_argument("--context", default=None, help="kubeconfig context")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lbc", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    scale = sub.add_parser("scale", help="set the number of replicas of a component", formatter_class=_DefaultsHelp)
    scale.add_argument("component", choices=["actors"])
    scale.add_argument("replicas", type=int)
    _cluster_args(scale)

    auto = sub.add_parser("autoscale", help="size the actor replicas to keep the learner fed",
                          description="Watches replay's /metrics and sets the actor Deployment's replicas to the "
                                      "count at which the actors produce what the learner consumes at the replay "
                                      "ratio, with hysteresis (lbc/scaling.py)",
                          formatter_class=_DefaultsHelp)
    _cluster_args(auto)
    auto.add_argument("--replay-metrics", default="http://lbc-replay:9102/metrics", help="replay_svc's /metrics URL")
    auto.add_argument("--min", dest="min_replicas", type=int, default=1, help="fewest actor replicas")
    auto.add_argument("--max", dest="max_replicas", type=int, default=16, help="most actor replicas")
    auto.add_argument("--replay-ratio", type=float, default=2.0, help="the run's replay.replay_ratio")
    auto.add_argument("--interval", type=float, default=30.0, help="seconds between observations")
    auto.add_argument("--patience", type=int, default=3, help="observations in a row before a change")
    auto.add_argument("--cooldown", type=float, default=120.0, help="seconds after a change with no other")
    auto.add_argument("--band", type=float, default=0.15, help="relative dead band around the current count")
    auto.add_argument("--metrics-port", type=int, default=9120, help="the autoscaler's own /metrics")
    auto.add_argument("--iterations", type=int, default=0, help="stop after this many observations (0: never)")
    auto.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                      help="log level")

    check = sub.add_parser("health", help="ask a service's gRPC health check; exit 0 when SERVING")
    check.add_argument("address", help="host:port, e.g. 127.0.0.1:50051")
    check.add_argument("--service", default="", help="health name, e.g. lbc.v1.ParameterService (default: the server)")
    check.add_argument("--wait", type=float, default=0.0,
                       help="keep asking for up to this many seconds (default 0: ask once)")
    check.add_argument("--certs", default=None,
                       help="the run's certificate folder, for a server with security.enabled (default: plain)")

    certs = sub.add_parser("certs", help="make a run's certificates and keys (security.enabled)",
                           description="A certificate authority, server and client certificates for mutual TLS on "
                                       "gRPC, and CURVE key pairs for ZeroMQ, in one folder (lbc/security.py). "
                                       "On Kubernetes: kubectl -n lbc create secret generic lbc-certs "
                                       "--from-file=DIR --from-file=DIR/curve ... (see the README)",
                           formatter_class=_DefaultsHelp)
    certs.add_argument("directory", help="folder to write, e.g. runs/cpu-pong/certs")
    certs.add_argument("--host", action="append", default=None,
                       help="a name the servers answer to (repeatable; default: localhost, 127.0.0.1 and the "
                            "cluster's Service names)")

    rep = sub.add_parser("report", help="learning curves (PNG) and a markdown summary of run folders",
                         description="Plots training return and evaluation score against frames, one line per run, "
                                     "and writes a summary table; over several games or runs also the papers' "
                                     "aggregates and the IQM with a bootstrap interval.")
    rep.add_argument("runs", nargs="+", help="run folders, e.g. runs/cpu-breakout")
    rep.add_argument("--out", default=None, help="folder for the files (default: the first run's parent, e.g. runs/)")
    rep.add_argument("--name", default="report", help="file name stem: <out>/<name>.png and <name>.md (default report)")

    config = sub.add_parser("config", help="the resolved configuration of a preset with overrides",
                            description="Prints the configuration a service would start with: the defaults, the "
                                        "preset (lbc/presets.py), LBC_* environment variables and --set overrides, "
                                        "validated.")
    config.add_argument("action", choices=["show"])
    config.add_argument("--preset", default=None, help="a preset name (default: $LBC_PRESET, else cpu)")
    config.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a field, e.g. --set learner.batch_size=8 (repeatable)")
    config.add_argument("--section", default=None, help="print only this section, e.g. learner")

    play = sub.add_parser("play", help="watch a trained agent: play a checkpoint, print scores, write an mp4",
                          description="Loads a run's checkpoint (weights only), plays its evaluation policy on the "
                                      "real game with the evaluation protocol and writes the game's frames as mp4.")
    add_checkpoint_arguments(play, "to play")
    play.add_argument("--episodes", type=int, default=1, help="games to play (default 1)")
    play.add_argument("--video", default=None, help="mp4 to write (default: none)")
    play.add_argument("--seed", type=int, default=0, help="seed of the games and the policy's draws (default 0)")
    play.add_argument("--max-frames", type=int, default=None, help="cap per episode (default: the run's env cap)")
    play.add_argument("--policy", choices=["greedy", "sample"], default=None,
                      help="evaluation policy (default: the run's eval.policy; see docs/decisions.md 28)")

    evaluate = sub.add_parser("evaluate", help="score a checkpoint with the evaluator's protocol and append it to "
                                               "the run's eval.jsonl (make curve: the score at the frame budget)",
                              description="Loads a run's checkpoint (weights only) and plays eval.episodes whole games "
                                          "on eval.num_envs environments as the evaluator does; the record goes to "
                                          "RUN/eval.jsonl at the frames the checkpoint was written at, where lbc "
                                          "report shows it.")
    add_checkpoint_arguments(evaluate, "to score")
    evaluate.add_argument("--episodes", type=int, default=None,
                          help="games to play (default: the run's eval.episodes)")
    evaluate.add_argument("--seed", type=int, default=None, help="seed of the games and draws (default: eval.seed)")
    evaluate.add_argument("--no-record", action="store_true", help="print the scores without appending them")

    export = sub.add_parser("export", help="write a run's acting network as ONNX or TorchScript, with a JSON of its "
                                           "inputs, outputs, preprocessing and behaviour",
                            description="Loads a run's checkpoint (weights only) and writes its acting step: "
                                        "observation, previous action and reward, episode start and recurrent state "
                                        "in; every head's advantages and values and the new state out. The batch "
                                        "axis is free. Beside it, a .json says how to prepare frames and act.")
    add_checkpoint_arguments(export, "to export")
    export.add_argument("--format", choices=["onnx", "torchscript"], default="onnx", help="file format (default onnx)")
    export.add_argument("--out", default=None,
                        help="file to write (default: RUN/export/policy-vVERSION.onnx, or .pt for torchscript)")
    return parser


def add_checkpoint_arguments(parser: argparse.ArgumentParser, purpose: str) -> None:
    """The run folder and the checkpoint in it, as every verb that loads a checkpoint takes them."""
    parser.add_argument("run", help="run folder, e.g. runs/cpu-breakout")
    parser.add_argument("--version", type=int, default=None,
                        help=f"parameter version of the checkpoint {purpose}, among those kept (default: the newest)")


def health(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.wait
    status = "UNREACHABLE"
    from lbc.peers import open_channel
    from lbc.security import channel_credentials

    credentials = channel_credentials(Path(args.certs)) if args.certs else None
    with open_channel(args.address, credentials) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=args.service), timeout=2.0)
                status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
            except grpc.RpcError as exc:
                status = exc.code().name
            if status == "SERVING" or time.monotonic() >= deadline:
                break
            time.sleep(0.5)
    print(f"{args.address} {args.service or '(server)'}: {status}")
    return 0 if status == "SERVING" else 1


def _apps_api(args: argparse.Namespace, command: str) -> kube.client.AppsV1Api:
    try:
        return kube.apps_api(args.kubeconfig, args.context)
    except kube.KubeConfigError as exc:
        raise SystemExit(f"lbc {command}: {exc}") from None


def scale(args: argparse.Namespace) -> int:
    if args.replicas < 0:
        raise SystemExit("replicas must be >= 0")
    namespace = args.namespace or kube.default_namespace()
    api = _apps_api(args, "scale")
    try:
        before = kube.read_replicas(api, namespace, args.deployment)
        kube.set_replicas(api, namespace, args.deployment, args.replicas)
    except ApiException as exc:
        raise SystemExit(f"cannot scale {namespace}/{args.deployment}: {exc.status} {exc.reason}") from None
    print(f"{namespace}/{args.deployment}: {before} -> {args.replicas} replicas")
    return 0


def _read_replay(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def autoscale(args: argparse.Namespace, stop: threading.Event | None = None) -> int:
    log = setup_logging("autoscaler", args.log_level)
    stop = stop or stop_event()
    policy = ScalePolicy(min_replicas=args.min_replicas, max_replicas=args.max_replicas,
                         replay_ratio=args.replay_ratio, rel_band=args.band, patience=args.patience,
                         cooldown_s=args.cooldown)
    namespace = args.namespace or kube.default_namespace()
    api = _apps_api(args, "autoscale")
    if args.metrics_port:
        start_metrics(args.metrics_port, "0.0.0.0")   # scraped in the cluster
    scaler = Autoscaler(policy)
    log.info("autoscaling %s/%s between %d and %d replicas from %s every %.0f s",
             namespace, args.deployment, policy.min_replicas, policy.max_replicas, args.replay_metrics, args.interval)
    previous = None
    observations = 0
    while not stop.is_set():
        try:
            counters = parse_replay_metrics(_read_replay(args.replay_metrics), time.monotonic())
        except (OSError, ValueError) as exc:
            ERRORS.labels("replay").inc()
            log.warning("cannot read replay metrics from %s: %s", args.replay_metrics, exc)
            counters = None
        rates = ReplayRates.between(previous, counters) if previous and counters else None
        previous = counters or previous
        if rates is not None:
            observations += 1
            try:
                current = kube.read_replicas(api, namespace, args.deployment)
                decision = scaler.observe(current, rates, time.monotonic())
                DESIRED.set(decision.replicas)
                TARGET.set(decision.target)
                action = "keep" if decision.replicas == current else ("up" if decision.replicas > current else "down")
                if action != "keep":
                    kube.set_replicas(api, namespace, args.deployment, decision.replicas)
                DECISIONS.labels(action).inc()
                log.info("replicas %d -> %d (%s): n*=%.2f insert %.1f/s sample %.1f/s actors waiting %.0f%% "
                         "learner waiting %.0f%%", current, decision.replicas, decision.reason, decision.target,
                         rates.insert_per_s, rates.sample_per_s, 100 * rates.actors_wait, 100 * rates.learner_wait)
            except ApiException as exc:
                ERRORS.labels("kubernetes").inc()
                log.warning("Kubernetes API: %s %s", exc.status, exc.reason)
            if args.iterations and observations >= args.iterations:
                break
        stop.wait(args.interval)
    return 0


def show_config(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from lbc.config import load_config

    try:
        resolved = load_config(args.preset, args.overrides).model_dump(mode="json")
    except (ValidationError, ValueError) as exc:
        raise SystemExit(f"lbc config: {exc}") from None
    if args.section is not None:
        if args.section not in resolved:
            raise SystemExit(f"lbc config: no section {args.section!r}; sections: {', '.join(resolved)}")
        resolved = {args.section: resolved[args.section]}
    print(json.dumps(resolved, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run_command(args)
    except BrokenPipeError:   # `lbc config show | head`: the reader has all it wanted
        stdout_gone()
        return 1


def run_command(args: argparse.Namespace) -> int:
    """The subcommand `args` name."""
    if args.command == "scale":
        return scale(args)
    if args.command == "health":
        return health(args)
    if args.command == "certs":
        from lbc.security import DEFAULT_HOSTS, make_certificates

        make_certificates(Path(args.directory), tuple(args.host) if args.host else DEFAULT_HOSTS)
        print(f"wrote the run's CA, server and client certificates and CURVE keys to {args.directory}")
        return 0
    if args.command == "report":
        from lbc.report import report  # matplotlib only where a report is made

        try:
            png, md = report(args.runs, args.out, args.name)
        except (OSError, ValueError) as exc:
            raise SystemExit(f"lbc report: {exc}") from None
        print(f"wrote {png} and {md}")
        print(md.read_text())
        return 0
    if args.command == "config":
        return show_config(args)
    if args.command == "export":
        from lbc.export import export_cli

        return export_cli(args)
    if args.command == "evaluate":
        from lbc.evaluate import evaluate_cli

        return evaluate_cli(args)
    if args.command == "play":
        from lbc.play import play_cli

        return play_cli(args)
    return autoscale(args)


if __name__ == "__main__":
    logging.captureWarnings(True)
    raise SystemExit(main())
