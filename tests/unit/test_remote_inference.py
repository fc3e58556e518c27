"""Central inference's pure parts: one pass over several actors' games gives each actor what its own pass
would, and the wire refuses what does not fit the network."""

import numpy as np
import pytest
import torch

from actor_svc.inference_server import batched_forward, input_buffers, padded_games
from actor_svc.remote import check_message, check_request, reply_layout, request_arrays, request_layout
from lbc.acting import CoreInputs, forward
from lbc.codec import CodecError
from lbc.config import load_config
from lbc.envs import env_spec
from lbc.nets import build_net


def _request(rng: np.random.Generator, net, spec, games: int) -> dict[str, np.ndarray]:
    obs = rng.integers(0, 256, (games, *spec.obs_shape), dtype=np.uint8)
    state = tuple(torch.from_numpy(rng.normal(size=(games, net.lstm_size)).astype(np.float32)) for _ in range(2))
    inputs = CoreInputs(rng.integers(0, spec.num_actions, games), rng.normal(size=games).astype(np.float32),
                        rng.random(games) < 0.3, state)
    return request_arrays(obs, inputs)


@pytest.mark.parametrize("preset", ["catch", "cpu"])
def test_one_pass_over_several_requests_gives_each_its_own_rows(preset):
    """Requests of 3, 1 and 5 games (states, resets and previous actions drawn at random) in one pass: each
    request's rows equal a pass over that request alone, in float32 up to another batch size's rounding."""
    cfg = load_config(preset, ["actor.precision=fp32"])
    spec = env_spec(cfg.env)
    torch.manual_seed(0)
    net = build_net(cfg, spec.obs_shape, spec.num_actions).eval()
    rng = np.random.default_rng(0)
    requests = [_request(rng, net, spec, games) for games in (3, 1, 5)]
    replies = batched_forward(net, requests)
    # the service joins the requests into buffers it keeps: the same rows
    buffers = input_buffers(request_layout(spec, net.lstm_size), 16, pin=False)
    for reply, kept in zip(replies, batched_forward(net, requests, buffers), strict=True):
        assert all(np.array_equal(reply[name], kept[name]) for name in reply)
    layout = reply_layout(cfg.num_policies, spec.num_actions, net.lstm_size)
    for request, reply in zip(requests, replies, strict=True):
        assert check_message(reply, layout, 8) == len(request["reset"])
        state = (torch.from_numpy(request["h"]), torch.from_numpy(request["c"]))
        alone = forward(net, request["obs"], CoreInputs(request["prev_action"], request["prev_reward"],
                                                        request["reset"], state))
        np.testing.assert_allclose(reply["adv"], alone.adv[0].numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(reply["value"], alone.value[0].numpy(), rtol=1e-4, atol=1e-5)
        for got, want in zip((reply["h"], reply["c"]), alone.state, strict=True):
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5)


def test_a_padded_pass_gives_the_requests_rows_whatever_the_rows_past_them_hold():
    """actor.cuda_graphs in the service: a pass runs over its games padded up to a power of two (at least 32, at
    most the buffers' room), the rows past the requests left as an earlier, larger pass filled them; each
    request still gets the rows an unpadded pass gives (here on the CPU, where forward runs eagerly)."""
    from lbc.lstm_bptt import GraphCache

    assert [padded_games(g, 2048) for g in (1, 32, 33, 100, 1024, 1025)] == [32, 32, 64, 128, 1024, 2048]
    assert padded_games(1500, 2000) == 2000
    cfg = load_config("catch", ["actor.precision=fp32"])
    spec = env_spec(cfg.env)
    torch.manual_seed(0)
    net = build_net(cfg, spec.obs_shape, spec.num_actions).eval()
    rng = np.random.default_rng(2)
    buffers = input_buffers(request_layout(spec, net.lstm_size), 64, pin=False)
    assert not any(b.any() for b in buffers.values())   # valid inputs in every row before any pass
    batched_forward(net, [_request(rng, net, spec, 40)], buffers)   # leaves rows 0-39 of other games behind
    requests = [_request(rng, net, spec, games) for games in (3, 6)]
    graphs = GraphCache()
    for padded, plain in zip(batched_forward(net, requests, buffers, graphs), batched_forward(net, requests),
                             strict=True):
        assert padded["adv"].shape == plain["adv"].shape
        for name in plain:
            np.testing.assert_allclose(padded[name], plain[name], rtol=1e-4, atol=1e-5)
    assert not graphs.graphs   # on the CPU nothing was captured


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a visible GPU")
def test_the_services_pass_replayed_as_cuda_graphs_gives_the_eager_passs_rows():
    """actor.cuda_graphs on the GPU service: passes of 9, 40 and 9 games again by graphs (padded to 32 and 64: two
    graphs, the third pass replaying the first) give the eager GPU pass's rows, with new parameters loaded in
    place between them."""
    from lbc.acting import acting_graphs

    cfg = load_config("cpu", ["actor.precision=fp32", "actor.cuda_graphs=true", "actor.inference=remote",
                              "inference.device=cuda"])
    spec = env_spec(cfg.env)
    torch.manual_seed(0)
    gpu = build_net(cfg, spec.obs_shape, spec.num_actions).eval().cuda()
    graphs = acting_graphs(cfg, torch.device("cuda"))
    rng = np.random.default_rng(3)
    buffers = input_buffers(request_layout(spec, gpu.lstm_size), 128, pin=True)
    for t, sizes in enumerate(((4, 5), (16, 16, 8), (9,))):
        if t == 2:
            gpu.load_state_dict({k: v * 1.5 for k, v in gpu.state_dict().items()})
        requests = [_request(rng, gpu, spec, games) for games in sizes]
        for graphed, eager in zip(batched_forward(gpu, requests, buffers, graphs), batched_forward(gpu, requests),
                                  strict=True):
            # the padded batch is another shape, for which cuBLAS and cuDNN pick other kernels that sum in
            # another order: session 45's H200 found one element of 1,280 off by 1.6e-5 (2.8e-4 of it) at
            # 1e-4/1e-5; a stale parameter or a misplaced row is off by tenths
            for name in eager:
                np.testing.assert_allclose(graphed[name], eager[name], rtol=1e-3, atol=1e-4)
    assert len(graphs.graphs) == 2


def test_the_wire_refuses_what_does_not_fit_the_network():
    cfg = load_config("catch", [])
    spec = env_spec(cfg.env)
    net = build_net(cfg, spec.obs_shape, spec.num_actions).eval()
    layout = request_layout(spec, net.lstm_size)
    good = _request(np.random.default_rng(1), net, spec, 4)
    assert check_message(good, layout, 4) == 4
    with pytest.raises(CodecError, match="5 games in one message; 1 to 4"):
        check_message(_request(np.random.default_rng(1), net, spec, 5), layout, 4)
    with pytest.raises(CodecError, match="'obs'"):   # another game's frames
        check_message({**good, "obs": np.zeros((4, 1, 3, 3), np.uint8)}, layout, 8)
    with pytest.raises(CodecError, match="'h'"):   # another network's state
        check_message({**good, "h": np.zeros((4, net.lstm_size + 1), np.float32)}, layout, 8)
    with pytest.raises(CodecError, match="'reset'"):   # games that disagree
        check_message({**good, "reset": good["reset"][:3]}, layout, 8)
    with pytest.raises(CodecError, match="missing"):
        check_message({k: v for k, v in good.items() if k != "c"}, layout, 8)
    # a previous action the network has no input for would stop the service's pass
    assert check_request(good, layout, 8, spec.num_actions) == 4
    for action in (-1, spec.num_actions):
        bad = {**good, "prev_action": np.full(4, action, np.int64)}
        with pytest.raises(CodecError, match="previous actions outside") as refused:
            check_request(bad, layout, 8, spec.num_actions)
        assert refused.value.reason == "value"


def test_remote_inference_is_refused_for_ngu():
    with pytest.raises(ValueError, match="actor.inference=remote covers the LBC family"):
        load_config("ngu", ["actor.inference=remote"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a visible GPU")
def test_one_pass_on_a_gpu_from_pinned_buffers_gives_the_cpus_rows():
    """The GPU service's pass: inputs joined into page-locked buffers, one copy to the device, the outputs and
    the state back in one copy; the rows are the CPU network's within float32 on another device."""
    cfg = load_config("cpu", ["actor.precision=fp32"])
    spec = env_spec(cfg.env)
    torch.manual_seed(0)
    net = build_net(cfg, spec.obs_shape, spec.num_actions).eval()
    gpu = build_net(cfg, spec.obs_shape, spec.num_actions).eval().cuda()
    gpu.load_state_dict(net.state_dict())
    rng = np.random.default_rng(0)
    requests = [_request(rng, net, spec, games) for games in (16, 16, 7)]
    buffers = input_buffers(request_layout(spec, net.lstm_size), 64, pin=True)
    assert torch.from_numpy(buffers["obs"]).is_pinned()
    for on_gpu, on_cpu in zip(batched_forward(gpu, requests, buffers), batched_forward(net, requests), strict=True):
        for name in on_cpu:
            # TF32 convolutions on the GPU: a row in the wrong place would differ by far more
            np.testing.assert_allclose(on_gpu[name], on_cpu[name], rtol=2e-2, atol=2e-3)


def test_a_local_run_with_central_inference_checks_the_services_ports_too():
    from lbc.config import endpoints_from_base
    from lbc.preflight import local_ports

    inference = {"endpoints.inference", "endpoints.inference_health", "endpoints.inference_metrics"}
    remote = local_ports(load_config("catch", [*endpoints_from_base(41000), "actor.inference=remote"]), actors=3)
    assert inference <= set(remote) and len(set(remote.values())) == len(remote)   # one port base, no collision
    assert not inference & set(local_ports(load_config("catch", endpoints_from_base(41000)), actors=3))
