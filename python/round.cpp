// sketchsgd._core's Round, its Requests and the Scatter: the collective round a driver runs
// (compress/round.hpp), its collectives handed to Python as Request objects to perform.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <sketchsgd/compress/round.hpp>
#include <sketchsgd/compress/scatter.hpp>
#include "binding.hpp"

namespace sketchsgd::python {
namespace {

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

void bind_round(py::module_& m) {
  py::class_<Round::Request>(m, "Request",
                             "A collective a Round asks its driver for (compress/round.hpp): op "
                             "'sum', an all-reduce in place of one of its rooms (room 0 payload, "
                             "1 answer; its values [offset, offset + count), all where count is "
                             "0; summed in format, int8 by columns), 'gather', an all-gather of "
                             "bytes, or 'exchange', an all-to-all of equal parts. Hashable by the "
                             "collective it names.")
      .def_property_readonly("op",
                             [](const Round::Request& r) {
                               return r.op == Round::Op::Sum      ? "sum"
                                      : r.op == Round::Op::Gather ? "gather"
                                                                  : "exchange";
                             })
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
      .def_property_readonly(
          "parts",
          [](const Round::Request& r) {
            if (r.op != Round::Op::Exchange)
              throw ProtocolError("round: only an exchange request has parts");
            py::list out;
            for (const auto& part : r.parts)  // writable for torch.frombuffer; nothing writes
              out.append(py::memoryview::from_memory(const_cast<uint8_t*>(part.data()),
                                                     py::ssize_t(part.size()), false));
            return out;
          },
          "An exchange's parts, one per rank and all of one length: memoryviews of the round's "
          "memory, valid until its next call.")
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
        if (r.op == Round::Op::Exchange)
          return "Request(exchange, " + std::to_string(r.parts.size()) + " parts of " +
                 std::to_string(r.parts.empty() ? 0 : r.parts[0].size()) + " bytes)";
        return "Request(sum, room " + std::to_string(r.room) + ", " + format_name(r.format) +
               ", columns " + std::to_string(r.columns) + ", [" + std::to_string(r.offset) + ", +" +
               std::to_string(r.count) + "))";
      });

  py::class_<Round>(m, "Round")
      .def(py::init([](Compressor& codec, Aggregator& aggregator, uint32_t rank, uint64_t whole,
                       uintptr_t payload, uint64_t payload_n, uintptr_t answer, uint64_t answer_n,
                       bool per_destination) {
             return std::make_unique<Round>(
                 codec, aggregator, rank, whole,
                 Round::Rooms{floats(payload, payload_n), floats(answer, answer_n)},
                 per_destination);
           }),
           py::arg("codec"), py::arg("aggregator"), py::arg("rank"), py::arg("whole"),
           py::arg("payload"), py::arg("payload_n"), py::arg("answer"), py::arg("answer_n"),
           py::arg("per_destination") = false, py::keep_alive<1, 2>(), py::keep_alive<1, 3>())
      .def_static(
          "whole_only",
          [](uint32_t world, uint64_t whole, uintptr_t payload, uint64_t n, int gpu,
             uintptr_t stream) {
            return std::make_unique<Round>(world, whole, device_of(gpu, stream),
                                           floats(payload, n));
          },
          "A round of a unit with nothing compressed.")
      .def_static("payload_size", &Round::payload_size, py::arg("codec"), py::arg("whole"),
                  py::arg("per_destination") = false)
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
      .def_property_readonly("sparse", &Round::sparse)
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
}

}  // namespace sketchsgd::python
