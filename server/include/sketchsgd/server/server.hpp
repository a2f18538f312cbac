// The ZeroMQ parameter server: a ROUTER socket owned by one I/O thread, the round logic (Engine) on
// a merge thread, bounded queues between them. The I/O thread keeps receiving, refusing garbage
// and echoing heartbeats while a large merge runs.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <sketchsgd/server/engine.hpp>

namespace sketchsgd::ps {

struct ServerOptions {
  JobConfig job;
  std::string bind = "tcp://127.0.0.1:5555";  ///< "tcp://127.0.0.1:*" picks a free port
  std::string metrics;                        ///< JSON lines, one per round; empty: none
  /// Checkpoint file (every job.checkpoint_every rounds and at the end; resumed from when it
  /// exists); empty: none.
  std::string checkpoint;
  bool status = true;  ///< one-line live status on stderr (a terminal), periodic lines otherwise
  bool quiet = false;  ///< no log lines (tests)
  uint32_t inbox = 0;  ///< messages queued for the merge thread (0: 2·W + 16)
  Millis linger{2000};
  /// CURVE: the server's Z85 secret key; with it only workers whose public key is listed in
  /// curve_clients connect, each bound to its rank. Empty: no encryption.
  std::string curve_secret;
  std::vector<std::pair<uint32_t, std::string>> curve_clients;
  Millis finish_grace{500};  ///< after the last round, how long to keep serving late pulls
  /// and how long at most to wait past it for the workers' goodbyes (each says Bye once it
  /// holds the last update; dead workers are not waited for)
  Millis finish_wait{30000};
  /// A backup: the primary's endpoint. It holds the primary's state round by round and takes
  /// over when a worker comes to it (server/replication.hpp). Empty: a primary (any server may
  /// be followed by a backup).
  std::string replica_of;
};

class Server {
 public:
  explicit Server(ServerOptions opts);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// Binds (throws Error if the address is taken) and resumes from the checkpoint when one exists.
  void start();
  /// Serves until the job's last round is done or stop() is called. Returns the rounds run.
  uint64_t run();
  /// Thread-safe; run() returns soon after.
  void stop() { stop_ = true; }
  /// The bound endpoint (the real port when bound to "*").
  const std::string& endpoint() const { return endpoint_; }
  /// The engine, for inspection after run() returns.
  const Engine& engine() const { return *engine_; }
  /// Why run() returned early: a backup took over from this server (empty: it did not).
  const std::string& deposed() const { return deposed_; }

 private:
  struct Impl;
  ServerOptions opts_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Impl> impl_;
  std::string endpoint_;
  std::string deposed_;
  std::atomic<bool> stop_{false};
};

}  // namespace sketchsgd::ps
