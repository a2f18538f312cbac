// The parameter server's Engine on a fake network with a fake clock: Net delivers messages and
// keeps what the server sent to each peer; FakeWorker speaks the worker's side of the protocol
// (registration, pull, push, answers, updates) with its own codec. For the Engine's tests.
#pragma once

#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include <sketchsgd/server/engine.hpp>
#include <sketchsgd/server/replication.hpp>

namespace sketchsgd::ps {

struct Net {
  explicit Net(JobConfig cfg, std::function<void(Checkpoint, bool)> checkpoint = {})
      : engine(std::move(cfg), hooks(std::move(checkpoint))) {}
  static Hooks hooks(std::function<void(Checkpoint, bool)> checkpoint) {
    Hooks h;
    h.log = [](const std::string&) {};
    h.checkpoint = std::move(checkpoint);
    return h;
  }

  // Through the replication's primary side, as the server runs it: without a backup it is the
  // engine alone; with one (replication_test), a round's end waits for its acknowledgement.
  void deliver(const PeerId& peer, const Frames& f) {
    std::vector<Outgoing> out;
    primary.handle(peer, f, now, out);
    route(out);
  }
  void tick(Millis dt) {
    now += dt;
    std::vector<Outgoing> out;
    primary.tick(now, out);
    route(out);
  }
  void route(std::vector<Outgoing>& out) {
    for (auto& o : out) inbox[o.peer].push_back(std::move(o.frames));
  }
  /// The next message the server sent to peer (fails the test when there is none).
  std::optional<std::pair<Envelope, Frames>> next(const PeerId& peer) {
    auto& q = inbox[peer];
    if (q.empty()) return std::nullopt;
    Frames f = std::move(q.front());
    q.pop_front();
    return std::make_pair(decode_envelope(f[0].bytes(), f.size() - 1), std::move(f));
  }

  Engine engine;
  Primary primary{engine, [](const std::string&) {}};
  Clock::time_point now = Clock::time_point{} + std::chrono::hours(1);
  std::map<PeerId, std::deque<Frames>> inbox;
};

inline Frame env(Type t, uint64_t job, uint64_t round, uint32_t rank, uint64_t session = 0) {
  return Frame::own(encode(Envelope{t, job, round, rank, 0, session}));
}
inline Frame bytes_frame(std::span<const uint8_t> b) {
  return Frame::own(Bytes(b.begin(), b.end()));
}

/// A worker, or a federated client (cfg.population() > 0): then `id` is the client's id, `round`
/// the round it registers for, and `rank` the slot its Welcome gives it.
struct FakeWorker {
  FakeWorker(uint32_t r, const JobConfig& cfg, uint64_t join_round = 0)
      : rank(r),
        id(r),
        peer("peer-" + std::to_string(r)),
        job(cfg.job),
        world(cfg.world),
        population(cfg.population()),
        shard(cfg.shard),
        codec(make_compressor(cfg.spec, cfg.dim)),
        round(join_round) {}

  void hello(Net& net, uint32_t as_world = 0) {
    const HelloInfo h{as_world ? as_world : world, codec->dim(), codec->spec(), population, shard};
    net.deliver(peer, {env(Type::Hello, job, round, id), Frame::own(encode(h))});
  }
  /// Registers, initialises (rank 0) and pulls the model.
  void join(Net& net, std::span<const float> init) {
    hello(net);
    auto w = net.next(peer);
    ASSERT_TRUE(w);
    ASSERT_EQ(w->first.type, Type::Welcome);
    session = w->first.session;
    rank = w->first.rank;
    if (!decode_welcome(w->second[1].bytes()).has_model && (rank == 0 || population) &&
        !init.empty())
      net.deliver(
          peer, {mine(Type::Init, round),
                 bytes_frame({reinterpret_cast<const uint8_t*>(init.data()), init.size_bytes()})});
    if (!population)
      net.deliver(peer, {mine(Type::Pull, round)});  // a client's model comes unasked
  }
  /// Takes a Model message if one is queued.
  bool take_model(Net& net) {
    auto m = net.next(peer);
    if (!m || m->first.type != Type::Model) return false;
    params.resize(codec->dim());
    std::memcpy(params.data(), m->second[1].bytes().data(), params.size() * 4);
    round = m->first.round;
    return true;
  }
  void push(Net& net, std::span<const float> g) {
    const Message m = codec->encode(g, round, rank);
    net.deliver(peer, {mine(Type::Push, round), bytes_frame(m)});
  }
  /// Handles what the server sent: answers queries, applies the update. Returns the type that
  /// ended the round (Update or Abort) or nothing.
  std::optional<Type> settle(Net& net) {
    while (auto m = net.next(peer)) {
      const auto& [e, f] = *m;
      if (e.type == Type::Query) {
        const Message a = codec->answer(f[1].bytes(), rank);
        net.deliver(peer, {mine(Type::Answer, e.round), bytes_frame(a)});
      } else if (e.type == Type::Update && e.round == round) {
        const UpdateInfo info = decode_update_info(f[1].bytes());
        std::vector<float> step(codec->dim());
        codec->apply(f[2].bytes(), step);
        kernels::cpu::axpy(params.data(), step.data(), params.size(), -info.lr);
        ++round;
        return Type::Update;
      } else if (e.type == Type::Abort && e.round == round) {
        ++round;
        return Type::Abort;
      }
    }
    return std::nullopt;
  }

  /// An envelope of this worker's current registration.
  Frame mine(Type t, uint64_t r) const { return env(t, job, r, rank, session); }

  uint32_t rank;  // on the wire: the worker's rank, or the client's slot once welcomed
  uint32_t id;    // in a Hello
  PeerId peer;
  uint64_t job;
  uint32_t world;
  uint32_t population;
  ShardId shard;         // a sharded job's: the server's
  uint64_t session = 0;  // from the Welcome
  std::unique_ptr<Compressor> codec;
  std::vector<float> params;
  uint64_t round = 0;
};

}  // namespace sketchsgd::ps
