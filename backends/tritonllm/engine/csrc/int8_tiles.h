// The int8-activation tiles (int8, int4 and packed 5- / 6-bit codes), written once for two instruction sets:
// AVX2 (maddubs: u8 x s8 pairs into int16, madd widens to int32) and AVX-512 VNNI (vpdpbusd on 256-bit vectors: the
// same four products added into each int32 lane in one instruction). Both compute the same int32 sums, so their
// results are bit for bit equal; VNNI spends fewer instructions a row and chunk (int8: broadcast, sign, dpbusd
// instead of broadcast, sign, maddubs, madd, add).
//
// Included by qgemm_cpu.cpp (VNNI false) and qgemm_vnni_cpu.cpp (VNNI true, under #pragma GCC target). Everything
// here has internal linkage: a function compiled for AVX-512 in one translation unit must never be the copy the
// linker keeps for the other's callers (an inline function with external linkage would be, on a CPU without
// AVX-512: SIGILL). qgemm.h's helpers are included before the pragma, so they are AVX2 code everywhere.
#pragma once
#include <type_traits>
#include "qgemm.h"

namespace tk_qgemm {
namespace {

// acc + the per-lane sum of u8 x s8 products (4 a lane): one vpdpbusd, or maddubs + madd + add. Exact either way
// where no maddubs pair saturates (every caller: a pair is at most 2 * 128 * 127 = 32512).
template <bool VNNI>
inline __m256i dot4(__m256i acc, __m256i u, __m256i s) {
  if constexpr (VNNI) return _mm256_dpbusd_epi32(acc, u, s);
  else return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}

// Independent int32 sums a row keeps over a block's chunks (added up at the block's end; integer sums, so the order
// changes nothing). vpdpbusd's result feeds the next one (~4 cycles on Zen 4): in one chain a block's chunks wait on
// each other, with two or four they overlap (bench_isa.py, Zen 4, 16 rows of a 1536 x 8960 Q4_K weight: 1.51 ms
// against 1.98 with one chain; one row is memory-bound either way). AVX2's chain is its 1-cycle adds: one sum.
template <bool VNNI, int MB>
constexpr int CHAINS = VNNI ? (MB == 1 ? 4 : 2) : 1;

// A block's sums set to zero: s[m] (AVX2's int16 / int32 sums) and each row's chains v[m][0..P).
template <int MB, int P>
inline void clear_sums(__m256i (&s)[MB], __m256i (&v)[MB][P]) {
#pragma GCC unroll 4
  for (int m = 0; m < MB; ++m) {
    s[m] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int c = 0; c < P; ++c) v[m][c] = _mm256_setzero_si256();
  }
}

template <int P>
inline __m256i sum_chains(const __m256i (&s)[P]) {
  __m256i r = s[0];
#pragma GCC unroll 4
  for (int c = 1; c < P; ++c) r = _mm256_add_epi32(r, s[c]);
  return r;
}

// int8: maddubs wants one unsigned side, so |w| x sign(x, w). A code of -128 is safe: sign(w, w) leaves 0x80,
// read as unsigned 128, and a pair sums to at most 2 * 128 * 127 = 32512 < 32767 (activations stay in +-127).
// HALF (d [G, 2 K/32, 8], GGUF's 16-element sub-blocks): chunks 0-3 of a block (inputs 0-15) and 4-7 (16-31) add
// up in two accumulators, each scaled by its own half's d.
template <bool VNNI, typename S, bool PER_BLOCK, bool HALF, int MB>
void q8x8_tile(const X8Args& a, const QuantizedRows& x, int64_t g, int64_t m0) {
  constexpr int P = CHAINS<VNNI, MB>;
  const int64_t nb = a.K / QK;
  const uint8_t* wg = a.w + g * nb * 256;
  __m256 acc[MB];
  for (int m = 0; m < MB; ++m) acc[m] = _mm256_setzero_ps();
  for (int64_t blk = 0; blk < nb; ++blk) {
    __m256i s32[MB][P], h32[MB][P];
#pragma GCC unroll 4
    for (int m = 0; m < MB; ++m)
#pragma GCC unroll 4
      for (int c = 0; c < P; ++c) s32[m][c] = h32[m][c] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int t = 0; t < 8; ++t) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + blk * 256 + t * 32));
      const __m256i aw = _mm256_sign_epi8(w, w);
#pragma GCC unroll 4
      for (int m = 0; m < MB; ++m) {
        const __m256i xs = _mm256_sign_epi8(bcast4(x.q.data() + (m0 + m) * a.K + blk * QK + 4 * t), w);
        if (HALF && t >= 4) h32[m][t % P] = dot4<VNNI>(h32[m][t % P], aw, xs);
        else s32[m][t % P] = dot4<VNNI>(s32[m][t % P], aw, xs);
      }
    }
#pragma GCC unroll 4
    for (int m = 0; m < MB; ++m) {
      const int64_t i = (m0 + m) * nb + blk;
      acc[m] = block_fma<S, PER_BLOCK, HALF, true>(acc[m], _mm256_cvtepi32_ps(sum_chains(s32[m])),
                                                   _mm256_cvtepi32_ps(sum_chains(h32[m])), a, g, blk, x.d[i],
                                                   x.ds.empty() ? 0.f : x.ds[i]);
    }
  }
  finish_x8<S, PER_BLOCK, MB>(a, acc, g, m0);
}

// int4: with AVX2 the 8 maddubs of a block add up in int16 without overflow (each lane at most 2 * 15 * 127 = 3810,
// eight of them 30480 < 32767) and one madd widens them; VNNI adds into int32 directly.
template <bool VNNI, typename S, int MB>
void q4x8_tile(const X8Args& a, const QuantizedRows& x, int64_t g, int64_t m0) {
  const int64_t nb = a.K / QK;
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const uint8_t* wg = a.w + g * nb * 128;
  __m256 acc[MB];
  for (int m = 0; m < MB; ++m) acc[m] = _mm256_setzero_ps();
  for (int64_t blk = 0; blk < nb; ++blk) {
    constexpr int P = CHAINS<VNNI, MB>;
    __m256i s[MB], v[MB][P];  // int16 pairs (AVX2), int32 lanes (VNNI)
    clear_sums(s, v);
#pragma GCC unroll 4
    for (int t = 0; t < 4; ++t) {
      const __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + blk * 128 + t * 32));
      const __m256i lo = _mm256_and_si256(p, low), hi = _mm256_and_si256(_mm256_srli_epi16(p, 4), low);
#pragma GCC unroll 4
      for (int m = 0; m < MB; ++m) {
        const int8_t* xb = x.q.data() + (m0 + m) * a.K + blk * QK;
        if constexpr (VNNI) {
          v[m][(2 * t) % P] = _mm256_dpbusd_epi32(v[m][(2 * t) % P], lo, bcast4(xb + 4 * t));
          v[m][(2 * t + 1) % P] = _mm256_dpbusd_epi32(v[m][(2 * t + 1) % P], hi, bcast4(xb + 4 * (t + 4)));
        } else {
          s[m] = _mm256_add_epi16(s[m], _mm256_maddubs_epi16(lo, bcast4(xb + 4 * t)));
          s[m] = _mm256_add_epi16(s[m], _mm256_maddubs_epi16(hi, bcast4(xb + 4 * (t + 4))));
        }
      }
    }
    const __m256 dv = scale8<S>(a.d, a.dsup, g * nb + blk, 8), mv = scale8<S>(a.m, a.msup, g * nb + blk, 8);
    for (int m = 0; m < MB; ++m) {
      const int64_t row = m0 + m;
      const __m256 dot = _mm256_cvtepi32_ps(VNNI ? sum_chains(v[m]) : _mm256_madd_epi16(s[m], ones));
      acc[m] = _mm256_fmadd_ps(dot, _mm256_mul_ps(dv, _mm256_set1_ps(x.d[row * nb + blk])), acc[m]);
      acc[m] = _mm256_fmadd_ps(mv, _mm256_set1_ps(x.ds[row * nb + blk]), acc[m]);
    }
  }
  store8<MB>(a, acc, g, m0);
}

// Chunk t's 5- / 6-bit codes (byte 4r + j: row r's code for input 4t + j; layout in qgemm_nbit_cpu.cpp). One 16-bit
// shift moves the high bits to bits 4..: every byte's result bits come from the same byte (left by at most 4, right
// by at most 3).
template <int HB>
inline __m256i nbit_codes(const uint8_t* lo, const uint8_t* hi, int t) {
  constexpr int per = 8 / HB;
  const __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lo + (t & 3) * 32));
  const __m256i nib = _mm256_and_si256(t < 4 ? p : _mm256_srli_epi16(p, 4), _mm256_set1_epi8(0x0F));
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hi + (t / per) * 32));
  const int sh = 4 - HB * (t % per);
  const __m256i hs = sh >= 0 ? _mm256_slli_epi16(h, sh) : _mm256_srli_epi16(h, -sh);
  return _mm256_or_si256(nib, _mm256_and_si256(hs, _mm256_set1_epi8(static_cast<char>(((1 << HB) - 1) << 4))));
}

// 5- / 6-bit codes. With AVX2, maddubs pairs are at most 2 * 31 * 127 = 7874 (5-bit) or 2 * 63 * 127 = 16002 (6-bit):
// int16 sums hold RUN = 4 or 2 chunks before madd widens them; VNNI adds every chunk into int32. The codes' fixed
// offset comes out of the int32 sums through the activations' half sums. 6-bit (HB 2) scales per half: each half is
// applied alone.
template <bool VNNI, typename S, int HB, int MB>
void nbit_x8_tile(const X8Args& a, const QuantizedRows& x, int64_t g, int64_t m0) {
  constexpr bool HALF = HB == 2;
  constexpr int RUN = VNNI ? 4 : HB == 1 ? 4 : 2;
  const int64_t nb = a.K / QK;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[MB];
  for (int m = 0; m < MB; ++m) acc[m] = _mm256_setzero_ps();
  for (int64_t blk = 0; blk < nb; ++blk) {
    const int64_t i = g * nb + blk;
    const uint8_t* lo = a.w + i * 128;
    const uint8_t* hi = a.h + i * 32 * HB;
    constexpr int P = CHAINS<VNNI, MB>;
    __m256i s32[MB], v[MB][P];  // AVX2: int32 sums of the int16 runs; VNNI: its chains, summed per half
    clear_sums(s32, v);
#pragma GCC unroll 2
    for (int half = 0; half < 2; ++half) {
#pragma GCC unroll 4
      for (int r0 = 0; r0 < 4; r0 += RUN) {
        __m256i s16[MB];
        for (int m = 0; m < MB; ++m) s16[m] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int u = 0; u < RUN; ++u) {
          const int t = 4 * half + r0 + u;
          const __m256i c = nbit_codes<HB>(lo, hi, t);
#pragma GCC unroll 4
          for (int m = 0; m < MB; ++m) {
            const __m256i xv = bcast4(x.q.data() + (m0 + m) * a.K + blk * QK + 4 * t);
            if constexpr (VNNI) v[m][u % P] = _mm256_dpbusd_epi32(v[m][u % P], c, xv);
            else s16[m] = _mm256_add_epi16(s16[m], _mm256_maddubs_epi16(c, xv));
          }
        }
        if constexpr (!VNNI)
          for (int m = 0; m < MB; ++m) s32[m] = _mm256_add_epi32(s32[m], _mm256_madd_epi16(s16[m], ones));
      }
      if constexpr (VNNI)
#pragma GCC unroll 4
        for (int m = 0; m < MB; ++m) {
          s32[m] = _mm256_add_epi32(s32[m], sum_chains(v[m]));
#pragma GCC unroll 4
          for (int c = 0; c < P; ++c) v[m][c] = _mm256_setzero_si256();
        }
      if (HALF) {
        const __m256 dv = scale8<S>(a.d, a.dsup, 2 * i + half, 16);
        for (int m = 0; m < MB; ++m) {
          const int64_t row = (m0 + m) * nb + blk;
          const __m256i v = _mm256_sub_epi32(s32[m], _mm256_set1_epi32(a.zero * x.hs[2 * row + half]));
          acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_mul_ps(dv, _mm256_set1_ps(x.d[row])), acc[m]);
          s32[m] = _mm256_setzero_si256();
        }
      }
    }
    if (!HALF) {
      const __m256 dv = scale8<S>(a.d, a.dsup, i, 8);
      for (int m = 0; m < MB; ++m) {
        const int64_t row = (m0 + m) * nb + blk;
        const __m256i v = _mm256_sub_epi32(s32[m], _mm256_set1_epi32(a.zero * (x.hs[2 * row] + x.hs[2 * row + 1])));
        acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_mul_ps(dv, _mm256_set1_ps(x.d[row])), acc[m]);
        if (a.m) acc[m] = _mm256_fmadd_ps(scale8<S>(a.m, a.msup, i, 8), _mm256_set1_ps(x.ds[row]), acc[m]);
      }
    }
  }
  store8<MB>(a, acc, g, m0);
}

template <bool VNNI, typename S>
X8Tiles tiles_with_scales(Codes c) {
  switch (c) {
    case Codes::N5: return {nbit_x8_tile<VNNI, S, 1, 1>, nbit_x8_tile<VNNI, S, 1, 4>};
    case Codes::N6: return {nbit_x8_tile<VNNI, S, 2, 1>, nbit_x8_tile<VNNI, S, 2, 4>};
    case Codes::Q4: return {q4x8_tile<VNNI, S, 1>, q4x8_tile<VNNI, S, 4>};
    default: break;
  }
  if constexpr (std::is_same_v<S, KScale>) {
    TORCH_CHECK(false, "int8 codes take float32 or float16 scales");
    return {};
  } else {
    switch (c) {
      case Codes::Q8_ROW: return {q8x8_tile<VNNI, S, false, false, 1>, q8x8_tile<VNNI, S, false, false, 4>};
      case Codes::Q8_BLOCK: return {q8x8_tile<VNNI, S, true, false, 1>, q8x8_tile<VNNI, S, true, false, 4>};
      default: return {q8x8_tile<VNNI, S, true, true, 1>, q8x8_tile<VNNI, S, true, true, 4>};
    }
  }
}

template <bool VNNI>
X8Tiles tiles_of(Codes c, Scales s) {
  switch (s) {
    case Scales::F32: return tiles_with_scales<VNNI, float>(c);
    case Scales::F16: return tiles_with_scales<VNNI, at::Half>(c);
    default: return tiles_with_scales<VNNI, KScale>(c);
  }
}

}  // namespace
}  // namespace tk_qgemm
