// Seeded sampling without replacement: which C of a federated job's N clients take part in a
// round. Integer arithmetic only (SplitMix64 words, Lemire's bounded draw, Floyd's algorithm), so
// the parameter server, its clients and the in-process simulation draw the same participants on
// every platform and compiler.
#pragma once

#include <cstdint>
#include <vector>

namespace sketchsgd {

/// per_round distinct clients of [0, population) in increasing order, every such set equally
/// likely, drawn from (seed, round) alone. O(per_round) time and memory. Throws InvalidArgument
/// unless 1 ≤ per_round ≤ population.
std::vector<uint32_t> sample_clients(uint32_t population, uint32_t per_round, uint64_t seed,
                                     uint64_t round);

}  // namespace sketchsgd
