// How many CPUs this process may use: its CPU affinity mask, capped by its cgroup's CPU quota
// (containers and systemd slices often grant "2 CPUs" on a larger machine).
#pragma once

namespace llmk {

// min(CPUs in sched_getaffinity, ceil(cgroup quota / period)), at least 1.
int available_cpus();

// ceil(quota / period) of the tightest CPU limit on this process's cgroup and its ancestors
// (cgroup v2 cpu.max or v1 cpu.cfs_quota_us / cpu.cfs_period_us), or 0 when none is set.
int cgroup_cpu_limit();

}  // namespace llmk
