// RMSNorm (optionally after the residual add) and SiLU-gate for the fp32 CPU engine (AVX2 + FMA).
//
// Why: torch's CPU rms_norm is a chain of ~8 ops (measured ~40-80 us per call at 1-16 rows) and
// silu(gate) * up costs 4 ops; a decode step makes 25 + 12 such calls. Here each is one pass per row.
// Numerics follow HF: var = mean(x^2) in fp32 (summed in 8 lanes, so the last bits of var can differ
// from torch's reduction), y = w * (x * (1 / sqrt(var + eps))); silu(x) = x / (1 + exp(-x)) with a
// vectorised exp within ~2 ulp of expf (Cephes polynomial).
#include "kernels.h"
#include <immintrin.h>
#include <cmath>

#include "vec_avx2.h"

// Named (not anonymous): decode_cpu.cpp calls the entry points declared in kernels.h.
namespace tk_elementwise {

using tritonllm::exp8;
using tritonllm::hsum;

void check_rows(const at::Tensor& x, const at::Tensor& w, const char* name) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(), name, ": x [T, D] float32");
  TORCH_CHECK(w.scalar_type() == at::kFloat && w.dim() == 1 && w.size(0) == x.size(1) && w.is_contiguous(),
              name, ": weight [D] float32");
}

void norm_row(const float* x, const float* w, float* y, int64_t D, float eps) {
  __m256 acc = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= D; j += 8) {
    const __m256 v = _mm256_loadu_ps(x + j);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  float ss = hsum(acc);
  for (; j < D; ++j) ss += x[j] * x[j];
  const float r = 1.f / std::sqrt(ss / static_cast<float>(D) + eps);
  const __m256 rv = _mm256_set1_ps(r);
  for (j = 0; j + 8 <= D; j += 8)
    _mm256_storeu_ps(y + j, _mm256_mul_ps(_mm256_loadu_ps(w + j), _mm256_mul_ps(_mm256_loadu_ps(x + j), rv)));
  for (; j < D; ++j) y[j] = w[j] * (x[j] * r);
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  check_rows(x, w, "rms_norm");
  auto y = at::empty_like(x);
  const int64_t D = x.size(1);
  const float *xp = x.data_ptr<float>(), *wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, x.size(0), 8, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) norm_row(xp + t * D, wp, yp + t * D, D, static_cast<float>(eps));
  });
  return y;
}

// h += d (in place), returns rms_norm(h).
at::Tensor add_rms_norm(at::Tensor h, const at::Tensor& d, const at::Tensor& w, double eps) {
  check_rows(h, w, "add_rms_norm");
  TORCH_CHECK(d.sizes() == h.sizes() && d.scalar_type() == at::kFloat && d.is_contiguous(),
              "add_rms_norm: residual delta must match h");
  auto y = at::empty_like(h);
  const int64_t D = h.size(1);
  float *hp = h.data_ptr<float>(), *yp = y.data_ptr<float>();
  const float *dp = d.data_ptr<float>(), *wp = w.data_ptr<float>();
  at::parallel_for(0, h.size(0), 8, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      float* row = hp + t * D;
      for (int64_t j = 0; j < D; ++j) row[j] += dp[t * D + j];
      norm_row(row, wp, yp + t * D, D, static_cast<float>(eps));
    }
  });
  return y;
}

// gu [T, 2 I] = [gate | up] -> silu(gate) * up [T, I]
at::Tensor silu_mul(const at::Tensor& gu) {
  TORCH_CHECK(gu.scalar_type() == at::kFloat && gu.dim() == 2 && gu.is_contiguous() && gu.size(1) % 2 == 0,
              "silu_mul: gu [T, 2 I] float32");
  const int64_t T = gu.size(0), I = gu.size(1) / 2;
  auto y = at::empty({T, I}, gu.options());
  const float* gp = gu.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, T * I, 2048, [&](int64_t b, int64_t e) {
    int64_t i = b;
    const __m256 one = _mm256_set1_ps(1.f);
    for (; i < e && (i % I) + 8 <= I && i + 8 <= e; i += 8) {
      const float* g = gp + (i / I) * 2 * I + i % I;
      const __m256 gv = _mm256_loadu_ps(g);
      const __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv))));
      _mm256_storeu_ps(yp + i, _mm256_mul_ps(s, _mm256_loadu_ps(g + I)));
    }
    for (; i < e; ++i) {
      const float* g = gp + (i / I) * 2 * I + i % I;
      yp[i] = g[0] / (1.f + std::exp(-g[0])) * g[I];
    }
  });
  return y;
}

}  // namespace tk_elementwise
