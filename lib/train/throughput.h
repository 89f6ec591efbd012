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

#include <string>

#include "recipe/recipe.h"

namespace ft {

// The model FLOPs of one optimizer step, the whole global batch (every rank's share).
double step_model_flops(const Recipe& r);

// The dense peak FLOP/s of one device for the recipe's precision: logging.peak_tflops when set;
// else for NVIDIA GPUs by name (bf16/fp16 tensor cores; fp32: TF32's with runtime.tf32, else
// the CUDA cores'), 0 when the device is not in the table (the CPU: set logging.peak_tflops).
double device_peak_flops(const Recipe& r, const std::string& device_name, bool cuda);

}  // namespace ft
