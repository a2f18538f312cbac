// The invariants checked after every event and at a run's end, and why a job could not end.
#include "sim/world.hpp"

namespace sketchsgd::ps::sim {

bool World::all_done() {
  for (const auto& w : workers_)
    if (w->state != WState::Done && w->state != WState::Failed) return false;
  if (!workers_done_at_) workers_done_at_ = now_;
  const bool late = now_ - *workers_done_at_ > std::chrono::minutes(6);
  for (const auto& s : servers_)
    if (s->state == SState::Up) {
      if (late && s->replica->following() && servers_[s->primary]->state != SState::Up)
        throw Violation(s->name +
                        " still follows a gone primary six minutes after the workers "
                        "ended");
      if (!late) return false;
    }
  return true;
}

void World::sabotage() {
  if (sc_.sabotage == Scenario::Sabotage::None || sabotaged_) return;
  Part& p = workers_[0]->parts[0];
  if (sc_.sabotage == Scenario::Sabotage::Stall && p.session->next_push() >= 2) {
    net_.pause(node_of_worker(0), now_ + std::chrono::hours(24));
    sabotaged_ = true;
  }
}

void World::check() {
  sabotage();
  for (size_t i = 0; i < servers_.size(); ++i) {
    Server& s = *servers_[i];
    if (s.state != SState::Up) continue;
    s.max_epoch = std::max(s.max_epoch, s.engine->epoch());
    if (!s.engine->has_model()) continue;
    // A backup following holds only what its primary committed, bit for bit.
    if (s.replica->following()) {
      const Server& p = *servers_[s.primary];
      if (p.state == SState::Up && p.engine->round() < s.engine->round())
        throw Violation(s.name + " at round " + std::to_string(s.engine->round()) +
                        " is ahead of its primary at " + std::to_string(p.engine->round()));
      const uint64_t r = s.engine->round();
      const auto it = primary_hash_.find({s.shard, r});
      if (r > 0 && !async() && it != primary_hash_.end() &&
          it->second != hash_of(s.engine->model(), s.engine->codec_state()))
        throw Violation(s.name + " holds round " + std::to_string(r) +
                        " other than its primary committed it (model or codec state)");
    }
  }
  for (size_t w = 0; w < workers_.size(); ++w) {
    Worker& x = *workers_[w];
    for (size_t p = 0; p < x.parts.size(); ++p) {
      Part& pt = x.parts[p];
      if (!pt.session->synced() || pt.session->round() == pt.seen_round) continue;
      const uint64_t before = pt.seen_round, r = pt.session->round();
      pt.seen_round = r;
      if (before != UINT64_MAX && r < before && !rollback_ok())
        throw Violation("worker " + std::to_string(w) + " went back from round " +
                        std::to_string(before) + " to " + std::to_string(r));
      if (before != UINT64_MAX && r > before) x.progress_at = now_;
      if (async() || r == 0) continue;
      // What it holds after round r − 1 is what some server had then: no update lost,
      // applied twice, or made up.
      const auto it = committed_.find({uint32_t(p), r});
      if (it == committed_.end() || !it->second.count(hash_of(pt.session->params())))
        throw Violation("worker " + std::to_string(w) + " holds at round " + std::to_string(r) +
                        " a model no server had then");
    }
  }
}

void World::final_checks() {
  // Allowed: a clear error where a server refused to go on (a torn checkpoint, both replicas
  // of a shard killed), and the workers' timeouts it causes.
  std::string no_server;
  for (uint32_t sh = 0; sh < shards_ && no_server.empty(); ++sh) no_server = unservable(sh);
  // And a worker cut off when the job ended: its servers finished and stopped (they do not
  // wait for the goodbye of a worker they count as dead), it times out.
  const bool ended = std::all_of(servers_.begin(), servers_.end(),
                                 [](const auto& s) { return s->state != SState::Up; }) &&
                     std::any_of(servers_.begin(), servers_.end(), [](const auto& s) {
                       return s->exit == "finished" && s->engine && s->engine->finished();
                     });
  // And a split said so: a backup took over on Hellos that had waited (in a partition, in a
  // paused server) while their workers went back to a primary going on alone; the rounds it
  // released are refused loudly, not undone.
  const bool split = std::any_of(workers_.begin(), workers_.end(), [](const auto& w) {
    return w->exit.find("the job's state is split") != std::string::npos;
  });
  // And a federated client whose round closed without it (late, or cut off): it is told so.
  const auto passed_over = [&](const Worker& x) {
    const auto it = complete_.find({0, x.join});
    return federated() && it != complete_.end() && !it->second.second;
  };
  for (size_t w = 0; w < workers_.size(); ++w) {
    const Worker& x = *workers_[w];
    if (x.state == WState::Failed &&
        !(server_errors_ || !no_server.empty() || ended || split || passed_over(x)))
      throw Violation("worker " + std::to_string(w) + " failed: " + x.exit);
  }
  const bool passed = std::any_of(workers_.begin(), workers_.end(), [&](const auto& w) {
    return w->state == WState::Failed && passed_over(*w);
  });
  cause_ = server_errors_       ? "a server refused to start: " + refusal_
           : !no_server.empty() ? no_server
           : passed             ? "a client's round closed without it (late or cut off)"
           : ended              ? "the job ended while a worker was cut off"
                                : "";
  for (size_t w = 0; w < workers_.size(); ++w) {
    const Worker& x = *workers_[w];
    if (x.state != WState::Done) continue;
    for (size_t p = 0; p < x.parts.size(); ++p) {
      const Part& pt = x.parts[p];
      const uint64_t r = async() ? pt.session->next_push() : pt.session->round();
      // (A federated client cut off after its push learns the job ended, not its round's
      // outcome: nothing of it is lost, and it keeps no state.)
      if (r < last_push(x) && !passed_over(x) && !(federated() && pt.finished))
        throw Violation("worker " + std::to_string(w) + " was told the job had finished at " +
                        std::to_string(r) + " of " + std::to_string(last_push(x)));
    }
    // Those that ended together (every worker; a federated round's clients that ran it) agree.
    const auto ran = [&](const Worker& y) {
      return y.state == WState::Done && y.parts[0].session->round() >= last_push(y);
    };
    // Passed over, or its round ran again after a restart from an older checkpoint (the
    // clients that had left hold the lost outcome: a rollback, as the workers of a restarted
    // server resynchronise to it).
    if (!ran(x) || (federated() && rerun_.count({0, x.join}))) continue;
    size_t first = 0;
    while (federated() && (workers_[first]->join != x.join || !ran(*workers_[first]))) ++first;
    if (!async() && x.full() != workers_[first]->full() && ran(*workers_[first]))
      throw Violation("workers " + std::to_string(first) + " and " + std::to_string(w) +
                      " end with different models");
    if (reference_ && whole() && (!federated() || x.join + 1 == sc_.rounds) &&
        x.full() != *reference_) {
      const auto v = x.full();
      const size_t at =
          size_t(std::mismatch(v.begin(), v.end(), reference_->begin()).first - v.begin());
      throw Violation("worker " + std::to_string(w) +
                      " ends with another model than the fault-free run (first at parameter " +
                      std::to_string(at) + " of " + std::to_string(v.size()) + ")");
    }
  }
  if (async()) {
    // The version the latest epoch reached: the pushes its server applied, each once.
    const uint64_t most = last_[0].second;
    const bool all = std::all_of(workers_.begin(), workers_.end(),
                                 [](const auto& w) { return w->state == WState::Done; });
    if (all && most != sc_.rounds * sc_.world)
      throw Violation("the asynchronous job applied " + std::to_string(most) + " pushes of " +
                      std::to_string(sc_.rounds * sc_.world));
  }
}

bool World::whole() const {
  return std::all_of(complete_.begin(), complete_.end(),
                     [](const auto& c) { return c.second.second; });
}

std::string World::unservable(uint32_t shard) const {
  uint64_t held = 0, epoch = 0;
  std::set<uint32_t> left;
  for (const auto& w : workers_) {
    held = std::max(held, w->parts[shard].session->round());
    if (w->state == WState::Done || w->state == WState::Failed) left.insert(w->rank);
  }
  if (async()) held = seen_version_.count(shard) ? seen_version_.at(shard) : 0;
  for (const auto& o : servers_)
    if (o->shard == shard) epoch = std::max(epoch, o->max_epoch);
  // The epoch a worker promised a backup that probed it (Session::promised): that backup may
  // have taken over counting the answer, so no older server may serve the worker.
  uint64_t promised = 0;
  for (const auto& w : workers_)
    promised = std::max(promised, w->parts[shard].session->promised().value_or(0));
  std::string why;
  for (const auto& o : servers_) {
    if (o->shard != shard) continue;
    std::string w;
    if (o->state == SState::Down)
      w = "killed";
    else if (o->state == SState::Stopped && federated() && o->exit == "finished")
      return "";  // every round ran: its clients were served, or passed over (said so)
    else if (o->state == SState::Stopped)
      w = o->exit.substr(0, o->exit.find(':'));
    else if (o->engine->epoch() < epoch)
      w = "of an epoch before its backup's takeover";
    else if (o->engine->epoch() < promised && !o->replica->following())
      w = "of an epoch before the one its workers promised a probing backup";
    else if (o->engine->round() < held && !federated())  // a federated one runs it again
      w = "behind the workers";
    else if (o->replica->following() && !o->replica->backup()->synced())
      w = "without the primary's state";
    else if (o->replica->following() && !o->engine->finished() &&
             std::any_of(left.begin(), left.end(),
                         [&](uint32_t r) { return !o->replica->backup()->left().count(r); }))
      w = "waiting for every worker to take over, one has left unannounced";
    else
      return "";
    why += (why.empty() ? "" : ", ") + o->name + " " + w;
  }
  return why;
}

std::string World::states() const {
  std::ostringstream o;
  for (const auto& s : servers_)
    o << s->name << " "
      << (s->state == SState::Up     ? "up"
          : s->state == SState::Down ? "down"
                                     : "stopped")
      << (s->engine ? " round " + std::to_string(s->engine->round()) : std::string())
      << (s->replica && s->replica->following() ? " following" : "")
      << (s->exit.empty() ? "" : " (" + s->exit + ")") << "; ";
  for (const auto& w : workers_) {
    o << "worker " << w->rank << " state " << int(w->state);
    for (const auto& p : w->parts)
      o << " round " << p.session->round() << " next push " << p.session->next_push()
        << (p.session->synced() ? "" : " unsynced");
    o << (w->exit.empty() ? "" : " (" + w->exit + ")") << "; ";
  }
  return o.str();
}

}  // namespace sketchsgd::ps::sim
