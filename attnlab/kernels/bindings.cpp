// The Python module of attnlab's compiled kernels: the one translation unit that is built. The kernels' sources
// are included rather than compiled apart because each compile spends most of its time parsing torch's headers
// (three units took 2.5 minutes on 2 busy cores; one takes a third of that).
#include "few_rows.cpp"
#include "decode_attention.cpp"
#include "prefill_attention.cpp"
#include "block_step.cpp"
#include "evict.cpp"
#include "ssm_scan.cpp"
#include "rope.cpp"
#include "int8_rows.cpp"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("linear", &few_rows_linear,
        "x @ w^T * scale + bias for a few rows, with an fp32, bf16 or int8 weight (int8: see int8_rows_as_int16)");
  m.def("block_pre", &block_pre, "a decode step's norm and q/k/v projection of one pre-norm block");
  m.def("block_post", &block_post, "a decode step's output projection, residual, norm, MLP and residual of one block");
  m.def("block_decode", &block_decode, "a block's whole decode step: pre, rotary, cache write, attention, post");
  m.def("gelu_tanh_", &gelu_tanh_, "GELU (tanh approximation) in place, fp32 or bf16");
  m.def("gelu_tanh_forward", &gelu_tanh_forward, "GELU (tanh approximation) into a new tensor, fp32");
  m.def("gelu_tanh_backward", &gelu_tanh_backward, "the gradient of gelu_tanh_forward at x, times g, fp32");
  m.def("rope_apply", &rope_apply, "rotate-half rotary over (B, H, T, D), or its inverse, fp32");
  m.def("evict", &evict, "flush a tensor's bytes from every cache level");
  m.def("lanes", []() { return int64_t(attnlab::VW); }, "fp32 lanes of one vector in this build");
#if defined(__AVX512BW__) && defined(__AVX512VNNI__)
  m.def("int8_rows_as_int16", []() { return true; }, "linear's int8 weights meet int16-quantized rows (VNNI)");
#else
  m.def("int8_rows_as_int16", []() { return false; }, "linear's int8 weights meet fp32 rows (no VNNI here)");
#endif
  m.def("prefill_attention", &prefill_attention, "causal attention of T new queries per row over S >= T keys, fp32",
        py::call_guard<py::gil_scoped_release>());  // milliseconds a layer: a server's event loop runs meanwhile
  m.def("ssm_scan_forward", &ssm_scan_forward, "the selective SSM's sequential scan, states in registers, fp32",
        py::call_guard<py::gil_scoped_release>());
  m.def("ssm_scan_backward", &ssm_scan_backward, "its gradients, the forward rerun per channel, fp32",
        py::call_guard<py::gil_scoped_release>());
  m.def("quantize_rows_int8", &quantize_rows_int8, "each row to int8 with its own step max|x| / 127 (w8a8's input)");
  m.def("scale_rows_int32", &scale_rows_int32, "int32 sums times each row's step and each column's scale, plus bias");
  m.def("decode_attention", &decode_attention, "one query per row over each row's own keys (paged or contiguous)");
}
