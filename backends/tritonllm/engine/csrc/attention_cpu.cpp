// Decode-step attention and RoPE + KV-cache write for the fp32 CPU engine, straight on the paged cache.
//
// Why: the torch path gathers every decode sequence's K and V into a padded copy (index_select), runs
// SDPA with a mask and scatters the result back: at batch 16 that copies ~6.5 MB per layer and costs
// ~20 torch ops per layer. Here each (sequence, KV head) task reads its cache slots in place.
//
// Layouts (see engine/kv_cache.py, engine/model.py): qkv [T, (H + 2 KVH) * D] is the fused projection
// output, q heads first; caches are [slots, KVH, W] with W = D (fp32, fp16) or D + 4 (int8 codes and the
// row's fp32 scale); q head h reads KV head h / (H / KVH) (HF repeat_kv).
// Numerics: RoPE is the same multiply-multiply-add per element as HF's rotate-half form (built with
// -ffp-contract=off so it stays bitwise equal); softmax is the plain max-subtracted form with a vectorised
// exp (vec_avx2.h), so attention outputs differ from SDPA's blocked online softmax by rounding only.
#include "kernels.h"
#include "vec_avx2.h"
#include <immintrin.h>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

// Named (not anonymous): decode_cpu.cpp calls the entry points declared in kernels.h.
namespace tk_attention {

using tritonllm::exp8;
using tritonllm::hsum;

// A cache row holds D values of one KV head: float (fp32 cache), fp16 (half cache) or int8 codes followed by
// the row's fp32 scale (int8 cache, engine/kv_quant.py). load8 widens 8 values to fp32; row_scale is 1 for
// the float forms. Fewer bytes a row is the point: at batch 16 decode attention reads the whole context's K/V
// once a step and runs at the memory's bandwidth.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const at::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 load8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline float load1(const float* p) { return *p; }
inline float load1(const at::Half* p) { return static_cast<float>(*p); }
inline float load1(const int8_t* p) { return static_cast<float>(*p); }
template <typename E> inline float row_scale(const E*, int64_t) { return 1.f; }
template <> inline float row_scale<int8_t>(const int8_t* r, int64_t D) {
  float s;
  std::memcpy(&s, r + D, sizeof s);
  return s;
}

template <typename E>
inline float dot(const float* a, const E* b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8(b + i), acc);
  float r = hsum(acc);
  for (; i < n; ++i) r += a[i] * load1(b + i);
  return r;
}

// Cache rows of one KV head: row(t) = base + slots[t] * stride.
template <typename E>
struct Rows {
  const E* base; const int64_t* slots; int64_t stride;
  const E* operator()(int64_t t) const { return base + slots[t] * stride; }
};

// out[t] = q . k_t * scale, four keys at a time so that four FMA chains run side by side.
template <typename E>
void scores(const float* q, const Rows<E>& k, int64_t n, int64_t D, float scale, float* out) {
  int64_t t = 0;
  if (D % 8 == 0) {
    for (; t + 4 <= n; t += 4) {
      const E *k0 = k(t), *k1 = k(t + 1), *k2 = k(t + 2), *k3 = k(t + 3);
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int64_t j = 0; j < D; j += 8) {
        const __m256 qv = _mm256_loadu_ps(q + j);
        a0 = _mm256_fmadd_ps(qv, load8(k0 + j), a0);
        a1 = _mm256_fmadd_ps(qv, load8(k1 + j), a1);
        a2 = _mm256_fmadd_ps(qv, load8(k2 + j), a2);
        a3 = _mm256_fmadd_ps(qv, load8(k3 + j), a3);
      }
      out[t] = hsum(a0) * row_scale(k0, D) * scale; out[t + 1] = hsum(a1) * row_scale(k1, D) * scale;
      out[t + 2] = hsum(a2) * row_scale(k2, D) * scale; out[t + 3] = hsum(a3) * row_scale(k3, D) * scale;
    }
  }
  for (; t < n; ++t) out[t] = dot(q, k(t), D) * row_scale(k(t), D) * scale;
}

// out[0:D] = scale * sum_t p[t] v_t, 32 output lanes in registers per pass over the keys.
template <typename E>
void weighted_sum(const float* p, const Rows<E>& v, int64_t n, int64_t D, float scale, float* out) {
  int64_t j = 0;
  for (; j + 32 <= D; j += 32) {
    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
    for (int64_t t = 0; t < n; ++t) {
      const E* r = v(t);
      const __m256 pv = _mm256_set1_ps(p[t] * row_scale(r, D));
      r += j;
      c0 = _mm256_fmadd_ps(pv, load8(r), c0);
      c1 = _mm256_fmadd_ps(pv, load8(r + 8), c1);
      c2 = _mm256_fmadd_ps(pv, load8(r + 16), c2);
      c3 = _mm256_fmadd_ps(pv, load8(r + 24), c3);
    }
    const __m256 sv = _mm256_set1_ps(scale);
    _mm256_storeu_ps(out + j, _mm256_mul_ps(c0, sv)); _mm256_storeu_ps(out + j + 8, _mm256_mul_ps(c1, sv));
    _mm256_storeu_ps(out + j + 16, _mm256_mul_ps(c2, sv)); _mm256_storeu_ps(out + j + 24, _mm256_mul_ps(c3, sv));
  }
  for (; j < D; ++j) {
    float c = 0.f;
    for (int64_t t = 0; t < n; ++t) c += p[t] * row_scale(v(t), D) * load1(v(t) + j);
    out[j] = c * scale;
  }
}

// exp(p - max) in place over p[0:n]; returns 1 / their sum.
inline float softmax_in_place(float* p, int64_t n) {
  float m = p[0];
  for (int64_t t = 1; t < n; ++t) m = std::max(m, p[t]);
  int64_t t = 0;
  __m256 sv = _mm256_setzero_ps();
  for (; t + 8 <= n; t += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + t), _mm256_set1_ps(m)));
    _mm256_storeu_ps(p + t, e);
    sv = _mm256_add_ps(sv, e);
  }
  float sum = hsum(sv);
  for (; t < n; ++t) { p[t] = std::exp(p[t] - m); sum += p[t]; }
  return 1.f / sum;
}

// The G query heads that share one KV head, together (D % 32 == 0): each K and V row is read and widened to fp32
// once for all G (per head, a task converted its rows G times) and each row's scale applied once.
// q: G heads of D floats; p: G rows of ld scores; out: G heads of D floats.
template <int G, typename E>
void grouped_attention(const float* q, const Rows<E>& k, const Rows<E>& v, int64_t n, int64_t D, float scale,
                       float* p, int64_t ld, float* out) {
  int64_t t = 0;
  for (; t + 2 <= n; t += 2) {  // two keys at a time: 2G independent FMA chains
    const E *k0 = k(t), *k1 = k(t + 1);
    __m256 a[2][G];
    for (int g = 0; g < G; ++g) a[0][g] = a[1][g] = _mm256_setzero_ps();
    for (int64_t j = 0; j < D; j += 8) {
      const __m256 x0 = load8(k0 + j), x1 = load8(k1 + j);
      for (int g = 0; g < G; ++g) {
        const __m256 qv = _mm256_loadu_ps(q + g * D + j);
        a[0][g] = _mm256_fmadd_ps(qv, x0, a[0][g]);
        a[1][g] = _mm256_fmadd_ps(qv, x1, a[1][g]);
      }
    }
    const float s0 = row_scale(k0, D) * scale, s1 = row_scale(k1, D) * scale;
    for (int g = 0; g < G; ++g) { p[g * ld + t] = hsum(a[0][g]) * s0; p[g * ld + t + 1] = hsum(a[1][g]) * s1; }
  }
  for (; t < n; ++t)
    for (int g = 0; g < G; ++g) p[g * ld + t] = dot(q + g * D, k(t), D) * row_scale(k(t), D) * scale;
  float inv[G];
  for (int g = 0; g < G; ++g) inv[g] = softmax_in_place(p + g * ld, n);
  constexpr int V = G <= 2 ? 4 : 2;  // output vectors per pass: G * V accumulators, V rows and p fit 16 registers
  for (int64_t j = 0; j < D; j += 8 * V) {
    __m256 c[G][V];
    for (int g = 0; g < G; ++g)
      for (int u = 0; u < V; ++u) c[g][u] = _mm256_setzero_ps();
    for (t = 0; t < n; ++t) {
      const E* r = v(t);
      const float rs = row_scale(r, D);
      __m256 x[V];
      for (int u = 0; u < V; ++u) x[u] = load8(r + j + 8 * u);
      for (int g = 0; g < G; ++g) {
        const __m256 pv = _mm256_set1_ps(p[g * ld + t] * rs);
        for (int u = 0; u < V; ++u) c[g][u] = _mm256_fmadd_ps(pv, x[u], c[g][u]);
      }
    }
    for (int g = 0; g < G; ++g)
      for (int u = 0; u < V; ++u)
        _mm256_storeu_ps(out + g * D + j + 8 * u, _mm256_mul_ps(c[g][u], _mm256_set1_ps(inv[g])));
  }
}

// The cache's row width for head_dim D: D values, plus the 4 bytes of the row's scale in an int8 cache.
int64_t row_width(const at::Tensor& cache, int64_t D) {
  const auto t = cache.scalar_type();
  TORCH_CHECK(cache.is_contiguous() && (t == at::kFloat || t == at::kHalf || t == at::kChar),
              "KV cache: contiguous float32, float16 or int8 expected");
  return t == at::kChar ? D + 4 : D;
}

// Row x[0:D] (fp32) into a cache row, in the forms kv_quant.store writes (same rounding: nearest, ties even).
inline void put_row(const float* x, int64_t D, float* dst) { std::copy(x, x + D, dst); }
inline void put_row(const float* x, int64_t D, at::Half* dst) {
  for (int64_t j = 0; j < D; ++j) dst[j] = at::Half(x[j]);
}
inline void put_row(const float* x, int64_t D, int8_t* dst) {
  float amax = 0.f;
  for (int64_t j = 0; j < D; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float s = std::max(amax, 1e-12f) / 127.f;
  for (int64_t j = 0; j < D; ++j)
    dst[j] = static_cast<int8_t>(std::min(127.f, std::max(-127.f, std::nearbyint(x[j] / s))));
  std::memcpy(dst + D, &s, sizeof s);
}

// Calls f with a null pointer of the cache's element type (the type, not the value, is what f needs).
template <typename F>
void by_cache_type(const at::Tensor& cache, F&& f) {
  switch (cache.scalar_type()) {
    case at::kHalf: f(static_cast<at::Half*>(nullptr)); break;
    case at::kChar: f(static_cast<int8_t*>(nullptr)); break;
    default: f(static_cast<float*>(nullptr));
  }
}

void check_f32(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous(), name, ": contiguous float32 expected");
}

// Rotates q and k heads of qkv in place (x * cos + rotate_half(x) * sin) and writes k and v of token t
// into cache slot slots[t] (as is, as fp16, or as int8 codes with the row's scale: see put_row).
void rope_store(at::Tensor qkv, const at::Tensor& cos, const at::Tensor& sin,
                const at::Tensor& slots, at::Tensor kc, at::Tensor vc, int64_t H, int64_t KVH) {
  check_f32(cos, "cos"); check_f32(sin, "sin");
  TORCH_CHECK(qkv.scalar_type() == at::kFloat && qkv.dim() == 2 && qkv.stride(1) == 1, "qkv: [T, F] float32");
  const int64_t T = qkv.size(0), D = qkv.size(1) / (H + 2 * KVH), half = D / 2, S = kc.size(0);
  const int64_t W = row_width(kc, D);
  TORCH_CHECK(qkv.size(1) == (H + 2 * KVH) * D && kc.size(1) == KVH && kc.size(2) == W && cos.size(0) == T &&
              cos.size(1) == D && sin.sizes() == cos.sizes() && vc.sizes() == kc.sizes() &&
              vc.scalar_type() == kc.scalar_type(), "rope_store: shapes of qkv, cos / sin or caches disagree");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.numel() == T && slots.is_contiguous(), "slots: [T] int64");
  float* base = qkv.data_ptr<float>();
  const int64_t* sl = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t) TORCH_CHECK(sl[t] >= 0 && sl[t] < S, "rope_store: slot out of range");
  by_cache_type(kc, [&](auto* type) {
    using E = std::remove_pointer_t<decltype(type)>;
    E *kp = static_cast<E*>(kc.data_ptr()), *vp = static_cast<E*>(vc.data_ptr());
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
          const int64_t kvh = (h - H) % KVH;
          put_row(x, D, (h < H + KVH ? kp : vp) + (sl[t] * KVH + kvh) * W);
        }
      }
    });
  });
}

// out[rows[i], h * D:(h + 1) * D] = attention of q head h of token rows[i] over the cache slots
// slots[i, lo[i]:hi[i]].
void decode_attention(const at::Tensor& qkv, const at::Tensor& kc, const at::Tensor& vc,
                      const at::Tensor& rows, const at::Tensor& slots, const at::Tensor& lo,
                      const at::Tensor& hi, double scale, int64_t H, at::Tensor out) {
  check_f32(out, "out");
  TORCH_CHECK(qkv.scalar_type() == at::kFloat && qkv.dim() == 2 && qkv.stride(1) == 1, "qkv: [T, F] float32");
  for (auto* t : {&rows, &slots, &lo, &hi})
    TORCH_CHECK(t->scalar_type() == at::kLong && t->is_contiguous(), "rows, slots, lo, hi: int64");
  TORCH_CHECK(H > 0 && out.dim() == 2 && out.size(1) % H == 0, "decode_attention: shapes disagree");
  const int64_t B = rows.numel(), L = slots.size(1), KVH = kc.size(1), D = out.size(1) / H, S = kc.size(0);
  const int64_t W = row_width(kc, D);
  TORCH_CHECK(H % KVH == 0 && kc.size(2) == W && out.size(0) == qkv.size(0) && qkv.size(1) >= H * D &&
              slots.dim() == 2 && slots.size(0) == B && lo.numel() == B && hi.numel() == B &&
              vc.sizes() == kc.sizes() && vc.scalar_type() == kc.scalar_type(), "decode_attention: shapes disagree");
  const int64_t G = H / KVH;
  const int64_t *rw = rows.data_ptr<int64_t>(), *sl = slots.data_ptr<int64_t>();
  const int64_t *lop = lo.data_ptr<int64_t>(), *hip = hi.data_ptr<int64_t>();
  for (int64_t i = 0; i < B; ++i) {
    TORCH_CHECK(0 <= lop[i] && lop[i] < hip[i] && hip[i] <= L && 0 <= rw[i] && rw[i] < out.size(0),
                "decode_attention: bad key range or row");
    for (int64_t j = lop[i]; j < hip[i]; ++j) TORCH_CHECK(0 <= sl[i * L + j] && sl[i * L + j] < S, "slot range");
  }
  const float* qp = qkv.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  by_cache_type(kc, [&](auto* type) {
    using E = std::remove_pointer_t<decltype(type)>;
    const E *kp = static_cast<const E*>(kc.data_ptr()), *vp = static_cast<const E*>(vc.data_ptr());
    at::parallel_for(0, B * KVH, 1, [&](int64_t b0, int64_t b1) {
      std::vector<float> p(G * L);
      for (int64_t task = b0; task < b1; ++task) {
        const int64_t i = task / KVH, g = task % KVH, n = hip[i] - lop[i];
        const int64_t* s = sl + i * L + lop[i];
        const Rows<E> k{kp + g * W, s, KVH * W}, v{vp + g * W, s, KVH * W};
        const float* q = qp + rw[i] * qkv.stride(0) + g * G * D;
        float* o = op + rw[i] * out.size(1) + g * G * D;
        // fp32 rows: per head was as fast (bandwidth-bound, 478-502 vs 511-551 us a layer, batch 16 x 512 keys);
        // fp16 / int8 rows: grouped, 1.3x (their conversion is paid once for G heads)
        if (!std::is_same_v<E, float> && D % 32 == 0 && G <= 4) {
          switch (G) {
            case 1: grouped_attention<1>(q, k, v, n, D, sc, p.data(), L, o); break;
            case 2: grouped_attention<2>(q, k, v, n, D, sc, p.data(), L, o); break;
            case 3: grouped_attention<3>(q, k, v, n, D, sc, p.data(), L, o); break;
            default: grouped_attention<4>(q, k, v, n, D, sc, p.data(), L, o);
          }
          continue;
        }
        for (int64_t h = 0; h < G; ++h) {  // any other head size or group: one head at a time
          scores(q + h * D, k, n, D, sc, p.data());
          const float inv = softmax_in_place(p.data(), n);
          weighted_sum(p.data(), v, n, D, inv, o + h * D);
        }
      }
    });
  });
}

}  // namespace tk_attention
