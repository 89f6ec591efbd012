// The harness's engine (op_harness.h): place a case's tensors on a device, run it, bring the
// outputs back, compare them with the reference's and say where they differ most.
#include "tests/ops/op_harness.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <sstream>

#include "core/error.h"
#include "core/half.h"
#include "runtime/profile.h"

namespace ft::op_test {

size_t elem_size(Elem e) {
  switch (e) {
    case Elem::kF32:
      return 4;
    case Elem::kBF16:
      return 2;
    case Elem::kF16:
      return 2;
    case Elem::kF64:
      return 8;
    case Elem::kI32:
      return 4;
    case Elem::kU8:
      return 1;
  }
  return 1;
}

const char* elem_name(Elem e) {
  switch (e) {
    case Elem::kF32:
      return "f32";
    case Elem::kBF16:
      return "bf16";
    case Elem::kF16:
      return "f16";
    case Elem::kF64:
      return "f64";
    case Elem::kI32:
      return "i32";
    case Elem::kU8:
      return "u8";
  }
  return "?";
}

DType dtype_of(Elem e) {
  switch (e) {
    case Elem::kF32:
      return DType::kF32;
    case Elem::kBF16:
      return DType::kBF16;
    case Elem::kF16:
      return DType::kF16;
    default:
      FT_FAIL("op harness: ", elem_name(e), " is not an element type of a Ref");
  }
}

const std::vector<std::string>& op_names() {
  static const std::vector<std::string> names = {
#define FT_OP(name, family, params, args) #name,
#include "runtime/op_list.h"
  };
  return names;
}

std::vector<std::string> check_coverage(const std::vector<Case>& cases) {
  std::map<std::string, size_t> count;
  for (const std::string& op : op_names()) count[op] = 0;
  std::vector<std::string> problems;
  for (const Case& c : cases) {
    auto it = count.find(c.op);
    if (it == count.end())
      problems.push_back("a case of '" + c.op + "', which is no op of runtime/op_list.h");
    else
      ++it->second;
  }
  for (const std::string& op : op_names())
    if (count[op] == 0)
      problems.push_back("op '" + op +
                         "' of runtime/op_list.h has no conformance case: add "
                         "them in tests/ops/op_cases.cpp (add_" +
                         op + "_cases)");
  return problems;
}

namespace {

// A case's tensors in one device's memory, freed on scope exit (also when the op throws).
class Placed {
 public:
  Placed(Device& dev, const std::vector<Tensor>& ts) : dev_(dev) {
    for (const Tensor& t : ts) {
      const size_t e = elem_size(t.elem);
      if (t.null || t.alias >= 0) {
        bases_.push_back(nullptr);
        sizes_.push_back(0);
        ptrs_.push_back(nullptr);
        continue;
      }
      const size_t bytes = (t.count() + t.offset) * e;
      void* base = dev.alloc(bytes ? bytes : 1);
      bases_.push_back(base);
      sizes_.push_back(bytes ? bytes : 1);
      void* p = static_cast<char*>(base) + t.offset * e;
      ptrs_.push_back(p);
      if (!t.host.empty()) dev.copy_from_host(p, t.host.data(), t.host.size());
    }
    for (size_t i = 0; i < ts.size(); ++i)
      if (!ts[i].null && ts[i].alias >= 0) ptrs_[i] = ptrs_[size_t(ts[i].alias)];
  }
  ~Placed() {
    for (size_t i = 0; i < bases_.size(); ++i)
      if (bases_[i]) dev_.free(bases_[i], sizes_[i]);
  }
  Placed(const Placed&) = delete;
  Placed& operator=(const Placed&) = delete;
  const std::vector<void*>& ptrs() const { return ptrs_; }

 private:
  Device& dev_;
  std::vector<void*> bases_, ptrs_;
  std::vector<size_t> sizes_;
};

bool compared(const Tensor& t) { return t.role != Role::kIn && !t.null; }

// Runs the case (`call`: its run or its twin) on dev; the outputs' bytes, in the order of the
// tensors that are outputs.
std::vector<std::vector<uint8_t>> run_on(const Case& c, Device& dev,
                                         const std::function<void(Device&, const Args&)>& call) {
  const Placed placed(dev, c.tensors);
  call(dev, Args(c.tensors, placed.ptrs()));
  dev.synchronize();
  std::vector<std::vector<uint8_t>> outs;
  for (size_t i = 0; i < c.tensors.size(); ++i) {
    const Tensor& t = c.tensors[i];
    if (!compared(t)) continue;
    outs.emplace_back(t.host.size());
    if (!t.host.empty()) dev.copy_to_host(outs.back().data(), placed.ptrs()[i], t.host.size());
  }
  return outs;
}

double value_at(Elem e, const uint8_t* p) {
  switch (e) {
    case Elem::kF32: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case Elem::kBF16: {
      bf16 v;
      std::memcpy(&v, p, 2);
      return to_f32(v);
    }
    case Elem::kF16: {
      f16 v;
      std::memcpy(&v, p, 2);
      return to_f32(v);
    }
    case Elem::kF64: {
      double v;
      std::memcpy(&v, p, 8);
      return v;
    }
    case Elem::kI32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case Elem::kU8:
      return *p;
  }
  return 0;
}

// The spacing of e's values at w, away from zero (the gap one rounding can open); 0 where w is
// not finite.
double ulp_at(Elem e, const uint8_t* p) {
  const double w = value_at(e, p);
  if (!std::isfinite(w)) return 0;
  switch (e) {
    case Elem::kF32: {
      const float a = std::fabs(float(w));
      return double(std::nextafter(a, std::numeric_limits<float>::infinity())) - a;
    }
    case Elem::kBF16:
    case Elem::kF16: {
      uint16_t bits;
      std::memcpy(&bits, p, 2);
      const uint16_t mag = bits & 0x7fff, next = uint16_t(mag + 1);
      uint8_t a[2], b[2];
      std::memcpy(a, &mag, 2);
      std::memcpy(b, &next, 2);
      return value_at(e, b) - value_at(e, a);
    }
    case Elem::kF64: {
      const double a = std::fabs(w);
      return std::nextafter(a, std::numeric_limits<double>::infinity()) - a;
    }
    default:
      return 0;
  }
}

std::string hex_bits(const uint8_t* p, size_t n) {
  uint64_t b = 0;
  std::memcpy(&b, p, n);
  char s[24];
  std::snprintf(s, sizeof s, "0x%0*llx", int(2 * n), (unsigned long long)b);
  return s;
}

std::string num(double v) {
  char s[40];
  std::snprintf(s, sizeof s, "%.9g", v);
  return s;
}

// Empty when `got` is within the tensor's tolerance of `want` (the same bits when
// bits_only), else what differs: how many elements, and the worst one.
std::string compare(const Tensor& t, const std::vector<uint8_t>& got,
                    const std::vector<uint8_t>& want, bool bits_only, double* worst_ratio) {
  const size_t n = t.count(), es = elem_size(t.elem);
  *worst_ratio = 0;
  if (bits_only || t.tol.exact()) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; ++i)
      if (std::memcmp(&got[i * es], &want[i * es], es) != 0 && bad++ == 0) first = i;
    if (bad == 0) return "";
    *worst_ratio = std::numeric_limits<double>::infinity();
    std::ostringstream m;
    m << t.name << ": " << bad << " of " << n << " elements differ in bits ("
      << (bits_only ? "the same kernels as the reference" : "an exact op") << "); first at ["
      << first << "]: got " << num(value_at(t.elem, &got[first * es])) << " ("
      << hex_bits(&got[first * es], es) << "), want " << num(value_at(t.elem, &want[first * es]))
      << " (" << hex_bits(&want[first * es], es) << ")";
    return m.str();
  }
  double amax = 0;
  for (size_t i = 0; i < n; ++i) {
    const double w = std::fabs(value_at(t.elem, &want[i * es]));
    if (std::isfinite(w) && w > amax) amax = w;
  }
  size_t bad = 0, at = 0;
  double worst = -1, worst_err = 0, worst_bound = 0;
  for (size_t i = 0; i < n; ++i) {
    const double g = value_at(t.elem, &got[i * es]), w = value_at(t.elem, &want[i * es]);
    double err = std::fabs(g - w), bound = 0, ratio;
    if (std::isnan(w) || std::isnan(g) || std::isinf(w) || std::isinf(g)) {
      const bool same = (std::isnan(w) && std::isnan(g)) || g == w;
      ratio = same ? 0 : std::numeric_limits<double>::infinity();
      err = same ? 0 : std::numeric_limits<double>::infinity();
    } else {
      const double s = !t.scale.empty() ? t.scale[i] : t.tol.abs_of_max ? amax : 1.0;
      bound = t.tol.rel * std::fabs(w) + t.tol.abs * s + t.tol.ulps * ulp_at(t.elem, &want[i * es]);
      ratio = err == 0 ? 0 : bound > 0 ? err / bound : std::numeric_limits<double>::infinity();
    }
    if (ratio > 1) ++bad;
    if (ratio > worst) worst = ratio, at = i, worst_err = err, worst_bound = bound;
  }
  *worst_ratio = worst;
  if (bad == 0) return "";
  std::ostringstream m;
  m << t.name << ": " << bad << " of " << n << " elements beyond the bound; worst at [" << at
    << "]: got " << num(value_at(t.elem, &got[at * es])) << ", want "
    << num(value_at(t.elem, &want[at * es])) << ", error " << num(worst_err) << " (bound "
    << num(worst_bound) << ")";
  return m.str();
}

// Empty when two runs' outputs have the same bits, else where they first differ.
std::string compare_runs(const Tensor& t, const std::vector<uint8_t>& a,
                         const std::vector<uint8_t>& b) {
  const size_t n = t.count(), es = elem_size(t.elem);
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < n; ++i)
    if (std::memcmp(&a[i * es], &b[i * es], es) != 0 && bad++ == 0) first = i;
  if (bad == 0) return "";
  std::ostringstream m;
  m << t.name << ": " << bad << " of " << n << " elements differ between two runs on the device"
    << " (not deterministic); first at [" << first << "]: " << num(value_at(t.elem, &a[first * es]))
    << " (" << hex_bits(&a[first * es], es) << "), then " << num(value_at(t.elem, &b[first * es]))
    << " (" << hex_bits(&b[first * es], es) << ")";
  return m.str();
}

// Empty when the case's twin gives `outs`' bits on dev (its calls left out of dev's profile),
// else where an output first differs, or what the twin threw.
std::string check_twin(const Case& c, Device& dev, const std::vector<std::vector<uint8_t>>& outs) {
  struct Unrecorded {  // the profile not recording for its scope, then as it was
    OpProfile* p;
    bool was;
    explicit Unrecorded(OpProfile* prof) : p(prof), was(prof && prof->recording) {
      if (p) p->recording = false;
    }
    ~Unrecorded() {
      if (p) p->recording = was;
    }
  };
  std::vector<std::vector<uint8_t>> twin;
  try {
    const Unrecorded off(dev.profile());
    twin = run_on(c, dev, c.twin);
  } catch (const std::exception& e) {
    return "its twin (" + c.twin_what + ") threw: " + e.what();
  }
  for (size_t i = 0, k = 0; i < c.tensors.size(); ++i) {
    const Tensor& t = c.tensors[i];
    if (!compared(t)) continue;
    const size_t n = t.count(), es = elem_size(t.elem);
    size_t bad = 0, first = 0;
    for (size_t e = 0; e < n; ++e)
      if (std::memcmp(&outs[k][e * es], &twin[k][e * es], es) != 0 && bad++ == 0) first = e;
    if (bad) {
      std::ostringstream m;
      m << t.name << ": " << bad << " of " << n << " elements differ in bits from its twin ("
        << c.twin_what << ") on the same device; first at [" << first
        << "]: " << num(value_at(t.elem, &outs[k][first * es])) << " ("
        << hex_bits(&outs[k][first * es], es) << "), the twin "
        << num(value_at(t.elem, &twin[k][first * es])) << " (" << hex_bits(&twin[k][first * es], es)
        << ")";
      return m.str();
    }
    ++k;
  }
  return "";
}

}  // namespace

Report run_cases(const std::vector<Case>& cases, Device& dev, Device& ref, const Options& o) {
  Report r;
  for (const Case& c : cases) {
    ++r.cases;
    ++r.cases_per_op[c.op];
    const std::string what = c.op + " " + c.dtype + " " + c.shape;
    std::string failure;
    double worst = 0;
    std::vector<std::vector<uint8_t>> want, got, again;
    try {
      want = run_on(c, ref, c.run);
    } catch (const std::exception& e) {
      failure = "the reference (" + ref.name() + ") threw: " + e.what();
    }
    if (failure.empty() && c.relation) {
      const std::string broken = c.relation(want);
      if (!broken.empty()) failure = "on the reference (" + ref.name() + "): " + broken;
    }
    if (failure.empty() && c.twin) {
      const std::string broken = check_twin(c, ref, want);
      if (!broken.empty()) failure = "on the reference (" + ref.name() + "): " + broken;
    }
    if (failure.empty()) {
      try {
        if (o.before_run) o.before_run(0);
        got = run_on(c, dev, c.run);
        if (o.twice) {
          if (o.before_run) o.before_run(1);
          again = run_on(c, dev, c.run);
        }
      } catch (const std::exception& e) {
        failure = std::string("threw: ") + e.what();
      }
      if (failure.empty() && c.relation) failure = c.relation(got);
      if (failure.empty() && c.relation && o.twice) failure = c.relation(again);
      if (failure.empty() && c.twin) failure = check_twin(c, dev, got);
    }
    for (size_t i = 0, k = 0; failure.empty() && i < c.tensors.size(); ++i) {
      if (!compared(c.tensors[i])) continue;
      double ratio = 0;
      failure = compare(c.tensors[i], got[k], want[k], o.same_kernels, &ratio);
      if (failure.empty() && o.twice) failure = compare_runs(c.tensors[i], got[k], again[k]);
      worst = std::max(worst, ratio);
      ++k;
    }
    std::string line;
    if (failure.empty()) {
      line = "ok   " + what + " (worst error / bound " + num(worst) + ")";
    } else {
      line = "FAIL " + what + " on " + dev.name() + ": " + failure;
      r.failures.push_back(line);
    }
    if (o.on_case) o.on_case(line);
  }
  return r;
}

}  // namespace ft::op_test
