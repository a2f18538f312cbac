// Typed errors thrown by every public entry point of sketchsgd.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>

namespace sketchsgd {

/// Base of every error the library throws on bad input or failed operations.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A size, count, index or option value outside what is accepted.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

/// NaN or ±Inf in an input vector.
class NonFiniteError : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

/// Two objects that must share a configuration (sketches, codecs, messages) do not.
class ConfigMismatch : public Error {
 public:
  using Error::Error;
};

/// Bytes that are not a valid encoded message or sketch: truncated, corrupt, oversized,
/// inconsistent.
class WireError : public Error {
 public:
  using Error::Error;
};

/// A valid message at the wrong time: wrong kind, round, duplicate sender, missing second round.
class ProtocolError : public Error {
 public:
  using Error::Error;
};

/// A peer (server or worker) did not answer in time.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

/// The parameter server's job ended (its last round ran) before this request could be served.
class JobFinished : public Error {
 public:
  JobFinished(const std::string& what, uint64_t round) : Error(what), round_(round) {}
  /// The round the job finished at: the model holds every update before it.
  uint64_t round() const { return round_; }

 private:
  uint64_t round_;
};

/// A CUDA runtime failure; the message carries the CUDA error text.
class CudaError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <class E, class... Args>
[[noreturn]] void raise(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  throw E(os.str());
}

/// A broken invariant: a bug, not bad input. Says where on stderr and aborts (no exception a
/// caller could take for a refusal and carry on with corrupt state).
template <class... Args>
[[noreturn]] void broken(const char* file, int line, const char* cond, const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  std::fprintf(stderr, "sketchsgd: internal invariant broken at %s:%d: %s %s\n", file, line, cond,
               os.str().c_str());
  std::fflush(stderr);
  std::abort();
}
}  // namespace detail

}  // namespace sketchsgd

/// For what cannot happen unless sketchsgd has a bug (faiss's FAISS_ASSERT): aborts with file:line
/// and the condition when `cond` is false. User errors use SKETCHSGD_REQUIRE instead.
#define SKETCHSGD_ASSERT(cond, ...)                                                      \
  do {                                                                                   \
    if (!(cond))                                                                         \
      ::sketchsgd::detail::broken(__FILE__, __LINE__, #cond __VA_OPT__(, ) __VA_ARGS__); \
  } while (0)

/// Throws `Type` with the streamed message when `cond` is false.
#define SKETCHSGD_REQUIRE(cond, Type, ...)                      \
  do {                                                          \
    if (!(cond)) ::sketchsgd::detail::raise<Type>(__VA_ARGS__); \
  } while (0)
