// The library's typed errors as Python exceptions, for the compiled modules: _core makes the
// classes (sketchsgd.Error and its subclasses), _ps raises the same ones.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include <sketchsgd/core/error.hpp>

namespace sketchsgd::python {

namespace py = pybind11;

/// Python exception classes that are also ValueError or RuntimeError, so plain except clauses
/// catch them: sketchsgd.Error is the common base.
struct Exceptions {
  py::object error, invalid, nonfinite, mismatch, wire, protocol, timeout, finished, cuda;
};

inline py::object new_exception(py::module_& m, const char* name, py::tuple bases,
                                const char* doc) {
  const std::string qualified = std::string("sketchsgd._core.") + name;
  py::object type = py::reinterpret_steal<py::object>(
      PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases.ptr(), nullptr));
  if (!type) throw py::error_already_set();
  m.attr(name) = type;
  return type;
}

/// This module's classes (each compiled module holds its own copy, filled when it loads).
inline Exceptions& exceptions() {
  static Exceptions ex;
  return ex;
}

/// Every C++ Error raised through a binding becomes its Python class (the most specific first).
inline void translate_errors() {
  py::register_exception_translator([](std::exception_ptr p) {
    const Exceptions& ex = exceptions();
    try {
      if (p) std::rethrow_exception(p);
    } catch (const NonFiniteError& e) {
      PyErr_SetString(ex.nonfinite.ptr(), e.what());
    } catch (const InvalidArgument& e) {
      PyErr_SetString(ex.invalid.ptr(), e.what());
    } catch (const ConfigMismatch& e) {
      PyErr_SetString(ex.mismatch.ptr(), e.what());
    } catch (const WireError& e) {
      PyErr_SetString(ex.wire.ptr(), e.what());
    } catch (const ProtocolError& e) {
      PyErr_SetString(ex.protocol.ptr(), e.what());
    } catch (const TimeoutError& e) {
      PyErr_SetString(ex.timeout.ptr(), e.what());
    } catch (const JobFinished& e) {
      PyErr_SetString(ex.finished.ptr(), e.what());
    } catch (const CudaError& e) {
      PyErr_SetString(ex.cuda.ptr(), e.what());
    } catch (const Error& e) {
      PyErr_SetString(ex.error.ptr(), e.what());
    }
  });
}

}  // namespace sketchsgd::python
