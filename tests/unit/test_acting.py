"""The acting step shared by actors, the evaluator and `lbc play`: core inputs across episode boundaries,
the evaluation policy per preset, and which evaluation episodes count."""

from functools import partial

import numpy as np
import pytest
import torch

from actor_svc.evaluator import EpisodeQuota, eval_env_config, evaluation_envs, forward_rows, play
from lbc.acting import CoreInputs, acting_agent, evaluation_policy, evaluation_probs, forward
from lbc.agents import make_acting
from lbc.behaviour import sample_actions
from lbc.config import load_config
from lbc.envs import AtariEnvs, make_envs
from lbc.nets import LBCNet, NetOutput, policy_net


def test_core_inputs_restart_at_boundaries():
    net = LBCNet("mlp", (1, 4, 3), 3, 2, hidden=8, lstm=8)
    inputs = CoreInputs.start(net, 3)
    assert inputs.reset.all() and not inputs.prev_action.any() and inputs.state[0].shape == (3, 8)
    state = (torch.ones(3, 8), torch.ones(3, 8))
    inputs.advance(np.array([2, 1, 2]), np.array([0.5, -1.0, 3.0], np.float32), np.array([False, True, False]), state)
    assert inputs.prev_action.tolist() == [2, 0, 2]
    assert inputs.prev_reward.tolist() == [0.5, 0.0, 3.0]
    assert inputs.reset.tolist() == [False, True, False] and inputs.state is state


@pytest.mark.parametrize("preset, expected", [
    ("cpu", "greedy"), ("impala", "sample"), ("impala-cpu", "sample"), ("dice", "greedy"), ("dice-fixed", "sample"),
    ("gdi-h3", "greedy"), ("ngu", "greedy"), ("agent57", "greedy")])
def test_evaluation_policy_per_preset(preset, expected):
    assert evaluation_policy(load_config(preset)) == expected
    assert evaluation_policy(load_config(preset, ["eval.policy=sample"])) == "sample"


def _output(adv: list[list[list[float]]]) -> NetOutput:
    a = torch.tensor(adv)[None]   # [1, E, N, A]
    return NetOutput(adv=a, value=torch.zeros(a.shape[:3]), state=(torch.zeros(1), torch.zeros(1)))


def test_greedy_evaluation_is_epsilon_greedy_on_the_mean_advantage():
    cfg = load_config("cpu", ["eval.epsilon=0.1"])   # three components, one per policy
    # policy 1 prefers action 0 a little, policies 2 and 3 prefer action 2: the mean prefers 2
    out = _output([[[0.3, 0.0, -0.3] + [0.0] * 15, [-0.2, 0.0, 0.4] + [0.0] * 15, [-0.2, 0.0, 0.4] + [0.0] * 15]])
    probs = evaluation_probs(cfg, out, "greedy")[0]
    assert probs[2] == pytest.approx(0.9 + 0.1 / 18) and probs[0] == pytest.approx(0.1 / 18)
    assert probs.sum() == pytest.approx(1.0)


def test_sampled_evaluation_is_the_target_policy():
    cfg = load_config("impala")   # one policy, fixed_tau 1: pi = softmax(A)
    adv = [[[1.0, 0.0, -1.0] + [0.0] * 15]]
    probs = evaluation_probs(cfg, _output(adv), "sample")[0]
    assert torch.allclose(probs, torch.softmax(torch.tensor(adv[0][0]), -1), atol=1e-6)


def test_episode_quota_counts_the_first_episodes_of_each_environment():
    quota = EpisodeQuota(5, 2)                  # 3 episodes from environment 0, 2 from environment 1
    assert quota.quota.tolist() == [3, 2]
    for score in (1.0, 2.0, 3.0):
        quota.record(1, score)                  # environment 1's short games: only its first two count
    assert not quota.done
    for score in (10.0, 20.0, 30.0, 40.0):
        quota.record(0, score)
    assert quota.done and sorted(quota.all_scores()) == [1.0, 2.0, 10.0, 20.0, 30.0]


def test_evaluation_protocol_options():
    cfg = load_config("cpu")
    assert eval_env_config(cfg).repeat_action_probability == 0.0
    sticky = eval_env_config(load_config("cpu", ["eval.sticky_actions=true"]))
    assert sticky.repeat_action_probability == 0.25 and sticky.noop_max == 30 and sticky.max_episode_frames == 108_000


def _gymnasium_with_a_short_limit() -> str:
    import gymnasium as gym

    env_id = "lbc-test/CartPole3-v0"
    if env_id not in gym.registry:
        gym.register(env_id, entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv", max_episode_steps=3)
    return env_id


@pytest.mark.parametrize("preset, overrides", [
    ("cpu", ["env.game=pong", "env.max_episode_frames=400", "env.num_envs=2"]),      # ALE: 100 steps of 4 frames
    ("minatar", ["env.game=freeway", "env.max_episode_frames=25", "env.num_envs=2"]),  # the chicken never dies
    ("cpu", ["env.kind=gymnasium", "env.num_envs=2", "net.torso=mlp"]),              # gymnasium's own limit: 3
])
def test_an_episode_cut_by_the_cap_brings_its_last_observation_and_its_value(preset, overrides):
    """Each environment kind hands over the cut episode's last observation where the frame cap ended it (obs
    already holds the next episode's first), and cut_episode_values gives V of exactly that observation,
    read after a_t and r_t from the state after x_t, on the cut rows only."""
    from lbc.acting import cut_episode_values, forward
    from lbc.envs import make_envs
    from lbc.nets import build_net

    if "env.kind=gymnasium" in overrides:
        overrides = [*overrides, f"env.id={_gymnasium_with_a_short_limit()}"]
    cfg = load_config(preset, overrides)
    envs = make_envs(cfg.env, 2, seed=0)
    net = build_net(cfg, envs.spec.obs_shape, envs.spec.num_actions).eval()
    obs, inputs = envs.reset(), CoreInputs.start(net, 2)
    for _ in range(200):
        out = forward(net, obs, inputs)
        actions = np.zeros(2, np.int64)
        result = envs.step(actions)
        if result.truncated.any():
            break
        assert result.final_obs is None
        obs = result.obs
        inputs.advance(actions, result.reward, result.done, out.state)
    envs.close()
    assert result.truncated.all() and result.done.all() and result.final_obs is not None
    assert result.final_obs.shape == result.obs.shape and result.final_obs.dtype == result.obs.dtype
    assert not np.array_equal(result.final_obs, result.obs)   # not the next episode's start
    step = partial(forward, net)
    values = cut_episode_values(step, result, actions, out.state)
    after = CoreInputs(actions, result.reward, np.zeros(2, bool), out.state)
    expected = forward(net, result.final_obs, after).value[0].numpy()
    np.testing.assert_allclose(values, expected, rtol=1e-6)
    partly = type(result)(result.obs, result.reward, result.done, np.array([True, False]), result.life_lost,
                          result.final_obs)
    assert cut_episode_values(step, partly, actions, out.state)[1].tolist() == [0.0] * cfg.num_policies
    uncut = type(result)(result.obs, result.reward, result.done, np.zeros(2, bool), result.life_lost, None)
    assert cut_episode_values(step, uncut, actions, out.state) is None


def test_acting_graphs_are_refused_without_a_gpu_and_unused_on_a_cpu_network():
    """actor.cuda_graphs: an actor whose actor.device=auto found no GPU stops with the reason; a CPU network
    handed graphs runs eagerly (nothing captured) and gives what it gives without them."""
    from lbc.acting import acting_graphs, forward
    from lbc.lstm_bptt import GraphCache

    assert acting_graphs(load_config("lbc-bm"), torch.device("cpu")) is None
    with pytest.raises(SystemExit, match="needs the acting pass on a GPU, and actor.device=auto found no GPU"):
        acting_graphs(load_config("lbc-bm", ["actor.device=auto", "actor.cuda_graphs=true"]), torch.device("cpu"))
    with pytest.raises(SystemExit, match="and inference.device=auto found no GPU"):
        acting_graphs(load_config("lbc-bm", ["actor.inference=remote", "actor.cuda_graphs=true"]),
                      torch.device("cpu"))
    net = LBCNet("mlp", (1, 4, 3), 3, 2, hidden=8, lstm=8).eval()
    obs = np.random.default_rng(0).integers(0, 255, (3, 1, 4, 3), dtype=np.uint8)
    graphs = GraphCache()
    plain, graphed = forward(net, obs, CoreInputs.start(net, 3)), forward(net, obs, CoreInputs.start(net, 3),
                                                                           graphs=graphs)
    assert not graphs.graphs
    torch.testing.assert_close(graphed.adv, plain.adv, rtol=0, atol=0)
    torch.testing.assert_close(graphed.state, plain.state, rtol=0, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a visible GPU")
@pytest.mark.parametrize("preset, precision", [("lbc-bm", "fp32"), ("lbc-bm", "bf16"), ("agent57", "fp32")])
def test_an_actor_replaying_its_pass_as_cuda_graphs_acts_as_the_eager_one(preset, precision):
    """actor.cuda_graphs: over steps with episodes restarting, a parameter pull in place (load_state_dict, as
    lbc.params.load_blob) and NGU's extra inputs, the graph's outputs are the eager pass's, the pulled weights
    are the ones it reads, and a step's returned state is not overwritten by the next replay."""
    from lbc.acting import acting_agent, acting_graphs, forward
    from lbc.nets import policy_net

    cfg = load_config(preset, ["actor.device=cuda", "actor.cuda_graphs=true", f"actor.precision={precision}"])
    device, envs, shape = torch.device("cuda"), 8, (4, 84, 84)
    torch.manual_seed(0)
    agent = acting_agent(cfg, shape, 4, device)
    net = policy_net(agent)
    graphs = acting_graphs(cfg, device)
    rng = np.random.default_rng(1)
    eager, graphed = CoreInputs.start(net, envs), CoreInputs.start(net, envs)
    tol = {"rtol": 1e-5, "atol": 1e-5} if precision == "fp32" else {"rtol": 2e-2, "atol": 2e-2}
    for t in range(6):
        obs = rng.integers(0, 255, (envs, *shape), dtype=np.uint8)
        extra = torch.from_numpy(rng.random((1, envs, net.extra_inputs), np.float32)) if net.extra_inputs else None
        if t == 3:   # a pull: new values copied into the same tensors the graph reads
            before_pull = forward(net, obs, eager, extra).adv
            agent.load_state_dict({k: v * 1.5 + 0.01 for k, v in agent.state_dict().items()})
        out_e = forward(net, obs, eager, extra)
        out_g = forward(net, obs, graphed, extra, graphs=graphs)
        kept = out_g.state[0].clone()
        torch.testing.assert_close(out_g.adv, out_e.adv, **tol)
        torch.testing.assert_close(out_g.value, out_e.value, **tol)
        torch.testing.assert_close(out_g.state, out_e.state, **tol)
        actions = rng.integers(0, 4, envs)
        boundary = rng.random(envs) < 0.3
        eager.advance(actions, np.ones(envs, np.float32), boundary, out_e.state)
        graphed.advance(actions, np.ones(envs, np.float32), boundary, out_g.state)
        if t == 3:
            assert not torch.allclose(out_e.adv, before_pull, **tol)   # the pull changed what the network says
    forward(net, obs, graphed, extra, graphs=graphs)
    torch.testing.assert_close(out_g.state[0], kept, rtol=0, atol=0)
    assert len(graphs.graphs) == 1


def _first_episodes_on_a_vector(cfg, net, acting, seed: int) -> tuple[list[float], list[int]]:
    """The reference: every game of a vector stepped until each has ended once; each game's first score and
    the steps it took."""
    envs = AtariEnvs(eval_env_config(cfg), cfg.eval.num_envs, seed)
    obs = envs.reset(seed)
    inputs = CoreInputs.start(net, envs.num_envs)
    acting.for_evaluation()
    generator = torch.Generator().manual_seed(seed)
    returns = np.zeros(envs.num_envs)
    scores, lengths = [None] * envs.num_envs, [None] * envs.num_envs
    t = 0
    while any(s is None for s in scores):
        out = forward(net, obs, inputs, acting.extra_inputs(acting.observe(obs, inputs.reset)))
        actions = sample_actions(evaluation_probs(cfg, out, "sample"), generator)[0].numpy()
        result = envs.step(actions)
        t += 1
        returns += result.reward
        for e in np.flatnonzero(result.done):
            if scores[e] is None:
                scores[e], lengths[e] = float(returns[e]), t
            returns[e] = 0.0
        obs = result.obs
        inputs.advance(actions, result.reward, result.done, out.state)
    envs.close()
    return scores, lengths


def test_evaluation_plays_the_vectors_episodes_without_the_frames_after_them():
    """Games whose episode is counted stop being stepped: the same scores as stepping every game until the
    longest episode ends, in the counted episodes' steps alone."""
    cfg = load_config("cpu", ["env.game=breakout", "eval.num_envs=3", "eval.episodes=3",
                              "env.max_episode_frames=20000"])
    torch.manual_seed(0)
    agent = acting_agent(cfg, (4, 84, 84), 18)
    net = policy_net(agent)
    seed = 5
    scores, lengths = _first_episodes_on_a_vector(cfg, net, make_acting(cfg, agent, 3), seed)
    envs = evaluation_envs(cfg, 3, seed)
    played, steps = play(cfg, net, envs, 3, seed, "sample", make_acting(cfg, agent, 3),
                         torch.Generator().manual_seed(seed))
    envs.close()
    assert played == scores
    assert steps == sum(lengths) < 3 * max(lengths)     # the vector played 3 x the longest


@pytest.mark.parametrize("preset", ["cpu", "agent57"])
def test_the_network_on_some_rows_gives_those_rows_of_a_pass_over_all(preset):
    cfg = load_config(preset, ["env.game=breakout"])
    torch.manual_seed(0)
    agent = acting_agent(cfg, (4, 84, 84), 18)
    net = policy_net(agent)
    acting = make_acting(cfg, agent, 5)
    obs = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8).numpy()
    inputs = CoreInputs.start(net, 5)
    inputs.reset[:] = [True, False, False, True, False]
    inputs.prev_action[:] = [0, 3, 7, 0, 17]
    inputs.state = tuple(torch.randn_like(s) for s in inputs.state)
    extra = acting.extra_inputs(acting.observe(obs, inputs.reset))
    whole = forward(net, obs, inputs, extra)
    rows = np.array([1, 3])
    part = forward_rows(net, obs, inputs, extra, rows)
    torch.testing.assert_close(part.adv[:, rows], whole.adv[:, rows], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(part.value[:, rows], whole.value[:, rows], rtol=1e-5, atol=1e-5)
    others = np.array([0, 2, 4])
    assert not part.adv[:, others].any() and not part.value[:, others].any()
    for before, after, full in zip(inputs.state, part.state, whole.state, strict=True):
        torch.testing.assert_close(after[rows], full[rows], rtol=1e-5, atol=1e-5)
        assert torch.equal(after[others], before[others])


@pytest.mark.parametrize("preset, game", [("cpu", "pong"), ("impala", "breakout")])
def test_an_actor_reading_its_stacks_through_a_frame_ring_acts_as_it_did(preset, game):
    """Decisions 85 and 92: a CPU actor whose first convolution reads frames in blocks gets a frame ring (and its
    torso channels-last), in its network's precision. Over real games, episodes restarting and a parameter pull, its
    pass through the ring gives the heads and state of its pass over the stacks as the games give them: in bf16
    within bfloat16's rounding (no further from the float32 network's than twice that pass's), in float32 within
    float32's (1e-4; measured 3e-6 and 1.2e-5). actor.frame_ring=false and the deep torso get none."""
    import copy

    from lbc.acting import frame_ring, set_precision

    cfg = load_config(preset, [f"env.game={game}", "env.max_episode_frames=120", "actor.precision=fp32"])
    num_envs = 4
    envs = make_envs(cfg.env, num_envs, seed=3)
    torch.manual_seed(0)
    agent = acting_agent(cfg, envs.spec.obs_shape, envs.spec.num_actions)
    nets = {"fp32": policy_net(agent)}
    nets["ring32"] = copy.deepcopy(nets["fp32"])
    for name in ("plain", "ring"):
        nets[name] = copy.deepcopy(nets["fp32"])
        set_precision(nets[name], "bf16")
    assert frame_ring(cfg.model_copy(update={"actor": cfg.actor.model_copy(update={"frame_ring": False})}),
                      nets["plain"], num_envs) is None
    rings = {name: frame_ring(cfg, nets[name], num_envs) for name in ("ring", "ring32")}
    assert rings["ring"].slots.dtype == torch.bfloat16 and rings["ring32"].slots.dtype == torch.float32
    assert nets["ring"].torso.memory_format == nets["ring32"].torso.memory_format == torch.channels_last
    inputs = {name: CoreInputs.start(net, num_envs) for name, net in nets.items()}
    rng = np.random.default_rng(0)
    obs, errors, restarts = envs.reset(), {"plain": [], "ring": [], "ring32": []}, 0
    for t in range(60):
        if t == 30:   # a pull copies new values into every network's weights
            state = {k: v * 1.2 for k, v in nets["fp32"].state_dict().items()}
            for net in nets.values():
                net.load_state_dict(state)
        outs = {name: forward(net, rings[name].push(obs) if name in rings else obs, inputs[name])
                for name, net in nets.items()}
        for name in ("plain", "ring", "ring32"):
            errors[name].append(max(float((outs[name].adv - outs["fp32"].adv).abs().max()),
                                    float((outs[name].state[0] - outs["fp32"].state[0]).abs().max())))
        actions = rng.integers(0, envs.spec.num_actions, num_envs)
        result = envs.step(actions)
        restarts += int(result.done.sum())
        for name, out in outs.items():
            inputs[name].advance(actions, result.reward, result.done, out.state)
        obs = result.obs
    envs.close()
    assert restarts >= 1, "the games must restart"
    assert max(errors["ring"]) <= 2 * max(errors["plain"]) + 1e-3, (max(errors["ring"]), max(errors["plain"]))
    assert 0 < max(errors["ring"]) < 0.2
    assert max(errors["ring32"]) < 1e-4, max(errors["ring32"])
    deep = load_config("lbc-bm", ["actor.precision=bf16"])
    deep_net = policy_net(acting_agent(deep, (4, 84, 84), 6))
    assert frame_ring(deep, deep_net, 2) is None


def test_evaluations_after_the_first_go_on_from_the_games_random_numbers():
    """The evaluator seeds its games for its first evaluation only (play with a seed), and starts each later one
    where the games' random numbers are (play with None: envs.restart): the first scores as a seeded play on
    fresh games, and a run of evaluations the same for the same seed."""
    cfg = load_config("catch", ["eval.num_envs=3"])
    torch.manual_seed(0)
    agent = acting_agent(cfg, (1, cfg.env.catch_rows, cfg.env.catch_columns), 3)
    net = policy_net(agent)

    def evaluations(seeds: list[int | None]) -> list[list[float]]:
        envs, generator = evaluation_envs(cfg, 3, 7), torch.Generator().manual_seed(7)
        runs = [play(cfg, net, envs, 6, seed, "sample", make_acting(cfg, agent, 3), generator)[0] for seed in seeds]
        envs.close()
        return runs

    first, second, third = evaluations([7, None, None])
    assert evaluations([7]) == [first]
    assert evaluations([7, None, None]) == [first, second, third]
    assert len(second) == len(third) == 6
