"""The evaluator against real peers: it plays the parameter version it reports, sends nothing to replay
and survives a learner restart."""

import json

import torch

from actor_svc.evaluator import evaluation_envs, play
from lbc.acting import evaluation_policy
from lbc.agents import make_acting
from lbc.config import load_config
from lbc.nets import build_agent
from tests.support import Service, endpoint_overrides, metric, overrides_dict, resume_learner, wait_for, wait_healthy

EVAL = ["eval.every_versions=1", "eval.episodes=6", "eval.num_envs=3", "learner.checkpoint_every=20"]


def _records(run_dir) -> list[dict]:
    path = run_dir / "eval.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_evaluator_plays_its_version_and_survives_a_learner_restart(tmp_path):
    run_dir = tmp_path / "run"
    overrides = endpoint_overrides(run_dir) + EVAL
    o = overrides_dict(overrides)
    # no actor: the learner publishes its initial parameters (version 0) and never trains
    replay = Service("replay_svc", "catch", overrides, tmp_path).start()
    learner = Service("learner_svc", "catch", overrides, tmp_path).start()
    evaluator = Service("actor_svc", "catch", overrides, tmp_path, "--mode", "eval").start()
    services = [evaluator, learner, replay]
    eval_port, replay_port = int(o["endpoints.eval_metrics"]), int(o["endpoints.replay_metrics"])
    try:
        wait_healthy(o["endpoints.eval_health"], "lbc.v1.Evaluator", timeout=60)
        wait_for(lambda: _records(run_dir), 60, "the first evaluation")
        first = _records(run_dir)[0]
        assert first["version"] == 0 and first["episodes"] == 6 and len(first["scores"]) == 6
        assert first["repeat_action_probability"] == 0.0 and first["sticky_actions"] is False
        assert metric(eval_port, "lbc_eval_param_version") == 0
        assert metric(eval_port, "lbc_eval_score", stat="mean") == first["mean"]

        # the same episodes replayed here with version 0's parameters (the learner's seeded initial
        # network) and the evaluator's seeds give the same scores: it played the version it reports
        cfg = load_config("catch", overrides)
        torch.manual_seed(cfg.learner.seed)
        agent = build_agent(cfg, (1, cfg.env.catch_rows, cfg.env.catch_columns), 3).eval()
        envs = evaluation_envs(cfg, cfg.eval.num_envs, cfg.eval.seed)
        scores, _ = play(cfg, agent, envs, cfg.eval.episodes, cfg.eval.seed, evaluation_policy(cfg),
                         make_acting(cfg, agent, cfg.eval.num_envs),
                         generator=torch.Generator().manual_seed(cfg.eval.seed))
        assert scores == first["scores"]

        # nothing reached replay
        assert metric(replay_port, "lbc_replay_inserted_total") == 0

        # an actor makes the learner train and publish: the evaluator follows the new versions
        services.append(Service("actor_svc", "catch", overrides, tmp_path, "--actor-id", "actor-0").start())
        wait_for(lambda: list((run_dir / "checkpoints").glob("ckpt-*.pt")) and _records(run_dir)[-1]["version"] >= 5,
                 120, "evaluations of trained versions and a checkpoint")
        # the learner dies and comes back from its checkpoint: the evaluator goes on with the newer versions
        learner.kill()
        resumed = resume_learner(learner, o)
        wait_for(lambda: _records(run_dir)[-1]["version"] >= resumed, 120, "an evaluation of the resumed learner")
        assert evaluator.alive()
    finally:
        codes = [s.stop() for s in services]
    assert codes == [0] * len(services), [s.log()[-2000:] for s in services]
    assert "Traceback" not in evaluator.log()
