#include <sketchsgd/server/replies.hpp>

#include <sketchsgd/server/model_store.hpp>

namespace sketchsgd::ps {

Frame envelope(Type t, uint64_t job, uint64_t round, uint32_t rank, uint64_t session) {
  return Frame::own(encode(Envelope{t, job, round, rank, 0, session}));
}

Replies::Replies(uint64_t job, const Roster& roster, const ModelStore& store,
                 std::function<void(const std::string&)> log)
    : job_(job), roster_(roster), store_(store), log_(std::move(log)) {}

Frame Replies::to(uint32_t rank, Type t, uint64_t round) const {
  return envelope(t, job_, round, rank, roster_[rank].session);
}

void Replies::send(uint32_t rank, Frames frames, std::vector<Outgoing>& out) const {
  out.push_back(Outgoing{roster_[rank].peer, std::move(frames)});
}

void Replies::resend(uint32_t rank, const Frames& message, uint64_t round,
                     std::vector<Outgoing>& out) const {
  Frames fr = message;
  fr[0] = to(rank, decode_envelope(fr[0].bytes(), fr.size() - 1).type, round);
  send(rank, std::move(fr), out);
}

void Replies::refuse(const PeerId& peer, const Envelope& e, bool retry, const std::string& why,
                     std::vector<Outgoing>& out, bool elsewhere) {
  log_("refused " + std::string(to_string(e.type)) + " from rank " + std::to_string(e.rank) + ": " +
       why);
  ++rejected_;
  RefuseInfo r{retry, e.type, why.substr(0, kMaxText)};
  r.elsewhere = elsewhere;
  out.push_back(Outgoing{
      peer,
      {envelope(Type::Refuse, job_, store_.round(), e.rank, e.session), Frame::own(encode(r))}});
}

void Replies::finished(const PeerId& peer, const Envelope& e, std::vector<Outgoing>& out,
                       std::string why) {
  ++late_;
  if (why.empty())
    why = "job " + std::to_string(job_) + " finished at round " + std::to_string(store_.round()) +
          " (its last round)";
  out.push_back(Outgoing{peer,
                         {envelope(Type::Finished, job_, store_.round(), e.rank, e.session),
                          Frame::own(encode_text(why))}});
}

void Replies::drop(const std::string& why) {
  ++rejected_;
  log_("dropped message: " + why);
}

void Replies::replay(const std::string& why) {
  ++replays_;
  drop(why);
}

}  // namespace sketchsgd::ps
