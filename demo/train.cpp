// sketchsgd-train: compressed data-parallel training of a Fashion-MNIST model over ZeroMQ.
//
//   sketchsgd-train                          server + 4 workers on this machine, sketch codec
//   sketchsgd-train --codec topk:k=10000     any codec spec
//   sketchsgd-train --role server --bind tcp://0.0.0.0:5555 --workers 4
//   sketchsgd-train --role worker --server tcp://HOST:5555 --rank 2 --workers 4
//   sketchsgd-train --shards 4               four servers, each holding a quarter of the model
//
// Writes OUT/results.csv (per epoch: test accuracy, loss, traffic) and OUT/summary.json.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/ps/flags.hpp>
#include <sketchsgd/ps/shards.hpp>
#include <sketchsgd/server/job_flags.hpp>
#include <sketchsgd/server/server.hpp>
#include <sketchsgd/worker/client.hpp>
#include <sketchsgd/worker/local_steps.hpp>
#include "idx.hpp"
#include "model.hpp"
#include "process.hpp"

namespace {

using namespace sketchsgd;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// The most accurate of our codecs at 20x less traffic or more on this job (docs/RESULTS.md, the
// frontier): PowerSGD rank 4 per layer (the model's layout is added), fp16 on the wire, worker
// momentum since the server applies updates as they come.
constexpr const char* kDefaultCodec = "powersgd:rank=4,momentum=0.9,wire=fp16";

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct Plan {
  uint32_t train_count, workers, batch, epochs;
  ps::LocalOptions local;  // both 1: a push of every step's gradient
  uint64_t steps_per_epoch() const { return (train_count / workers) / batch; }
  /// Local steps between pushes or fetches: the model trains on each worker, and the server's
  /// step is the outer step on the pushed pseudo-gradients.
  bool local_steps() const { return local.push_every > 1 || local.fetch_every > 1; }
  /// Training steps of each worker (whole rounds of push_every).
  uint64_t steps() const { return rounds() * local.push_every; }
  uint64_t rounds() const { return steps_per_epoch() * epochs / local.push_every; }
};

/// --slow RANK:FACTOR: which worker is a straggler and by how much (none: factor 1).
struct Slow {
  uint32_t rank = 0;
  double factor = 1;
};
Slow slow_of(const ps::Flags& f, uint32_t workers) {
  const std::string s = f.str("slow");
  if (s.empty()) return {};
  const auto colon = s.find(':');
  char* end = nullptr;
  const unsigned long r = colon == std::string::npos ? 0 : std::strtoul(s.c_str(), &end, 10);
  const bool rank_ok = colon != std::string::npos && colon > 0 && end == s.c_str() + colon;
  const double factor = rank_ok ? std::strtod(s.c_str() + colon + 1, &end) : 0;
  SKETCHSGD_REQUIRE(rank_ok && *end == '\0' && end != s.c_str() + colon + 1 && r < workers &&
                        std::isfinite(factor) && factor >= 1 && factor <= 100,
                    InvalidArgument, "--slow: expected RANK:FACTOR with RANK < --workers and ",
                    "FACTOR in [1, 100], got '", s, "'");
  return {uint32_t(r), factor};
}

/// Every flag's value, checked before anything starts (the processes of --role all get the same
/// flags): a bad one is an InvalidArgument naming its flag, exit status 2.
void check_flags(const ps::Flags& f, const ps::JobFlags& job) {
  const std::string role = f.str("role"), model = f.str("model");
  SKETCHSGD_REQUIRE(role == "all" || role == "server" || role == "worker", InvalidArgument,
                    "--role must be all, server or worker, got '", role, "'");
  SKETCHSGD_REQUIRE(model == "mlp" || model == "cnn", InvalidArgument,
                    "--model must be mlp or cnn, got '", model, "'");
  const uint64_t workers = f.u64("workers", 1, 65536);
  f.u64("rank", 0, workers - 1);
  f.u64("batch", 1, 60000);
  f.u64("epochs", 1, UINT32_MAX);
  f.u64("push-every", 1, UINT32_MAX);
  f.u64("fetch-every", 0, UINT32_MAX);
  f.u64("subset", 0, UINT32_MAX);
  f.u64("shards", 1, 64);  // the demo's limit (the server's is 1,024)
  f.u64("threads", 1, 1024);
  f.u64("seed");
  ps::JobConfig scratch;  // the server's flags, checked as sketchsgd-server checks them
  scratch.world = uint32_t(workers);
  job.read(f, scratch);
  for (const char* name : {"lr", "outer-lr"})
    SKETCHSGD_REQUIRE(f.num(name) > 0, InvalidArgument, "--", name, " must be > 0, got ",
                      f.str(name));
  for (const char* name : {"local-momentum", "outer-momentum"})
    SKETCHSGD_REQUIRE(f.num(name) >= 0 && f.num(name) < 1, InvalidArgument, "--", name,
                      " must be in [0, 1), got ", f.str(name));
  for (const char* name : {"wd", "clip"})
    SKETCHSGD_REQUIRE(f.num(name) >= 0, InvalidArgument, "--", name, " must be ≥ 0, got ",
                      f.str(name));
  SKETCHSGD_REQUIRE(f.num("step-ms") >= 0 && f.num("step-ms") <= 60000, InvalidArgument,
                    "--step-ms must be in [0, 60000], got ", f.str("step-ms"));
  slow_of(f, uint32_t(workers));
}

Plan plan_of(const ps::Flags& f) {
  Plan p{uint32_t(f.u64("subset")),
         uint32_t(f.u64("workers")),
         uint32_t(f.u64("batch")),
         uint32_t(f.u64("epochs")),
         {uint32_t(f.u64("push-every")), uint32_t(f.u64("fetch-every"))}};
  if (p.train_count == 0 || p.train_count > 60000) p.train_count = 60000;
  if (p.local.fetch_every == 0) p.local.fetch_every = p.local.push_every;
  SKETCHSGD_REQUIRE(p.workers >= 1 && p.batch >= 1 && p.epochs >= 1, InvalidArgument,
                    "--workers, --batch and --epochs must be ≥ 1");
  SKETCHSGD_REQUIRE(p.steps_per_epoch() >= 1, InvalidArgument, "--subset ", p.train_count,
                    " is too small for ", p.workers, " workers with batch ", p.batch);
  SKETCHSGD_REQUIRE(p.local.push_every >= 1, InvalidArgument, "--push-every must be ≥ 1");
  SKETCHSGD_REQUIRE(p.rounds() >= 1, InvalidArgument, "--push-every ", p.local.push_every,
                    " exceeds the job's ", p.steps_per_epoch() * p.epochs, " steps");
  return p;
}

/// Where this process trains: --device auto picks CUDA when both libtorch and sketchsgd have it;
/// auto and cuda spread the workers over the visible GPUs by rank (the server takes rank 0's),
/// cuda:N puts every process on GPU N.
torch::Device torch_device(const ps::Flags& f, uint32_t rank = 0) {
  const std::string d = f.str("device");
  const bool cuda_ok = torch::cuda::is_available() && gpu::device_count() > 0;
  if (d == "cpu" || (d == "auto" && !cuda_ok)) return torch::kCPU;
  SKETCHSGD_REQUIRE(d == "auto" || d == "cuda" || d.rfind("cuda:", 0) == 0, InvalidArgument,
                    "--device must be auto, cpu, cuda or cuda:N, got ", d);
  Device pinned;
  try {
    pinned = Device::parse(d);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(std::string("--device: ") + e.what());
  }
  SKETCHSGD_REQUIRE(cuda_ok, InvalidArgument, "--device ", d, ": ",
                    torch::cuda::is_available()
                        ? "sketchsgd was built without CUDA or sees no GPU"
                        : "this libtorch has no CUDA (Debian's is CPU-only; "
                          "build against a CUDA PyTorch, see README)");
  const int gpus = int(std::min<size_t>(torch::cuda::device_count(), size_t(gpu::device_count())));
  if (d.find(':') == std::string::npos) return torch::Device(torch::kCUDA, int(rank % gpus));
  SKETCHSGD_REQUIRE(pinned.gpu < gpus, InvalidArgument, "--device ", d, ": this machine has ", gpus,
                    " GPU", gpus == 1 ? "" : "s");
  return torch::Device(torch::kCUDA, pinned.gpu);
}

/// The codecs' device for a torch device: the legacy default stream, which libtorch also uses, so
/// torch's kernels and ours are ordered without extra synchronisation.
Device codec_device(torch::Device d) {
  return d.is_cuda() ? Device::cuda(d.index() < 0 ? 0 : d.index()) : Device::cpu();
}

uint32_t shards_of(const ps::Flags& f) {
  const uint64_t s = f.u64("shards");
  SKETCHSGD_REQUIRE(s >= 1 && s <= 64, InvalidArgument, "--shards must be in [1, 64], got ", s);
  return uint32_t(s);
}

/// A server's per-round metrics: rounds.jsonl, or rounds.shardI.jsonl for each of S > 1 shards.
std::string metrics_path(const ps::Flags& f, uint32_t shard) {
  return f.str("out") +
         (shards_of(f) > 1 ? "/rounds.shard" + std::to_string(shard) + ".jsonl" : "/rounds.jsonl");
}

ps::Server* g_server = nullptr;
// An asynchronous job's server is stopped by run_all (SIGTERM) once its workers are done.
void on_term(int) {
  if (g_server) g_server->stop();
}

int run_server(const ps::Flags& f, const ps::JobFlags& job) {
  const Plan plan = plan_of(f);
  demo::FlatModel model(f.str("model"), f.u64("seed"));
  ps::ServerOptions o;
  o.bind = f.str("bind");
  o.job.world = plan.workers;
  o.job.dim = uint64_t(model.dim());
  o.job.spec = complete_spec(f.str("codec"), model.layout());
  o.job.mode = ps::SyncMode{{ps::Policy::Quorum}};
  job.read(f, o.job);  // the job id, the shard's range and codec, the mode, the optimizer
  o.job.lr = float(f.num("lr"));
  if (plan.local_steps()) {  // the outer step on the mean pseudo-gradient (DiLoCo's defaults)
    o.job.lr = float(f.num("outer-lr"));
    if (o.job.outer.kind == ps::OuterKind::Sgd) {
      o.job.outer.momentum = float(f.num("outer-momentum"));
      o.job.outer.nesterov = o.job.outer.momentum > 0;
    }
  }
  o.job.device = codec_device(torch_device(f));  // the sketch unsketch runs where workers train
  // An asynchronous job has no rounds to count: it ends when every worker has done its steps
  // (run_all stops the server then).
  if (!o.job.async()) o.job.max_rounds = plan.rounds();
  o.metrics = metrics_path(f, uint32_t(f.u64("shard")));
  std::remove(o.metrics.c_str());
  o.quiet = !f.on("verbose");
  o.status = false;
  ps::Server server(o);
  g_server = &server;
  std::signal(SIGTERM, on_term);
  server.start();
  std::printf("%s\n", server.endpoint().c_str());
  std::fflush(stdout);
  server.run();
  return 0;
}

torch::Tensor rows(const demo::Dataset& d, const std::vector<uint32_t>& idx, size_t from,
                   size_t n) {
  auto x = torch::empty({int64_t(n), 784});
  float* p = x.data_ptr<float>();
  for (size_t i = 0; i < n; ++i)
    std::memcpy(p + i * 784, d.x.data() + size_t(idx[from + i]) * 784, 784 * 4);
  return x;
}

torch::Tensor labels(const demo::Dataset& d, const std::vector<uint32_t>& idx, size_t from,
                     size_t n) {
  auto y = torch::empty({int64_t(n)}, torch::kInt64);
  for (size_t i = 0; i < n; ++i) y[int64_t(i)] = d.y[idx[from + i]];
  return y;
}

/// unit: what a step of the bar is (a round, or a local step).
void progress(uint64_t epoch, uint64_t epochs, uint64_t step, uint64_t steps, double loss,
              double ms_per_round, bool tty, const char* unit) {
  if (tty) {
    const int width = 30, done = int(width * step / steps);
    std::fprintf(stderr, "\r  epoch %llu/%llu [%s%s] %llu/%llu  loss %.3f  %.0f ms/%s ",
                 (unsigned long long)epoch, (unsigned long long)epochs,
                 std::string(size_t(done), '#').c_str(),
                 std::string(size_t(width - done), '.').c_str(), (unsigned long long)step,
                 (unsigned long long)steps, loss, ms_per_round, unit);
  } else if (step == steps || step % std::max<uint64_t>(1, steps / 10) == 0) {
    std::fprintf(stderr, "  epoch %llu/%llu: %llu/%llu %ss, loss %.3f, %.0f ms/%s\n",
                 (unsigned long long)epoch, (unsigned long long)epochs, (unsigned long long)step,
                 (unsigned long long)steps, unit, loss, ms_per_round, unit);
  }
}

int run_worker(const ps::Flags& f) {
  const Plan plan = plan_of(f);
  const uint32_t rank = uint32_t(f.u64("rank"));
  torch::set_num_threads(int(f.u64("threads")));
  const demo::Dataset train = demo::load_fashion_mnist(f.str("data"), "train", plan.train_count);
  demo::Dataset test;
  if (rank == 0) test = demo::load_fashion_mnist(f.str("data"), "t10k");
  const torch::Device device = torch_device(f, rank);
  const bool gpu = device.is_cuda();
  demo::FlatModel model(f.str("model"), f.u64("seed"), device);

  ps::ClientOptions o;
  o.server = f.str("server");
  o.job = f.u64("job");
  o.rank = rank;
  o.world = plan.workers;
  o.timeout = 300s;
  // An asynchronous job fetches with every push (Downpour's n_fetch = 1), or where local steps
  // say (LocalSteps asks the client).
  o.fetch_every = plan.local_steps() ? 0 : 1;
  // On a GPU the codec takes the device gradient straight from libtorch (no host copy) and the
  // client keeps the model in device memory.
  ps::Client client(o,
                    make_compressor(complete_spec(f.str("codec"), model.layout()),
                                    uint64_t(model.dim()), codec_device(device)),
                    model.params());
  auto sync_model = [&] { model.load(client.params()); };
  sync_model();

  // This worker's shard: every W-th example, reshuffled each epoch with a per-rank seed.
  std::vector<uint32_t> shard;
  for (uint32_t i = rank; i < plan.train_count && shard.size() < plan.train_count / plan.workers;
       i += plan.workers)
    shard.push_back(i);
  std::mt19937 rng(uint32_t(f.u64("seed") * 7919 + rank));
  std::vector<float> host_grad(gpu ? 0 : size_t(model.dim()));
  torch::Tensor device_grad =
      gpu ? torch::empty({model.dim()},
                         torch::TensorOptions().dtype(torch::kFloat32).device(device))
          : torch::Tensor();
  const std::span<float> grad =
      gpu ? std::span<float>(device_grad.data_ptr<float>(), size_t(model.dim()))
          : std::span<float>(host_grad);
  const float wd = float(f.num("wd"));
  const double clip = f.num("clip");
  const bool tty = rank == 0 && isatty(2);
  const torch::Tensor test_x =
      rank == 0 ? torch::from_blob(test.x.data(), {int64_t(test.count), 784}).clone()
                : torch::Tensor();
  const torch::Tensor test_y = rank == 0 ? torch::tensor(test.y) : torch::Tensor();
  std::ofstream csv;
  if (rank == 0) {
    csv.open(f.str("out") + "/results.csv");
    csv << "epoch,round,test_accuracy,train_loss,wall_s\n";
  }
  // With local steps the worker trains its own copy (SGD with momentum at --lr) and LocalSteps
  // pushes the change every --push-every steps; otherwise every step's gradient is pushed and
  // the model follows the server's.
  std::optional<ps::LocalSteps> local;
  torch::Tensor velocity;
  if (plan.local_steps()) {
    local.emplace(client, plan.local);
    local->start(model.params());
    velocity = torch::zeros_like(model.flat());
  }
  const float inner_momentum = float(f.num("local-momentum"));
  const float lr = float(f.num("lr"));
  // Steps taken: pushes made (with bounded staleness some are not answered yet).
  auto done = [&] { return local ? local->steps() : client.next_push(); };
  const Slow slow = slow_of(f, plan.workers);
  const double slow_by = rank == slow.rank ? slow.factor - 1 : 0;
  const double step_s = f.num("step-ms") / 1000;
  const uint64_t per_epoch = plan.steps_per_epoch();
  const auto start = Clock::now();
  while (done() < plan.steps()) {
    const uint64_t epoch = done() / per_epoch;
    std::shuffle(shard.begin(), shard.end(), rng);
    double loss_sum = 0;
    uint64_t n = 0;
    const auto epoch_start = Clock::now();
    for (uint64_t s = done() % per_epoch; s < per_epoch && done() < plan.steps(); ++s) {
      const auto x = rows(train, shard, s * plan.batch, plan.batch);
      const auto y = labels(train, shard, s * plan.batch, plan.batch);
      const auto compute_start = Clock::now();
      loss_sum += model.gradient(x, y, grad);
      // This machine's speed: at least --step-ms a step, and a straggler's (1 + slow_by)× longer.
      if (const double spent = seconds_since(compute_start),
          least = (1 + slow_by) * std::max(step_s, spent);
          least > spent)
        std::this_thread::sleep_for(std::chrono::duration<double>(least - spent));
      ++n;
      if (gpu) {  // the same two steps as torch ops on the device
        torch::NoGradGuard no_grad;
        if (wd > 0) device_grad.add_(model.flat(), wd);
        if (clip > 0)
          if (const double norm = device_grad.norm().item<double>(); norm > clip)
            device_grad.mul_(clip / norm);
      } else {
        if (wd > 0) {
          const auto p = model.params();
          for (size_t i = 0; i < grad.size(); ++i) grad[i] += wd * p[i];
        }
        if (clip > 0) {  // local gradient clipping: keeps error-feedback codecs stable early on
          double sq = 0;
          for (float v : grad) sq += double(v) * v;
          if (const double norm = std::sqrt(sq); norm > clip)
            for (auto& v : grad) v *= float(clip / norm);
        }
      }
      std::optional<ps::StepResult> r;
      if (local) {
        {
          torch::NoGradGuard no_grad;
          velocity.mul_(inner_momentum).add_(model.view(grad));
          model.flat().add_(velocity, -lr);
        }
        r = local->after_step(model.params());
      } else {
        r = client.step(grad);
        sync_model();
      }
      if (r && r->outcome == ps::StepResult::Outcome::Resynced) break;
      if (rank == 0)
        progress(epoch + 1, plan.epochs, s + 1, per_epoch, loss_sum / double(n),
                 1000.0 * seconds_since(epoch_start) / double(n), tty, local ? "step" : "round");
    }
    if (rank == 0 && (done() % per_epoch == 0 || done() == plan.steps())) {
      // The server's model (with local steps this worker's own copy is set aside meanwhile).
      const torch::Tensor own = local ? model.flat().clone() : torch::Tensor();
      if (local) sync_model();
      const double acc = model.accuracy(test_x, test_y);
      if (local) model.flat().copy_(own);
      if (tty) std::fprintf(stderr, "\n");
      std::fprintf(stderr, "  epoch %llu: test accuracy %.2f%%  (%.1f s)\n",
                   (unsigned long long)(epoch + 1), 100 * acc, seconds_since(start));
      csv << epoch + 1 << ',' << client.round() << ',' << acc << ','
          << loss_sum / double(std::max<uint64_t>(n, 1)) << ',' << seconds_since(start) << '\n'
          << std::flush;
    }
  }
  if (!local) {
    client.sync();  // the pushes still unanswered (bounded staleness)
    sync_model();
  }
  if (local) sync_model();  // ends on the server's model
  if (!f.str("dump").empty()) {
    std::ofstream out(f.str("dump") + ".rank" + std::to_string(rank), std::ios::binary);
    const torch::Tensor host = model.flat().to(torch::kCPU).contiguous();  // the client's model
    out.write(reinterpret_cast<const char*>(host.data_ptr<float>()),
              std::streamsize(host.numel() * sizeof(float)));
  }
  return 0;
}

struct Traffic {
  uint64_t rounds = 0, up = 0, down = 0, dense = 0;
  /// What the workers' links would carry, sent + received, for a ring all-reduce of the
  /// gradient in bf16 every step: 2 · 2(W − 1)/W of its 2d bytes each (the baseline of
  /// sketchsgd.torch's stats(); a worker's own link carries its push and pull).
  double bf16 = 0;
};

/// One server's metrics file.
/// An asynchronous job's line is one push, answered to its worker alone, whose fetch of the model
/// (dense) follows it.
Traffic traffic(const std::string& metrics, uint32_t workers, uint32_t steps_per_round,
                bool async) {
  Traffic t;
  std::ifstream in(metrics);
  auto number = [](const std::string& l, const std::string& key) -> uint64_t {
    const auto at = l.find("\"" + key + "\":");
    return at == std::string::npos ? 0 : std::stoull(l.substr(at + key.size() + 3));
  };
  for (std::string l; std::getline(in, l);) {
    ++t.rounds;
    const auto a = l.find("\"bytes_up\":[");
    std::stringstream ups(l.substr(a + 12, l.find(']', a) - a - 12));
    for (std::string v; std::getline(ups, v, ',');) t.up += std::stoull(v);
    const uint32_t receivers = async ? 1 : workers;
    t.down += number(l, "bytes_down_each") * receivers + (async ? number(l, "dense_bytes") : 0);
    // A dense push and a dense update each, every step.
    t.dense += 2 * number(l, "dense_bytes") * receivers * steps_per_round;
    t.bf16 += 4.0 * (workers - 1) / workers * (number(l, "dense_bytes") / 2.0) * receivers *
              steps_per_round;
  }
  return t;
}

/// Per round, from the servers' metrics (every shard's bytes added; rounds counted by shard 0);
/// dense is what per-step dense pushes and updates would have cost for the same training steps
/// (steps_per_round of them a round).
Traffic traffic(const ps::Flags& f, uint32_t workers, uint32_t steps_per_round, bool async) {
  Traffic t;
  for (uint32_t s = 0; s < shards_of(f); ++s) {
    const Traffic part = traffic(metrics_path(f, s), workers, steps_per_round, async);
    if (s == 0) t.rounds = part.rounds;
    t.up += part.up;
    t.down += part.down;
    t.dense += part.dense;
    t.bf16 += part.bf16;
  }
  return t;
}

int run_all(const ps::Flags& f, int argc, char** argv) {
  const Plan plan = plan_of(f);
  const std::string self = "/proc/self/exe";
  std::vector<std::string> pass;  // every flag given, forwarded to the children
  for (int i = 1; i < argc; ++i) pass.emplace_back(argv[i]);
  auto child = [&](std::vector<std::string> role) {
    std::vector<std::string> a = {self};
    a.insert(a.end(), pass.begin(), pass.end());
    a.insert(a.end(), role.begin(), role.end());  // later flags win
    return a;
  };
  // Validates device, model, spec and data before anything starts.
  const torch::Device device = torch_device(f);
  const demo::FlatModel shape(f.str("model"), 1);
  std::unique_ptr<Compressor> codec;
  try {
    codec = make_compressor(complete_spec(f.str("codec"), shape.layout()), uint64_t(shape.dim()));
  } catch (const InvalidArgument& e) {
    throw InvalidArgument("--codec " + f.str("codec") + ": " + e.what());
  }
  SKETCHSGD_REQUIRE(f.str("mode") != "async" || !codec->two_rounds(), InvalidArgument,
                    "--mode async needs a one-round codec: ", f.str("codec"),
                    " queries its workers in a second round (try topk:k=18000,momentum=0.9)");
  for (const char* file : {"/train-images-idx3-ubyte.gz", "/t10k-images-idx3-ubyte.gz"})
    SKETCHSGD_REQUIRE(std::filesystem::exists(f.str("data") + file), InvalidArgument, "--data ",
                      f.str("data"), ": no ", file + 1,
                      " (apt-get install dataset-fashion-mnist, or pass --data DIR)");
  char rounds[160] = "";
  if (plan.local_steps())
    std::snprintf(rounds, sizeof rounds, ", %llu rounds (push every %u, fetch every %u)",
                  (unsigned long long)plan.rounds(), plan.local.push_every, plan.local.fetch_every);
  std::fprintf(stderr,
               "sketchsgd-train: %s model on %s, %u workers, %u server%s, codec %s, %u epochs of "
               "%llu steps%s\n",
               f.str("model").c_str(), device.str().c_str(), plan.workers, shards_of(f),
               shards_of(f) == 1 ? "" : "s", f.str("codec").c_str(), plan.epochs,
               (unsigned long long)plan.steps_per_epoch(), rounds);
  const auto start = Clock::now();
  // Workers and the server share 2 cores here: one thread each for libtorch and the kernels.
  std::vector<demo::Process> servers;
  std::string endpoint;  // the servers' endpoints, comma-separated: a sharded job's list
  for (uint32_t i = 0; i < shards_of(f); ++i) {
    servers.push_back(demo::Process::spawn(
        child({"--role", "server", "--shard", std::to_string(i), "--bind", "tcp://127.0.0.1:*"})));
    const std::string e = servers.back().line(60s);
    SKETCHSGD_REQUIRE(!e.empty(), Error, "server ", i, " did not start");
    endpoint += (endpoint.empty() ? "" : ",") + e;
  }
  std::vector<demo::Process> workers;
  for (uint32_t r = 0; r < plan.workers; ++r)
    workers.push_back(demo::Process::spawn(
        child({"--role", "worker", "--rank", std::to_string(r), "--server", endpoint}),
        {"OMP_NUM_THREADS=1"}));
  // The first worker that fails ends the job: the others would only wait for it.
  std::vector<bool> done(plan.workers, false);
  for (uint32_t left = plan.workers; left > 0;) {
    for (uint32_t r = 0; r < plan.workers; ++r) {
      if (done[r]) continue;
      const auto rc = workers[r].try_wait();
      if (!rc) continue;
      done[r] = true;
      --left;
      if (*rc != 0) {
        std::fprintf(stderr, "worker %u failed (exit %d): stopping the job\n", r, *rc);
        return 1;  // the destructors kill the other workers and the server
      }
    }
    std::this_thread::sleep_for(50ms);
  }
  if (f.str("mode") == "async")  // no last round: the job is done when its workers are
    for (auto& server : servers) server.terminate();
  for (auto& server : servers)
    if (const int src = server.wait(60s); src != 0) {
      std::fprintf(stderr, "server failed (exit %d)\n", src);
      return 1;
    }
  const double wall = seconds_since(start);

  const Traffic t = traffic(f, plan.workers, plan.local.push_every, f.str("mode") == "async");
  double acc = 0;
  {
    std::ifstream in(f.str("out") + "/results.csv");
    for (std::string l; std::getline(in, l);) {
      std::stringstream ss(l);
      std::string e, rd, a;
      std::getline(ss, e, ',');
      std::getline(ss, rd, ',');
      std::getline(ss, a, ',');
      if (e != "epoch") acc = std::stod(a);
    }
  }
  const double ratio = t.up + t.down ? double(t.dense) / double(t.up + t.down) : 0;
  const double ratio_bf16 = t.up + t.down ? t.bf16 / double(t.up + t.down) : 0;
  std::fprintf(stderr,
               "\nsummary: test accuracy %.2f%% | %llu rounds | up %.1f MB, down %.1f MB "
               "(dense fp32 pushes and pulls: %.1f MB) | link bytes %.1fx fewer than a bf16 "
               "all-reduce at W = %u (%.1fx fewer than dense fp32 pushes and pulls) | %.1f s\n",
               100 * acc, (unsigned long long)t.rounds, t.up / 1e6, t.down / 1e6, t.dense / 1e6,
               ratio_bf16, plan.workers, ratio, wall);
  std::ofstream js(f.str("out") + "/summary.json");
  js << "{\"codec\":\"" << f.str("codec") << "\",\"spec\":\"" << codec->spec() << "\",\"model\":\""
     << f.str("model") << "\",\"workers\":" << plan.workers << ",\"epochs\":" << plan.epochs
     << ",\"rounds\":" << t.rounds << ",\"push_every\":" << plan.local.push_every
     << ",\"fetch_every\":" << plan.local.fetch_every << ",\"shards\":" << shards_of(f)
     << ",\"steps\":" << plan.steps() << ",\"test_accuracy\":" << acc << ",\"bytes_up\":" << t.up
     << ",\"bytes_down\":" << t.down << ",\"dense_bytes\":" << t.dense
     << ",\"traffic_ratio\":" << ratio << ",\"bf16_allreduce_link_bytes\":" << t.bf16
     << ",\"link_ratio_bf16\":" << ratio_bf16 << ",\"wall_s\":" << wall << "}\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  ps::Flags f(
      "sketchsgd-train: Fashion-MNIST over a ZeroMQ parameter server with compressed gradients.\n"
      "With no --role it starts the server and --workers worker processes on this machine.\n"
      "Exit status: 0 trained, 1 the job failed, 2 bad flags or an error, 3 (--role worker) the\n"
      "server's job had already finished.");
  f.add("role", "all", "all | server | worker");
  f.add("workers", "4", "number of workers W");
  f.add("rank", "0", "this worker's rank (--role worker)");
  f.add("server", "tcp://127.0.0.1:5555", "server endpoint (--role worker)");
  f.add("bind", "tcp://127.0.0.1:5555", "endpoint to bind (--role server)");
  ps::JobFlags job;  // the server's job flags, as sketchsgd-server has them
  job.add(f, {"shards", "shard", "job"});
  f.add("model", "mlp", "mlp (1.86M parameters) | cnn");
  f.add("codec", kDefaultCodec, "codec spec (see sketchsgd-server --list-codecs)");
  f.add("epochs", "3", "passes over the training set");
  f.add("batch", "32", "examples per worker per round");
  f.add("lr", "0.01",
        "learning rate: the server's (momentum is the codec's); with local steps the workers'");
  f.add("push-every", "1",
        "n_push: local steps between pushes of the accumulated change (1: every step's gradient)");
  f.add("fetch-every", "0",
        "n_fetch: local steps between fetches of the server's model (0: = "
        "--push-every)");
  f.add("local-momentum", "0.9", "with local steps: the workers' SGD momentum");
  f.add("outer-lr", "0.7", "with local steps: the server's outer learning rate");
  f.add("outer-momentum", "0.9", "with local steps: the outer step's Nesterov momentum (0: none)");
  job.add(f,
          {"mode", "server-opt", "staleness", "min-workers", "deadline-ms", "max-age", "age-scale"},
          {{"deadline-ms", "60000"}});
  f.add("slow", "", "RANK:FACTOR: that worker computes FACTOR times slower (a straggler)");
  f.add("step-ms", "0",
        "every worker's step computes for at least this long (a fleet of machines of that speed: "
        "the rest of the time it sleeps, so workers sharing this machine's cores do not slow "
        "each other; 0: as fast as it can)");
  f.add("wd", "0", "weight decay added to the gradient");
  f.add("clip", "0", "clip each worker's gradient to this L2 norm (0: off)");
  f.add("seed", "1", "model initialisation and shuffling seed");
  f.add("subset", "0", "use only the first N training examples (0: all 60,000)");
  f.add("data", demo::kFashionDir, "folder of the Fashion-MNIST IDX files");
  f.add("out", "build/demo", "folder for results.csv, summary.json, rounds.jsonl");
  f.add("device", "auto",
        "auto | cpu | cuda | cuda:N: where workers train and the server unsketches (auto: CUDA "
        "when libtorch and sketchsgd both have it; workers spread over the GPUs by rank)");
  f.add("threads", "1", "libtorch threads per worker");
  f.add("dump", "", "write each worker's final parameters to PREFIX.rankN (tests)");
  f.add("verbose", "0", "server log lines", "", true);
  try {
    if (!f.parse(argc, argv)) return 0;
    check_flags(f, job);
    try {
      std::filesystem::create_directories(f.str("out"));
    } catch (const std::filesystem::filesystem_error& e) {
      throw InvalidArgument("--out " + f.str("out") + ": " + e.code().message());
    }
    const std::string role = f.str("role");
    if (role == "server") return run_server(f, job);
    if (role == "worker") return run_worker(f);
    return run_all(f, argc, argv);
  } catch (const sketchsgd::JobFinished& e) {
    // A worker that came after the job's last round: told at once, with its own exit code.
    std::fprintf(stderr, "sketchsgd-train: nothing to do: %s\n", e.what());
    return ps::kExitJobFinished;
  } catch (const sketchsgd::Error& e) {
    std::fprintf(stderr, "sketchsgd-train: %s\n", e.what());
    return 2;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "sketchsgd-train: libtorch: %s\n", e.what_without_backtrace());
    return 2;
  } catch (const std::exception& e) {  // the standard library's (a file system's refusal, …)
    std::fprintf(stderr, "sketchsgd-train: %s\n", e.what());
    return 2;
  }
}
