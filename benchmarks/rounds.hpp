// Shared by the parameter-server benchmarks (bench_ps, bench_churn, bench_shards): milliseconds,
// medians, the synthetic gradient every worker pushes, and a server process's memory and CPU.
#pragma once

#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

namespace sketchsgd::bench {

using Clock = std::chrono::steady_clock;

inline double ms(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

/// xorshift: fast, gradient-like noise with rare heavy coordinates.
inline std::vector<float> xorshift_gradient(uint64_t d) {
  std::vector<float> g(d);
  uint64_t x = 88172645463325252ull;
  for (auto& v : g) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    v = float(int64_t(x % 2001) - 1000) * 1e-3f * ((x >> 40) % 997 == 0 ? 50.0f : 1.0f);
  }
  return g;
}

/// A process's resident memory (MB) and CPU time (ms, user + system), from /proc.
inline double rss_mb(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/statm");
  uint64_t pages = 0, resident = 0;
  in >> pages >> resident;
  return double(resident) * double(::sysconf(_SC_PAGESIZE)) / 1e6;
}
inline double cpu_ms(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream rest(s.substr(s.rfind(')') + 2));  // fields after the command name
  std::string x;
  uint64_t utime = 0, stime = 0;
  for (int field = 3; field <= 15 && rest >> x; ++field) {
    if (field == 14) utime = std::stoull(x);
    if (field == 15) stime = std::stoull(x);
  }
  return double(utime + stime) * 1000.0 / double(::sysconf(_SC_CLK_TCK));
}

/// The sketchsgd-server program: the one given, else the build's, beside this benchmark's folder.
inline std::string server_program(const std::string& given, const std::string& argv0) {
  if (!given.empty()) return given;
  return argv0.substr(0, argv0.rfind('/') + 1) + "../server/sketchsgd-server";
}

}  // namespace sketchsgd::bench
