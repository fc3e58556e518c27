"""RMSProp as TensorFlow 1 made it, which IMPALA's code trained with (tf.train.RMSPropOptimizer).

torch.optim.RMSprop differs from it in two places that matter at IMPALA's settings (decision 76):
- TensorFlow starts the mean square at 1, torch at 0. torch's first step is lr * g / (sqrt((1 - rho) g^2) + eps),
  up to 1 / sqrt(1 - rho) = 10 times the learning rate for every weight at rho = 0.99; TensorFlow's first steps
  are lr * g / sqrt(rho + ...), about lr * g, until the mean square has decayed to the gradients' own scale
  (a few hundred steps).
- TensorFlow adds epsilon inside the square root, torch outside: IMPALA's epsilon of 0.01 floors the denominator at
  sqrt(0.01) = 0.1 in TensorFlow and at 0.01 in torch.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def rmsprop_tf_update(param: torch.Tensor, grad: torch.Tensor, mean_square: torch.Tensor, mom: torch.Tensor,
                      lr: float, decay: float, eps: float, momentum: float) -> None:
    """One step of TensorFlow 1's RMSProp on one parameter, in place (mean_square starts at ones, mom at zeros):

        mean_square <- decay * mean_square + (1 - decay) * g^2
        mom         <- momentum * mom + lr * g / sqrt(mean_square + eps)
        param       <- param - mom
    """
    mean_square.mul_(decay).addcmul_(grad, grad, value=1.0 - decay)
    mom.mul_(momentum).addcdiv_(grad, mean_square.add(eps).sqrt_(), value=lr)
    param.sub_(mom)


class RMSpropTF(torch.optim.Optimizer):
    """TensorFlow 1's RMSProp (rmsprop_tf_update) over a model's parameters. weight_decay adds wd * param to the
    gradient first, as torch.optim.RMSprop does (TensorFlow's optimiser has none; IMPALA used none)."""

    initial_state = {"mean_square": 1.0, "mom": 0.0}   # what each parameter's statistics start at

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float, decay: float = 0.99, eps: float = 0.01,
                 momentum: float = 0.0, weight_decay: float = 0.0) -> None:
        super().__init__(params, {"lr": lr, "decay": decay, "eps": eps, "momentum": momentum,
                                  "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: None = None) -> None:
        if closure is not None:
            raise ValueError("RMSpropTF takes no closure")
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad if group["weight_decay"] == 0 else p.grad.add(p, alpha=group["weight_decay"])
                state = self.state[p]
                if not state:
                    for key, start in self.initial_state.items():
                        state[key] = torch.full_like(p, start, memory_format=torch.preserve_format)
                rmsprop_tf_update(p, grad, state["mean_square"], state["mom"], group["lr"], group["decay"],
                                  group["eps"], group["momentum"])
