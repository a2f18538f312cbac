#include <sketchsgd/server/model_store.hpp>

#include <algorithm>
#include <cstring>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/kernels/cpu.hpp>
#include <sketchsgd/ps/protocol.hpp>

namespace sketchsgd::ps {

ModelStore::ModelStore(JobConfig cfg, std::function<void(Checkpoint, bool)> checkpoint)
    : cfg_(std::move(cfg)), checkpoint_(std::move(checkpoint)) {
  codec_ = make_compressor(cfg_.spec, cfg_.dim);
  cfg_.spec = codec_->spec();
  agg_ = make_aggregator();
  outer_ = std::make_unique<OuterStep>(cfg_.outer, cfg_.dim, Device::cpu());
}

std::unique_ptr<Aggregator> ModelStore::make_aggregator() const {
  // The aggregator keeps only the codec's identity and limits: one made by a codec on the chosen
  // device runs there, while codec_ (host) applies updates to the host model.
  if (cfg_.device == codec_->device()) return codec_->make_aggregator(cfg_.world);
  return make_compressor(cfg_.spec, cfg_.dim, cfg_.device)->make_aggregator(cfg_.world);
}

void ModelStore::init(std::span<const uint8_t> b, uint64_t round) {
  SKETCHSGD_REQUIRE(b.size() == cfg_.dim * 4, WireError, "init of ", b.size(), " bytes for dim ",
                    cfg_.dim);
  std::vector<float> p(cfg_.dim);
  std::memcpy(p.data(), b.data(), b.size());
  const size_t bad = kernels::cpu::find_nonfinite(p.data(), p.size());
  SKETCHSGD_REQUIRE(bad == kernels::kNone, NonFiniteError, "init: non-finite parameter at ", bad);
  model_ = std::move(p);
  snapshot_ = Frame();
  if (round > round_) round_ = cfg_.max_rounds ? std::min(round, cfg_.max_rounds) : round;
}

void ModelStore::apply(std::span<const uint8_t> update, float lr) {
  outer_->apply(*codec_, update, model_, lr);  // validates before it writes
  snapshot_ = Frame();
}

void ModelStore::follow(std::span<const uint8_t> codec_state,
                        const std::span<const uint8_t>* update, float lr) {
  // The state goes into a spare aggregator (made once: FetchSGD's is not cheap to make each
  // round), which becomes the current one only once the update has applied.
  if (!spare_) spare_ = make_aggregator();
  spare_->load_state(codec_state);
  if (update) apply(*update, lr);
  std::swap(agg_, spare_);
}

void ModelStore::commit(Frames outcome) {
  last_outcome_ = std::move(outcome);
  ++round_;
  save(false);
}

void ModelStore::save_now() {
  save(true);
}

void ModelStore::save(bool now) {
  if (checkpoint_ && cfg_.checkpoint_every &&
      (now || round_ % cfg_.checkpoint_every == 0 || finished()))
    checkpoint_(checkpoint(), finished());
}

Frames ModelStore::model_frames() const {
  if (snapshot_.size() == 0) {
    // The parameters, the optimizer's state (none for plain SGD), Adam's step count.
    const std::vector<float> m = outer_->save();
    const bool steps = cfg_.outer.kind == OuterKind::Adam;
    Bytes b((model_.size() + m.size()) * 4 + (steps ? 8 : 0));
    std::memcpy(b.data(), model_.data(), model_.size() * 4);
    if (!m.empty()) std::memcpy(b.data() + model_.size() * 4, m.data(), m.size() * 4);
    if (steps) {
      const uint64_t t = outer_->steps();
      std::memcpy(b.data() + (model_.size() + m.size()) * 4, &t, 8);
    }
    snapshot_ = Frame::own(std::move(b));
  }
  return {Frame(), snapshot_};
}

Checkpoint ModelStore::checkpoint() const {
  return Checkpoint{cfg_.job,           round_,         cfg_.spec,  model_,
                    agg_->save_state(), outer_->save(), cfg_.shard, outer_->steps()};
}

void ModelStore::restore(const Checkpoint& c) {
  SKETCHSGD_REQUIRE(c.job == cfg_.job, ConfigMismatch, "checkpoint of job ", c.job,
                    ", server runs job ", cfg_.job);
  // Compared in today's canonical form: a checkpoint written by an older version names the same
  // codec in older words (e.g. hashing=0 for hashing=random).
  std::string spec = c.spec;
  try {
    spec = make_compressor(c.spec, cfg_.dim)->spec();
  } catch (const Error&) {
  }
  SKETCHSGD_REQUIRE(spec == cfg_.spec, ConfigMismatch, "checkpoint of codec ", c.spec,
                    ", server runs ", cfg_.spec);
  SKETCHSGD_REQUIRE(c.params.size() == cfg_.dim, ConfigMismatch, "checkpoint of dim ",
                    c.params.size(), ", server runs dim ", cfg_.dim);
  // An older checkpoint names no shard: it held a whole model.
  const ShardId shard = c.shard.model_dim ? c.shard : ShardId{0, 1, 0, c.params.size()};
  SKETCHSGD_REQUIRE(shard == cfg_.shard, ConfigMismatch, "checkpoint of ",
                    shard.describe(c.params.size()), ", server is ", cfg_.shard.describe(cfg_.dim));
  // Another optimizer's state is a mismatch; a state of a wrong length, corruption (load's).
  const size_t vectors = c.outer.size() / std::max<size_t>(cfg_.dim, 1);
  SKETCHSGD_REQUIRE(c.outer.size() % std::max<size_t>(cfg_.dim, 1) != 0 || vectors == 0 ||
                        vectors == cfg_.outer.buffers(),
                    ConfigMismatch, "checkpoint with ", vectors,
                    " optimizer state vectors, the server's ", to_string(cfg_.outer.kind),
                    " keeps ", cfg_.outer.buffers());
  SKETCHSGD_REQUIRE(c.outer.empty() || cfg_.outer.stateful(), ConfigMismatch,
                    "checkpoint with optimizer state, the server runs plain SGD");
  auto agg = make_aggregator();  // on the configured device, as at start
  agg->load_state(c.codec_state);
  outer_->load(c.outer, c.outer_steps);  // validates; empty (an older checkpoint): zero
  agg_ = std::move(agg);
  model_ = c.params;
  snapshot_ = Frame();
  round_ = c.round;
  last_outcome_.clear();
}

}  // namespace sketchsgd::ps
