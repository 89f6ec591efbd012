// Loss scaling for fp16 training (DESIGN.md §5, "Mixed precision and loss scaling").
//
// fp16 keeps 5 exponent bits: a gradient below 2^-24 flushes to zero and one above 65504
// becomes inf. So the loss is multiplied by a scale S before backward, the fp32 gradients are
// divided by S before clipping and the update, and a step whose gradients overflowed (the
// all-reduced gradient norm is not finite, on every rank alike) is skipped: parameters, AdamW
// moments and AdamW's step count stay as they were. This class owns S and the counters; the
// step calls scale() before backward and update(found_inf) once per step, after the norm.
//
// Dynamic rule (training.loss_scale 0), as DeepSpeed's DynamicLossScaler with its defaults
// (consecutive_hysteresis false, raise_error_at_min_scale true) and Megatron's
// DynamicGradScaler, which give the same sequence of scales:
//   state: S (starts at initial_scale), clean = clean steps since the last overflow or growth,
//          h = overflows still forgiven (starts at hysteresis H).
//   clean step: clean += 1; when clean reaches window: S *= 2 (kept only if finite, as
//          PyTorch's GradScaler), clean = 0, h = H.
//   overflow:   clean = 0; the step is skipped; if h > 1: h -= 1 and S stays; otherwise, if S
//          is already min_scale: stop (DeepSpeed raises here), else S = max(S / 2, min_scale).
// h is restored by a growth only, never by a clean step: with H = 2, the first overflow since
// the start or the last growth is forgiven, and every later one halves S until S grows again.
// With H = 1 and window = growth_interval this is PyTorch's GradScaler (init_scale 2^16,
// growth 2, backoff 0.5), except that GradScaler has no minimum scale and never stops.
//
// Static rule (training.loss_scale N > 0): S = N for ever; an overflow still skips the step.
//
// Either way, the update(...) that makes max_skipped_steps consecutive skips also stops: the
// run ends with exit code 1 like a non-finite fp32 step, with the newest checkpoint the last
// good one.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace ft {

// The defaults are the recipe's (recipe/recipe.h: loss_scaler_config(TrainingConfig{})).
struct LossScalerConfig {
  double loss_scale = 0;          // 0: dynamic; N > 0: static scale N
  double initial_scale = 0;       // dynamic: the first scale (DeepSpeed 2^initial_scale_power)
  double min_scale = 0;           // dynamic: never below; an overflow at it stops the run
  int64_t window = 0;             // dynamic: clean steps before the scale doubles
  int hysteresis = 0;             // dynamic: overflows before the scale halves (see above)
  int64_t max_skipped_steps = 0;  // consecutive skipped steps that stop the run
};

// Everything that changes from step to step; what a checkpoint keeps (manifest "loss_scaler").
struct LossScalerState {
  float scale = 1;
  int64_t clean_steps = 0;          // clean steps since the last overflow or growth
  int hysteresis_left = 1;          // overflows still forgiven, >= 1
  int64_t consecutive_skipped = 0;  // skipped steps since the last applied one
  int64_t total_skipped = 0;        // skipped steps of the run (since fp16 began)

  nlohmann::json to_json() const;
  // Reads what to_json wrote, trusting nothing: every field present, counts JSON integers in
  // range, the scale a finite number > 0. Throws Error "<file>: loss_scaler.<key>: ...; the
  // checkpoint is damaged" (file names the manifest), never another exception type.
  static LossScalerState from_json(const nlohmann::json& j, const std::string& file);
  bool operator==(const LossScalerState&) const = default;
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerConfig& cfg);

  struct Decision {
    bool skip = false;   // the step's update is not applied
    bool stop = false;   // give up: the run ends with exit code 1 (skip is true too)
    std::string reason;  // empty on an applied step; else what happened, for the log or error
  };
  // The scale to multiply this step's loss by (and to divide its gradients by).
  float scale() const { return s_.scale; }
  bool dynamic() const { return cfg_.loss_scale == 0; }
  // Ends the step: found_inf says whether its gradients overflowed (on any rank). Returns what
  // to do with this step; scale() is then the next step's scale.
  Decision update(bool found_inf);

  const LossScalerConfig& config() const { return cfg_; }
  const LossScalerState& state() const { return s_; }
  int64_t consecutive_skipped() const { return s_.consecutive_skipped; }
  int64_t total_skipped() const { return s_.total_skipped; }

  // The whole state, for the checkpoint; from_json(to_json()) on a scaler of the same config
  // gives identical future behaviour. A checkpoint saved under another config is adapted: a
  // static scaler keeps its recipe's scale, a dynamic one clamps the scale up to min_scale and
  // the forgiven overflows down to hysteresis.
  nlohmann::json to_json() const { return s_.to_json(); }
  void from_json(const nlohmann::json& j, const std::string& file);
  void restore(const LossScalerState& s);

 private:
  LossScalerConfig cfg_;
  LossScalerState s_;
};

}  // namespace ft
