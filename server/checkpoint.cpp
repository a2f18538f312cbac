#include <sketchsgd/server/checkpoint.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <sketchsgd/core/bytes.hpp>

namespace sketchsgd::ps {
namespace {

constexpr uint32_t kCheckpointMagic = 0x4B434B53;  // "SKCK"
// 2: the outer momentum, 3: the shard, 4: any optimizer's state and its step count (1-3 read)
constexpr uint16_t kCheckpointVersion = 4;

[[noreturn]] void fail(const std::string& what, const std::string& path) {
  throw Error("checkpoint: " + what + " " + path + ": " + std::strerror(errno));
}

void write_all(int fd, const uint8_t* p, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("write", path);
    p += w;
    n -= size_t(w);
  }
}

void fsync_dir(const std::string& path) {
  auto dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) fail("open folder of", path);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) fail("fsync folder of", path);
}

}  // namespace

Bytes encode(const Checkpoint& c) {
  Bytes b;
  b.reserve(64 + c.spec.size() + (c.params.size() + c.outer.size()) * 4 + c.codec_state.size());
  ByteWriter w(b);
  w.put(kCheckpointMagic);
  w.put(kCheckpointVersion);
  w.put(uint16_t(0));
  w.put(c.job);
  w.put(c.round);
  w.put(uint64_t(c.params.size()));
  w.put(uint32_t(c.spec.size()));
  w.put_array(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(c.spec.data()), c.spec.size()));
  w.put_array(std::span<const float>(c.params));
  w.put(uint64_t(c.codec_state.size()));
  w.put_array(std::span<const uint8_t>(c.codec_state));
  w.put(uint64_t(c.outer.size()));
  w.put_array(std::span<const float>(c.outer));
  w.put(c.shard.index);
  w.put(c.shard.count);
  w.put(c.shard.begin);
  w.put(c.shard.model_dim);
  w.put(c.outer_steps);
  seal(b);
  return b;
}

void save_checkpoint(const std::string& path, const Checkpoint& c) {
  const Bytes b = encode(c);
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("create", tmp);
  try {
    write_all(fd, b.data(), b.size(), tmp);
    if (::fsync(fd) != 0) fail("fsync", tmp);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("rename to", path);
  fsync_dir(path);
}

std::optional<Checkpoint> load_checkpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (!std::filesystem::exists(path)) return std::nullopt;
    fail("open", path);
  }
  const Bytes b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return decode_checkpoint(b, path);
}

Checkpoint decode_checkpoint(std::span<const uint8_t> b, const std::string& path) {
  const std::string what = "checkpoint " + path;
  ByteReader r(unseal(b, what.c_str()), "checkpoint");
  SKETCHSGD_REQUIRE(r.get<uint32_t>() == kCheckpointMagic, WireError, "checkpoint ", path,
                    ": bad magic");
  const auto version = r.get<uint16_t>();
  SKETCHSGD_REQUIRE(version >= 1 && version <= kCheckpointVersion, WireError, "checkpoint ", path,
                    ": version ", version);
  r.get<uint16_t>();
  Checkpoint c;
  c.job = r.get<uint64_t>();
  c.round = r.get<uint64_t>();
  const auto dim = r.get<uint64_t>();
  const auto spec_len = r.get<uint32_t>();
  SKETCHSGD_REQUIRE(spec_len <= kMaxText, WireError, "checkpoint ", path, ": spec of ", spec_len,
                    " bytes");
  const auto spec = r.take<uint8_t>(spec_len);
  c.spec.assign(reinterpret_cast<const char*>(spec.data()), spec.size());
  SKETCHSGD_REQUIRE(dim <= r.left() / 4, WireError, "checkpoint ", path, ": declares ", dim,
                    " parameters, holds ", r.left(), " bytes");
  c.params.resize(dim);
  r.get_array(std::span<float>(c.params));
  const auto state = r.take<uint8_t>(r.get<uint64_t>());
  c.codec_state.assign(state.begin(), state.end());
  if (version >= 2) {
    const auto n = r.get<uint64_t>();
    SKETCHSGD_REQUIRE(n == 0 || (dim && n % dim == 0 && n / dim <= (version >= 4 ? 2u : 1u)),
                      WireError, "checkpoint ", path, ": optimizer state of ", n, " values for ",
                      dim, " parameters");
    c.outer.resize(n);
    r.get_array(std::span<float>(c.outer));
  }
  if (version >= 3) {
    c.shard.index = r.get<uint32_t>();
    c.shard.count = r.get<uint32_t>();
    c.shard.begin = r.get<uint64_t>();
    c.shard.model_dim = r.get<uint64_t>();
  }
  if (version >= 4) c.outer_steps = r.get<uint64_t>();
  r.expect_end();
  for (size_t i = 0; i < c.params.size(); ++i)
    SKETCHSGD_REQUIRE(std::isfinite(c.params[i]), WireError, "checkpoint ", path,
                      ": non-finite parameter at ", i);
  return c;
}

}  // namespace sketchsgd::ps
