import pytest
import torch

from lbc.config import load_config
from lbc.envs import env_spec
from lbc.nets import build_net


def _count(model):
    return sum(p.numel() for p in model.parameters())


def test_small_net_shapes_and_size():
    cfg = load_config("cpu")
    spec = env_spec(cfg.env)
    net = build_net(cfg, spec.obs_shape, spec.num_actions)
    # IMPALA's shallow net is ~1.2M parameters with its LSTM (paper Fig. 3)
    assert 1.0e6 < _count(net) < 1.6e6
    t, b = 3, 2
    out = net(torch.randint(0, 255, (t, b, *spec.obs_shape), dtype=torch.uint8), torch.zeros(t, b, dtype=torch.long),
              torch.zeros(t, b), torch.zeros(t, b, dtype=torch.bool), net.initial_state(b))
    assert out.adv.shape == (t, b, 3, 18) and out.value.shape == (t, b, 3)
    torch.testing.assert_close(out.adv.mean(-1), torch.zeros(t, b, 3), atol=1e-6, rtol=0)   # dueling: mean-zero A


@pytest.mark.slow
def test_deep_net_size():
    cfg = load_config("lbc-bm")
    spec = env_spec(cfg.env)
    net = build_net(cfg, spec.obs_shape, spec.num_actions)
    assert 1.5e6 < _count(net) < 2.5e6


def test_all_heads_in_one_forward_match_per_policy_heads():
    cfg = load_config("catch")
    spec = env_spec(cfg.env)
    net = build_net(cfg, spec.obs_shape, spec.num_actions)
    obs = torch.randint(0, 2, (1, 4, *spec.obs_shape), dtype=torch.uint8) * 255
    out = net(obs, torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4), torch.ones(1, 4, dtype=torch.bool),
              net.initial_state(4))
    w = net.heads.weight.view(cfg.num_policies, spec.num_actions + 1, -1)
    h = out.state[0]
    for i in range(cfg.num_policies):
        raw = h @ w[i].T + net.heads.bias.view(cfg.num_policies, -1)[i]
        torch.testing.assert_close(out.value[0, :, i], raw[:, -1])
        torch.testing.assert_close(out.adv[0, :, i], raw[:, :-1] - raw[:, :-1].mean(-1, keepdim=True))


def test_reset_zeroes_the_recurrent_state():
    cfg = load_config("catch")
    spec = env_spec(cfg.env)
    net = build_net(cfg, spec.obs_shape, spec.num_actions)
    obs = torch.zeros(1, 1, *spec.obs_shape, dtype=torch.uint8)
    args = (obs, torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1))
    junk = (torch.randn(1, cfg.net.lstm), torch.randn(1, cfg.net.lstm))
    with_reset = net(*args, torch.ones(1, 1, dtype=torch.bool), junk)
    fresh = net(*args, torch.zeros(1, 1, dtype=torch.bool), net.initial_state(1))
    torch.testing.assert_close(with_reset.adv, fresh.adv)
