#include <sketchsgd/worker/session.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>

#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/cpu.hpp>

namespace sketchsgd::ps {

using Millis = std::chrono::milliseconds;

struct Session::Parsed {
  Envelope env;
  const Frames& frames;
};

Session::Session(ClientOptions opts, Compressor& codec, std::span<const float> initial_params)
    : opts_(std::move(opts)),
      codec_(codec),
      outer_(std::make_unique<OuterStep>(OuterOptions{}, codec.dim(), codec.device())),
      slot_(opts_.rank),
      round_(opts_.join_round),
      next_push_(opts_.join_round),
      heartbeat_(opts_.heartbeat) {
  const bool federated = opts_.population != 0;
  SKETCHSGD_REQUIRE(opts_.world >= 1 && opts_.rank < (federated ? opts_.population : opts_.world),
                    InvalidArgument, "client: ", federated ? "id " : "rank ", opts_.rank,
                    " outside ", federated ? "a population of " : "a world of ",
                    federated ? opts_.population : opts_.world);
  SKETCHSGD_REQUIRE(!federated || opts_.world <= opts_.population, InvalidArgument,
                    "client: ", opts_.world, " clients a round from a population of ",
                    opts_.population);
  SKETCHSGD_REQUIRE(federated || opts_.join_round == 0, InvalidArgument,
                    "client: join_round is for federated clients (population > 0)");
  SKETCHSGD_REQUIRE(opts_.timeout.count() >= 1 && opts_.heartbeat.count() >= 1, InvalidArgument,
                    "client: timeout and heartbeat must be ≥ 1 ms");
  SKETCHSGD_REQUIRE(std::isfinite(opts_.weight) && opts_.weight > 0.0f && opts_.weight <= 1e6f,
                    InvalidArgument, "client: weight must be in (0, 10^6], got ", opts_.weight);
  if (!opts_.log) opts_.log = [](const std::string&) {};
  if (federated ? !initial_params.empty() : opts_.rank == 0) {
    SKETCHSGD_REQUIRE(initial_params.size() == codec_.dim(), InvalidArgument,
                      "client: rank 0 needs initial parameters of length ", codec_.dim(), ", got ",
                      initial_params.size());
    init_.resize(initial_params.size());
    detail::copy_bytes(init_.data(), initial_params.data(), initial_params.size_bytes(),
                       codec_.device());
    const size_t bad = kernels::cpu::find_nonfinite(init_.data(), init_.size());
    SKETCHSGD_REQUIRE(bad == kernels::kNone, NonFiniteError,
                      "client: non-finite initial parameter at ", bad);
  }
}

Frame Session::envelope(Type t, uint64_t round) const {
  return Frame::own(encode(Envelope{t, opts_.job, round, slot_, 0, session_}));
}

void Session::hello(Outbox& out) {
  registered_ = false;
  synced_ = false;
  fetching_ = false;
  behind_ = false;
  session_ = 0;
  hello_at_.reset();
  slot_ = opts_.rank;  // a Hello names the worker's rank, or the federated client's id
  // A federated client registers for its round, also when it checked in ahead and holds the
  // model of the round before (a Hello naming that round would ask for a slot there).
  const uint64_t round = opts_.population ? std::max(round_, opts_.join_round) : round_;
  out.push_back({envelope(Type::Hello, round), Frame::own(encode(hello_info()))});
}

HelloInfo Session::hello_info() const {
  ShardId shard = opts_.shard;
  if (shard.model_dim == 0) shard.model_dim = codec_.dim();
  // While it has promised a backup to keep away from the old epoch, the worker says it is at the
  // new one: a server of the old one sends it on (Engine refuses a Hello of a later epoch).
  const uint64_t epoch = promise_ ? std::max(epoch_, promise_->epoch) : epoch_;
  return HelloInfo{opts_.world, codec_.dim(), codec_.spec(), opts_.population,
                   shard,       epoch,        opts_.weight};
}

void Session::bye(Outbox& out) const {
  // A federated client whose round has ended holds no slot any more: nothing to say.
  const bool done = opts_.population != 0 && round_ > opts_.join_round;
  if (registered_ && !done) out.push_back({envelope(Type::Bye, round_)});
}

void Session::tick(Clock::time_point now, Outbox& out) {
  if (hello_at_ && now >= *hello_at_) hello(out);
}

std::optional<Session::Parsed> Session::parse(const Frames& frames) const {
  if (frames.empty()) return std::nullopt;
  try {
    Envelope e = decode_envelope(frames[0].bytes(), frames.size() - 1);
    // A federated client's Welcome names the slot it takes (any rank of the round).
    const bool slot_given =
        opts_.population != 0 && e.type == Type::Welcome && e.rank < opts_.world;
    SKETCHSGD_REQUIRE(e.job == opts_.job && (e.rank == slot_ || slot_given), ProtocolError,
                      "message for job ", e.job, " rank ", e.rank);
    // Registration answers come before (or instead of) a session; everything else must belong to
    // the current one, so traffic of an earlier registration is never applied.
    // (A Probe's session field is the backup's nonce.)
    const bool any_session = e.type == Type::Welcome || e.type == Type::Refuse ||
                             e.type == Type::Finished || e.type == Type::Probe;
    SKETCHSGD_REQUIRE(any_session || (session_ != 0 && e.session == session_), ProtocolError,
                      to_string(e.type), " of another session");
    return Parsed{e, frames};
  } catch (const Error& ex) {
    opts_.log(std::string("dropped server message: ") + ex.what());
    return std::nullopt;
  }
}

bool Session::control(const Parsed& m, Clock::time_point now, Outbox& out) {
  switch (m.env.type) {
    case Type::Welcome: {
      const WelcomeInfo w = decode_welcome(m.frames[1].bytes());
      if (promise_ && w.epoch < promise_->epoch) {
        // Welcomed by the old epoch after answering a backup that may be taking over (the Hello
        // crossed the Probe): rounds applied there could be ones the backup lacks.
        opts_.log("a server of epoch " + std::to_string(w.epoch) +
                  " welcomed this worker, which told a backup taking over as epoch " +
                  std::to_string(promise_->epoch) + " it would wait: trying the next replica");
        elsewhere_ = true;
        return true;
      }
      registered_ = true;
      promise_.reset();  // kept: this server's epoch is the promised one or later
      session_ = m.env.session;
      slot_ = m.env.rank;
      heartbeat_ = Millis(w.heartbeat_ms);
      staleness_ = w.staleness;
      async_ = w.async != 0;
      epoch_ = std::max(epoch_, w.epoch);  // a server of an older one was deposed
      // The job's optimizer (its state arrives with the model, which the Pull below asks for).
      const OuterOptions oo = outer_options(w);
      if (!(outer_->options() == oo))
        outer_ = std::make_unique<OuterStep>(oo, codec_.dim(), codec_.device());
      const bool initialises = opts_.population ? !init_.empty() : opts_.rank == 0;
      if (!w.has_model && initialises) {
        // A server restarted without a checkpoint starts again from rank 0's current model.
        const std::vector<float> p = init_.empty() ? params_.to_vector() : init_;
        out.push_back({envelope(Type::Init, round_),
                       Frame::own(Bytes(reinterpret_cast<const uint8_t*>(p.data()),
                                        reinterpret_cast<const uint8_t*>(p.data() + p.size())))});
      }
      resent_ = 0;
      if (w.has_model && !opts_.population) {
        // A registration again (a new socket, or a backup that took over): the pushes without an
        // outcome go before the Pull. A server at our round merges them; one a round further
        // (its outcome lost on our way) answers the last with that outcome, which we then apply
        // as the others did (codec state included) rather than jump to its model.
        for (const auto& [round, frame] : pending_) {
          out.push_back({envelope(Type::Push, round), frame});
          resent_ += frame.size();
        }
      }
      if (!opts_.population) {  // a federated client's model follows its Welcome
        out.push_back({envelope(Type::Pull, round_)});
        fetching_ = true;
      }
      return true;
    }
    case Type::Refuse: {
      const RefuseInfo r = decode_refuse(m.frames[1].bytes());
      if (!r.retry)
        throw ConfigMismatch("worker " + std::to_string(opts_.rank) +
                             ": server refused: " + r.reason);
      if (r.refused == Type::Hello) {
        opts_.log("registration refused for now: " + r.reason);
        elsewhere_ = r.elsewhere;
        hello_at_ = now + std::min(heartbeat_, Millis(500));
      } else if (registered_) {
        // The server forgot us (it restarted): register again, then pull.
        opts_.log("server: " + r.reason + ": registering again");
        hello(out);
      }
      return true;
    }
    case Type::Probe: {
      if (registered_) {
        opts_.log("ignored a backup's probe: registered with a server");
        return true;
      }
      ProbeInfo p;
      try {
        p = decode_probe(m.frames[1].bytes());
      } catch (const Error& ex) {
        opts_.log(std::string("dropped a backup's probe: ") + ex.what());
        return true;
      }
      if (p.release) {
        // The backup follows its primary again, having voided every answer to its probes: the
        // primary is alive, so that is where to go.
        if (promise_ && promise_->epoch <= p.epoch) {
          opts_.log("a backup that did not take over as epoch " + std::to_string(p.epoch) +
                    " released this worker: trying the next replica");
          promise_.reset();
          elsewhere_ = true;
        }
        return true;
      }
      // No time limit: the backup may have counted the answer and taken over, in which case a
      // round applied by the old epoch would be one it lacks (and, asynchronous, lost silently).
      promise_ = Promise{std::max(p.epoch, promise_ ? promise_->epoch : 0)};
      out.push_back(
          {Frame::own(encode(Envelope{Type::Present, opts_.job, round_, slot_, 0, m.env.session})),
           Frame::own(encode(hello_info()))});
      return true;
    }
    case Type::Finished:
      throw JobFinished("worker " + std::to_string(opts_.rank) +
                            ": the server's job has ended: " + decode_text(m.frames[1].bytes()),
                        m.env.round);
    case Type::Model: {
      const auto b = m.frames[1].bytes();
      // The parameters, then the optimizer's state where it keeps one, then Adam's steps.
      const OuterOptions& oo = outer_->options();
      const uint64_t dim = codec_.dim(), k = oo.buffers();
      const bool steps = oo.kind == OuterKind::Adam;
      SKETCHSGD_REQUIRE(b.size() == dim * 4 * (1 + k) + (steps ? 8 : 0), WireError, "model of ",
                        b.size(), " bytes for dim ", dim, " with ", to_string(oo.kind), "'s ", k,
                        " state vectors");
      std::vector<float> p(dim), state(dim * k);
      std::memcpy(p.data(), b.data(), dim * 4);
      const size_t bad = kernels::cpu::find_nonfinite(p.data(), p.size());
      SKETCHSGD_REQUIRE(bad == kernels::kNone, NonFiniteError, "model: non-finite value at ", bad);
      if (k) {
        uint64_t t = 0;
        std::memcpy(state.data(), b.data() + dim * 4, dim * k * 4);
        if (steps) std::memcpy(&t, b.data() + dim * 4 * (1 + k), 8);
        outer_->load(state, t);  // validates before it writes
      }
      // A federated client's pending push was computed on the model it holds: a server that sends
      // another for the same round ran the round before again, differently (restarted from an
      // older checkpoint, with other clients' pushes): the push is stale and computed again.
      const bool other = opts_.population && m.env.round == round_ && !pending_.empty() &&
                         params_.size() == p.size() && params_.to_vector() != p;
      if (params_.size() != p.size()) params_ = Buffer<float>(p.size(), codec_.device());
      params_.upload(p);
      if (m.env.round != round_ || other) model_changed_round_ = true;  // the server is elsewhere
      round_ = m.env.round;
      if (model_changed_round_ || pending_.empty()) next_push_ = round_;
      behind_ = opts_.population != 0 && round_ < opts_.join_round;  // checked in ahead
      synced_ = !behind_;
      fetching_ = false;
      since_fetch_ = 0;
      if (!opts_.population) {
        // Rank 0 initialises a server that lost its model from its current one; a federated
        // client given the initial model keeps it for that (its current one may be of the round
        // before its own, which the server may not have reached again).
        init_.clear();
        init_.shrink_to_fit();
      }
      return true;
    }
    default:
      return false;
  }
}

void Session::handle_registration(const Frames& frames, Clock::time_point now, Outbox& out) {
  const auto m = parse(frames);
  if (!m || m->env.type == Type::Heartbeat) return;
  const Type t = m->env.type;
  if (behind_ && (t == Type::Update || t == Type::Abort) && m->env.round == round_) {
    // The outcome of the round before ours: our round has opened, with this model.
    if (t == Type::Update) apply_update(*m);
    next_push_ = ++round_;
    behind_ = round_ < opts_.join_round;
    synced_ = !behind_;
  } else if (!control(*m, now, out)) {
    opts_.log("ignored " + std::string(to_string(t)) + " before registration");
  } else if (t == Type::Model) {
    model_changed_round_ = false;  // the first model is where we start, not a resync
  }
}

uint64_t Session::apply_update(const Parsed& m) {
  const UpdateInfo info = decode_update_info(m.frames[1].bytes());
  const auto u = m.frames[2].bytes();
  outer_->apply(codec_, u, params_.span(), info.lr);
  return u.size();
}

void Session::push(std::span<const float> grad, Outbox& out, StepResult& res) {
  const uint64_t r = next_push_;
  res.round = r;
  if (opts_.population && pending_.empty()) before_push_ = codec_.save_state();
  const Frame msg = Frame::own(codec_.encode(grad, r, slot_).release());
  pending_.emplace_back(r, msg);
  out.push_back({envelope(Type::Push, r), msg});
  res.bytes_up += msg.size();
  ++next_push_;
  // Downpour's n_fetch: the Pull goes right behind the push, whose update the server applies
  // first (one connection keeps the order), so the model comes back with it in.
  if (async_ && opts_.fetch_every && ++since_fetch_ >= opts_.fetch_every) fetch(out);
}

void Session::fetch(Outbox& out) {
  if (!registered_ || fetching_) return;
  out.push_back({envelope(Type::Pull, round_)});
  fetching_ = true;
}

bool Session::handle(const Frames& frames, Clock::time_point now, Outbox& out, StepResult& res) {
  const auto m = parse(frames);
  if (!m || m->env.type == Type::Heartbeat) return false;
  const Envelope& e = m->env;
  const bool was_synced = synced_;
  if (control(*m, now, out)) {
    if (e.type == Type::Model) {
      res.fetched = true;
      // An asynchronous job's fetch is its download (a round job's Model only (re)starts it).
      if (async_) res.bytes_down += m->frames[1].size();
    }
    res.bytes_up += resent_;
    const bool resent = e.type == Type::Welcome ? resent_ != 0 : resent_before_model_;
    if (e.type == Type::Welcome) resent_before_model_ = resent_ != 0;
    resent_ = 0;
    if (model_changed_round_) {
      model_changed_round_ = false;
      pending_.clear();
      if (before_push_) codec_.load_state(*before_push_);
      before_push_.reset();
      next_push_ = round_;
      opts_.log("resynchronised with the server at round " + std::to_string(round_));
      res.outcome = StepResult::Outcome::Resynced;
      return true;
    }
    // A Model of our round after (re)registration: the server may have lost our pushes (unless
    // they went out with the Welcome, before our Pull).
    if (e.type == Type::Model && !was_synced && !resent)
      for (const auto& [round, frame] : pending_) {
        out.push_back({envelope(Type::Push, round), frame});
        res.bytes_up += frame.size();
      }
    if (e.type == Type::Model) resent_before_model_ = false;
    return false;
  }
  if (e.round > round_ && (e.type == Type::Update || e.type == Type::Abort)) {
    // An outcome of a later round: ours was lost on the way. Catch up through the model.
    opts_.log("missed the outcome of round " + std::to_string(round_) + ": pulling the model");
    out.push_back({envelope(Type::Pull, round_)});
    return false;
  }
  if (e.round != round_) return false;  // a duplicate of an earlier round's outcome
  switch (e.type) {
    case Type::Query: {
      const auto q = m->frames[1].bytes();
      res.bytes_down += q.size();
      const Frame ans = Frame::own(codec_.answer(q, slot_).release());
      res.bytes_up += ans.size();
      out.push_back({envelope(Type::Answer, round_), ans});
      return false;
    }
    case Type::Update: {
      const UpdateInfo info = decode_update_info(m->frames[1].bytes());
      res.bytes_down += apply_update(*m);
      res.lr = info.lr;
      res.contributors = info.contributors;
      res.age = info.age;
      res.version = info.version;
      res.outcome = StepResult::Outcome::Updated;
      break;
    }
    case Type::Abort:
      opts_.log((async_ ? "push #" : "round ") + std::to_string(round_) +
                (async_ ? " refused: " : " aborted: ") + decode_text(m->frames[1].bytes()));
      res.outcome = StepResult::Outcome::Aborted;
      if (async_) fetch(out);  // too old (or undecodable): catch up before the next push
      break;
    default:
      opts_.log("ignored unexpected " + std::string(to_string(e.type)));
      return false;
  }
  ++round_;
  while (!pending_.empty() && pending_.front().first < round_) pending_.pop_front();
  if (pending_.empty()) before_push_.reset();
  if (next_push_ < round_) next_push_ = round_;
  return false;
}

}  // namespace sketchsgd::ps
