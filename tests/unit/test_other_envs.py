"""Gymnasium environments (env.kind=gymnasium) and MinAtar (env.kind=minatar) behind lbc's vector-environment
contract: shapes and dtypes, same-step resets, the frame cap, and clear errors for what lbc cannot train."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from pydantic import ValidationError

from lbc.config import MINATAR_CHANNELS, load_config
from lbc.envs import GymnasiumEnvs, MinAtarEnvs, env_spec, make_envs
from lbc.nets import TORSOS, build_net
from lbc.sequences import sequence_layout
from lbc.torsos import TORSO_NAMES, resolve_torso


def _cfg(*overrides: str, preset: str = "cpu"):
    return load_config(preset, list(overrides))


def test_cartpole_is_a_float_vector_with_same_step_resets():
    cfg = _cfg("env.kind=gymnasium", "env.id=CartPole-v1", "net.torso=auto")
    spec = env_spec(cfg.env)
    assert (spec.obs_shape, spec.num_actions, spec.obs_dtype) == ((4,), 2, "float32")
    assert sequence_layout(cfg)["obs"] == ("float32", (cfg.sequence.total + 1, 4))
    assert resolve_torso(cfg.net.torso, spec.obs_shape) == "mlp"
    envs = make_envs(cfg.env, 3, seed=0)
    assert isinstance(envs, GymnasiumEnvs)
    obs = envs.reset()
    assert obs.shape == (3, 4) and obs.dtype == np.float32
    ends = 0
    for _ in range(60):                           # pushing left only: the pole falls within ~10 steps
        result = envs.step(np.zeros(3, np.int64))
        assert result.obs.shape == (3, 4) and result.reward.dtype == np.float32
        if result.done.any():
            ends += int(result.done.sum())
            # the observation that comes with an end is already the next episode's first (CartPole starts
            # within +-0.05 on every coordinate), as Atari and Catch give it
            assert np.abs(result.obs[result.done]).max() <= 0.05
            assert not result.truncated[result.done].any() and not result.life_lost.any()
    assert ends >= 3
    envs.close()


def test_the_networks_read_vectors_as_they_come():
    cfg = _cfg("env.kind=gymnasium", "env.id=CartPole-v1", "net.torso=auto", "net.hidden=32", "net.lstm=32")
    net = build_net(cfg, (4,), 2)
    obs = torch.tensor([[[0.5, -2.0, 0.1, 3.0]]])             # [T, B, 4]
    out = net(obs, torch.zeros(1, 1, dtype=torch.int64), torch.zeros(1, 1), torch.ones(1, 1, dtype=torch.bool),
              net.initial_state(1))
    assert out.adv.shape == (1, 1, cfg.num_policies, 2)
    assert torch.equal(net.torso_input(obs[0]), obs[0])       # not scaled as pixels: 3.0 stays 3.0


def test_gymnasium_pixels_go_channels_first():
    spec = env_spec(_cfg("env.kind=gymnasium", "env.id=ale_py:ALE/Pong-v5").env)
    assert (spec.obs_shape, spec.num_actions, spec.obs_dtype) == ((3, 210, 160), 6, "uint8")
    envs = make_envs(_cfg("env.kind=gymnasium", "env.id=ale_py:ALE/Pong-v5").env, 2, seed=0)
    obs = envs.reset()
    assert obs.shape == (2, 3, 210, 160) and obs.dtype == np.uint8 and obs.flags.c_contiguous
    envs.close()


class _DictObservations(gym.Env):
    observation_space = gym.spaces.Dict({"a": gym.spaces.Box(0, 1, (2,))})
    action_space = gym.spaces.Discrete(2)


gym.register("LbcTestDictObs-v0", entry_point=_DictObservations)


@pytest.mark.parametrize("overrides,message", [
    (["env.kind=gymnasium", "env.id=Pendulum-v1"], "lbc trains discrete actions"),
    (["env.kind=gymnasium", "env.id=LbcTestDictObs-v0"], "observation space is Dict"),
    (["env.kind=gymnasium", "env.id=NoSuchGame-v9"], "Gymnasium cannot make it"),
    (["env.kind=gymnasium"], "needs env.id"),
    (["env.kind=gymnasium", "env.id=CartPole-v1"], "net.torso=small reads images"),
    (["env.kind=minatar", "env.game=pong"], "unknown MinAtar game"),
    (["env.kind=minatar", "env.game=breakout"], "net.torso=small needs images of at least 36x36"),
    (["net.torso=mlp"], "flattens the 4x84x84 observation"),                # Atari frames
    (["net.torso=minatar", "learner.recycle_every=100"], "recycle_every covers the small and mlp"),
])
def test_configuration_names_what_cannot_be_trained(overrides, message):
    with pytest.raises(ValidationError, match=message):
        _cfg(*overrides)


def test_torso_auto_picks_by_the_observation():
    assert resolve_torso("auto", (4, 84, 84)) == "small"
    assert resolve_torso("auto", (4, 10, 10)) == "minatar"
    assert resolve_torso("auto", (8,)) == "mlp"
    assert resolve_torso("deep", (8,)) == "deep"      # an explicit choice is kept (and validated elsewhere)
    # config validation knows the torsos by name (without torch); the networks build exactly those
    assert set(TORSO_NAMES) == set(TORSOS)


def test_minatar_channels_are_the_packages():
    from minatar import Environment

    for game, channels in MINATAR_CHANNELS.items():
        assert Environment(game).state_shape() == [10, 10, channels], game


def test_minatar_boards_resets_and_the_frame_cap():
    cfg = load_config("minatar", ["env.max_episode_frames=7"])
    assert cfg.env.repeat_action_probability == 0.1 and cfg.env.frames_per_step == 1
    envs = make_envs(cfg.env, 4, seed=3)
    assert isinstance(envs, MinAtarEnvs) and envs.spec.obs_shape == (4, 10, 10) and envs.spec.num_actions == 6
    obs = envs.reset()
    assert obs.shape == (4, 4, 10, 10) and obs.dtype == np.uint8 and set(np.unique(obs)) <= {0, 255}
    assert (obs[:, 0].sum(axis=(1, 2)) == 255).all()      # breakout's channel 0: one paddle cell
    rng = np.random.default_rng(0)
    alive = np.zeros(4, np.int64)
    for _ in range(40):
        result = envs.step(rng.integers(0, 6, 4))
        alive += 1
        assert not (alive > 7).any(), "an episode outlived the frame cap"
        assert (result.truncated <= result.done).all() and not result.life_lost.any()
        assert (result.truncated == (result.done & (alive == 7))).all()
        alive[result.done] = 0
    with pytest.raises(ValueError, match="out of range"):
        envs.step(np.full(4, 6))


def test_minatar_is_reproducible_from_its_seed():
    cfg = load_config("minatar").env
    runs = []
    for _ in range(2):
        envs = make_envs(cfg, 2, seed=5)
        frames = [envs.reset()]
        rng = np.random.default_rng(1)
        frames += [envs.step(rng.integers(0, 6, 2)).obs for _ in range(30)]
        runs.append(np.stack(frames))
    assert np.array_equal(*runs)
    assert not np.array_equal(runs[0][:, 0], runs[0][:, 1])   # the environments are seeded apart


@pytest.mark.parametrize("overrides", [("env.kind=catch", "net.torso=auto"),
                                       ("env.kind=gymnasium", "env.id=CartPole-v1", "net.torso=auto"),
                                       ("env.kind=minatar", "env.game=breakout", "net.torso=auto")])
def test_every_kind_restarts_its_games_where_their_random_numbers_are(overrides):
    """restart (the evaluator's later evaluations): new episodes in every game, the same for the same history of
    seed and actions, and not the seeded start again."""
    cfg = _cfg(*overrides).env
    made = [make_envs(cfg, 3, seed=4) for _ in range(2)]
    firsts = [envs.reset() for envs in made]
    history = [np.random.default_rng(t).integers(0, env_spec(cfg).num_actions, 3) for t in range(7)]
    for envs in made:
        for actions in history:
            envs.step(actions)
    again = [envs.restart() for envs in made]
    np.testing.assert_array_equal(*again)
    for a, b in zip(*[[envs.step(actions).obs for actions in history] for envs in made], strict=True):
        np.testing.assert_array_equal(a, b)
    if cfg.kind == "gymnasium":   # CartPole starts anywhere within +-0.05: a new start is not the seeded one
        assert not np.array_equal(again[0], firsts[0])
    for envs in made:
        envs.close()
