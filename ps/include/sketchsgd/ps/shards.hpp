// A sharded parameter server: S server processes, shard i owning one contiguous range of the
// model, each running the job's codec on its range with its share of the budget (a sketch with
// its share of the columns and k, top-k with its share of k, PowerSGD on the tensors it holds,
// dense on its slice) and its own rounds, checkpoints and metrics. Server and workers derive the
// same plan from the job's spec, dim and S; a worker pushes every shard its part and assembles
// the update (worker/client.hpp).
//
// k across shards is proportional: shard i keeps k · len_i / d of the coordinates (largest
// remainder, so the shares add up to k), chosen within its range. One threshold exchange would
// pick the same k coordinates as one server; the proportional rule saves that round trip and
// leaves the shards independent (docs/BENCHMARKS.md measures the difference).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <sketchsgd/ps/protocol.hpp>

namespace sketchsgd::ps {

struct ShardPlan {
  ShardId id;        ///< index, count, where the range begins, the model's dim
  uint64_t dim = 0;  ///< the range's length
  std::string spec;  ///< the canonical spec a server of this range runs
  uint64_t end() const { return id.begin + dim; }
};

/// The shards of a model of dim values under spec. Ranges are even (floor(i·d/S)); a spec with
/// a layout is cut at the tensor boundaries nearest to them, every shard holding at least one
/// tensor. A shard whose tensors the codec would all send whole (PowerSGD's biases, which it
/// refuses to run on alone) runs dense with the spec's worker momentum and wire format, as the
/// DDP hook sends such tensors. InvalidArgument for S = 0, S > dim, fewer tensors than shards or
/// a bad spec.
std::vector<ShardPlan> plan_shards(std::string_view spec, uint64_t dim, uint32_t count);

/// "tcp://a:1,tcp://b:2" → its endpoints in order (a worker's --server of a sharded job: shard i
/// at place i); with separator '|', one shard's primary and backup ("tcp://a:1|tcp://c:1").
/// InvalidArgument for an empty item.
std::vector<std::string> split_endpoints(std::string_view list, char separator = ',');

}  // namespace sketchsgd::ps
