// Few-row matmuls y[M, N] = x[M, K] W[N, K]^T (+ b) over INT8 / INT4 weights, with int8 dot products (AVX2).
//
// Why int8 dot products: unpacking quantized weights to fp32 and multiplying in fp32 costs ~2 instructions per
// weight, which at batch 1 is slower than streaming fp32 weights. Quantizing the activations per 32-element
// block to int8 (d = amax / 127, as llama.cpp's Q8_0 / Q8_1 for its quantized dot products) turns a block into
// 32 multiply-adds in two instructions (maddubs: u8 x s8 -> s16 pairs, madd: -> s32) plus one fp32 FMA.
// The price is the activations' rounding (at most d / 2 per element); engine/quant.py documents and the
// tests bound the error against the fp32 matmul of the dequantized weights.
//
// Layouts (written by engine/quant.py), K a multiple of 32, blocks of 32 along K:
//   int8: q [N, K] int8 (-128..127), d [N] fp32 per output channel (symmetric), or d [N, K / 32] per block
//         with optional m [N, K / 32] (checkpoints' 8-bit groups with zero points: weight = d * q + m).
//   int4: 8 rows interleaved per 32-block (see linear_q4x8); weight = d[n, b] * q + m[n, b], q in 0..15
//         (m = -d * zero point; symmetric weights have zero point 8).
//   fp8:  q [N, K] uint8 (float8_e4m3fn bits), d [N] fp32 per output channel; converted in registers and
//         multiplied in fp32: exactly the float matmul of the dequantized weights (no activation rounding), at
//         1 byte per weight read. Conversion: the code's exponent and mantissa bits placed at the bottom of an
//         fp32's (bits << 20) give 2^-120 times the value, subnormals included (they land on fp32
//         subnormals); one multiply by 2^120 and the sign bit finish it. The NaN codes (0x7F, 0xFF) would come
//         out finite; quantized weights never hold them. The scalar tail uses lut (the codes as fp32, torch).
// Output rows are split across torch's intra-op threads; each weight block is unpacked once and used for
// MB activation rows.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>
#include "vec_avx2.h"

namespace {

using tritonllm::hsum;
constexpr int QK = 32;

// x [M, K] -> int8 codes, per-block scales d and d * sum(codes) (for the weights' zero points, m).
struct QuantizedRows {
  std::vector<int8_t> q;
  std::vector<float> d, ds;
};

// One 32-element block: d = amax / 127, codes = round-to-nearest-even(v / d) (as std::nearbyint), their sum.
inline void quantize_block(const float* v, int8_t* q, float& d_out, float& ds_out) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 x[4], amax = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    x[i] = _mm256_loadu_ps(v + 8 * i);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, x[i]));
  }
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  const float d = _mm_cvtss_f32(m) / 127.f, inv = d > 0.f ? 1.f / d : 0.f;
  __m256i c[4];
  for (int i = 0; i < 4; ++i) c[i] = _mm256_cvtps_epi32(_mm256_mul_ps(x[i], _mm256_set1_ps(inv)));
  const __m256i s32 = _mm256_add_epi32(_mm256_add_epi32(c[0], c[1]), _mm256_add_epi32(c[2], c[3]));
  // pack 4 x 8 int32 -> 32 int8 (the packs interleave 128-bit lanes; the permute restores element order)
  const __m256i p16a = _mm256_packs_epi32(c[0], c[1]), p16b = _mm256_packs_epi32(c[2], c[3]);
  const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b),
                                                 _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), p8);
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
  d_out = d;
  ds_out = d * static_cast<float>(_mm_cvtsi128_si32(t));
}

QuantizedRows quantize_rows(const float* x, int64_t M, int64_t K) {
  const int64_t nb = K / QK;
  QuantizedRows r{std::vector<int8_t>(M * K), std::vector<float>(M * nb), std::vector<float>(M * nb)};
  at::parallel_for(0, M * nb, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      quantize_block(x + (i / nb) * K + (i % nb) * QK, r.q.data() + (i / nb) * K + (i % nb) * QK, r.d[i], r.ds[i]);
  });
  return r;
}

inline __m256i load32(const int8_t* x) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)); }


// |w| x sign(x, w): maddubs wants one unsigned side. A weight code of -128 is safe: sign(w, w) leaves 0x80,
// read as unsigned 128, and a pair sums to at most 2 * 128 * 127 = 32512 < 32767 (activations stay in +-127).
inline __m256 dot_s8s8(__m256i w, __m256i xv) {
  const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xv, w));
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}


// Weight codes of one 32-element block: loaded once per block and row, multiplied with MB activation blocks.
struct S8 {  // int8 codes, 32 bytes a block
  static constexpr int BYTES = 32;
  static __m256i load(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static __m256 dot(__m256i w, __m256i xv) { return dot_s8s8(w, xv); }
};
// w: codes, row_bytes apart; d: one scale per row (PER_BLOCK false) or per row and block [N, K/32]; m: the
// zero points' share per row and block (m = -d * zero), or null.
struct QArgs { const uint8_t* w; int64_t row_bytes; const float* d; const float* m; const float* b; float* y;
               int64_t M, K, N; };

// sum over blocks of m[n, b] * (d * sum(codes))[row, b]: the zero points' share, apart from the hot loop.
inline float mins(const QArgs& a, const QuantizedRows& x, int64_t n, int64_t row) {
  const int64_t nb = a.K / QK, nb8 = nb & ~int64_t(7);
  const float* mw = a.m + n * nb;
  const float* ds = x.ds.data() + row * nb;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb8; b += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(mw + b), _mm256_loadu_ps(ds + b), acc);
  float s = hsum(acc);
  for (int64_t b = nb8; b < nb; ++b) s += mw[b] * ds[b];
  return s;
}

// Outputs (m0 .. m0+MB) x (n .. n+R): each weight block is loaded once for MB activation rows and each
// activation block once for R weight rows.
template <class W, bool PER_BLOCK, int R, int MB>
inline void tile(const QArgs& a, const QuantizedRows& x, int64_t n, int64_t m0) {
  const int64_t nb = a.K / QK;
  __m256 acc[R][MB];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MB; ++m) acc[r][m] = _mm256_setzero_ps();
  for (int64_t blk = 0; blk < nb; ++blk) {
    __m256i w[R];
    float dw[R];
    for (int r = 0; r < R; ++r) {
      w[r] = W::load(a.w + (n + r) * a.row_bytes + blk * W::BYTES);
      dw[r] = PER_BLOCK ? a.d[(n + r) * nb + blk] : 1.f;
    }
    for (int m = 0; m < MB; ++m) {
      const int64_t row = m0 + m;
      const __m256i xv = load32(x.q.data() + row * a.K + blk * QK);
      const float dx = x.d[row * nb + blk];
      for (int r = 0; r < R; ++r)
        acc[r][m] = _mm256_fmadd_ps(W::dot(w[r], xv), _mm256_set1_ps(PER_BLOCK ? dw[r] * dx : dx), acc[r][m]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MB; ++m) {
      float s = hsum(acc[r][m]) * (PER_BLOCK ? 1.f : a.d[n + r]);
      if (a.m) s += mins(a, x, n + r, m0 + m);
      a.y[(m0 + m) * a.N + n + r] = a.b ? s + a.b[n + r] : s;
    }
}

struct F8Args { const uint8_t* w; const float* dw; const float* lut; const float* x; const float* b; float* y;
                int64_t M, K, N; };

template <int MB>
inline void f8_row(const F8Args& a, int64_t n, int64_t m0) {
  const int64_t K8 = a.K & ~int64_t(7);
  const uint8_t* w = a.w + n * a.K;
  __m256 acc[MB];
  for (int m = 0; m < MB; ++m) acc[m] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K8; k += 8) {
    const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + k)));
    const __m256i mag = _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x7F)), 20);
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x80)), 24);
    const __m256 wv = _mm256_or_ps(_mm256_mul_ps(_mm256_castsi256_ps(mag), _mm256_set1_ps(0x1p120f)),
                                   _mm256_castsi256_ps(sign));
    for (int m = 0; m < MB; ++m)
      acc[m] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(a.x + (m0 + m) * a.K + k), acc[m]);
  }
  for (int m = 0; m < MB; ++m) {
    float s = hsum(acc[m]);
    for (int64_t k = K8; k < a.K; ++k) s += a.lut[w[k]] * a.x[(m0 + m) * a.K + k];
    s *= a.dw[n];
    a.y[(m0 + m) * a.N + n] = a.b ? s + a.b[n] : s;
  }
}

// Rows of W split across threads. M = 1 keeps 8 weight rows in flight (the memory-level parallelism that
// streams weights near the bandwidth: with 2 rows the int8 LM head of the bench model read at 12.5 GB/s);
// M > 1 tiles 2 weight rows x 4 activation rows, the rest of the rows one by one.
template <class W, bool PER_BLOCK>
void run(const QArgs& a, const QuantizedRows& x) {
  const int64_t R = a.M == 1 ? 8 : 2;
  at::parallel_for(0, a.N / R, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t n = i * R;
      if (a.M == 1) {
        tile<W, PER_BLOCK, 8, 1>(a, x, n, 0);
        continue;
      }
      int64_t m = 0;
      for (; m + 4 <= a.M; m += 4) tile<W, PER_BLOCK, 2, 4>(a, x, n, m);
      for (; m < a.M; ++m) tile<W, PER_BLOCK, 2, 1>(a, x, n, m);
    }
  });
  for (int64_t n = (a.N / R) * R; n < a.N; ++n)
    for (int64_t m = 0; m < a.M; ++m) tile<W, PER_BLOCK, 1, 1>(a, x, n, m);
}

void check_x(const torch::Tensor& x, int64_t K, const c10::optional<torch::Tensor>& b, int64_t N) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "quantized linear: contiguous float32 x [M, K] expected");
  TORCH_CHECK(K % QK == 0, "quantized linear: K must be a multiple of 32");
  if (b.has_value() && b->defined())
    TORCH_CHECK(b->dim() == 1 && b->size(0) == N && b->is_contiguous() && b->scalar_type() == at::kFloat,
                "quantized linear: bias [N] float32 expected");
}

// d [N]: one scale per output channel; d [N, K/32]: per block, with m [N, K/32] (zero points) or without.
torch::Tensor linear_q8(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& d,
                        const c10::optional<torch::Tensor>& m, const c10::optional<torch::Tensor>& b) {
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == at::kChar && q.is_contiguous(), "linear_q8: int8 q [N, K]");
  const int64_t N = q.size(0), K = q.size(1);
  const bool per_block = d.dim() == 2;
  TORCH_CHECK(d.scalar_type() == at::kFloat && d.is_contiguous() &&
              (per_block ? d.size(0) == N && d.size(1) == K / QK : d.numel() == N),
              "linear_q8: d [N] or [N, K/32] float32");
  const bool has_m = m.has_value() && m->defined();
  TORCH_CHECK(!has_m || (per_block && m->sizes() == d.sizes() && m->scalar_type() == at::kFloat && m->is_contiguous()),
              "linear_q8: m [N, K/32] float32, with per-block d");
  check_x(x, K, b, N);
  auto y = torch::empty({x.size(0), N}, x.options());
  const bool has_b = b.has_value() && b->defined();
  const QArgs a{reinterpret_cast<const uint8_t*>(q.data_ptr<int8_t>()), K, d.data_ptr<float>(),
                has_m ? m->data_ptr<float>() : nullptr, has_b ? b->data_ptr<float>() : nullptr,
                y.data_ptr<float>(), x.size(0), K, N};
  const QuantizedRows xq = quantize_rows(x.data_ptr<float>(), a.M, K);
  if (per_block)
    run<S8, true>(a, xq);
  else
    run<S8, false>(a, xq);
  return y;
}

// int4 codes 0..15 of 8 rows interleaved (Int4Weight's layout, engine/quant.py): rows in groups of 8 (N
// padded with zero rows), per group g and 32-block b, 4 chunks of 32 bytes: byte 4r + j of chunk t holds row
// r's code for input 4t + j (low nibble) and 4(t + 4) + j (high nibble); d, m [G, nb, 8] per row and block.
// One 32-bit lane per row: maddubs of a chunk's codes with the activations' 4 codes of that chunk broadcast to
// every lane, so a block's 32 multiply-adds of 8 rows take 8 maddubs and no horizontal sums, and its scale
// is one vector multiply. The 8 maddubs add up in int16 without overflow: each lane is at most
// 2 * 15 * 127 = 3810, eight of them 30480 < 32767 (activation codes stay in +-127).
struct Q4x8Args { const uint8_t* w; const float* d; const float* m; const float* b; float* y; int64_t M, K, N; };

inline __m256i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

template <int MB>
inline void q4x8_tile(const Q4x8Args& a, const QuantizedRows& x, int64_t g, int64_t m0) {
  const int64_t nb = a.K / QK;
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const uint8_t* wg = a.w + g * nb * 128;
  const float* dg = a.d + g * nb * 8;
  const float* mg = a.m + g * nb * 8;
  __m256 acc[MB];
  for (int m = 0; m < MB; ++m) acc[m] = _mm256_setzero_ps();
  for (int64_t blk = 0; blk < nb; ++blk) {
    __m256i s16[MB];
    for (int m = 0; m < MB; ++m) s16[m] = _mm256_setzero_si256();
    for (int t = 0; t < 4; ++t) {
      const __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + blk * 128 + t * 32));
      const __m256i lo = _mm256_and_si256(p, low), hi = _mm256_and_si256(_mm256_srli_epi16(p, 4), low);
      for (int m = 0; m < MB; ++m) {
        const int8_t* xb = x.q.data() + (m0 + m) * a.K + blk * QK;
        s16[m] = _mm256_add_epi16(s16[m], _mm256_maddubs_epi16(lo, bcast4(xb + 4 * t)));
        s16[m] = _mm256_add_epi16(s16[m], _mm256_maddubs_epi16(hi, bcast4(xb + 4 * (t + 4))));
      }
    }
    const __m256 dv = _mm256_loadu_ps(dg + blk * 8), mv = _mm256_loadu_ps(mg + blk * 8);
    for (int m = 0; m < MB; ++m) {
      const int64_t row = m0 + m;
      const __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(s16[m], ones));
      acc[m] = _mm256_fmadd_ps(dot, _mm256_mul_ps(dv, _mm256_set1_ps(x.d[row * nb + blk])), acc[m]);
      acc[m] = _mm256_fmadd_ps(mv, _mm256_set1_ps(x.ds[row * nb + blk]), acc[m]);
    }
  }
  const int64_t n0 = g * 8, rows = std::min<int64_t>(8, a.N - n0);
  for (int m = 0; m < MB; ++m) {
    float out[8];
    _mm256_storeu_ps(out, acc[m]);
    float* y = a.y + (m0 + m) * a.N + n0;
    for (int64_t r = 0; r < rows; ++r) y[r] = a.b ? out[r] + a.b[n0 + r] : out[r];
  }
}

torch::Tensor linear_q4x8(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& d,
                          const torch::Tensor& m, const c10::optional<torch::Tensor>& b, int64_t N) {
  TORCH_CHECK(q.dim() == 4 && q.size(2) == 4 && q.size(3) == 32 && q.scalar_type() == at::kByte && q.is_contiguous(),
              "linear_q4x8: uint8 q [G, K/32, 4, 32]");
  const int64_t G = q.size(0), K = q.size(1) * QK;
  TORCH_CHECK(N > 0 && N <= G * 8 && N > (G - 1) * 8, "linear_q4x8: N must fill the last group of 8 rows");
  for (const auto* t : {&d, &m})
    TORCH_CHECK(t->dim() == 3 && t->size(0) == G && t->size(1) == K / QK && t->size(2) == 8 &&
                t->scalar_type() == at::kFloat && t->is_contiguous(), "linear_q4x8: d, m [G, K/32, 8] float32");
  check_x(x, K, b, N);
  auto y = torch::empty({x.size(0), N}, x.options());
  const bool has_b = b.has_value() && b->defined();
  const Q4x8Args a{q.data_ptr<uint8_t>(), d.data_ptr<float>(), m.data_ptr<float>(),
                   has_b ? b->data_ptr<float>() : nullptr, y.data_ptr<float>(), x.size(0), K, N};
  const QuantizedRows xq = quantize_rows(x.data_ptr<float>(), a.M, K);
  at::parallel_for(0, G, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      int64_t mm = 0;
      for (; mm + 4 <= a.M; mm += 4) q4x8_tile<4>(a, xq, g, mm);
      for (; mm < a.M; ++mm) q4x8_tile<1>(a, xq, g, mm);
    }
  });
  return y;
}

torch::Tensor linear_f8(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& d,
                        const torch::Tensor& lut, const c10::optional<torch::Tensor>& b) {
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == at::kByte && q.is_contiguous(), "linear_f8: uint8 q [N, K]");
  const int64_t N = q.size(0), K = q.size(1);
  TORCH_CHECK(d.numel() == N && d.scalar_type() == at::kFloat && d.is_contiguous(), "linear_f8: d [N] float32");
  TORCH_CHECK(lut.numel() == 256 && lut.scalar_type() == at::kFloat && lut.is_contiguous(), "linear_f8: lut [256]");
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "linear_f8: contiguous float32 x [M, K] expected");
  const bool has_b = b.has_value() && b->defined();
  if (has_b)
    TORCH_CHECK(b->dim() == 1 && b->size(0) == N && b->is_contiguous() && b->scalar_type() == at::kFloat,
                "linear_f8: bias [N] float32 expected");
  auto y = torch::empty({x.size(0), N}, x.options());
  const F8Args a{q.data_ptr<uint8_t>(), d.data_ptr<float>(), lut.data_ptr<float>(), x.data_ptr<float>(),
                 has_b ? b->data_ptr<float>() : nullptr, y.data_ptr<float>(), x.size(0), K, N};
  at::parallel_for(0, N, 8, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      int64_t m = 0;
      for (; m + 4 <= a.M; m += 4) f8_row<4>(a, n, m);
      for (; m < a.M; ++m) f8_row<1>(a, n, m);
    }
  });
  return y;
}

}  // namespace

void register_qgemm(pybind11::module& mod) {
  mod.def("linear_q8", &linear_q8,
          "y = x W^T (+ b), W int8 per channel (d [N]) or per 32-block (d, m [N, K/32]), activations int8 per 32-block",
          pybind11::arg("x"), pybind11::arg("q"), pybind11::arg("d"), pybind11::arg("m") = pybind11::none(),
          pybind11::arg("b") = pybind11::none());
  mod.def("linear_q4x8", &linear_q4x8, "y = x W^T (+ b), W int4 per 32-block, 8 rows interleaved, activations int8 per 32-block",
          pybind11::arg("x"), pybind11::arg("q"), pybind11::arg("d"), pybind11::arg("m"),
          pybind11::arg("b") = pybind11::none(), pybind11::arg("N"));
  mod.def("linear_f8", &linear_f8, "y = x W^T (+ b), W float8_e4m3fn per channel, converted in registers",
          pybind11::arg("x"), pybind11::arg("q"), pybind11::arg("d"), pybind11::arg("lut"),
          pybind11::arg("b") = pybind11::none());
}
