// sketchsgd._ps: the parameter server's worker client (worker/client.hpp) for Python, built where
// the server is (it links ZeroMQ; pip's build leaves it out). Vectors cross as (address, length)
// of float32 host memory, checked first by the Python layer (sketchsgd/ps.py); a step releases
// the GIL while it waits for the round, so several clients of one process can push at once.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/worker/client.hpp>
#include "errors.hpp"

namespace py = pybind11;
using namespace sketchsgd;
using ps::Client;
using ps::ClientOptions;
using ps::StepResult;

namespace {

std::span<const float> floats(uintptr_t address, uint64_t n) {
  SKETCHSGD_REQUIRE(address != 0 || n == 0, InvalidArgument, "null tensor address");
  return {reinterpret_cast<const float*>(address), size_t(n)};
}

std::unique_ptr<Client> connect(const std::string& server, uint64_t job, uint32_t rank,
                                uint32_t world, uint32_t population, uint64_t join_round,
                                const std::string& spec, const std::string& layout, uint64_t dim,
                                uintptr_t init, uint64_t init_len, double timeout_s, bool quiet,
                                bool shared_io, uint32_t fetch_every, float weight) {
  SKETCHSGD_REQUIRE(timeout_s > 0 && timeout_s < 1e6, InvalidArgument,
                    "timeout must be in (0, 10^6) seconds, got ", timeout_s);
  ClientOptions o;
  o.server = server;
  o.job = job;
  o.rank = rank;
  o.world = world;
  o.population = population;
  o.join_round = join_round;
  o.timeout = std::chrono::milliseconds(int64_t(timeout_s * 1000));
  o.shared_io = shared_io;
  o.fetch_every = fetch_every;
  o.weight = weight;
  if (quiet) o.log = [](const std::string&) {};
  auto codec =
      layout.empty() ? make_compressor(spec, dim) : make_compressor(spec, Layout::parse(layout));
  return std::make_unique<Client>(std::move(o), std::move(codec), floats(init, init_len));
}

py::dict result(const StepResult& r) {
  const char* outcome = r.outcome == StepResult::Outcome::Updated    ? "updated"
                        : r.outcome == StepResult::Outcome::Aborted  ? "aborted"
                        : r.outcome == StepResult::Outcome::Resynced ? "resynced"
                                                                     : "pending";
  return py::dict(py::arg("outcome") = outcome, py::arg("round") = r.round, py::arg("lr") = r.lr,
                  py::arg("contributors") = r.contributors, py::arg("bytes_up") = r.bytes_up,
                  py::arg("bytes_down") = r.bytes_down, py::arg("age") = r.age,
                  py::arg("version") = r.version);
}

}  // namespace

PYBIND11_MODULE(_ps, m) {
  m.doc() = "sketchsgd's parameter-server client (vectors cross as address and length)";
  // The same exception classes as sketchsgd._core.
  const py::module_ core = py::module_::import("sketchsgd._core");
  python::Exceptions& ex = python::exceptions();
  ex.error = core.attr("Error");
  ex.invalid = core.attr("InvalidArgument");
  ex.nonfinite = core.attr("NonFiniteError");
  ex.mismatch = core.attr("ConfigMismatch");
  ex.wire = core.attr("WireError");
  ex.protocol = core.attr("ProtocolError");
  ex.timeout = core.attr("TimeoutError");
  ex.finished = core.attr("JobFinished");
  ex.cuda = core.attr("CudaError");
  python::translate_errors();

  py::class_<Client>(m, "Client")
      .def(py::init(&connect), py::arg("server"), py::arg("job"), py::arg("rank"), py::arg("world"),
           py::arg("population"), py::arg("join_round"), py::arg("spec"), py::arg("layout"),
           py::arg("dim"), py::arg("init"), py::arg("init_len"), py::arg("timeout"),
           py::arg("quiet"), py::arg("shared_io"), py::arg("fetch_every"), py::arg("weight"),
           py::call_guard<py::gil_scoped_release>(),
           "Connects, registers and pulls the model (blocking).")
      .def_property_readonly("dim", [](Client& c) { return c.codec().dim(); })
      .def_property_readonly("spec", [](Client& c) { return c.codec().spec(); })
      .def_property_readonly("rank", &Client::rank)
      .def_property_readonly("round", &Client::round)
      .def_property_readonly("shards", &Client::shards)
      .def_property_readonly("asynchronous", &Client::async)
      .def(
          "fetch",
          [](Client& c) {
            StepResult r;
            {
              py::gil_scoped_release unlocked;
              r = c.fetch();
            }
            return result(r);
          },
          "An asynchronous job's fetch of the server's model.")
      .def(
          "params",
          [](const Client& c, uintptr_t out, uint64_t n) {
            const auto p = c.params();
            SKETCHSGD_REQUIRE(n == p.size() && out != 0, InvalidArgument, "params: ", n,
                              " values for a model of ", p.size());
            std::copy(p.begin(), p.end(), reinterpret_cast<float*>(out));
          },
          py::arg("out"), py::arg("n"), "Copies the model into n floats at out.")
      .def(
          "step",
          [](Client& c, uintptr_t grad, uint64_t n) {
            StepResult r;
            {
              py::gil_scoped_release unlocked;
              r = c.step(floats(grad, n));
            }
            return result(r);
          },
          py::arg("grad"), py::arg("n"), "Pushes the gradient and waits for the round's outcome.");
}
