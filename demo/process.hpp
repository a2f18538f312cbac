// Child processes for launchers and tests: spawn with stdout on a pipe, read its first line with a
// time limit, wait with a time limit (killing what outlives it). Header-only, POSIX.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

namespace sketchsgd::demo {

class Process {
 public:
  Process() = default;
  Process(Process&& o) noexcept
      : pid_(std::exchange(o.pid_, -1)), out_(std::exchange(o.out_, -1)) {}
  Process& operator=(Process&& o) noexcept {
    kill9();
    pid_ = std::exchange(o.pid_, -1);
    out_ = std::exchange(o.out_, -1);
    return *this;
  }
  ~Process() { kill9(); }

  /// argv[0] is the program's path. stdout goes to a pipe (line()); stderr is inherited.
  static Process spawn(std::vector<std::string> args, const std::vector<std::string>& env = {}) {
    int p[2];
    if (pipe(p) != 0) throw std::runtime_error("pipe failed");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, p[1], 1);
    posix_spawn_file_actions_addclose(&fa, p[0]);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> envs = env;
    for (char** e = environ; *e; ++e) envs.emplace_back(*e);
    std::vector<char*> envp;
    for (auto& e : envs) envp.push_back(e.data());
    envp.push_back(nullptr);
    Process pr;
    const int rc = posix_spawn(&pr.pid_, argv[0], &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    close(p[1]);
    if (rc != 0) {
      close(p[0]);
      throw std::runtime_error("cannot start " + args[0]);
    }
    pr.out_ = p[0];
    return pr;
  }

  pid_t pid() const { return pid_; }

  /// The next line of the child's stdout, waiting at most `limit` ("" on timeout or EOF).
  std::string line(std::chrono::milliseconds limit) {
    std::string s;
    const auto end = std::chrono::steady_clock::now() + limit;
    char c;
    while (out_ >= 0 && std::chrono::steady_clock::now() < end) {
      pollfd fd{out_, POLLIN, 0};
      if (::poll(&fd, 1, 50) <= 0) continue;
      if (read(out_, &c, 1) != 1 || c == '\n') break;
      s += c;
    }
    return s;
  }

  /// The exit code (or −signal) if the child has ended, without waiting.
  std::optional<int> try_wait() {
    int st = 0;
    if (pid_ <= 0 || waitpid(pid_, &st, WNOHANG) != pid_) return std::nullopt;
    pid_ = -1;
    close_out();
    return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
  }

  /// Exit code, or −signal; kills the child and returns −999 when it outlives `limit`.
  int wait(std::chrono::milliseconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    int st = 0;
    while (pid_ > 0 && std::chrono::steady_clock::now() < end) {
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        close_out();
        return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    kill9();
    return -999;
  }

  /// Asks the child to end (SIGTERM: a server then stops cleanly); wait() for it.
  void terminate() {
    if (pid_ > 0) kill(pid_, SIGTERM);
  }

  void kill9() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
    close_out();
  }

 private:
  void close_out() {
    if (out_ >= 0) close(out_);
    out_ = -1;
  }
  pid_t pid_ = -1;
  int out_ = -1;
};

}  // namespace sketchsgd::demo
