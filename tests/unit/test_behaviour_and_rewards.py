"""The behaviour mixture (LBC eq. 10 / App. D) and reward shaping (LBC Table 3) by hand."""

import math

import numpy as np
import pytest
import torch

from lbc.behaviour import boltzmann_mixture, epsilon_greedy_mixture, log_boltzmann_mixture, sample_actions
from lbc.psi import Psi, psi_problem, split_psi
from lbc.rewards import REWARD_SHAPING, quarter_root, rs1, rs2, rs3


@pytest.fixture
def adv():
    return torch.randn(5, 3, 6, generator=torch.Generator().manual_seed(0))   # [B, N, A]


def test_mixture_sums_to_one(adv):
    tau = torch.rand(5, 3) * 10
    omega = torch.softmax(torch.randn(5, 3), -1)
    probs = boltzmann_mixture(adv, tau, omega)
    torch.testing.assert_close(probs.sum(-1), torch.ones(5))
    assert (probs > 0).all()


def test_one_hot_omega_gives_that_policys_softmax(adv):
    tau = torch.tensor([[0.5, 2.0, 3.0]]).expand(5, 3)
    omega = torch.tensor([[0.0, 1.0, 0.0]]).expand(5, 3)
    torch.testing.assert_close(boltzmann_mixture(adv, tau, omega), torch.softmax(2.0 * adv[:, 1], -1))


def test_tau_zero_gives_uniform(adv):
    omega = torch.full((5, 3), 1 / 3)
    torch.testing.assert_close(boltzmann_mixture(adv, torch.zeros(5, 3), omega), torch.full((5, 6), 1 / 6))


def test_large_tau_gives_greedy(adv):
    probs = boltzmann_mixture(adv, torch.full((5, 3), 1e4), torch.tensor([[1.0, 0.0, 0.0]]).expand(5, 3))
    torch.testing.assert_close(probs, torch.nn.functional.one_hot(adv[:, 0].argmax(-1), 6).float())


def test_mixture_by_hand():
    adv = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0]]])  # policy 1: softmax = (1/4, 3/4); policy 2 uniform
    probs = boltzmann_mixture(adv, torch.tensor([[1.0, 1.0]]), torch.tensor([[0.5, 0.5]]))
    torch.testing.assert_close(probs, torch.tensor([[0.5 * 0.25 + 0.25, 0.5 * 0.75 + 0.25]]))


def test_epsilon_greedy_mixture_by_hand():
    adv = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 0.0, 2.0]]])
    probs = epsilon_greedy_mixture(adv, torch.tensor([[0.3, 0.0]]), torch.tensor([[0.5, 0.5]]))
    # policy 1: (0.8, 0.1, 0.1); policy 2: (0, 0, 1)
    torch.testing.assert_close(probs, torch.tensor([[0.4, 0.05, 0.55]]))


def test_sampling_frequencies_and_recorded_probability():
    probs = torch.tensor([[0.1, 0.6, 0.3]]).expand(20000, 3)
    actions, mu = sample_actions(probs, torch.Generator().manual_seed(0))
    freq = np.bincount(actions.numpy(), minlength=3) / 20000
    np.testing.assert_allclose(freq, [0.1, 0.6, 0.3], atol=0.015)
    torch.testing.assert_close(mu, probs[0][actions])


def test_rs1_by_hand():
    x = torch.tensor([0.0, 3.0, -8.0, 1000.0], dtype=torch.float64)
    # sign(x)(sqrt(|x|+1)-1) + 0.001x
    want = [0.0, (2.0 - 1.0) + 0.003, -(3.0 - 1.0) - 0.008, (math.sqrt(1001) - 1) + 1.0]
    torch.testing.assert_close(rs1(x), torch.tensor(want, dtype=torch.float64))


def test_rs2_is_the_printed_asymmetric_log():
    x = torch.tensor([0.0, 1.0, -1.0, math.e - 1], dtype=torch.float64)
    # log(|x|+1) * (2*1[x>=0] - 1[x<=0]): positive doubled, negative kept
    want = [0.0, 2 * math.log(2), -math.log(2), 2.0]
    torch.testing.assert_close(rs2(x), torch.tensor(want, dtype=torch.float64))


def test_rs3_by_hand():
    x = torch.tensor([0.0, 1.0, -1.0, 50.0, -50.0], dtype=torch.float64)
    t = math.tanh(1.0)
    want = [0.0, 5 * t, -0.3 * t, 5.0, -0.3]
    torch.testing.assert_close(rs3(x), torch.tensor(want, dtype=torch.float64))


def test_every_configured_shaping_exists():
    for name in ("rs1", "rs2", "rs3", "identity", "clip"):
        assert REWARD_SHAPING[name](torch.tensor([2.0])).shape == (1,)
    assert REWARD_SHAPING["clip"](torch.tensor([5.0, -3.0])).tolist() == [1.0, -1.0]


@pytest.mark.parametrize("name", sorted(REWARD_SHAPING))
def test_each_shaping_answers_numpy_as_torch(name):
    """One definition serves the learner's tensors and replay's numpy bound (lbc.sequences.value_bound):
    the same values, in the argument's own kind and dtype."""
    x = np.array([-1e4, -7.5, -1.0, -1e-3, 0.0, 1e-3, 0.5, 1.0, 3.0, 1e4])
    for dtype, tdtype in ((np.float64, torch.float64), (np.float32, torch.float32)):
        got, want = REWARD_SHAPING[name](x.astype(dtype)), REWARD_SHAPING[name](torch.tensor(x, dtype=tdtype))
        assert isinstance(got, np.ndarray) and got.dtype == dtype and want.dtype == tdtype
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-6 if dtype == np.float32 else 1e-12)


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("heads", [(0, 0), (0, 1)])
def test_gdi_mixture_probabilities_by_numpy(heads):
    """GDI App. F eq. 10 (I3, one head twice) and eq. 12 (H3, two heads):
    pi = eps softmax(A_1 / tau_1) + (1 - eps) softmax(A_2 / tau_2); lbc's tau is the inverse temperature."""
    rng = np.random.default_rng(0)
    adv = rng.normal(size=(5, 2, 6))                       # [B, policies, A]
    inv_t = rng.uniform(0.0, 50.0, size=(5, 2))
    eps = rng.uniform(size=5)
    expected = (eps[:, None] * _softmax(adv[:, heads[0]] * inv_t[:, :1])
                + (1 - eps[:, None]) * _softmax(adv[:, heads[1]] * inv_t[:, 1:]))
    comp = torch.tensor(adv[:, list(heads)])
    omega = torch.tensor(np.stack([eps, 1 - eps], 1))
    got = boltzmann_mixture(comp, torch.tensor(inv_t), omega)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-10)
    np.testing.assert_allclose(log_boltzmann_mixture(comp, torch.tensor(inv_t), omega).exp().numpy(), expected,
                               rtol=1e-10)


def test_gdi_mixture_special_cases():
    """eps = 1 is DiCE's softmax(A / tau_1); 1/tau_1 = 0 with a large 1/tau_2 is eps-greedy (GDI sec. 3)."""
    adv = torch.tensor([[[0.5, -1.0, 2.0, 0.1]] * 2], dtype=torch.float64)    # [1, 2, A]
    dice = log_boltzmann_mixture(adv, torch.tensor([[3.0, 7.0]], dtype=torch.float64),
                                 torch.tensor([[1.0, 0.0]], dtype=torch.float64)).exp()
    torch.testing.assert_close(dice, torch.softmax(3.0 * adv[:, 0], -1))
    greedy = log_boltzmann_mixture(adv, torch.tensor([[0.0, 1e4]], dtype=torch.float64),
                                   torch.tensor([[0.2, 0.8]], dtype=torch.float64)).exp()
    torch.testing.assert_close(greedy, torch.tensor([[0.05, 0.05, 0.85, 0.05]], dtype=torch.float64))


def test_log_mixture_stays_finite_where_a_component_underflows():
    adv = torch.tensor([[[0.0, 40.0], [0.0, 40.0]]], requires_grad=True)
    log_mu = log_boltzmann_mixture(adv, torch.tensor([[50.0, 50.0]]), torch.tensor([[0.0, 1.0]]))
    assert torch.isfinite(log_mu).all()
    log_mu[0, 0].backward()
    assert torch.isfinite(adv.grad).all()


def test_quarter_root_by_hand():
    """GDI-H3's second shape: sign(x)((|x| + 1)^0.25 - 1) + 0.001 x."""
    r = torch.tensor([1.0, -15.0, 0.0, 80.0], dtype=torch.float64)
    expected = torch.tensor([2 ** 0.25 - 1 + 0.001, -1.0 - 0.015, 0.0, 3.0 - 1.0 + 0.08], dtype=torch.float64)
    torch.testing.assert_close(quarter_root(r), expected)


def test_psi_is_joined_and_split_in_one_place():
    import numpy as np
    import torch

    from lbc.psi import join_psi, psi_width, split_psi

    psi = join_psi([0.5, 2.0, 9.0], (0.2, 0.3, 0.5))
    assert psi.dtype == np.float32 and psi.shape == (psi_width(3),)
    tau, omega = split_psi(psi, 3)
    np.testing.assert_allclose(tau, [0.5, 2.0, 9.0])
    np.testing.assert_allclose(omega, [0.2, 0.3, 0.5])
    batch = torch.from_numpy(np.stack([psi, psi[::-1].copy()]))[None]   # [1, 2, 6], as the learner holds it
    t, w = split_psi(batch, 3)
    assert t.shape == w.shape == (1, 2, 3) and float(w[0, 1, 0]) == 9.0


def test_psi_names_its_slots_per_family_and_packs_as_join_psi():
    psi = Psi((2.0, 0.5), (0.25, 0.75))
    assert psi.named("boltzmann_mixture") == {"tau_1": 2.0, "tau_2": 0.5, "omega_1": 0.25, "omega_2": 0.75}
    assert list(psi.named("epsilon_greedy_mixture")) == ["epsilon_1", "epsilon_2", "omega_1", "omega_2"]
    packed = psi.packed()
    assert packed.dtype == np.float32 and packed.tolist() == [2.0, 0.5, 0.25, 0.75]
    assert [tuple(x) for x in split_psi(packed, 2)] == [psi.first, psi.omega]
    assert Psi.uniform(1.0, 4) == Psi((1.0,) * 4, (0.25,) * 4)
    assert psi_problem(np.array(Psi.uniform(1.0, 3).first), np.array(Psi.uniform(1.0, 3).omega), 10.0) == ""
