// ALE's screens to the network's frames (decision 94): OpenCV's INTER_AREA downscale of single-channel uint8 images
// at a non-integer ratio (cv::resize's resizeArea_, what ale-py's AtariVectorEnv runs), to the bit. lbc/screens.py
// builds the tables, each output column's (row's) source columns (rows) in OpenCV's order, padded with weight 0,
// which adds an exact 0. The same float operations in the same order as OpenCV's loop: each product rounded, then
// each sum; the build gives this file -ffp-contract=off so that no product and sum fuse. OpenCV's loop scatters
// into a row of sums through a table, each term waiting on the last; here each output's terms sum in a register.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace {

using at::Tensor;

constexpr int64_t kLanes = 8;   // floats in an AVX2 register

constexpr int64_t kStrip = 16;   // output rows resized together (84 rows from 210: 40 source rows a strip)
constexpr int64_t kMaxOutCols = 512;
constexpr int64_t kMaxTerms = 16;

inline int64_t padded(int64_t n) { return (n + kLanes - 1) / kLanes * kLanes; }

// [lo, hi): the source rows output rows [dy0, dy1) read
inline std::pair<int64_t, int64_t> source_rows(const int32_t* y_index, int64_t terms, int64_t dy0, int64_t dy1) {
  int64_t lo = y_index[dy0 * terms], hi = lo + 1;
  for (int64_t k = dy0 * terms; k < dy1 * terms; ++k) {
    lo = std::min<int64_t>(lo, y_index[k]);
    hi = std::max<int64_t>(hi, y_index[k] + 1);
  }
  return {lo, hi};
}

// rows[i] (8 registers of 8 floats) transposed in place: rows[i][j] <- rows[j][i]
inline void transpose8(__m256 rows[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(rows[0], rows[1]), t1 = _mm256_unpackhi_ps(rows[0], rows[1]);
  const __m256 t2 = _mm256_unpacklo_ps(rows[2], rows[3]), t3 = _mm256_unpackhi_ps(rows[2], rows[3]);
  const __m256 t4 = _mm256_unpacklo_ps(rows[4], rows[5]), t5 = _mm256_unpackhi_ps(rows[4], rows[5]);
  const __m256 t6 = _mm256_unpacklo_ps(rows[6], rows[7]), t7 = _mm256_unpackhi_ps(rows[6], rows[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  rows[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  rows[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  rows[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  rows[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  rows[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  rows[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  rows[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  rows[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// float [rows, cols] (row stride `from_stride`) -> [cols, rows] (row stride `to_stride`), both counts multiples of 8
void transpose(const float* from, int64_t from_stride, float* to, int64_t to_stride, int64_t rows, int64_t cols) {
  __m256 block[kLanes];
  for (int64_t r = 0; r < rows; r += kLanes) {
    for (int64_t c = 0; c < cols; c += kLanes) {
      for (int64_t i = 0; i < kLanes; ++i) block[i] = _mm256_loadu_ps(from + (r + i) * from_stride + c);
      transpose8(block);
      for (int64_t i = 0; i < kLanes; ++i) _mm256_storeu_ps(to + (c + i) * to_stride + r, block[i]);
    }
  }
}

// rows [first, first + count) of a uint8 image [height, width] -> float columns [padded(width), count]: transposed,
// zeros beyond the image (count a multiple of 8)
void image_columns(const uint8_t* image, int64_t height, int64_t width, int64_t first, int64_t count,
                   float* columns) {
  const int64_t cols = padded(width);
  alignas(32) uint8_t edge[kLanes][kLanes];
  __m256 block[kLanes];
  for (int64_t r = 0; r < count; r += kLanes) {
    const int64_t row = first + r;
    for (int64_t c = 0; c < cols; c += kLanes) {
      const bool inside = row + kLanes <= height && c + kLanes <= width;
      if (!inside) {   // a block across the image's edge: its pixels inside, zeros beyond
        for (int64_t i = 0; i < kLanes; ++i)
          for (int64_t j = 0; j < kLanes; ++j)
            edge[i][j] = (row + i < height && c + j < width) ? image[(row + i) * width + c + j] : 0;
      }
      for (int64_t i = 0; i < kLanes; ++i) {
        const uint8_t* eight = inside ? image + (row + i) * width + c : edge[i];
        const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(eight));
        block[i] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
      }
      transpose8(block);
      for (int64_t i = 0; i < kLanes; ++i) _mm256_storeu_ps(columns + (c + i) * count + r, block[i]);
    }
  }
}

// 8 floats rounded half to even (the conversion's default mode, as cvRound) and saturated to uint8 [0, 255]
inline void store_bytes(__m256 values, uint8_t* to) {
  const __m256i ints = _mm256_cvtps_epi32(values);
  const __m128i words = _mm_packus_epi32(_mm256_castsi256_si128(ints), _mm256_extracti128_si256(ints, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(to), _mm_packus_epi16(words, words));
}

// to[k] = sum over t of weight[t] * lines[index[t]][k] for k < count (a multiple of 8), term after term in float
template <int Terms>
inline void weighted_rows_of(const float* lines, int64_t stride, const int32_t* index, const float* weight,
                             int64_t count, float* to) {
  const float* from[Terms];
  __m256 w[Terms];
  for (int t = 0; t < Terms; ++t) {
    from[t] = lines + index[t] * stride;
    w[t] = _mm256_set1_ps(weight[t]);
  }
  for (int64_t k = 0; k < count; k += kLanes) {
    __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(from[0] + k), w[0]);
    for (int t = 1; t < Terms; ++t) acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(from[t] + k), w[t]));
    _mm256_storeu_ps(to + k, acc);
  }
}

inline void weighted_rows(const float* lines, int64_t stride, const int32_t* index, const float* weight, int64_t terms,
                          int64_t count, float* to) {
  switch (terms) {   // the term counts of 210x160 -> 84x84 and near it, unrolled
    case 2: return weighted_rows_of<2>(lines, stride, index, weight, count, to);
    case 3: return weighted_rows_of<3>(lines, stride, index, weight, count, to);
    case 4: return weighted_rows_of<4>(lines, stride, index, weight, count, to);
    default: break;
  }
  for (int64_t k = 0; k < count; k += kLanes) {
    __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(lines + index[0] * stride + k), _mm256_set1_ps(weight[0]));
    for (int64_t t = 1; t < terms; ++t)
      acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(lines + index[t] * stride + k), _mm256_set1_ps(weight[t])));
    _mm256_storeu_ps(to + k, acc);
  }
}

// Per strip of output rows, over the source rows r it reads, in three passes that each read and write whole registers:
//   columns[x][r] = image[r][x], as floats (the source transposed, padded with zeros to multiples of 8);
//   across_t[dx][r] = sum over t of x_weight[dx, t] * columns[x_index[dx, t]][r], term after term (OpenCV's
//     horizontal sums, the strip's source rows at once), then transposed to across[r][dx];
//   out[dy][dx] = sum over t of y_weight[dy, t] * across[y_index[dy, t]][dx], term after term (its vertical sums),
//     rounded half to even and saturated to [0, 255] (store_bytes).
// OpenCV computes each product and each sum in float, in these orders; padding terms add an exact 0.
void area_resize(const Tensor& src, const Tensor& dst, const Tensor& x_index, const Tensor& x_weight,
                 const Tensor& y_index, const Tensor& y_weight) {
  TORCH_CHECK(src.dim() == 3 && dst.dim() == 3 && src.scalar_type() == at::kByte && dst.scalar_type() == at::kByte,
              "area_resize: uint8 [N, H, W] to uint8 [N, h, w]");
  TORCH_CHECK(src.is_contiguous(), "area_resize: the source must be contiguous");
  TORCH_CHECK(dst.stride(2) == 1 && dst.stride(1) == dst.size(2), "area_resize: each output image's rows contiguous");
  const int64_t n = src.size(0), height = src.size(1), width = src.size(2);
  const int64_t out_h = dst.size(1), out_w = dst.size(2);
  TORCH_CHECK(dst.size(0) == n, "area_resize: as many outputs as sources");
  TORCH_CHECK(x_index.scalar_type() == at::kInt && y_index.scalar_type() == at::kInt &&
                  x_weight.scalar_type() == at::kFloat && y_weight.scalar_type() == at::kFloat,
              "area_resize: int32 indices, float32 weights");
  TORCH_CHECK(x_index.is_contiguous() && x_weight.is_contiguous() && y_index.is_contiguous() && y_weight.is_contiguous(),
              "area_resize: contiguous tables");
  TORCH_CHECK(x_index.dim() == 2 && x_index.size(0) == out_w && x_weight.sizes() == x_index.sizes(),
              "area_resize: x tables [w, terms]");
  TORCH_CHECK(y_index.dim() == 2 && y_index.size(0) == out_h && y_weight.sizes() == y_index.sizes(),
              "area_resize: y tables [h, terms]");
  const int64_t x_terms = x_index.size(1), y_terms = y_index.size(1);
  TORCH_CHECK(x_terms >= 1 && y_terms >= 1, "area_resize: at least one term");
  const int32_t* xi = x_index.data_ptr<int32_t>();
  const float* xw = x_weight.data_ptr<float>();
  const int32_t* yi = y_index.data_ptr<int32_t>();
  const float* yw = y_weight.data_ptr<float>();
  for (int64_t k = 0; k < out_w * x_terms; ++k) TORCH_CHECK(xi[k] >= 0 && xi[k] < width, "area_resize: x index");
  for (int64_t k = 0; k < out_h * y_terms; ++k) TORCH_CHECK(yi[k] >= 0 && yi[k] < height, "area_resize: y index");

  const int64_t cols = padded(width), out_cols = padded(out_w);
  TORCH_CHECK(out_cols <= kMaxOutCols && y_terms <= kMaxTerms, "area_resize: at most 512 output columns, 16 terms");

  // kept between calls (an actor resizes every step), sized for a strip of output rows. across_t's rows beyond out_w
  // are never written: what they hold reaches only the lanes beyond out_w, which are not stored
  int64_t strip_rows = 0;   // the most source rows any strip reads, padded
  for (int64_t dy0 = 0; dy0 < out_h; dy0 += kStrip) {
    const auto [lo, hi] = source_rows(yi, y_terms, dy0, std::min(out_h, dy0 + kStrip));
    strip_rows = std::max(strip_rows, padded(hi - lo));
  }
  thread_local std::vector<float> columns_buffer, across_t_buffer, across_buffer;
  columns_buffer.resize(cols * strip_rows);
  across_t_buffer.assign(out_cols * strip_rows, 0.0f);
  across_buffer.resize(strip_rows * out_cols);
  float* columns = columns_buffer.data();
  float* across_t = across_t_buffer.data();
  float* across = across_buffer.data();
  const uint8_t* images = src.data_ptr<uint8_t>();
  uint8_t* outs = dst.data_ptr<uint8_t>();
  const int64_t image_stride = dst.stride(0);
  alignas(32) float sum[kMaxOutCols];
  int32_t index[kMaxTerms];
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* image = images + i * height * width;
    uint8_t* out = outs + i * image_stride;
    // a strip of output rows at a time, from the source rows it reads: a working set of tens of kilobytes, where a
    // whole image's passes would take hundreds and push the acting network's weights out of the core's cache
    for (int64_t dy0 = 0; dy0 < out_h; dy0 += kStrip) {
      const int64_t dy1 = std::min(out_h, dy0 + kStrip);
      const auto [lo, hi] = source_rows(yi, y_terms, dy0, dy1);
      const int64_t rows = padded(hi - lo);
      image_columns(image, height, width, lo, rows, columns);
      for (int64_t dx = 0; dx < out_w; ++dx)
        weighted_rows(columns, rows, xi + dx * x_terms, xw + dx * x_terms, x_terms, rows, across_t + dx * rows);
      transpose(across_t, rows, across, out_cols, out_cols, rows);
      for (int64_t dy = dy0; dy < dy1; ++dy) {
        for (int64_t t = 0; t < y_terms; ++t) index[t] = yi[dy * y_terms + t] - static_cast<int32_t>(lo);
        weighted_rows(across, out_cols, index, yw + dy * y_terms, y_terms, out_cols, sum);
        uint8_t* o = out + dy * out_w;
        int64_t dx = 0;
        for (; dx + kLanes <= out_w; dx += kLanes) store_bytes(_mm256_load_ps(sum + dx), o + dx);
        if (dx < out_w) {   // the row's last few columns, through a buffer of a whole register
          alignas(8) uint8_t last[kLanes];
          store_bytes(_mm256_load_ps(sum + dx), last);
          std::memcpy(o + dx, last, out_w - dx);
        }
      }
    }
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(lbc_native, m) {
  m.def("area_resize(Tensor src, Tensor(a!) dst, Tensor x_index, Tensor x_weight, Tensor y_index, Tensor y_weight) -> ()");
}

TORCH_LIBRARY_IMPL(lbc_native, CPU, m) { m.impl("area_resize", area_resize); }
