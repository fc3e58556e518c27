"""The learner process's ParameterService over real gRPC: version-aware pulls, guarded pushes."""

import grpc
import pytest
import torch
from prometheus_client import REGISTRY

from lbc.config import load_config
from lbc.envs import env_spec
from lbc.nets import build_net
from lbc.params import load_blob, to_blob
from lbc.peers import ParameterClient
from tests.support import Service, endpoint_overrides, overrides_dict, wait_healthy


@pytest.fixture
def learner(tmp_path, request):
    overrides = endpoint_overrides(tmp_path / "run") + list(getattr(request, "param", []))
    svc = Service("learner_svc", "catch", overrides, tmp_path).start()
    address = overrides_dict(overrides)["endpoints.params"]
    wait_healthy(address, "lbc.v1.ParameterService")
    yield svc, address
    assert svc.stop() == 0, svc.log()


PUSHES_ON = ["learner.accept_pushes=true"]


def test_by_default_nobody_else_pushes_parameters(learner):
    svc, address = learner
    cfg = load_config("catch")
    spec = env_spec(cfg.env)
    client = ParameterClient(address, "test", 5.0)
    with pytest.raises(grpc.RpcError) as err:
        client.push(2**62, to_blob(build_net(cfg, spec.obs_shape, spec.num_actions)))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert client.pull(-1)[0] == 0 and svc.alive()


@pytest.mark.parametrize("learner", [PUSHES_ON], indirect=True)
def test_pull_push_and_versions(learner):
    svc, address = learner
    cfg = load_config("catch")
    spec = env_spec(cfg.env)
    net = build_net(cfg, spec.obs_shape, spec.num_actions)
    client = ParameterClient(address, "test", 5.0)

    version, blob = client.pull(-1)
    assert version == 0
    load_blob(net, blob)
    assert client.pull(0) is None                      # nothing sent when the caller is current

    for p in net.parameters():
        p.data.fill_(0.5)
    assert client.push(5, to_blob(net)).accepted
    reply = client.push(3, to_blob(net))
    assert not reply.accepted and "not newer" in reply.reason
    assert client.pull(0, min_version=6) is None       # nor when the newest is older than the caller wants
    assert client.pull(-1, min_version=6) is None
    with pytest.raises(grpc.RpcError) as err:
        client.pull(0, min_version=-1)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    version, blob = client.pull(0, min_version=5)
    assert version == 5
    fresh = build_net(cfg, spec.obs_shape, spec.num_actions)
    load_blob(fresh, blob)
    assert all(float(p.detach().mean()) == pytest.approx(0.5) for p in fresh.parameters())
    client.close()


@pytest.mark.parametrize("learner", [PUSHES_ON], indirect=True)
def test_bad_pushes_are_refused_and_service_survives(learner):
    svc, address = learner
    client = ParameterClient(address, "test", 5.0)
    reply = client.push(9, b"definitely not safetensors")
    assert not reply.accepted and "safetensors" in reply.reason
    cfg = load_config("catch", ["net.hidden=32"])
    spec = env_spec(cfg.env)
    reply = client.push(9, to_blob(build_net(cfg, spec.obs_shape, spec.num_actions)))
    assert not reply.accepted and "shape" in reply.reason
    net = build_net(load_config("catch"), spec.obs_shape, spec.num_actions)
    with torch.no_grad():
        next(net.parameters()).fill_(float("nan"))
    reply = client.push(9, to_blob(net))
    assert not reply.accepted and "non-finite" in reply.reason
    assert client.pull(-1)[0] == 0
    with pytest.raises(grpc.RpcError):
        ParameterClient("127.0.0.1:1", "test", 0.5).pull(-1)
    assert svc.alive()


def test_an_actor_refuses_non_finite_parameters_and_keeps_its_last_good_ones():
    """Over real gRPC: version 1 holds NaN; the actor's puller refuses it and goes on with version 0."""
    from actor_svc.peers import ParamPuller
    from lbc.params import shapes
    from lbc.service import grpc_server
    from lbcproto import lbc_pb2_grpc
    from learner_svc.param_server import ParameterServicer, ParameterStore
    from tests.support import free_port

    address = f"127.0.0.1:{free_port()}"
    cfg = load_config("catch", [f"endpoints.params={address}"])
    spec = env_spec(cfg.env)
    good = build_net(cfg, spec.obs_shape, spec.num_actions)
    store = ParameterStore()
    store.set(0, to_blob(good))
    server, _ = grpc_server(address, workers=2)
    lbc_pb2_grpc.add_ParameterServiceServicer_to_server(ParameterServicer(store, shapes(good)), server)
    server.start()
    try:
        actor_net = build_net(cfg, spec.obs_shape, spec.num_actions)
        puller = ParamPuller(cfg, "actor-test", actor_net)
        assert puller.pull() and puller.version == 0
        broken = build_net(cfg, spec.obs_shape, spec.num_actions)
        with torch.no_grad():
            next(broken.parameters()).fill_(float("nan"))
        store.set(1, to_blob(broken))
        refused = REGISTRY.get_sample_value("lbc_actor_param_pulls_total", {"result": "refused"}) or 0.0
        assert puller.pull(min_version=2) and puller.version == 0   # version 1 not wanted: not sent, not refused
        assert REGISTRY.get_sample_value("lbc_actor_param_pulls_total", {"result": "refused"}) in (None, refused)
        assert puller.pull() and puller.version == 0
        assert REGISTRY.get_sample_value("lbc_actor_param_pulls_total", {"result": "refused"}) == refused + 1
        kept = zip(actor_net.state_dict().values(), good.state_dict().values(), strict=True)
        assert all(torch.equal(a, b) for a, b in kept)
    finally:
        server.stop(0)
