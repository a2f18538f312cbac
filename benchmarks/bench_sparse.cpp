// sketchsgd_bench_sparse: the sparse all-reduce (compress/sparse_reduce.hpp) against the
// all-gather of every rank's top-k list, W ranks simulated in one process: the link bytes each
// rank's collectives move (the ring model of python/sketchsgd/_traffic.py, the all-gathers padded
// to the longest list as the drivers pad them), and how well each step's update follows the mean
// gradient, with each rank's error feedback kept here (what it sent and the update holds leaves
// it; the all-gather's update holds all it sent).
//
// Gradients are synthetic: g_w = s + n_w, a shared signal s and each rank's own noise n_w, both
// N(0, a_i²) with per-coordinate scales a_i log-normal and an eighth of the coordinates (a "layer"
// at the start of the vector) 8 times larger, so large values cluster as they do in a model.
// Quality, per step: the cosine of the update with the mean gradient; over the run: how far the
// sum of the updates is from the sum of the mean gradients, relative to the latter.
//
// Figures are per step from the second step on (the first runs on even ranges: its imbalance is
// reported apart); the sparse update keeps at most --budget · k values (Ok-Topk's is k). Prints a
// table and, with --json, writes the figures.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/compress/sparse_reduce.hpp>
#include <sketchsgd/core/error.hpp>

namespace {

using namespace sketchsgd;
using sparse::Sparse;

struct BenchOptions {
  uint64_t dim = 1 << 18;
  double density = 0.01;
  std::vector<uint32_t> worlds{4, 16, 64, 256};
  int steps = 12;
  bool delta = true;
  WireFloat wire = WireFloat::F16;
  uint64_t seed = 1;
  double budget = 1;  // the sparse update's values, in k
  std::string json;
};

/// Link bytes a rank receives (= sends, for the ring forms) by collective.
double all_reduce(double n, uint32_t W) {
  return 2.0 * (W - 1) / W * n;
}
double all_gather(double m, uint32_t W) {
  return double(W - 1) * m;
}

struct Result {
  uint32_t world;
  double gather_bytes = 0, sparse_bytes = 0, bf16_bytes = 0;  // per rank and step, the busiest
  double gather_cos = 0, sparse_cos = 0;                      // per step, mean
  double gather_drift = 0, sparse_drift = 0;                  // over the run
  double kept = 0;                                            // sparse update's values per step
  double imbalance = 0;        // the largest range's received pairs over the mean, per step
  double first_imbalance = 0;  // the same on the first step's even ranges
};

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
  return s;
}

Result run(const BenchOptions& o, uint32_t W) {
  const uint64_t d = o.dim, k = std::max<uint64_t>(1, uint64_t(o.density * double(d)));
  const char* wire = o.wire == WireFloat::F16    ? "fp16"
                     : o.wire == WireFloat::BF16 ? "bf16"
                                                 : "fp32";
  const std::string spec = "topk:k=" + std::to_string(k) + ",ef=0,wire=" + wire +
                           ",index=" + (o.delta ? "delta" : "u32");
  std::mt19937_64 rng(o.seed);
  std::normal_distribution<float> z(0.0f, 1.0f);
  std::vector<float> scale(d);
  for (uint64_t i = 0; i < d; ++i) scale[i] = std::exp(0.5f * z(rng)) * (i < d / 8 ? 8.0f : 1.0f);

  // Per method: each rank's error feedback, the sum of its updates; one codec per rank.
  struct Method {
    std::vector<std::vector<float>> error;
    std::vector<float> applied;
  };
  Method gather{std::vector<std::vector<float>>(W, std::vector<float>(d, 0.0f)),
                std::vector<float>(d, 0.0f)};
  Method sparse_{gather};
  std::vector<float> truth(d, 0.0f);
  std::vector<std::unique_ptr<Compressor>> codecs;
  for (uint32_t w = 0; w < W; ++w) codecs.push_back(make_compressor(spec, d));
  sparse::Ranges ranges(d, W);
  Result res{W};
  double per = 0;  // a step's weight in the figures

  auto lists_of = [&](Method& m) {
    std::vector<Sparse> lists(W);
    for (uint32_t w = 0; w < W; ++w) {
      const Message msg = codecs[w]->encode(m.error[w], 0, w);
      lists[w] = sparse::from_bytes(payload_of(msg.bytes()), d, k, o.delta, o.wire);
    }
    return lists;
  };
  auto rounded = [&](Sparse s) {  // the update as the codec's format carries it
    return sparse::from_bytes(sparse::to_bytes(s, o.delta, o.wire), d, s.indices.size(), o.delta,
                              o.wire);
  };
  auto score = [&](const Sparse& u, const std::vector<float>& mean, double& cos, Method& m) {
    std::vector<float> dense(d, 0.0f);
    for (size_t i = 0; i < u.indices.size(); ++i) dense[u.indices[i]] = u.values[i];
    const double c = dot(dense, mean) / std::sqrt(dot(dense, dense) * dot(mean, mean) + 1e-300);
    cos += c * per;
    for (uint64_t i = 0; i < d; ++i) m.applied[i] += dense[i];
  };

  const uint64_t budget = std::max<uint64_t>(1, uint64_t(o.budget * double(k)));
  for (int t = 0; t < o.steps; ++t) {
    // Figures per step from the second on: the first runs on even ranges (nothing to balance by).
    per = o.steps == 1 || t > 0 ? 1.0 / std::max(1, o.steps - 1) : 0.0;
    std::vector<float> mean(d, 0.0f), shared(d);
    for (uint64_t i = 0; i < d; ++i) shared[i] = scale[i] * z(rng);
    for (uint32_t w = 0; w < W; ++w)
      for (uint64_t i = 0; i < d; ++i) {
        const float g = shared[i] + scale[i] * z(rng);
        gather.error[w][i] += g;
        sparse_.error[w][i] += g;
        mean[i] += g / float(W);
      }
    for (uint64_t i = 0; i < d; ++i) truth[i] += mean[i];

    // The all-gather: every rank's list, each padded to the longest; the mean of the union.
    {
      const auto lists = lists_of(gather);
      size_t longest = 0;
      Sparse all;
      for (uint32_t w = 0; w < W; ++w) {
        longest = std::max(longest, sparse::to_bytes(lists[w], o.delta, o.wire).size());
        for (size_t i = 0; i < lists[w].indices.size(); ++i)
          gather.error[w][lists[w].indices[i]] -= lists[w].values[i];
      }
      res.gather_bytes += (all_gather(8, W) + all_gather(double(longest), W)) * per;
      std::vector<Sparse> parts(lists);
      const Sparse u = rounded(sparse::mean(parts, W));
      score(u, mean, res.gather_cos, gather);
    }
    // The sparse reduce as the Round runs it (compress/sparse_phases.hpp): the longest part's
    // length all-gathered, the parts all-to-all, the two passes' counts all-reduced, the kept
    // values' lengths and the kept values (padded to the longest) all-gathered.
    {
      const auto lists = lists_of(sparse_);
      std::vector<std::vector<Bytes>> out(W);  // out[s][r]: rank s's bytes for owner r
      for (uint32_t s = 0; s < W; ++s)
        for (const Sparse& p : sparse::split(lists[s], ranges))
          out[s].push_back(sparse::to_bytes(p, o.delta, o.wire));
      // Parts travel padded to the longest of any rank (Round's exchange: equal parts).
      size_t part = 0;
      for (const auto& row : out)
        for (const Bytes& b : row) part = std::max(part, b.size());
      double received = 0, most = 0;
      std::vector<Sparse> means(W), kept(W);
      std::vector<float> counts(sparse::kBuckets, 0.0f);
      std::vector<sparse::Ranges::Profile> profiles(W);
      for (uint32_t r = 0; r < W; ++r) {
        double pairs = 0;
        std::vector<Sparse> parts;
        for (uint32_t s = 0; s < W; ++s) {
          parts.push_back(sparse::from_bytes(out[s][r], d, k, o.delta, o.wire));
          pairs += double(parts.back().indices.size());
        }
        received += pairs / W;
        most = std::max(most, pairs);
        means[r] = sparse::mean(parts, W);
        profiles[r] = ranges.profile(parts);
        sparse::count(means[r], counts);
      }
      res.imbalance += most / std::max(received, 1.0) * per;
      if (t == 0) res.first_imbalance = most / std::max(received, 1.0);
      const uint32_t split = sparse::split(counts, budget);
      std::vector<float> fine(sparse::kBuckets, 0.0f);
      for (const Sparse& m : means) sparse::count_fine(m, split, fine);
      const sparse::Cut cut = sparse::cut(counts, fine, split, budget);
      size_t longest = 0;
      for (uint32_t r = 0; r < W; ++r) {
        kept[r] = sparse::keep(means[r], cut);
        longest = std::max(longest, sparse::to_bytes(kept[r], o.delta, o.wire).size() +
                                        sizeof(sparse::Ranges::Profile));
      }
      const Sparse u = rounded(sparse::join(kept));
      res.kept += double(u.indices.size()) * per;
      res.sparse_bytes += (all_gather(8, W) + double(W - 1) * double(part) +
                           2 * all_reduce(4.0 * sparse::kBuckets, W) + all_gather(8, W) +
                           all_gather(double(longest), W)) *
                          per;
      for (uint32_t w = 0; w < W; ++w) {
        const Sparse back = sparse::dropped(lists[w], u.indices);
        for (size_t i = 0; i < lists[w].indices.size(); ++i)
          sparse_.error[w][lists[w].indices[i]] -= lists[w].values[i];
        for (size_t i = 0; i < back.indices.size(); ++i)
          sparse_.error[w][back.indices[i]] += back.values[i];
      }
      score(u, mean, res.sparse_cos, sparse_);
      ranges.balance(profiles);
    }
  }
  auto drift = [&](const std::vector<float>& applied) {
    double e = 0, n = 0;
    for (uint64_t i = 0; i < d; ++i) {
      e += double(applied[i] - truth[i]) * (applied[i] - truth[i]);
      n += double(truth[i]) * truth[i];
    }
    return std::sqrt(e / n);
  };
  res.gather_drift = drift(gather.applied);
  res.sparse_drift = drift(sparse_.applied);
  res.bf16_bytes = all_reduce(2.0 * d, W);
  return res;
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(
      stderr,
      "sketchsgd_bench_sparse: %s\nusage: sketchsgd_bench_sparse [--dim N] [--density F] "
      "[--worlds 4,16,64,256] [--steps N] [--budget F] [--wire fp32|fp16|bf16] [--index u32|delta] "
      "[--seed N] [--json FILE]\n",
      why.c_str());
  std::exit(2);
}

uint64_t number(const std::string& flag, const std::string& v, uint64_t lo, uint64_t hi) {
  size_t used = 0;
  unsigned long long x = 0;
  try {
    x = std::stoull(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || v.empty() || v[0] == '-' || x < lo || x > hi)
    usage(flag + " " + v + ": an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
          "]");
  return x;
}

BenchOptions parse(int argc, char** argv) {
  BenchOptions o;
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage(a + ": needs a value");
    const std::string v = argv[i + 1];
    if (a == "--dim") {
      o.dim = number(a, v, 16, uint64_t(1) << 26);
    } else if (a == "--density") {
      char* end = nullptr;
      o.density = std::strtod(v.c_str(), &end);
      if (*end || !(o.density > 0 && o.density <= 0.5)) usage("--density " + v + ": in (0, 0.5]");
    } else if (a == "--worlds") {
      o.worlds.clear();
      std::stringstream in(v);
      for (std::string w; std::getline(in, w, ',');)
        o.worlds.push_back(uint32_t(number(a, w, 2, 1024)));
    } else if (a == "--budget") {
      char* end = nullptr;
      o.budget = std::strtod(v.c_str(), &end);
      if (*end || !(o.budget > 0 && o.budget <= 1024)) usage("--budget " + v + ": in (0, 1024]");
    } else if (a == "--steps") {
      o.steps = int(number(a, v, 1, 10000));
    } else if (a == "--wire") {
      if (v != "fp32" && v != "fp16" && v != "bf16") usage("--wire " + v + ": fp32, fp16 or bf16");
      o.wire = v == "fp32" ? WireFloat::F32 : v == "fp16" ? WireFloat::F16 : WireFloat::BF16;
    } else if (a == "--index") {
      if (v != "u32" && v != "delta") usage("--index " + v + ": u32 or delta");
      o.delta = v == "delta";
    } else if (a == "--seed") {
      o.seed = number(a, v, 0, ~uint64_t(0));
    } else if (a == "--json") {
      o.json = v;
    } else {
      usage("unknown flag " + a);
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const BenchOptions o = parse(argc, argv);
  std::ostringstream json;
  json << "{\"dim\": " << o.dim << ", \"density\": " << o.density << ", \"steps\": " << o.steps
       << ", \"seed\": " << o.seed << ", \"budget\": " << o.budget << ", \"results\": [";
  std::printf("%6s %14s %14s %8s %10s %10s %10s %10s %8s %9s\n", "W", "gather B/rank",
              "sparse B/rank", "ratio", "bf16/gathr", "cos gathr", "cos sparse", "drift g/s",
              "kept/k", "imbalance");
  try {
    for (size_t i = 0; i < o.worlds.size(); ++i) {
      const uint32_t W = o.worlds[i];
      std::fprintf(stderr, "sketchsgd_bench_sparse: W = %u (%zu of %zu)\n", W, i + 1,
                   o.worlds.size());
      const Result r = run(o, W);
      const double k = std::max(1.0, o.density * double(o.dim));
      std::printf("%6u %14.0f %14.0f %8.2f %10.2f %10.4f %10.4f %5.3f/%.3f %8.3f %9.2f\n", W,
                  r.gather_bytes, r.sparse_bytes, r.gather_bytes / r.sparse_bytes,
                  r.bf16_bytes / r.gather_bytes, r.gather_cos, r.sparse_cos, r.gather_drift,
                  r.sparse_drift, r.kept / k, r.imbalance);
      json << (i ? ", " : "") << "{\"world\": " << W << ", \"gather_bytes\": " << r.gather_bytes
           << ", \"sparse_bytes\": " << r.sparse_bytes << ", \"bf16_bytes\": " << r.bf16_bytes
           << ", \"gather_cos\": " << r.gather_cos << ", \"sparse_cos\": " << r.sparse_cos
           << ", \"gather_drift\": " << r.gather_drift << ", \"sparse_drift\": " << r.sparse_drift
           << ", \"kept_per_k\": " << r.kept / k << ", \"imbalance\": " << r.imbalance
           << ", \"first_imbalance\": " << r.first_imbalance << "}";
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "sketchsgd_bench_sparse: %s\n", e.what());
    return 2;
  }
  json << "]}\n";
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    f << json.str();
    if (!f) {
      std::fprintf(stderr, "sketchsgd_bench_sparse: cannot write %s\n", o.json.c_str());
      return 2;
    }
  }
  return 0;
}
