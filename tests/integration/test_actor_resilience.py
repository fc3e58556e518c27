"""An actor keeps running through the death and restart of each of its peers, and picks up again."""

import pytest

from lbc.presets import CATCH_SIZING
from tests.support import (
    Service,
    endpoint_overrides,
    flat_overrides,
    metric,
    overrides_dict,
    resume_learner,
    wait_for,
    wait_healthy,
)


# agent57 on Catch sizes: NGU's learner resumes with its target network, the actor keeps its own j
# while the bandit that chooses j is away. The lbc family's variant is `extended` (make test-extended,
# docs/decisions.md 47): its learner's resume runs in CI in tests/integration/test_launcher.py, its actor's
# default psi while the bandit is away in tests/integration/test_bandit_service.py, and every catch service
# killed at random moments in tests/integration/test_chaos.py.
@pytest.mark.parametrize("preset, sizing", [
    pytest.param("catch", [], marks=pytest.mark.extended),
    ("agent57", [*flat_overrides(CATCH_SIZING), "ngu.num_mixtures=8"]),
], ids=["lbc-bm", "agent57"])
def test_actor_survives_peer_restarts(tmp_path, preset, sizing):
    overrides = endpoint_overrides(tmp_path / "run") + sizing + ["learner.checkpoint_every=20"]
    o = overrides_dict(overrides)
    bandit = Service("bandit_svc", preset, overrides, tmp_path).start()
    replay = Service("replay_svc", preset, overrides, tmp_path).start()
    learner = Service("learner_svc", preset, overrides, tmp_path).start()
    actor = Service("actor_svc", preset, overrides, tmp_path, "--actor-id", "actor-0").start()
    actor_port = int(o["endpoints.actor_metrics_base"])
    replay_port, learner_port = int(o["endpoints.replay_metrics"]), int(o["endpoints.learner_metrics"])
    services = [actor, learner, replay, bandit]
    try:
        wait_healthy(f"127.0.0.1:{o['endpoints.actor_health_base']}", timeout=60)
        wait_for(lambda: metric(learner_port, "lbc_learner_steps_total") > 30, 90, "learner steps")

        # replay dies: the actor blocks on send but stays up; a new replay gets sequences again
        replay.kill()
        steps = metric(actor_port, "lbc_actor_steps_total")
        replay.start()
        wait_for(lambda: metric(replay_port, "lbc_replay_inserted_total") > 10, 60, "inserts after replay restart")
        assert actor.alive() and metric(actor_port, "lbc_actor_steps_total") > steps

        # bandit dies: episodes continue with the default psi; reports resume when it is back
        bandit.kill()
        wait_for(lambda: metric(actor_port, "lbc_actor_bandit_fallbacks_total") > 0, 30, "fallback psi")
        bandit.start()
        accepted = metric(actor_port, "lbc_actor_bandit_reports_total", result="accepted")
        wait_for(lambda: metric(actor_port, "lbc_actor_bandit_reports_total", result="accepted") > accepted + 5, 60,
                 "reports after bandit restart")

        # learner dies: the actor acts on its last parameters; the new learner resumes the version count
        published = metric(learner_port, "lbc_learner_param_version")
        learner.kill()
        version = metric(actor_port, "lbc_actor_param_version")   # read after the kill: it cannot rise now
        resumed = resume_learner(learner, o, timeout=90)
        # versions never repeat: the resumed learner publishes above everything published before
        assert resumed > max(published, version)
        wait_for(lambda: metric(actor_port, "lbc_actor_param_version") >= resumed, 90, "the new learner's parameters")
        assert actor.alive()
        assert "resumed from" in learner.log()
    finally:
        codes = [s.stop() for s in services]
    assert codes == [0, 0, 0, 0], [s.log()[-2000:] for s in services]
