"""Population-based bandits, LBC App. E: votes, UCB scores, replacement, discretisation."""

import math

import numpy as np
import pytest

from lbc.bandit import (
    BanditPopulation,
    BehaviourController,
    Discretisation,
    MixtureController,
    SlidingWindowUCB,
    top_d,
    ucb_scores,
    vote,
)


def test_vote_on_lbc_example_2_picks_arm_1():
    """Example 2: 7 bandits, D = 2, proposals 1,2,1,3,2,4,5; 1,1,2,2,1,1,4 -> arm 1."""
    proposals = np.array([1, 2, 1, 3, 2, 4, 5, 1, 1, 2, 2, 1, 1, 4])
    rng = np.random.default_rng(0)
    assert all(vote(proposals, 11, rng) == 1 for _ in range(20))


def test_vote_breaks_ties_uniformly():
    rng = np.random.default_rng(0)
    picks = [vote(np.array([0, 0, 3, 3, 5]), 6, rng) for _ in range(4000)]
    counts = np.bincount(picks, minlength=6)
    assert counts[5] == 0 and abs(counts[0] - counts[3]) < 250


def test_ucb_eq_24_by_hand():
    sums = np.array([10.0, 3.0, 0.0])
    counts = np.array([2.0, 1.0, 0.0])
    c = 1.2
    # V = (5, 3, 0); bonus = c sqrt(log(1 + 3) / (1 + N))
    want = np.array([5 + c * math.sqrt(math.log(4) / 3), 3 + c * math.sqrt(math.log(4) / 2),
                     0 + c * math.sqrt(math.log(4) / 1)])
    np.testing.assert_allclose(ucb_scores(sums, counts, c, normalise=False), want)


def test_ucb_eq_25_normalises_values():
    sums = np.array([10.0, 3.0, 0.0, 8.0])
    counts = np.array([2.0, 1.0, 0.0, 4.0])
    v = np.array([5.0, 3.0, 2.0])          # visited arms' means
    z = (v - v.mean()) / v.std()
    bonus = 0.7 * np.sqrt(math.log(1 + 7) / (1 + counts))
    want = np.array([z[0], z[1], 0.0, z[2]]) + bonus
    np.testing.assert_allclose(ucb_scores(sums, counts, 0.7, normalise=True), want)


def test_top_d_takes_highest_scores():
    rng = np.random.default_rng(0)
    assert set(top_d(np.array([0.1, 5.0, 3.0, -1.0, 4.0]), 3, rng)) == {1, 2, 4}
    assert len(top_d(np.array([1.0, 2.0]), 4, rng)) == 2


def _population_state(rng: np.random.Generator, size: int = 7, arms: int = 12) -> tuple[np.ndarray, ...]:
    """Counts and sums as a population has them: rows with no arm visited, with one (std 0), with many."""
    counts = rng.integers(0, 4, size=(size, arms)).astype(float)
    counts[0] = 0.0
    counts[1] = 0.0
    counts[1, 5] = 3.0
    sums = np.where(counts > 0, rng.normal(size=(size, arms)) * counts, 0.0)
    return sums, counts, rng.uniform(0.5, 1.5, size)


def _ucb_by_loop(sums: np.ndarray, counts: np.ndarray, c: float, normalise: bool) -> list[float]:
    """Eq. 23-25 for one bandit, arm by arm in plain Python: V the mean return of a visited arm, 0 otherwise;
    normalised by the visited arms' mean and population std (a std of 0 divides by 1)."""
    visited = [k for k in range(len(counts)) if counts[k] > 0]
    v = [sums[k] / counts[k] if counts[k] > 0 else 0.0 for k in range(len(counts))]
    if normalise and visited:
        mean = sum(v[k] for k in visited) / len(visited)
        std = math.sqrt(sum((v[k] - mean) ** 2 for k in visited) / len(visited))
        std = std if std > 1e-8 else 1.0
        v = [(v[k] - mean) / std if counts[k] > 0 else 0.0 for k in range(len(counts))]
    total = sum(counts)
    return [v[k] + c * math.sqrt(math.log(1.0 + total) / (1.0 + counts[k])) for k in range(len(counts))]


@pytest.mark.parametrize("normalise", [True, False])
def test_population_scores_are_each_bandits_own(normalise):
    """A population's [P, K] scores in one pass equal each bandit's scored alone, against a plain loop over the
    arms (rows with no arm visited and with one, whose std is 0, included) and the one-bandit path."""
    sums, counts, c = _population_state(np.random.default_rng(0))
    together = ucb_scores(sums, counts, c, normalise)
    by_loop = np.array([_ucb_by_loop(sums[i], counts[i], float(c[i]), normalise) for i in range(len(c))])
    np.testing.assert_allclose(together, by_loop, rtol=1e-12, atol=1e-12)
    alone = np.stack([ucb_scores(sums[i], counts[i], float(c[i]), normalise) for i in range(len(c))])
    np.testing.assert_allclose(together, alone, rtol=1e-12, atol=1e-12)


def test_population_proposals_equal_each_bandits_top_d_in_turn():
    """[P, K] scores give each row's top-D with the random tie-breaks P draws in turn would give."""
    scores = np.round(np.random.default_rng(1).normal(size=(7, 12)), 1)   # rounded: many ties
    together = top_d(scores, 4, np.random.default_rng(2))
    rng = np.random.default_rng(2)
    np.testing.assert_array_equal(together, np.stack([top_d(row, 4, rng) for row in scores]))
    sums, counts, c = _population_state(np.random.default_rng(3))
    pop = BanditPopulation(12, 7, (0.5, 1.5), 4, replace_every=50, normalise=True, rng=np.random.default_rng(4))
    pop.sums, pop.counts, pop.c = sums, counts, c
    rng = np.random.default_rng(5)
    one_by_one = np.stack([top_d(ucb_scores(sums[i], counts[i], float(c[i]), True), 4, rng) for i in range(7)])
    np.testing.assert_array_equal(pop.propose(np.random.default_rng(5)), one_by_one)


def test_population_learns_the_best_arm():
    rng = np.random.default_rng(0)
    pop = BanditPopulation(5, 7, (0.5, 1.5), 2, replace_every=10_000, normalise=True, rng=rng)
    means = np.array([0.0, 0.2, 1.0, 0.1, 0.3])
    for _ in range(600):
        arm = pop.select(rng)
        pop.update(arm, means[arm] + rng.normal(scale=0.3), rng)
    assert pop.selections.argmax() == 2
    assert pop.selections[2] > 0.5 * pop.selections.sum()


def test_replacement_every_t_replace_episodes():
    rng = np.random.default_rng(0)
    pop = BanditPopulation(4, 7, (0.5, 1.5), 2, replace_every=50, normalise=True, rng=rng)
    for episode in range(1, 151):
        before = pop.counts.sum(axis=1).copy()
        pop.update(int(rng.integers(4)), 1.0, rng)
        after = pop.counts.sum(axis=1)
        reset = np.flatnonzero(after < before + 1)
        if episode % 50 == 0:
            assert len(reset) == 1 and after[reset[0]] == 0
        else:
            assert len(reset) == 0
    assert pop.replacements == 3
    assert ((pop.c >= 0.5) & (pop.c <= 1.5)).all()


def test_discretisation_of_lbc_table_3():
    tau = Discretisation(0.0, math.exp(4), 0.2)
    assert tau.num_arms == math.ceil(math.exp(4) / 0.2)
    assert tau.region(tau.num_arms - 1)[1] == pytest.approx(math.exp(4))
    omega = Discretisation(0.0, 1.0, 0.1)
    assert omega.num_arms == 10
    rng = np.random.default_rng(0)
    lo, hi = omega.region(3)
    assert (lo, hi) == pytest.approx((0.3, 0.4))
    assert all(lo <= omega.sample(3, rng) <= hi for _ in range(100))


def test_controller_psi_and_snapshot_round_trip():
    kwargs = dict(num_policies=3, tau=Discretisation(0, 10, 1), omega=Discretisation(0, 1, 0.1), population=7,
                  c_range=(0.5, 1.5), top_d=4, replace_every=50, normalise=True)
    ctl = BehaviourController(seed=1, **kwargs)
    for _ in range(30):
        choice = ctl.select()
        assert len(choice.tau) == 3 and abs(sum(choice.omega) - 1) < 1e-9
        for arm, t in zip(choice.arms[:3], choice.tau, strict=True):
            assert arm <= t <= arm + 1
        ctl.update(choice.arms, float(sum(choice.tau)))
    clone = BehaviourController(seed=99, **kwargs)
    clone.load_dict(ctl.to_dict())
    assert [clone.select() for _ in range(5)] == [ctl.select() for _ in range(5)]


def test_frozen_controller_draws_psi_uniformly_and_learns_nothing():
    """LBC's random-selection ablation: bandits that never learn vote uniformly over the arms."""
    tau = Discretisation(0.0, 1.0, 0.25)
    ctl = BehaviourController(1, tau, Discretisation(0.0, 1.0, 0.5), population=7, c_range=(0.5, 1.5), top_d=4,
                              replace_every=50, normalise=True, seed=0, learn=False)
    counts = np.zeros(tau.num_arms)
    for _ in range(4000):
        choice = ctl.select()
        counts[choice.arms[0]] += 1
        ctl.update(choice.arms, float(choice.arms[0] == 3) * 10.0)   # arm 3 would be learned as best
    np.testing.assert_allclose(counts / counts.sum(), 1 / tau.num_arms, atol=0.03)
    assert ctl.episodes == 4000 and all(not p.counts.any() for p in ctl.populations)


def test_sliding_window_ucb_by_hand():
    sw = SlidingWindowUCB(num_arms=3, window=4, beta=1.0, epsilon=0.0)
    rng = np.random.default_rng(0)
    played = []
    for g in (1.0, 5.0, 2.0):               # unplayed arms first, in order
        arm = sw.select(rng)
        played.append(arm)
        sw.update(arm, g)
    assert played == [0, 1, 2]
    # window holds (0,1), (1,5), (2,2): scores 1 + 1, 5 + 1, 2 + 1 -> arm 1
    assert sw.select(rng) == 1
    sw.update(1, 5.0)
    sw.update(1, -20.0)                     # window of 4 drops (0, 1): (1,5) (2,2) (1,5) (1,-20)
    counts, sums = sw.stats()
    np.testing.assert_array_equal(counts, [0, 3, 1])
    assert sw.select(rng) == 0              # arm 0 left the window: played first again
    sw.update(0, 0.0)                       # drops the first (1, 5): (2,2) (1,5) (1,-20) (0,0)
    counts, sums = sw.stats()
    np.testing.assert_array_equal(counts, [1, 2, 1])
    # scores: arm 0: 0 + 1; arm 1: -7.5 + sqrt(1/2); arm 2: 2 + 1
    assert sw.select(rng) == 2


def test_sliding_window_ucb_explores_uniformly_with_probability_epsilon():
    sw = SlidingWindowUCB(num_arms=4, window=100, beta=0.0, epsilon=0.5)
    for arm, g in ((0, 10.0), (1, 0.0), (2, 0.0), (3, 0.0)):
        sw.update(arm, g)
    rng = np.random.default_rng(1)
    picks = np.bincount([sw.select(rng) for _ in range(8000)], minlength=4) / 8000
    np.testing.assert_allclose(picks, [0.5 + 0.125, 0.125, 0.125, 0.125], atol=0.02)


def test_mixture_controller_learns_the_best_j_and_survives_a_snapshot():
    """Agent57's meta-controller per actor: j from the sliding-window UCB, psi fixed; a snapshot restores
    the window, the counts and the random stream."""
    ctl = MixtureController(num_mixtures=4, window=50, beta=0.5, epsilon=0.1, fixed_tau=1.0, seed=3)
    for _ in range(300):
        choice = ctl.select()
        assert choice.tau == (1.0,) and choice.omega == (1.0,) and choice.arms == (choice.mixture,)
        ctl.update(choice.arms, 1.0 if choice.mixture == 2 else 0.0)
    assert ctl.episodes == 300
    assert int(np.argmax(ctl.selections)) == 2 and ctl.selections[2] > 0.7 * 300
    restored = MixtureController(4, 50, 0.5, 0.1, 1.0, seed=99)
    restored.load_dict(ctl.to_dict())
    assert [ctl.select().mixture for _ in range(20)] == [restored.select().mixture for _ in range(20)]
    assert restored.stats()[0]["name"] == "mixture"
    with pytest.raises(ValueError, match="mixture indices"):
        MixtureController(2, 50, 0.5, 0.1, 1.0, seed=0).load_dict(ctl.to_dict())


def test_frozen_mixture_controller_draws_j_uniformly():
    ctl = MixtureController(num_mixtures=4, window=50, beta=0.5, epsilon=0.0, fixed_tau=1.0, seed=0, learn=False)
    picks = []
    for _ in range(4000):
        choice = ctl.select()
        ctl.update(choice.arms, 10.0 if choice.mixture == 0 else 0.0)
        picks.append(choice.mixture)
    np.testing.assert_allclose(np.bincount(picks) / 4000, 0.25, atol=0.03)


def test_bandit_state_keeps_at_most_max_actors_forgetting_the_least_recently_seen(tmp_path):
    """Issue 12: 10^5 actor ids grew the bandit to 1.64 GB. Its state is bounded; a snapshot keeps the
    survivors and their order."""
    from bandit_svc.state import BanditState, UnknownEpisode
    from lbc.config import load_config

    state = BanditState(load_config("cpu", ["bandit.max_actors=3"]))
    first, _ = state.select("a")
    for name in ("b", "c"):
        state.select(name)
    state.select("a")                  # a is now the most recent
    state.select("d")                  # b, the least recently seen, goes
    assert list(state.controllers) == ["c", "a", "d"] and state.evicted == 1
    state.report("a", first, 1.0)
    for i in range(100):
        state.select(f"x{i}")
    assert len(state.controllers) == len(state.pending) == len(state.next_episode) == 3
    with pytest.raises(UnknownEpisode):
        state.report("a", first, 1.0)
    state.save(tmp_path / "s.json")
    again = BanditState(load_config("cpu", ["bandit.max_actors=3"]))
    again.restore(tmp_path / "s.json")
    assert list(again.controllers) == ["x97", "x98", "x99"]


def test_a_damaged_bandit_snapshot_falls_back_to_the_one_before(tmp_path, caplog):
    """Issue 12: a truncated newest snapshot used to stop the service although an older good one
    existed; a write killed midway left a .tmp behind for ever."""
    from bandit_svc.state import BanditState
    from lbc.config import load_config

    cfg = load_config("cpu")
    state = BanditState(cfg)
    episode, _ = state.select("a")
    state.report("a", episode, 1.0)
    path = tmp_path / "bandit" / "state.json"
    state.save(path)
    state.select("b")
    state.save(path)                                   # the first snapshot is now state.json.prev
    path.write_text(path.read_text()[:100])            # cut short, as by a full disk
    (path.parent / "state.json.tmp").write_text("{")   # as left by a killed write
    again = BanditState(cfg)
    assert again.restore(path) and list(again.controllers) == ["a"]
    assert again.controllers["a"].episodes == 1
    assert not (path.parent / "state.json.tmp").exists()
    assert "does not read" in caplog.text
    (path.parent / "state.json.prev").write_text("")
    with pytest.raises(ValueError, match="no bandit snapshot"):
        BanditState(cfg).restore(path)


@pytest.mark.parametrize("preset, kind, names", [("cpu", "BehaviourController", 6), ("dice", "BvaController", 2),
                                                 ("gdi-i3", "BvaController", 3), ("agent57", "MixtureController", 1)])
def test_one_factory_makes_each_preset_s_controller(preset, kind, names):
    """lbc.controllers chooses the algorithm from the configuration alone; every controller answers the
    Controller interface with as many arms as it names dimensions, and learns from a return."""
    from lbc.config import load_config
    from lbc.controllers import dimension_names, make_controller

    cfg = load_config(preset)
    ctl = make_controller(cfg, seed=3)
    assert type(ctl).__name__ == kind and len(dimension_names(cfg)) == names
    choice = ctl.select()
    assert len(choice.arms) == names and len(ctl.stats()) == names
    ctl.update(choice.arms, 1.0)
    assert ctl.episodes == 1
    other = make_controller(cfg, seed=4)
    other.load_dict(ctl.to_dict())
    assert other.episodes == 1
