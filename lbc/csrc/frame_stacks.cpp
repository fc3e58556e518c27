// A CPU learner's frame stacks in 4x4 blocks (decision 83's layout), written in one pass from a batch's single uint8
// frames (decision 96). lbc.nets._blocked_stacks builds the same stacks in four torch passes (the frames in blocks,
// centred in int16, converted, stacked: each a full pass over memory, the stack's the largest, 28 MB a `cpu` batch);
// here each output block is read from its frame, centred, converted and stored while in registers. Plain stores, not
// streaming ones: the first convolution reads the stacks next, and a `cpu` learner step took 4% longer when the
// stores went around the cache (session 68, the AMX host).
//
//   out[t, b, i, j, s, 4 dy + dx] = frames[t + s, b, 4 i + dy, 4 j + dx] - medians[t + s, b]   where keep[t, b, s]
//                                 = 0                                                         elsewhere
//
// x - m is an integer in [-255, 255]: exact in float32, and in bfloat16 (8 significant bits), where the float's
// upper half is that value, so cutting its lower half (all zeros) is the conversion torch's rounding makes.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace {

using at::Tensor;

constexpr int64_t kBlock = 4;             // the blocks' side: the first convolution's stride
constexpr int64_t kArea = kBlock * kBlock;
constexpr int64_t kMaxStack = 16;

// a 4x4 block's 16 bytes (row stride `width`), row by row, as 16 int32 less `median` in two registers
inline void block_less(const uint8_t* p, int64_t width, __m256i median, __m256i& lo, __m256i& hi) {
  int32_t rows[4];
  for (int64_t r = 0; r < kBlock; ++r) std::memcpy(&rows[r], p + r * width, sizeof(int32_t));
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows));
  lo = _mm256_sub_epi32(_mm256_cvtepu8_epi32(bytes), median);
  hi = _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8)), median);
}

inline void store_block(float* dst, __m256i lo, __m256i hi) {
  _mm256_storeu_ps(dst, _mm256_cvtepi32_ps(lo));
  _mm256_storeu_ps(dst + 8, _mm256_cvtepi32_ps(hi));
}

inline void store_block(at::BFloat16* dst, __m256i lo, __m256i hi) {
  // each float's upper 16 bits, packed in order (packus works within 128-bit lanes: the permute puts them back)
  const __m256i a = _mm256_srli_epi32(_mm256_castps_si256(_mm256_cvtepi32_ps(lo)), 16);
  const __m256i b = _mm256_srli_epi32(_mm256_castps_si256(_mm256_cvtepi32_ps(hi)), 16);
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), packed);
}

template <typename T>
void stacks(const uint8_t* frames, int64_t step_stride, int64_t batch_stride, const int32_t* medians, const bool* keep,
            T* out, int64_t steps, int64_t batch, int64_t stack, int64_t height, int64_t width) {
  const int64_t h = height / kBlock, w = width / kBlock;
  at::parallel_for(0, steps * batch, 1, [&](int64_t begin, int64_t end) {
    for (int64_t tb = begin; tb < end; ++tb) {
      const int64_t t = tb / batch, b = tb % batch;
      const uint8_t* src[kMaxStack];
      __m256i median[kMaxStack];
      bool kept[kMaxStack];
      for (int64_t s = 0; s < stack; ++s) {
        src[s] = frames + (t + s) * step_stride + b * batch_stride;
        median[s] = _mm256_set1_epi32(medians[(t + s) * batch + b]);
        kept[s] = keep[tb * stack + s];
      }
      T* o = out + tb * h * w * stack * kArea;
      for (int64_t i = 0; i < h; ++i) {
        for (int64_t j = 0; j < w; ++j) {
          for (int64_t s = 0; s < stack; ++s, o += kArea) {
            __m256i lo = _mm256_setzero_si256(), hi = lo;
            if (kept[s]) block_less(src[s] + i * kBlock * width + j * kBlock, width, median[s], lo, hi);
            store_block(o, lo, hi);
          }
        }
      }
    }
  });
}

void blocked_stacks(const Tensor& frames, const Tensor& medians, const Tensor& keep, const Tensor& out) {
  // the batch's frames as they come, time-major views of batch-major memory included: each frame contiguous
  TORCH_CHECK(frames.scalar_type() == at::kByte && frames.dim() == 4 && frames.stride(3) == 1 &&
                  frames.stride(2) == frames.size(3),
              "blocked_stacks: uint8 frames [T + S - 1, B, H, W], each frame contiguous");
  TORCH_CHECK(keep.scalar_type() == at::kBool && keep.dim() == 3 && keep.is_contiguous(),
              "blocked_stacks: keep bool [T, B, S], contiguous");
  const int64_t steps = keep.size(0), batch = keep.size(1), stack = keep.size(2);
  const int64_t height = frames.size(2), width = frames.size(3);
  TORCH_CHECK(stack >= 1 && stack <= kMaxStack, "blocked_stacks: 1 to 16 frames a stack");
  TORCH_CHECK(frames.size(0) == steps + stack - 1 && frames.size(1) == batch,
              "blocked_stacks: frames [T + S - 1, B, H, W] for keep [T, B, S]");
  TORCH_CHECK(height % kBlock == 0 && width % kBlock == 0, "blocked_stacks: frames of sides a multiple of 4");
  TORCH_CHECK(medians.scalar_type() == at::kInt && medians.is_contiguous() && medians.dim() == 2 &&
                  medians.size(0) == frames.size(0) && medians.size(1) == batch,
              "blocked_stacks: int32 medians [T + S - 1, B], contiguous");
  TORCH_CHECK(out.is_contiguous() && out.dim() == 6 && out.size(0) == steps && out.size(1) == batch &&
                  out.size(2) == height / kBlock && out.size(3) == width / kBlock && out.size(4) == stack &&
                  out.size(5) == kArea,
              "blocked_stacks: out [T, B, H / 4, W / 4, S, 16], contiguous");
  const uint8_t* f = frames.data_ptr<uint8_t>();
  const int32_t* m = medians.data_ptr<int32_t>();
  const bool* k = keep.data_ptr<bool>();
  if (out.scalar_type() == at::kFloat) {
    stacks(f, frames.stride(0), frames.stride(1), m, k, out.data_ptr<float>(), steps, batch, stack, height, width);
  } else {
    TORCH_CHECK(out.scalar_type() == at::kBFloat16, "blocked_stacks: out in float32 or bfloat16");
    stacks(f, frames.stride(0), frames.stride(1), m, k, out.data_ptr<at::BFloat16>(), steps, batch, stack, height,
           width);
  }
}


// the lower median of a frame's block corners (every 4th pixel of every 4th row, lbc.nets.frame_medians): the least
// value v with more than (n - 1) / 2 of the n corners at most v, read off their counts
int32_t corner_median(const uint8_t* frame, int64_t h, int64_t w, int64_t width) {
  int32_t counts[256] = {};
  for (int64_t i = 0; i < h; ++i) {
    const uint8_t* row = frame + i * kBlock * width;
    for (int64_t j = 0; j < w; ++j) ++counts[row[j * kBlock]];
  }
  const int64_t half = (h * w - 1) / 2;
  int64_t seen = 0;
  for (int32_t v = 0; v < 256; ++v) {
    seen += counts[v];
    if (seen > half) return v;
  }
  return 255;
}

// one frame's blocks, less `median`, into a ring slot: block (i, j) at out + (i w + j) step
template <typename T>
void write_slot(const uint8_t* frame, int32_t median, T* out, int64_t step, int64_t h, int64_t w, int64_t width) {
  const __m256i m = _mm256_set1_epi32(median);
  for (int64_t i = 0; i < h; ++i) {
    for (int64_t j = 0; j < w; ++j) {
      __m256i lo, hi;
      block_less(frame + i * kBlock * width + j * kBlock, width, m, lo, hi);
      store_block(out + (i * w + j) * step, lo, hi);
    }
  }
}

template <typename T>
void zero_slot(T* out, int64_t step, int64_t h, int64_t w) {
  for (int64_t b = 0; b < h * w; ++b) std::memset(out + b * step, 0, kArea * sizeof(T));
}

template <typename T>
void ring_push(const Tensor& obs, T* slots, int64_t slot, bool centre, int64_t games, int64_t stack, int64_t height,
               int64_t width) {
  const int64_t h = height / kBlock, w = width / kBlock, step = stack * kArea;
  const int64_t frame_stride = obs.stride(1), game_stride = obs.stride(0);
  const uint8_t* base = obs.data_ptr<uint8_t>();
  at::parallel_for(0, games, 1, [&](int64_t begin, int64_t end) {
    for (int64_t e = begin; e < end; ++e) {
      const uint8_t* game = base + e * game_stride;
      T* ring = slots + e * h * w * step;
      // slot < 0: every slot s from the stack's frame s (the ring's first push); else the newest frame into `slot`
      const int64_t first = slot < 0 ? 0 : stack - 1;
      for (int64_t f = first; f < stack; ++f) {
        const uint8_t* frame = game + f * frame_stride;
        const int64_t into = slot < 0 ? f : slot;
        write_slot(frame, centre ? corner_median(frame, h, w, width) : 0, ring + into * kArea, step, h, w, width);
      }
      if (slot < 0) continue;
      // a stack started afresh (its older frames all zeros: lbc.frame_stacks.starts_afresh): its other slots zeroed
      bool afresh = true;
      for (int64_t f = 0; f < stack - 1 && afresh; ++f) {
        const uint8_t* frame = game + f * frame_stride;
        int64_t p = 0;
        for (; p + 32 <= height * width && afresh; p += 32) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(frame + p));
          afresh = _mm256_testz_si256(v, v);
        }
        for (; p < height * width && afresh; ++p) afresh = frame[p] == 0;
      }
      if (afresh) {
        for (int64_t s = 0; s < stack; ++s)
          if (s != slot) zero_slot(ring + s * kArea, step, h, w);
      }
    }
  });
}

void frame_ring_push(const Tensor& obs, const Tensor& slots, int64_t slot, bool centre) {
  TORCH_CHECK(obs.scalar_type() == at::kByte && obs.dim() == 4 && obs.stride(3) == 1 && obs.stride(2) == obs.size(3),
              "frame_ring_push: uint8 stacks [E, S, H, W], each frame contiguous");
  const int64_t games = obs.size(0), stack = obs.size(1), height = obs.size(2), width = obs.size(3);
  TORCH_CHECK(height % kBlock == 0 && width % kBlock == 0, "frame_ring_push: frames of sides a multiple of 4");
  TORCH_CHECK(slots.is_contiguous() && slots.dim() == 5 && slots.size(0) == games && slots.size(1) == height / kBlock &&
                  slots.size(2) == width / kBlock && slots.size(3) == stack && slots.size(4) == kArea,
              "frame_ring_push: slots [E, H / 4, W / 4, S, 16], contiguous");
  TORCH_CHECK(slot >= -1 && slot < stack, "frame_ring_push: slot -1 (all) or one of the stack's");
  if (slots.scalar_type() == at::kFloat) {
    ring_push(obs, slots.data_ptr<float>(), slot, centre, games, stack, height, width);
  } else {
    TORCH_CHECK(slots.scalar_type() == at::kBFloat16, "frame_ring_push: slots in float32 or bfloat16");
    ring_push(obs, slots.data_ptr<at::BFloat16>(), slot, centre, games, stack, height, width);
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(lbc_native, m) {
  m.def("blocked_stacks(Tensor frames, Tensor medians, Tensor keep, Tensor(a!) out) -> ()");
  m.def("frame_ring_push(Tensor obs, Tensor(a!) slots, int slot, bool centre) -> ()");
}

TORCH_LIBRARY_IMPL(lbc_native, CPU, m) {
  m.impl("blocked_stacks", blocked_stacks);
  m.impl("frame_ring_push", frame_ring_push);
}
