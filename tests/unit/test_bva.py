"""DiCE's Bandits Vote Algorithm (lbc.bva) against hand-derived values of App. A eqs. 9-11."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lbc.bva import BanditsVote, BvaController, TileBandit, inverse_temperature, tile_scores


def bandit(mode: str = "argmax", width: int = 1, lr: float = 0.1, d: int = 2) -> TileBandit:
    return TileBandit(mode=mode, low=0.0, high=1.0, acc=0.2, width=width, lr=lr, candidates=d)


def test_tiles_clamp_at_both_ends() -> None:
    b = bandit()
    assert b.num_tiles == 5
    assert [b.tile(x) for x in (-1.0, 0.0, 0.19, 0.2, 0.99, 1.0, 7.0)] == [0, 0, 0, 1, 4, 4, 4]


def test_evaluate_is_the_window_mean_cut_at_the_edges() -> None:
    b = bandit(width=1)
    b.w = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    np.testing.assert_allclose(b.values(), [1.5, 2.0, 3.0, 4.0, 4.5])


def test_update_moves_the_window_towards_the_return() -> None:
    b = bandit(width=1, lr=0.1)
    b.update(0.5, 10.0)                  # tile 2: V_2 = 0, so w_1..w_3 += 0.1 * 10
    np.testing.assert_allclose(b.w, [0, 1, 1, 1, 0])
    np.testing.assert_allclose(b.n, [0, 0, 1, 0, 0])
    b.update(0.5, 10.0)                  # V_2 = 1: += 0.1 * 9
    np.testing.assert_allclose(b.w, [0, 1.9, 1.9, 1.9, 0])


def test_scores_by_hand() -> None:
    b = bandit(width=0)
    b.w = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    b.n = np.array([1.0, 0.0, 0.0, 0.0, 3.0])
    v = (b.w - 2.0) / np.sqrt(2.0)                     # mean 2, population std sqrt(2)
    bonus = np.sqrt(math.log(1 + 4) / (1 + b.n))
    np.testing.assert_allclose(b.scores(), v + bonus)


@pytest.mark.parametrize("normalise", [True, False])
def test_an_ensembles_scores_in_one_pass_are_each_bandits_own(normalise: bool) -> None:
    """Bandits of different widths scored together ([M, K] weights, widths [M]) get each one's eq. 11
    row, a bandit that has learned nothing (std V = 0) included."""
    rng = np.random.default_rng(0)
    bandits = [TileBandit(mode="argmax", low=0.0, high=2.0, acc=0.2, width=width, lr=0.1, candidates=3,
                          normalise=normalise) for width in (0, 1, 2, 3, 1)]
    for b in bandits[1:]:
        b.w, b.n = rng.normal(size=b.num_tiles), rng.integers(0, 5, size=b.num_tiles).astype(float)
    together = tile_scores(np.stack([b.w for b in bandits]), np.stack([b.n for b in bandits]),
                           np.array([b.width for b in bandits]), 1.0, normalise)
    np.testing.assert_allclose(together, np.stack([b.scores() for b in bandits]), rtol=1e-12, atol=1e-12)
    assert np.allclose(together[0], together[0, 0])   # nothing learned: every tile alike


def test_argmax_mode_proposes_the_top_tiles_inside_them() -> None:
    b = bandit(mode="argmax", width=0, d=2)
    b.w = np.array([0.0, 5.0, 1.0, 4.0, 2.0])
    b.n = np.ones(5)
    rng = np.random.default_rng(0)
    for _ in range(20):
        xs = b.propose(rng)
        assert sorted(b.tile(x) for x in xs) == [1, 3]


def test_random_mode_draws_tiles_by_softmax_of_the_scores() -> None:
    b = bandit(mode="random", width=0, d=1)
    b.w = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    b.n = np.full(5, 10.0)
    rng = np.random.default_rng(1)
    counts = np.bincount([b.tile(b.propose(rng)[0]) for _ in range(20000)], minlength=5)
    p = np.exp(b.scores() - b.scores().max())
    np.testing.assert_allclose(counts / counts.sum(), p / p.sum(), atol=0.01)


def test_ensemble_finds_the_best_temperature_region_and_random_ablation_does_not_learn() -> None:
    def episode_return(x: float) -> float:     # best around x = 2.5
        return -abs(x - 2.5)

    rng = np.random.default_rng(2)
    ens = BanditsVote(0.0, math.log1p(50.0), 0.1, bandits=7, candidates=7, ucb_c=1.0, normalise=True, rng=rng)
    for _ in range(1500):
        x = ens.select()
        ens.update(x, episode_return(x))
    late = [ens.select() for _ in range(300)]
    assert abs(np.median(late) - 2.5) < 0.5
    frozen = BanditsVote(0.0, 3.0, 0.1, bandits=7, candidates=7, ucb_c=1.0, normalise=True,
                         rng=np.random.default_rng(3), learn=False)
    frozen.update(1.0, 5.0)
    assert frozen.episodes == 1 and all(not b.w.any() and not b.n.any() for b in frozen.bandits)


def test_controller_speaks_lbcs_inverse_temperature_and_round_trips() -> None:
    assert inverse_temperature(math.log1p(50.0)) == pytest.approx(50.0)
    ctl = BvaController((0.0, 50.0), 0.1, bandits=7, candidates=7, ucb_c=1.0, normalise=True, learn=True, seed=4)
    choice = ctl.select()
    assert choice.omega == (1.0,) and 0.0 <= choice.tau[0] <= 50.0 and choice.arms[1] == 0
    ctl.update(choice.arms, 3.0)
    other = BvaController((0.0, 50.0), 0.1, bandits=7, candidates=7, ucb_c=1.0, normalise=True, learn=True, seed=9)
    other.load_dict(ctl.to_dict())
    assert other.select() == ctl.select() and other.episodes == 1


def test_gdi_controller_searches_inverse_temperatures_and_epsilon() -> None:
    """GDI App. G: three dimensions, tau_k = exp(x_k) - 1 on [0, 50] and eps = x_3 on [0, 1]; psi's
    weights are (eps, 1 - eps); every ensemble learns from each return; the widths come from GDI's table."""
    ctl = BvaController((0.0, 50.0), 0.1, bandits=7, candidates=3, ucb_c=1.0, normalise=True, learn=True, seed=4,
                        components=2, widths=(2, 3, 4), epsilon_accuracy=0.1)
    assert ctl.names == ["tau_1", "tau_2", "epsilon"]
    assert [e.bandits[0].num_tiles for e in ctl.ensembles] == [39, 39, 10]
    assert all(b.width in (2, 3, 4) for e in ctl.ensembles for b in e.bandits)
    for _ in range(20):
        choice = ctl.select()
        assert len(choice.arms) == 3 and all(0.0 <= t <= 50.0 for t in choice.tau)
        eps = choice.omega[0]
        assert 0.0 <= eps <= 1.0 and choice.omega[1] == pytest.approx(1.0 - eps)
        assert choice.arms[2] == min(int(eps / 0.1), 9)
        ctl.update(choice.arms, 1.0)
    assert all(e.episodes == 20 for e in ctl.ensembles)
    assert all(b.n.sum() == 20 for e in ctl.ensembles for b in e.bandits)
    other = BvaController((0.0, 50.0), 0.1, bandits=7, candidates=3, ucb_c=1.0, normalise=True, learn=True, seed=8,
                          components=2, widths=(2, 3, 4))
    other.load_dict(ctl.to_dict())
    assert other.select() == ctl.select()
    with pytest.raises(ValueError, match="one \\(DiCE\\) or two"):
        BvaController((0.0, 50.0), 0.1, 7, 3, 1.0, True, True, 0, components=3)


def test_gdi_controller_moves_towards_the_better_epsilon() -> None:
    """Returns that grow with eps draw the epsilon ensemble's choices to the top tiles."""
    ctl = BvaController((0.0, 50.0), 0.1, bandits=7, candidates=3, ucb_c=1.0, normalise=True, learn=True, seed=1,
                        components=2, widths=(2, 3, 4))
    eps = []
    for _ in range(600):
        choice = ctl.select()
        eps.append(choice.omega[0])
        ctl.update(choice.arms, 10.0 * choice.omega[0])
    assert np.mean(eps[-100:]) > 0.7 > np.mean(eps[:50])
