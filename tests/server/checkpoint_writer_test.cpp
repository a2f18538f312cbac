// The server's checkpoint writer: snapshots written off the caller's thread, the latest kept,
// failures reported, nothing waiting lost at shutdown.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <sketchsgd/server/checkpoint_writer.hpp>

namespace sketchsgd::ps {
namespace {

TEST(CheckpointWriter, KeepsTheLatestSnapshotAndReportsFailures) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("sketchsgd-writer-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = (dir / "ckpt").string();
  auto snapshot = [](uint64_t round) {
    return Checkpoint{3, round, "dense", std::vector<float>(1000, float(round)), {}};
  };
  {
    CheckpointWriter w(path);
    for (uint64_t r = 1; r <= 20; ++r) w.submit(snapshot(r));  // older ones may be skipped
    w.flush();
    const auto c = load_checkpoint(path);
    ASSERT_TRUE(c);
    EXPECT_EQ(c->round, 20u);
    EXPECT_EQ(c->params, std::vector<float>(1000, 20.0f));
    EXPECT_TRUE(w.take_failures().empty());
    w.submit(snapshot(21));  // still waiting when the writer goes away: written, not lost
  }
  EXPECT_EQ(load_checkpoint(path)->round, 21u);

  CheckpointWriter bad((dir / "missing" / "ckpt").string());
  bad.submit(snapshot(1));
  bad.flush();
  const auto failures = bad.take_failures();
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_NE(failures[0].find("missing"), std::string::npos) << failures[0];
  EXPECT_TRUE(bad.take_failures().empty());  // taken once
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace sketchsgd::ps
