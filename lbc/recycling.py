"""ReDo: recycling dormant units (Sokar et al. 2023, "The Dormant Neuron Phenomenon in Deep RL", Alg. 1).

A unit i of a ReLU layer with H units is tau-dormant on inputs x when its normalised activity

    s_i = E_x |h_i(x)| / ( (1/H) sum_k E_x |h_k(x)| )   <=   tau

(a convolution's unit is a channel, its activity averaged over positions too). Every so many steps,
each dormant unit gets fresh incoming weights (drawn as at initialisation) and zero outgoing weights,
and the optimiser's moments of those weights are zeroed. The zero outgoing weights leave the network's
output unchanged at the moment of recycling; the unit can then learn again.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class Link:
    """One ReLU layer and where its units go: `layer` (Conv2d or Linear) makes the units, `relu` is the
    activation after it, `consumer` is the weight [out, in, ...] that reads them, and unit i is the
    consumer's input columns i * `span` .. (i + 1) * `span` (span > 1: a channel flattened over positions);
    columns after the units' (the recurrent core's other inputs) are left alone."""

    layer: nn.Conv2d | nn.Linear
    relu: nn.ReLU
    consumer: nn.Parameter
    span: int = 1


def unit_activity(module: nn.Module, x: torch.Tensor, relus: list[nn.ReLU]) -> list[torch.Tensor]:
    """E_x |h_i(x)| for every unit of each of `relus` (modules inside `module`), from one no-grad pass of
    `module` on `x`; a convolution's unit is a channel, averaged over positions too."""
    activity: dict[int, torch.Tensor] = {}
    hooks = []
    for n, relu in enumerate(relus):
        def keep(_m: nn.Module, _i: tuple, out: torch.Tensor, n: int = n) -> None:
            a = out.abs()
            activity[n] = a.mean(0) if a.dim() == 2 else a.transpose(0, 1).flatten(1).mean(1)
        hooks.append(relu.register_forward_hook(keep))
    try:
        with torch.no_grad():
            module(x)
    finally:
        for hook in hooks:
            hook.remove()
    return [activity[n] for n in range(len(relus))]


def dormant_scores(module: nn.Module, x: torch.Tensor, links: list[Link]) -> list[torch.Tensor]:
    """s_i for every unit of each link's ReLU, from one no-grad pass of `module` on `x`."""
    activity = unit_activity(module, x, [link.relu for link in links])
    return [a / a.mean().clamp_min(1e-12) for a in activity]


def recycle(links: list[Link], scores: list[torch.Tensor], tau: float, optimiser: torch.optim.Optimizer | None,
            reinit: Callable[[nn.Module], None]) -> list[int]:
    """Recycle the units with s_i <= tau (ReDo, Alg. 1); returns how many per link.

    reinit(layer) draws a layer's weights as at initialisation; only the dormant units' rows are taken."""
    counts = []
    for link, score in zip(links, scores, strict=True):
        dormant = score <= tau
        counts.append(int(dormant.sum()))
        if not dormant.any():
            continue
        fresh = copy.deepcopy(link.layer)
        reinit(fresh)
        columns = dormant.repeat_interleave(link.span)
        columns = torch.cat([columns, columns.new_zeros(link.consumer.shape[1] - len(columns))])
        with torch.no_grad():
            link.layer.weight[dormant] = fresh.weight[dormant].to(link.layer.weight.dtype)
            if link.layer.bias is not None:
                link.layer.bias[dormant] = fresh.bias[dormant].to(link.layer.bias.dtype)
            link.consumer[:, columns] = 0.0
        if optimiser is not None:
            _restart_moments(optimiser, link.layer.weight, dormant)
            if link.layer.bias is not None:
                _restart_moments(optimiser, link.layer.bias, dormant)
            _restart_moments(optimiser, link.consumer, (slice(None), columns))
    return counts


def _restart_moments(optimiser: torch.optim.Optimizer, param: torch.Tensor, index: torch.Tensor | tuple) -> None:
    """Restart the optimiser's running statistics (Adam's moments, RMSProp's square average) at `index`: zero, or
    the value the optimiser starts them at where it names one (`initial_state`: TensorFlow's RMSProp, 1)."""
    initial = getattr(optimiser, "initial_state", {})
    for key, value in optimiser.state.get(param, {}).items():
        if isinstance(value, torch.Tensor) and value.shape == param.shape:
            value[index] = initial.get(key, 0.0)
