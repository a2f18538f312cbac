// sketchsgd_compare --input FILE.f32 --rows R --cols C --k K --reps N --seed S
// Times construction, accumulate and unsketch+top-k of one vector and prints one JSON object;
// benchmarks/compare_torch.py runs the PyTorch reference on the same vector beside it.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <sketchsgd/sketch/count_sketch.hpp>

namespace {

/// A field of /proc/self/status in bytes (VmRSS, VmHWM).
long status_bytes(const char* field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(field, 0) == 0) return std::stol(line.substr(std::strlen(field) + 1)) * 1024;
  return -1;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class F>
double ms(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string input;
  uint32_t rows = 5, cols = 500000;
  uint64_t k = 50000, seed = 42;
  int reps = 5;
  sketchsgd::Hashing hashing = sketchsgd::Hashing::Blocked;
  uint32_t block = 1024;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--input")
      input = v;
    else if (a == "--rows")
      rows = uint32_t(std::stoul(v));
    else if (a == "--cols")
      cols = uint32_t(std::stoul(v));
    else if (a == "--k")
      k = std::stoull(v);
    else if (a == "--reps")
      reps = std::max(1, std::stoi(v));
    else if (a == "--seed")
      seed = std::stoull(v);
    else if (a == "--block")
      block = uint32_t(std::stoul(v));
    else if (a == "--hashing" && (v == "random" || v == "precomputed" || v == "blocked"))
      hashing = v == "random"        ? sketchsgd::Hashing::OnTheFly
                : v == "precomputed" ? sketchsgd::Hashing::Precomputed
                                     : sketchsgd::Hashing::Blocked;
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  std::ifstream f(input, std::ios::binary | std::ios::ate);
  if (!f) {
    std::fprintf(stderr, "cannot read --input '%s'\n", input.c_str());
    return 2;
  }
  const size_t bytes = size_t(f.tellg());
  std::vector<float> x(bytes / 4);
  f.seekg(0);
  f.read(reinterpret_cast<char*>(x.data()), std::streamsize(x.size() * 4));
  try {
    // Peak memory beyond the input: what the sketch, its hashes and the selection allocate.
    const long base = status_bytes("VmRSS:");
    std::FILE* reset = std::fopen("/proc/self/clear_refs", "w");
    if (reset) std::fputs("5", reset), std::fclose(reset);  // resets VmHWM to the current RSS
    std::vector<double> construct, acc, top;
    for (int r = 0; r < reps; ++r) {
      std::unique_ptr<sketchsgd::CountSketch> s;
      construct.push_back(ms([&] {
        s = std::make_unique<sketchsgd::CountSketch>(
            sketchsgd::SketchConfig{x.size(), rows, cols, seed, hashing, block});
      }));
      acc.push_back(ms([&] { s->accumulate(x); }));
      sketchsgd::TopK t;
      top.push_back(ms([&] { t = s->top_k(k); }));
      if (t.indices.size() != k) return 3;
    }
    const long peak = status_bytes("VmHWM:");
    std::printf(
        "{\"construct_ms\": %.3f, \"accumulate_ms\": %.3f, \"topk_ms\": %.3f, "
        "\"peak_extra_bytes\": %ld, \"threads\": %d, \"dim\": %zu}\n",
        median(construct), median(acc), median(top), peak - base, omp_get_max_threads(), x.size());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sketchsgd_compare: %s\n", e.what());
    return 1;
  }
  return 0;
}
