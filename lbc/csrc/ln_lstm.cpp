// The LayerNorm-LSTM's unroll on a CPU (decision 90): lbc/lstm_bptt.py's unroll_forward and unroll_backward with
// the same arguments, results and equations (see there), each step's matrix product by ATen (oneDNN) as there and
// everything else in one pass over each row, where TorchScript runs a dozen small kernels a step. Float32 tensors,
// but for the hidden weight, float32 or bfloat16 (the bf16 learner's); the products' inputs and results rounded to
// its dtype as torch.mm rounds them. Built by `python -m lbc.native` (make install); loaded by lbc.native.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using at::Tensor;

// float -> bfloat16 bits, rounding to nearest even as torch's conversion does (finite values)
inline uint16_t to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float from_bf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// mean and 1 / sqrt(var + eps) of a row, var biased, as layer normalisation takes them
inline void moments(const float* x, int64_t n, double eps, float* mean, float* rstd) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) sum += x[j];
  const float m = sum / static_cast<float>(n);
  float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
  for (int64_t j = 0; j < n; ++j) sq += (x[j] - m) * (x[j] - m);
  *mean = m;
  *rstd = 1.0f / std::sqrt(sq / static_cast<float>(n) + static_cast<float>(eps));
}

std::vector<Tensor> unroll_forward(const Tensor& xs_in, const Tensor& keep_in, const Tensor& h0, const Tensor& c0,
                                   const Tensor& hidden_weight, const Tensor& hidden_gain_in,
                                   const Tensor& cell_gain_in, const Tensor& cell_bias_in, double eps) {
  for (const Tensor* t : {&xs_in, &keep_in, &h0, &c0, &hidden_gain_in, &cell_gain_in, &cell_bias_in})
    TORCH_CHECK(t->scalar_type() == at::kFloat, "ln_lstm_forward: float32 tensors but for the hidden weight");
  TORCH_CHECK(hidden_weight.scalar_type() == at::kFloat || hidden_weight.scalar_type() == at::kBFloat16,
              "ln_lstm_forward: a float32 or bfloat16 hidden weight");
  const Tensor xs = xs_in.contiguous(), keep = keep_in.contiguous();
  const Tensor hidden_gain = hidden_gain_in.contiguous(), cell_gain = cell_gain_in.contiguous(),
               cell_bias = cell_bias_in.contiguous();
  TORCH_CHECK(xs.dim() == 3 && xs.size(2) % 4 == 0, "ln_lstm_forward: xs [T, B, 4H]");
  const int64_t steps = xs.size(0), batch = xs.size(1), gates = xs.size(2), size = gates / 4;
  TORCH_CHECK(keep.numel() == steps * batch && h0.numel() == batch * size && c0.numel() == batch * size &&
                  hidden_weight.size(0) == gates && hidden_weight.size(1) == size,
              "ln_lstm_forward: keep [T, B, 1], h and c [B, H], hidden_weight [4H, H]");
  const auto f32 = xs.options();
  const bool mixed = hidden_weight.scalar_type() != at::kFloat;
  // what unroll_backward reads, as unroll_forward keeps it: the reset state (h' in the product's dtype), W h',
  // the activations (sigma of i, f, o and tanh of g), the cells, tanh of their norm, and both norms' statistics
  Tensor kept_h = at::empty({steps, batch, size}, f32.dtype(hidden_weight.scalar_type()));
  Tensor kept_c = at::empty({steps, batch, size}, f32), cells = at::empty({steps, batch, size}, f32);
  Tensor tanh_cells = at::empty({steps, batch, size}, f32), out = at::empty({steps, batch, size}, f32);
  Tensor projected = at::empty({steps, batch, gates}, f32), acts = at::empty({steps, batch, gates}, f32);
  Tensor p_mean = at::empty({steps, batch, 1}, f32), p_rstd = at::empty({steps, batch, 1}, f32);
  Tensor c_mean = at::empty({steps, batch, 1}, f32), c_rstd = at::empty({steps, batch, 1}, f32);
  const Tensor weight_t = hidden_weight.t();
  Tensor h = h0.contiguous(), c = c0.contiguous();
  const float* hg = hidden_gain.data_ptr<float>();
  const float* cg = cell_gain.data_ptr<float>();
  const float* cb = cell_bias.data_ptr<float>();
  std::vector<float> row(gates);   // a row's normalised gates plus its input projection
  Tensor scratch = at::empty({batch, gates}, f32.dtype(hidden_weight.scalar_type()));
  for (int64_t t = 0; t < steps; ++t) {
    const float* k = keep.data_ptr<float>() + t * batch;
    const float* hp = h.data_ptr<float>();
    const float* cp = c.data_ptr<float>();
    float* kc = kept_c.data_ptr<float>() + t * batch * size;
    if (mixed) {
      auto* kh = reinterpret_cast<uint16_t*>(kept_h.data_ptr<at::BFloat16>()) + t * batch * size;
      for (int64_t b = 0; b < batch; ++b) {
        const float kb = k[b];
#pragma omp simd
        for (int64_t j = 0; j < size; ++j) kh[b * size + j] = to_bf16(hp[b * size + j] * kb);
      }
    } else {
      float* kh = kept_h.data_ptr<float>() + t * batch * size;
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t j = 0; j < size; ++j) kh[b * size + j] = hp[b * size + j] * k[b];
    }
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t j = 0; j < size; ++j) kc[b * size + j] = cp[b * size + j] * k[b];
    // p_t = W h': in bfloat16 as torch.mm computes and rounds it, then kept in float32 as unroll_forward keeps it
    float* pt = projected.data_ptr<float>() + t * batch * gates;
    if (mixed) {
      at::mm_out(scratch, kept_h.select(0, t), weight_t);
      const auto* s16 = reinterpret_cast<const uint16_t*>(scratch.data_ptr<at::BFloat16>());
#pragma omp simd
      for (int64_t j = 0; j < batch * gates; ++j) pt[j] = from_bf16(s16[j]);
    } else {
      Tensor p_t = projected.select(0, t);
      at::mm_out(p_t, kept_h.select(0, t), weight_t);
    }
    const float* xt = xs.data_ptr<float>() + t * batch * gates;
    float* at_ = acts.data_ptr<float>() + t * batch * gates;
    float* cell = cells.data_ptr<float>() + t * batch * size;
    float* tc = tanh_cells.data_ptr<float>() + t * batch * size;
    float* ot = out.data_ptr<float>() + t * batch * size;
    float* pm = p_mean.data_ptr<float>() + t * batch;
    float* pr = p_rstd.data_ptr<float>() + t * batch;
    float* cm = c_mean.data_ptr<float>() + t * batch;
    float* cr = c_rstd.data_ptr<float>() + t * batch;
    for (int64_t b = 0; b < batch; ++b) {
      const float* p = pt + b * gates;
      const float* x = xt + b * gates;
      float* a = at_ + b * gates;
      moments(p, gates, eps, pm + b, pr + b);
      const float m = pm[b], r = pr[b];
      float* n = row.data();
#pragma omp simd
      for (int64_t j = 0; j < gates; ++j) n[j] = (p[j] - m) * r * hg[j] + x[j];
#pragma omp simd
      for (int64_t j = 0; j < 2 * size; ++j) a[j] = 1.0f / (1.0f + std::exp(-n[j]));
#pragma omp simd
      for (int64_t j = 2 * size; j < 3 * size; ++j) a[j] = std::tanh(n[j]);
#pragma omp simd
      for (int64_t j = 3 * size; j < gates; ++j) a[j] = 1.0f / (1.0f + std::exp(-n[j]));
      const float* ck = kc + b * size;
      float* cl = cell + b * size;
#pragma omp simd
      for (int64_t j = 0; j < size; ++j) cl[j] = a[size + j] * ck[j] + a[j] * a[2 * size + j];
      moments(cl, size, eps, cm + b, cr + b);
      const float mc = cm[b], rc = cr[b];
      float* tcb = tc + b * size;
      float* ob = ot + b * size;
#pragma omp simd
      for (int64_t j = 0; j < size; ++j) tcb[j] = std::tanh((cl[j] - mc) * rc * cg[j] + cb[j]);
#pragma omp simd
      for (int64_t j = 0; j < size; ++j) ob[j] = a[3 * size + j] * tcb[j];
    }
    h = out.select(0, t);
    c = cells.select(0, t);
  }
  return {out, h.clone(), c.clone(), kept_h, kept_c, projected, acts, cells, tanh_cells, p_mean, p_rstd, c_mean, c_rstd};
}


// layer normalisation's input gradient over a row, from the output's gradient `dy`: with xhat = (x - mean) rstd
// and g = dy gain, dx = rstd (g - mean(g) - xhat mean(g xhat)); the gain's gradient dy xhat is added to dgain
inline void norm_backward(const float* dy, const float* x, const float* gain, float mean, float rstd, int64_t n,
                          float* dx, float* dgain) {
  float sum_g = 0.0f, sum_gx = 0.0f;
#pragma omp simd reduction(+ : sum_g, sum_gx)
  for (int64_t j = 0; j < n; ++j) {
    const float xhat = (x[j] - mean) * rstd;
    const float g = dy[j] * gain[j];
    sum_g += g;
    sum_gx += g * xhat;
  }
  const float mg = sum_g / static_cast<float>(n), mgx = sum_gx / static_cast<float>(n);
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    const float xhat = (x[j] - mean) * rstd;
    dx[j] = rstd * (dy[j] * gain[j] - mg - xhat * mgx);
    dgain[j] += dy[j] * xhat;
  }
}

std::vector<Tensor> unroll_backward(const Tensor& d_out_in, const Tensor& d_h, const Tensor& d_c,
                                    const Tensor& keep_in, const Tensor& hidden_weight,
                                    const Tensor& hidden_gain_in, const Tensor& cell_gain_in,
                                    const Tensor& /*cell_bias*/, const Tensor& kept_h, const Tensor& kept_c_in,
                                    const Tensor& projected_in, const Tensor& acts_in, const Tensor& cells_in,
                                    const Tensor& tanh_cells_in, const Tensor& p_mean_in, const Tensor& p_rstd_in,
                                    const Tensor& c_mean_in, const Tensor& c_rstd_in) {
  for (const Tensor* t : {&d_out_in, &keep_in, &kept_c_in, &projected_in, &acts_in, &cells_in, &tanh_cells_in})
    TORCH_CHECK(t->scalar_type() == at::kFloat, "ln_lstm_backward: float32 tensors but for the hidden weight");
  TORCH_CHECK(kept_h.scalar_type() == hidden_weight.scalar_type(), "ln_lstm_backward: kept_h in the weight's dtype");
  const Tensor d_out = d_out_in.contiguous(), keep = keep_in.contiguous(), kept_c = kept_c_in.contiguous();
  const Tensor projected = projected_in.contiguous(), acts = acts_in.contiguous(), cells = cells_in.contiguous();
  const Tensor tanh_cells = tanh_cells_in.contiguous(), p_mean = p_mean_in.contiguous(),
               p_rstd = p_rstd_in.contiguous(), c_mean = c_mean_in.contiguous(), c_rstd = c_rstd_in.contiguous();
  const Tensor hidden_gain = hidden_gain_in.contiguous(), cell_gain = cell_gain_in.contiguous();
  const int64_t steps = projected.size(0), batch = projected.size(1), gates = projected.size(2), size = gates / 4;
  TORCH_CHECK(d_out.numel() == steps * batch * size && acts.numel() == steps * batch * gates &&
                  keep.numel() == steps * batch && hidden_weight.size(0) == gates && hidden_weight.size(1) == size,
              "ln_lstm_backward: the shapes unroll_forward gives");
  const auto f32 = projected.options();
  const bool mixed = hidden_weight.scalar_type() != at::kFloat;
  Tensor d_gates = at::empty({steps, batch, gates}, f32);
  Tensor d_projected = at::empty({steps, batch, gates}, f32.dtype(hidden_weight.scalar_type()));
  Tensor d_hidden_gain = at::zeros({gates}, f32), d_cell_gain = at::zeros({size}, f32),
         d_cell_bias = at::zeros({size}, f32);
  Tensor dh = d_h.to(at::kFloat).contiguous().clone(), dc = d_c.to(at::kFloat).contiguous().clone();
  const float* hg = hidden_gain.data_ptr<float>();
  const float* cg = cell_gain.data_ptr<float>();
  float* dhg = d_hidden_gain.data_ptr<float>();
  float* dcg = d_cell_gain.data_ptr<float>();
  float* dcb = d_cell_bias.data_ptr<float>();
  std::vector<float> dl(size), dcl(size), dp(gates);   // a row's dl_t, LN'(c_t)^T dl_t and dp_t
  Tensor back = at::empty({batch, size}, f32.dtype(hidden_weight.scalar_type()));   // W^T dp_t
  for (int64_t t = steps - 1; t >= 0; --t) {
    const float* k = keep.data_ptr<float>() + t * batch;
    float* dhp = dh.data_ptr<float>();
    float* dcp = dc.data_ptr<float>();
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t row = t * batch + b;
      const float* dout = d_out.data_ptr<float>() + row * size;
      const float* a = acts.data_ptr<float>() + row * gates;
      const float* tc = tanh_cells.data_ptr<float>() + row * size;
      const float* cl = cells.data_ptr<float>() + row * size;
      const float* ck = kept_c.data_ptr<float>() + row * size;
      const float* p = projected.data_ptr<float>() + row * gates;
      float* dg = d_gates.data_ptr<float>() + row * gates;
      float* dhr = dhp + b * size;
      float* dcr = dcp + b * size;
      // dh_t (from step t + 1 and the output at t) into d_o and dl_t
#pragma omp simd
      for (int64_t j = 0; j < size; ++j) {
        const float d = dhr[j] + dout[j];
        const float so = a[3 * size + j];
        dg[3 * size + j] = d * tc[j] * so * (1.0f - so);
        dl[j] = d * so * (1.0f - tc[j] * tc[j]);
        dcb[j] += dl[j];
      }
      norm_backward(dl.data(), cl, cg, c_mean.data_ptr<float>()[row], c_rstd.data_ptr<float>()[row], size,
                    dcl.data(), dcg);
      const float kb = k[b];
      // dc_t into (d_i, d_f, d_g), and on to step t - 1 through the forget gate and the reset
#pragma omp simd
      for (int64_t j = 0; j < size; ++j) {
        const float d = dcl[j] + dcr[j];
        const float si = a[j], sf = a[size + j], tg = a[2 * size + j];
        dg[j] = d * tg * si * (1.0f - si);
        dg[size + j] = d * ck[j] * sf * (1.0f - sf);
        dg[2 * size + j] = d * si * (1.0f - tg * tg);
        dcr[j] = d * sf * kb;
      }
      norm_backward(dg, p, hg, p_mean.data_ptr<float>()[row], p_rstd.data_ptr<float>()[row], gates, dp.data(), dhg);
      if (mixed) {
        auto* out = reinterpret_cast<uint16_t*>(d_projected.data_ptr<at::BFloat16>()) + row * gates;
#pragma omp simd
        for (int64_t j = 0; j < gates; ++j) out[j] = to_bf16(dp[j]);
      } else {
        std::memcpy(d_projected.data_ptr<float>() + row * gates, dp.data(), gates * sizeof(float));
      }
    }
    // dh for step t - 1: (W^T dp_t) keep_t, the product in the weight's dtype as unroll_backward's
    if (mixed) {
      at::mm_out(back, d_projected.select(0, t), hidden_weight);
      const auto* r16 = reinterpret_cast<const uint16_t*>(back.data_ptr<at::BFloat16>());
      for (int64_t b = 0; b < batch; ++b) {
        const float kb = k[b];
#pragma omp simd
        for (int64_t j = 0; j < size; ++j) dhp[b * size + j] = from_bf16(r16[b * size + j]) * kb;
      }
    } else {
      at::mm_out(back, d_projected.select(0, t), hidden_weight);
      const float* r = back.data_ptr<float>();
      for (int64_t b = 0; b < batch; ++b) {
        const float kb = k[b];
#pragma omp simd
        for (int64_t j = 0; j < size; ++j) dhp[b * size + j] = r[b * size + j] * kb;
      }
    }
  }
  const int64_t rows = steps * batch;
  Tensor d_weight = d_projected.view({rows, gates}).t().mm(kept_h.reshape({rows, size}));
  return {d_gates, dh, dc, d_weight, d_hidden_gain, d_cell_gain, d_cell_bias};
}

}  // namespace

TORCH_LIBRARY(lbc_native, m) {
  m.def("ln_lstm_forward(Tensor xs, Tensor keep, Tensor h, Tensor c, Tensor hidden_weight, Tensor hidden_gain, "
        "Tensor cell_gain, Tensor cell_bias, float eps) -> Tensor[]");
  m.def("ln_lstm_backward(Tensor d_out, Tensor d_h, Tensor d_c, Tensor keep, Tensor hidden_weight, "
        "Tensor hidden_gain, Tensor cell_gain, Tensor cell_bias, Tensor kept_h, Tensor kept_c, Tensor projected, "
        "Tensor acts, Tensor cells, Tensor tanh_cells, Tensor p_mean, Tensor p_rstd, Tensor c_mean, "
        "Tensor c_rstd) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(lbc_native, CPU, m) {
  m.impl("ln_lstm_forward", unroll_forward);
  m.impl("ln_lstm_backward", unroll_backward);
}
