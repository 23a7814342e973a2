// Processes this one starts: a program run with its output in a log file
// (`gpipectl local` starts a controller and workers so), or a forked copy of
// this process running a function (a benchmark's or a test's peer, forked
// before any thread or GPU context exists). Either dies with its parent
// (PR_SET_PDEATHSIG) and is killed and reaped, at the latest, when its
// object goes.
#ifndef GPIPE_CLI_CHILD_PROCESS_H_
#define GPIPE_CLI_CHILD_PROCESS_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace gpipe {

class ChildProcess {
 public:
  // Runs argv[0] (a path) with `argv`, stdin from /dev/null, stdout and
  // stderr into `log_path`, in a process group of its own so that a Ctrl-C
  // on the terminal reaches this process alone, which then stops it in
  // order.
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(
      std::string name, const std::vector<std::string>& argv,
      std::string log_path);
  // Runs `body` in a forked copy of this process; its result is the exit
  // code. Only what is safe after fork belongs in it when this process has
  // threads: fork early.
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Fork(
      std::string name, const std::function<int()>& body);

  ~ChildProcess();  // SIGKILL and reap, if still running
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  const std::string& name() const { return name_; }
  const std::string& log_path() const { return log_path_; }
  pid_t pid() const { return pid_; }

  // Reaps the process when it has ended.
  bool Running();
  void Signal(int sig);
  // Waits until the process has ended or `deadline` passes.
  bool WaitUntil(absl::Time deadline);
  // Waits for the end; its exit code, or 128 + the signal that killed it.
  int Wait();
  // "exited with code 1", "was killed by signal 9 (Killed)".
  std::string HowItEnded() const;

 private:
  ChildProcess(std::string name, pid_t pid, std::string log_path)
      : name_(std::move(name)), pid_(pid), log_path_(std::move(log_path)) {}
  void Reaped(int status);

  std::string name_;
  pid_t pid_;
  std::string log_path_;
  bool exited_ = false;
  int wait_status_ = 0;
};

}  // namespace gpipe

#endif  // GPIPE_CLI_CHILD_PROCESS_H_
