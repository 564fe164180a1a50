// Every entry point of the native CPU kernels: what bindings.cpp binds for Python and decode_cpu.cpp's fused decode
// calls. Each lives in its own file's namespace.
//
// The kernel files include ATen's core headers only, not <torch/extension.h> (torch's whole C++ API and pybind11):
// that header alone took ~20 s of compiler time per file, most of `make build`'s kernel step. Only bindings.cpp and
// decode_cpu.cpp (which reads Python tuples) include it.
#pragma once
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <string>

namespace tk_gemm {
// fp32, few rows (decode): cpu_kernels.MAX_ROWS
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& b);
}
namespace tk_elementwise {
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps);
at::Tensor add_rms_norm(at::Tensor h, const at::Tensor& d, const at::Tensor& w, double eps);
at::Tensor silu_mul(const at::Tensor& gu);
}
namespace tk_attention {
void rope_store(at::Tensor qkv, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& slots,
                at::Tensor kc, at::Tensor vc, int64_t H, int64_t KVH);
void decode_attention(const at::Tensor& qkv, const at::Tensor& kc, const at::Tensor& vc,
                      const at::Tensor& rows, const at::Tensor& slots, const at::Tensor& lo,
                      const at::Tensor& hi, double scale, int64_t H, at::Tensor out);
}
namespace tk_qgemm {
// dsup / msup: K-quant super-block scales where d / m hold int8 codes (qgemm.h, KScale); else None.
at::Tensor linear_q4x8(const at::Tensor& x, const at::Tensor& q, const at::Tensor& d,
                       const at::Tensor& m, const c10::optional<at::Tensor>& b, int64_t N,
                       const c10::optional<at::Tensor>& dsup, const c10::optional<at::Tensor>& msup);
at::Tensor linear_q4x8_f32(const at::Tensor& x, const at::Tensor& q, const at::Tensor& d,
                           const at::Tensor& m, const c10::optional<at::Tensor>& b, int64_t N,
                           const c10::optional<at::Tensor>& dsup, const c10::optional<at::Tensor>& msup);
at::Tensor linear_q8x8(const at::Tensor& x, const at::Tensor& q, const at::Tensor& d,
                       const c10::optional<at::Tensor>& m, const c10::optional<at::Tensor>& b, int64_t N);
at::Tensor linear_q8x8_f32(const at::Tensor& x, const at::Tensor& q, const at::Tensor& d,
                           const c10::optional<at::Tensor>& m, const c10::optional<at::Tensor>& b,
                           int64_t N);
at::Tensor linear_nbit(const at::Tensor& x, const at::Tensor& q, const at::Tensor& h, const at::Tensor& d,
                       const c10::optional<at::Tensor>& m, const c10::optional<at::Tensor>& b, int64_t N,
                       int64_t zero, const c10::optional<at::Tensor>& dsup,
                       const c10::optional<at::Tensor>& msup);
at::Tensor linear_nbit_f32(const at::Tensor& x, const at::Tensor& q, const at::Tensor& h,
                           const at::Tensor& d, const c10::optional<at::Tensor>& m,
                           const c10::optional<at::Tensor>& b, int64_t N, int64_t zero,
                           const c10::optional<at::Tensor>& dsup, const c10::optional<at::Tensor>& msup);
at::Tensor dequant_x8(const at::Tensor& q, const at::Tensor& d, const c10::optional<at::Tensor>& m, int64_t N,
                      const c10::optional<at::Tensor>& dsup, const c10::optional<at::Tensor>& msup);
at::Tensor dequant_nbit(const at::Tensor& q, const at::Tensor& h, const at::Tensor& d, const c10::optional<at::Tensor>& m,
                        int64_t N, int64_t zero, const c10::optional<at::Tensor>& dsup,
                        const c10::optional<at::Tensor>& msup);
// The instruction set of the int8 dot products: "avx2" or "avx512_vnni" sets it ("auto": the best this CPU has; one
// it lacks is an error), "" only reads it. Both give bit for bit the same results: the choice is speed alone, and
// process-wide (tests and benchmarks compare the two).
std::string cpu_isa(const std::string& set);
}
namespace tk_fp8 {
at::Tensor linear_f8(const at::Tensor& x, const at::Tensor& q, const at::Tensor& d, const at::Tensor& lut,
                     const c10::optional<at::Tensor>& b);
}
