#include "optim/loss_scaler.h"

#include <algorithm>
#include <climits>
#include <cmath>

#include "core/error.h"
#include "core/json_describe.h"

namespace ft {
using nlohmann::json;

namespace {

std::string describe(const json& v) { return describe_json_value(v); }

[[noreturn]] void damaged(const std::string& file, const std::string& key,
                          const std::string& what) {
  throw Error(file + ": loss_scaler" + (key.empty() ? "" : "." + key) + ": " + what +
              "; the checkpoint is damaged");
}

const json& field(const json& j, const std::string& file, const char* key) {
  const auto it = j.find(key);
  if (it == j.end()) damaged(file, key, "missing");
  return *it;
}

// A JSON integer (not 3.0, not a bool, not a string) in [lo, hi].
int64_t integer(const json& j, const std::string& file, const char* key, int64_t lo, int64_t hi) {
  const json& v = field(j, file, key);
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u <= uint64_t(hi) && int64_t(u) >= lo) return int64_t(u);
  } else if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i >= lo && i <= hi) return i;
  }
  damaged(file, key,
          detail::concat("expected an integer from ", lo, " to ", hi, ", found ", describe(v)));
}

}  // namespace

json LossScalerState::to_json() const {
  return {{"scale", scale},
          {"clean_steps", clean_steps},
          {"hysteresis_left", hysteresis_left},
          {"consecutive_skipped", consecutive_skipped},
          {"total_skipped", total_skipped}};
}

LossScalerState LossScalerState::from_json(const json& j, const std::string& file) {
  if (!j.is_object()) damaged(file, "", "expected an object, found " + describe(j));
  LossScalerState s;
  const json& scale = field(j, file, "scale");
  // The scale is a real number; a float, or an integer such as 65536 as another writer may
  // put it. It must be one a float holds: the loss is multiplied by it in fp32.
  const double d = scale.is_number() ? scale.get<double>() : 0.0;
  if (!scale.is_number() || !std::isfinite(d) || !(d > 0) || !std::isfinite(float(d)) ||
      float(d) == 0.0f)
    damaged(file, "scale", "expected a finite number > 0, found " + describe(scale));
  s.scale = float(d);
  // Counts of steps: a run has at most 2^40 of them (the checkpoint's own bound on a step).
  const int64_t kMaxSteps = int64_t(1) << 40;
  s.clean_steps = integer(j, file, "clean_steps", 0, kMaxSteps);
  s.hysteresis_left = int(integer(j, file, "hysteresis_left", 1, INT_MAX));
  s.consecutive_skipped = integer(j, file, "consecutive_skipped", 0, kMaxSteps);
  s.total_skipped = integer(j, file, "total_skipped", 0, kMaxSteps);
  if (s.consecutive_skipped > s.total_skipped)
    damaged(file, "consecutive_skipped",
            detail::concat(s.consecutive_skipped, " exceeds total_skipped ", s.total_skipped));
  return s;
}

LossScaler::LossScaler(const LossScalerConfig& cfg) : cfg_(cfg) {
  FT_CHECK(cfg.loss_scale >= 0 && cfg.initial_scale > 0 && cfg.min_scale > 0 &&
               cfg.min_scale <= cfg.initial_scale && cfg.window >= 1 && cfg.hysteresis >= 1 &&
               cfg.max_skipped_steps >= 1,
           "invalid loss scaler settings (the recipe validation should have refused them)");
  s_.scale = float(dynamic() ? cfg.initial_scale : cfg.loss_scale);
  s_.hysteresis_left = cfg.hysteresis;
}

LossScaler::Decision LossScaler::update(bool found_inf) {
  Decision d;
  if (!found_inf) {
    s_.consecutive_skipped = 0;
    if (!dynamic()) return d;
    // `>=`, not `==`: a checkpoint saved with a longer window may hold more clean steps than
    // this window; the scale then grows on the first clean step, as it was due to.
    if (++s_.clean_steps >= cfg_.window) {
      s_.clean_steps = 0;
      s_.hysteresis_left = cfg_.hysteresis;
      // As PyTorch's GradScaler: a doubling that would not be finite is not taken.
      const float grown = s_.scale * 2.0f;
      if (std::isfinite(grown)) s_.scale = grown;
    }
    return d;
  }
  d.skip = true;
  ++s_.consecutive_skipped;
  ++s_.total_skipped;
  const float used = s_.scale;
  if (!dynamic()) {
    d.reason = detail::concat("gradient overflow at the static loss scale ", used,
                              " (training.loss_scale): step skipped");
  } else {
    s_.clean_steps = 0;
    if (s_.hysteresis_left > 1) {
      --s_.hysteresis_left;
      d.reason = detail::concat(
          "gradient overflow at loss scale ", used,
          ": step skipped, scale kept (training.loss_scale_hysteresis: ", s_.hysteresis_left,
          " more overflow", s_.hysteresis_left == 1 ? "" : "s", " before it halves)");
    } else if (double(used) <= cfg_.min_scale) {
      d.stop = true;
      d.reason = detail::concat(
          "gradient overflow at the minimum loss scale ", used,
          " (training.min_loss_scale): the gradients overflow even unscaled, so fp16 cannot "
          "train this step; try precision bf16, a lower optimizer.lr, or a lower min_loss_scale");
    } else {
      s_.scale = float(std::max(double(used) * 0.5, cfg_.min_scale));
      d.reason = detail::concat("gradient overflow at loss scale ", used,
                                ": step skipped, scale reduced to ", s_.scale);
    }
  }
  if (!d.stop && s_.consecutive_skipped >= cfg_.max_skipped_steps) {
    d.stop = true;
    d.reason = detail::concat(
        s_.consecutive_skipped, s_.consecutive_skipped == 1 ? " step" : " consecutive steps",
        " skipped for gradient overflow (training.max_skipped_steps ", cfg_.max_skipped_steps,
        "), the last at loss scale ", used,
        ": the loss or the gradients are not finite at any scale; check the data and "
        "optimizer.lr, or try precision bf16");
  }
  return d;
}

void LossScaler::restore(const LossScalerState& s) {
  s_ = s;
  if (!dynamic()) {
    s_.scale = float(cfg_.loss_scale);  // the recipe's static scale is the scale
    return;
  }
  s_.scale = float(std::max(double(s.scale), cfg_.min_scale));
  s_.hysteresis_left = std::min(s.hysteresis_left, cfg_.hysteresis);
}

void LossScaler::from_json(const json& j, const std::string& file) {
  restore(LossScalerState::from_json(j, file));
}

}  // namespace ft
