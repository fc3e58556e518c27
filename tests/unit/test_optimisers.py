"""TensorFlow 1's RMSProp (lbc.optimisers) against a plain numpy loop of tf.train.RMSPropOptimizer's update as its
documentation writes it: mean_square = decay * mean_square + (1 - decay) * g^2, mom = momentum * mom +
lr * g / sqrt(mean_square + epsilon), delta = -mom, with the mean square's slot initialised to ones."""

import numpy as np
import pytest
import torch

from lbc.optimisers import RMSpropTF
from lbc.recycling import _restart_moments


def _tf_rmsprop_reference(theta: np.ndarray, grads: list[np.ndarray], lr: float, decay: float, eps: float,
                          momentum: float) -> np.ndarray:
    theta = theta.astype(np.float64).copy()
    ms, mom = np.ones_like(theta), np.zeros_like(theta)
    for g in grads:
        for i in range(theta.size):   # element by element, as the update is written
            ms.flat[i] = decay * ms.flat[i] + (1 - decay) * g.flat[i] ** 2
            mom.flat[i] = momentum * mom.flat[i] + lr * g.flat[i] / np.sqrt(ms.flat[i] + eps)
            theta.flat[i] -= mom.flat[i]
    return theta


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_rmsprop_tf_follows_tensorflows_update(momentum):
    rng = np.random.default_rng(0)
    theta0 = rng.normal(size=(3, 4))
    grads = [rng.normal(scale=s, size=(3, 4)) for s in (0.01, 1.0, 30.0, 0.1, 5.0)]
    param = torch.nn.Parameter(torch.tensor(theta0, dtype=torch.float64))
    opt = RMSpropTF([param], lr=6e-4, decay=0.99, eps=0.01, momentum=momentum)
    for g in grads:
        param.grad = torch.tensor(g)
        opt.step()
    np.testing.assert_allclose(param.detach().numpy(), _tf_rmsprop_reference(theta0, grads, 6e-4, 0.99, 0.01,
                                                                             momentum), rtol=1e-12, atol=1e-15)


def test_rmsprop_tf_first_step_is_about_lr_times_g_where_torchs_is_ten_times_lr():
    # the property that sets them apart (decision 76): from a mean square of 1 the first step of a small gradient
    # is about lr * g; torch's, from 0, is lr * g / (0.1 |g| + eps), near 10 lr whatever g's size
    g = torch.full((4,), 1e-3)
    ours, torchs = torch.nn.Parameter(torch.zeros(4)), torch.nn.Parameter(torch.zeros(4))
    ours.grad, torchs.grad = g.clone(), g.clone()
    RMSpropTF([ours], lr=1.0, decay=0.99, eps=0.01).step()
    torch.optim.RMSprop([torchs], lr=1.0, alpha=0.99, eps=1e-8).step()
    torch.testing.assert_close(-ours.detach(), g / torch.sqrt(torch.tensor(0.99 + 0.01 * 1e-6 + 0.01)))
    torch.testing.assert_close(-torchs.detach(), torch.full((4,), 10.0), rtol=1e-4, atol=0)


def test_weight_decay_adds_to_the_gradient_as_torchs_rmsprop_does():
    param = torch.nn.Parameter(torch.tensor([2.0]))
    param.grad = torch.tensor([0.5])
    RMSpropTF([param], lr=0.1, decay=0.9, eps=0.0, weight_decay=0.25).step()
    g = 0.5 + 0.25 * 2.0
    torch.testing.assert_close(param.detach(), torch.tensor([2.0 - 0.1 * g / (0.9 + 0.1 * g * g) ** 0.5]))


def test_a_recycled_unit_restarts_from_the_optimisers_own_initial_statistics():
    param = torch.nn.Parameter(torch.zeros(3, 2))
    opt = RMSpropTF([param], lr=0.1)
    param.grad = torch.ones(3, 2)
    opt.step()
    _restart_moments(opt, param, torch.tensor([1]))
    state = opt.state[param]
    assert torch.equal(state["mean_square"][1], torch.ones(2)) and not state["mom"][1].any()
    assert torch.allclose(state["mean_square"][0], torch.full((2,), 0.99 + 0.01))


def test_rmsprop_tf_refuses_a_closure():
    with pytest.raises(ValueError, match="closure"):
        RMSpropTF([torch.nn.Parameter(torch.zeros(1))], lr=0.1).step(lambda: 0.0)
