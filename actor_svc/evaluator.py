"""The evaluator (`python -m actor_svc --mode eval`): an actor that plays a fixed evaluation policy on
its own games and reports scores, and never sends anything to replay or the bandit.

Every `eval.every_versions` parameter versions it takes the newest parameters and, without pulling
again until it is done, plays `eval.episodes` whole games on `eval.num_envs` environments seeded apart
from every actor, once: later evaluations start new games where the games' random numbers are (the papers'
protocol: up to 30 no-ops, the 108,000-frame cap, the full action set; sticky actions on request). Each
evaluation is one line of `runs/<name>/eval.jsonl` and a set of Prometheus gauges: raw mean, median and std,
HNS, HWRNS, SABER and whether the mean beats the human world record.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from prometheus_client import Counter, Gauge

from actor_svc.peers import ParamPuller
from lbc.acting import CoreInputs, acting_agent, evaluation_policy, evaluation_probs, forward, precision_of
from lbc.agents import Acting, make_acting
from lbc.behaviour import sample_actions
from lbc.config import Config, EnvConfig
from lbc.devices import pick_device
from lbc.envs import IndependentEnvs, VectorEnvs
from lbc.nets import NetOutput, policy_net
from lbc.scores import summarise

log = logging.getLogger("evaluator")

EVALS = Counter("lbc_eval_evaluations_total", "Evaluations finished")
EVAL_EPISODES = Counter("lbc_eval_episodes_total", "Evaluation episodes finished")
EVAL_FRAMES = Counter("lbc_eval_frames_total", "Emulator frames played by the evaluator")
EVAL_VERSION = Gauge("lbc_eval_param_version", "Parameter version of the last evaluation")
EVAL_SCORE = Gauge("lbc_eval_score", "Raw score of the last evaluation", ["stat"])
EVAL_NORMALISED = Gauge("lbc_eval_normalised_score", "Normalised mean score of the last evaluation "
                        "(hns, hwrns, saber; absent outside the Atari table)", ["measure"])
EVAL_HWRB = Gauge("lbc_eval_world_record_broken", "1 when the last evaluation's mean beats the human world record")
EVAL_SECONDS = Gauge("lbc_eval_seconds", "Wall time of the last evaluation")


def eval_env_config(cfg: Config) -> EnvConfig:
    """The actors' environment with the evaluation protocol: sticky actions only when asked (Atari; other
    kinds are evaluated as they are played, e.g. MinAtar with its sticky actions)."""
    if cfg.env.kind != "atari":
        return cfg.env
    return cfg.env.model_copy(update={"repeat_action_probability": 0.25 if cfg.eval.sticky_actions else 0.0})


class EpisodeQuota:
    """Which finished episodes count: the first `quota[e]` of each environment, the quotas splitting
    `episodes` as evenly as possible. Counting the first episodes of every environment, rather than the
    first `episodes` to finish anywhere, keeps long games from being under-counted."""

    def __init__(self, episodes: int, num_envs: int) -> None:
        self.quota = np.array([len(part) for part in np.array_split(np.arange(episodes), num_envs)])
        self.scores: list[list[float]] = [[] for _ in range(num_envs)]

    def record(self, env: int, score: float) -> None:
        if len(self.scores[env]) < self.quota[env]:
            self.scores[env].append(score)

    def playing(self) -> np.ndarray:
        """[E] bool: the environments whose count is not complete."""
        return np.array([len(s) < q for s, q in zip(self.scores, self.quota, strict=True)])

    @property
    def done(self) -> bool:
        return not self.playing().any()

    def all_scores(self) -> list[float]:
        return [score for env in self.scores for score in env]


def evaluation_envs(cfg: Config, num_envs: int, seed: int) -> IndependentEnvs:
    """The games an evaluation plays (eval_env_config's protocol), each stepped only while its episodes count."""
    return IndependentEnvs(eval_env_config(cfg), num_envs, seed)


def play(cfg: Config, net: torch.nn.Module, envs: IndependentEnvs | VectorEnvs, episodes: int, seed: int | None,
         policy: str, acting: Acting, generator: torch.Generator | None = None,
         on_frame: Callable[[np.ndarray, np.ndarray], None] | None = None,
         stop: threading.Event | None = None) -> tuple[list[float], int] | None:
    """Play `episodes` whole games with the evaluation policy from fresh resets, seeded by `seed` (None: each
    game's random numbers going on from the last play, envs.restart()); (scores, the agent steps the
    games took), or None when `stop` (a threading.Event) is set first. With IndependentEnvs (evaluation_envs) a
    game whose episodes are counted (EpisodeQuota) is neither stepped nor read by the policy network again
    (forward_rows), and every step still draws the same random numbers, whichever games are left; a vector
    (`lbc play`'s one game) steps all its games. `acting` (lbc.agents.make_acting) supplies what the family's
    network reads besides the frame. `on_frame(obs, actions)` (optional) sees every step, e.g. to record a
    video."""
    num_envs = envs.num_envs
    independent = isinstance(envs, IndependentEnvs)
    quota = EpisodeQuota(episodes, num_envs)
    obs = envs.reset(seed=seed) if seed is not None else envs.restart()
    inputs = CoreInputs.start(net, num_envs)
    acting.for_evaluation()
    returns = np.zeros(num_envs)
    steps = 0
    while (playing := quota.playing()).any():
        if stop is not None and stop.is_set():
            return None
        extra = acting.extra_inputs(acting.observe(obs, inputs.reset))
        out = (forward_rows(net, obs, inputs, extra, np.flatnonzero(playing)) if independent and not playing.all()
               else forward(net, obs, inputs, extra))
        actions, _ = sample_actions(evaluation_probs(cfg, out, policy), generator)
        action_np = actions.numpy()
        if on_frame is not None:
            on_frame(obs, action_np)
        result = envs.step(action_np, playing) if independent else envs.step(action_np)
        returns += result.reward
        for e in np.flatnonzero(result.done):
            quota.record(int(e), float(returns[e]))
            returns[e] = 0.0
        obs = result.obs
        inputs.advance(action_np, result.reward, result.done, out.state)
        steps += int(playing.sum()) if independent else num_envs
    return quota.all_scores(), steps


def forward_rows(net: torch.nn.Module, obs: np.ndarray, inputs: CoreInputs, extra: torch.Tensor | None,
                 rows: np.ndarray) -> NetOutput:
    """lbc.acting.forward for the environments at `rows` alone, laid out for all E: the others' advantages and
    values zero, their recurrent state as it was. The rows' outputs equal those of a pass over all E up to float
    rounding (a smaller batch may sum in another order)."""
    index = torch.as_tensor(rows, device=inputs.state[0].device)
    part = CoreInputs(inputs.prev_action[rows], inputs.prev_reward[rows], inputs.reset[rows],
                      tuple(s[index] for s in inputs.state))
    out = forward(net, obs[rows], part, None if extra is None else extra[:, rows])
    num_envs = len(inputs.reset)
    adv = out.adv.new_zeros((out.adv.shape[0], num_envs, *out.adv.shape[2:]))
    value = out.value.new_zeros((out.value.shape[0], num_envs, *out.value.shape[2:]))
    adv[:, rows], value[:, rows] = out.adv, out.value
    state = tuple(s.clone() for s in inputs.state)
    for whole, new in zip(state, out.state, strict=True):
        whole[index] = new
    return NetOutput(adv=adv, value=value, state=state)


def evaluation_record(cfg: Config, version: int, policy: str, scores: list[float], steps: int,
                      seconds: float) -> dict:
    """One line of eval.jsonl: the version played, the protocol it was played under and the scores'
    summary (lbc.scores.summarise). `frames` are the emulator frames the evaluation itself played."""
    return {"time": time.time(), "version": version, "game": cfg.env.name, "policy": policy,
            "epsilon": cfg.eval.epsilon if policy == "greedy" else None, "sticky_actions": cfg.eval.sticky_actions,
            "repeat_action_probability": eval_env_config(cfg).repeat_action_probability,
            "noop_max": cfg.env.noop_max, "max_episode_frames": cfg.env.max_episode_frames,
            **summarise(cfg.env.name, scores), "scores": scores, "frames": steps * cfg.env.frames_per_step,
            "seconds": seconds}


def append_record(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


def run(cfg: Config, stop: threading.Event, index: int = 0) -> int:
    """The evaluator's loop; returns when `stop` is set."""
    ec = cfg.eval
    game = cfg.env.name
    envs = evaluation_envs(cfg, ec.num_envs, ec.seed)
    spec = envs.spec
    agent = acting_agent(cfg, spec.obs_shape, spec.num_actions, pick_device(cfg.actor.device, "actor.device"))
    net = policy_net(agent)
    acting = make_acting(cfg, agent, ec.num_envs)
    puller = ParamPuller(cfg, f"evaluator-{index}", agent)
    policy = evaluation_policy(cfg)
    generator = torch.Generator().manual_seed(ec.seed)
    out_path = Path(cfg.run_dir) / "eval.jsonl"
    log.info("evaluator up: %s, policy %s (eps %.3g), %d episodes on %d environments every %d versions, "
             "sticky actions %s, inference in %s; results in %s", game, policy, ec.epsilon, ec.episodes, ec.num_envs,
             ec.every_versions, ec.sticky_actions, precision_of(net), out_path)

    last = None
    rounds = 0
    while not stop.is_set():
        # only the version the next evaluation plays is sent: taking each new version as the learner published it
        # cost a blob's transfer, checksums and load every few seconds (about 20 ms of CPU for `impala`'s 4.9 MB)
        wanted = 0 if last is None else last + ec.every_versions
        puller.pull(min_version=wanted)
        if puller.version < wanted:   # also while it holds nothing yet (version -1)
            stop.wait(1.0)
            continue
        version = puller.version
        started = time.monotonic()
        # seeded once: every later evaluation's games go on from their random numbers, as a seeded reset reloads each
        # ALE game's ROM (0.7 s of CPU for 8 games: 13% of an early `impala` evaluation's CPU)
        played = play(cfg, net, envs, ec.episodes, ec.seed if rounds == 0 else None, policy, acting, generator,
                      stop=stop)
        if played is None:
            break
        scores, steps = played
        seconds = time.monotonic() - started
        rounds += 1
        last = version
        record = evaluation_record(cfg, version, policy, scores, steps, seconds)
        append_record(out_path, record)
        EVALS.inc()
        EVAL_EPISODES.inc(len(scores))
        EVAL_FRAMES.inc(record["frames"])
        EVAL_VERSION.set(version)
        EVAL_SECONDS.set(seconds)
        for stat in ("mean", "median", "std"):
            EVAL_SCORE.labels(stat).set(record[stat])
        for measure in ("hns", "hwrns", "saber"):
            if record[measure] is not None:
                EVAL_NORMALISED.labels(measure).set(record[measure])
        if record["hwrb"] is not None:
            EVAL_HWRB.set(float(record["hwrb"]))
        log.info("version %d: mean %.2f median %.2f std %.2f over %d episodes (%.0f s)", version, record["mean"],
                 record["median"], record["std"], len(scores), seconds)
    envs.close()
    return 0
