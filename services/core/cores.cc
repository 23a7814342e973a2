#include "services/core/cores.h"

#include <sched.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace gpipe {
namespace {

std::optional<int> CoresFromQuota(int64_t quota, int64_t period) {
  if (quota <= 0 || period <= 0) return std::nullopt;
  const int64_t cores = (quota + period - 1) / period;
  return static_cast<int>(std::clamp<int64_t>(cores, 1, 1 << 20));
}

std::string ReadSmallFile(const char* path) {
  std::ifstream in(path);
  if (!in) return "";
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

int AffinityCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace

std::optional<int> CoresFromCpuMax(absl::string_view cpu_max) {
  const std::vector<absl::string_view> fields = absl::StrSplit(
      absl::StripAsciiWhitespace(cpu_max), ' ', absl::SkipEmpty());
  if (fields.size() != 2 || fields[0] == "max") return std::nullopt;
  int64_t quota = 0, period = 0;
  if (!absl::SimpleAtoi(fields[0], &quota) ||
      !absl::SimpleAtoi(fields[1], &period)) {
    return std::nullopt;
  }
  return CoresFromQuota(quota, period);
}

std::optional<int> CoresFromCfsQuota(absl::string_view quota_us,
                                     absl::string_view period_us) {
  int64_t quota = 0, period = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(quota_us), &quota) ||
      !absl::SimpleAtoi(absl::StripAsciiWhitespace(period_us), &period)) {
    return std::nullopt;
  }
  return CoresFromQuota(quota, period);
}

int AvailableCores() {
  int cores = AffinityCores();
  // Inside a container the cgroup namespace makes these the pod's own files.
  std::optional<int> quota =
      CoresFromCpuMax(ReadSmallFile("/sys/fs/cgroup/cpu.max"));
  if (!quota) {
    quota = CoresFromCfsQuota(
        ReadSmallFile("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"),
        ReadSmallFile("/sys/fs/cgroup/cpu/cpu.cfs_period_us"));
  }
  if (quota) cores = std::min(cores, *quota);
  return std::max(1, cores);
}

}  // namespace gpipe
