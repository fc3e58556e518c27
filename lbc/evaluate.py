"""`lbc evaluate RUN`: the evaluator's protocol played on one of a run's checkpoints, during or after the run.

The evaluator scores a version every `eval.every_versions` while the run goes on, so the last periodic
evaluation of a curve falls some way short of its frame budget (Breakout at 5M frames: at 4.5M). `make curve`
therefore runs this once the launcher has stopped: the final checkpoint (the parameters at the budget) plays
`eval.episodes` whole games on `eval.num_envs` environments, exactly as the evaluator plays them
(actor_svc.evaluator.play, the papers' protocol of eval_env_config), and the record is appended to
`RUN/eval.jsonl` with the checkpoint's name, its learner step and `run_frames`: the frames the actors had
played when the checkpoint was written, where `lbc report` places it on the curve.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch

from lbc.run_folder import find_checkpoint, load_config_of, read_jsonl


def frames_when_written(metrics_log: Path, written_at: float) -> float | None:
    """The actors' frames in the last progress record logged no later than `written_at` (Unix time);
    None when the log is missing or starts later."""
    frames = None
    for record in read_jsonl(metrics_log):
        if record.get("time", math.inf) > written_at:
            break
        frames = record.get("frames", frames)
    return frames


def evaluate_cli(args: argparse.Namespace) -> int:
    from actor_svc.evaluator import append_record, evaluation_envs, evaluation_record, play
    from lbc.acting import acting_agent, evaluation_policy
    from lbc.agents import make_acting
    from lbc.nets import policy_net

    run_dir = Path(args.run)
    cfg = load_config_of(run_dir, "evaluate")
    path, state = find_checkpoint(run_dir, args.version, "evaluate")
    ec = cfg.eval
    episodes = ec.episodes if args.episodes is None else args.episodes
    if episodes < 1:
        raise SystemExit(f"lbc evaluate: --episodes must be at least 1, got {episodes}")
    seed = ec.seed if args.seed is None else args.seed
    envs = evaluation_envs(cfg, ec.num_envs, seed)
    agent = acting_agent(cfg, envs.spec.obs_shape, envs.spec.num_actions)
    agent.load_state_dict(state["model"])
    net = policy_net(agent)
    acting = make_acting(cfg, agent, ec.num_envs)
    policy = evaluation_policy(cfg)
    run_frames = frames_when_written(run_dir / "metrics.jsonl", path.stat().st_mtime)
    at = f"{run_frames:,.0f} frames" if run_frames is not None else "frames unknown"
    print(f"evaluating {cfg.env.name} with {path.name} (version {state['version']}, learner step {state['step']}, "
          f"{at}): policy {policy}, {episodes} games on {ec.num_envs} environments", flush=True)
    started = time.monotonic()
    scores, steps = play(cfg, net, envs, episodes, seed, policy, acting, torch.Generator().manual_seed(seed))
    envs.close()
    record = {**evaluation_record(cfg, int(state["version"]), policy, scores, steps, time.monotonic() - started),
              "checkpoint": path.name, "learner_step": int(state["step"]), "run_frames": run_frames}
    if not args.no_record:
        append_record(run_dir / "eval.jsonl", record)
    hns = f", HNS {record['hns']:.3f}" if record.get("hns") is not None else ""
    print(f"mean {record['mean']:.2f} ± {record['std']:.2f}, median {record['median']:.2f} over {len(scores)} "
          f"games{hns} ({record['seconds']:.0f} s)" + ("" if args.no_record else f"; appended to {run_dir}/eval.jsonl"),
          flush=True)
    return 0
