// Every layer of a decode step in one native call (model.Transformer's fused decode).
//
// A decode step of a deep, narrow model spends a fifth of its time between kernels: 30 layers x ~10 Python calls,
// each through the weight's dispatch (SmolLM2-135M: ~1.1 ms of a 5 ms step). DecodeStack holds each layer's
// weights once, as the kernel each one uses, and runs the layers' kernels in the order and with the arguments of
// model.py's per-layer path (rms_norm, qkv, rope_store, decode_attention, o, add_rms_norm, gate_up, silu_mul,
// down, residual add): the same functions on the same tensors, so the result is bit for bit the same.
// Only steps the Python path would run on these kernels come here (model.py checks: every row a decode, fp32 KV,
// no LoRA, no q / k norm, SiLU, few rows).
#include <torch/extension.h>
#include <vector>
#include "kernels.h"

namespace tk_decode {

namespace py = pybind11;

enum Kind : int64_t { F32 = 0, Q4 = 1, Q4_F32 = 2, Q8 = 3, Q8_F32 = 4, QN = 5, QN_F32 = 6, ROWS = 7 };

// One projection as its kernel sees it: (kind, weight or codes, scales, zero shares, bias, output rows, and for
// 5- / 6-bit codes their high-bit planes and offset, and K-quant super-block scales where d / m are codes); or ROWS: (ROWS, parts, None, None, bias, output rows), weights
// of different layouts over one input whose outputs are concatenated (quant.RowStack: a GGUF file's Q4_K q / k with
// its Q6_K v).
struct Lin {
  int64_t kind = F32, n = 0, zero = 0;
  torch::Tensor w, d, m, h;
  c10::optional<torch::Tensor> dsup, msup;  // K-quant super-block scales (d / m as int8 codes)
  c10::optional<torch::Tensor> bias;
  std::vector<Lin> parts;

  static Lin from(const py::tuple& t) {
    Lin l;
    l.kind = t[0].cast<int64_t>();
    if (l.kind == ROWS) {
      for (const auto& p : t[1].cast<std::vector<py::tuple>>()) l.parts.push_back(from(p));
      TORCH_CHECK(!l.parts.empty(), "DecodeStack: a row stack needs parts");
      if (!t[4].is_none()) l.bias = t[4].cast<torch::Tensor>();
      l.n = t[5].cast<int64_t>();
      return l;
    }
    l.w = t[1].cast<torch::Tensor>();
    if (!t[2].is_none()) l.d = t[2].cast<torch::Tensor>();
    if (!t[3].is_none()) l.m = t[3].cast<torch::Tensor>();
    if (!t[4].is_none()) l.bias = t[4].cast<torch::Tensor>();
    l.n = t[5].cast<int64_t>();
    if (t.size() > 7 && !t[6].is_none()) {
      l.h = t[6].cast<torch::Tensor>();
      l.zero = t[7].cast<int64_t>();
    }
    if (t.size() > 9) {
      if (!t[8].is_none()) l.dsup = t[8].cast<torch::Tensor>();
      if (!t[9].is_none()) l.msup = t[9].cast<torch::Tensor>();
    }
    TORCH_CHECK(l.kind >= F32 && l.kind <= QN_F32, "DecodeStack: unknown weight kind ", l.kind);
    TORCH_CHECK(!(l.kind == QN || l.kind == QN_F32) || l.h.defined(), "DecodeStack: 5- / 6-bit codes need h");
    TORCH_CHECK(l.kind == F32 || l.d.defined(), "DecodeStack: a quantized weight needs its scales");
    TORCH_CHECK(!(l.kind == Q4 || l.kind == Q4_F32) || l.m.defined(), "DecodeStack: int4 needs zero shares");
    return l;
  }

  torch::Tensor operator()(const torch::Tensor& x) const {
    const c10::optional<torch::Tensor> shares = m.defined() ? c10::optional<torch::Tensor>(m) : c10::nullopt;
    switch (kind) {
      case ROWS: {
        std::vector<torch::Tensor> ys;
        for (const Lin& p : parts) ys.push_back(p(x));
        torch::Tensor y = torch::cat(ys, 1);
        return bias ? y.add_(*bias) : y;
      }
      case F32: return tk_gemm::linear(x, w, bias);
      case Q4: return tk_qgemm::linear_q4x8(x, w, d, m, bias, n, dsup, msup);
      case Q4_F32: return tk_qgemm::linear_q4x8_f32(x, w, d, m, bias, n, dsup, msup);
      case Q8: return tk_qgemm::linear_q8x8(x, w, d, shares, bias, n);
      case Q8_F32: return tk_qgemm::linear_q8x8_f32(x, w, d, shares, bias, n);
      case QN: return tk_qgemm::linear_nbit(x, w, h, d, shares, bias, n, zero, dsup, msup);
      default: return tk_qgemm::linear_nbit_f32(x, w, h, d, shares, bias, n, zero, dsup, msup);
    }
  }
};

struct Layer {
  torch::Tensor ln1, ln2;
  Lin qkv, o, gate_up, down;
};

class DecodeStack {
 public:
  // layers: per layer (ln1, ln2, qkv, o, gate_up, down), each projection a Lin tuple.
  DecodeStack(const std::vector<py::tuple>& layers, double eps, int64_t heads, int64_t kv_heads, double scale)
      : eps_(eps), heads_(heads), kv_heads_(kv_heads), scale_(scale) {
    for (const auto& t : layers) {
      TORCH_CHECK(t.size() == 6, "DecodeStack: a layer is (ln1, ln2, qkv, o, gate_up, down)");
      layers_.push_back({t[0].cast<torch::Tensor>(), t[1].cast<torch::Tensor>(), Lin::from(t[2].cast<py::tuple>()),
                         Lin::from(t[3].cast<py::tuple>()), Lin::from(t[4].cast<py::tuple>()),
                         Lin::from(t[5].cast<py::tuple>())});
    }
  }

  // h [T, hidden] (the residual stream, updated in place); every row a decode (rows = 0..T-1).
  void run(torch::Tensor h, const std::vector<torch::Tensor>& kc, const std::vector<torch::Tensor>& vc,
           const torch::Tensor& cos, const torch::Tensor& sin, const torch::Tensor& slots,
           const torch::Tensor& rows, const torch::Tensor& gather, const torch::Tensor& lo,
           const torch::Tensor& hi) const {
    TORCH_CHECK(kc.size() == layers_.size() && vc.size() == layers_.size(), "DecodeStack: one K and V cache a layer");
    const int64_t T = h.size(0);
    for (size_t li = 0; li < layers_.size(); ++li) {
      const Layer& L = layers_[li];
      torch::Tensor x = tk_elementwise::rms_norm(h, L.ln1, eps_);
      torch::Tensor qkv = L.qkv(x);
      tk_attention::rope_store(qkv, cos, sin, slots, kc[li], vc[li], heads_, kv_heads_);
      torch::Tensor attn = torch::empty({T, qkv.size(1) / (heads_ + 2 * kv_heads_) * heads_}, qkv.options());
      tk_attention::decode_attention(qkv, kc[li], vc[li], rows, gather, lo, hi, scale_, heads_, attn);
      torch::Tensor o = L.o(attn);
      x = tk_elementwise::add_rms_norm(h, o, L.ln2, eps_);
      torch::Tensor act = tk_elementwise::silu_mul(L.gate_up(x));
      h.add_(L.down(act));
    }
  }

 private:
  std::vector<Layer> layers_;
  double eps_;
  int64_t heads_, kv_heads_;
  double scale_;
};

}  // namespace tk_decode

void register_decode(pybind11::module& m) {
  pybind11::class_<tk_decode::DecodeStack>(m, "DecodeStack")
      .def(pybind11::init<const std::vector<pybind11::tuple>&, double, int64_t, int64_t, double>())
      .def("run", &tk_decode::DecodeStack::run, "every layer of a decode step (see decode_cpu.cpp)",
           pybind11::call_guard<pybind11::gil_scoped_release>());
}
