"""The learner must see what the actor saw: sequences cut from a real game, sent through the wire codec
and replay's validation, then replayed by the learner's path (time-major batch, burn-in from the stored
state, the rest from where burn-in left off), give back the behaviour probability the actor recorded for
every action. Any misalignment of observations, previous actions and rewards, resets, recurrent states
or psi between actor and learner breaks the equality."""

import numpy as np
import pytest
import torch

from actor_svc.sequencer import SequenceBuilder
from lbc.acting import CoreInputs, forward
from lbc.behaviour import behaviour_probs, sample_actions
from lbc.codec import decode, encode
from lbc.config import load_config
from lbc.envs import make_envs
from lbc.nets import build_agent
from lbc.sequences import sequence_layout, stack, validate_sequence
from learner_svc.training import to_time_major

NUM_ENVS = 4


def _play(cfg, steps: int) -> tuple[torch.nn.Module, list[dict[str, np.ndarray]]]:
    """An actor's loop on real games with a random network made peaky (so that a misaligned input
    changes the probabilities) and a different psi per environment."""
    torch.manual_seed(0)
    envs = make_envs(cfg.env, NUM_ENVS, seed=3)
    net = build_agent(cfg, envs.spec.obs_shape, envs.spec.num_actions).eval()
    with torch.no_grad():
        net.heads.weight.mul_(30.0)
    k = cfg.num_components
    rng = np.random.default_rng(0)
    psi = np.concatenate([rng.uniform(0.5, 3.0, (NUM_ENVS, k)), rng.dirichlet(np.ones(k), NUM_ENVS)], 1)
    psi = psi.astype(np.float32)
    builder = SequenceBuilder(NUM_ENVS, cfg.sequence.burn_in, sequence_layout(cfg))
    obs = envs.reset()
    inputs = CoreInputs.start(net, NUM_ENVS)
    generator = torch.Generator().manual_seed(0)
    received = []
    for _ in range(steps):
        for seq, _version in builder.observe(obs, inputs.prev_action, inputs.prev_reward, inputs.reset,
                                             inputs.state[0].numpy(), inputs.state[1].numpy(), 0):
            arrays = decode(encode("sequence", seq), max_bytes=1 << 28, expected_kind="sequence").arrays
            validate_sequence(arrays, cfg)
            received.append(arrays)
        out = forward(net, obs, inputs)
        probs = behaviour_probs(cfg.behaviour.family, out.adv[0][:, torch.tensor(cfg.components)],
                                torch.from_numpy(psi[:, :k]), torch.from_numpy(psi[:, k:]))
        actions, mu = sample_actions(probs, generator)
        result = envs.step(actions.numpy())
        boundary = result.done | result.life_lost if cfg.env.episodic_life else result.done
        builder.act(actions.numpy(), result.reward, boundary, mu.numpy(), psi)
        obs = result.obs
        inputs.advance(actions.numpy(), result.reward, boundary, out.state)
    envs.close()
    return net, received


@pytest.mark.parametrize("preset, game", [("cpu", "pong"), ("impala", "breakout")],
                         ids=["lbc-mixture-pong", "impala-life-loss-breakout"])
def test_the_learner_recomputes_the_actors_behaviour_probabilities(preset, game):
    cfg = load_config(preset, [f"env.game={game}"])
    net, sequences = _play(cfg, steps=200)
    assert len(sequences) >= 2 * NUM_ENVS   # consecutive sequences, overlapping by the burn-in
    b = to_time_major(stack(sequences))
    burn, k = cfg.sequence.burn_in, cfg.num_components
    with torch.no_grad():
        state = (b["h0"], b["c0"])
        # the stacks as the learner reads them, straight from the single frames (LBCNet.sequence_input)
        inputs = [net.sequence_input(b), b["prev_action"].long(), b["prev_reward"], b["reset"]]
        adv = []
        for part in (slice(0, burn), slice(burn, None)):
            if part.stop == 0:
                continue
            out = net(*(x[part] for x in inputs), state)
            state = out.state
            adv.append(out.adv)
        adv = torch.cat(adv)[:-1][:, :, cfg.components]   # the steps; the last observation only bootstraps
        mu = behaviour_probs(cfg.behaviour.family, adv, b["psi"][..., :k], b["psi"][..., k:])
    taken = mu.gather(-1, b["action"].long().unsqueeze(-1)).squeeze(-1)
    assert float(b["behaviour_prob"].min()) < 0.5   # peaky enough that a wrong input would show
    torch.testing.assert_close(taken, b["behaviour_prob"], rtol=1e-4, atol=1e-5)
    assert bool(b["reset"][0, :NUM_ENVS].all())   # each game's first sequence starts it
    if cfg.env.episodic_life and game == "breakout":   # Pong has no lives to lose
        assert bool(b["done"].any()), "life losses end the learner's episodes"
