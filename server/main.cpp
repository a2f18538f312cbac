// sketchsgd-server: the parameter server of one training job. Workers connect with the worker
// client (worker/client.hpp); see --help.
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/ps/flags.hpp>
#include <sketchsgd/ps/transport.hpp>
#include <sketchsgd/server/job_flags.hpp>
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
  JobFlags job;
  job.add(f, {"job", "world", "population", "sample-seed", "dim", "codec", "shards", "shard"});
  f.add("replica-of", "",
        "a backup: the primary's endpoint (the same job flags); it holds the primary's state round "
        "by round and takes over when workers find the primary gone (workers list both: "
        "PRIMARY|BACKUP)",
        "SKETCHSGD_REPLICA_OF");
  job.add(f, {"lr", "outer-momentum", "outer-nesterov", "server-opt", "opt-eps", "opt-betas",
              "policy", "min-workers", "deadline-ms", "heartbeat-ms", "dead-after", "staleness",
              "mode", "max-age", "age-scale", "device"});
  f.add("checkpoint", "", "checkpoint file; resumed from when it exists", "SKETCHSGD_CHECKPOINT");
  job.add(f, {"checkpoint-every", "rounds"});
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
    job.read(f, o.job);
    o.checkpoint = f.str("checkpoint");
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
