"""reverse_affine_scan (the log-depth scan under V-trace and Retrace) against the plain loop it replaces."""

import numpy as np
import pytest
import torch

from lbc.losses import reverse_affine_scan, vtrace


def loop_reference(a: np.ndarray, b: np.ndarray, last: np.ndarray) -> np.ndarray:
    """x_t = b_t + a_t x_{t+1} from x_T = last, one step at a time."""
    x = np.empty_like(b)
    acc = last
    for t in reversed(range(len(b))):
        acc = b[t] + a[t] * acc
        x[t] = acc
    return x


# every length up to past two powers of two: a round's stride reaching or overshooting the end is where a
# doubling scan goes wrong
@pytest.mark.parametrize("steps", range(1, 19))
def test_scan_matches_the_loop_at_every_length(steps):
    rng = np.random.default_rng(steps)
    a = rng.uniform(-1.2, 1.2, (steps, 3, 2)) * (rng.random((steps, 3, 2)) > 0.2)   # zeros: episode ends
    b, last = rng.normal(size=(steps, 3, 2)), rng.normal(size=(3, 2))
    got = reverse_affine_scan(torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(last))
    np.testing.assert_allclose(got.numpy(), loop_reference(a, b, last), rtol=1e-12, atol=1e-12)


def test_scan_of_one_axis_and_float32():
    rng = np.random.default_rng(0)
    a, b = rng.uniform(0, 1, 81).astype(np.float32), rng.normal(size=81).astype(np.float32)
    got = reverse_affine_scan(torch.from_numpy(a), torch.from_numpy(b), torch.tensor(2.0))
    np.testing.assert_allclose(got.numpy(), loop_reference(a.astype(np.float64), b.astype(np.float64), 2.0),
                               rtol=1e-5, atol=1e-5)


def test_zero_a_cuts_the_recursion():
    """a_t = 0 (an episode's end): x_t is b_t whatever follows."""
    a = torch.tensor([0.5, 0.0, 0.5, 0.5])
    b = torch.tensor([1.0, 2.0, 3.0, 4.0])
    got = reverse_affine_scan(a, b, torch.tensor(8.0))
    # x_3 = 4 + 0.5 * 8 = 8, x_2 = 3 + 4 = 7, x_1 = 2, x_0 = 1 + 0.5 * 2 = 2
    torch.testing.assert_close(got, torch.tensor([2.0, 2.0, 7.0, 8.0]))


def test_vtrace_on_the_papers_sequence_length():
    """V-trace over 80 steps (the paper's learning length), float32 as the learner runs it, against its loop."""
    rng = np.random.default_rng(1)
    steps, batch = 80, 4
    values, rewards = rng.normal(size=(steps, batch)), rng.normal(size=(steps, batch))
    discounts = 0.997 * (rng.random((steps, batch)) > 0.05)
    rhos = np.exp(rng.normal(scale=0.5, size=(steps, batch)))
    bootstrap = rng.normal(size=batch)
    deltas = np.minimum(1.0, rhos) * (rewards + discounts * np.vstack([values[1:], bootstrap]) - values)
    want = values + loop_reference(discounts * np.minimum(1.0, rhos), deltas, np.zeros(batch))
    t = {k: torch.tensor(v, dtype=torch.float32) for k, v in
         dict(values=values, bootstrap_value=bootstrap, rewards=rewards, discounts=discounts).items()}
    got = vtrace(**t, log_rhos=torch.tensor(np.log(rhos), dtype=torch.float32))
    np.testing.assert_allclose(got.vs.numpy(), want, rtol=1e-4, atol=1e-4)
