"""ReDo (lbc.recycling) against hand-derived scores and the properties Sokar et al. (2023) state."""

import numpy as np
import pytest
import torch
from torch import nn

from lbc.config import load_config
from lbc.envs import env_spec
from lbc.nets import build_net
from lbc.recycling import Link, dormant_scores, recycle


def _tiny() -> tuple[nn.Sequential, list[Link]]:
    net = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 2))
    with torch.no_grad():
        net[0].weight.copy_(torch.tensor([[2.0, 0.0], [0.0, -1.0], [1.0, 0.0]]))
        net[0].bias.zero_()
    return net, [Link(net[0], net[1], net[2].weight)]


def test_scores_are_activity_over_the_layer_mean():
    net, links = _tiny()
    x = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    # |h| per unit: unit 0 -> 2 on both, unit 1 -> 0, unit 2 -> 1; layer mean (2 + 0 + 1) / 3 = 1
    (scores,) = dormant_scores(net, x, links)
    torch.testing.assert_close(scores, torch.tensor([2.0, 0.0, 1.0]))
    assert not net[1]._forward_hooks


def test_recycling_leaves_the_output_and_the_live_units_alone():
    net, links = _tiny()
    optimiser = torch.optim.AdamW(net.parameters(), lr=1e-3)
    x = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.5, 2.0]])
    net(x).sum().backward()
    optimiser.step()
    before_out = net(x).detach()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    scores = dormant_scores(net, x, links)
    assert recycle(links, scores, 0.025, optimiser, nn.Linear.reset_parameters) == [1]
    torch.testing.assert_close(net(x), before_out)                         # outgoing weights zero
    assert not torch.equal(net[0].weight[1], before["0.weight"][1])        # fresh incoming weights
    torch.testing.assert_close(net[0].weight[[0, 2]], before["0.weight"][[0, 2]])
    assert not net[2].weight[:, 1].any()
    torch.testing.assert_close(net[2].weight[:, [0, 2]], before["2.weight"][:, [0, 2]])
    state = optimiser.state[net[0].weight]
    assert not state["exp_avg"][1].any() and not state["exp_avg_sq"][1].any() and state["exp_avg_sq"][0].any()
    assert not optimiser.state[net[2].weight]["exp_avg"][:, 1].any()


@pytest.mark.parametrize("init", ["torch", "orthogonal", "sonnet"])
def test_a_blind_small_torso_sees_again(init):
    cfg = load_config("cpu", [f"net.init={init}"])
    spec = env_spec(cfg.env)
    net = build_net(cfg, spec.obs_shape, spec.num_actions)
    frames = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (64, *spec.obs_shape), dtype=np.uint8))
    with torch.no_grad():
        net.torso.convs[0].bias.fill_(-1e3)   # every first-layer channel dead: nothing downstream fires
    assert net.torso_dead_units(frames)["convs.1"] == 1.0

    def outputs() -> tuple[torch.Tensor, torch.Tensor]:
        out = net(frames.unsqueeze(0), torch.zeros(1, 64, dtype=torch.long), torch.zeros(1, 64),
                  torch.ones(1, 64, dtype=torch.bool), net.initial_state(64))
        return out.adv.detach(), out.value.detach()

    before = outputs()
    # tau = 0: only units silent on every frame, so the output is exactly kept (with tau > 0 a barely
    # active unit's small contribution goes too)
    recycled = net.recycle_dormant(frames, 0.0, None)
    assert recycled["convs.1"] == 16
    assert net.torso_dead_units(frames)["convs.1"] < 0.5
    torch.testing.assert_close(outputs(), before)   # what reads the fresh units reads zeros from them


def test_mlp_features_are_the_first_columns_of_the_core_input():
    cfg = load_config("catch")
    spec = env_spec(cfg.env)
    net = build_net(cfg, spec.obs_shape, spec.num_actions)
    last = net.recycling_links()[-1]
    with torch.no_grad():
        last.layer.bias.fill_(-1e3)
    frames = torch.randint(0, 2, (32, *spec.obs_shape), dtype=torch.uint8) * 255
    before = net.core.input_weight.detach().clone()
    net.recycle_dormant(frames, 0.025, None)
    hidden = cfg.net.hidden
    assert not net.core.input_weight[:, :hidden].any()
    torch.testing.assert_close(net.core.input_weight[:, hidden:], before[:, hidden:])   # actions, reward


def test_recycling_is_refused_for_the_deep_torso():
    with pytest.raises(ValueError, match="recycle_every"):
        load_config("lbc-bm", ["learner.recycle_every=100"])


def test_without_a_core_the_heads_read_the_recycled_features():
    cfg = load_config("impala", ["net.core=feedforward"])
    spec = env_spec(cfg.env)
    net = build_net(cfg, spec.obs_shape, spec.num_actions)
    with torch.no_grad():
        net.torso.fc[0].bias[:10].fill_(-1e3)   # ten features dead on every frame
    frames = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (32, *spec.obs_shape), dtype=np.uint8))
    before = net.heads.weight.detach().clone()
    recycled = net.recycle_dormant(frames, 0.0, None)["fc.1"]
    zeroed = ~net.heads.weight.detach().any(0)          # the heads stop reading each recycled feature
    assert recycled >= 10 and int(zeroed.sum()) == recycled and bool(zeroed[:10].all())
    torch.testing.assert_close(net.heads.weight[:, ~zeroed], before[:, ~zeroed])
