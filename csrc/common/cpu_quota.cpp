// The CPU budget of this process (see cpu_quota.h).
#include "common/cpu_quota.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace llmk {
namespace {

// CPUs allowed by a quota/period pair; 0 when unlimited or unreadable.
int limit_of(double quota, double period) {
  if (quota <= 0 || period <= 0) return 0;
  return std::max(1, int(std::ceil(quota / period - 1e-9)));
}

int v2_limit(const std::string& dir) {
  std::ifstream f(dir + "/cpu.max");
  std::string q;
  double period = 0;
  if (!(f >> q >> period) || q == "max") return 0;
  return limit_of(std::atof(q.c_str()), period);
}

int v1_limit(const std::string& dir) {
  std::ifstream fq(dir + "/cpu.cfs_quota_us"), fp(dir + "/cpu.cfs_period_us");
  double quota = -1, period = 0;
  if (!(fq >> quota) || !(fp >> period)) return 0;
  return limit_of(quota, period);
}

// The tightest limit on `path` and its ancestors under each candidate mount point.
template <typename Read>
int walk(const std::string& path, std::initializer_list<const char*> mounts, Read read) {
  int best = 0;
  for (const char* m : mounts) {
    std::string p = path;
    for (;;) {
      const int l = read(std::string(m) + p);
      if (l > 0) best = best ? std::min(best, l) : l;
      if (p.empty() || p == "/") break;
      const size_t cut = p.find_last_of('/');
      p = cut == std::string::npos || cut == 0 ? std::string() : p.substr(0, cut);
    }
  }
  return best;
}

}  // namespace

int cgroup_cpu_limit() {
#if defined(__linux__)
  std::ifstream f("/proc/self/cgroup");
  std::string line;
  int best = 0;
  auto take = [&](int l) {
    if (l > 0) best = best ? std::min(best, l) : l;
  };
  while (std::getline(f, line)) {
    // hierarchy-id:controllers:path; v2 has id 0 and no controllers.
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string ctrl = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (ctrl.empty()) {
      take(walk(path, {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"}, v2_limit));
    } else {
      std::stringstream ss(ctrl);
      for (std::string c; std::getline(ss, c, ',');)
        if (c == "cpu") take(walk(path, {"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"}, v1_limit));
    }
  }
  return best;
#else
  return 0;
#endif
}

int available_cpus() {
  int n = std::max(1u, std::thread::hardware_concurrency());
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) n = std::max(1, CPU_COUNT(&set));
#endif
  const int quota = cgroup_cpu_limit();
  return quota > 0 ? std::min(n, quota) : n;
}

}  // namespace llmk
