"""What an evaluation costs when the games whose episode is counted stop (decision 75), against a vector that
steps every game until the longest counted episode ends: the same episodes (the scores must agree), the agent
steps played and the process's CPU seconds (ALE's threads included), on a run's checkpoint.

    python -m bench.eval_frames runs/NAME [--version V] [--evaluations 4]

Each evaluation plays the run's protocol (eval.episodes on eval.num_envs games, evaluation seed + i, as the
evaluator's i-th round), once each way, the two taking turns. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

import torch

from actor_svc.evaluator import eval_env_config, evaluation_envs, play
from bench.throughput import allocate_as_services, describe_machine
from lbc.acting import acting_agent, evaluation_policy
from lbc.agents import make_acting
from lbc.envs import env_spec, make_envs
from lbc.nets import policy_net
from lbc.run_folder import find_checkpoint, load_config_of


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path)
    parser.add_argument("--version", type=int, default=None, help="default: the newest checkpoint")
    parser.add_argument("--evaluations", type=int, default=4)
    args = parser.parse_args()
    allocate_as_services("bench.eval_frames")
    torch.set_num_threads(1)   # the evaluator's share of a machine: one thread of inference
    cfg = load_config_of(args.run, "bench.eval_frames")
    path, state = find_checkpoint(args.run, args.version, "bench.eval_frames")
    ec = cfg.eval
    spec = env_spec(cfg.env)
    agent = acting_agent(cfg, spec.obs_shape, spec.num_actions)
    agent.load_state_dict(state["model"])
    net = policy_net(agent)
    policy = evaluation_policy(cfg)
    print(describe_machine())
    print(f"{cfg.env.name}, {path.name} (version {state['version']}), policy {policy}: {ec.episodes} episodes on "
          f"{ec.num_envs} games, one inference thread")
    print("| evaluation | scores agree | agent steps: every game / counted games | CPU s: every game / counted games |")
    print("| ---: | --- | --- | --- |")
    totals = {"vector": [0, 0.0], "independent": [0, 0.0]}
    for i in range(args.evaluations):
        seed = ec.seed + i
        played = {}
        for way in (("vector", "independent") if i % 2 == 0 else ("independent", "vector")):
            envs = (make_envs(eval_env_config(cfg), ec.num_envs, seed) if way == "vector"
                    else evaluation_envs(cfg, ec.num_envs, seed))
            acting = make_acting(cfg, agent, ec.num_envs)
            cpu, wall = _cpu_seconds(), time.perf_counter()
            scores, steps = play(cfg, net, envs, ec.episodes, seed, policy, acting, torch.Generator().manual_seed(seed))
            cpu = _cpu_seconds() - cpu
            envs.close()
            played[way] = (scores, steps, cpu, time.perf_counter() - wall)
            totals[way][0] += steps
            totals[way][1] += cpu
        (s_v, n_v, c_v, _), (s_i, n_i, c_i, _) = played["vector"], played["independent"]
        print(f"| {i} | {'yes' if s_v == s_i else f'NO: {s_v} / {s_i}'} | {n_v:,} / {n_i:,} "
              f"({n_i / n_v:.2f}) | {c_v:.1f} / {c_i:.1f} ({c_i / c_v:.2f}) |", flush=True)
    (n_v, c_v), (n_i, c_i) = totals["vector"], totals["independent"]
    print(f"| all | | {n_v:,} / {n_i:,} ({n_i / n_v:.2f}) | {c_v:.1f} / {c_i:.1f} ({c_i / c_v:.2f}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
