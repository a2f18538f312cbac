// The simulator's world, private to tests/sim: every server, backup and worker of one job as the
// real Engine, Replica and Session on one simulated clock and network (world.cpp), the faults a
// seed draws (faults.cpp) and the invariants checked after every event (invariants.cpp).
#pragma once

#include "sim/network.hpp"
#include "sim/sim.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <queue>
#include <random>
#include <set>
#include <sstream>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/sample.hpp>
#include <sketchsgd/ps/liveness.hpp>
#include <sketchsgd/ps/shards.hpp>
#include <sketchsgd/server/checkpoint.hpp>
#include <sketchsgd/server/replica.hpp>
#include <sketchsgd/worker/session.hpp>
#include "support/ps_job.hpp"
#include "support/ps_synthetic.hpp"

namespace sketchsgd::ps::sim {

using namespace std::chrono_literals;

inline uint64_t fnv(std::span<const uint8_t> b, uint64_t h = 1469598103934665603ull) {
  for (uint8_t x : b) h = (h ^ x) * 1099511628211ull;
  return h;
}
inline uint64_t hash_of(std::span<const float> v, std::span<const uint8_t> extra = {}) {
  return fnv(extra, fnv({reinterpret_cast<const uint8_t*>(v.data()), v.size_bytes()}));
}
inline double ms(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

inline bool is_heartbeat(const Frames& f, uint64_t job, Envelope* e = nullptr) {
  if (f.size() != 1) return false;
  try {
    const Envelope x = decode_envelope(f[0].bytes(), 0);
    if (e) *e = x;
    return x.type == Type::Heartbeat && x.job == job;
  } catch (const Error&) {
    return false;
  }
}

struct Violation : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class World {
 public:
  World(const Scenario& s, uint64_t seed, bool keep_trace, bool faults);

  Report go();

  /// The model every worker holds at the end (rounds kinds; a federated job's last clients),
  /// for the fault-free reference.
  std::vector<float> final_model() const;
  void expect(std::vector<float> ref) { reference_ = std::move(ref); }

 private:
  void at(Clock::time_point t, std::function<void()> f) { clock_.at(t, std::move(f)); }

  void note(const std::string& s);
  void fault(const std::string& s);

  // ---- nodes: servers 0..S-1, then workers (numbers for partitions and pauses)
  enum class SState { Up, Down, Stopped };
  enum class WState { Idle, Joining, Working, Done, Failed };

  struct Server {
    std::string name;
    uint32_t shard = 0;
    bool backup = false;
    int primary = -1;  // its primary's index (a backup)
    std::unique_ptr<Engine> engine;
    std::unique_ptr<Replica> replica;
    SState state = SState::Down;
    std::string exit;
    uint32_t incarnation = 0;
    std::map<PeerId, int> peers;  // connections of this incarnation
    int up = -1;                  // a backup's connection to its primary
    Liveness alive;
    Clock::time_point last_up_send{};
    bool answered = false;
    std::optional<Bytes> disk;     // the checkpoint file
    std::optional<Bytes> writing;  // a snapshot on its way to the disk
    uint64_t max_epoch = 0;        // the highest it reached
  };

  struct Part {
    std::unique_ptr<Compressor> codec;
    std::unique_ptr<Session> session;
    std::vector<int> endpoints;  // server indices: primary, then backup
    size_t current = 0;
    int conn = -1;
    Liveness alive;
    Clock::time_point last_send{};
    bool elsewhere = false;
    bool finished = false;  // JobFinished
    bool joined = false;    // the first registration is done (Client::join returned)
    uint64_t seen_round = UINT64_MAX;
  };

  struct Worker {
    uint32_t rank = 0;  // a federated client's id
    uint64_t join = 0;  // a federated client's round
    std::vector<Part> parts;
    std::vector<ShardPlan> plan;
    WState state = WState::Idle;
    std::string exit;
    Clock::time_point progress_at{};
    bool computing = false;
    std::vector<float> full() const {
      std::vector<float> v;
      for (const auto& p : parts) {
        const auto s = p.session->params();
        v.insert(v.end(), s.begin(), s.end());
      }
      return v;
    }
  };

  /// What a connection is to the job (the network knows only its two nodes).
  struct Conn {
    bool from_server = false;  // a backup's link to its primary
    int client = 0;            // worker or server index
    int part = 0;              // the worker's shard
    int server = 0;
    uint32_t incarnation = 0;  // of the server when it last heard this connection
    uint32_t gen = 0;          // the server-side identity (new after a server restart)
    int id = 0;
    PeerId peer() const { return "c" + std::to_string(id) + "." + std::to_string(gen); }
  };

  int node_of_worker(int w) const { return int(servers_.size()) + w; }

  void add_server(uint32_t shard, bool backup);

  void add_worker(uint32_t rank, uint64_t join = 0);

  // ---- connections
  int open(bool from_server, int client, int part, int server);
  void close(int id) { net_.close(id); }
  void send(int id, bool up, Frames f) { net_.send(id, up, std::move(f)); }
  Clock::time_point paused_until(int node) const { return net_.paused_until(node); }

  // ---- servers
  void start_server(int i, bool restart);

  void up_send(int i, Frames f);

  void write(int i, Bytes b);

  void stop(int i, const std::string& why, bool clear_error);

  void crash(int i);

  void route(int i, std::vector<Outgoing>& out);

  void after_server(int i, std::vector<Outgoing>& out, std::vector<Frames>& up);

  void to_server(int id, const Frames& f);

  void tick_server(int i, uint32_t inc);

  void from_primary(int id, const Frames& f);

  /// A round ended on server i (Hooks::round: the model is that after it).
  void accepted(int i, const RoundMetrics& m);
  bool rollback_ok() const { return sc_.kind == Kind::Restart || federated(); }

  // ---- workers
  void start_worker(int w);

  void flush(int w, int p, Session::Outbox& out);

  void fail(int w, const std::string& why);

  void to_client(int id, const Frames& f);

  bool async() const { return sc_.kind == Kind::Async; }
  bool federated() const { return sc_.kind == Kind::Federated; }
  /// The push after a worker's last: the job's rounds, or a federated client's one.
  uint64_t last_push(const Worker& x) const { return federated() ? x.join + 1 : sc_.rounds; }

  /// The training loop's next move: a push when every shard lets it, goodbye when done.
  void step(int w);

  void tick_worker(int w);

  // ---- faults
  void schedule_faults(uint64_t seed);
  std::string node_name(int n) const;

  // ---- invariants
  /// Every worker is done or failed, and every server has stopped, or six minutes later is
  /// still serving with its reason logged (a primary cut off while its backup finished the job,
  /// that backup then killed, waits for its workers: nobody is left to tell it), and its backup
  /// with it. A backup still following a primary that is gone stops by itself (Replica::done).
  bool all_done();

  void sabotage();

  /// After every event.
  void check();

  void final_checks();
  /// Every round's last outcome had all of its workers (the answers of a worker that died
  /// after its push are left out, whatever the policy).
  bool whole() const;
  /// Why no server of the shard can serve every worker (empty: one can). One that can is up,
  /// holds the state (a backup that never got it does not), every round the workers have
  /// applied (a backup its primary went on without does not: it does not take over) and the
  /// latest epoch (a primary whose backup took over and was then killed sends the workers that
  /// registered there on); a backup still following takes over only once every worker has come
  /// (one that left the job holds it back), unless the job's last round is done there.
  std::string unservable(uint32_t shard) const;

  std::string states() const;

  Scenario sc_;
  std::mt19937_64 rng_;
  bool keep_;
  uint32_t shards_ = 1;
  bool replicated_ = true;
  std::vector<ShardPlan> plan_;
  std::vector<float> init_;
  std::vector<JobConfig> cfgs_;
  std::vector<std::unique_ptr<Server>> servers_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<Conn> conns_;  // by the network's numbers

  Clockwork clock_;
  Network net_{clock_, rng_, sc_.duplicates,
               [this](int id, bool up, Frames f) { up ? to_server(id, f) : to_client(id, f); }};
  Clock::time_point start_ = clock_.now();
  Clock::time_point now_ = start_;
  uint64_t events_ = 0;
  uint32_t faults_ = 0;
  std::vector<std::string> trace_;
  bool server_errors_ = false;
  bool sabotaged_ = false;
  std::string refusal_;  // why a server refused to start
  std::string cause_;    // why the workers could not finish
  std::optional<Clock::time_point> workers_done_at_;

  std::map<std::tuple<uint32_t, uint64_t, uint64_t>, std::optional<int>> acceptor_;
  std::map<std::pair<uint32_t, uint64_t>, std::set<uint64_t>> committed_;
  std::map<std::pair<uint32_t, uint64_t>, uint64_t> primary_hash_;
  // per (shard, round): the epoch that ended it last, and whether every worker's push was in it
  std::map<std::pair<uint32_t, uint64_t>, std::pair<uint64_t, bool>> complete_;
  std::set<std::pair<uint32_t, uint64_t>>
      rerun_;  // rounds a restart from an older checkpoint ran again
  std::map<uint32_t, std::pair<uint64_t, uint64_t>> last_;  // per shard: the latest (epoch, round)
  std::map<uint32_t, uint64_t> seen_version_;  // per shard: the latest version a worker applied
  std::optional<std::vector<float>> reference_;
};

}  // namespace sketchsgd::ps::sim
