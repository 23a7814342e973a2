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

std::optional<int> QuotaCores(absl::string_view proc_self_cgroup,
                              const std::string& mount) {
  std::optional<int> tightest;
  auto tighten = [&](std::optional<int> q) {
    if (q && (!tightest || *q < *tightest)) tightest = q;
  };
  // Every directory from `path` up to the hierarchy's root, inclusive.
  auto walk = [&](const std::string& root, std::string path,
                  const auto& read_quota) {
    while (!path.empty() && path.back() == '/') path.pop_back();
    for (;;) {
      tighten(read_quota(root + path));
      if (path.empty()) break;
      path.erase(path.rfind('/'));
    }
  };
  for (absl::string_view line : absl::StrSplit(proc_self_cgroup, '\n')) {
    // "ID:CONTROLLERS:PATH"; the path may itself hold ':'.
    const std::vector<absl::string_view> f =
        absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3 || f[2].empty() || f[2][0] != '/') continue;
    const std::string path(f[2]);
    if (f[0] == "0" && f[1].empty()) {
      walk(mount, path, [](const std::string& dir) {
        return CoresFromCpuMax(ReadSmallFile((dir + "/cpu.max").c_str()));
      });
      continue;
    }
    const std::vector<absl::string_view> controllers =
        absl::StrSplit(f[1], ',');
    if (std::find(controllers.begin(), controllers.end(), "cpu") ==
        controllers.end()) {
      continue;
    }
    // v1 mounts the cpu controller as cpu, cpu,cpuacct or cpuacct,cpu.
    for (const char* name : {"/cpu", "/cpu,cpuacct", "/cpuacct,cpu"}) {
      walk(mount + name, path, [](const std::string& dir) {
        return CoresFromCfsQuota(
            ReadSmallFile((dir + "/cpu.cfs_quota_us").c_str()),
            ReadSmallFile((dir + "/cpu.cfs_period_us").c_str()));
      });
    }
  }
  return tightest;
}

int AvailableCores() {
  int cores = AffinityCores();
  const std::optional<int> quota =
      QuotaCores(ReadSmallFile("/proc/self/cgroup"), "/sys/fs/cgroup");
  if (quota) cores = std::min(cores, *quota);
  return std::max(1, cores);
}

}  // namespace gpipe
