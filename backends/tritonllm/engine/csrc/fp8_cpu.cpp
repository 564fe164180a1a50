// Few-row matmuls over FP8 weights (quantization: fp8 on the CPU, engine/fp8.py): y[M, N] = x[M, K] W[N, K]^T (+ b).
//
// q [N, K] uint8 (float8_e4m3fn bits), d [N] fp32 per output channel; converted in registers and
// multiplied in fp32: exactly the float matmul of the dequantized weights (no activation rounding), at
// 1 byte per weight read. Conversion: the code's exponent and mantissa bits placed at the bottom of an
// fp32's (bits << 20) give 2^-120 times the value, subnormals included (they land on fp32
// subnormals); one multiply by 2^120 and the sign bit finish it. The NaN codes (0x7F, 0xFF) would come
// out finite; quantized weights never hold them. The scalar tail uses lut (the codes as fp32, torch).
// Output rows are split across torch's intra-op threads; each weight row is converted once for up to 4 activation rows.
#include "kernels.h"
#include <immintrin.h>
#include "vec_avx2.h"

namespace tk_fp8 {

using tritonllm::hsum;

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

at::Tensor linear_f8(const at::Tensor& x, const at::Tensor& q, const at::Tensor& d,
                     const at::Tensor& lut, const c10::optional<at::Tensor>& b) {
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
  auto y = at::empty({x.size(0), N}, x.options());
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

}  // namespace tk_fp8
