// Shared by the int8 / int4 kernels (qgemm_cpu.cpp: int8 activations, qgemm_f32_cpu.cpp: fp32 activations):
// the interleaved weight layout, the tiles' arguments, their scale loads and stores.
#pragma once
#include "kernels.h"
#include <immintrin.h>
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace tk_qgemm {

constexpr int QK = 32;

// Weights of 8 rows interleaved per 32-block (layouts written by engine/quant.py): rows in groups of 8 (N
// padded with zero rows), one 32-bit lane per row. Chunk t of a block holds, at byte 4r + j, row r's code(s)
// for input 4t + j; maddubs with the activations' 4 codes of that chunk broadcast to every lane gives each
// row's partial dot product in its own lane: no horizontal sums, and a block's scales are one vector
// multiply for 8 rows.
//   int8: 8 chunks of 32 bytes per group and block, codes -128..127; d [G, 8] per row, or d and m
//         [G, nb, 8] per row and block (checkpoints' 8-bit groups: weight = d * q + m), or d [G, 2 nb, 8] per
//         row and 16-element half block (GGUF's Q6_K / Q3_K), no m.
//   int4: 4 chunks of 32 bytes, the low nibble for input 4t + j, the high one for 4(t + 4) + j; codes 0..15,
//         d and m [G, nb, 8] (weight = d * q + m, m = -d * zero point).
//   Scales (d, m) are fp32, or fp16 where every one of a weight's is exactly a float16 (GGUF's Q4_0 / Q4_1 /
//   Q8_0 blocks: half the scale bytes, a fifth of an int4 weight's traffic); the tiles take their type S.
// x and xs (the fp32-activation kernels': activations and their per-block sums) are set by run_f32.
// h and zero: the 5- / 6-bit layouts' high-bit planes and the codes' fixed offset (qgemm_nbit_cpu.cpp).
// dsup and msup: K-quant super-block scales (KScale below).
struct X8Args { const uint8_t* w; const void* d; const void* m; const float* b; float* y; int64_t M, K, N;
                const float* x = nullptr; const float* xs = nullptr; const uint8_t* h = nullptr; int32_t zero = 0;
                const void* dsup = nullptr; const void* msup = nullptr; };

template <typename S> inline __m256 load8(const S* p);
template <> inline __m256 load8<float>(const float* p) { return _mm256_loadu_ps(p); }
template <> inline __m256 load8<at::Half>(const at::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// An activation row's 4 int8 codes of a chunk, in every 32-bit lane.
inline __m256i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Scales as the tiles read them, one vector of 8 rows at vector index v (d or m [G, blocks, 8] flattened): S is
// float or at::Half (the scales themselves), or KScale: GGUF's K-quant factoring kept, int8 codes per block (or half
// block) times a float16 per row and 256-element super-block (sup [G, K/256, 8]: the file's d / dmin; per_sup
// vectors a super-block). A float16 times a code of at most 8 bits is exact in fp32: the same scale as stored whole,
// in a quarter of the bytes (Q4_K: 4.6 bits a weight held instead of 6).
struct KScale {};
template <typename S>
inline __m256 scale8(const void* p, const void*, int64_t v, int64_t) {
  return load8(static_cast<const S*>(p) + v * 8);
}
template <>
inline __m256 scale8<KScale>(const void* p, const void* sup, int64_t v, int64_t per_sup) {
  const __m128i c = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(static_cast<const int8_t*>(p) + v * 8));
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c)), load8(static_cast<const at::Half*>(sup) + v / per_sup * 8));
}

// One output vector (8 rows of one group) of one activation row, plus the bias.
inline void put8(const X8Args& a, __m256 r, int64_t g, int64_t row) {
  const int64_t n0 = g * 8, rows = std::min<int64_t>(8, a.N - n0);
  float* y = a.y + row * a.N + n0;
  if (rows == 8) {
    _mm256_storeu_ps(y, a.b ? _mm256_add_ps(r, _mm256_loadu_ps(a.b + n0)) : r);
    return;
  }
  alignas(32) float t[8];
  _mm256_store_ps(t, r);
  for (int64_t i = 0; i < rows; ++i) y[i] = a.b ? t[i] + a.b[n0 + i] : t[i];
}

// Every loop over an accumulator array must be unrolled (put8 takes one vector by value): a loop left rolled
// indexes the array at run time, which keeps it in memory, stored at every input (GCC 12; measured 3x slower).
template <int MB>
inline void store8(const X8Args& a, const __m256 (&acc)[MB], int64_t g, int64_t m0) {
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m) put8(a, acc[m], g, m0 + m);
}

// One block of an int8-code tile into a row's accumulator, for both activation modes: the block's sums s (and h,
// the second half's, HALF) times the block's weight scales and, with int8 activations (XD), the row's own block
// scale xd; asymmetric codes add m * xsum (the block's activation sum). Without per-block scales the per-row scale
// is applied once, after the last block (finish_x8).
template <typename S, bool PER_BLOCK, bool HALF, bool XD>
inline __m256 block_fma(__m256 acc, __m256 s, __m256 h, const X8Args& a, int64_t g, int64_t blk, float xd, float xsum) {
  const int64_t nb = a.K / QK;
  const S* d = static_cast<const S*>(a.d);
  const S* mm = static_cast<const S*>(a.m);
  const __m256 xv = _mm256_set1_ps(xd);
  if (HALF) {
    const S* dh = d + (g * nb + blk) * 16;
    acc = _mm256_fmadd_ps(s, XD ? _mm256_mul_ps(load8(dh), xv) : load8(dh), acc);
    return _mm256_fmadd_ps(h, XD ? _mm256_mul_ps(load8(dh + 8), xv) : load8(dh + 8), acc);
  }
  if (PER_BLOCK) {
    const __m256 dv = load8(d + (g * nb + blk) * 8);
    acc = _mm256_fmadd_ps(s, XD ? _mm256_mul_ps(dv, xv) : dv, acc);
    return mm ? _mm256_fmadd_ps(load8(mm + (g * nb + blk) * 8), _mm256_set1_ps(xsum), acc) : acc;
  }
  return XD ? _mm256_fmadd_ps(s, xv, acc) : _mm256_add_ps(acc, s);
}

template <typename S, bool PER_BLOCK, int MB>
inline void finish_x8(const X8Args& a, __m256 (&acc)[MB], int64_t g, int64_t m0) {
  if (!PER_BLOCK) {
    const __m256 dv = load8(static_cast<const S*>(a.d) + g * 8);
    for (int m = 0; m < MB; ++m) acc[m] = _mm256_mul_ps(acc[m], dv);
  }
  store8<MB>(a, acc, g, m0);
}


// x [M, K] as int8 codes per 32-block (qgemm_cpu.cpp): per block the scale d and d * sum(codes) (ds, for the
// weights' zero shares m); with half sums (hs) also the integer sum of each 16-element half's codes (the 5- / 6-bit
// codes' fixed offsets).
struct QuantizedRows {
  std::vector<int8_t> q;
  std::vector<float> d, ds;
  std::vector<int32_t> hs;
};

// The tiles the runners call: MB activation rows (from m0) against group g's 8 weight rows.
using X8Tile = void (*)(const X8Args&, const QuantizedRows&, int64_t g, int64_t m0);
// An int8-activation layout's tiles (int8_tiles.h) for 1 and 4 rows, by its codes and its scales' type: int8 codes
// with one scale a row, a 32-block or a 16-element half; int4; packed 5- / 6-bit codes. Scales fp32, fp16 or KScale.
enum class Codes { Q8_ROW, Q8_BLOCK, Q8_HALF, Q4, N5, N6 };
enum class Scales { F32, F16, K };
struct X8Tiles { X8Tile x1, x4; };
// The tiles of the instruction set in use (cpu_isa, kernels.h): AVX-512 VNNI's where the CPU has it, AVX2's otherwise.
X8Tiles int8_tiles(Codes c, Scales s);
X8Tiles int8_tiles_vnni(Codes c, Scales s);  // qgemm_vnni_cpu.cpp; call only where the CPU has AVX-512 VNNI + VL
using F32Tile = void (*)(const X8Args&, int64_t g, int64_t m0);
using DequantTile = void (*)(const X8Args&, int64_t g, float* tile);  // group g's rows into columns 0-7 of [K, 16]

// int8 activations (qgemm_cpu.cpp): x quantized once, then tile4 / tile1 over every group in L2-sized row panels.
at::Tensor run_x8(const at::Tensor& x, const X8Args& base, X8Tile tile1, X8Tile tile4, int64_t G,
                  bool half_sums = false);
// fp32 activations (qgemm_f32_cpu.cpp): widened codes for few rows (per-block activation sums in xs when need_sums),
// dequantized [K, 16] tiles for TILE_ROWS or more.
at::Tensor run_f32(const at::Tensor& x, X8Args a, bool need_sums, F32Tile tile1, F32Tile tile4,
                   DequantTile dequant, int64_t G);
// The check every quantized matmul makes of its activations and bias.
void check_x(const at::Tensor& x, int64_t K, const c10::optional<at::Tensor>& b, int64_t N);
void check_scales(const at::Tensor& t, const std::vector<int64_t>& shape, c10::ScalarType dtype, const char* name);

// A weight's layout, checked once for both activation modes: the kernel arguments and which tiles apply.
struct X8Layout { X8Args args; int64_t G; bool fp16_scales, per_block, sub16, has_m, kscales = false; };

// Scales (d, and m where given) of a layout whose blocks are vectors [G, blocks, 8]: fp32 or fp16 alike, or int8 codes
// with float16 super-block scales dsup (and msup) [G, K/256, 8] (KScale); sets args.dsup / msup, returns kscales.
bool check_block_scales(X8Args& args, const at::Tensor& d, int64_t blocks, const c10::optional<at::Tensor>& m,
                        const c10::optional<at::Tensor>& dsup, const c10::optional<at::Tensor>& msup, int64_t G,
                        const char* name);
// Rows at which the int8-activation kernels expand factored (KScale) scales to fp32 once per call rather than per
// block and 4-row tile: a prefill's tiles share each group's scales (measured: Q4_K at 512 rows 6% slower without).
constexpr int64_t EXPAND_KSCALES_ROWS = 16;

// Factored scales expanded to fp32 for the call (args.d / m then point into them, dsup / msup cleared): codes
// [G, blocks, 8] times their super-block's float16, exactly the values scale8<KScale> gives.
struct ExpandedScales {
  std::vector<float> d, m;
  ExpandedScales(X8Args& args, int64_t G, int64_t blocks);
};

// The float weight [N, K] through a layout's dequantizing tile (qgemm_f32_cpu.cpp).
at::Tensor dequant_by_tiles(const X8Args& a, int64_t G, int64_t N, DequantTile tile);
// int4's dequantizing tile for the layout's scale type (qgemm_f32_cpu.cpp).
DequantTile q4x8_dequant_fn(const X8Layout& l);

X8Layout q4x8_layout(const at::Tensor& x, const at::Tensor& q, const at::Tensor& d, const at::Tensor& m,
                     const c10::optional<at::Tensor>& b, int64_t N, const c10::optional<at::Tensor>& dsup,
                     const c10::optional<at::Tensor>& msup);
X8Layout q8x8_layout(const at::Tensor& x, const at::Tensor& q, const at::Tensor& d,
                     const c10::optional<at::Tensor>& m, const c10::optional<at::Tensor>& b, int64_t N);

}  // namespace tk_qgemm
