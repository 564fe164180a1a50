// Decode-step attention and RoPE + KV-cache write for the fp32 CPU engine, straight on the paged cache.
//
// Why: the torch path gathers every decode sequence's K and V into a padded copy (index_select), runs
// SDPA with a mask and scatters the result back: at batch 16 that copies ~6.5 MB per layer and costs
// ~20 torch ops per layer. Here each (sequence, KV head) task reads its cache slots in place.
//
// Layouts (see engine/kv_cache.py, engine/model.py): qkv [T, (H + 2 KVH) * D] is the fused projection
// output, q heads first; caches are [slots, KVH, D]; q head h reads KV head h / (H / KVH) (HF repeat_kv).
// Numerics: RoPE is the same multiply-multiply-add per element as HF's rotate-half form (built with
// -ffp-contract=off so it stays bitwise equal); softmax is the plain max-subtracted form, so attention
// outputs differ from SDPA's blocked online softmax by rounding only.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cmath>
#include <vector>

namespace {

inline float dot(const float* a, const float* b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  float r = _mm_cvtss_f32(s);
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

inline void axpy(float* y, float a, const float* x, int64_t n) {  // y += a x
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
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
  TORCH_CHECK(qkv.size(1) == (H + 2 * KVH) * D && kc.size(1) == KVH && cos.size(0) == T && cos.size(1) == D,
              "rope_store: shapes of qkv, cos or cache disagree");
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
  TORCH_CHECK(H % KVH == 0 && out.size(1) == H * D && slots.size(0) == B, "decode_attention: shapes");
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
    std::vector<float> p, acc(G * D);
    for (int64_t task = b0; task < b1; ++task) {
      const int64_t i = task / KVH, g = task % KVH, n = hip[i] - lop[i];
      const int64_t* s = sl + i * L + lop[i];
      const float* q = qp + rw[i] * qkv.stride(0) + g * G * D;
      p.resize(G * n);
      for (int64_t t = 0; t < n; ++t) {
        const float* k = kp + (s[t] * KVH + g) * D;
        for (int64_t h = 0; h < G; ++h) p[h * n + t] = dot(q + h * D, k, D) * sc;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      std::vector<float> sum(G, 0.f);
      for (int64_t h = 0; h < G; ++h) {
        float* ph = p.data() + h * n;
        float m = ph[0];
        for (int64_t t = 1; t < n; ++t) m = std::max(m, ph[t]);
        for (int64_t t = 0; t < n; ++t) { ph[t] = std::exp(ph[t] - m); sum[h] += ph[t]; }
      }
      for (int64_t t = 0; t < n; ++t) {
        const float* v = vp + (s[t] * KVH + g) * D;
        for (int64_t h = 0; h < G; ++h) axpy(acc.data() + h * D, p[h * n + t], v, D);
      }
      for (int64_t h = 0; h < G; ++h) {
        float* o = op + rw[i] * out.size(1) + (g * G + h) * D;
        const float inv = 1.f / sum[h];
        for (int64_t d = 0; d < D; ++d) o[d] = acc[h * D + d] * inv;
      }
    }
  });
}

}  // namespace

void register_attention(pybind11::module& m) {
  m.def("rope_store", &rope_store, "in-place RoPE of q, k heads in qkv; k, v into the paged cache");
  m.def("decode_attention", &decode_attention, "one-token attention per sequence over its cache slots");
}
