// Throughput as the field states it (DESIGN.md §7 "Throughput"): the model FLOPs of a step, by
// the formula PaLM's MFU and torchtitan, Megatron and llm.c use, and the device's dense peak.
//
// Per token of a row: 6·N + 12·L·T·C, N the matmul weights (q, k, v, o, gate, up, down of every
// layer, and lm_head; the embedding is a lookup), L the layers, T data.seq_len, C model.dim:
// 2 FLOPs per multiply-accumulate forward, twice that backward, and attention's two T×T products
// (QKᵀ and PV, not halved for causality). What ft's variants count:
//   - a frozen matrix (an adapter's base, outside modules_to_save) 4·N: forward and the input's
//     gradient, no weight gradient; a LoRA adapter's A and B 6 per weight, as any trained one;
//     attention's 12·L·T·C whatever trains (its backward runs for the input's gradient);
//   - every position of a row counts, padding included (packed windows, DPO's rows): the work is
//     done on them;
//   - DPO: two rows a pair, and with dpo.reference: base the reference's forward in every step,
//     2·N + 4·L·T·C per token (its pass before step 1, with reference: initial, is no step's);
//   - activation checkpointing's recomputed forward is not counted: model FLOPs, not the
//     hardware's (MFU's definition, so that checkpointing does not raise it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "recipe/recipe.h"
#include "runtime/device.h"

namespace ft {

// The model FLOPs of one optimizer step, the whole global batch (every rank's share).
double step_model_flops(const Recipe& r);

// The dense peak FLOP/s of one device for the recipe's precision: logging.peak_tflops when set;
// else for NVIDIA GPUs by name (bf16/fp16 tensor cores; fp32: TF32's with runtime.tf32, else
// the CUDA cores'), 0 when the device is not in the table (the CPU: set logging.peak_tflops).
double device_peak_flops(const Recipe& r, const std::string& device_name, bool cuda);

// The GPUs' load on a logged step (DESIGN.md §7 "GPU load"): rank 0's own reading and the
// slowest rank's. The slowest is the least busy GPU: the lowest gpu_util, the lowest rank on a
// tie, among the ranks with a reading. (Not the longest step: the step's collectives end every
// rank's step together, so the wall times hardly differ. In a data-parallel step each GPU has
// the same work; the one busy the smallest share of the time is the one the others wait for,
// its host late with input or launches: under NCCL the waiting GPUs count as busy, since NCCL's
// kernels run while they wait.)
struct GpuLoad {
  bool own_known = false;  // this rank's reading (rank 0's, where the line is written)
  double util_percent = 0;
  uint64_t mem_used_bytes = 0;
  int slowest_rank = -1;  // -1: no rank has a reading
  double slowest_util_percent = 0;
  uint64_t slowest_mem_used_bytes = 0;
};

// One rank's reading as gathered.
struct RankUsage {
  bool known = false;
  double util_percent = 0;
  uint64_t mem_used_bytes = 0;
};
// The slowest rank of `ranks` (index = rank), as GpuLoad defines it; -1 when none has a reading.
int slowest_rank(const std::vector<RankUsage>& ranks);

// Every rank reads its device (Device::usage) and the readings are all-gathered over `world`
// (host memory, three doubles a rank): a collective, called by every rank on the same steps.
// A device without figures (the CPU) gives none and says nothing. A failed reading is said once:
// by rank 0 for itself, by another rank for itself only when rank 0 has a reading (else rank 0's
// message stands for all: the usual failure, no NVML on the hosts, is every rank's).
GpuLoad gather_gpu_load(Communicator& world, Device& dev);

}  // namespace ft
