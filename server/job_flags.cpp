#include <sketchsgd/server/job_flags.hpp>

#include <cstdlib>

#include <sketchsgd/compress/registry.hpp>
#include <sketchsgd/core/error.hpp>
#include <sketchsgd/ps/shards.hpp>

namespace sketchsgd::ps {
namespace {

struct Entry {
  const char* name;
  const char* fallback;
  const char* help;
};

// clang-format off
const Entry kTable[] = {
    {"job", "1", "job id; workers must use the same"},
    {"world", "1", "number of workers W (a federated job: clients sampled per round)"},
    {"population", "0", "a federated job's clients N: W of them sampled each round, each registers "
                        "for its round, pushes and leaves (0: W fixed workers)"},
    {"sample-seed", "1", "a federated job: seed of the rounds' samples (clients draw the same)"},
    {"dim", "0", "number of parameters d (required)"},
    {"codec", "sketch", "codec spec, e.g. sketch:rows=5,cols=500000,k=50000,p2=4"},
    {"shards", "1", "S servers share the model: each holds one range (--dim and --codec stay the "
                    "whole model's; workers list all S endpoints, comma-separated)"},
    {"shard", "0", "with --shards: which one this server is, 0..S-1"},
    {"lr", "0.1", "learning rate: everyone does w -= lr * step"},
    {"outer-momentum", "0", "momentum of the step everyone applies (workers pushing "
                            "pseudo-gradients: DiLoCo's outer step; 0: plain w -= lr * step)"},
    {"outer-nesterov", "1", "with --outer-momentum: Nesterov's look-ahead (0: heavy ball)"},
    {"server-opt", "sgd", "the optimizer every holder of the model applies to each update: sgd "
                          "(with --outer-momentum), adagrad or adam (per coordinate, state kept "
                          "with the model)"},
    {"opt-eps", "1e-8", "adagrad, adam: epsilon added to the root"},
    {"opt-betas", "0.9,0.999", "adam: beta1,beta2"},
    {"policy", "quorum", "when a round's deadline passes: wait | quorum | abort"},
    {"min-workers", "0", "quorum size (0: all W)"},
    {"deadline-ms", "30000", "per-round deadline from its first push"},
    {"heartbeat-ms", "1000", "liveness interval workers must keep"},
    {"dead-after", "3", "missed heartbeat intervals before a worker is dead"},
    {"staleness", "0", "bounded staleness: rounds a worker may push ahead (0: synchronous)"},
    {"mode", "rounds", "rounds: every update merges a round's pushes | async: no rounds, each push "
                       "applied as it arrives and answered to its worker alone (Downpour; "
                       "one-round codecs)"},
    {"max-age", "0", "async: refuse a push computed on a model this many other workers' updates "
                     "old (0: none)"},
    {"age-scale", "1", "async: divide a push's step by 1 + its age (1) or not (0)"},
    {"device", "cpu", "where the aggregator runs: cpu, cuda or cuda:N (sketch unsketch on the "
                      "GPU)"},
    {"checkpoint-every", "100", "rounds between checkpoints (with --checkpoint)"},
    {"rounds", "0", "stop after this many rounds (0: run until interrupted)"},
};
// clang-format on

std::string env_of(std::string_view name) {
  std::string e = "SKETCHSGD_";
  for (const char c : name) e += c == '-' ? '_' : char(std::toupper(static_cast<unsigned char>(c)));
  return e;
}

/// What parse returns; its InvalidArgument told as one of the flag --name's.
template <class Parse>
auto named(const std::string& name, Parse&& parse) {
  try {
    return parse();
  } catch (const InvalidArgument& e) {
    throw InvalidArgument("--" + name + ": " + e.what());
  }
}

}  // namespace

std::vector<std::string> job_flag_names() {
  std::vector<std::string> v;
  for (const Entry& e : kTable) v.push_back(e.name);
  return v;
}

void JobFlags::add(Flags& f, const std::vector<std::string>& names,
                   const std::map<std::string, std::string>& defaults) {
  for (const std::string& name : names) {
    const Entry* e = nullptr;
    for (const Entry& x : kTable)
      if (name == x.name) e = &x;
    SKETCHSGD_REQUIRE(e, InvalidArgument, "no job flag --", name);
    const auto d = defaults.find(name);
    f.add(name, d == defaults.end() ? e->fallback : d->second, e->help, env_of(name));
    names_.insert(name);
  }
}

void JobFlags::read(const Flags& f, JobConfig& cfg) const {
  const auto has = [&](const char* name) { return names_.count(name) != 0; };
  if (has("job")) cfg.job = f.u64("job");
  if (has("world")) cfg.world = uint32_t(f.u64("world", 1, 65536));
  // The mode's values, read in the table's order and made one mode at the end.
  RoundPolicy close = cfg.close();
  uint32_t population = cfg.population(), staleness = cfg.staleness(), max_age = cfg.max_age();
  uint64_t sample_seed = cfg.sample_seed();
  bool async = cfg.async(), age_scaled = cfg.async() ? cfg.age_scaled() : AsyncMode{}.age_scaled;
  if (has("population")) population = uint32_t(f.u64("population", 0, UINT32_MAX));
  if (has("sample-seed")) sample_seed = f.u64("sample-seed");
  if (has("dim")) {
    cfg.dim = f.u64("dim");
    SKETCHSGD_REQUIRE(cfg.dim > 0, InvalidArgument, "--dim is required (see --help)");
  }
  if (has("codec")) {
    cfg.spec = f.str("codec");
    named("codec " + cfg.spec, [&] { return share_spec(cfg.spec); });
  }
  if (has("shards")) {
    const uint64_t shards = f.u64("shards"), shard = f.u64("shard");
    SKETCHSGD_REQUIRE(shards >= 1 && shard < shards && shards <= 1024, InvalidArgument, "--shard ",
                      shard, " of --shards ", shards, ": need 0 <= shard < shards <= 1024");
    if (shards > 1 && cfg.dim > 0) {
      const ShardPlan p = plan_shards(cfg.spec, cfg.dim, uint32_t(shards))[shard];
      cfg.shard = p.id;
      cfg.dim = p.dim;
      cfg.spec = p.spec;
    }
  }
  if (has("lr")) cfg.lr = float(f.num("lr"));
  if (has("outer-momentum")) {
    cfg.outer.momentum = float(f.num("outer-momentum"));
    SKETCHSGD_REQUIRE(cfg.outer.momentum >= 0 && cfg.outer.momentum < 1, InvalidArgument,
                      "--outer-momentum must be in [0, 1), got ", f.str("outer-momentum"));
    const bool nesterov = !has("outer-nesterov") || f.u64("outer-nesterov", 0, 1) != 0;
    cfg.outer.nesterov = nesterov && cfg.outer.momentum > 0;
  }
  if (has("server-opt"))
    cfg.outer.kind = named("server-opt", [&] { return parse_outer_kind(f.str("server-opt")); });
  if (has("opt-eps")) cfg.outer.eps = float(f.num("opt-eps"));
  if (has("opt-betas")) {
    const std::string betas = f.str("opt-betas");
    char* mid = nullptr;
    char* end = nullptr;
    const double b1 = std::strtod(betas.c_str(), &mid);
    const double b2 = mid && *mid == ',' ? std::strtod(mid + 1, &end) : 0.0;
    SKETCHSGD_REQUIRE(
        mid && *mid == ',' && mid != betas.c_str() && end && *end == '\0' && end != mid + 1,
        InvalidArgument, "--opt-betas: expected beta1,beta2, got '", betas, "'");
    cfg.outer.beta1 = float(b1);
    cfg.outer.beta2 = float(b2);
  }
  named("server-opt", [&] {
    cfg.outer.validate();
    return 0;
  });
  if (has("policy")) close.policy = named("policy", [&] { return parse_policy(f.str("policy")); });
  if (has("min-workers")) close.min_workers = uint32_t(f.u64("min-workers", 0, cfg.world));
  if (has("deadline-ms")) cfg.deadline = Millis(f.u64("deadline-ms", 1, UINT32_MAX));
  if (has("heartbeat-ms")) cfg.heartbeat = Millis(f.u64("heartbeat-ms", 1, UINT32_MAX));
  if (has("dead-after")) cfg.dead_after = uint32_t(f.u64("dead-after", 1, UINT32_MAX));
  if (has("staleness")) staleness = uint32_t(f.u64("staleness", 0, 64));
  if (has("mode")) {
    const std::string mode = f.str("mode");
    SKETCHSGD_REQUIRE(mode == "rounds" || mode == "async", InvalidArgument,
                      "--mode must be rounds or async, got '", mode, "'");
    async = mode == "async";
  }
  if (has("max-age")) max_age = uint32_t(f.u64("max-age", 0, UINT32_MAX));
  if (has("age-scale")) age_scaled = f.u64("age-scale", 0, 1) != 0;
  SKETCHSGD_REQUIRE(async || max_age == 0, InvalidArgument,
                    "--max-age bounds the pushes of --mode async jobs only");
  SKETCHSGD_REQUIRE(!async || staleness == 0, InvalidArgument,
                    "--staleness is for --mode rounds (an asynchronous job has none)");
  SKETCHSGD_REQUIRE(!async || population == 0, InvalidArgument,
                    "--population is for --mode rounds (an asynchronous job has no rounds to "
                    "sample clients for)");
  SKETCHSGD_REQUIRE(population == 0 || staleness == 0, InvalidArgument,
                    "a federated job's clients leave after their round: no bounded staleness");
  // An asynchronous job has no rounds to close: the policy flags have no use there.
  if (async)
    cfg.mode = AsyncMode{max_age, age_scaled};
  else if (population)
    cfg.mode = FederatedMode{close, population, sample_seed};
  else
    cfg.mode = SyncMode{close, staleness};
  if (has("device")) cfg.device = named("device", [&] { return Device::parse(f.str("device")); });
  if (has("checkpoint-every")) cfg.checkpoint_every = f.u64("checkpoint-every");
  if (has("rounds")) cfg.max_rounds = f.u64("rounds");
}

}  // namespace sketchsgd::ps
