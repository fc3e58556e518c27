"""The learner process's ParameterService over real gRPC: version-aware pulls, guarded pushes."""

import grpc
import pytest

from lbc.config import load_config
from lbc.envs import env_spec
from lbc.nets import build_net
from lbc.params import load_blob, to_blob
from lbc.peers import ParameterClient
from tests.support import Service, endpoint_overrides, overrides_dict, wait_healthy


@pytest.fixture
def learner(tmp_path):
    overrides = endpoint_overrides(tmp_path / "run")
    svc = Service("learner_svc", "catch", overrides, tmp_path).start()
    address = overrides_dict(overrides)["endpoints.params"]
    wait_healthy(address, "lbc.v1.ParameterService")
    yield svc, address
    assert svc.stop() == 0, svc.log()


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
    version, blob = client.pull(0)
    assert version == 5
    fresh = build_net(cfg, spec.obs_shape, spec.num_actions)
    load_blob(fresh, blob)
    assert all(float(p.detach().mean()) == pytest.approx(0.5) for p in fresh.parameters())
    client.close()


def test_bad_pushes_are_refused_and_service_survives(learner):
    svc, address = learner
    client = ParameterClient(address, "test", 5.0)
    reply = client.push(9, b"definitely not safetensors")
    assert not reply.accepted and "safetensors" in reply.reason
    cfg = load_config("catch", ["net.hidden=32"])
    spec = env_spec(cfg.env)
    reply = client.push(9, to_blob(build_net(cfg, spec.obs_shape, spec.num_actions)))
    assert not reply.accepted and "shape" in reply.reason
    assert client.pull(-1)[0] == 0
    with pytest.raises(grpc.RpcError):
        ParameterClient("127.0.0.1:1", "test", 0.5).pull(-1)
    assert svc.alive()
