// Timestamped, rate-limited log lines on stderr: a flood of bad traffic costs a summary line, not a
// line per message.
#pragma once

#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <string>

#include <unistd.h>

namespace sketchsgd::ps {

class Log {
 public:
  Log(std::string who, bool quiet, int per_second = 20)
      : who_(std::move(who)), quiet_(quiet), tty_(isatty(2)), per_second_(per_second) {}

  void operator()(const std::string& line) {
    if (quiet_) return;
    std::lock_guard lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    if (now - window_ >= std::chrono::seconds(1)) {
      if (suppressed_) {
        // Appended, not `"(" + std::to_string(...)`: GCC 12 warns falsely (-Wrestrict) there.
        std::string note = "(";
        note += std::to_string(suppressed_);
        note += " similar lines suppressed)";
        print(note);
      }
      window_ = now;
      count_ = 0;
      suppressed_ = 0;
    }
    if (++count_ > per_second_) {
      ++suppressed_;
      return;
    }
    print(line);
  }

 private:
  void print(const std::string& line) {
    const auto t = std::chrono::system_clock::now();
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
    const std::time_t secs = std::time_t(ms / 1000);
    std::tm tm{};
    gmtime_r(&secs, &tm);
    // On a terminal, clear the live status line first.
    std::fprintf(stderr, "%s[%s %02d:%02d:%02d.%03d] %s\n", tty_ ? "\r\033[K" : "", who_.c_str(),
                 tm.tm_hour, tm.tm_min, tm.tm_sec, int(ms % 1000), line.c_str());
  }

  std::string who_;
  bool quiet_;
  bool tty_;
  int per_second_;
  std::mutex mu_;
  std::chrono::steady_clock::time_point window_{};
  int count_ = 0;
  int suppressed_ = 0;
};

}  // namespace sketchsgd::ps
