// sketchsgd-server: the parameter server of one training job. Workers connect with the worker
// client (worker/client.hpp); see --help.
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/ps/flags.hpp>
#include <sketchsgd/ps/shards.hpp>
#include <sketchsgd/ps/transport.hpp>
#include <sketchsgd/server/server.hpp>

namespace {
sketchsgd::ps::Server* g_server = nullptr;
std::atomic<bool> g_shutting_down{false};
// The first signal ends the job cleanly (queued checkpoint written, last messages sent); one that
// comes while ZeroMQ still lingers over undelivered messages, or a second one, ends the process.
void on_signal(int sig) {
  if (g_shutting_down.exchange(true) || !g_server) _exit(128 + sig);
  g_server->stop();
}

/// What parse returns; its InvalidArgument told as one of the flag --name's.
template <class Parse>
auto named(const std::string& name, Parse&& parse) {
  try {
    return parse();
  } catch (const sketchsgd::InvalidArgument& e) {
    throw sketchsgd::InvalidArgument("--" + name + ": " + e.what());
  }
}
}  // namespace

int main(int argc, char** argv) {
  using namespace sketchsgd::ps;
  Flags f(
      "sketchsgd-server: parameter server for compressed distributed SGD.\n"
      "Workers push encoded gradients each round; the server merges them in compressed form\n"
      "(sketches summed, heavy hitters recovered), applies the update to its model and sends it\n"
      "to every worker.\n\n"
      "  sketchsgd-server --world 4 --dim 1000000 --codec sketch:k=10000 --bind "
      "tcp://0.0.0.0:5555");
  f.add("bind", "tcp://127.0.0.1:5555", "ZeroMQ endpoint to bind (tcp://HOST:PORT; PORT * = any)",
        "SKETCHSGD_BIND");
  f.add("job", "1", "job id; workers must use the same", "SKETCHSGD_JOB");
  f.add("world", "1", "number of workers W (a federated job: clients sampled per round)",
        "SKETCHSGD_WORLD");
  f.add("population", "0",
        "a federated job's clients N: W of them sampled each round, each registers for its round, "
        "pushes and leaves (0: W fixed workers)",
        "SKETCHSGD_POPULATION");
  f.add("sample-seed", "1", "a federated job: seed of the rounds' samples (clients draw the same)",
        "SKETCHSGD_SAMPLE_SEED");
  f.add("dim", "0", "number of parameters d (required)", "SKETCHSGD_DIM");
  f.add("codec", "sketch", "codec spec, e.g. sketch:rows=5,cols=500000,k=50000,p2=4",
        "SKETCHSGD_CODEC");
  f.add("shards", "1",
        "S servers share the model: each holds one range (--dim and --codec stay the whole "
        "model's; workers list all S endpoints, comma-separated)",
        "SKETCHSGD_SHARDS");
  f.add("shard", "0", "with --shards: which one this server is, 0..S-1", "SKETCHSGD_SHARD");
  f.add("replica-of", "",
        "a backup: the primary's endpoint (the same job flags); it holds the primary's state round "
        "by round and takes over when workers find the primary gone (workers list both: "
        "PRIMARY|BACKUP)",
        "SKETCHSGD_REPLICA_OF");
  f.add("lr", "0.1", "learning rate: everyone does w -= lr * step", "SKETCHSGD_LR");
  f.add("outer-momentum", "0",
        "momentum of the step everyone applies (workers pushing pseudo-gradients: DiLoCo's outer "
        "step; 0: plain w -= lr * step)",
        "SKETCHSGD_OUTER_MOMENTUM");
  f.add("outer-nesterov", "1", "with --outer-momentum: Nesterov's look-ahead (0: heavy ball)",
        "SKETCHSGD_OUTER_NESTEROV");
  f.add("server-opt", "sgd",
        "the optimizer every holder of the model applies to each update: sgd (with "
        "--outer-momentum), adagrad or adam (per coordinate, state kept with the model)",
        "SKETCHSGD_SERVER_OPT");
  f.add("opt-eps", "1e-8", "adagrad, adam: epsilon added to the root", "SKETCHSGD_OPT_EPS");
  f.add("opt-betas", "0.9,0.999", "adam: beta1,beta2", "SKETCHSGD_OPT_BETAS");
  f.add("policy", "quorum", "when a round's deadline passes: wait | quorum | abort",
        "SKETCHSGD_POLICY");
  f.add("min-workers", "0", "quorum size (0: all W)", "SKETCHSGD_MIN_WORKERS");
  f.add("deadline-ms", "30000", "per-round deadline from its first push", "SKETCHSGD_DEADLINE_MS");
  f.add("heartbeat-ms", "1000", "liveness interval workers must keep", "SKETCHSGD_HEARTBEAT_MS");
  f.add("dead-after", "3", "missed heartbeat intervals before a worker is dead",
        "SKETCHSGD_DEAD_AFTER");
  f.add("staleness", "0", "bounded staleness: rounds a worker may push ahead (0: synchronous)",
        "SKETCHSGD_STALENESS");
  f.add("mode", "rounds",
        "rounds: every update merges a round's pushes | async: no rounds, each push applied as it "
        "arrives and answered to its worker alone (Downpour; one-round codecs)",
        "SKETCHSGD_MODE");
  f.add("max-age", "0",
        "async: refuse a push computed on a model this many other workers' updates old (0: none)",
        "SKETCHSGD_MAX_AGE");
  f.add("age-scale", "1", "async: divide a push's step by 1 + its age (1) or not (0)",
        "SKETCHSGD_AGE_SCALE");
  f.add("device", "cpu",
        "where the aggregator runs: cpu, cuda or cuda:N (sketch unsketch on the GPU)",
        "SKETCHSGD_DEVICE");
  f.add("checkpoint", "", "checkpoint file; resumed from when it exists", "SKETCHSGD_CHECKPOINT");
  f.add("checkpoint-every", "100", "rounds between checkpoints (with --checkpoint)",
        "SKETCHSGD_CHECKPOINT_EVERY");
  f.add("rounds", "0", "stop after this many rounds (0: run until interrupted)",
        "SKETCHSGD_ROUNDS");
  f.add("finish-grace-ms", "500",
        "after the last round, how long to keep answering late workers 'job finished'",
        "SKETCHSGD_FINISH_GRACE_MS");
  f.add("finish-wait-ms", "30000",
        "after the last round, how long at most to wait for the workers' goodbyes (each says "
        "goodbye once it holds the last update: on a slow link that takes a while)",
        "SKETCHSGD_FINISH_WAIT_MS");
  f.add("linger-ms", "2000", "at exit, how long ZeroMQ may keep trying to deliver to slow peers",
        "SKETCHSGD_LINGER_MS");
  f.add("metrics", "", "append one JSON line per round to this file", "SKETCHSGD_METRICS");
  f.add("curve-secret-file", "", "CURVE on: file holding the server's Z85 secret key",
        "SKETCHSGD_CURVE_SECRET_FILE");
  f.add("curve-keys", "", "with CURVE: file of 'RANK WORKER_PUBLIC_KEY' lines; only these connect",
        "SKETCHSGD_CURVE_KEYS");
  f.add("gen-keypair", "0", "print a new CURVE key pair (public, then secret) and exit", "", true);
  f.add("quiet", "0", "no log lines", "", true);
  f.add("no-status", "0", "no live status line", "", true);
  f.add("list-codecs", "0", "print every codec and its options, then exit", "", true);
  try {
    if (!f.parse(argc, argv)) return 0;
    if (f.on("list-codecs")) {
      std::fputs(sketchsgd::Registry::instance().describe().c_str(), stdout);
      return 0;
    }
    if (f.on("gen-keypair")) {
      const CurveKeys k = curve_keypair();
      std::printf("%s\n%s\n", k.public_key.c_str(), k.secret_key.c_str());
      return 0;
    }
    ServerOptions o;
    if (!f.str("curve-secret-file").empty()) {
      std::ifstream in(f.str("curve-secret-file"));
      std::getline(in, o.curve_secret);
      SKETCHSGD_REQUIRE(o.curve_secret.size() == 40, sketchsgd::InvalidArgument,
                        "--curve-secret-file must hold a 40-character Z85 key");
      SKETCHSGD_REQUIRE(!f.str("curve-keys").empty(), sketchsgd::InvalidArgument,
                        "--curve-secret-file needs --curve-keys (the workers allowed in)");
      o.curve_clients = read_key_list(f.str("curve-keys"));
    }
    o.bind = f.str("bind");
    o.job.job = f.u64("job");
    o.job.world = uint32_t(f.u64("world", 1, 65536));
    o.job.population = uint32_t(f.u64("population", 0, UINT32_MAX));
    o.job.sample_seed = f.u64("sample-seed");
    o.job.dim = f.u64("dim");
    SKETCHSGD_REQUIRE(o.job.dim > 0, sketchsgd::InvalidArgument, "--dim is required (see --help)");
    o.job.spec = f.str("codec");
    named("codec " + o.job.spec, [&] { return sketchsgd::share_spec(o.job.spec); });
    const uint64_t shards = f.u64("shards"), shard = f.u64("shard");
    SKETCHSGD_REQUIRE(shards >= 1 && shard < shards && shards <= 1024, sketchsgd::InvalidArgument,
                      "--shard ", shard, " of --shards ", shards,
                      ": need 0 <= shard < shards <= 1024");
    if (shards > 1) {
      const ShardPlan p = plan_shards(o.job.spec, o.job.dim, uint32_t(shards))[shard];
      o.job.shard = p.id;
      o.job.dim = p.dim;
      o.job.spec = p.spec;
    }
    o.job.lr = float(f.num("lr"));
    o.job.outer.momentum = float(f.num("outer-momentum"));
    SKETCHSGD_REQUIRE(o.job.outer.momentum >= 0 && o.job.outer.momentum < 1,
                      sketchsgd::InvalidArgument, "--outer-momentum must be in [0, 1), got ",
                      f.str("outer-momentum"));
    o.job.outer.nesterov = f.u64("outer-nesterov", 0, 1) != 0 && o.job.outer.momentum > 0;
    o.job.outer.kind = named("server-opt", [&] { return parse_outer_kind(f.str("server-opt")); });
    o.job.outer.eps = float(f.num("opt-eps"));
    {
      const std::string betas = f.str("opt-betas");
      char* mid = nullptr;
      char* end = nullptr;
      const double b1 = std::strtod(betas.c_str(), &mid);
      const double b2 = mid && *mid == ',' ? std::strtod(mid + 1, &end) : 0.0;
      SKETCHSGD_REQUIRE(
          mid && *mid == ',' && mid != betas.c_str() && end && *end == '\0' && end != mid + 1,
          sketchsgd::InvalidArgument, "--opt-betas: expected beta1,beta2, got '", betas, "'");
      o.job.outer.beta1 = float(b1);
      o.job.outer.beta2 = float(b2);
    }
    named("server-opt", [&] {
      o.job.outer.validate();
      return 0;
    });
    o.job.policy = named("policy", [&] { return parse_policy(f.str("policy")); });
    o.job.min_workers = uint32_t(f.u64("min-workers", 0, o.job.world));
    o.job.deadline = Millis(f.u64("deadline-ms", 1, UINT32_MAX));
    o.job.heartbeat = Millis(f.u64("heartbeat-ms", 1, UINT32_MAX));
    o.job.dead_after = uint32_t(f.u64("dead-after", 1, UINT32_MAX));
    o.job.staleness = uint32_t(f.u64("staleness", 0, 64));
    const std::string mode = f.str("mode");
    SKETCHSGD_REQUIRE(mode == "rounds" || mode == "async", sketchsgd::InvalidArgument,
                      "--mode must be rounds or async, got '", mode, "'");
    o.job.async = mode == "async";
    o.job.max_age = uint32_t(f.u64("max-age", 0, UINT32_MAX));
    o.job.age_scaled = f.u64("age-scale", 0, 1) != 0;
    SKETCHSGD_REQUIRE(o.job.async || o.job.max_age == 0, sketchsgd::InvalidArgument,
                      "--max-age bounds the pushes of --mode async jobs only");
    if (o.job.async) o.job.policy = Policy::Wait;  // no rounds to close: the policy has no use
    o.job.device = named("device", [&] { return sketchsgd::Device::parse(f.str("device")); });
    o.checkpoint = f.str("checkpoint");
    o.job.checkpoint_every = f.u64("checkpoint-every");
    o.job.max_rounds = f.u64("rounds");
    o.finish_grace = Millis(f.u64("finish-grace-ms", 0, UINT32_MAX));
    o.finish_wait = Millis(f.u64("finish-wait-ms", 0, UINT32_MAX));
    o.linger = Millis(f.u64("linger-ms", 0, UINT32_MAX));
    o.metrics = f.str("metrics");
    o.replica_of = f.str("replica-of");
    o.quiet = f.on("quiet");
    o.status = !f.on("no-status") && !o.quiet;
    {
      Server server(o);
      g_server = &server;
      std::signal(SIGINT, on_signal);
      std::signal(SIGTERM, on_signal);
      server.start();
      // The bound endpoint on stdout, so a launcher that asked for port * can read it.
      std::printf("%s\n", server.endpoint().c_str());
      std::fflush(stdout);
      server.run();
      g_shutting_down = true;  // from here on a signal ends the process at once
      if (!server.deposed().empty()) {
        std::fprintf(stderr, "sketchsgd-server: deposed: %s\n", server.deposed().c_str());
        return kExitDeposed;
      }
    }  // within --linger-ms, whatever the peers do
    return 0;
  } catch (const sketchsgd::Error& e) {
    std::fprintf(stderr, "sketchsgd-server: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {  // the standard library's (memory, a file system, …)
    std::fprintf(stderr, "sketchsgd-server: %s\n", e.what());
    return 2;
  }
}
