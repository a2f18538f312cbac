#include <sketchsgd/worker/client.hpp>

#include <algorithm>
#include <exception>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/ops.hpp>
#include <sketchsgd/ps/log.hpp>
#include <sketchsgd/ps/shards.hpp>
#include "link.hpp"

namespace sketchsgd::ps {

// One server of the job (the only one, or one shard): its codec, round logic and link.
struct Client::Shard {
  Shard(ClientOptions opts, Compressor& codec, std::span<const float> initial_params)
      : codec(codec) {
    if (!opts.log) {
      const std::string who =
          "worker " + std::to_string(opts.rank) +
          (opts.shard.count > 1 ? " shard " + std::to_string(opts.shard.index) : std::string());
      auto log = std::make_shared<Log>(who, false);
      opts.log = [log](const std::string& s) { (*log)(s); };
    }
    session = std::make_unique<Session>(std::move(opts), codec, initial_params);
    const ClientOptions& o = session->options();
    link = std::make_unique<Link>(o, max_frame_bytes(codec) + 64, o.log);
  }

  /// Registers and waits for the model.
  void join() {
    Session::Outbox out;
    session->hello(out);
    flush(out);
    const auto deadline = Clock::now() + session->options().timeout;
    while (!session->synced()) {
      Received ev;
      if (!next(deadline, ev)) timeout("registration");
      if (ev.reconnected)
        session->hello(out);
      else
        session->handle_registration(ev.frames, Clock::now(), out);
      flush(out);
    }
  }

  void bye() {
    Session::Outbox out;
    session->bye(out);
    flush(out);
  }

  /// Sends what the session queued.
  void flush(Session::Outbox& out) {
    for (auto& f : out) link->io->post(Outgoing{{}, std::move(f)});
    out.clear();
    link->hb_ms = session->heartbeat().count();
    link->session = session->session();
    link->rank = session->rank();
    if (session->take_elsewhere()) link->elsewhere = true;
  }

  [[noreturn]] void timeout(const std::string& what) const {
    const ClientOptions& o = session->options();
    const auto promised = session->promised();
    throw TimeoutError(
        "worker " + std::to_string(o.rank) + ": no answer from " + o.server + " for " + what +
        " within " + std::to_string(o.timeout.count()) + " ms" +
        (promised ? " (it answered a backup taking over as epoch " + std::to_string(*promised) +
                        " and so keeps away from older servers; that backup never came back)"
                  : ""));
  }

  /// The next event of the link (a server message, or the news that the socket was replaced),
  /// running the session's timers meanwhile; false when the deadline passed first.
  bool next(Clock::time_point deadline, Received& ev) {
    for (;;) {
      if (!link->backlog.empty()) {
        ev = std::move(link->backlog.front());
        link->backlog.pop_front();
        return true;
      }
      Session::Outbox out;
      session->tick(Clock::now(), out);  // e.g. a Hello again after a transient refusal
      flush(out);
      auto wake = deadline;
      if (const auto t = session->next_tick()) wake = std::min(wake, *t);
      auto got = link->io->take(std::max(wake, Clock::now()));
      if (const auto failure = link->io->failure()) std::rethrow_exception(failure);
      for (auto& m : got) link->backlog.push_back(std::move(m));
      if (link->backlog.empty() && Clock::now() >= deadline) return false;
    }
  }

  /// Hands an event to the session; true when the step must return (resynchronised).
  bool dispatch(Received& ev, StepResult& res) {
    Session::Outbox out;
    bool done = false;
    if (ev.reconnected)
      session->hello(out);  // what went out before may be lost: register again, then resend
    else
      done = session->handle(ev.frames, Clock::now(), out, res);
    flush(out);
    return done;
  }

  StepResult step(std::span<const float> grad) {
    StepResult res;
    push(grad, res);
    settle(res);
    return res;
  }

  /// Encodes and sends the push of the next round.
  void push(std::span<const float> grad, StepResult& res) {
    Session::Outbox out;
    session->push(grad, out, res);
    flush(out);
    res.pushed_at = Clock::now();
  }

  /// Handles the server's messages (queries answered, updates applied) until at most
  /// `staleness` pushes are unanswered.
  void settle(StepResult& res) {
    const auto deadline = Clock::now() + session->options().timeout;
    for (;;) {
      Received ev;
      if (!session->must_wait()) {
        // Far enough: take whatever already arrived, without waiting.
        if (!next(Clock::now(), ev)) return;
      } else if (!next(deadline, ev)) {
        timeout("round " + std::to_string(session->round()));
      }
      if (dispatch(ev, res)) return;
    }
  }

  StepResult sync() {
    StepResult res;
    res.round = session->round();
    const auto deadline = Clock::now() + session->options().timeout;
    while (!session->settled()) {
      Received ev;
      if (!next(deadline, ev)) timeout("round " + std::to_string(session->round()));
      if (dispatch(ev, res)) break;
    }
    return res;
  }

  std::unique_ptr<Compressor> own;  // a shard's codec of its range (the job's codec: none)
  Compressor& codec;
  std::unique_ptr<Session> session;
  std::unique_ptr<Link> link;
  bool finished = false;  // its job ended: left out of later steps
};

Client::Client(ClientOptions opts, std::unique_ptr<Compressor> codec,
               std::span<const float> initial_params)
    : codec_(std::move(codec)) {
  SKETCHSGD_REQUIRE(codec_ != nullptr, InvalidArgument, "client: no codec");
  const std::vector<std::string> servers = split_endpoints(opts.server);
  if (servers.size() == 1) {
    shards_.push_back(std::make_unique<Shard>(std::move(opts), *codec_, initial_params));
    shards_[0]->join();
    return;
  }
  SKETCHSGD_REQUIRE(servers.size() <= 1024, InvalidArgument, "client: ", servers.size(),
                    " shards (at most 1024)");
  SKETCHSGD_REQUIRE(opts.shard == ShardId{}, InvalidArgument,
                    "client: opts.shard is set per shard by the client itself");
  SKETCHSGD_REQUIRE(initial_params.empty() || initial_params.size() == codec_->dim(),
                    InvalidArgument, "client: ", initial_params.size(),
                    " initial parameters for a model of ", codec_->dim());
  const auto plan = plan_shards(codec_->spec(), codec_->dim(), uint32_t(servers.size()));
  for (const auto& p : plan) {
    ClientOptions o = opts;
    o.server = servers[p.id.index];
    o.shard = p.id;
    auto own = make_compressor(p.spec, p.dim, codec_->device());
    const auto init =
        initial_params.empty() ? initial_params : initial_params.subspan(p.id.begin, p.dim);
    auto s = std::make_unique<Shard>(std::move(o), *own, init);
    s->own = std::move(own);
    shards_.push_back(std::move(s));
  }
  params_ = Buffer<float>(codec_->dim(), codec_->device());
  // In shard order, as every worker does: rank 0 initialises each shard as it comes to it.
  for (auto& s : shards_) s->join();
  assemble();
}

Client::~Client() {
  // Says goodbye; each link then closes within its socket's linger.
  for (auto& s : shards_)
    if (s->link && s->session) s->bye();
  shards_.clear();
}

template <class F>
void Client::each(std::vector<StepResult>& res, std::vector<std::exception_ptr>& errors, F&& f) {
  for (size_t i = 0; i < shards_.size(); ++i) {
    if (shards_[i]->finished || errors[i]) continue;
    try {
      f(*shards_[i], res[i]);
    } catch (const JobFinished&) {
      shards_[i]->finished = true;
      errors[i] = std::current_exception();
    } catch (...) {
      errors[i] = std::current_exception();
    }
  }
}

void Client::rethrow(const std::vector<std::exception_ptr>& errors) const {
  const bool all_finished =
      std::all_of(shards_.begin(), shards_.end(), [](auto& s) { return s->finished; });
  for (const auto& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const JobFinished&) {
      if (all_finished) throw;  // else: that shard is left out from now on
    }
  }
}

std::vector<bool> Client::live() const {
  std::vector<bool> v;
  for (const auto& s : shards_) v.push_back(!s->finished);
  return v;
}

void Client::assemble() {
  if (shards_.size() == 1) return;
  for (const auto& s : shards_) {
    const ShardId& id = s->session->options().shard;
    ops::copy(codec_->device(), params_.span().subspan(id.begin, s->codec.dim()),
              s->session->params());
  }
}

namespace {

/// The results of the shards that took part as one: bytes summed, the most eventful outcome,
/// the lowest round.
StepResult merge(const std::vector<StepResult>& all, const std::vector<bool>& took_part) {
  std::vector<StepResult> parts;
  for (size_t i = 0; i < all.size(); ++i)
    if (took_part[i]) parts.push_back(all[i]);
  if (parts.empty()) return StepResult{};
  auto rank = [](StepResult::Outcome o) {
    switch (o) {
      case StepResult::Outcome::Resynced:
        return 3;
      case StepResult::Outcome::Aborted:
        return 2;
      case StepResult::Outcome::Pending:
        return 1;
      case StepResult::Outcome::Updated:
        return 0;
    }
    return 0;
  };
  StepResult m = parts.front();
  for (size_t i = 1; i < parts.size(); ++i) {
    const StepResult& p = parts[i];
    if (rank(p.outcome) > rank(m.outcome)) m.outcome = p.outcome;
    m.round = std::min(m.round, p.round);
    m.contributors = std::min(m.contributors, p.contributors);
    m.bytes_up += p.bytes_up;
    m.bytes_down += p.bytes_down;
    m.fetched = m.fetched && p.fetched;  // every shard's model came
    m.age = std::max(m.age, p.age);
    m.pushed_at = std::max(m.pushed_at, p.pushed_at);
  }
  return m;
}

}  // namespace

StepResult Client::step(std::span<const float> grad) {
  if (shards_.size() == 1) return shards_[0]->step(grad);
  SKETCHSGD_REQUIRE(grad.size() == codec_->dim(), InvalidArgument, "client: gradient of ",
                    grad.size(), " values for a model of ", codec_->dim());
  // Checked whole first, so no shard gets a part of a gradient the others refuse.
  const size_t bad = ops::find_nonfinite(codec_->device(), scratch_, grad);
  SKETCHSGD_REQUIRE(bad == kernels::kNone, NonFiniteError, "client: gradient value ", bad,
                    " is not finite");
  // Every part goes out first, then each shard's round is settled in shard order (every worker
  // keeps that order, so a two-round codec's queries cannot wait on each other): the rounds run
  // at once on the shards' links while the codecs' work stays on this thread, where their
  // kernels' own threads (OpenMP) do not compete with other shards' for the cores.
  std::vector<StepResult> parts(shards_.size());
  std::vector<std::exception_ptr> errors(shards_.size());
  std::vector<bool> took_part = live();
  each(parts, errors, [&](Shard& s, StepResult& r) {
    s.push(grad.subspan(s.session->options().shard.begin, s.codec.dim()), r);
  });
  each(parts, errors, [](Shard& s, StepResult& r) { s.settle(r); });
  assemble();  // the shards that completed their round moved on
  rethrow(errors);
  for (size_t i = 0; i < errors.size(); ++i)
    if (errors[i]) took_part[i] = false;  // finished during this call
  return merge(parts, took_part);
}

StepResult Client::sync() {
  if (shards_.size() == 1) return shards_[0]->sync();
  std::vector<StepResult> parts(shards_.size());
  std::vector<std::exception_ptr> errors(shards_.size());
  std::vector<bool> took_part = live();
  each(parts, errors, [](Shard& s, StepResult& r) { r = s.sync(); });
  assemble();
  rethrow(errors);
  for (size_t i = 0; i < errors.size(); ++i)
    if (errors[i]) took_part[i] = false;  // finished during this call
  return merge(parts, took_part);
}

StepResult Client::fetch() {
  std::vector<StepResult> parts(shards_.size());
  std::vector<std::exception_ptr> errors(shards_.size());
  std::vector<bool> took_part = live();
  // Every shard asked first, then each waited for: the models come at once.
  each(parts, errors, [](Shard& s, StepResult&) {
    Session::Outbox out;
    s.session->fetch(out);
    s.flush(out);
  });
  each(parts, errors, [](Shard& s, StepResult& r) { s.settle(r); });
  assemble();
  rethrow(errors);
  for (size_t i = 0; i < errors.size(); ++i)
    if (errors[i]) took_part[i] = false;
  return merge(parts, took_part);
}

bool Client::async() const {
  return shards_[0]->session->async();
}

std::span<const float> Client::params() const {
  return shards_.size() == 1 ? shards_[0]->session->params() : params_.span();
}

uint64_t Client::round() const {
  uint64_t r = UINT64_MAX;
  for (const auto& s : shards_) r = std::min(r, s->session->round());
  return r;
}

uint64_t Client::next_push() const {
  uint64_t r = UINT64_MAX;
  for (const auto& s : shards_) r = std::min(r, s->session->next_push());
  return r;
}

uint32_t Client::staleness() const {
  return shards_[0]->session->staleness();
}
uint32_t Client::rank() const {
  return shards_[0]->session->rank();
}

uint64_t Client::shard_round(size_t i) const {
  SKETCHSGD_REQUIRE(i < shards_.size(), InvalidArgument, "client: shard ", i, " of ",
                    shards_.size());
  return shards_[i]->session->round();
}

}  // namespace sketchsgd::ps
