#include "core/system.h"

#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace ft {

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return int(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
}

namespace {

// The first number of a one-line file (cgroup's memory.max says "max" when unlimited: nullopt).
bool read_number(const std::string& path, uint64_t* out) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word.empty() || word.find_first_not_of("0123456789") != std::string::npos)
    return false;
  *out = std::strtoull(word.c_str(), nullptr, 10);
  return true;
}

}  // namespace

uint64_t available_memory_bytes() {
  uint64_t avail = 0;
  {
    std::ifstream in("/proc/meminfo");
    std::string key;
    uint64_t kib = 0;
    std::string unit;
    while (in >> key >> kib) {
      std::getline(in, unit);
      if (key == "MemAvailable:") {
        avail = kib * 1024;
        break;
      }
    }
  }
  // cgroup v2: "0::/some/path" names this process's group under /sys/fs/cgroup.
  std::ifstream cg("/proc/self/cgroup");
  std::string line;
  while (std::getline(cg, line)) {
    if (line.rfind("0::", 0) != 0) continue;
    const std::string dir = "/sys/fs/cgroup" + line.substr(3);
    uint64_t max = 0, current = 0;
    if (read_number(dir + "/memory.max", &max) && read_number(dir + "/memory.current", &current)) {
      const uint64_t left = max > current ? max - current : 0;
      avail = avail ? std::min(avail, left) : left;
    }
  }
  return avail;
}

int local_rank_count() {
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (!local) local = std::getenv("SLURM_NTASKS_PER_NODE");
  return local ? std::max(1, std::atoi(local)) : 1;
}

namespace {
const std::chrono::steady_clock::time_point g_static_init = std::chrono::steady_clock::now();

// Field 22 of /proc/self/stat (starttime, ticks after boot); the command name, field 2, is in
// parentheses and may hold spaces, so fields are counted after its closing parenthesis.
bool process_start_ticks(uint64_t* ticks) {
  std::ifstream in("/proc/self/stat");
  std::string stat;
  if (!std::getline(in, stat)) return false;
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream rest(stat.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22; ++i)
    if (!(rest >> field)) return false;
  if (field.find_first_not_of("0123456789") != std::string::npos) return false;
  *ticks = std::strtoull(field.c_str(), nullptr, 10);
  return true;
}
}  // namespace

double seconds_since_process_start() {
  uint64_t ticks = 0;
  timespec now{};
  const long hz = sysconf(_SC_CLK_TCK);
  if (hz > 0 && process_start_ticks(&ticks) && clock_gettime(CLOCK_BOOTTIME, &now) == 0) {
    const double s = double(now.tv_sec) + 1e-9 * double(now.tv_nsec) - double(ticks) / double(hz);
    if (s >= 0) return s;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - g_static_init).count();
}

bool launched_by_mpi() {
  // Open MPI's mpirun, PMIx (srun --mpi=pmix, mpirun), and PMI-1/2 (srun --mpi=pmi2).
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"})
    if (std::getenv(v)) return true;
  return false;
}

}  // namespace ft
