#include <sketchsgd/server/async_pushes.hpp>

#include <algorithm>

#include <sketchsgd/core/error.hpp>

namespace sketchsgd::ps {

using Worker = Roster::Worker;

AsyncPushes::AsyncPushes(const Parts& parts) : PushHandle(parts) {}

void AsyncPushes::push(uint32_t rank, const Envelope& e, const Frames& f, Clock::time_point,
                       std::vector<Outgoing>& out) {
  const auto msg = f[1].bytes();
  Worker& w = roster_[rank];
  if (e.round < w.next_push) {
    // Sent again after a reconnect: its reply was lost (the last push), or the worker has moved
    // on since (an older one). Applied once either way.
    if (e.round + 1 == w.next_push && !w.ack.empty())
      replies_.resend(rank, w.ack, w.next_push - 1, out);
    hooks_.log("rank " + std::to_string(rank) + " sent push #" + std::to_string(e.round) +
               " again (next expected #" + std::to_string(w.next_push) + ")");
    return;
  }
  if (store_.finished()) return replies_.finished(w.peer, e, out);
  if (e.round > w.next_push)
    return replies_.refuse(w.peer, e, true,
                           "push #" + std::to_string(e.round) + " of rank " + std::to_string(rank) +
                               " comes before #" + std::to_string(w.next_push) +
                               " (register again and fetch the model)",
                           out);
  SKETCHSGD_REQUIRE(from(msg, rank, e.round), ProtocolError, "push #", e.round, " of rank ", rank,
                    " carries a message with another sender or push number");
  const uint64_t age = store_.round() - w.base - w.own;
  metrics_ = RoundMetrics{};
  metrics_.round = store_.round();
  metrics_.bytes_up.assign(cfg_.world, 0);
  metrics_.bytes_up[rank] = msg.size();
  metrics_.dense_bytes = cfg_.dim * 4 + kHeaderBytes;
  metrics_.pusher = rank;
  metrics_.age = age;
  w.next_push = e.round + 1;
  auto refuse_push = [&](const std::string& why) {
    // Nothing applied: the worker's codec keeps the push in its error feedback.
    hooks_.log("rank " + std::to_string(rank) + " push #" + std::to_string(e.round) +
               " not applied: " + why);
    replies_.count_refusal();
    w.ack = {Frame(), Frame::own(encode_text(why.substr(0, kMaxText)))};
    w.ack[0] = replies_.to(rank, Type::Abort, e.round);
    replies_.resend(rank, w.ack, w.next_push - 1, out);
  };
  if (cfg_.max_age() && age > cfg_.max_age())
    return refuse_push("it is " + std::to_string(age) + " updates old (the bound is " +
                       std::to_string(cfg_.max_age()) + "): fetch the model");
  const auto t0 = Clock::now();
  Message m;
  try {
    store_.aggregator().add(msg);
    m = store_.aggregator().finish();
  } catch (const Error& ex) {
    store_.aggregator().abandon();
    return refuse_push(std::string("decode failed: ") + ex.what());
  }
  const Frame payload = Frame::own(std::move(m).release());
  const float lr =
      cfg_.lr * w.weight / float(cfg_.world) / (cfg_.age_scaled() ? float(1 + age) : 1.0f);
  try {
    store_.apply(payload.bytes(), lr);
  } catch (const Error& ex) {
    return refuse_push(std::string("update rejected: ") + ex.what());
  }
  ++w.own;
  const UpdateInfo info{
      lr, 1, store_.round() + 1, uint32_t(std::min<uint64_t>(age, UINT32_MAX)), rank, e.round};
  const Frame info_frame = Frame::own(encode(info));
  w.ack = {replies_.to(rank, Type::Update, e.round), info_frame, payload};
  replies_.resend(rank, w.ack, w.next_push - 1, out);
  metrics_.contributors = 1;
  metrics_.merge_ms = ms_between(t0, Clock::now());
  metrics_.bytes_down_each = payload.size();
  hooks_.round(metrics_);
  commit_({envelope(Type::Update, cfg_.job, store_.round(), 0, 0), info_frame, payload}, out);
}

void AsyncPushes::answer(uint32_t rank, const Envelope& e, const Frames&) {
  if (e.round < store_.round()) return;  // as a round job's answer of a closed round
  throw ProtocolError("answer of round " + std::to_string(e.round) + " from rank " +
                      std::to_string(rank) + " while no query of that round is open");
}

void AsyncPushes::followed(const CommitInfo& c, const Frames& outcome) {
  if (c.outcome != Type::Update || c.info.pusher >= cfg_.world) return;
  // Which push this was: sent again to this server after a failover, it is answered, not
  // applied twice.
  Worker& w = roster_[c.info.pusher];
  w.numbered = true;
  w.next_push = c.info.push + 1;
  ++w.own;
  w.ack = {envelope(Type::Update, cfg_.job, c.info.push, c.info.pusher, 0), outcome[1], outcome[2]};
}

}  // namespace sketchsgd::ps
