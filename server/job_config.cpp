#include <sketchsgd/server/job_config.hpp>

#include <cmath>

#include <sketchsgd/core/error.hpp>

namespace sketchsgd::ps {

Policy parse_policy(std::string_view s) {
  if (s == "wait") return Policy::Wait;
  if (s == "quorum") return Policy::Quorum;
  if (s == "abort") return Policy::Abort;
  throw InvalidArgument("policy must be wait, quorum or abort, got '" + std::string(s) + "'");
}

std::string_view to_string(Policy p) {
  switch (p) {
    case Policy::Wait:
      return "wait";
    case Policy::Quorum:
      return "quorum";
    case Policy::Abort:
      return "abort";
  }
  return "unknown";
}

namespace {
const RoundPolicy kNoRounds{};  // an asynchronous job's: nothing to close
}  // namespace

const RoundPolicy& JobConfig::close() const {
  if (const auto* m = std::get_if<SyncMode>(&mode)) return m->close;
  if (const auto* m = std::get_if<FederatedMode>(&mode)) return m->close;
  return kNoRounds;
}

RoundPolicy& JobConfig::closing() {
  if (auto* m = std::get_if<SyncMode>(&mode)) return m->close;
  if (auto* m = std::get_if<FederatedMode>(&mode)) return m->close;
  throw InvalidArgument("an asynchronous job has no rounds: no round policy or quorum");
}

uint32_t JobConfig::staleness() const {
  const auto* m = std::get_if<SyncMode>(&mode);
  return m ? m->staleness : 0;
}

uint32_t JobConfig::population() const {
  const auto* m = std::get_if<FederatedMode>(&mode);
  return m ? m->population : 0;
}

uint64_t JobConfig::sample_seed() const {
  const auto* m = std::get_if<FederatedMode>(&mode);
  return m ? m->sample_seed : 1;
}

uint32_t JobConfig::max_age() const {
  const auto* m = std::get_if<AsyncMode>(&mode);
  return m ? m->max_age : 0;
}

bool JobConfig::age_scaled() const {
  const auto* m = std::get_if<AsyncMode>(&mode);
  return m && m->age_scaled;
}

void JobConfig::validate() const {
  SKETCHSGD_REQUIRE(world >= 1 && world <= 65536, InvalidArgument,
                    "world size must be in [1, 65536], got ", world);
  SKETCHSGD_REQUIRE(dim >= 1, InvalidArgument, "dim must be ≥ 1");
  SKETCHSGD_REQUIRE(std::isfinite(lr), InvalidArgument, "learning rate must be finite, got ", lr);
  SKETCHSGD_REQUIRE(min_workers() <= world, InvalidArgument, "min_workers ", min_workers(),
                    " exceeds the world size ", world);
  SKETCHSGD_REQUIRE(deadline.count() >= 1, InvalidArgument, "deadline must be ≥ 1 ms");
  SKETCHSGD_REQUIRE(heartbeat.count() >= 1, InvalidArgument, "heartbeat must be ≥ 1 ms");
  SKETCHSGD_REQUIRE(dead_after >= 1, InvalidArgument, "dead_after must be ≥ 1");
  SKETCHSGD_REQUIRE(staleness() <= 64, InvalidArgument, "staleness must be ≤ 64 rounds, got ",
                    staleness());
  SKETCHSGD_REQUIRE(!federated() || population() >= world, InvalidArgument, "population ",
                    population(), " is smaller than the ", world, " clients sampled per round");
  SKETCHSGD_REQUIRE(shard.count >= 1 && shard.index < shard.count, InvalidArgument, "shard ",
                    shard.index, " of ", shard.count);
  SKETCHSGD_REQUIRE(shard.model_dim == 0 ||
                        (shard.begin <= shard.model_dim && dim <= shard.model_dim - shard.begin),
                    InvalidArgument, shard.describe(dim), ": the range leaves the model");
  SKETCHSGD_REQUIRE(
      shard.count > 1 || (shard.begin == 0 && (shard.model_dim == 0 || shard.model_dim == dim)),
      InvalidArgument, "one server holds the whole model: ", shard.describe(dim));
  outer.validate();
}

JobConfig JobConfig::checked() const {
  validate();
  JobConfig c = *this;
  if (!c.async() && c.close().min_workers == 0) c.closing().min_workers = c.world;
  if (c.shard.model_dim == 0) c.shard.model_dim = c.dim;
  return c;
}

}  // namespace sketchsgd::ps
