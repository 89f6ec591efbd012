// NCCL on a real GPU, one rank (issue 17, point 6), for the GPU check's nccl stage: the NCCL
// communicator (lib/comm/nccl_communicator.cpp) made as ft makes it (make_device_world("nccl")
// over the one-process communicator: ncclGetUniqueId, ncclCommInitRank), split twice
// (ncclCommSplit), and every collective ft uses, on each of the three groups, against the same
// call through HostStagedCommunicator on the same device: all_reduce (sum, max), all_gather (in
// and out of place) and broadcast in f32, f64, bf16 and f16, reduce_scatter in f32 (its
// contract), random data, the results bit for bit (and equal to what one rank must give: its
// own data). Then the stream order of a call's handle: a call reads its input after the work
// queued before it on the caller's stream, and both wait() and wait_on(stream) order what
// follows after the call. Then that the collective watchdog reuses its CUDA events across calls,
// and last a call recorded into a CUDA graph and launched three times.
// send/recv need two ranks and are not checked here (the two-rank runs
// of gpu_check.py's nccl stage use them only with a pipeline; they run none).
//
//   ft_nccl_check        exit 0: all held; 1: a check failed; 77: no usable GPU ("no GPU: ...")
//                        or no usable NCCL ("no NCCL: ..."), with the reason
// Built against the real NCCL (ft_nccl, libnccl.so.2 opened on first use: LD_LIBRARY_PATH must
// reach it) and, as ft_nccl_check_emu (ctest cuda_emu_nccl_check), against the emulated NCCL.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "runtime/device.h"
#if FT_HAVE_CUDA && FT_HAVE_NCCL
#include "comm/communicator.h"
#include "comm/device_comm.h"
#include "comm/host_staging.h"
#include "core/half.h"
#include "runtime/cuda/cuda_device.h"
#endif

#if FT_HAVE_CUDA && FT_HAVE_NCCL
namespace {

using namespace ft;

int failures = 0, passed = 0;
void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  (ok ? passed : failures)++;
}

// Device memory of `bytes`, freed with the device's allocator.
class DeviceBlock {
 public:
  DeviceBlock(Device& dev, size_t bytes) : dev_(dev), bytes_(bytes), ptr_(dev.alloc(bytes)) {}
  ~DeviceBlock() { dev_.free(ptr_, bytes_); }
  DeviceBlock(const DeviceBlock&) = delete;
  DeviceBlock& operator=(const DeviceBlock&) = delete;
  std::byte* ptr() const { return static_cast<std::byte*>(ptr_); }
  void upload(const std::vector<std::byte>& h) { dev_.copy_from_host(ptr_, h.data(), h.size()); }
  std::vector<std::byte> download(size_t bytes) const {
    std::vector<std::byte> h(bytes);
    dev_.copy_to_host(h.data(), ptr_, bytes);
    return h;
  }

 private:
  Device& dev_;
  size_t bytes_;
  void* ptr_;
};

std::mt19937_64 rng(20261126);

// n random finite values of dtype t (normal, scale 10), as bytes.
std::vector<std::byte> random_values(DType t, size_t n) {
  std::normal_distribution<double> normal(0.0, 10.0);
  std::vector<std::byte> out(n * dtype_size(t));
  for (size_t i = 0; i < n; ++i) {
    const double x = normal(rng);
    std::byte* p = out.data() + i * dtype_size(t);
    switch (t) {
      case DType::kF32: {
        const float f = float(x);
        std::memcpy(p, &f, 4);
        break;
      }
      case DType::kF64:
        std::memcpy(p, &x, 8);
        break;
      case DType::kBF16: {
        const bf16 b = to_bf16(float(x));
        std::memcpy(p, &b, 2);
        break;
      }
      case DType::kF16: {
        const f16 h = to_f16(float(x));
        std::memcpy(p, &h, 2);
        break;
      }
      default:
        FT_FAIL("random_values: dtype ", dtype_name(t));
    }
  }
  return out;
}

// The handle waited on one of the two ways, alternately; returns which, for the message.
const char* finish(CommWork w, Device& dev, bool on_stream) {
  if (on_stream) {
    w.wait_on(dev.stream());
    return "wait_on";
  }
  w.wait();
  return "wait";
}

// One call through NCCL and through host staging, from the same input `in` (and initial
// output `init`), the results compared bit for bit with each other and with `expect`.
// `call` makes the call on (communicator, input block, output block); for in-place calls it
// ignores the output block.
template <typename Call>
void compare_call(const std::string& what, Device& dev, Communicator& nccl, Communicator& staged,
                  const std::vector<std::byte>& in, const std::vector<std::byte>& init,
                  bool in_place, const std::vector<std::byte>& expect, bool on_stream, Call call) {
  std::vector<std::byte> got[2];
  const char* how = "";
  for (int k = 0; k < 2; ++k) {
    Communicator& c = k == 0 ? nccl : staged;
    DeviceBlock a(dev, in.size()), b(dev, init.size() ? init.size() : 1);
    a.upload(in);
    if (!init.empty()) b.upload(init);
    CommWork w = call(c, a.ptr(), b.ptr());
    if (k == 0)
      how = finish(std::move(w), dev, on_stream);
    else
      w.wait();
    got[k] = in_place ? a.download(in.size()) : b.download(init.size());
  }
  const bool same = got[0] == got[1], right = got[0] == expect;
  check(same && right, what + " (" + how + "): " +
                           (same ? "same bits as host staging" : "DIFFERS from host staging") +
                           (right ? "" : ", NOT one rank's own data"));
}

void collectives(const std::string& group, Device& dev, Communicator& nccl, Communicator& staged) {
  check(nccl.size() == 1 && nccl.rank() == 0, group + ": size " + std::to_string(nccl.size()) +
                                                  ", rank " + std::to_string(nccl.rank()) + " (" +
                                                  nccl.describe() + ")");
  const Stream s = dev.stream();
  // Odd sizes, one of them over 4 MiB of f32 (NCCL switches protocols with the size).
  const size_t sizes[] = {1, 1000003};
  const DType dtypes[] = {DType::kF32, DType::kF64, DType::kBF16, DType::kF16};
  bool on_stream = false;
  for (DType t : dtypes) {
    const std::string dt = dtype_name(t);
    for (size_t n : sizes) {
      const std::string sz = " n=" + std::to_string(n);
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
        const std::vector<std::byte> x = random_values(t, n);
        compare_call(group + " all_reduce " + (op == ReduceOp::kSum ? "sum " : "max ") + dt + sz,
                     dev, nccl, staged, x, {}, true, x, on_stream = !on_stream,
                     [&](Communicator& c, std::byte* a, std::byte*) {
                       return c.all_reduce(s, Ref(a, t), n, op);
                     });
      }
      {
        const std::vector<std::byte> x = random_values(t, n), junk = random_values(t, n);
        compare_call(group + " all_gather out of place " + dt + sz, dev, nccl, staged, x, junk,
                     false, x, on_stream = !on_stream,
                     [&](Communicator& c, std::byte* a, std::byte* b) {
                       return c.all_gather(s, CRef(a, t), Ref(b, t), n);
                     });
        // In place: this rank's shard is its place in the output (rank 0: the start).
        compare_call(group + " all_gather in place " + dt + sz, dev, nccl, staged, x, {}, true, x,
                     on_stream = !on_stream, [&](Communicator& c, std::byte* a, std::byte*) {
                       return c.all_gather(s, CRef(a, t), Ref(a, t), n);
                     });
        compare_call(group + " broadcast root 0 " + dt + sz, dev, nccl, staged, x, {}, true, x,
                     on_stream = !on_stream, [&](Communicator& c, std::byte* a, std::byte*) {
                       return c.broadcast(s, Ref(a, t), n, 0);
                     });
      }
      if (t == DType::kF32) {
        const std::vector<std::byte> x = random_values(t, n), junk = random_values(t, n);
        compare_call(group + " reduce_scatter f32" + sz, dev, nccl, staged, x, junk, false, x,
                     on_stream = !on_stream, [&](Communicator& c, std::byte* a, std::byte* b) {
                       return c.reduce_scatter(s, CRef(a, t), Ref(b, t), n);
                     });
      }
    }
  }
  std::printf("     %s send/recv: not checked (a peer needs a second rank)\n", group.c_str());
}

// Stream order: the input `in` is zeros, then the compute stream copies the data into it behind
// a queue of large copies (so the copy is still running when the call is made); the call
// (out-of-place all_gather) must read it after them. wait_on: a copy queued on the compute
// stream after the wait reads the result; wait: the host reads it directly.
void stream_order(Device& dev, Communicator& nccl) {
#if defined(FT_CUDA_EMU)
  // The emulated streams finish each call as it is made: the size shows nothing there.
  const size_t n = size_t(1) << 20, bytes = n * 4;
#else
  const size_t n = size_t(16) << 20, bytes = n * 4;  // 64 MiB of f32
#endif
  const std::vector<std::byte> x = random_values(DType::kF32, n);
  DeviceBlock src(dev, bytes), in(dev, bytes), out(dev, bytes), after(dev, bytes),
      scratch(dev, bytes);
  src.upload(x);
  for (bool on_stream : {true, false}) {
    dev.memset_zero(in.ptr(), bytes);
    dev.memset_zero(out.ptr(), bytes);
    dev.memset_zero(after.ptr(), bytes);
    dev.synchronize();
    const Stream s = dev.stream();
    for (int i = 0; i < 16; ++i) dev.copy(s, scratch.ptr(), src.ptr(), bytes);
    dev.copy(s, in.ptr(), src.ptr(), bytes);
    CommWork w = nccl.all_gather(s, CRef(in.ptr(), DType::kF32), Ref(out.ptr(), DType::kF32), n);
    std::vector<std::byte> got;
    if (on_stream) {
      w.wait_on(s);
      dev.copy(s, after.ptr(), out.ptr(), bytes);
      got = after.download(bytes);
    } else {
      w.wait();
      got = out.download(bytes);
    }
    check(got == x,
          "stream order, all_gather of " + std::to_string(bytes >> 20) +
              " MiB behind 16 queued copies, " +
              (on_stream ? "wait_on(compute stream), then a copy on it" : "wait(), then the host") +
              " reads the data: " + (got == x ? "the data" : "NOT the data"));
  }
}

// A call on a stream that is recording a graph (FT_CUDA_GRAPHS; NCCL 2.9+, what ZeRO's
// reducing micro-batch does): recorded, not made (its output untouched by the recording), then
// made at each launch with the data its input holds then; the compute stream's wait for it
// (wait_on) and a copy of its output after are in the graph too. After each launch the collective
// watchdog watches it (watched_launch), and sees it complete.
void recorded_in_graph(Device& dev, Communicator& nccl) {
  const size_t n = 4096, bytes = n * 4;
  DeviceBlock in(dev, bytes), out(dev, bytes), after(dev, bytes);
  in.upload(random_values(DType::kF32, n));  // a call made while recording would copy it
  for (const DeviceBlock* b : {&out, &after}) dev.memset_zero(b->ptr(), bytes);
  dev.synchronize();
  const std::vector<std::byte> zeros(bytes);
  check(nccl.records_in_graphs(), "the NCCL communicator says it records calls into graphs");
  void* graph = dev.graph_record([&] {
    CommWork w =
        nccl.all_gather(dev.stream(), CRef(in.ptr(), DType::kF32), Ref(out.ptr(), DType::kF32), n);
    w.wait_on(dev.stream());
    dev.copy(dev.stream(), after.ptr(), out.ptr(), bytes);
  });
  const bool untouched = out.download(bytes) == zeros && after.download(bytes) == zeros;
  const NcclBackend& nb = *nccl_backend();
  bool each = true, drained = true, watched = true;
  for (int i = 0; i < 3; ++i) {
    const std::vector<std::byte> x = random_values(DType::kF32, n);
    in.upload(x);
    nccl.watched_launch(dev.stream(), "graph_launch", [&] {
      watched = watched && nb.watchdog_events().watched > 0;  // registered before the launch
      dev.graph_launch(graph);
    });
    each = each && after.download(bytes) == x;
    drained = false;  // the watchdog polls every 10 ms; up to 10 s to see the launch complete
    for (int t = 0; t < 10000 && !drained; ++t) {
      drained = nb.watchdog_events().watched == 0;
      if (!drained) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  dev.graph_destroy(graph);
  check(
      untouched && each && drained && watched,
      std::string("all_gather recorded into a graph: ") +
          (untouched ? "not made while recording" : "MADE while recording") + ", " +
          (each ? "made at each of 3 launches with that launch's input" : "NOT the launch's data") +
          (watched ? "" : "; a launch was not watched") +
          (drained ? "" : "; the watchdog never saw a launch complete"));
}

// The watchdog's events are reused (lib/comm/nccl_communicator.cpp): calls made one after
// another, each seen complete by the watchdog before the next, create at most one event in all
// (none once an earlier call's is free), where an event per call would create `calls`.
void watchdog_reuses_events(Device& dev, Communicator& nccl) {
  const NcclBackend& nb = *nccl_backend();
  const int calls = 40;
  DeviceBlock buf(dev, 64 * 4);
  dev.memset_zero(buf.ptr(), 64 * 4);
  const uint64_t before = nb.watchdog_events().created;
  bool drained = true;
  for (int i = 0; i < calls && drained; ++i) {
    nccl.all_reduce(dev.stream(), Ref(buf.ptr(), DType::kF32), 64, ReduceOp::kSum).wait();
    // The watchdog thread polls every 10 ms; give it up to 10 s to see the call complete.
    drained = false;
    for (int t = 0; t < 10000 && !drained; ++t) {
      drained = nb.watchdog_events().watched == 0;
      if (!drained) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  const uint64_t made = nb.watchdog_events().created - before;
  check(drained && made <= 1, "watchdog events: " + std::to_string(calls) +
                                  " all-reduces one after another created " + std::to_string(made) +
                                  " event(s) (at most 1: reused)" +
                                  (drained ? "" : "; a call was never seen complete"));
}

}  // namespace
#endif

int main() {
#if !FT_HAVE_CUDA
  std::printf("no GPU: this build of ft has no CUDA backend (ft_nccl_check skipped)\n");
  return 77;
#elif !FT_HAVE_NCCL
  std::printf(
      "no NCCL: this build of ft has no NCCL communicator (ft_nccl: configure where "
      "nccl.h is installed, with FT_MPI) (ft_nccl_check skipped)\n");
  return 77;
#else
  using namespace ft;
  // Registered as apps/ft/main.cpp does: ft_cuda_backend and ft_nccl here, or (the ctest
  // cuda_emu_nccl_check) ft_cuda_backend_emu and ft_nccl_emu.
  register_cuda_backend(&this_cuda_backend());
  register_nccl_backend(&this_nccl_backend());
  if (std::string why = cuda_unusable_reason(); !why.empty()) {
    std::printf("no GPU: %s (ft_nccl_check skipped)\n", why.c_str());
    return 77;
  }
  try {
    setenv("FT_CUDA_GRAPHS", "1", 1);  // recorded_in_graph records one
    std::unique_ptr<Device> dev = make_device("cuda");
    std::printf("     device: %s\n", dev->name().c_str());
    const NcclBackend* nb = nccl_backend();
    if (std::string why = nb->unusable_reason(*dev); !why.empty()) {
      std::printf("no NCCL: %s (%s; ft_nccl_check skipped)\n", why.c_str(),
                  nb->description().c_str());
      return 77;
    }
    std::printf("     NCCL: %s\n", nb->description().c_str());

    std::unique_ptr<Communicator> one = make_single_process_communicator();
    std::unique_ptr<Communicator> world = make_device_world("nccl", *one, *dev);
    check(world != nullptr, "make_device_world(\"nccl\") over one process gives NCCL");
    if (!world) return 1;
    HostStagedCommunicator staged(*one, *dev);
    // Two splits: one of the world, one of that split (a mesh's groups are splits of the world;
    // NCCL's split of a split must work as well).
    std::unique_ptr<Communicator> part = world->split(0, 0);
    std::unique_ptr<Communicator> part2 = part->split(3, 0);
    collectives("world", *dev, *world, staged);
    collectives("split(0,0)", *dev, *part, staged);
    collectives("split(0,0).split(3,0)", *dev, *part2, staged);
    stream_order(*dev, *world);
    stream_order(*dev, *part2);
    watchdog_reuses_events(*dev, *world);
    recorded_in_graph(*dev, *world);
  } catch (const std::exception& e) {
    check(false, std::string("error: ") + e.what());
  }
  std::printf("ft_nccl_check: %d of %d checks held%s\n", passed, passed + failures,
              failures ? "; FAILED" : "");
  return failures ? 1 : 0;
#endif
}
