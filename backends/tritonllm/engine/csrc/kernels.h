// Entry points of the native CPU kernels that other translation units call (decode_cpu.cpp's fused decode).
// Each lives in its own file's namespace; the Python bindings are those files' register_* functions.
#pragma once
#include <torch/extension.h>

namespace tk_gemm {
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w, const c10::optional<torch::Tensor>& b);
}
namespace tk_elementwise {
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& w, double eps);
torch::Tensor add_rms_norm(torch::Tensor h, const torch::Tensor& d, const torch::Tensor& w, double eps);
torch::Tensor silu_mul(const torch::Tensor& gu);
}
namespace tk_attention {
void rope_store(torch::Tensor qkv, const torch::Tensor& cos, const torch::Tensor& sin, const torch::Tensor& slots,
                torch::Tensor kc, torch::Tensor vc, int64_t H, int64_t KVH);
void decode_attention(const torch::Tensor& qkv, const torch::Tensor& kc, const torch::Tensor& vc,
                      const torch::Tensor& rows, const torch::Tensor& slots, const torch::Tensor& lo,
                      const torch::Tensor& hi, double scale, int64_t H, torch::Tensor out);
}
namespace tk_qgemm {
// dsup / msup: K-quant super-block scales where d / m hold int8 codes (qgemm.h, KScale); else None.
torch::Tensor linear_q4x8(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& d,
                          const torch::Tensor& m, const c10::optional<torch::Tensor>& b, int64_t N,
                          const c10::optional<torch::Tensor>& dsup, const c10::optional<torch::Tensor>& msup);
torch::Tensor linear_q4x8_f32(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& d,
                              const torch::Tensor& m, const c10::optional<torch::Tensor>& b, int64_t N,
                              const c10::optional<torch::Tensor>& dsup, const c10::optional<torch::Tensor>& msup);
torch::Tensor linear_q8x8(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& d,
                          const c10::optional<torch::Tensor>& m, const c10::optional<torch::Tensor>& b, int64_t N);
torch::Tensor linear_q8x8_f32(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& d,
                              const c10::optional<torch::Tensor>& m, const c10::optional<torch::Tensor>& b,
                              int64_t N);
torch::Tensor linear_nbit(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& h, const torch::Tensor& d,
                          const c10::optional<torch::Tensor>& m, const c10::optional<torch::Tensor>& b, int64_t N,
                          int64_t zero, const c10::optional<torch::Tensor>& dsup,
                          const c10::optional<torch::Tensor>& msup);
torch::Tensor linear_nbit_f32(const torch::Tensor& x, const torch::Tensor& q, const torch::Tensor& h,
                              const torch::Tensor& d, const c10::optional<torch::Tensor>& m,
                              const c10::optional<torch::Tensor>& b, int64_t N, int64_t zero,
                              const c10::optional<torch::Tensor>& dsup, const c10::optional<torch::Tensor>& msup);
}
