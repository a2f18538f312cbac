// sketchsgd._core: the C++ codecs and aggregators for Python. It never links libtorch (PyTorch
// builds differ in C++ ABI): tensors cross as (address, length) in the codec's device memory, and
// the Python layer (sketchsgd/_tensors.py) checks dtype, contiguity, device and size first.
// Messages cross as any contiguous buffer (bytes, memoryview, a NumPy array). Long calls release
// the GIL, so DDP's threads and other ranks' work go on meanwhile.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/config.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/core/gpu.hpp>
#include <sketchsgd/kernels/sample.hpp>
#include "binding.hpp"
#include "errors.hpp"

namespace py = pybind11;
using namespace sketchsgd;
using namespace sketchsgd::python;

namespace {

/// The spec of each of a codec's examples.
std::vector<std::string> example_names(const CodecEntry& e) {
  std::vector<std::string> v;
  for (const CodecExample& x : e.examples) v.push_back(x.spec);
  return v;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "sketchsgd's C++ codecs and aggregators (tensors cross as address and length)";
  Exceptions& ex = exceptions();
  const py::object value_error = py::reinterpret_borrow<py::object>(PyExc_ValueError);
  const py::object runtime_error = py::reinterpret_borrow<py::object>(PyExc_RuntimeError);
  ex.error =
      new_exception(m, "Error", py::make_tuple(py::reinterpret_borrow<py::object>(PyExc_Exception)),
                    "Base of every sketchsgd error.");
  ex.invalid = new_exception(m, "InvalidArgument", py::make_tuple(ex.error, value_error),
                             "A size, count, index or option value outside what is accepted.");
  ex.nonfinite = new_exception(m, "NonFiniteError", py::make_tuple(ex.invalid),
                               "NaN or infinity in an input vector.");
  ex.mismatch = new_exception(m, "ConfigMismatch", py::make_tuple(ex.error, value_error),
                              "Objects that must share a configuration do not.");
  ex.wire = new_exception(m, "WireError", py::make_tuple(ex.error, value_error),
                          "Bytes that are not a valid message or state: truncated, corrupt.");
  ex.protocol = new_exception(m, "ProtocolError", py::make_tuple(ex.error, runtime_error),
                              "A valid message at the wrong time.");
  ex.timeout = new_exception(m, "TimeoutError", py::make_tuple(ex.error, runtime_error),
                             "A peer did not answer in time.");
  ex.finished = new_exception(m, "JobFinished", py::make_tuple(ex.error, runtime_error),
                              "The parameter server's job ended.");
  ex.cuda = new_exception(m, "CudaError", py::make_tuple(ex.error, runtime_error),
                          "A CUDA runtime failure.");
  translate_errors();

  m.attr("cuda_build") = bool(SKETCHSGD_HAS_CUDA);
  m.def("gpu_count", &gpu::device_count, "Usable CUDA devices (0 without a CUDA build).");
  m.def(
      "describe", [] { return Registry::instance().describe(); },
      "Every codec and its options, as text.");
  m.def(
      "codecs",
      [] {
        py::list out;
        for (const CodecEntry* e : Registry::instance().entries()) {
          py::list options;
          for (const auto& o : e->options)
            options.append(py::dict(py::arg("key") = o.key, py::arg("help") = o.help,
                                    py::arg("default") = o.fallback, py::arg("min") = o.min,
                                    py::arg("max") = o.max, py::arg("integer") = o.integer,
                                    py::arg("names") = o.names, py::arg("budget") = o.budget));
          out.append(py::dict(py::arg("name") = e->name, py::arg("summary") = e->summary,
                              py::arg("options") = options,
                              py::arg("layout") = e->layout == LayoutUse::Required   ? "required"
                                                  : e->layout == LayoutUse::Optional ? "optional"
                                                                                     : "none",
                              py::arg("examples") = example_names(*e)));
        }
        return out;
      },
      "The registry: a dict per codec with its name, summary, options, layout use and example "
      "specs.");
  m.def(
      "example_specs",
      [](const std::string& layout) {
        return example_specs(layout.empty() ? Layout() : Layout::parse(layout));
      },
      py::arg("layout") = "",
      "Every codec's example specs; with a layout (\"40x45+200\"), codecs that require one get "
      "it and those that take one are listed without and with it.");
  m.def("sample_clients", &sample_clients, py::arg("population"), py::arg("per_round"),
        py::arg("seed"), py::arg("round"),
        "A federated round's participants: per_round distinct clients of [0, population) in "
        "increasing order, drawn from (seed, round) as the parameter server draws them.");
  m.def("share_spec", &share_spec, py::arg("spec"), py::arg("share") = 1.0,
        "The canonical spec for a share of the model: its budgets (k, cols) scaled by share, at "
        "least 1 each; share 1 validates a spec.");
  m.def(
      "compresses_any",
      [](const std::string& spec, const std::string& layout) {
        return compresses_any(spec, Layout::parse(layout));
      },
      py::arg("spec"), py::arg("layout"),
      "Whether spec's codec would compress any of the vector made of layout's tensors "
      "(\"40x45+200\"): false where a codec that reads the layout finds none worth its work "
      "(PowerSGD: no matrix worth factoring at its rank), a vector better sent whole.");
  m.def(
      "sent_whole",
      [](uint64_t dims, uint64_t numel, uint64_t dense_below) {
        return Layout::sent_whole(Layout::Tensor{0, numel, 0, 0, size_t(dims)}, dense_below);
      },
      py::arg("dims"), py::arg("numel"), py::arg("dense_below"),
      "The library's small-tensor rule: such a tensor travels uncompressed.");
  m.def(
      "merge_runs",
      [](const std::vector<std::pair<uint64_t, uint64_t>>& runs) {
        std::vector<Layout::Run> in;
        for (const auto& [offset, numel] : runs) in.push_back({offset, numel});
        std::vector<std::pair<uint64_t, uint64_t>> out;
        for (const auto& r : Layout::merge(in)) out.emplace_back(r.offset, r.numel);
        return out;
      },
      py::arg("runs"),
      "(offset, numel) runs in order, each merged into the one before it where it starts where "
      "that one ends (the library's Layout::merge).");
  m.def(
      "message_info",
      [](const py::buffer& b) {
        const View v(b);
        const Header h = decode_header(v.bytes(), ~uint64_t(0));
        return py::dict(py::arg("codec") = std::string(to_string(h.codec)),
                        py::arg("kind") = std::string(to_string(h.kind)), py::arg("dim") = h.dim,
                        py::arg("round") = h.round, py::arg("sender") = h.sender,
                        py::arg("payload_bytes") = h.payload_bytes);
      },
      "The header of a message (WireError when it is not one).");
  m.attr("header_bytes") = kHeaderBytes;

  py::class_<Owned>(m, "_OwnedBytes", py::buffer_protocol()).def_buffer([](Owned& o) {
    return py::buffer_info(o.bytes.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                           {py::ssize_t(o.bytes.size())}, {py::ssize_t(1)}, /*readonly=*/true);
  });

  bind_codec(m);
  bind_round(m);
}
