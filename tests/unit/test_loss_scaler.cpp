// The fp16 loss scaler (lib/optim/loss_scaler.h): sequences of overflow findings worked out by
// hand from the rules at the top of loss_scaler.h, the stops, and the checkpoint state. A
// pattern has one character per step: '.' a clean step, 'x' an overflow (found_inf).
// tests/ref/test_loss_scaler.py checks longer random sequences against transcriptions of
// PyTorch's GradScaler, DeepSpeed's and Megatron's rules.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "optim/loss_scaler.h"
#include "recipe/recipe.h"

namespace ft {
namespace {

LossScalerConfig dynamic_config(double initial, int64_t window, int hysteresis,
                                double min_scale = 1, int64_t max_skipped = 1000) {
  LossScalerConfig c = loss_scaler_config(TrainingConfig{});
  c.initial_scale = initial;
  c.window = window;
  c.hysteresis = hysteresis;
  c.min_scale = min_scale;
  c.max_skipped_steps = max_skipped;
  return c;
}

struct Step {
  float used;  // scale() before update: the scale this step ran with
  bool skip, stop;
  float after;  // scale() after update: the next step's
  std::string reason;
};

std::vector<Step> run(LossScaler& s, const std::string& pattern) {
  std::vector<Step> out;
  for (char ch : pattern) {
    const float used = s.scale();
    const LossScaler::Decision d = s.update(ch == 'x');
    out.push_back({used, d.skip, d.stop, s.scale(), d.reason});
  }
  return out;
}

// The scales after each step.
std::vector<float> scales_after(const std::vector<Step>& steps) {
  std::vector<float> v;
  for (const Step& s : steps) v.push_back(s.after);
  return v;
}

std::string skips(const std::vector<Step>& steps) {
  std::string v;
  for (const Step& s : steps) v += s.stop ? 'S' : s.skip ? 'x' : '.';
  return v;
}

}  // namespace

TEST_CASE("loss scaler: the recipe's defaults are DeepSpeed's") {
  const LossScalerConfig c = loss_scaler_config(TrainingConfig{});
  CHECK(c.loss_scale == 0);         // dynamic
  CHECK(c.initial_scale == 65536);  // 2^initial_scale_power, power 16
  CHECK(c.window == 1000);
  CHECK(c.hysteresis == 2);
  CHECK(c.min_scale == 1);
  CHECK(c.max_skipped_steps == 100);
  LossScaler s(c);
  CHECK(s.dynamic());
  CHECK(s.scale() == 65536.0f);
  CHECK(s.state().hysteresis_left == 2);
  CHECK(s.total_skipped() == 0);
}

TEST_CASE("loss scaler: the scale doubles after exactly `window` clean steps") {
  // window 3, from 8: clean steps 1 and 2 keep 8, the 3rd doubles to 16 (the counter restarts),
  // steps 4-5 keep 16, step 6 doubles to 32. Nothing is skipped.
  LossScaler s(dynamic_config(8, 3, 1));
  const auto steps = run(s, "......");
  CHECK(scales_after(steps) == std::vector<float>{8, 8, 16, 16, 16, 32});
  CHECK(skips(steps) == "......");
  CHECK(steps[2].used == 8.0f);  // the growing step itself ran at the old scale
  CHECK(steps[0].reason.empty());
  // window 1: every clean step doubles.
  LossScaler every(dynamic_config(1, 1, 1));
  CHECK(scales_after(run(every, "...")) == std::vector<float>{2, 4, 8});
}

TEST_CASE("loss scaler: an overflow halves the scale and restarts the clean-step count") {
  // window 3, hysteresis 1, from 8: two clean steps (count 2), an overflow halves to 4 and
  // zeroes the count, so the growth comes 3 clean steps after it (step 6), not at step 4.
  LossScaler s(dynamic_config(8, 3, 1));
  const auto steps = run(s, "..x...");
  CHECK(scales_after(steps) == std::vector<float>{8, 8, 4, 4, 4, 8});
  CHECK(skips(steps) == "..x...");
  CHECK(steps[2].used == 8.0f);
  CHECK(steps[2].reason.find("loss scale 8: step skipped, scale reduced to 4") !=
        std::string::npos);
  CHECK(s.total_skipped() == 1);
  CHECK(s.consecutive_skipped() == 0);
}

TEST_CASE("loss scaler: hysteresis 2 forgives one overflow until the scale grows again") {
  // window 4, hysteresis 2, from 64.
  LossScaler s(dynamic_config(64, 4, 2));
  // x: forgiven (64 kept, 1 left); x: halves to 32; x: halves to 16 (still none forgiven).
  auto steps = run(s, "xxx");
  CHECK(scales_after(steps) == std::vector<float>{64, 32, 16});
  CHECK(skips(steps) == "xxx");  // a forgiven overflow is still a skipped step
  CHECK(steps[0].reason.find("scale kept") != std::string::npos);
  CHECK(s.state().hysteresis_left == 1);
  // Clean steps do not restore the forgiveness (DeepSpeed's consecutive_hysteresis false):
  // two clean steps, then an overflow halves 16 to 8 at once.
  steps = run(s, "..x");
  CHECK(scales_after(steps) == std::vector<float>{16, 16, 8});
  // A growth does: 4 clean steps double 8 to 16 and restore it, so the next overflow is
  // forgiven and the one after halves.
  steps = run(s, "....xx");
  CHECK(scales_after(steps) == std::vector<float>{8, 8, 8, 16, 16, 8});
  CHECK(s.total_skipped() == 6);
}

TEST_CASE("loss scaler: hysteresis 3 forgives two overflows, consecutive or not") {
  // window 10, from 1024: x (2 left) . x (1 left) . . x halves to 512.
  LossScaler s(dynamic_config(1024, 10, 3));
  const auto steps = run(s, "x.x..x");
  CHECK(scales_after(steps) == std::vector<float>{1024, 1024, 1024, 1024, 1024, 512});
}

TEST_CASE("loss scaler: the minimum scale clamps, and an overflow at it stops the run") {
  // From 8, min 2, hysteresis 1: x halves to 4, x to 2, x at 2 cannot go lower: stop.
  LossScaler s(dynamic_config(8, 100, 1, 2));
  auto steps = run(s, "xxx");
  CHECK(scales_after(steps) == std::vector<float>{4, 2, 2});
  CHECK(skips(steps) == "xxS");
  CHECK(steps[2].skip);  // a stop never applies the step
  CHECK(steps[2].reason.find("minimum loss scale 2") != std::string::npos);
  CHECK(steps[2].reason.find("training.min_loss_scale") != std::string::npos);

  // A minimum that is not a power of two: 8 → 4 → max(2, 3) = 3 → stop.
  LossScaler odd(dynamic_config(8, 100, 1, 3));
  CHECK(skips(run(odd, "xxx")) == "xxS");
  CHECK(odd.scale() == 3.0f);

  // Hysteresis applies at the minimum too (as DeepSpeed, whose raise comes only when a halving
  // is due): from 2 = min with hysteresis 2, the first overflow is forgiven, the second stops.
  LossScaler at_min(dynamic_config(2, 100, 2, 2));
  CHECK(skips(run(at_min, "xx")) == "xS");

  // Growth from the minimum works as anywhere: 1 → x forgiven → 4 clean → 2.
  LossScaler grow(dynamic_config(1, 4, 2, 1));
  CHECK(scales_after(run(grow, "x....")) == std::vector<float>{1, 1, 1, 1, 2});
}

TEST_CASE("loss scaler: a static scale never changes; an overflow still skips") {
  LossScalerConfig c = dynamic_config(65536, 2, 1, 1, 3);
  c.loss_scale = 1024;
  LossScaler s(c);
  CHECK_FALSE(s.dynamic());
  CHECK(s.scale() == 1024.0f);
  // Clean steps never grow it (window 2 would have), overflows never halve it, and there is no
  // minimum to stop at: only max_skipped_steps (3) ends it, at the 3rd consecutive skip.
  auto steps = run(s, "....x.x.xx");
  CHECK(skips(steps) == "....x.x.xx");
  for (const Step& st : steps) CHECK(st.after == 1024.0f);
  CHECK(steps[4].reason.find("static loss scale 1024") != std::string::npos);
  steps = run(s, "x");
  CHECK(skips(steps) == "S");
  CHECK(steps[0].reason.find("3 consecutive steps skipped") != std::string::npos);
  CHECK(steps[0].reason.find("training.max_skipped_steps 3") != std::string::npos);
  CHECK(s.total_skipped() == 5);
}

TEST_CASE("loss scaler: max_skipped_steps counts consecutive skips only") {
  // From 2^16, hysteresis 1, max 3: x x (2 in a row) . (back to 0) x x x: the 3rd stops.
  LossScaler s(dynamic_config(65536, 1000, 1, 1, 3));
  const auto steps = run(s, "xx.xxx");
  CHECK(skips(steps) == "xx.xxS");
  CHECK(scales_after(steps) == std::vector<float>{32768, 16384, 16384, 8192, 4096, 2048});
  CHECK(s.consecutive_skipped() == 3);
  CHECK(s.total_skipped() == 5);
  // max 1: the first overflow stops.
  LossScaler one(dynamic_config(65536, 1000, 2, 1, 1));
  const auto first = run(one, "x");
  CHECK(skips(first) == "S");
  CHECK(first[0].reason.find("1 step skipped for gradient overflow") != std::string::npos);
}

TEST_CASE("loss scaler: the scale grows only while it stays a finite float") {
  // 2^127 · 2 is inf in fp32: GradScaler keeps the scale then, and so does ft; the clean-step
  // count still restarts.
  LossScaler s(dynamic_config(std::ldexp(1.0, 127), 1, 1));
  CHECK(scales_after(run(s, "..")) ==
        std::vector<float>{std::ldexp(1.0f, 127), std::ldexp(1.0f, 127)});
  CHECK(s.state().clean_steps == 0);
}

TEST_CASE("loss scaler: PyTorch GradScaler's sequence with hysteresis 1 and window = interval") {
  // GradScaler (torch.cuda.amp, _amp_update_scale_), transcribed: overflow: scale · 0.5,
  // tracker 0; clean: tracker + 1, and at growth_interval: scale · 2 if finite, tracker 0.
  // No minimum: ft's is set far below anything reached.
  const int64_t interval = 7;
  float gs_scale = 65536.0f;
  int64_t tracker = 0;
  LossScaler s(dynamic_config(65536, interval, 1, std::ldexp(1.0, -120), 1 << 20));
  uint64_t x = 12345;
  int overflows = 0, growths = 0;
  for (int i = 0; i < 3000; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    const bool inf = (x >> 33) % 100 < 10;  // 10% of steps overflow
    if (inf) {
      gs_scale *= 0.5f;
      tracker = 0;
      ++overflows;
    } else if (++tracker == interval) {
      if (std::isfinite(gs_scale * 2.0f)) gs_scale *= 2.0f;
      tracker = 0;
      ++growths;
    }
    const LossScaler::Decision d = s.update(inf);
    CHECK(d.skip == inf);
    CHECK_FALSE(d.stop);
    REQUIRE(s.scale() == gs_scale);
  }
  // The walk went both ways.
  CHECK(overflows > 100);
  CHECK(growths > 100);
}

TEST_CASE("loss scaler: the JSON state resumes with identical behaviour") {
  const LossScalerConfig c = dynamic_config(4096, 5, 2, 1, 1000);
  const std::string before = "..x.x...xx......x.", after = "x..x.....xxx.......x..x...";
  // Uninterrupted.
  LossScaler a(c);
  run(a, before);
  const auto want = run(a, after);
  // Saved after `before` (through the text of a manifest), restored into a fresh scaler.
  LossScaler b(c);
  run(b, before);
  const std::string text = b.to_json().dump();
  LossScaler resumed(c);
  resumed.from_json(nlohmann::json::parse(text), "m.json");
  CHECK(resumed.state() == b.state());
  const auto got = run(resumed, after);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i].used == want[i].used);
    CHECK(got[i].after == want[i].after);
    CHECK(got[i].skip == want[i].skip);
    CHECK(got[i].stop == want[i].stop);
  }
  CHECK(resumed.state() == a.state());
  // A fresh scaler would not have behaved the same: the state carried something.
  LossScaler fresh(c);
  CHECK(scales_after(run(fresh, after)) != scales_after(want));
  // The fields, as DESIGN.md §8 documents them.
  const nlohmann::json j = a.to_json();
  CHECK(j.size() == 5);
  CHECK(j.at("scale").get<double>() == double(a.scale()));
  CHECK(j.at("clean_steps") == a.state().clean_steps);
  CHECK(j.at("hysteresis_left") == a.state().hysteresis_left);
  CHECK(j.at("consecutive_skipped") == a.consecutive_skipped());
  CHECK(j.at("total_skipped") == a.total_skipped());
}

TEST_CASE("loss scaler: a state saved under other settings is adapted to the recipe's") {
  LossScalerState saved;
  saved.scale = 2;
  saved.clean_steps = 40;
  saved.hysteresis_left = 3;
  saved.consecutive_skipped = 1;
  saved.total_skipped = 9;
  // Dynamic, min 8, hysteresis 2, window 10: the scale clamps up to 8, the forgiveness down to
  // 2, and 40 clean steps already past the window grow the scale at the next clean step.
  LossScaler d(dynamic_config(65536, 10, 2, 8));
  d.restore(saved);
  CHECK(d.scale() == 8.0f);
  CHECK(d.state().hysteresis_left == 2);
  CHECK(d.total_skipped() == 9);
  CHECK(scales_after(run(d, ".")) == std::vector<float>{16});
  // Static: the recipe's scale, whatever was saved; the counters carry on.
  LossScalerConfig c = dynamic_config(65536, 10, 2);
  c.loss_scale = 128;
  LossScaler s(c);
  s.restore(saved);
  CHECK(s.scale() == 128.0f);
  CHECK(s.consecutive_skipped() == 1);
}

TEST_CASE("loss scaler: a damaged state is refused, naming the key") {
  using J = nlohmann::json;
  const J good = {{"scale", 1024.0},
                  {"clean_steps", 3},
                  {"hysteresis_left", 2},
                  {"consecutive_skipped", 1},
                  {"total_skipped", 4}};
  CHECK(LossScalerState::from_json(good, "m.json").scale == 1024.0f);
  // An integer scale, as another writer may put it, is a number like any other.
  J int_scale = good;
  int_scale["scale"] = 1024;
  CHECK(LossScalerState::from_json(int_scale, "m.json").scale == 1024.0f);
  struct Case {
    const char* what;
    J value;
    std::string key;
  };
  auto with = [&](const char* key, J v) {
    J j = good;
    if (v.is_discarded()) {
      j.erase(key);
    } else {
      j[key] = v;
    }
    return j;
  };
  const J gone = J(J::value_t::discarded);
  const std::vector<Case> cases = {
      {"not an object", J::array({1, 2}), ""},
      {"no scale", with("scale", gone), "scale"},
      {"scale 0", with("scale", 0.0), "scale"},
      {"scale -2", with("scale", -2.0), "scale"},
      {"scale beyond a float", with("scale", 1e300), "scale"},
      {"scale below a float", with("scale", 1e-300), "scale"},
      {"scale a string", with("scale", "65536"), "scale"},
      {"scale a bool", with("scale", true), "scale"},
      {"clean_steps -1", with("clean_steps", -1), "clean_steps"},
      {"clean_steps 2.5", with("clean_steps", 2.5), "clean_steps"},
      {"clean_steps 3.0 (a float, even if whole)", with("clean_steps", 3.0), "clean_steps"},
      {"clean_steps 2^62", with("clean_steps", int64_t(1) << 62), "clean_steps"},
      {"hysteresis_left 0", with("hysteresis_left", 0), "hysteresis_left"},
      {"hysteresis_left 2^40", with("hysteresis_left", int64_t(1) << 40), "hysteresis_left"},
      {"no total_skipped", with("total_skipped", gone), "total_skipped"},
      {"total_skipped null", with("total_skipped", nullptr), "total_skipped"},
      {"consecutive_skipped past total_skipped", with("consecutive_skipped", 5),
       "consecutive_skipped"},
  };
  for (const Case& k : cases) {
    CAPTURE(k.what);
    try {
      LossScalerState::from_json(k.value, "step_00000004/manifest.json");
      FAIL("accepted: ", k.what);
    } catch (const Error& e) {
      const std::string want = "step_00000004/manifest.json: loss_scaler" +
                               (k.key.empty() ? std::string(":") : "." + k.key + ":");
      CHECK(std::string(e.what()).find(want) != std::string::npos);
      CHECK(std::string(e.what()).find("the checkpoint is damaged") != std::string::npos);
    }
  }
}

}  // namespace ft
