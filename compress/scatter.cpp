#include <sketchsgd/compress/scatter.hpp>

#include <array>

#include <sketchsgd/core/error.hpp>

namespace sketchsgd {

Scatter::Scatter(std::vector<Round*> rounds, uint32_t rank)
    : rounds_(std::move(rounds)), rank_(rank) {
  const uint64_t world = rounds_.size();
  SKETCHSGD_REQUIRE(world >= 1, InvalidArgument, "scatter: no chunks");
  SKETCHSGD_REQUIRE(rank < world, InvalidArgument, "scatter: rank ", rank, " of ", world,
                    " chunks");
  for (uint64_t r = 0; r < world; ++r) {
    const Round* round = rounds_[r];
    SKETCHSGD_REQUIRE(round != nullptr, InvalidArgument, "scatter: chunk ", r, " has no round");
    SKETCHSGD_REQUIRE(round->world() == world, InvalidArgument, "scatter: chunk ", r,
                      "'s round is of a group of ", round->world(), ", not ", world);
    SKETCHSGD_REQUIRE(!round->compresses() || round->gathered(), InvalidArgument, "scatter: chunk ",
                      r, "'s codec sums (its round goes whole: a sum needs no per-rank decode)");
  }
}

std::vector<uint64_t> Scatter::lengths() const {
  std::vector<uint64_t> out(rounds_.size(), 0);
  for (const Round* round : rounds_)
    if (round->failed()) return out;
  for (size_t r = 0; r < rounds_.size(); ++r)
    out[r] = rounds_[r]->compresses() ? rounds_[r]->message_size() : 1;
  return out;
}

Scatter::Exchange Scatter::next(std::span<const uint64_t> table) {
  const uint64_t world = rounds_.size();
  SKETCHSGD_REQUIRE(table.size() == world * world, InvalidArgument, "scatter: a table of ",
                    table.size(), " lengths for ", world, " ranks (", world * world, " expected)");
  auto at = [&](uint64_t i, uint64_t r) { return table[i * world + r]; };
  for (const Round* round : rounds_) round->rethrow_own();  // this rank's own, with its coordinate
  for (uint64_t i = 0; i < world; ++i)
    for (uint64_t r = 0; r < world; ++r)
      SKETCHSGD_REQUIRE(at(i, r) != 0, NonFiniteError, "rank ", i,
                        "'s gradient was not finite (that rank raised NonFiniteError with the "
                        "coordinate); this step has no update");
  for (uint64_t r = 0; r < world; ++r) {
    const uint64_t limit = rounds_[r]->compresses() ? rounds_[r]->message_limit() : 1;
    for (uint64_t i = 0; i < world; ++i)
      SKETCHSGD_REQUIRE(at(i, r) <= limit, WireError, "rank ", i, " sent a message of ", at(i, r),
                        " bytes for rank ", r, "'s chunk (limit ", limit, ")");
  }

  Exchange out{std::vector<std::span<const uint8_t>>(world), std::vector<uint64_t>(world, 0)};
  std::vector<std::array<uint8_t, 8>> column(world);
  std::vector<std::span<const uint8_t>> lengths(world);
  for (uint64_t r = 0; r < world; ++r) {
    if (!rounds_[r]->compresses()) continue;  // no message: its tensors go in the driver's sum
    // Round r pads this rank's message to the longest of chunk r's: what goes to rank r is its
    // first bytes. Round rank_'s also keeps the lengths it reads the received messages by.
    for (uint64_t i = 0; i < world; ++i) {
      uint64_t n = at(i, r);
      for (auto& b : column[i]) {
        b = uint8_t(n & 0xFF);
        n >>= 8;
      }
      lengths[i] = column[i];
    }
    const auto reqs = rounds_[r]->next(lengths);
    out.send[r] = reqs.at(0).bytes.first(at(rank_, r));
  }
  if (rounds_[rank_]->compresses())
    for (uint64_t i = 0; i < world; ++i) out.receive[i] = at(i, rank_);
  return out;
}

}  // namespace sketchsgd
