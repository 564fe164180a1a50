// The Python module: every kernel entry point (kernels.h) bound in one table. The only file besides decode_cpu.cpp
// that includes <torch/extension.h> (kernels.h says why).
//
// Every function is bound with the GIL released (call_guard), as torch's own operators are: a step's kernels hold no
// Python lock, so the serving process's other Python threads (Triton's request thread, the responder sending streamed
// tokens) run during them instead of waiting up to a switch interval (5 ms). Arguments that may be None are bound as
// such (quant.py passes every argument positionally).
#include <torch/extension.h>
#include "kernels.h"

void register_decode(pybind11::module& m);  // decode_cpu.cpp

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  using tk_qgemm::cpu_isa;
  using Release = py::call_guard<py::gil_scoped_release>;
  const auto none = py::none();

  m.def("linear", &tk_gemm::linear, "y = x W^T (+ b), fp32, AVX2 + FMA", py::arg("x"), py::arg("w"),
        py::arg("b") = none, Release());
  m.def("rope_store", &tk_attention::rope_store, "in-place RoPE of q, k heads in qkv; k, v into the paged cache",
        Release());
  m.def("decode_attention", &tk_attention::decode_attention, "one-token attention per sequence over its cache slots",
        Release());
  m.def("rms_norm", &tk_elementwise::rms_norm, "w * x / sqrt(mean(x^2) + eps) per row", Release());
  m.def("add_rms_norm", &tk_elementwise::add_rms_norm, "h += d in place, then rms_norm(h)", Release());
  m.def("silu_mul", &tk_elementwise::silu_mul, "silu(gate) * up of [gate | up]", Release());
  m.def("linear_f8", &tk_fp8::linear_f8, "y = x W^T (+ b), W float8_e4m3fn per channel, converted in registers",
        py::arg("x"), py::arg("q"), py::arg("d"), py::arg("lut"), py::arg("b") = none, Release());

  m.def("linear_q8x8", &tk_qgemm::linear_q8x8,
        "y = x W^T (+ b), W int8 8 rows interleaved, per row (d [G, 8]), per 32-block (d, m [G, K/32, 8]) or per "
        "16-block (d [G, K/16, 8])",
        py::arg("x"), py::arg("q"), py::arg("d"), py::arg("m").none(true), py::arg("b").none(true), py::arg("N"),
        Release());
  m.def("linear_q4x8", &tk_qgemm::linear_q4x8,
        "y = x W^T (+ b), W int4 8 rows interleaved per 32-block (d, m [G, K/32, 8])", py::arg("x"), py::arg("q"),
        py::arg("d"), py::arg("m"), py::arg("b").none(true), py::arg("N"), py::arg("dsup") = none,
        py::arg("msup") = none, Release());
  m.def("linear_q8x8_f32", &tk_qgemm::linear_q8x8_f32, "linear_q8x8 with fp32 activations (no activation rounding)",
        py::arg("x"), py::arg("q"), py::arg("d"), py::arg("m").none(true), py::arg("b").none(true), py::arg("N"),
        Release());
  m.def("linear_q4x8_f32", &tk_qgemm::linear_q4x8_f32, "linear_q4x8 with fp32 activations (no activation rounding)",
        py::arg("x"), py::arg("q"), py::arg("d"), py::arg("m"), py::arg("b").none(true), py::arg("N"),
        py::arg("dsup") = none, py::arg("msup") = none, Release());
  m.def("dequant_x8", &tk_qgemm::dequant_x8, "the float weight [N, K] of an interleaved int8 / int4 layout",
        py::arg("q"), py::arg("d"), py::arg("m").none(true), py::arg("N"), py::arg("dsup") = none,
        py::arg("msup") = none, Release());
  m.def("linear_nbit", &tk_qgemm::linear_nbit,
        "y = x W^T (+ b), W 5- / 6-bit codes packed (qgemm_nbit_cpu.cpp), int8 activations", py::arg("x"),
        py::arg("q"), py::arg("h"), py::arg("d"), py::arg("m").none(true), py::arg("b").none(true), py::arg("N"),
        py::arg("zero"), py::arg("dsup") = none, py::arg("msup") = none, Release());
  m.def("linear_nbit_f32", &tk_qgemm::linear_nbit_f32, "linear_nbit with fp32 activations (no activation rounding)",
        py::arg("x"), py::arg("q"), py::arg("h"), py::arg("d"), py::arg("m").none(true), py::arg("b").none(true),
        py::arg("N"), py::arg("zero"), py::arg("dsup") = none, py::arg("msup") = none, Release());
  m.def("dequant_nbit", &tk_qgemm::dequant_nbit, "the float weight [N, K] of a packed 5- / 6-bit layout",
        py::arg("q"), py::arg("h"), py::arg("d"), py::arg("m").none(true), py::arg("N"), py::arg("zero"),
        py::arg("dsup") = none, py::arg("msup") = none, Release());
  m.def("cpu_isa", &cpu_isa,
        "the int8 dot products' instruction set: sets it (auto, avx2, avx512_vnni) and returns it; '' only reads it",
        py::arg("set") = "");
  register_decode(m);
}
