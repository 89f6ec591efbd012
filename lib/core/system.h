// Facts about the machine this process runs on.
#pragma once

namespace ft {

// Cores this process may run on: its CPU affinity mask (what taskset, SLURM and mpirun binding
// and cgroup cpusets restrict), not the machine's core count. At least 1.
int available_cores();

}  // namespace ft
