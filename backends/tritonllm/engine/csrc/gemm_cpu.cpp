// y[M, N] = x[M, K] W[N, K]^T (+ b) in fp32 for the few-row matmuls of decoding (AVX2 + FMA).
//
// Why not MKL / oneDNN: on the AVX2 AMD EPYC this project is measured on, both stream W well below the
// memory bandwidth at M = 1 and waste most of the FMA units at M = 2..96 (benchmarks/bench_cpu_kernels.py).
// W is the row-major [out, in] weight as stored by the checkpoint, so no repacking is needed.
//
// Scheme: output rows are split across torch's intra-op threads (at::parallel_for). A tile keeps
// R weight rows x MB activation rows of 8-lane accumulators in registers while walking K, so W is read
// from memory once per call and each activation vector is reused R times. Every output is one fp32 dot
// product (8 partial sums, then a horizontal add): not bitwise equal to MKL / oneDNN, within ~1e-6
// relative of them.
#include "kernels.h"
#include "vec_avx2.h"
#include <immintrin.h>

// Named (not anonymous): decode_cpu.cpp calls the entry points declared in kernels.h.
namespace tk_gemm {

using tritonllm::hsum;

struct Args {
  const float* x; const float* w; const float* b; float* y; int64_t M, K, N;
};

// Outputs (m0 .. m0+MB) x (n .. n+R). PRELOAD keeps the R weight vectors of a K step in registers
// (pays off when MB > 1: each is used MB times); otherwise they are FMA memory operands.
template <int R, int MB, bool PRELOAD>
inline void tile(const Args& a, int64_t n, int64_t m0) {
  const int64_t K = a.K, K8 = K & ~int64_t(7);
  __m256 acc[MB][R];
  for (int m = 0; m < MB; ++m)
    for (int r = 0; r < R; ++r) acc[m][r] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K8; k += 8) {
    if (PRELOAD) {
      __m256 wv[R];
      for (int r = 0; r < R; ++r) wv[r] = _mm256_loadu_ps(a.w + (n + r) * K + k);
      for (int m = 0; m < MB; ++m) {
        const __m256 xv = _mm256_loadu_ps(a.x + (m0 + m) * K + k);
        for (int r = 0; r < R; ++r) acc[m][r] = _mm256_fmadd_ps(wv[r], xv, acc[m][r]);
      }
    } else {
      for (int m = 0; m < MB; ++m) {
        const __m256 xv = _mm256_loadu_ps(a.x + (m0 + m) * K + k);
        for (int r = 0; r < R; ++r)
          acc[m][r] = _mm256_fmadd_ps(_mm256_loadu_ps(a.w + (n + r) * K + k), xv, acc[m][r]);
      }
    }
  }
  for (int m = 0; m < MB; ++m)
    for (int r = 0; r < R; ++r) {
      float s = hsum(acc[m][r]);
      for (int64_t k = K8; k < K; ++k) s += a.x[(m0 + m) * K + k] * a.w[(n + r) * K + k];
      a.y[(m0 + m) * a.N + n + r] = a.b ? s + a.b[n + r] : s;
    }
}

template <int R, int MB, bool PRELOAD>
inline void row_block(const Args& a, int64_t n) {
  int64_t m = 0;
  for (; m + MB <= a.M; m += MB) tile<R, MB, PRELOAD>(a, n, m);
  for (; m < a.M; ++m) tile<R, 1, false>(a, n, m);
}

template <int R, int MB, bool PRELOAD>
void run(const Args& a) {
  at::parallel_for(0, a.N / R, 4, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) row_block<R, MB, PRELOAD>(a, i * R);
  });
  for (int64_t n = (a.N / R) * R; n < a.N; ++n) row_block<1, 1, false>(a, n);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& b) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "linear: x [M, K], w [N, K] expected");
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat, "linear: float32 only");
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous(), "linear: contiguous x and w expected");
  const bool has_b = b.has_value() && b->defined();
  if (has_b)
    TORCH_CHECK(b->dim() == 1 && b->size(0) == w.size(0) && b->is_contiguous() &&
                b->scalar_type() == at::kFloat, "linear: bias [N] float32 expected");
  auto y = at::empty({x.size(0), w.size(0)}, x.options());
  Args a{x.data_ptr<float>(), w.data_ptr<float>(), has_b ? b->data_ptr<float>() : nullptr,
         y.data_ptr<float>(), x.size(0), x.size(1), w.size(0)};
  // Tile shapes chosen by benchmarks/bench_cpu_kernels.py on the 2-core AVX2 EPYC (16 ymm registers).
  if (a.M == 1) run<16, 1, false>(a);        // bandwidth-bound: 16 concurrent weight streams
  else if (a.M <= 8) run<8, 2, true>(a);
  else run<3, 4, true>(a);                  // 12 accumulators + 3 weights + 1 activation
  return y;
}

}  // namespace tk_gemm
