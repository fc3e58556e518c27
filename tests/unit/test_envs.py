"""The ALE protocol of DESIGN §5 on a real game, and the built-in Catch."""

import time

import numpy as np
import pytest

from lbc.config import load_config
from lbc.envs import AtariEnvs, CatchEnvs, IndependentEnvs
from tests.support import assert_same_step, same_play


@pytest.fixture(scope="module")
def pong_cfg():
    return load_config("cpu").env


def test_atari_protocol_shapes_and_raw_rewards(pong_cfg):
    envs = AtariEnvs(pong_cfg, 2, seed=0)
    obs = envs.reset()
    assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
    assert envs.spec.num_actions == 18          # full action set
    rewards = []
    rng = np.random.default_rng(0)
    for _ in range(400):
        res = envs.step(rng.integers(0, 18, 2))
        rewards.append(res.reward)
    rewards = np.concatenate(rewards)
    assert set(np.unique(rewards)) <= {-1.0, 0.0, 1.0} and (rewards != 0).any()
    envs.close()


def test_atari_is_reproducible_from_its_seed(pong_cfg):
    def run(seed):
        envs = AtariEnvs(pong_cfg, 2, seed=seed)
        envs.reset()
        for _ in range(60):
            obs = envs.step(np.full(2, 3)).obs
        envs.close()
        return obs

    np.testing.assert_array_equal(run(5), run(5))


def test_atari_takes_an_actors_seed_beyond_a_c_int(pong_cfg):
    # the third actor of `lbc.launch` ("actor-2") gets base + 2 x 9973 + crc32("actor-2") > 2**31
    from actor_svc.__main__ import actor_seed
    seed = actor_seed(0, 2, "actor-2")
    assert seed >= 2**31
    envs = AtariEnvs(pong_cfg, 2, seed=seed)
    assert envs.reset().shape == (2, 4, 84, 84)
    envs.close()


def test_atari_rejects_actions_outside_the_set(pong_cfg):
    envs = AtariEnvs(pong_cfg, 2, seed=0)
    envs.reset()
    with pytest.raises(ValueError, match="out of range"):
        envs.step(np.array([0, 18]))
    envs.close()


def test_catch_rules_and_optimal_policy():
    cfg = load_config("catch").env
    envs = CatchEnvs(cfg, 64, seed=0)
    obs = envs.reset()
    total, episodes = 0.0, 0
    for _ in range(cfg.catch_rows - 1):
        ball = obs[:, 0, :-1].max(axis=1).argmax(axis=1)
        paddle = obs[:, 0, -1].argmax(axis=1)
        res = envs.step((np.sign(ball - paddle) + 1).astype(np.int64))
        total += res.reward.sum()
        episodes += res.done.sum()
        obs = res.obs
    assert episodes == 64 and total == 64.0    # every ball caught
    res = CatchEnvs(cfg, 64, seed=0)
    res.reset()
    rewards = np.concatenate([res.step(np.ones(64, np.int64)).reward for _ in range(cfg.catch_rows - 1)])
    assert rewards.sum() < 0                     # standing still misses most balls


def test_breakout_reports_life_losses_apart_from_game_over():
    """Life losses come as `life_lost` while the game goes on (env.episodic_life turns them into learning
    ends in the actor); a game over is `done` and never also a life loss."""
    cfg = load_config("cpu", ["env.game=breakout", "env.num_envs=2"]).env
    envs = AtariEnvs(cfg, 2, seed=3)
    envs.reset()
    rng = np.random.default_rng(0)
    lost = dones = 0
    for _ in range(1500):
        result = envs.step(rng.integers(0, 18, 2))
        assert not (result.life_lost & result.done).any()
        lost += int(result.life_lost.sum())
        dones += int(result.done.sum())
    envs.close()
    assert dones >= 1 and lost >= 4 * dones   # five lives: four losses before each game over


def test_independent_games_play_a_vectors_frames_and_idle_where_told():
    """IndependentEnvs' game i is a vector's game i (same seed, same actions, same frames); a game left out of a
    step keeps its frame, with no reward and no end, and later goes on from where it stopped."""
    cfg = load_config("cpu", ["env.game=breakout"]).env
    vector, independent = AtariEnvs(cfg, 3, seed=11), IndependentEnvs(cfg, 3, seed=11)
    ends = sum(int(a.done.sum()) for a, _ in same_play(vector, independent, 250, seed=1))
    assert ends >= 1                                     # the same games across a same-step reset
    vector.close()

    # game 1 left out for 30 steps, against a game seeded as game 1 and stepped only when game 1 is
    alone = AtariEnvs(cfg, 1, seed=12)
    rng = np.random.default_rng(2)
    last = independent.reset(seed=11)[1]
    alone.reset(seed=12)
    playing = np.array([True, False, True])
    for t in range(80):
        actions = rng.integers(0, 18, 3)
        idle = 30 <= t < 50
        result = independent.step(actions, playing if idle else None)
        if idle:
            assert result.reward[1] == 0 and not result.done[1] and not result.life_lost[1]
            np.testing.assert_array_equal(result.obs[1], last)
        else:
            np.testing.assert_array_equal(result.obs[1], alone.step(actions[1:2]).obs[0])
        last = result.obs[1]
    independent.close()
    alone.close()


def test_a_restart_starts_new_games_from_where_their_random_numbers_are_without_reseeding():
    """IndependentEnvs.restart (the evaluator's every evaluation but its first): new episodes in every game, the
    same for the same history of seed and actions, at a fraction of a seeded reset's CPU, which reloads each
    ALE game's ROM (0.1 s a game against 5 ms)."""
    cfg = load_config("cpu", ["env.game=pong"]).env
    made = [IndependentEnvs(cfg, 3, seed=5) for _ in range(2)]
    rng = np.random.default_rng(0)
    history = [rng.integers(0, 18, 3) for _ in range(40)]
    restarts, cpu = [], []
    for envs in made:
        envs.reset()
        for actions in history:
            envs.step(actions)
        start = time.process_time()
        restarts.append(envs.restart())
        cpu.append(time.process_time() - start)
    np.testing.assert_array_equal(*restarts)
    steps = [[envs.step(actions) for actions in history] for envs in made]
    for a, b in zip(*steps, strict=True):
        assert_same_step(a, b, ("obs", "reward", "done"))
    start = time.process_time()
    made[0].reset(seed=5)
    seeded = time.process_time() - start
    assert max(cpu) < seeded / 4, (cpu, seeded)
    for envs in made:
        envs.close()
