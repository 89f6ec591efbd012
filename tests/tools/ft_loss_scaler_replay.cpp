// Replays a sequence of overflow findings through ft's LossScaler, for the reference check
// tests/ref/test_loss_scaler.py (which computes the same sequences with PyTorch's GradScaler
// rule, DeepSpeed's and Megatron's).
//
//   ft_loss_scaler_replay LOSS_SCALE INITIAL MIN WINDOW HYSTERESIS MAX_SKIPPED PATTERN
//
// PATTERN has one character per step: '.' a clean step, 'x' an overflow. Prints one line per
// step, until the first stop: "<scale used> <skip 0|1> <stop 0|1> <scale after>", scales in
// C's %a (hexadecimal, exact). A stop ends the run, so nothing follows it.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "optim/loss_scaler.h"

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr, "usage: %s LOSS_SCALE INITIAL MIN WINDOW HYSTERESIS MAX_SKIPPED PATTERN\n",
                 argv[0]);
    return 2;
  }
  ft::LossScalerConfig c;
  c.loss_scale = std::strtod(argv[1], nullptr);
  c.initial_scale = std::strtod(argv[2], nullptr);
  c.min_scale = std::strtod(argv[3], nullptr);
  c.window = std::strtoll(argv[4], nullptr, 10);
  c.hysteresis = std::atoi(argv[5]);
  c.max_skipped_steps = std::strtoll(argv[6], nullptr, 10);
  const std::string pattern = argv[7];
  try {
    ft::LossScaler scaler(c);
    for (char ch : pattern) {
      if (ch != '.' && ch != 'x') {
        std::fprintf(stderr, "PATTERN takes '.' and 'x' only, got '%c'\n", ch);
        return 2;
      }
      const float used = scaler.scale();
      const ft::LossScaler::Decision d = scaler.update(ch == 'x');
      std::printf("%a %d %d %a\n", double(used), int(d.skip), int(d.stop), double(scaler.scale()));
      if (d.stop) break;
    }
  } catch (const ft::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
