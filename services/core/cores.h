// How many cores this process may really use: the CPUs it is pinned to,
// capped by the CPU quotas of its cgroup and the cgroups above it (a
// Kubernetes CPU limit, a systemd CPUQuota). A pod limited
// to 2 CPUs on a 64-core node sees 64 in std::thread::hardware_concurrency();
// 64 compute threads there would be throttled by the quota most of each
// period, and the stage would stall at every barrier.
#ifndef GPIPE_SERVICES_CORE_CORES_H_
#define GPIPE_SERVICES_CORE_CORES_H_

#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace gpipe {

// At least 1.
int AvailableCores();

// The most compute threads a process may ask for (--threads): a count no
// machine has crashed libgomp (a segfault in GOMP_parallel).
inline constexpr int kMaxThreads = 1024;

// The cores a quota allows, rounded up, from cgroup v2's cpu.max ("QUOTA
// PERIOD" or "max PERIOD") or from cgroup v1's cfs_quota_us and cfs_period_us
// (quota -1: none). Nothing when there is no quota or the text is not one.
std::optional<int> CoresFromCpuMax(absl::string_view cpu_max);
std::optional<int> CoresFromCfsQuota(absl::string_view quota_us,
                                     absl::string_view period_us);

// The tightest quota on the way from this process's cgroup up to the root:
// a limit may sit on a parent (a systemd slice, a pod above its containers),
// and without a cgroup namespace the process's cgroup is not the mount's
// root. `proc_self_cgroup` is /proc/self/cgroup's text ("0::/PATH" for v2,
// "N:cpu,cpuacct:/PATH" for v1), `mount` where cgroupfs is (/sys/fs/cgroup).
std::optional<int> QuotaCores(absl::string_view proc_self_cgroup,
                              const std::string& mount);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_CORE_CORES_H_
