"""The inference service against real peers: it answers each actor with what the learner's published network
computes for that actor's games, serves several actors in one pass, refuses what does not fit, and an actor
waiting on it picks up again when it restarts; the dashboard's row for it shows its passes from a real Prometheus."""

import threading
from pathlib import Path

import numpy as np
import pytest
import torch
import zmq
from prometheus_client import REGISTRY

from actor_svc.remote import REFUSED, REQUEST, RemoteNetwork, request_arrays
from lbc import codec, dashboard
from lbc.acting import CoreInputs, forward
from lbc.config import load_config
from lbc.envs import env_spec
from lbc.nets import build_agent, policy_net
from tests.prometheus import Target, bound_queries, prometheus, promql, wait_for_data
from tests.support import Service, endpoint_overrides, metric, overrides_dict, wait_for, wait_healthy


def _inputs(rng: np.random.Generator, games: int, num_actions: int, state_size: int) -> CoreInputs:
    state = tuple(torch.from_numpy(rng.normal(size=(games, state_size)).astype(np.float32)) for _ in range(2))
    return CoreInputs(rng.integers(0, num_actions, games), rng.normal(size=games).astype(np.float32),
                      rng.random(games) < 0.3, state)


def _dashboard_row_has_data(root: Path, metrics_port: int, client: RemoteNetwork, ask: tuple, stop: threading.Event
                            ) -> None:
    """Every query of lbc.dashboard's central-inference row returns data from a real Prometheus scraping the
    service, and a pass's games are what the one asking actor sends (5 a request, one request a pass)."""
    asking = threading.Event()

    def keep_asking() -> None:
        while not (stop.is_set() or asking.is_set()):
            client.forward(*ask)

    thread = threading.Thread(target=keep_asking)
    thread.start()
    try:
        (root / "prometheus").mkdir()
        target = Target("inference", "lbc-inference-0", "test", metrics_port)
        with prometheus(root / "prometheus", [target], interval="1s") as url:
            exprs = bound_queries(dashboard.panels_by_row(dashboard.build())[dashboard.INFERENCE_ROW], "test", "5s")
            assert len(exprs) == 6
            wait_for_data(url, exprs, 60, interval=1)
            (games,) = promql(url, exprs[2])   # games a pass
            (requests,) = promql(url, exprs[3])
            assert float(games["value"][1]) == pytest.approx(5) and float(requests["value"][1]) == pytest.approx(1)
            (refused,) = promql(url, exprs[5])
            assert refused["metric"] == {"reason": "layout"}
    finally:
        asking.set()
        thread.join(30)


def _timeouts() -> float:
    """This process's actors' requests the service left unanswered (lbc_actor_inference_timeouts_total)."""
    return REGISTRY.get_sample_value("lbc_actor_inference_timeouts_total") or 0.0


def test_inference_service_answers_as_the_published_network_and_survives_a_restart(tmp_path):
    overrides = endpoint_overrides(tmp_path / "run") + ["actor.inference=remote", "inference.max_wait_ms=300",
                                                        "endpoints.rpc_timeout_s=1"]
    o = overrides_dict(overrides)
    # no actor: the learner publishes its initial parameters (version 0) and never trains
    replay = Service("replay_svc", "catch", overrides, tmp_path).start()
    learner = Service("learner_svc", "catch", overrides, tmp_path).start()
    inference = Service("actor_svc", "catch", overrides, tmp_path, "--mode", "infer").start()
    services = [inference, learner, replay]
    port = int(o["endpoints.inference_metrics"])
    stop = threading.Event()
    try:
        wait_healthy(o["endpoints.inference_health"], "lbc.v1.Inference", timeout=60)
        cfg = load_config("catch", overrides)
        spec = env_spec(cfg.env)
        torch.manual_seed(cfg.learner.seed)   # version 0: the learner's seeded initial network
        net = policy_net(build_agent(cfg, spec.obs_shape, spec.num_actions).eval())
        clients = [RemoteNetwork(cfg, f"actor-{i}", spec, net.num_policies, net.lstm_size, stop) for i in range(2)]
        rng = np.random.default_rng(0)
        asks = [(rng.integers(0, 2, (games, *spec.obs_shape), dtype=np.uint8),
                 _inputs(rng, games, spec.num_actions, net.lstm_size)) for games in (3, 5)]

        # two actors at once: each gets its own games' outputs from the published network, in one pass
        answers: list = [None, None]
        start = threading.Barrier(2)

        def ask(i: int) -> None:
            start.wait()
            answers[i] = clients[i].forward(*asks[i])

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        for client, (obs, inputs), out in zip(clients, asks, answers, strict=True):
            want = forward(net, obs, inputs)
            np.testing.assert_allclose(out.adv.numpy(), want.adv.numpy(), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(out.value.numpy(), want.value.numpy(), rtol=1e-5, atol=1e-6)
            for got, expected in zip(out.state, want.state, strict=True):
                np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)
            assert client.version == 0
        assert metric(port, "lbc_inference_requests_total") == 2 and metric(port, "lbc_inference_games_total") == 8
        assert metric(port, "lbc_inference_passes_total") == 1

        # a request for another game's frames is refused, with the reason, and counted
        dealer = zmq.Context.instance().socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(o["endpoints.inference"])
        wrong = request_arrays(np.zeros((2, 1, 4, 4), np.uint8), _inputs(rng, 2, spec.num_actions, net.lstm_size))
        dealer.send_multipart(codec.encode(REQUEST, wrong, sender="test", meta={"id": "7"}))
        assert dealer.poll(10_000)
        refusal = codec.decode(dealer.recv_multipart(), max_bytes=1 << 20)
        dealer.close()
        assert refusal.kind == REFUSED and refusal.meta["id"] == "7" and "'obs'" in refusal.meta["reason"]
        assert metric(port, "lbc_inference_rejected_total", reason="layout") == 1

        # the dashboard's row for the service, over a real Prometheus scraping it while an actor keeps asking
        _dashboard_row_has_data(tmp_path, port, clients[1], asks[1], stop)

        # the service dies: an actor asking meanwhile waits, asks again, and is answered by the next one
        inference.kill()
        timeouts = _timeouts()
        late: list = []
        waiting = threading.Thread(target=lambda: late.append(clients[0].forward(*asks[0])))
        waiting.start()
        wait_for(lambda: _timeouts() > timeouts, 10, "the actor to ask again")
        assert waiting.is_alive()
        inference.start()
        waiting.join(60)
        assert late and np.allclose(late[0].adv.numpy(), answers[0].adv.numpy(), rtol=1e-5, atol=1e-6)
    finally:
        stop.set()
        codes = [s.stop() for s in services]
    assert codes == [0, 0, 0], [s.log()[-2000:] for s in services]
