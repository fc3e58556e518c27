"""The LayerNorm-LSTM's unroll (lbc.nets.ln_lstm_step over time) with its backward through time written out,
for the learner's eager step.

Autograd records about 15 operations per step forward and runs about 26 backward, each one kernel launch on a
GPU, where launching is what bounds the paper preset's learner (docs/speed.md). Written out, a step is 12
operations forward with nothing recorded and 10 backward; everything that does not depend on the step before
(the gates' derivatives, the gradients of the weights and the norms' gains) is computed once over all steps,
the weight gradient as one matrix product over T * B rows instead of T small ones.

Forward, per step t, with keep_t zero where the state resets (Ba et al. 2016 eq. 20-22):

    h' = keep_t h_{t-1},  c' = keep_t c_{t-1},  p_t = W h'
    (i, f, g, o) = x_t + LN(p_t; a_h)                     x_t: the input's normalised projection
    c_t = sigma(f) c' + sigma(i) tanh(g),  h_t = sigma(o) tanh(LN(c_t; a_c, b_c))

Backward, with dh_t the gradient reaching h_t (from the output at t and from step t + 1) and dc from step t + 1:

    d_o = dh_t tanh(l_t) sigma'(o),  dl_t = dh_t sigma(o) (1 - tanh^2(l_t))     l_t = LN(c_t)
    dc_t = LN'(c_t)^T dl_t + dc_{t+1}
    (d_i, d_f, d_g) = dc_t (tanh(g) sigma'(i), c' sigma'(f), sigma(i) (1 - tanh^2(g)))
    dc_t -> dc for step t - 1:  dc_t sigma(f) keep_t,      dp_t = LN'(p_t)^T (d_i, d_f, d_g, d_o)
    dh_{t-1} += (W^T dp_t) keep_t,   dx_t = (d_i, d_f, d_g, d_o),   dW = sum_t dp_t h'_t^T

LN' is layer normalisation's own backward (torch's, the kernel autograd runs); the gains' gradients come from
it over all steps at once. Tested against autograd through lbc.nets.ln_lstm_steps in float64.
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable

import torch

from lbc import native

EPS = 1e-5   # nn.LayerNorm's default, as the module's norms have
MAX_GRAPHS = 16   # CUDA graphs kept per network and its copies; a shape past them unrolls eagerly
GRAPH_BATCH = 8   # forward_by_graphs pads the batch to a multiple of this
_layer_norm_backward = torch.ops.aten.native_layer_norm_backward
_scripting = threading.Lock()


def on_cpu(fn: Callable[..., tuple[torch.Tensor, ...]]) -> Callable[..., tuple[torch.Tensor, ...]]:
    """unroll_forward or unroll_backward compiled by TorchScript, for CPU tensors (decision 84): the same
    operations in the same order, so the same bits, with the loop over time run by TorchScript's interpreter
    outside Python. Eager, a step's dozen small operations cost more in Python and its lock than in their
    kernels (at batch 1 two thirds of the unroll's time), and the learner's two threads, the step's and the
    one preparing the next batch, each unrolling, wait on each other for that lock. Not on a GPU: CUDA graphs
    replay the unroll there (GraphCache), and TorchScript's GPU fuser would change the rounding."""
    with _scripting:   # both of the learner's threads may ask first
        return _script(fn)


@functools.cache
def _script(fn: Callable[..., tuple[torch.Tensor, ...]]) -> Callable[..., tuple[torch.Tensor, ...]]:
    with warnings.catch_warnings():   # torch 2.13 calls torch.jit.script deprecated; decision 84 says why it is used
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.script(fn)


def unroll_forward(xs: torch.Tensor, keep: torch.Tensor, h: torch.Tensor, c: torch.Tensor, hidden_weight: torch.Tensor,
                   hidden_gain: torch.Tensor, cell_gain: torch.Tensor, cell_bias: torch.Tensor, eps: float = EPS
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                              torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                              torch.Tensor]:
    """The forward above over xs [T, B, 4H]: (every step's h [T, B, H], the last h, the last c, then what
    unroll_backward reads: the per-step values and the two norms' means and inverse deviations). The product
    W h' computes in hidden_weight's dtype (h' rounded to it, as autocast rounds a matrix product's inputs),
    everything else in xs's. TorchScript compiles it as written (on_cpu)."""
    steps, batch, gates = xs.shape
    size = gates // 4
    kept_c, cells = xs.new_empty([steps, batch, size]), xs.new_empty([steps, batch, size])
    tanh_cells, out = xs.new_empty([steps, batch, size]), xs.new_empty([steps, batch, size])
    kept_h = xs.new_empty([steps, batch, size], dtype=hidden_weight.dtype)
    projected, acts = xs.new_empty([steps, batch, gates]), xs.new_empty([steps, batch, gates])
    p_means, p_rstds, c_means, c_rstds = [], [], [], []
    weight_t = hidden_weight.t()
    mixed = hidden_weight.dtype != xs.dtype
    for t in range(steps):
        hk = torch.mul(h, keep[t], out=kept_h[t])
        ck = torch.mul(c, keep[t], out=kept_c[t])
        p = projected[t].copy_(torch.mm(hk, weight_t)) if mixed else torch.mm(hk, weight_t, out=projected[t])
        normed, p_mean, p_rstd = torch.native_layer_norm(p, [gates], hidden_gain, None, eps)
        a = torch.sigmoid(normed.add_(xs[t]), out=acts[t])   # sigma(g) is overwritten by tanh(g) next
        i, f, g, o = a.split(size, dim=1)
        torch.tanh(normed[:, 2 * size:3 * size], out=g)
        c = torch.mul(f, ck, out=cells[t]).addcmul_(i, g)
        normed_c, c_mean, c_rstd = torch.native_layer_norm(c, [size], cell_gain, cell_bias, eps)
        h = torch.mul(o, torch.tanh(normed_c, out=tanh_cells[t]), out=out[t])
        p_means.append(p_mean)
        p_rstds.append(p_rstd)
        c_means.append(c_mean)
        c_rstds.append(c_rstd)
    # the last state apart: an output must not be a view of another
    return (out, h.clone(), c.clone(), kept_h, kept_c, projected, acts, cells, tanh_cells, torch.stack(p_means),
            torch.stack(p_rstds), torch.stack(c_means), torch.stack(c_rstds))


def unroll_backward(d_out: torch.Tensor, d_h: torch.Tensor, d_c: torch.Tensor, keep: torch.Tensor,
                    hidden_weight: torch.Tensor, hidden_gain: torch.Tensor, cell_gain: torch.Tensor,
                    cell_bias: torch.Tensor, kept_h: torch.Tensor, kept_c: torch.Tensor, projected: torch.Tensor,
                    acts: torch.Tensor, cells: torch.Tensor, tanh_cells: torch.Tensor, p_mean: torch.Tensor,
                    p_rstd: torch.Tensor, c_mean: torch.Tensor, c_rstd: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                               torch.Tensor]:
    """The backward above from the gradients reaching every step's h, the last h and the last c, and what
    unroll_forward kept: the gradients of (xs, h, c, hidden_weight, hidden_gain, cell_gain, cell_bias). The
    products with W and the weight's gradient compute in hidden_weight's dtype, as in the forward (dp rounded
    to it), the weight's gradient summed over all the steps inside its one product. TorchScript compiles it as
    written (on_cpu)."""
    steps, batch, gates = projected.shape
    size = gates // 4
    s_i, s_f, tanh_g, s_o = acts.split(size, dim=-1)
    slope = acts * (1 - acts)   # sigma' where acts holds sigma
    # what dc_t multiplies into (d_i, d_f, d_g), [T, B, 3, H], and what dh_t multiplies into d_o and dl
    to_ifg = torch.stack((tanh_g * slope[..., :size], kept_c * slope[..., size:2 * size],
                          s_i * (1 - tanh_g * tanh_g)), dim=2)
    to_o = tanh_cells * slope[..., 3 * size:]
    to_l = s_o * (1 - tanh_cells * tanh_cells)
    carry_c = s_f * keep
    d_gates = acts.new_empty([steps, batch, gates])
    d_normed_c = acts.new_empty([steps, batch, size])
    d_projected = acts.new_empty([steps, batch, gates], dtype=hidden_weight.dtype)
    dh, dc = d_h, d_c
    first_only = [True, False, False]
    for t in range(steps - 1, -1, -1):
        dh = dh + d_out[t]
        dg = d_gates[t]
        torch.mul(dh, to_o[t], out=dg[:, 3 * size:])
        dl = torch.mul(dh, to_l[t], out=d_normed_c[t])
        dc = _layer_norm_backward(dl, cells[t], [size], c_mean[t], c_rstd[t], cell_gain, cell_bias,
                                  first_only)[0].add_(dc)
        torch.mul(dc.unsqueeze(1), to_ifg[t], out=dg[:, :3 * size].view(batch, 3, size))
        dc = dc.mul_(carry_c[t])
        dp = _layer_norm_backward(dg, projected[t], [gates], p_mean[t], p_rstd[t], hidden_gain, None,
                                  first_only)[0]
        d_projected[t] = dp
        dh = torch.mul(torch.mm(d_projected[t], hidden_weight), keep[t])   # in xs's dtype (keep's)
    rows = steps * batch
    d_weight = d_projected.view(rows, gates).t().mm(kept_h.view(rows, size))
    d_hidden_gain = _layer_norm_backward(d_gates.view(rows, gates), projected.view(rows, gates), [gates],
                                         p_mean.view(rows, 1), p_rstd.view(rows, 1), hidden_gain, None,
                                         [False, True, False])[1]
    _, d_cell_gain, d_cell_bias = _layer_norm_backward(
        d_normed_c.view(rows, size), cells.view(rows, size), [size], c_mean.view(rows, 1),
        c_rstd.view(rows, 1), cell_gain, cell_bias, [False, True, True])
    return d_gates, dh, dc, d_weight, d_hidden_gain, d_cell_gain, d_cell_bias


def native_runs(inputs: tuple[torch.Tensor, ...]) -> bool:
    """Whether lbc.native's unroll takes these unroll_forward or unroll_backward inputs: CPU tensors in float32, the
    hidden weight (the fifth) in float32 or bfloat16, and the library loaded (lbc.native.ln_lstm_ops)."""
    # the hidden weight is the fifth of both functions' inputs; unroll_backward's ninth, kept_h, is in its dtype
    return (not inputs[0].is_cuda and all(t.dtype == torch.float32 for i, t in enumerate(inputs) if i not in (4, 8))
            and inputs[4].dtype in (torch.float32, torch.bfloat16) and native.ln_lstm_ops() is not None)


def _run(fn: Callable[..., tuple[torch.Tensor, ...]], inputs: tuple[torch.Tensor, ...], graphs: GraphCache | None,
         native_unroll: bool = False) -> tuple[torch.Tensor, ...]:
    """unroll_forward or unroll_backward over inputs: replayed by `graphs` where given (CUDA); on a CPU by lbc.native's
    C++ where native_unroll asks for it and it runs (native_runs), else as TorchScript compiled it (on_cpu); eagerly
    on a GPU without graphs."""
    if graphs is not None:
        return graphs.run(fn, inputs)
    if inputs[0].is_cuda:
        return fn(*inputs)
    if native_unroll and native_runs(inputs):
        forward, backward = native.ln_lstm_ops()
        return tuple(forward(*inputs, EPS) if fn is unroll_forward else backward(*inputs))
    return on_cpu(fn)(*inputs)


class _Unroll(torch.autograd.Function):

    @staticmethod
    def forward(ctx, graphs: GraphCache | None, native_unroll: bool, *inputs: torch.Tensor   # noqa: ANN001
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        results = _run(unroll_forward, inputs, graphs, native_unroll)
        keep, weights = inputs[1], inputs[4:]
        ctx.graphs, ctx.native_unroll = graphs, native_unroll
        ctx.save_for_backward(keep, *weights, *results[3:])
        return results[:3]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:   # noqa: ANN001
        inputs = (*grads, *ctx.saved_tensors)
        d_xs, dh, dc, *d_weights = _run(unroll_backward, inputs, ctx.graphs, ctx.native_unroll)
        return None, None, d_xs, None, dh, dc, *d_weights


class GraphCache:
    """unroll_forward and unroll_backward as CUDA graphs, one captured per function and input shapes (a few per
    learner: the online network's unroll, its burn-in, the target's), then replayed: one launch for the whole
    unroll instead of about 12 per step forward and 10 backward. The inputs are copied into the graph's own
    tensors and the results copied out, so that nothing a caller holds is overwritten by the next replay.
    Captures and replays hold a lock: the learner's preparing thread unrolls too."""

    def __deepcopy__(self, memo: dict) -> GraphCache:
        return self   # a copied network (the target) shares the graphs: inputs and weights are copied in

    def __init__(self) -> None:
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]] = {}
        self.lock = threading.Lock()

    def run(self, fn: Callable[..., tuple[torch.Tensor, ...]], inputs: tuple[torch.Tensor, ...],
            results: int | None = None) -> tuple[torch.Tensor, ...]:
        """fn(*inputs) by its graph: its first `results` results (all by default), copied out."""
        key = (fn.__name__, *((t.shape, t.dtype, t.device) for t in inputs))
        with self.lock:
            if key not in self.graphs:
                if len(self.graphs) >= MAX_GRAPHS:   # a target network unrolling a varying count of sequences
                    return fn(*inputs)[:results]
                self.graphs[key] = self._capture(fn, inputs)
            graph, static_inputs, static_results = self.graphs[key]
            for static, t in zip(static_inputs, inputs, strict=True):
                static.copy_(t)
            graph.replay()
            return tuple(r.clone() for r in static_results[:results])

    @staticmethod
    def _capture(fn: Callable[..., tuple[torch.Tensor, ...]], inputs: tuple[torch.Tensor, ...]
                 ) -> tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        static_inputs = tuple(t.detach().clone() for t in inputs)
        side = torch.cuda.Stream(inputs[0].device)
        side.wait_stream(torch.cuda.current_stream(inputs[0].device))
        with torch.cuda.stream(side):   # warm-up before capture, as torch.cuda.graphs asks (cuBLAS's workspace)
            fn(*static_inputs)
        torch.cuda.current_stream(inputs[0].device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: another thread (the preparing one) may allocate while this one captures
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            static_results = fn(*static_inputs)
        return graph, static_inputs, static_results


def ln_lstm_steps_bptt(xs: torch.Tensor, keep: torch.Tensor, h: torch.Tensor, c: torch.Tensor,
                       hidden_weight: torch.Tensor, hidden_gain: torch.Tensor, cell_gain: torch.Tensor,
                       cell_bias: torch.Tensor, graphs: GraphCache | None = None, native_unroll: bool = False
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """lbc.nets.ln_lstm_steps (the same arguments and results: every step's h [T, B, H] and the last (h, c)) with
    the backward above, outside autocast. Float tensors of one dtype, but for hidden_weight, which may be in a
    lower one (bfloat16) for the recurrent products: LayerNormLSTM's unroll under autocast passes it cast once,
    where autocast would cast it at every step and its gradient back at every step. With `graphs` (CUDA
    tensors only) the forward and the backward replay CUDA graphs; with native_unroll (CPU tensors) they run
    lbc.native's C++ where it is built and loads (native_runs): the same equations (decision 90)."""
    return _Unroll.apply(graphs, native_unroll, xs, keep, h, c, hidden_weight, hidden_gain, cell_gain, cell_bias)


def forward_by_graphs(graphs: GraphCache, xs: torch.Tensor, keep: torch.Tensor, h: torch.Tensor, c: torch.Tensor,
                      *weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """unroll_forward's (out, h, c) by `graphs`, the batch padded with zero rows up to a multiple of GRAPH_BATCH:
    a target network unrolls the sequences it does not keep (lbc.target_cache), a count that changes from step
    to step, and one graph per count would fill MAX_GRAPHS and leave the rest eager. Rows do not mix (the norms
    are per row), so the padding changes no real row's results."""
    batch = xs.shape[1]
    pad = -batch % GRAPH_BATCH
    if pad:
        xs, keep = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (xs, keep))
        h, c = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (h, c))
    out, h, c = graphs.run(unroll_forward, (xs, keep, h, c, *weights), results=3)
    return out[:, :batch], h[:batch], c[:batch]

