// Matmuls y[M, N] = x[M, K] W[N, K]^T (+ b) over INT8 / INT4 weights, with int8 dot products (AVX2, or
// AVX-512 VNNI where the CPU has it: the tiles are int8_tiles.h's, chosen by int8_tiles below).
//
// Why int8 dot products: unpacking quantized weights to fp32 and multiplying in fp32 costs ~2 instructions per
// weight, which at batch 1 is slower than streaming fp32 weights. Quantizing the activations per 32-element
// block to int8 (d = amax / 127, as llama.cpp's Q8_0 / Q8_1 for its quantized dot products) turns a block into
// 32 multiply-adds in two instructions (maddubs: u8 x s8 -> s16 pairs, madd: -> s32) plus one fp32 FMA.
// The price is the activations' rounding (at most d / 2 per element); engine/quant.py documents and the
// tests bound the error against the fp32 matmul of the dequantized weights.
//
// Layouts (written by engine/quant.py), K a multiple of 32, blocks of 32 along K:
//   int8 / int4: 8 rows interleaved per 32-block (see X8Args, qgemm.h).
//   fp8: fp8_cpu.cpp.
// Output rows are split across torch's intra-op threads; each weight block is unpacked once and used for
// MB activation rows.
#include "kernels.h"
#include <immintrin.h>
#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>
#include "int8_tiles.h"
#include "qgemm.h"
#include "vec_avx2.h"

// Named (not anonymous): decode_cpu.cpp calls the entry points declared in kernels.h.
namespace tk_qgemm {


// One 32-element block: d = amax / 127, codes = round-to-nearest-even(v / d) (as std::nearbyint), their sum.
inline void quantize_block(const float* v, int8_t* q, float& d_out, float& ds_out, int32_t* halves) {
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
  const __m256i h0 = _mm256_add_epi32(c[0], c[1]), h1 = _mm256_add_epi32(c[2], c[3]);
  const __m256i s32 = _mm256_add_epi32(h0, h1);
  // pack 4 x 8 int32 -> 32 int8 (the packs interleave 128-bit lanes; the permute restores element order)
  const __m256i p16a = _mm256_packs_epi32(c[0], c[1]), p16b = _mm256_packs_epi32(c[2], c[3]);
  const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b),
                                                 _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), p8);
  d_out = d;
  ds_out = d * static_cast<float>(tritonllm::hsum_epi32(s32));
  if (halves) {  // the stored codes' sums: codes in +-127, so the packs above saturate nothing
    halves[0] = tritonllm::hsum_epi32(h0);
    halves[1] = tritonllm::hsum_epi32(h1);
  }
}

QuantizedRows quantize_rows(const float* x, int64_t M, int64_t K, bool half_sums) {
  const int64_t nb = K / QK;
  QuantizedRows r{std::vector<int8_t>(M * K), std::vector<float>(M * nb), std::vector<float>(M * nb),
                  std::vector<int32_t>(half_sums ? 2 * M * nb : 0)};
  at::parallel_for(0, M * nb, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      quantize_block(x + (i / nb) * K + (i % nb) * QK, r.q.data() + (i / nb) * K + (i % nb) * QK, r.d[i], r.ds[i],
                     half_sums ? r.hs.data() + 2 * i : nullptr);
  });
  return r;
}

void check_x(const at::Tensor& x, int64_t K, const c10::optional<at::Tensor>& b, int64_t N) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K && x.scalar_type() == at::kFloat && x.is_contiguous() && x.is_cpu(),
              "quantized linear: contiguous float32 x [M, K] on the CPU expected");
  TORCH_CHECK(K % QK == 0, "quantized linear: K must be a multiple of 32");
  if (b.has_value() && b->defined())
    TORCH_CHECK(b->dim() == 1 && b->size(0) == N && b->is_contiguous() && b->scalar_type() == at::kFloat,
                "quantized linear: bias [N] float32 expected");
}

constexpr int64_t PANEL_BYTES = 128 * 1024;

// Tiles of 4 activation rows: a tile's accumulators and block sums (8 + the weights' registers) fit AVX2's 16; 8 rows
// spill them to the stack at every chunk (measured 2.9x slower at 512 rows: docs/quantization.md, "The matmuls"), and
// with VNNI's 32 registers GCC still spills them (measured 0.70-0.94x the AVX2 tiles on Q6_K at 16-512 rows).
at::Tensor run_x8(const at::Tensor& x, const X8Args& base, X8Tile tile1, X8Tile tile4, int64_t G, bool half_sums) {
  auto y = at::empty({x.size(0), base.N}, x.options());
  X8Args a = base;
  a.y = y.data_ptr<float>();
  a.M = x.size(0);
  const QuantizedRows xq = quantize_rows(x.data_ptr<float>(), a.M, a.K, half_sums);
  // Rows in panels whose int8 codes (PANEL_BYTES) stay in L2 while the thread's groups of 8 weight rows pass over
  // them: a prefill reads each panel once from memory and its weights once per panel (a decode is one panel).
  const int64_t panel = std::max<int64_t>(4, PANEL_BYTES / a.K / 4 * 4);
  at::parallel_for(0, G, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r0 = 0; r0 < a.M; r0 += panel) {
      const int64_t r1 = std::min(a.M, r0 + panel);
      for (int64_t g = begin; g < end; ++g) {
        int64_t mm = r0;
        for (; mm + 4 <= r1; mm += 4) tile4(a, xq, g, mm);
        for (; mm < r1; ++mm) tile1(a, xq, g, mm);
      }
    }
  });
  return y;
}

void check_x8(const at::Tensor& q, int64_t chunks, c10::ScalarType dtype, int64_t N, const char* name) {
  TORCH_CHECK(q.dim() == 4 && q.size(2) == chunks && q.size(3) == 32 && q.scalar_type() == dtype && q.is_contiguous() &&
              q.is_cpu(),
              name, ": q [G, K/32, ", chunks, ", 32] expected");
  TORCH_CHECK(N > (q.size(0) - 1) * 8 && N <= q.size(0) * 8, name, ": N must fill the last group of 8 rows");
}

// d (and m, of d's dtype): fp32 or fp16, contiguous, of the given shape.
void check_scales(const at::Tensor& t, const std::vector<int64_t>& shape, c10::ScalarType dtype, const char* name) {
  TORCH_CHECK(t.sizes() == at::IntArrayRef(shape) && (dtype == at::kFloat || dtype == at::kHalf) &&
                  t.scalar_type() == dtype && t.is_contiguous() && t.is_cpu(),
              name, ": scales ", at::IntArrayRef(shape), " float32 or float16 (all of one weight's alike) expected, got ",
              t.sizes(), " ", t.scalar_type());
}

bool check_block_scales(X8Args& args, const at::Tensor& d, int64_t blocks, const c10::optional<at::Tensor>& m,
                        const c10::optional<at::Tensor>& dsup, const c10::optional<at::Tensor>& msup, int64_t G,
                        const char* name) {
  const int64_t K = args.K;
  const bool has_m = m.has_value() && m->defined(), kscales = d.scalar_type() == at::kChar;
  auto code_check = [&](const at::Tensor& t, const std::vector<int64_t>& shape) {
    TORCH_CHECK(t.sizes() == at::IntArrayRef(shape) && t.scalar_type() == at::kChar && t.is_contiguous() && t.is_cpu(),
                name, ": K-quant scale codes ", at::IntArrayRef(shape), " int8 expected, got ", t.sizes(), " ",
                t.scalar_type());
  };
  auto sup_check = [&](const c10::optional<at::Tensor>& t) {
    TORCH_CHECK(t.has_value() && t->defined() && K % 256 == 0, name, ": int8 scale codes need their super-block scales");
    TORCH_CHECK(t->sizes() == at::IntArrayRef({G, K / 256, 8}) && t->scalar_type() == at::kHalf && t->is_contiguous(),
                name, ": super-block scales [G, K/256, 8] float16 expected, got ", t->sizes(), " ", t->scalar_type());
  };
  if (kscales) {
    code_check(d, {G, blocks, 8});
    sup_check(dsup);
    args.dsup = dsup->data_ptr();
    if (has_m) {
      code_check(*m, {G, K / QK, 8});
      sup_check(msup);
      args.msup = msup->data_ptr();
    }
    return true;
  }
  check_scales(d, {G, blocks, 8}, d.scalar_type(), name);
  if (has_m) check_scales(*m, {G, K / QK, 8}, d.scalar_type(), name);
  return false;
}


ExpandedScales::ExpandedScales(X8Args& args, int64_t G, int64_t blocks) {
  const int64_t per_sup = blocks / (args.K / 256);  // vectors a super-block: 8 (per 32) or 16 (per 16)
  d.resize(G * blocks * 8);
  m.resize(args.m ? G * (args.K / QK) * 8 : 0);
  at::parallel_for(0, G, 16, [&](int64_t begin, int64_t end) {
    for (int64_t v = begin * blocks; v < end * blocks; ++v)
      _mm256_storeu_ps(d.data() + v * 8, scale8<KScale>(args.d, args.dsup, v, per_sup));
    if (args.m)
      for (int64_t v = begin * (args.K / QK); v < end * (args.K / QK); ++v)
        _mm256_storeu_ps(m.data() + v * 8, scale8<KScale>(args.m, args.msup, v, 8));
  });
  args.d = d.data();
  args.m = args.m ? m.data() : nullptr;
  args.dsup = args.msup = nullptr;
}

// int4: d and m [G, K/32, 8] (or their K-quant codes with dsup and msup).
X8Layout q4x8_layout(const at::Tensor& x, const at::Tensor& q, const at::Tensor& d, const at::Tensor& m,
                     const c10::optional<at::Tensor>& b, int64_t N, const c10::optional<at::Tensor>& dsup,
                     const c10::optional<at::Tensor>& msup) {
  check_x8(q, 4, at::kByte, N, "linear_q4x8");
  const int64_t G = q.size(0), K = q.size(1) * QK;
  if (x.defined()) check_x(x, K, b, N);
  const bool has_b = b.has_value() && b->defined();
  X8Args args{q.data_ptr<uint8_t>(), d.data_ptr(), m.data_ptr(), has_b ? b->data_ptr<float>() : nullptr, nullptr, 0, K, N};
  const bool kscales = check_block_scales(args, d, K / QK, m, dsup, msup, G, "linear_q4x8 scales");
  TORCH_CHECK(kscales || m.scalar_type() == d.scalar_type(), "linear_q4x8: m must be of d's dtype");
  return {args, G, d.scalar_type() == at::kHalf, true, false, true, kscales};
}

// int8: d [G, 8] one scale per row; d [G, K/32, 8] per row and block, with m (zero shares) or without; d [G, K/16, 8]
// per row and half block, without m.
X8Layout q8x8_layout(const at::Tensor& x, const at::Tensor& q, const at::Tensor& d,
                     const c10::optional<at::Tensor>& m, const c10::optional<at::Tensor>& b, int64_t N) {
  check_x8(q, 8, at::kChar, N, "linear_q8x8");
  const int64_t G = q.size(0), K = q.size(1) * QK;
  const bool per_block = d.dim() == 3, has_m = m.has_value() && m->defined();
  const bool half = per_block && d.size(1) == 2 * (K / QK);
  check_scales(d, per_block ? std::vector<int64_t>{G, (half ? 2 : 1) * K / QK, 8} : std::vector<int64_t>{G, 8},
               d.scalar_type(), "linear_q8x8 d");
  TORCH_CHECK(!has_m || (per_block && !half), "linear_q8x8: m needs per-block d (of whole blocks)");
  if (has_m) check_scales(*m, {G, K / QK, 8}, d.scalar_type(), "linear_q8x8 m");
  check_x(x, K, b, N);
  const bool has_b = b.has_value() && b->defined();
  return {X8Args{reinterpret_cast<const uint8_t*>(q.data_ptr<int8_t>()), d.data_ptr(), has_m ? m->data_ptr() : nullptr,
                 has_b ? b->data_ptr<float>() : nullptr, nullptr, 0, K, N},
          G, d.scalar_type() == at::kHalf, per_block, half, has_m};
}

Scales scales_of(const X8Layout& l) { return l.kscales ? Scales::K : l.fp16_scales ? Scales::F16 : Scales::F32; }

at::Tensor linear_q4x8(const at::Tensor& x, const at::Tensor& q, const at::Tensor& d,
                       const at::Tensor& m, const c10::optional<at::Tensor>& b, int64_t N,
                       const c10::optional<at::Tensor>& dsup, const c10::optional<at::Tensor>& msup) {
  const X8Layout l = q4x8_layout(x, q, d, m, b, N, dsup, msup);
  if (l.kscales && x.size(0) >= EXPAND_KSCALES_ROWS) {  // qgemm.h: the tiles then read fp32 scales
    X8Args a = l.args;
    const ExpandedScales fp32(a, l.G, a.K / QK);
    const X8Tiles t = int8_tiles(Codes::Q4, Scales::F32);
    return run_x8(x, a, t.x1, t.x4, l.G);
  }
  const X8Tiles t = int8_tiles(Codes::Q4, scales_of(l));
  return run_x8(x, l.args, t.x1, t.x4, l.G);
}

at::Tensor linear_q8x8(const at::Tensor& x, const at::Tensor& q, const at::Tensor& d,
                       const c10::optional<at::Tensor>& m, const c10::optional<at::Tensor>& b, int64_t N) {
  const X8Layout l = q8x8_layout(x, q, d, m, b, N);
  const X8Tiles t = int8_tiles(l.sub16 ? Codes::Q8_HALF : l.per_block ? Codes::Q8_BLOCK : Codes::Q8_ROW, scales_of(l));
  return run_x8(x, l.args, t.x1, t.x4, l.G);
}

namespace {
bool cpu_has_vnni() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
}
// Read by every int8-activation matmul, written only by cpu_isa: relaxed is enough (both choices compute the same).
std::atomic<bool> vnni_in_use{cpu_has_vnni()};
}  // namespace

X8Tiles int8_tiles(Codes c, Scales s) {
  return vnni_in_use.load(std::memory_order_relaxed) ? int8_tiles_vnni(c, s) : tiles_of<false>(c, s);
}

std::string cpu_isa(const std::string& set) {
  if (set == "auto") vnni_in_use = cpu_has_vnni();
  else if (set == "avx2") vnni_in_use = false;
  else if (set == "avx512_vnni") {
    TORCH_CHECK(cpu_has_vnni(), "cpu_isa: this CPU lacks AVX-512 VNNI (or VL); use avx2 or auto");
    vnni_in_use = true;
  } else TORCH_CHECK(set.empty(), "cpu_isa: auto, avx2 or avx512_vnni expected, got '", set, "'");
  return vnni_in_use ? "avx512_vnni" : "avx2";
}

template <typename S>
void dequant_x8_into(const uint8_t* qp, const S* dp, const S* mp, float* wp, bool per_block, int64_t halves, int64_t G,
                     int64_t nb, int64_t N) {
  const int64_t K = nb * QK;
  at::parallel_for(0, G, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g)
      for (int64_t blk = 0; blk < nb; ++blk)
        for (int r = 0; r < 8 && g * 8 + r < N; ++r) {
          const S* scales = per_block ? dp + (g * nb + blk) * halves * 8 + r : dp + g * 8 + r;
          const float scale = static_cast<float>(scales[0]);
          const float shift = mp ? static_cast<float>(mp[(g * nb + blk) * 8 + r]) : 0.f;
          float* row = wp + (g * 8 + r) * K + blk * QK;
          const uint8_t* c = qp + (g * nb + blk) * 256 + 4 * r;
          for (int t = 0; t < 8; ++t) {
            const float s = halves == 2 && t >= 4 ? static_cast<float>(scales[8]) : scale;
            for (int j = 0; j < 4; ++j) {
              const float v = static_cast<float>(static_cast<int8_t>(c[t * 32 + j])) * s;
              row[4 * t + j] = mp ? v + shift : v;
            }
          }
        }
  });
}

// The float weight [N, K] of an interleaved int8 / int4 layout, for prefill-sized inputs with fp32 activations
// (activation_quantization none): oneDNN's fp32 GEMM over it needs the weight once per call (quant.py). int4 goes
// through its dequantizing tile (every scale type), int8 here.
at::Tensor dequant_x8(const at::Tensor& q, const at::Tensor& d, const c10::optional<at::Tensor>& m,
                      int64_t N, const c10::optional<at::Tensor>& dsup, const c10::optional<at::Tensor>& msup) {
  if (q.scalar_type() == at::kByte) {
    TORCH_CHECK(m.has_value() && m->defined(), "dequant_x8: int4 needs m");
    const X8Layout l = q4x8_layout(at::Tensor(), q, d, *m, c10::nullopt, N, dsup, msup);
    return dequant_by_tiles(l.args, l.G, N, q4x8_dequant_fn(l));
  }
  check_x8(q, 8, at::kChar, N, "dequant_x8");
  const int64_t G = q.size(0), nb = q.size(1), K = nb * QK;
  const bool per_block = d.dim() == 3, has_m = m.has_value() && m->defined();
  const int64_t halves = per_block && d.size(1) == 2 * nb ? 2 : 1;
  check_scales(d, per_block ? std::vector<int64_t>{G, halves * nb, 8} : std::vector<int64_t>{G, 8}, d.scalar_type(),
               "dequant_x8 d");
  TORCH_CHECK(!has_m || halves == 1, "dequant_x8: m needs d of whole blocks");
  if (has_m) check_scales(*m, {G, nb, 8}, d.scalar_type(), "dequant_x8 m");
  auto w = at::empty({N, K}, at::kFloat);
  const uint8_t* qp = static_cast<const uint8_t*>(q.data_ptr());  // int8 codes read as bytes, cast back below
  if (d.scalar_type() == at::kHalf)
    dequant_x8_into<at::Half>(qp, d.data_ptr<at::Half>(), has_m ? m->data_ptr<at::Half>() : nullptr,
                              w.data_ptr<float>(), per_block, halves, G, nb, N);
  else
    dequant_x8_into<float>(qp, d.data_ptr<float>(), has_m ? m->data_ptr<float>() : nullptr, w.data_ptr<float>(),
                           per_block, halves, G, nb, N);
  return w;
}

}  // namespace tk_qgemm
