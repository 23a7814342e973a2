#include "cli/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace gpipe {
namespace {

// In the child, before anything else: die with the parent (also when it
// died before this call).
void FollowParent(pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != parent) _exit(1);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Start(
    std::string name, const std::vector<std::string>& argv,
    std::string log_path) {
  if (argv.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot start ", name, ": no program"));
  }
  // Everything the child needs is prepared here: between fork and exec
  // only async-signal-safe calls are allowed.
  std::vector<char*> cargv;
  for (const std::string& a : argv) {
    cargv.push_back(const_cast<char*>(a.c_str()));
  }
  cargv.push_back(nullptr);
  const int log =
      open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot create ", log_path, ": ", std::strerror(errno)));
  }
  const int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
  const pid_t parent = getpid();
  static const char kExecFailed[] = "exec failed\n";
  const pid_t pid = fork();
  if (pid < 0) {
    const int err = errno;
    close(log);
    if (null >= 0) close(null);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot start ", name, ": fork: ", std::strerror(err)));
  }
  if (pid == 0) {
    FollowParent(parent);
    setpgid(0, 0);
    if (null >= 0) dup2(null, STDIN_FILENO);
    dup2(log, STDOUT_FILENO);
    dup2(log, STDERR_FILENO);
    execv(cargv[0], cargv.data());
    (void)!write(STDERR_FILENO, kExecFailed, sizeof(kExecFailed) - 1);
    _exit(127);
  }
  close(log);
  if (null >= 0) close(null);
  return std::unique_ptr<ChildProcess>(
      new ChildProcess(std::move(name), pid, std::move(log_path)));
}

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Fork(
    std::string name, const std::function<int()>& body) {
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot start ", name, ": fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    FollowParent(parent);
    _exit(body());
  }
  return std::unique_ptr<ChildProcess>(
      new ChildProcess(std::move(name), pid, ""));
}

ChildProcess::~ChildProcess() {
  if (Running()) {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    Reaped(status);
  }
}

void ChildProcess::Reaped(int status) {
  exited_ = true;
  wait_status_ = status;
}

bool ChildProcess::Running() {
  if (exited_) return false;
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_ || (r < 0 && errno == ECHILD)) {
    Reaped(status);
    return false;
  }
  return true;
}

void ChildProcess::Signal(int sig) {
  if (Running()) kill(pid_, sig);
}

bool ChildProcess::WaitUntil(absl::Time deadline) {
  while (Running()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

int ChildProcess::Wait() {
  if (!exited_) {
    int status = 0;
    pid_t r;
    do {
      r = waitpid(pid_, &status, 0);
    } while (r < 0 && errno == EINTR);
    Reaped(r == pid_ ? status : 0);
  }
  if (WIFEXITED(wait_status_)) return WEXITSTATUS(wait_status_);
  if (WIFSIGNALED(wait_status_)) return 128 + WTERMSIG(wait_status_);
  return 255;
}

std::string ChildProcess::HowItEnded() const {
  if (!exited_) return "is running";
  if (WIFEXITED(wait_status_)) {
    return absl::StrCat("exited with code ", WEXITSTATUS(wait_status_));
  }
  if (WIFSIGNALED(wait_status_)) {
    const int sig = WTERMSIG(wait_status_);
    return absl::StrCat("was killed by signal ", sig, " (", strsignal(sig),
                        ")");
  }
  return "ended";
}

}  // namespace gpipe
