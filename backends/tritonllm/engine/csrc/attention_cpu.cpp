// Decode-step attention and RoPE + KV-cache write for the fp32 CPU engine, straight on the paged cache.
//
// Why: the torch path gathers every decode sequence's K and V into a padded copy (index_select), runs
// SDPA with a mask and scatters the result back: at batch 16 that copies ~6.5 MB per layer and costs
// ~20 torch ops per layer. Here each (sequence, KV head) task reads its cache slots in place.
//
// Layouts (see engine/kv_cache.py, engine/model.py): qkv [T, (H + 2 KVH) * D] is the fused projection
// output, q heads first; caches are [slots, KVH, D]; q head h reads KV head h / (H / KVH) (HF repeat_kv).
// Numerics: RoPE is the same multiply-multiply-add per element as HF's rotate-half form (built with
// -ffp-contract=off so it stays bitwise equal); softmax is the plain max-subtracted form with a vectorised
// exp (vec_avx2.h), so attention outputs differ from SDPA's blocked online softmax by rounding only.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include "vec_avx2.h"
#include <immintrin.h>
#include <cmath>
#include <vector>

// Named (not anonymous): decode_cpu.cpp calls the entry points declared in kernels.h.
namespace tk_attention {

using tritonllm::exp8;
using tritonllm::hsum;

inline float dot(const float* a, const float* b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  float r = hsum(acc);
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

// Cache rows of one KV head: row(t) = base + slots[t] * stride.
struct Rows {
  const float* base; const int64_t* slots; int64_t stride;
  const float* operator()(int64_t t) const { return base + slots[t] * stride; }
};

// out[t] = q . k_t * scale, four keys at a time so that four FMA chains run side by side.
void scores(const float* q, const Rows& k, int64_t n, int64_t D, float scale, float* out) {
  int64_t t = 0;
  if (D % 8 == 0) {
    for (; t + 4 <= n; t += 4) {
      const float *k0 = k(t), *k1 = k(t + 1), *k2 = k(t + 2), *k3 = k(t + 3);
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int64_t j = 0; j < D; j += 8) {
        const __m256 qv = _mm256_loadu_ps(q + j);
        a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + j), a0);
        a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + j), a1);
        a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + j), a2);
        a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + j), a3);
      }
      out[t] = hsum(a0) * scale; out[t + 1] = hsum(a1) * scale;
      out[t + 2] = hsum(a2) * scale; out[t + 3] = hsum(a3) * scale;
    }
  }
  for (; t < n; ++t) out[t] = dot(q, k(t), D) * scale;
}

// out[0:D] = scale * sum_t p[t] v_t, 32 output lanes in registers per pass over the keys.
void weighted_sum(const float* p, const Rows& v, int64_t n, int64_t D, float scale, float* out) {
  int64_t j = 0;
  for (; j + 32 <= D; j += 32) {
    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
    for (int64_t t = 0; t < n; ++t) {
      const __m256 pv = _mm256_set1_ps(p[t]);
      const float* r = v(t) + j;
      c0 = _mm256_fmadd_ps(pv, _mm256_loadu_ps(r), c0);
      c1 = _mm256_fmadd_ps(pv, _mm256_loadu_ps(r + 8), c1);
      c2 = _mm256_fmadd_ps(pv, _mm256_loadu_ps(r + 16), c2);
      c3 = _mm256_fmadd_ps(pv, _mm256_loadu_ps(r + 24), c3);
    }
    const __m256 sv = _mm256_set1_ps(scale);
    _mm256_storeu_ps(out + j, _mm256_mul_ps(c0, sv)); _mm256_storeu_ps(out + j + 8, _mm256_mul_ps(c1, sv));
    _mm256_storeu_ps(out + j + 16, _mm256_mul_ps(c2, sv)); _mm256_storeu_ps(out + j + 24, _mm256_mul_ps(c3, sv));
  }
  for (; j < D; ++j) {
    float c = 0.f;
    for (int64_t t = 0; t < n; ++t) c += p[t] * v(t)[j];
    out[j] = c * scale;
  }
}

void check_f32(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous(), name, ": contiguous float32 expected");
}

// Rotates q and k heads of qkv in place (x * cos + rotate_half(x) * sin) and writes k and v of token t
// into cache slot slots[t].
void rope_store(torch::Tensor qkv, const torch::Tensor& cos, const torch::Tensor& sin,
                const torch::Tensor& slots, torch::Tensor kc, torch::Tensor vc, int64_t H, int64_t KVH) {
  check_f32(cos, "cos"); check_f32(sin, "sin"); check_f32(kc, "k cache"); check_f32(vc, "v cache");
  TORCH_CHECK(qkv.scalar_type() == at::kFloat && qkv.dim() == 2 && qkv.stride(1) == 1, "qkv: [T, F] float32");
  const int64_t T = qkv.size(0), D = kc.size(2), half = D / 2, S = kc.size(0);
  TORCH_CHECK(qkv.size(1) == (H + 2 * KVH) * D && kc.size(1) == KVH && cos.size(0) == T && cos.size(1) == D &&
              sin.sizes() == cos.sizes() && vc.sizes() == kc.sizes(),
              "rope_store: shapes of qkv, cos / sin or caches disagree");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.numel() == T && slots.is_contiguous(), "slots: [T] int64");
  float* base = qkv.data_ptr<float>();
  const int64_t* sl = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t) TORCH_CHECK(sl[t] >= 0 && sl[t] < S, "rope_store: slot out of range");
  at::parallel_for(0, T * (H + 2 * KVH), 64, [&](int64_t b, int64_t e) {
    std::vector<float> tmp(D);
    for (int64_t i = b; i < e; ++i) {
      const int64_t t = i / (H + 2 * KVH), h = i % (H + 2 * KVH);
      float* x = base + t * qkv.stride(0) + h * D;
      if (h < H + KVH) {
        const float* c = cos.data_ptr<float>() + t * D;
        const float* s = sin.data_ptr<float>() + t * D;
        for (int64_t j = 0; j < half; ++j) tmp[j] = x[j] * c[j] + (-x[j + half]) * s[j];
        for (int64_t j = half; j < D; ++j) tmp[j] = x[j] * c[j] + x[j - half] * s[j];
        std::copy(tmp.begin(), tmp.end(), x);
      }
      if (h >= H) {  // k or v head: into the cache
        float* cache = (h < H + KVH ? kc : vc).data_ptr<float>();
        const int64_t kvh = (h - H) % KVH;
        std::copy(x, x + D, cache + (sl[t] * KVH + kvh) * D);
      }
    }
  });
}

// out[rows[i], h * D:(h + 1) * D] = attention of q head h of token rows[i] over the cache slots
// slots[i, lo[i]:hi[i]].
void decode_attention(const torch::Tensor& qkv, const torch::Tensor& kc, const torch::Tensor& vc,
                      const torch::Tensor& rows, const torch::Tensor& slots, const torch::Tensor& lo,
                      const torch::Tensor& hi, double scale, int64_t H, torch::Tensor out) {
  check_f32(kc, "k cache"); check_f32(vc, "v cache"); check_f32(out, "out");
  TORCH_CHECK(qkv.scalar_type() == at::kFloat && qkv.dim() == 2 && qkv.stride(1) == 1, "qkv: [T, F] float32");
  for (auto* t : {&rows, &slots, &lo, &hi})
    TORCH_CHECK(t->scalar_type() == at::kLong && t->is_contiguous(), "rows, slots, lo, hi: int64");
  const int64_t B = rows.numel(), L = slots.size(1), KVH = kc.size(1), D = kc.size(2), S = kc.size(0);
  TORCH_CHECK(H % KVH == 0 && out.dim() == 2 && out.size(1) == H * D && out.size(0) == qkv.size(0) &&
              qkv.size(1) >= H * D && slots.dim() == 2 && slots.size(0) == B && lo.numel() == B &&
              hi.numel() == B && vc.sizes() == kc.sizes(), "decode_attention: shapes disagree");
  const int64_t G = H / KVH;
  const int64_t *rw = rows.data_ptr<int64_t>(), *sl = slots.data_ptr<int64_t>();
  const int64_t *lop = lo.data_ptr<int64_t>(), *hip = hi.data_ptr<int64_t>();
  for (int64_t i = 0; i < B; ++i) {
    TORCH_CHECK(0 <= lop[i] && lop[i] < hip[i] && hip[i] <= L && 0 <= rw[i] && rw[i] < out.size(0),
                "decode_attention: bad key range or row");
    for (int64_t j = lop[i]; j < hip[i]; ++j) TORCH_CHECK(0 <= sl[i * L + j] && sl[i * L + j] < S, "slot range");
  }
  const float *kp = kc.data_ptr<float>(), *vp = vc.data_ptr<float>(), *qp = qkv.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  at::parallel_for(0, B * KVH, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> p(L);
    for (int64_t task = b0; task < b1; ++task) {
      const int64_t i = task / KVH, g = task % KVH, n = hip[i] - lop[i];
      const int64_t* s = sl + i * L + lop[i];
      const Rows k{kp + g * D, s, KVH * D}, v{vp + g * D, s, KVH * D};
      for (int64_t h = g * G; h < (g + 1) * G; ++h) {
        scores(qp + rw[i] * qkv.stride(0) + h * D, k, n, D, sc, p.data());
        float m = p[0], sum = 0.f;
        for (int64_t t = 1; t < n; ++t) m = std::max(m, p[t]);
        int64_t t = 0;
        __m256 sv = _mm256_setzero_ps();
        for (; t + 8 <= n; t += 8) {
          const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(&p[t]), _mm256_set1_ps(m)));
          _mm256_storeu_ps(&p[t], e);
          sv = _mm256_add_ps(sv, e);
        }
        sum = hsum(sv);
        for (; t < n; ++t) { p[t] = std::exp(p[t] - m); sum += p[t]; }
        weighted_sum(p.data(), v, n, D, 1.f / sum, op + rw[i] * out.size(1) + h * D);
      }
    }
  });
}

}  // namespace tk_attention
using namespace tk_attention;

void register_attention(pybind11::module& m) {
  m.def("rope_store", &rope_store, "in-place RoPE of q, k heads in qkv; k, v into the paged cache",
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("decode_attention", &decode_attention, "one-token attention per sequence over its cache slots",
        pybind11::call_guard<pybind11::gil_scoped_release>());
}
