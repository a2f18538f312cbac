// sketchsgd._core's Compressor and Aggregator: a codec's encode, answer and apply, and the
// aggregator that sums or gathers its messages.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>

#include <sketchsgd/compress/registry.hpp>
#include "binding.hpp"

namespace sketchsgd::python {
namespace {

MessageKind kind_of(const std::string& name) {
  for (auto k :
       {MessageKind::Gradient, MessageKind::Query, MessageKind::Answer, MessageKind::Update})
    if (to_string(k) == name) return k;
  throw InvalidArgument("message kind '" + name + "': expected gradient, query, answer or update");
}

}  // namespace

void bind_codec(py::module_& m) {
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

}  // namespace sketchsgd::python
