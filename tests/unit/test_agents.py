"""The algorithm seam (lbc/agents): each preset's family, and what each family's acting part gives the
shared acting loop."""

import numpy as np
import pytest
import torch

from lbc.acting import evaluation_policy
from lbc.agents import LbcActing, NguActing, family_of, make_acting, make_loss
from lbc.agents.lbc_family import LbcLoss
from lbc.agents.ngu import NguLoss
from lbc.behaviour import EpisodeBehaviour, boltzmann_mixture, epsilon_greedy_mixture
from lbc.config import PRESETS, load_config
from lbc.family import family_traits
from lbc.nets import NetOutput, build_agent, policy_net
from lbc.presets import CATCH_SIZING, deep_merge
from lbc.psi import Psi
from lbc.sequences import sequence_layout


def _catch(preset, *layers):
    return load_config(preset, deep_merge(CATCH_SIZING, *layers))


def _agent(cfg):
    return build_agent(cfg, (1, cfg.env.catch_rows, cfg.env.catch_columns), 3)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_has_one_family_with_its_acting_and_loss(preset):
    cfg = _catch(preset)
    agent = _agent(cfg)
    acting, loss = make_acting(cfg, agent, 4), make_loss(cfg, agent, torch.device("cpu"))
    expected = (NguActing, NguLoss) if preset in ("ngu", "agent57") else (LbcActing, LbcLoss)
    assert family_of(cfg) == ("ngu" if preset in ("ngu", "agent57") else "lbc")
    assert (type(acting), type(loss)) == expected
    assert acting.psi.shape == (4, 2 * cfg.num_components)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_a_familys_traits_shape_its_network_sequences_and_evaluation(preset):
    cfg = _catch(preset)
    traits, ngu = family_traits(cfg), preset in ("ngu", "agent57")
    assert policy_net(_agent(cfg)).extra_inputs == traits.extra_inputs == (cfg.ngu.num_mixtures + 1 if ngu else 0)
    extras = set(sequence_layout(cfg)) - set(sequence_layout(_catch("cpu")))
    assert extras == set(traits.fields) == ({"mixture", "prev_intrinsic"} if ngu else set())
    fixed_boltzmann = not cfg.behaviour.controlled and cfg.behaviour.family == "boltzmann_mixture" and not ngu
    assert evaluation_policy(cfg) == ("sample" if fixed_boltzmann else "greedy")
    assert evaluation_policy(_catch(preset, {"eval": {"policy": "sample"}})) == "sample"


def _output(adv):
    return NetOutput(adv=adv[None], value=torch.zeros(1, adv.shape[0], adv.shape[1]), state=None)


@pytest.mark.parametrize("family", ["boltzmann_mixture", "epsilon_greedy_mixture"])
def test_lbc_acting_plays_each_environments_episode_psi(family):
    """After begin_episode, environment e's behaviour is mu_psi with e's (tau, omega); a later episode's
    psi reaches the next step (psi is recorded by reference, so the sequence holds what was played)."""
    # LBC's own target: cpu's (the episode's temperature) is for the Boltzmann mixture alone
    cfg = _catch("cpu", {"behaviour": {"family": family, "tau_range": [0.0, 1.0]},
                         "learner": {"target_policy": "softmax"}})
    acting = make_acting(cfg, _agent(cfg), 2)
    k = cfg.num_components
    rng = np.random.default_rng(0)
    choices = [EpisodeBehaviour("", Psi(tuple(rng.uniform(0, 1, k)), tuple(rng.dirichlet(np.ones(k)))))
               for _ in range(3)]
    acting.begin_episode(0, choices[0])
    acting.begin_episode(1, choices[1])
    adv = torch.from_numpy(rng.normal(size=(2, cfg.num_policies, 3)).astype(np.float32))
    mix = boltzmann_mixture if family == "boltzmann_mixture" else epsilon_greedy_mixture

    def expected(env, chosen):
        return mix(adv[env][cfg.components], torch.tensor(chosen.psi.first).float(),
                   torch.tensor(chosen.psi.omega).float())

    probs = acting.behaviour(_output(adv))
    assert torch.allclose(probs[0], expected(0, choices[0]), atol=1e-6)
    assert torch.allclose(probs[1], expected(1, choices[1]), atol=1e-6)
    acting.begin_episode(1, choices[2])
    assert torch.allclose(acting.behaviour(_output(adv))[1], expected(1, choices[2]), atol=1e-6)
    assert np.allclose(acting.psi[1], [*choices[2].psi.first, *choices[2].psi.omega])
    assert acting.observe(np.zeros((2, 1, 5, 5), np.uint8), np.ones(2, bool)) == {}
    assert acting.extra_inputs({}) is None and not acting.exploits(0)


def test_ngu_acting_plays_its_member_or_the_chosen_one_and_evaluates_with_j_0():
    cfg = _catch("ngu", {"ngu": {"num_mixtures": 4}})
    acting = make_acting(cfg, _agent(cfg), 4, actor_index=0)
    own = acting.own_mixture.copy()
    n = cfg.num_components
    default = EpisodeBehaviour("", Psi.uniform(1.0, n))
    for e in range(4):
        acting.begin_episode(e, default)
    assert np.array_equal(acting.mixture, own)
    acting.begin_episode(2, EpisodeBehaviour("x", Psi.uniform(1.0, n), mixture=3))
    assert acting.mixture[2] == 3 and not acting.exploits(2)
    fields = acting.observe(np.zeros((4, 1, cfg.env.catch_rows, cfg.env.catch_columns), np.uint8), np.ones(4, bool))
    assert fields["mixture"].tolist() == [*own[:2], 3, own[3]]
    assert acting.extra_inputs(fields).shape == (1, 4, cfg.ngu.num_mixtures + 1)
    acting.for_evaluation()
    assert all(acting.exploits(e) for e in range(4))


@pytest.mark.parametrize("target_policy", ["softmax", "fixed_temperature", "behaviour_temperature"])
def test_target_policy_temperature_and_gradient_scale(target_policy):
    """pi_i = softmax(beta A_i) with beta 1 (LBC), target_tau (one for every episode) or the episode's tau_i
    (DiCE); the policy gradient is scaled by 1/beta, so its step in A is the same at every beta."""
    cfg = _catch("cpu", {"learner": {"target_policy": target_policy, "target_tau": 8.0}})
    loss = make_loss(cfg, _agent(cfg), torch.device("cpu"))
    t, b, n, a = 5, 3, cfg.num_policies, 3
    gen = torch.Generator().manual_seed(0)
    adv = torch.randn(t + 1, b, n, a, generator=gen)
    tau = torch.rand(t, b, n, generator=gen) * 50 + 1
    psi = torch.cat([tau, torch.full((t, b, n), 1.0 / n)], dim=-1)
    log_pi, scale = loss.target_log_policy(adv, psi)
    beta = {"softmax": torch.tensor(1.0), "fixed_temperature": torch.tensor(8.0),
            "behaviour_temperature": torch.cat([tau, tau[-1:]]).unsqueeze(-1)}[target_policy]
    logits = beta.double().numpy() * adv.double().numpy()
    logits -= logits.max(-1, keepdims=True)
    expected = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    torch.testing.assert_close(log_pi.double(), torch.from_numpy(expected), rtol=1e-4, atol=1e-4)
    if target_policy == "softmax":
        assert scale is None
    else:
        per_step = beta[:-1].squeeze(-1) if beta.dim() else beta
        torch.testing.assert_close(torch.broadcast_to(scale, (t, b, n)), torch.broadcast_to(1.0 / per_step, (t, b, n)))
