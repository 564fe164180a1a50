// Quantized matmuls with fp32 activations (``activation_quantization: none``): the entry points linear_q4x8_f32 /
// linear_q8x8_f32 (kernels.h); their bindings are registered with the int8-activation ones in qgemm_cpu.cpp.
#include "kernels.h"
#include <immintrin.h>
#include <vector>
#include "qgemm.h"
#include "vec_avx2.h"

namespace tk_qgemm {

using tritonllm::hsum;

// ---- fp32 activations (``activation_quantization: none``, W4A16 / W8A16): the interleaved codes are widened to
// fp32 in registers and multiplied with the activations as they are, so the product is the float matmul of the
// dequantized weights (up to summation order: per block, d * sum(q x) + m * sum(x)), with no activation rounding.
// Each 32-bit lane holds one row's 4 codes of a chunk; constant shifts walk them (low byte / nibble first).
template <typename S, int MB>
inline void q4x8_f32_tile(const X8Args& a, int64_t g, int64_t m0) {
  const int64_t nb = a.K / QK;
  const __m256i low = _mm256_set1_epi32(0x0F);
  const uint8_t* wg = a.w + g * nb * 128;
  __m256 acc[MB];
  for (int m = 0; m < MB; ++m) acc[m] = _mm256_setzero_ps();
  for (int64_t blk = 0; blk < nb; ++blk) {
    __m256 s[MB];
    for (int m = 0; m < MB; ++m) s[m] = _mm256_setzero_ps();
    for (int t = 0; t < 4; ++t) {
      __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + blk * 128 + t * 32));
      for (int j = 0; j < 4; ++j, v = _mm256_srli_epi32(v, 8)) {
        const __m256 lo = _mm256_cvtepi32_ps(_mm256_and_si256(v, low));
        const __m256 hi = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, 4), low));
        for (int m = 0; m < MB; ++m) {
          const float* xb = a.x + (m0 + m) * a.K + blk * QK;
          s[m] = _mm256_fmadd_ps(lo, _mm256_broadcast_ss(xb + 4 * t + j), s[m]);
          s[m] = _mm256_fmadd_ps(hi, _mm256_broadcast_ss(xb + 4 * (t + 4) + j), s[m]);
        }
      }
    }
    const __m256 dv = scale8<S>(a.d, a.dsup, g * nb + blk, 8), mv = scale8<S>(a.m, a.msup, g * nb + blk, 8);
    for (int m = 0; m < MB; ++m) {
      acc[m] = _mm256_fmadd_ps(s[m], dv, acc[m]);
      acc[m] = _mm256_fmadd_ps(mv, _mm256_broadcast_ss(a.xs + (m0 + m) * nb + blk), acc[m]);
    }
  }
  store8<MB>(a, acc, g, m0);
}

// int8 codes: a byte is sign-extended by shifting it to the top of its lane and back (arithmetic).
template <typename S, bool PER_BLOCK, bool HALF, int MB>
inline void q8x8_f32_tile(const X8Args& a, int64_t g, int64_t m0) {
  const int64_t nb = a.K / QK;
  const uint8_t* wg = a.w + g * nb * 256;
  __m256 acc[MB];
  for (int m = 0; m < MB; ++m) acc[m] = _mm256_setzero_ps();
  for (int64_t blk = 0; blk < nb; ++blk) {
    __m256 s[MB], h[MB];
    for (int m = 0; m < MB; ++m) s[m] = h[m] = _mm256_setzero_ps();
    for (int t = 0; t < 8; ++t) {
      __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + blk * 256 + t * 32));
      for (int j = 0; j < 4; ++j, v = _mm256_srli_epi32(v, 8)) {
        const __m256 w = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(v, 24), 24));
        for (int m = 0; m < MB; ++m) {
          const __m256 xv = _mm256_broadcast_ss(a.x + (m0 + m) * a.K + blk * QK + 4 * t + j);
          if (HALF && t >= 4) h[m] = _mm256_fmadd_ps(w, xv, h[m]);
          else s[m] = _mm256_fmadd_ps(w, xv, s[m]);
        }
      }
    }
    for (int m = 0; m < MB; ++m)
      acc[m] = block_fma<S, PER_BLOCK, HALF, false>(acc[m], s[m], h[m], a, g, blk, 1.f,
                                                    a.xs ? a.xs[(m0 + m) * nb + blk] : 0.f);
  }
  finish_x8<S, PER_BLOCK, MB>(a, acc, g, m0);
}

// ---- fp32 activations, many rows (M >= TILE_ROWS: a batch of decode steps, a short prefill). Widening the codes
// per 4 rows (above) costs the vector unit as much again as the multiply-adds; with more rows two groups' 16 weight
// rows are dequantized once into a [K, 16] fp32 tile (row stride 16 floats: one vector per input and group; at
// most 96 KiB at K = 1536, in L2) and every activation row multiplies it with one broadcast and two FMAs per
// input. The tile holds exactly dequant()'s values (d * q, then + m: two roundings, as quant.py's _values), so the
// product is the float matmul of the dequantized weights up to summation order.
constexpr int64_t TILE_ROWS = 8;

// int4: the low nibble of lane byte j in chunk t is input 4t + j, the high one 4(t + 4) + j.
template <typename S>
inline void q4x8_dequant_tile(const X8Args& a, int64_t g, float* tile) {
  const int64_t nb = a.K / QK;
  const __m256i low = _mm256_set1_epi32(0x0F);
  const uint8_t* wg = a.w + g * nb * 128;
  for (int64_t blk = 0; blk < nb; ++blk) {
    const __m256 dv = scale8<S>(a.d, a.dsup, g * nb + blk, 8), mv = scale8<S>(a.m, a.msup, g * nb + blk, 8);
    float* tb = tile + blk * QK * 16;
    for (int t = 0; t < 4; ++t) {
      __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + blk * 128 + t * 32));
      for (int j = 0; j < 4; ++j, v = _mm256_srli_epi32(v, 8)) {
        const __m256 lo = _mm256_cvtepi32_ps(_mm256_and_si256(v, low));
        const __m256 hi = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, 4), low));
        _mm256_storeu_ps(tb + (4 * t + j) * 16, _mm256_add_ps(_mm256_mul_ps(lo, dv), mv));
        _mm256_storeu_ps(tb + (4 * (t + 4) + j) * 16, _mm256_add_ps(_mm256_mul_ps(hi, dv), mv));
      }
    }
  }
}

// int8: per-row d [G, 8], per-block d (and m) [G, nb, 8], or per-half-block d [G, 2 nb, 8].
template <typename S, bool PER_BLOCK, bool HALF>
inline void q8x8_dequant_tile(const X8Args& a, int64_t g, float* tile) {
  const int64_t nb = a.K / QK;
  const uint8_t* wg = a.w + g * nb * 256;
  const S* d = static_cast<const S*>(a.d);
  const S* mm = static_cast<const S*>(a.m);
  const __m256 row_d = PER_BLOCK ? _mm256_setzero_ps() : load8(d + g * 8);
  for (int64_t blk = 0; blk < nb; ++blk) {
    const int64_t i = g * nb + blk;
    const __m256 d0 = !PER_BLOCK ? row_d : HALF ? load8(d + i * 16) : load8(d + i * 8);
    const __m256 d1 = HALF ? load8(d + i * 16 + 8) : d0;
    const bool has_m = PER_BLOCK && !HALF && mm;
    const __m256 mv = has_m ? load8(mm + i * 8) : _mm256_setzero_ps();
    float* tb = tile + blk * QK * 16;
    for (int t = 0; t < 8; ++t) {
      __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + blk * 256 + t * 32));
      const __m256 dv = t >= 4 ? d1 : d0;
      for (int j = 0; j < 4; ++j, v = _mm256_srli_epi32(v, 8)) {
        const __m256 w = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(v, 24), 24)), dv);
        _mm256_storeu_ps(tb + (4 * t + j) * 16, has_m ? _mm256_add_ps(w, mv) : w);
      }
    }
  }
}

// MB activation rows against the dequantized tiles of NV groups (16 weight rows side by side, as BLIS' 6 x 16
// AVX2 micro-kernel): per input NV weight vectors, MB broadcasts, MB x NV FMAs in 12 accumulators.
template <int MB, int NV>
inline void f32_tile_rows(const X8Args& a, const float* tile, int64_t g, int64_t m0) {
  // Every loop over acc unrolled (put8 takes one vector by value): a loop left rolled indexes acc at run time,
  // which keeps the array in memory, stored at every input (GCC 12; measured 3x slower).
  const int64_t K = a.K;
  const float* x = a.x + m0 * K;
  __m256 acc[NV][MB];
  for (int v = 0; v < NV; ++v)
    for (int m = 0; m < MB; ++m) acc[v][m] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    __m256 w[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) w[v] = _mm256_loadu_ps(tile + k * 16 + 8 * v);
#pragma GCC unroll 6
    for (int m = 0; m < MB; ++m) {
      const __m256 xm = _mm256_broadcast_ss(x + m * K + k);
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[v][m] = _mm256_fmadd_ps(xm, w[v], acc[v][m]);
    }
  }
#pragma GCC unroll 2
  for (int v = 0; v < NV; ++v)
#pragma GCC unroll 6
    for (int m = 0; m < MB; ++m) put8(a, acc[v][m], g + v, m0 + m);
}

template <int NV>
inline void f32_tile_all_rows(const X8Args& a, const float* tile, int64_t g) {
  int64_t mm = 0;
  for (; mm + 6 <= a.M; mm += 6) f32_tile_rows<6, NV>(a, tile, g, mm);
  for (; mm + 4 <= a.M; mm += 4) f32_tile_rows<4, NV>(a, tile, g, mm);
  for (; mm + 2 <= a.M; mm += 2) f32_tile_rows<2, NV>(a, tile, g, mm);
  for (; mm < a.M; ++mm) f32_tile_rows<1, NV>(a, tile, g, mm);
}

// Groups in pairs: tile [K, 16] holds group g's rows at columns 0-7 and g + 1's at 8-15.
void run_f32_tiles(const X8Args& a, DequantTile dequant, int64_t G) {
  at::parallel_for(0, (G + 1) / 2, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> tile(a.K * 16);
    for (int64_t p = begin; p < end; ++p) {
      const int64_t g = 2 * p;
      dequant(a, g, tile.data());
      if (g + 1 < G) {
        dequant(a, g + 1, tile.data() + 8);
        f32_tile_all_rows<2>(a, tile.data(), g);
      } else {
        f32_tile_all_rows<1>(a, tile.data(), g);
      }
    }
  });
}

// Fewer rows: up to 4 activation rows share each widened weight vector (4 accumulators + 4 block sums fit AVX2's
// 16 registers beside the weights).
at::Tensor run_f32(const at::Tensor& x, X8Args a, bool need_sums, F32Tile tile1, F32Tile tile4,
                   DequantTile dequant, int64_t G) {
  auto y = at::empty({x.size(0), a.N}, x.options());
  a.y = y.data_ptr<float>();
  a.x = x.data_ptr<float>();
  a.M = x.size(0);
  if (a.M >= TILE_ROWS) {
    run_f32_tiles(a, dequant, G);
    return y;
  }
  const int64_t nb = a.K / QK;
  std::vector<float> sums(need_sums ? a.M * nb : 0);
  for (int64_t i = 0; i < static_cast<int64_t>(sums.size()); ++i) {
    const float* v = a.x + (i / nb) * a.K + (i % nb) * QK;
    __m256 t = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(v), _mm256_loadu_ps(v + 8)),
                             _mm256_add_ps(_mm256_loadu_ps(v + 16), _mm256_loadu_ps(v + 24)));
    sums[i] = hsum(t);
  }
  a.xs = sums.data();
  at::parallel_for(0, G, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      int64_t mm = 0;
      for (; mm + 4 <= a.M; mm += 4) tile4(a, g, mm);
      for (; mm < a.M; ++mm) tile1(a, g, mm);
    }
  });
  return y;
}

at::Tensor linear_q4x8_f32(const at::Tensor& x, const at::Tensor& q, const at::Tensor& d,
                           const at::Tensor& m, const c10::optional<at::Tensor>& b, int64_t N,
                           const c10::optional<at::Tensor>& dsup, const c10::optional<at::Tensor>& msup) {
  const X8Layout l = q4x8_layout(x, q, d, m, b, N, dsup, msup);
  if (l.kscales)
    return run_f32(x, l.args, true, q4x8_f32_tile<KScale, 1>, q4x8_f32_tile<KScale, 4>, q4x8_dequant_tile<KScale>,
                   l.G);
  if (l.fp16_scales)
    return run_f32(x, l.args, true, q4x8_f32_tile<at::Half, 1>, q4x8_f32_tile<at::Half, 4>,
                   q4x8_dequant_tile<at::Half>, l.G);
  return run_f32(x, l.args, true, q4x8_f32_tile<float, 1>, q4x8_f32_tile<float, 4>, q4x8_dequant_tile<float>, l.G);
}

DequantTile q4x8_dequant_fn(const X8Layout& l) {
  return l.kscales ? q4x8_dequant_tile<KScale> : l.fp16_scales ? q4x8_dequant_tile<at::Half> : q4x8_dequant_tile<float>;
}

at::Tensor dequant_by_tiles(const X8Args& a, int64_t G, int64_t N, DequantTile tile) {
  auto w = at::empty({N, a.K}, at::kFloat);
  float* wp = w.data_ptr<float>();
  at::parallel_for(0, G, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> t(a.K * 16);
    for (int64_t g = begin; g < end; ++g) {
      tile(a, g, t.data());
      for (int64_t r = 0; r < 8 && g * 8 + r < N; ++r)
        for (int64_t k = 0; k < a.K; ++k) wp[(g * 8 + r) * a.K + k] = t[k * 16 + r];
    }
  });
  return w;
}

template <typename S>
at::Tensor run_q8x8_f32(const at::Tensor& x, const X8Layout& l) {
  if (l.sub16)
    return run_f32(x, l.args, false, q8x8_f32_tile<S, true, true, 1>, q8x8_f32_tile<S, true, true, 4>,
                   q8x8_dequant_tile<S, true, true>, l.G);
  if (l.per_block)
    return run_f32(x, l.args, l.has_m, q8x8_f32_tile<S, true, false, 1>, q8x8_f32_tile<S, true, false, 4>,
                   q8x8_dequant_tile<S, true, false>, l.G);
  return run_f32(x, l.args, false, q8x8_f32_tile<S, false, false, 1>, q8x8_f32_tile<S, false, false, 4>,
                 q8x8_dequant_tile<S, false, false>, l.G);
}

at::Tensor linear_q8x8_f32(const at::Tensor& x, const at::Tensor& q, const at::Tensor& d,
                           const c10::optional<at::Tensor>& m, const c10::optional<at::Tensor>& b, int64_t N) {
  const X8Layout l = q8x8_layout(x, q, d, m, b, N);
  return l.fp16_scales ? run_q8x8_f32<at::Half>(x, l) : run_q8x8_f32<float>(x, l);
}

}  // namespace tk_qgemm
