// sketchsgd._core: the C++ codecs and aggregators for Python. It never links libtorch (PyTorch
// builds differ in C++ ABI): tensors cross as (address, length) in the codec's device memory, and
// the Python layer (sketchsgd/_tensors.py) checks dtype, contiguity, device and size first.
// Messages cross as any contiguous buffer (bytes, memoryview, a NumPy array). Long calls release
// the GIL, so DDP's threads and other ranks' work go on meanwhile.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/compress/round.hpp>
#include <sketchsgd/compress/scatter.hpp>
#include <sketchsgd/config.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/core/gpu.hpp>
#include <sketchsgd/kernels/sample.hpp>
#include "errors.hpp"

namespace py = pybind11;
using namespace sketchsgd;

namespace {

/// A float vector of the codec's device, from the address and length the Python layer checked.
std::span<float> floats(uintptr_t address, uint64_t n) {
  SKETCHSGD_REQUIRE(address != 0 || n == 0, InvalidArgument, "null tensor address");
  return {reinterpret_cast<float*>(address), size_t(n)};
}

/// The bytes of a contiguous buffer; the object stays alive (and the GIL held) while they are read.
struct View {
  py::buffer_info info;
  explicit View(const py::buffer& b) : info(b.request()) {
    SKETCHSGD_REQUIRE(info.ndim <= 1 && (info.ndim == 0 || info.strides[0] == info.itemsize),
                      InvalidArgument, "message buffer must be contiguous and one-dimensional");
  }
  std::span<const uint8_t> bytes() const {
    return {static_cast<const uint8_t*>(info.ptr), size_t(info.size * info.itemsize)};
  }
};

py::bytes to_py(std::span<const uint8_t> b) {
  return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
}

/// A message's bytes kept alive by the read-only memoryview over them (finish(copy=False)):
/// handing an update of megabytes to Python without copying it into a bytes object.
struct Owned {
  Bytes bytes;
};

py::memoryview view_of(Message&& msg) {
  return py::memoryview(py::cast(Owned{std::move(msg).release()}));
}

MessageKind kind_of(const std::string& name) {
  for (auto k :
       {MessageKind::Gradient, MessageKind::Query, MessageKind::Answer, MessageKind::Update})
    if (to_string(k) == name) return k;
  throw InvalidArgument("message kind '" + name + "': expected gradient, query, answer or update");
}

Device device_of(int gpu, uintptr_t stream) {
  return gpu < 0 ? Device::cpu() : Device::cuda(gpu, reinterpret_cast<gpu::Stream>(stream));
}

const char* format_name(WireFloat f) {
  return f == WireFloat::F16    ? "fp16"
         : f == WireFloat::BF16 ? "bf16"
         : f == WireFloat::I8   ? "int8"
                                : "fp32";
}

/// A Round's requests for Python: Request objects (bound below), copies of the C++ ones; a
/// Gather's bytes stay the round's memory, valid until its next call.
py::list requests(const std::vector<Round::Request>& reqs) {
  py::list out;
  for (const auto& r : reqs) out.append(py::cast(r));
  return out;
}

/// What names a request's collective: equal requests ask for the same Sum of the same room
/// (a Gather's bytes, new each call, are not compared).
auto request_key(const Round::Request& r) {
  return std::make_tuple(r.op, r.room, r.format, r.columns, r.offset, r.count);
}

/// Runs of a buffer as Python gives them: (offset, numel) pairs.
std::vector<std::string> example_names(const CodecEntry& e) {
  std::vector<std::string> v;
  for (const CodecExample& x : e.examples) v.push_back(x.spec);
  return v;
}

using Runs = std::vector<std::pair<uint64_t, uint64_t>>;
std::vector<Layout::Run> runs(const Runs& pairs) {
  std::vector<Layout::Run> out;
  out.reserve(pairs.size());
  for (const auto& [offset, numel] : pairs) out.push_back({offset, numel});
  return out;
}

/// Every rank's gathered bytes, as buffers the caller keeps alive for the call.
struct Gathered {
  std::vector<View> views;
  std::vector<std::span<const uint8_t>> spans;
  explicit Gathered(const py::list& buffers) {
    views.reserve(buffers.size());
    for (const auto& b : buffers) views.emplace_back(b.cast<py::buffer>());
    for (const auto& v : views) spans.push_back(v.bytes());
  }
};

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "sketchsgd's C++ codecs and aggregators (tensors cross as address and length)";
  python::Exceptions& ex = python::exceptions();
  const py::object value_error = py::reinterpret_borrow<py::object>(PyExc_ValueError);
  const py::object runtime_error = py::reinterpret_borrow<py::object>(PyExc_RuntimeError);
  ex.error = python::new_exception(
      m, "Error", py::make_tuple(py::reinterpret_borrow<py::object>(PyExc_Exception)),
      "Base of every sketchsgd error.");
  ex.invalid =
      python::new_exception(m, "InvalidArgument", py::make_tuple(ex.error, value_error),
                            "A size, count, index or option value outside what is accepted.");
  ex.nonfinite = python::new_exception(m, "NonFiniteError", py::make_tuple(ex.invalid),
                                       "NaN or infinity in an input vector.");
  ex.mismatch = python::new_exception(m, "ConfigMismatch", py::make_tuple(ex.error, value_error),
                                      "Objects that must share a configuration do not.");
  ex.wire =
      python::new_exception(m, "WireError", py::make_tuple(ex.error, value_error),
                            "Bytes that are not a valid message or state: truncated, corrupt.");
  ex.protocol = python::new_exception(m, "ProtocolError", py::make_tuple(ex.error, runtime_error),
                                      "A valid message at the wrong time.");
  ex.timeout = python::new_exception(m, "TimeoutError", py::make_tuple(ex.error, runtime_error),
                                     "A peer did not answer in time.");
  ex.finished = python::new_exception(m, "JobFinished", py::make_tuple(ex.error, runtime_error),
                                      "The parameter server's job ended.");
  ex.cuda = python::new_exception(m, "CudaError", py::make_tuple(ex.error, runtime_error),
                                  "A CUDA runtime failure.");
  python::translate_errors();

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

  py::class_<Aggregator>(m, "Aggregator")
      .def("add",
           [](Aggregator& a, const py::buffer& b) {
             const View v(b);
             a.add(v.bytes());
           })
      .def(
          "add_sum",
          [](Aggregator& a, uintptr_t address, uint64_t n, uint32_t contributors, uint64_t round) {
            a.add_sum(floats(address, n), contributors, round);
          },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "finish",
          [](Aggregator& a, bool copy) -> py::object {
            Message msg;
            {
              py::gil_scoped_release release;
              msg = a.finish();
            }
            if (copy) return to_py(msg.bytes());
            return view_of(std::move(msg));
          },
          py::arg("copy") = true)
      .def(
          "finish_values",
          [](Aggregator& a, uintptr_t out, uint64_t n) { a.finish_values(floats(out, n)); },
          py::call_guard<py::gil_scoped_release>())
      .def_property_readonly(
          "replying", [](const Aggregator& a) { return std::string(to_string(a.replying())); })
      .def("abandon", &Aggregator::abandon)
      .def_property_readonly("count", &Aggregator::count)
      .def_property_readonly("world_size", &Aggregator::world_size)
      .def_property_readonly(
          "expecting", [](const Aggregator& a) { return std::string(to_string(a.expecting())); })
      .def("save_state", [](const Aggregator& a) { return to_py(a.save_state()); })
      .def("load_state", [](Aggregator& a, const py::buffer& b) {
        const View v(b);
        a.load_state(v.bytes());
      });

  py::class_<Round::Request>(m, "Request",
                             "A collective a Round asks its driver for (compress/round.hpp): op "
                             "'sum', an all-reduce in place of one of its rooms (room 0 payload, "
                             "1 answer; its values [offset, offset + count), all where count is "
                             "0; summed in format, int8 by columns), or 'gather', an all-gather of "
                             "bytes. Hashable by the collective it names.")
      .def_property_readonly(
          "op", [](const Round::Request& r) { return r.op == Round::Op::Sum ? "sum" : "gather"; })
      .def_readonly("room", &Round::Request::room)
      .def_property_readonly("format",
                             [](const Round::Request& r) { return format_name(r.format); })
      .def_readonly("columns", &Round::Request::columns)
      .def_readonly("offset", &Round::Request::offset)
      .def_readonly("count", &Round::Request::count)
      .def_property_readonly(
          "bytes",
          [](const Round::Request& r) {
            if (r.op != Round::Op::Gather)
              throw ProtocolError("round: a sum request has no bytes: it sums a room in place");
            // writable: torch.frombuffer warns on read-only memory; nothing writes to it
            return py::memoryview::from_memory(const_cast<uint8_t*>(r.bytes.data()),
                                               py::ssize_t(r.bytes.size()), false);
          },
          "A gather's bytes: a memoryview of the round's memory, valid until its next call.")
      .def("__eq__", [](const Round::Request& a,
                        const Round::Request& b) { return request_key(a) == request_key(b); })
      .def("__hash__",
           [](const Round::Request& r) {
             return py::hash(
                 py::make_tuple(int(r.op), r.room, int(r.format), r.columns, r.offset, r.count));
           })
      .def("__repr__", [](const Round::Request& r) {
        if (r.op == Round::Op::Gather)
          return "Request(gather, " + std::to_string(r.bytes.size()) + " bytes)";
        return "Request(sum, room " + std::to_string(r.room) + ", " + format_name(r.format) +
               ", columns " + std::to_string(r.columns) + ", [" + std::to_string(r.offset) + ", +" +
               std::to_string(r.count) + "))";
      });

  py::class_<Round>(m, "Round")
      .def(py::init([](Compressor& codec, Aggregator& aggregator, uint32_t rank, uint64_t whole,
                       uintptr_t payload, uint64_t payload_n, uintptr_t answer, uint64_t answer_n) {
             return std::make_unique<Round>(
                 codec, aggregator, rank, whole,
                 Round::Rooms{floats(payload, payload_n), floats(answer, answer_n)});
           }),
           py::keep_alive<1, 2>(), py::keep_alive<1, 3>())
      .def_static(
          "whole_only",
          [](uint32_t world, uint64_t whole, uintptr_t payload, uint64_t n, int gpu,
             uintptr_t stream) {
            return std::make_unique<Round>(world, whole, device_of(gpu, stream),
                                           floats(payload, n));
          },
          "A round of a unit with nothing compressed.")
      .def_static("payload_size", &Round::payload_size)
      .def_static("answer_size", &Round::answer_size)
      .def_property_readonly("phases", &Round::phases)
      .def("start",
           [](Round& r, uintptr_t buffer, uint64_t n, const Runs& kept, const Runs& whole,
              uint64_t round) {
             std::vector<Round::Request> out;
             {
               py::gil_scoped_release release;
               out = r.start(floats(buffer, n), {runs(kept), runs(whole)}, round);
             }
             return requests(out);
           })
      .def("next",
           [](Round& r, const py::list& gathered) {
             const Gathered g(gathered);
             std::vector<Round::Request> out;
             {
               py::gil_scoped_release release;
               out = r.next(g.spans);
             }
             return requests(out);
           })
      .def("finish",
           [](Round& r, const py::list& gathered, uintptr_t buffer, uint64_t n, const Runs& kept,
              const Runs& whole) {
             const Gathered g(gathered);
             py::gil_scoped_release release;
             r.finish(g.spans, floats(buffer, n), {runs(kept), runs(whole)});
           })
      .def_property_readonly("gathered", &Round::gathered)
      .def(
          "reduce",
          [](Round& r, const py::list& gathered) {
            const Gathered g(gathered);
            Message msg;
            {
              py::gil_scoped_release release;
              msg = r.reduce(g.spans);
            }
            return view_of(std::move(msg));
          },
          "A gathered round's update from every rank's message, for finish_update() of each "
          "rank of a group in one process (a read-only memoryview).")
      .def("finish_update",
           [](Round& r, const py::buffer& update, uintptr_t buffer, uint64_t n, const Runs& kept,
              const Runs& whole) {
             const View u(update);
             py::gil_scoped_release release;
             r.finish_update(u.bytes(), floats(buffer, n), {runs(kept), runs(whole)});
           })
      .def(
          "finish_window",
          [](Round& r, const py::list& gathered, uintptr_t out, uint64_t lo, uint64_t count,
             uint64_t n, const Runs& kept, const Runs& whole) {
            const Gathered g(gathered);
            py::gil_scoped_release release;
            r.finish(g.spans, floats(out, count), lo, n, {runs(kept), runs(whole)});
          },
          "finish() writing only the buffer's values [lo, lo + count) of n, at out");

  py::class_<Scatter>(m, "Scatter",
                      "A gathered codec's reduce-scatter per destination (compress/scatter.hpp): "
                      "Scatter(rounds, rank), rounds[r] the started round of chunk r; lengths() "
                      "for the all-gather, next(table) -> (send, receive) for the all-to-all")
      .def(py::init([](const std::vector<Round*>& rounds, uint32_t rank) {
             return std::make_unique<Scatter>(rounds, rank);
           }),
           py::keep_alive<1, 2>())
      .def_property_readonly("world", &Scatter::world)
      .def("lengths", &Scatter::lengths)
      .def(
          "next",
          [](Scatter& s, const std::vector<std::vector<uint64_t>>& table) {
            std::vector<uint64_t> flat;
            for (const auto& row : table) {
              SKETCHSGD_REQUIRE(row.size() == s.world(), InvalidArgument, "scatter: a row of ",
                                row.size(), " lengths for ", s.world(), " ranks");
              flat.insert(flat.end(), row.begin(), row.end());
            }
            Scatter::Exchange ex;
            {
              py::gil_scoped_release release;
              ex = s.next(flat);
            }
            py::list send;
            for (const auto& part : ex.send)  // writable for torch.frombuffer; nothing writes
              send.append(py::memoryview::from_memory(const_cast<uint8_t*>(part.data()),
                                                      py::ssize_t(part.size()), false));
            return py::make_tuple(send, ex.receive);
          },
          "table[i]: rank i's lengths(). Raises on every rank alike (NonFiniteError, WireError); "
          "else (send, receive): send[r] this rank's bytes for rank r (memoryviews of the rounds' "
          "memory, valid until their next start), receive[i] the bytes rank i sends here.");

  py::class_<Compressor>(m, "Compressor")
      .def(py::init([](const std::string& spec, uint64_t dim, int gpu, uintptr_t stream) {
             return make_compressor(spec, dim, device_of(gpu, stream));
           }),
           py::arg("spec"), py::arg("dim"), py::arg("gpu") = -1, py::arg("stream") = 0)
      .def_static(
          "with_layout",
          [](const std::string& spec, const std::string& layout, int gpu, uintptr_t stream) {
            return make_compressor(spec, Layout::parse(layout), device_of(gpu, stream));
          },
          py::arg("spec"), py::arg("layout"), py::arg("gpu") = -1, py::arg("stream") = 0,
          "A codec for the vector made of the layout's tensors (text form: 1024x784+1024).")
      .def_property_readonly("spec", &Compressor::spec)
      .def_property_readonly("dim", &Compressor::dim)
      .def_property_readonly("device", [](const Compressor& c) { return c.device().name(); })
      .def_property_readonly("two_rounds", &Compressor::two_rounds)
      .def("sum_format", [](const Compressor& c,
                            const std::string& k) { return format_name(c.sum_format(kind_of(k))); })
      .def("sum_columns",
           [](const Compressor& c, const std::string& k) { return c.sum_columns(kind_of(k)); })
      .def_property_readonly("last_message_bytes", &Compressor::last_message_bytes)
      .def_property_readonly("compression_ratio", &Compressor::compression_ratio)
      .def("sum_size",
           [](const Compressor& c, const std::string& k) { return c.sum_size(kind_of(k)); })
      .def("reply_size",
           [](const Compressor& c, const std::string& k) { return c.reply_size(kind_of(k)); })
      .def("max_message_bytes",
           [](const Compressor& c, const std::string& k) {
             return kHeaderBytes + c.max_payload(kind_of(k));
           })
      .def("encode",
           [](Compressor& c, uintptr_t address, uint64_t n, uint64_t round, uint32_t sender) {
             Message msg;
             {
               py::gil_scoped_release release;
               msg = c.encode(floats(address, n), round, sender);
             }
             return to_py(msg.bytes());
           })
      .def(
          "encode_sum",
          [](Compressor& c, uintptr_t grad, uint64_t n, uint64_t round, uintptr_t out, uint64_t m) {
            c.encode_sum(floats(grad, n), round, floats(out, m));
          },
          py::call_guard<py::gil_scoped_release>())
      .def("answer",
           [](Compressor& c, const py::buffer& query, uint32_t sender) {
             const View v(query);
             Message msg;
             {
               py::gil_scoped_release release;
               msg = c.answer(v.bytes(), sender);
             }
             return to_py(msg.bytes());
           })
      .def("answer_sum",
           [](Compressor& c, const py::buffer& query, uintptr_t out, uint64_t m) {
             const View v(query);
             py::gil_scoped_release release;
             c.answer_sum(v.bytes(), floats(out, m));
           })
      .def(
          "answer_values",
          [](Compressor& c, uintptr_t query, uint64_t n, uintptr_t out, uint64_t m) {
            c.answer_values(floats(query, n), floats(out, m));
          },
          py::call_guard<py::gil_scoped_release>())
      .def(
          "apply_values",
          [](Compressor& c, uintptr_t update, uint64_t n, uintptr_t step, uint64_t m) {
            c.apply_values(floats(update, n), floats(step, m));
          },
          py::call_guard<py::gil_scoped_release>())
      .def("apply",
           [](Compressor& c, const py::buffer& update, uintptr_t step, uint64_t n) {
             const View v(update);
             py::gil_scoped_release release;
             c.apply(v.bytes(), floats(step, n));
           })
      .def("apply_step",
           [](Compressor& c, const py::buffer& update, uintptr_t params, uint64_t n, float lr) {
             const View v(update);
             py::gil_scoped_release release;
             c.apply_step(v.bytes(), floats(params, n), lr);
           })
      .def("make_aggregator", &Compressor::make_aggregator, py::arg("world_size"))
      .def("save_state", [](const Compressor& c) { return to_py(c.save_state()); })
      .def("load_state", [](Compressor& c, const py::buffer& b) {
        const View v(b);
        c.load_state(v.bytes());
      });
}
