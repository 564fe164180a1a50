// Matmuls over 5- and 6-bit codes, packed: GGUF's Q5_0 / Q5_1 / Q5_K and Q6_K blocks at the file's 5.5 to 6.6 bits a
// weight (codes and scales; K-quant scales factored, qgemm.h KScale) instead of the 8.5 and 10 of int8 codes, for
// batch-1 decode, whose time is the weights' bytes.
//
// Layout (written by engine/quant_nbit.py), rows in groups of 8 and blocks of 32 along K as int4's (qgemm.h):
//   q [G, nb, 4, 32]: the codes' low nibbles exactly as int4 holds its codes (chunk t's in the low nibble of chunk
//     t % 4, in the high nibble for t >= 4);
//   h [G, nb, HB, 32], HB = bits - 4 high bits per code: plane p holds chunks p * 8 / HB .. + 8 / HB - 1, chunk t at
//     bits HB * (t % (8 / HB)) of byte 4r + j (row r, input 4t + j);
//   codes unsigned 0 .. 2^bits - 1 with a fixed offset zero: weight = d * (q - zero) (+ m). 5-bit: d (and m) per
//     32-block [G, nb, 8] (Q5_0: zero 16; Q5_1 / Q5_K: zero 0 and m); 6-bit: d per 16-element half [G, 2 nb, 8],
//     no m (Q6_K: zero 32).
// With int8 activations the offset is taken out of the integer sums (sum (q - z) x = sum q x - z sum x, exact), so
// the results are bit for bit those of the same weights held as signed int8 codes; with fp32 activations the
// widened codes are (q - z) before the scale, the dequantized weights' values.
#include "kernels.h"
#include <immintrin.h>
#include <optional>
#include <vector>
#include "int8_tiles.h"
#include "qgemm.h"

namespace tk_qgemm {

// fp32 activations, few rows: each lane's 4 codes widened to (q - zero) in fp32, one byte at a time.
template <typename S, int HB, int MB>
void nbit_f32_tile(const X8Args& a, int64_t g, int64_t m0) {
  constexpr bool HALF = HB == 2;
  const int64_t nb = a.K / QK;
  const __m256i byte = _mm256_set1_epi32(0xFF), zero = _mm256_set1_epi32(a.zero);
  __m256 acc[MB];
  for (int m = 0; m < MB; ++m) acc[m] = _mm256_setzero_ps();
  for (int64_t blk = 0; blk < nb; ++blk) {
    const int64_t i = g * nb + blk;
    const uint8_t* lo = a.w + i * 128;
    const uint8_t* hi = a.h + i * 32 * HB;
    __m256 s[MB];
    for (int m = 0; m < MB; ++m) s[m] = _mm256_setzero_ps();
    for (int half = 0; half < 2; ++half) {
      for (int t = 4 * half; t < 4 * half + 4; ++t) {
        __m256i c = nbit_codes<HB>(lo, hi, t);
        for (int j = 0; j < 4; ++j, c = _mm256_srli_epi32(c, 8)) {
          const __m256 w = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(c, byte), zero));
          for (int m = 0; m < MB; ++m)
            s[m] = _mm256_fmadd_ps(w, _mm256_broadcast_ss(a.x + (m0 + m) * a.K + blk * QK + 4 * t + j), s[m]);
        }
      }
      if (HALF) {
        const __m256 dv = scale8<S>(a.d, a.dsup, 2 * i + half, 16);
        for (int m = 0; m < MB; ++m) {
          acc[m] = _mm256_fmadd_ps(s[m], dv, acc[m]);
          s[m] = _mm256_setzero_ps();
        }
      }
    }
    if (!HALF) {
      const __m256 dv = scale8<S>(a.d, a.dsup, i, 8);
      for (int m = 0; m < MB; ++m) {
        acc[m] = _mm256_fmadd_ps(s[m], dv, acc[m]);
        if (a.m)
          acc[m] = _mm256_fmadd_ps(scale8<S>(a.m, a.msup, i, 8), _mm256_broadcast_ss(a.xs + (m0 + m) * nb + blk), acc[m]);
      }
    }
  }
  store8<MB>(a, acc, g, m0);
}

// Group g's 8 rows dequantized into columns 0-7 of tile [K, 16]: (q - zero) * d, then + m (quant_nbit.py's values).
template <typename S, int HB>
void nbit_dequant_tile(const X8Args& a, int64_t g, float* tile) {
  constexpr bool HALF = HB == 2;
  const int64_t nb = a.K / QK;
  const __m256i byte = _mm256_set1_epi32(0xFF), zero = _mm256_set1_epi32(a.zero);
  for (int64_t blk = 0; blk < nb; ++blk) {
    const int64_t i = g * nb + blk;
    const uint8_t* lo = a.w + i * 128;
    const uint8_t* hi = a.h + i * 32 * HB;
    const __m256 mv = a.m ? scale8<S>(a.m, a.msup, i, 8) : _mm256_setzero_ps();
    float* tb = tile + blk * QK * 16;
    for (int t = 0; t < 8; ++t) {
      const __m256 dv = HALF ? scale8<S>(a.d, a.dsup, 2 * i + t / 4, 16) : scale8<S>(a.d, a.dsup, i, 8);
      __m256i c = nbit_codes<HB>(lo, hi, t);
      for (int j = 0; j < 4; ++j, c = _mm256_srli_epi32(c, 8)) {
        const __m256 w = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(c, byte), zero)), dv);
        _mm256_storeu_ps(tb + (4 * t + j) * 16, a.m ? _mm256_add_ps(w, mv) : w);
      }
    }
  }
}

struct NbitLayout { X8Layout l; int64_t hb; };
using Opt = c10::optional<at::Tensor>;

// q [G, nb, 4, 32] and h [G, nb, HB, 32] uint8; 5-bit: d (and m) [G, nb, 8]; 6-bit: d [G, 2 nb, 8], no m; scales
// fp32, fp16, or K-quant codes with dsup (and msup).
NbitLayout nbit_layout(const at::Tensor& x, const at::Tensor& q, const at::Tensor& h, const at::Tensor& d,
                       const Opt& m, const Opt& b, int64_t N, int64_t zero, const Opt& dsup, const Opt& msup) {
  TORCH_CHECK(q.dim() == 4 && q.size(2) == 4 && q.size(3) == 32 && q.scalar_type() == at::kByte && q.is_contiguous(),
              "nbit: q [G, K/32, 4, 32] uint8 expected");
  const int64_t G = q.size(0), nb = q.size(1), K = nb * QK, hb = h.dim() == 4 ? h.size(2) : 0;
  TORCH_CHECK(N > (G - 1) * 8 && N <= G * 8, "nbit: N must fill the last group of 8 rows");
  TORCH_CHECK((hb == 1 || hb == 2) && h.size(0) == G && h.size(1) == nb && h.size(3) == 32 &&
                  h.scalar_type() == at::kByte && h.is_contiguous(),
              "nbit: h [G, K/32, 1 or 2, 32] uint8 expected (5- or 6-bit codes)");
  TORCH_CHECK(zero >= 0 && zero < (1 << (4 + hb)), "nbit: zero must be a code (0 .. 2^bits - 1)");
  const bool has_m = m.has_value() && m->defined();
  TORCH_CHECK(hb == 1 || !has_m, "nbit: 6-bit codes take no m");
  if (x.defined()) check_x(x, K, b, N);
  const bool has_b = b.has_value() && b->defined();
  X8Args args{q.data_ptr<uint8_t>(), d.data_ptr(), has_m ? m->data_ptr() : nullptr,
              has_b ? b->data_ptr<float>() : nullptr, nullptr, 0, K, N};
  args.h = h.data_ptr<uint8_t>();
  args.zero = static_cast<int32_t>(zero);
  const bool kscales = check_block_scales(args, d, hb * nb, m, dsup, msup, G, "nbit scales");
  return {{args, G, d.scalar_type() == at::kHalf, true, hb == 2, has_m, kscales}, hb};
}

// A layout's fp32-activation tiles, by scale type and bit width (the int8-activation ones: int8_tiles).
struct NbitKernels { F32Tile f1, f4; DequantTile dequant; };

template <typename S, int HB>
NbitKernels nbit_kernels_of() {
  return {nbit_f32_tile<S, HB, 1>, nbit_f32_tile<S, HB, 4>, nbit_dequant_tile<S, HB>};
}

NbitKernels nbit_kernels(const NbitLayout& n) {
  if (n.l.kscales) return n.hb == 1 ? nbit_kernels_of<KScale, 1>() : nbit_kernels_of<KScale, 2>();
  if (n.l.fp16_scales) return n.hb == 1 ? nbit_kernels_of<at::Half, 1>() : nbit_kernels_of<at::Half, 2>();
  return n.hb == 1 ? nbit_kernels_of<float, 1>() : nbit_kernels_of<float, 2>();
}

at::Tensor linear_nbit(const at::Tensor& x, const at::Tensor& q, const at::Tensor& h,
                       const at::Tensor& d, const Opt& m, const Opt& b, int64_t N, int64_t zero, const Opt& dsup,
                       const Opt& msup) {
  NbitLayout n = nbit_layout(x, q, h, d, m, b, N, zero, dsup, msup);
  std::optional<ExpandedScales> fp32;  // qgemm.h: from EXPAND_KSCALES_ROWS the tiles read fp32 scales
  if (n.l.kscales && x.size(0) >= EXPAND_KSCALES_ROWS) {
    fp32.emplace(n.l.args, n.l.G, n.hb * q.size(1));
    n.l.kscales = n.l.fp16_scales = false;
  }
  const Scales s = n.l.kscales ? Scales::K : n.l.fp16_scales ? Scales::F16 : Scales::F32;
  const X8Tiles t = int8_tiles(n.hb == 1 ? Codes::N5 : Codes::N6, s);
  return run_x8(x, n.l.args, t.x1, t.x4, n.l.G, true);
}

at::Tensor linear_nbit_f32(const at::Tensor& x, const at::Tensor& q, const at::Tensor& h,
                           const at::Tensor& d, const Opt& m, const Opt& b, int64_t N, int64_t zero,
                           const Opt& dsup, const Opt& msup) {
  const NbitLayout n = nbit_layout(x, q, h, d, m, b, N, zero, dsup, msup);
  const NbitKernels k = nbit_kernels(n);
  return run_f32(x, n.l.args, n.l.has_m, k.f1, k.f4, k.dequant, n.l.G);
}

// The float weight [N, K] (a long prefill with fp32 activations: oneDNN's GEMM over it), through the tiles.
at::Tensor dequant_nbit(const at::Tensor& q, const at::Tensor& h, const at::Tensor& d, const Opt& m,
                        int64_t N, int64_t zero, const Opt& dsup, const Opt& msup) {
  const NbitLayout n = nbit_layout(at::Tensor(), q, h, d, m, c10::nullopt, N, zero, dsup, msup);
  return dequant_by_tiles(n.l.args, n.l.G, N, nbit_kernels(n).dequant);
}

}  // namespace tk_qgemm
