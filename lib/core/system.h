// Facts about the machine this process runs on.
#pragma once

#include <cstdint>

namespace ft {

// Cores this process may run on: its CPU affinity mask (what taskset, SLURM and mpirun binding
// and cgroup cpusets restrict), not the machine's core count. At least 1.
int available_cores();

// Memory a new allocation can still get: MemAvailable of /proc/meminfo (free memory plus the
// page cache the kernel can drop), or less when this process's cgroup (v2) has a limit closer to
// its current use. 0 when neither can be read.
uint64_t available_memory_bytes();

// Ranks of this job on this node, as the launcher says (Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE,
// SLURM's SLURM_NTASKS_PER_NODE); 1 when started without one. They share the node's cores and
// memory.
int local_rank_count();

// Seconds since this process started: the kernel's start time of the process (/proc/self/stat,
// in clock ticks, 10 ms here) against CLOCK_BOOTTIME, so the count includes loading the shared
// libraries and everything before main (and survives ft's re-exec, which keeps the process).
// Where /proc cannot be read: since this library's static initialisation.
double seconds_since_process_start();

// True when this process was started by an MPI launcher (mpirun, srun with PMIx/PMI).
bool launched_by_mpi();

}  // namespace ft
