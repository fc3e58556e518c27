"""Settings against each other on the whole system, their windows in turn (`python -m bench.ab`).

The 2-core VM's host drifts by 5-25% within an hour, often in one direction (docs/speed.md), so one window of
each setting compares the hours as much as the settings. This runs every arm's window in a round, each round in
the order reversed from the one before (two arms over two rounds: A B B A), and compares the arms two ways:

- on their means over all rounds, where a drift linear in time cancels out;
- round by round (each arm against the first arm's window in the same round, next to it in time): how many
  rounds put it above the first arm, and a two-sided sign test's p of as many or more rounds on one side by
  chance (two rounds can never say less than 0.5; eight that all agree, 0.008).

Beside frames/s it prints what drifts less than they do: the CPU all services spend an agent step, the learner's
and the actors' share of it, the actors' inference a loop, and the share of the window the learner's busiest
thread waited for a core (its neighbours holding both). With --stage learner or --stage inference it
compares the arms on that stage alone instead (bench.throughput's learner step or acting step, every arm's built
in this process on one core), in blocks of a second or so of CPU taking turns the same way: samples per CPU
second, where a setting's cost shows without the rest of the system's noise. Figures, never assertions. Each arm is
a label and its settings as --set takes them; settings every arm shares go in --set. A label of LABEL@DIR runs that
arm's system from another checkout of lbc (e.g. a `git worktree` of the commit before a change, with its generated
`lbcproto/`): its services import that checkout's code, with this one's virtual environment (--stage system only):

    python -m bench.ab --preset impala --actors 2 --arm off:actor.frame_ring=false --arm on:actor.frame_ring=true
    python -m bench.ab --preset impala --stage inference --rounds 8 --arm off:actor.frame_ring=false --arm on:
    git worktree add /tmp/before HEAD~1 && cp -r lbcproto /tmp/before/
    python -m bench.ab --preset cpu --actors 1 --rounds 4 --arm before@/tmp/before: --arm after:
"""

from __future__ import annotations

import argparse
import json
import math
import re
import signal
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.cpu_use import cores_by_service, ms_by_role
from bench.system import end_to_end
from bench.throughput import allocate_as_services, describe_machine, preset_config, stage_figures, stage_step
from lbc.config import PRESETS


@dataclass(frozen=True)
class Arm:
    """One side of the comparison: its label, the settings it adds to the shared ones, and the checkout of lbc its
    system runs from (None: this one)."""
    label: str
    settings: tuple[str, ...]
    checkout: Path | None = None


# a comma starts the next setting only where a key= follows it, so a value may hold commas ("(1,2,3)")
_NEXT_SETTING = re.compile(r",(?=\s*[A-Za-z_][\w.]*=)")


def parse_arm(text: str) -> Arm:
    """`label:key=value,key=value` (no settings after the colon: the preset as it is), or `label@dir:...` for an
    arm whose system runs from the checkout of lbc at dir, as an Arm."""
    label, colon, rest = text.partition(":")
    label, at, where = label.partition("@")
    if not colon or not label.strip() or (at and not where.strip()):
        raise ValueError(f"an arm is LABEL[@DIR]:KEY=VALUE,KEY=VALUE (the settings may be empty), not {text!r}")
    settings = tuple(s.strip() for s in _NEXT_SETTING.split(rest) if s.strip())
    bad = [s for s in settings if "=" not in s]
    if bad:
        raise ValueError(f"arm {label!r}: settings are KEY=VALUE, not {', '.join(map(repr, bad))}")
    checkout = Path(where.strip()) if at else None
    if checkout is not None and not (checkout / "lbc" / "launch.py").is_file():
        raise ValueError(f"arm {label!r}: {checkout} is not a checkout of lbc (no lbc/launch.py there)")
    if checkout is not None and not (checkout / "lbcproto" / "lbc_pb2.py").is_file():
        raise ValueError(f"arm {label!r}: {checkout} has no generated lbcproto/ (make proto there, or copy it)")
    return Arm(label.strip(), settings, checkout)


def schedule(arms: int, rounds: int) -> list[tuple[int, int]]:
    """(round, arm) of each window in the order they run: every arm once a round, odd rounds in reverse, so
    that over an even number of rounds each arm's mean time is the same and a linear drift cancels."""
    order = []
    for r in range(rounds):
        arm_order = range(arms) if r % 2 == 0 else reversed(range(arms))
        order += [(r, a) for a in arm_order]
    return order


def window_figures(e2e: dict, frames_per_step: int) -> dict[str, float]:
    """What bench.ab compares of one end_to_end window: frames/s, the frames/s the learner's steps kept up with,
    and CPU milliseconds an agent step (all services, the learner, the actors but the evaluator, the evaluator:
    what its evaluations cost, in proportion to how many it finishes a frame), with the actors' inference a loop
    where they ran it locally, the share of the window the learner's busiest thread waited for a core (runnable,
    its neighbours on both: bench.cpu_use.busiest_threads), and the cores the hypervisor took in the window (steal
    time: a round whose arm ran while the host took more is slower for it)."""
    agent_steps = e2e["frames_per_s"] / frames_per_step
    ms = ms_by_role(cores_by_service(*e2e["cpu"], e2e["seconds"]), agent_steps or float("nan"))
    return {"frames_per_s": e2e["frames_per_s"], "cpu_ms_per_agent_step": ms["all services"],
            "learner_ms_per_agent_step": ms["learner"], "actors_ms_per_agent_step": ms["actors"],
            "evaluator_ms_per_agent_step": ms["evaluator"],
            "inference_ms_per_loop": e2e["actor_loop_ms"].get("inference", float("nan")),
            "learner_core_wait": e2e.get("threads", {}).get("learner_svc", (float("nan"),) * 2)[1],
            "stolen_cores": e2e["stolen_cores"]}


# what a window of the whole system compares (window_figures), and a stage alone (stage_figures); the first of
# each is the headline, higher better, that the rounds resolve
SYSTEM_FIGURES = {"frames_per_s": ("frames/s", "{:,.0f}"), "cpu_ms_per_agent_step": ("CPU ms/step", "{:.3f}"),
                  "learner_ms_per_agent_step": ("learner", "{:.3f}"), "actors_ms_per_agent_step": ("actors", "{:.3f}"),
                  "evaluator_ms_per_agent_step": ("evaluator", "{:.3f}"),
                  "inference_ms_per_loop": ("inference ms/loop", "{:.2f}"),
                  "learner_core_wait": ("learner waits for a core", "{:.2f}"), "stolen_cores": ("stolen", "{:.2f}")}
STAGE_FIGURES = {"samples_per_cpu_s": ("samples/CPU-s", "{:,.0f}"), "cpu_ms_per_step": ("CPU ms/step", "{:.2f}")}


def sign_test_p(above: int, decided: int) -> float:
    """Two-sided sign test: the chance that `decided` fair coin tosses put `above` or a count as far from half on
    one side (1.0 without a decided round)."""
    if decided == 0:
        return 1.0
    tail = min(above, decided - above)
    return min(1.0, 2 * sum(math.comb(decided, k) for k in range(tail + 1)) / 2 ** decided)


def summarise(labels: list[str], windows: list[dict], figures: tuple[str, ...]) -> dict:
    """The arms compared: each of `figures`' mean per arm and its ratio to the first arm's mean, and the first
    figure (the headline) arm against the first arm round by round. `windows` hold "round", "arm" (an index
    into labels) and the figures. "above" counts the rounds where the headline beat the first arm's, of
    "decided" (rounds with a ratio other than 1), and "sign_p" is sign_test_p of them."""
    headline = figures[0]
    by_arm = {a: [w for w in windows if w["arm"] == a] for a in range(len(labels))}
    means = {labels[a]: {k: statistics.fmean(w[k] for w in ws) for k in figures} for a, ws in by_arm.items() if ws}
    base = means[labels[0]]
    firsts = {w["round"]: w for w in by_arm[0]}
    arms = {}
    for a, label in enumerate(labels):
        if label not in means:
            continue
        rounds = [w[headline] / firsts[w["round"]][headline] for w in by_arm[a] if w["round"] in firsts]
        above, decided = sum(r > 1 for r in rounds), sum(r != 1 for r in rounds)
        arms[label] = {"means": means[label],
                       "ratio_of_means": {k: means[label][k] / base[k] if base[k] else float("nan")
                                          for k in figures},
                       "ratio_by_round": rounds, "above": above, "decided": decided,
                       "sign_p": sign_test_p(above, decided)}
    return {"labels": labels, "headline": headline, "arms": arms}


def summary_lines(summary: dict, figures: dict[str, tuple[str, str]]) -> list[str]:
    """summarise's comparison as a table, a row per arm, the first arm the base: each figure's mean, and for the
    headline its ratio to the base's on the means and round by round, the rounds above the base and the sign test's
    p."""
    labels, headline = summary["labels"], summary["headline"]
    columns = [(k, header, fmt) for k, (header, fmt) in figures.items()]
    width = {k: max(len(header), 9) for k, header, _ in columns}
    by_round_width = max([8, *(7 * len(arm["ratio_by_round"]) for arm in summary["arms"].values())])
    rows = ["  ".join([f"{'arm':12}", f"{columns[0][1]:>{width[headline]}}", f"{'x first':>7}",
                       f"{'by round':{by_round_width}}", *(f"{header:>{width[k]}}" for k, header, _ in columns[1:])])]
    for label in labels:
        arm = summary["arms"].get(label)
        if arm is None:
            continue
        first = label == labels[0]
        by_round = "(base)" if first else ", ".join(f"{r:.3f}" for r in arm["ratio_by_round"])
        verdict = "" if first else f"  {arm['above']} of {arm['decided']} rounds above, sign test p {arm['sign_p']:.2f}"
        cells = [f"{fmt.format(arm['means'][k]):>{width[k]}}" for k, _, fmt in columns]
        rows.append("  ".join([f"{label:12}", cells[0], f"{arm['ratio_of_means'][headline]:7.3f}",
                               f"{by_round:{by_round_width}}", *cells[1:]]) + verdict)
    return rows


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    parser.add_argument("--game", default=None, help="default: the preset's own")
    parser.add_argument("--arm", dest="arms", action="append", required=True, metavar="LABEL:KEY=VALUE,...",
                        help="an arm to compare (two or more; the first is the base the others are read against)")
    parser.add_argument("--stage", choices=("system", "learner", "inference"), default="system",
                        help="system: the whole system under the launcher, a window an arm a round; learner or "
                             "inference: that stage alone on one core, a block of CPU time an arm a round")
    parser.add_argument("--actors", type=int, help="actor processes in every window (--stage system)")
    parser.add_argument("--rounds", type=int, help="windows or blocks per arm; even, so that a linear drift "
                                                   "cancels (default 2 for the system, 8 for a stage)")
    parser.add_argument("--seconds", type=float, default=120.0, help="each window's length (--stage system)")
    parser.add_argument("--warmup", type=float, default=30.0,
                        help="seconds of the running system discarded before each window, from when every service "
                             "answers at its metrics port (--stage system)")
    parser.add_argument("--block-seconds", type=float, default=2.0, help="CPU seconds of each block (a stage)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="settings every arm shares")
    parser.add_argument("--out", type=Path, metavar="DIR", help="also write the windows and the summary to DIR/ab.json")
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    try:
        arms = [parse_arm(a) for a in args.arms]
    except ValueError as exc:
        parser.error(str(exc))
    labels = [a.label for a in arms]
    if len(arms) < 2 or len(set(labels)) != len(labels):
        parser.error("give two or more arms with different labels")
    system = args.stage == "system"
    if system and args.actors is None:
        parser.error("--stage system needs --actors")
    if not system and any(a.checkout is not None for a in arms):
        parser.error("an arm from another checkout (LABEL@DIR) runs the whole system: --stage system")
    args.rounds = args.rounds if args.rounds is not None else (2 if system else 8)
    if args.rounds < 1:
        parser.error("--rounds must be 1 or more")
    try:   # every arm's settings validated before the first window, not an hour into the run
        configs = [preset_config(args.preset, args.game, [*args.overrides, *a.settings]) for a in arms]
    except ValueError as exc:
        parser.error(str(exc))
    allocate_as_services("bench.ab")
    signal.signal(signal.SIGTERM, signal.default_int_handler)   # a kill stops the system under test too
    game = configs[0][1]
    order = schedule(len(arms), args.rounds)
    what = (f"{args.actors} actor(s); {len(order)} windows of {args.seconds:.0f} s after {args.warmup:.0f} s, about "
            f"{len(order) * (args.seconds + args.warmup + 15) / 60:.0f} min" if system else
            f"the {args.stage} stage alone on one core; {len(order)} blocks of {args.block_seconds:g} CPU-s")
    print(f"machine: {describe_machine()}; preset {args.preset}, game {game}, {what}", flush=True)
    figures = SYSTEM_FIGURES if system else STAGE_FIGURES
    if system:
        frames_per_step = configs[0][0].env.frames_per_step
    else:
        torch.set_num_threads(1)
        steps = [stage_step(cfg, args.stage) for cfg, _ in configs]
    windows = []
    for i, (r, a) in enumerate(order):
        if system:
            e2e = end_to_end(args.preset, game, args.actors, args.seconds, args.warmup,
                             [*args.overrides, *arms[a].settings], cwd=arms[a].checkout)
            w = window_figures(e2e, frames_per_step)
        else:
            w = stage_figures(*steps[a], args.block_seconds)
        windows.append({"round": r, "arm": a, "time": time.time(), **w})
        print(f"[{i + 1}/{len(order)}] round {r} {arms[a].label}: "
              + ", ".join(f"{header} {fmt.format(w[k])}" for k, (header, fmt) in figures.items()), flush=True)
    summary = summarise(labels, windows, tuple(figures))
    for line in summary_lines(summary, figures):
        print(line, flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        record = {"machine": describe_machine(), "preset": args.preset, "game": game, "stage": args.stage,
                  "actors": args.actors, "shared": args.overrides, "arms": {a.label: list(a.settings) for a in arms},
                  "checkouts": {a.label: str(a.checkout) for a in arms if a.checkout is not None},
                  "windows": windows, "summary": summary}
        (args.out / "ab.json").write_text(json.dumps(record, indent=1))
        print(f"wrote {args.out / 'ab.json'}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
