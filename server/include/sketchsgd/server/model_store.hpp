// The server's copy of the job between rounds: the model, the outer optimizer's state beside it,
// the codec's aggregator with its state across rounds, the round number and the last round's
// outcome. Whatever ends a round (a synchronous round, an asynchronous push, a backup following
// its primary) ends it through commit(), so the round number, the outcome kept for re-sending and
// the checkpoints cannot disagree.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include <sketchsgd/compress/compressor.hpp>
#include <sketchsgd/ps/frame.hpp>
#include <sketchsgd/ps/outer.hpp>
#include <sketchsgd/server/checkpoint.hpp>
#include <sketchsgd/server/job_config.hpp>

namespace sketchsgd::ps {

class ModelStore {
 public:
  /// Takes snapshots through `checkpoint` (unset: none) every cfg.checkpoint_every rounds and
  /// after the last. cfg is validated (JobConfig::checked); its spec may be in any form
  /// make_compressor accepts: spec() is its canonical form.
  ModelStore(JobConfig cfg, std::function<void(Checkpoint, bool last)> checkpoint);

  const std::string& spec() const { return cfg_.spec; }
  /// The host codec that applies updates to the model (it never encodes).
  const Compressor& codec() const { return *codec_; }
  Aggregator& aggregator() { return *agg_; }
  Bytes codec_state() const { return agg_->save_state(); }

  bool has_model() const { return !model_.empty(); }
  std::span<const float> model() const { return model_; }
  uint64_t round() const { return round_; }
  /// max_rounds reached.
  bool finished() const { return cfg_.max_rounds && round_ >= cfg_.max_rounds; }
  /// The outcome of round() − 1 as sent to the workers (envelope, then its payload frames);
  /// empty before the first round ends (or after a restore, until resume()).
  const Frames& last_outcome() const { return last_outcome_; }

  /// rank 0's parameters (dim floats, all finite: else it throws and changes nothing); the job
  /// goes on from `round` (a restarted server's, taken from rank 0) where that is later.
  void init(std::span<const uint8_t> params, uint64_t round);
  /// w −= lr · step, or the outer step; validates the update before it writes anything.
  void apply(std::span<const uint8_t> update, float lr);
  /// A backup's commit of its primary's round: the aggregator state after it, and the update
  /// (none for an aborted round). Checked whole before anything changes: a throw leaves the state
  /// as it was. commit() then ends the round.
  void follow(std::span<const uint8_t> codec_state, const std::span<const uint8_t>* update,
              float lr);
  /// Ends round(): `outcome` kept for re-sending, the round advanced, a snapshot taken where
  /// checkpoint_every says.
  void commit(Frames outcome);
  /// A snapshot of the state now (the initial model's, say).
  void save_now();
  void set_last_outcome(Frames outcome) { last_outcome_ = std::move(outcome); }

  /// The model's message for Pulls (an empty envelope frame to fill in, then the parameters and
  /// the optimizer's state): one copy per model version, shared until the model changes.
  Frames model_frames() const;

  Checkpoint checkpoint() const;
  /// Throws ConfigMismatch (changing nothing) for another job's, codec's, dim's, shard's or
  /// optimizer's checkpoint, WireError for a corrupt state. The next round is c.round; the last
  /// outcome is forgotten.
  void restore(const Checkpoint& c);

 private:
  /// An aggregator on the job's device (the CPU, or a GPU for --device cuda).
  std::unique_ptr<Aggregator> make_aggregator() const;
  void save(bool now);

  JobConfig cfg_;
  std::function<void(Checkpoint, bool)> checkpoint_;
  std::unique_ptr<Compressor> codec_;  // host
  std::unique_ptr<Aggregator> agg_;
  std::unique_ptr<Aggregator> spare_;  // a backup's: where a commit's state is checked first
  std::vector<float> model_;
  std::unique_ptr<OuterStep> outer_;  // on the host, beside model_
  uint64_t round_ = 0;
  Frames last_outcome_;
  mutable Frame snapshot_;  // the model's bytes for Pulls, until the model changes
};

}  // namespace sketchsgd::ps
