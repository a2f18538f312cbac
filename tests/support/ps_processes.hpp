// The parameter-server programs as processes on 127.0.0.1, for the tests that start them: the
// binaries under test, scratch files, and one job's flags with its in-process reference.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <sketchsgd/kernels/cpu.hpp>
#include "demo/process.hpp"
#include "support/ps_synthetic.hpp"
#include "support/round.hpp"

namespace sketchsgd::ps {

namespace fs = std::filesystem;

using Proc = demo::Process;

/// The programs under test: the build's, or the environment's (a build copied to another
/// machine, as scripts/gpu.sh check runs it, lives at another path).
inline std::string program(const char* env, const char* built) {
  const char* v = std::getenv(env);
  return v && *v ? v : built;
}
inline const std::string kServer = program("SKETCHSGD_SERVER_BIN", SKETCHSGD_SERVER_BIN);
inline const std::string kWorker = program("SKETCHSGD_WORKER_BIN", SKETCHSGD_WORKER_BIN);

inline fs::path scratch(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("sketchsgd-ps-" + std::to_string(getpid()));
  fs::create_directories(d);
  return d / name;
}

inline std::vector<float> read_params(const fs::path& p, size_t dim) {
  std::vector<float> v(dim);
  std::ifstream in(p, std::ios::binary);
  in.read(reinterpret_cast<char*>(v.data()), std::streamsize(dim * 4));
  if (size_t(in.gcount()) != dim * 4) v.clear();
  return v;
}

inline std::vector<std::string> lines_of(const fs::path& p) {
  std::vector<std::string> v;
  std::ifstream in(p);
  for (std::string l; std::getline(in, l);) v.push_back(l);
  return v;
}

struct Job {
  std::string spec;
  uint32_t world;
  uint64_t dim = 3000, rounds = 6, seed = 4;
  std::string bind = "tcp://127.0.0.1:*";
  std::vector<std::string> server_extra;

  /// The flags server and workers must agree on.
  std::vector<std::string> job_flags(std::string program) const {
    return {std::move(program),  "--job",   "3",  "--world",  std::to_string(world), "--dim",
            std::to_string(dim), "--codec", spec, "--rounds", std::to_string(rounds)};
  }
  Proc server(const std::string& checkpoint = "", const std::string& metrics = "") const {
    auto a = job_flags(kServer);
    a.insert(a.end(), {"--bind", bind, "--lr", "0.2", "--quiet"});
    if (!checkpoint.empty())
      a.insert(a.end(), {"--checkpoint", checkpoint, "--checkpoint-every", "2"});
    if (!metrics.empty()) a.insert(a.end(), {"--metrics", metrics});
    a.insert(a.end(), server_extra.begin(), server_extra.end());
    return Proc::spawn(a);
  }
  Proc worker(const std::string& endpoint, uint32_t rank, const fs::path& out,
              std::vector<std::string> extra = {}) const {
    auto a = job_flags(kWorker);
    a.insert(a.end(), {"--server", endpoint, "--rank", std::to_string(rank), "--seed",
                       std::to_string(seed), "--out", out.string()});
    a.insert(a.end(), extra.begin(), extra.end());
    return Proc::spawn(a);
  }
  std::vector<float> reference() const {
    test::Job ref(spec, dim, world);
    auto p = test::initial_params(dim, seed);
    for (uint64_t t = 0; t < rounds; ++t) {
      std::vector<std::vector<float>> g;
      for (uint32_t r = 0; r < world; ++r) g.push_back(test::synthetic_grad(p, r, t, seed));
      const auto steps = ref.round(g, t);
      kernels::cpu::axpy(p.data(), steps[0].data(), dim, -0.2f);
    }
    return p;
  }
};

}  // namespace sketchsgd::ps
