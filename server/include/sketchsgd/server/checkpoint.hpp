// Server checkpoints: parameters, round and job identity in one self-checking file, written
// atomically (temporary file, fsync, rename, fsync of the folder) so a crash leaves either the old
// checkpoint or the new one, never a torn file.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <sketchsgd/ps/protocol.hpp>

namespace sketchsgd::ps {

struct Checkpoint {
  uint64_t job = 0;
  uint64_t round = 0;  ///< next round to run: updates of rounds < round are in params
  std::string spec;    ///< canonical codec spec
  std::vector<float> params;
  std::vector<uint8_t> codec_state;  ///< Aggregator::save_state() (FetchSGD's sketches)
  std::vector<float> outer;          ///< the optimizer's state (OuterStep::save; empty: none)
  ShardId shard;                     ///< the part of the model params are (model_dim 0: unknown)
  uint64_t outer_steps = 0;          ///< the optimizer's steps taken (Adam's bias correction)
};

/// The file's bytes (versioned, CRC-32C sealed); a backup server receives its primary's state so.
Bytes encode(const Checkpoint& c);
/// Throws WireError when the bytes are truncated or corrupt; `source` names them in the error.
Checkpoint decode_checkpoint(std::span<const uint8_t> bytes, const std::string& source);
/// Writes atomically; throws Error with the failing system call and errno text.
void save_checkpoint(const std::string& path, const Checkpoint& c);
/// nullopt when no file exists; WireError when it exists but is truncated or corrupt.
std::optional<Checkpoint> load_checkpoint(const std::string& path);

}  // namespace sketchsgd::ps
