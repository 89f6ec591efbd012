// The CUDA device on a real GPU (lib/runtime/cuda/cuda_device.h), for the GPU check: what the
// CPU-only CI cannot run. Allocations through the caching allocator, host and device copies,
// memset, stats, reuse, page-locked staging, the out-of-memory error and recovery after it.
//
//   ft_cuda_device_check        exit 0: all held; 1: a check failed; 77: no usable GPU here
//                               (or a build without the CUDA backend), with the reason
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "runtime/device.h"
#if FT_HAVE_CUDA
#include "runtime/cuda/cuda_device.h"
#include "runtime/cuda/ops_memory.h"
#endif

#if FT_HAVE_CUDA
namespace {

int failures = 0;
void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) failures++;
}

}  // namespace
#endif

int main() {
#if !FT_HAVE_CUDA
  std::printf("no GPU: this build of ft has no CUDA backend (ft_cuda_device_check skipped)\n");
  return 77;
#else
  using namespace ft;
  // make_device("cuda") asks the registered backend (runtime/device.h); a test binary, like
  // apps/ft/main.cpp, registers the one it links: ft_cuda_backend on a GPU build, or (the
  // ctest cuda_emu_device_check) ft_cuda_backend_emu, the same sources on the CUDA emulation.
  // Unregistered, make_device("cuda") refused with "this build of ft has no CUDA backend" even
  // on a GPU.
  register_cuda_backend(&this_cuda_backend());
  if (std::string why = cuda_unusable_reason(); !why.empty()) {
    std::printf("no GPU: %s (ft_cuda_device_check skipped)\n", why.c_str());
    return 77;
  }
  try {
    std::unique_ptr<Device> dev = make_device("cuda");
    check(dev->kind() == DeviceKind::kCuda, "make_device(\"cuda\") is a CUDA device");
    std::printf("     device: %s\n", dev->name().c_str());

    // The device holds its own buffers from the start (the cuBLASLt workspace, 32 MiB from
    // sm_90, runtime/cuda/ops_memory.h): the counts below are relative to what it holds now.
    // (Counting from zero failed on the emulated sm_90 device as soon as this test reached
    // the device at all, and would have on an H100.)
    const AllocatorStats base = dev->stats();
    std::printf("     held by the device itself: %zu bytes\n", base.current_bytes);
    // Odd sizes: not multiples of the allocator's 512-byte granule.
    const size_t n = 1000003;
    std::vector<float> host(n), back(n, -1.0f);
    for (size_t i = 0; i < n; ++i) host[i] = float(i) * 0.5f - 7.0f;
    {
      Buffer<float> a(dev.get(), n), b(dev.get(), n);
      const AllocatorStats s = dev->stats();
      check(s.current_bytes == base.current_bytes + 2 * n * sizeof(float),
            "current_bytes counts what was asked");
      check(s.reserved_bytes >= s.current_bytes, "reserved_bytes covers what is in use");
      a.upload(host.data(), n);
      dev->copy(dev->stream(), b.data(), a.data(), n * sizeof(float));
      b.download(back.data(), n);
      check(back == host, "upload, device-to-device copy, download round trip");
      b.zero();
      b.download(back.data(), n);
      bool zero = true;
      for (float x : back) zero = zero && x == 0.0f;
      check(zero, "memset_zero");
      // Same-dtype convert is a device copy and needs no kernel.
      dev->ops().convert(dev->stream(), b.data(), a.data(), n);
      b.download(back.data(), n, 0);
      check(back == host, "ops().convert with one dtype copies");
    }
    const AllocatorStats freed = dev->stats();
    check(freed.current_bytes == base.current_bytes,
          "current_bytes back to the device's own after the buffers are freed");
    check(freed.peak_bytes == std::max(base.peak_bytes, base.current_bytes + 2 * n * sizeof(float)),
          "peak_bytes kept the high-water mark");
    {
      Buffer<float> c(dev.get(), n);  // the same size again: served from the cache
      check(dev->stats().reserved_bytes == freed.reserved_bytes,
            "a freed block is reused without a new cudaMalloc");
    }

    // Page-locked staging: the host reads and writes it, copies go through it.
    {
      Buffer<float> a(dev.get(), n);
      a.upload(host.data(), n);
      auto* staging = static_cast<float*>(dev->alloc_host(n * sizeof(float)));
      std::memset(staging, 0, n * sizeof(float));
      dev->copy_to_host(staging, a.data(), n * sizeof(float));
      check(std::memcmp(staging, host.data(), n * sizeof(float)) == 0,
            "copy_to_host into page-locked staging");
      dev->free_host(staging, n * sizeof(float));
    }

    // The checkpoint's staging path: the copy stream waits for an event of the compute stream
    // (here, behind a device copy that writes the source), copies async, records its own event.
    {
      Buffer<float> a(dev.get(), n), b(dev.get(), n);
      a.upload(host.data(), n);
      b.zero();
      dev->copy(dev->stream(), b.data(), a.data(), n * sizeof(float));  // queued, not waited for
      Event ready = dev->make_event(), done = dev->make_event();
      ready.record(dev->stream());
      dev->wait(dev->copy_stream(), ready);
      auto* staging = static_cast<float*>(dev->alloc_host(n * sizeof(float)));
      dev->copy_to_host_async(dev->copy_stream(), staging, b.data(), n * sizeof(float));
      done.record(dev->copy_stream());
      done.synchronize();
      check(done.query(), "a synchronized event reports its work done");
      check(std::memcmp(staging, host.data(), n * sizeof(float)) == 0,
            "copy stream after an event of the compute stream sees the compute stream's work");
      dev->free_host(staging, n * sizeof(float));
      Event t0 = dev->make_event(true), t1 = dev->make_event(true);
      t0.record(dev->stream());
      dev->copy(dev->stream(), b.data(), a.data(), n * sizeof(float));
      t1.record(dev->stream());
      t1.synchronize();
      const float ms = elapsed_ms(t0, t1);
      check(ms >= 0, "elapsed_ms between two timing events is a time");
      std::string err;
      try {
        elapsed_ms(ready, done);  // made without timing
      } catch (const Error& e) {
        err = e.what();
      }
      check(!err.empty(), "elapsed_ms of events made without timing is an error");
    }

    // upload_async: the host array may change as soon as the call returns, with nothing waited
    // for in between. More uploads than the staging ring has slots (16), so slots are reused
    // while their earlier copies may still be queued; uploads 20 and 36 (one slot, 16 apart) are
    // larger than a slot's first 64 KiB, so that slot grows, then is refilled at its new size.
    // Under the emulation's deferred streams a slot refilled before its copy ran gives other
    // values.
    {
      const int uploads = 40;
      std::vector<Buffer<int> > dst;
      std::vector<int> src(40000);  // 160 KB
      Buffer<int> scratch(dev.get(), src.size());
      for (int i = 0; i < uploads; ++i) {
        const size_t n = i == 20 || i == 36 ? src.size() - size_t(i) : size_t(7 + i);
        for (size_t j = 0; j < n; ++j) src[j] = i * 100000 + int(j);
        dst.emplace_back(dev.get(), n);
        dev->upload_async(dev->stream(), dst.back().data(), src.data(), n * sizeof(int));
        std::fill(src.begin(), src.end(), -1);  // the host's array, reused at once
        dev->copy(dev->stream(), scratch.data(), dst.back().data(), n * sizeof(int));  // queued
      }
      bool same = true;
      for (int i = 0; i < uploads; ++i) {
        std::vector<int> back(dst[size_t(i)].size());
        dst[size_t(i)].download(back.data(), back.size());
        for (size_t j = 0; j < back.size(); ++j) same = same && back[j] == i * 100000 + int(j);
      }
      check(same,
            "upload_async: 40 uploads through the staging ring (a slot grown), the host array "
            "reused");
    }

    // Graphs: off unless FT_CUDA_GRAPHS=1 when the device is made; then work queued between
    // graph_begin and graph_end is recorded, not run, and each launch replays it, reading device
    // memory as it is then. An allocation while recording is an error, and the device goes on
    // after graph_cancel. Freeing a block that existed at the recording moves the graph epoch;
    // freeing a later one does not.
    {
      std::string err;
      try {
        dev->graph_begin();
      } catch (const Error& e) {
        err = e.what();
      }
      check(!dev->graphs_enabled() && err.find("FT_CUDA_GRAPHS=1") != std::string::npos,
            "graphs are off without FT_CUDA_GRAPHS=1, and graph_begin says so");
      setenv("FT_CUDA_GRAPHS", "1", 1);
      std::unique_ptr<Device> g = make_device("cuda");
      unsetenv("FT_CUDA_GRAPHS");
      check(g->graphs_enabled(), "FT_CUDA_GRAPHS=1: the device records graphs");
      const size_t m = 1000;
      std::vector<float> x(m), y(m, 0.5f), got(m);
      for (size_t i = 0; i < m; ++i) x[i] = float(i);
      Buffer<float> xd(g.get(), m), yd(g.get(), m), old(g.get(), 7);
      xd.upload(x.data(), m);
      yd.upload(y.data(), m);
      g->graph_begin();
      g->ops().add(g->stream(), yd.data(), xd.data(), m);  // y += x
      void* graph = g->graph_end();
      yd.download(got.data(), m);
      check(got[10] == 0.5f, "recorded work does not run");
      g->graph_launch(graph);
      for (float& v : x) v *= 2.0f;  // the second replay reads the new x
      xd.upload(x.data(), m);
      g->graph_launch(graph);
      yd.download(got.data(), m);
      check(got[10] == 0.5f + 10.0f + 20.0f && got[999] == 0.5f + 999.0f + 1998.0f,
            "each launch replays the recording on the memory as it is then");
      const uint64_t epoch = g->graph_epoch();
      {
        Buffer<float> later(g.get(), 5);  // made after the recording: freeing it changes nothing
      }
      check(g->graph_epoch() == epoch, "freeing a block made after the recording keeps the epoch");
      old = Buffer<float>();  // existed at the recording: the graph may have used it
      check(g->graph_epoch() != epoch, "freeing a block older than the recording moves the epoch");
      g->graph_destroy(graph);
      err.clear();
      g->graph_begin();
      try {
        Buffer<float> during(g.get(), 3);
      } catch (const Error& e) {
        err = e.what();
      }
      g->graph_cancel();
      check(err.find("while a graph is recorded") != std::string::npos,
            "an allocation while recording is an error");
      g->ops().add(g->stream(), yd.data(), xd.data(), m);
      yd.download(got.data(), m);
      check(got[10] == 0.5f + 10.0f + 20.0f + 20.0f, "the device runs work after graph_cancel");

      // Another thread's event query and wait (the NCCL watchdog's, a checkpoint writer's) leave
      // a recording whole: it is thread-local.
      Event before = g->make_event();
      before.record(g->stream());
      g->graph_begin();
      g->ops().add(g->stream(), yd.data(), xd.data(), m);
      err.clear();
      std::thread([&] {
        try {
          before.query();
          before.synchronize();
        } catch (const Error& e) {
          err = e.what();
        }
      }).join();
      check(err.empty(), "another thread waits on an event while a graph is recorded: " + err);
      void* graph2 = nullptr;
      try {
        graph2 = g->graph_end();
      } catch (const Error& e) {
        std::printf("     graph_end: %s\n", e.what());
      }
      check(graph2 != nullptr, "that recording ends whole");
      if (graph2) {
        g->graph_launch(graph2);
        g->graph_destroy(graph2);
      }
      yd.download(got.data(), m);
      check(got[10] == 0.5f + 10.0f + 3 * 20.0f, "and replays");
      // This thread's own wait breaks the recording: graph_end says so, and leaves no error
      // behind for the next launch's check to report.
      g->graph_begin();
      g->ops().add(g->stream(), yd.data(), xd.data(), m);
      err.clear();
      try {
        before.synchronize();
      } catch (const Error& e) {
        err = e.what();
      }
      check(!err.empty(), "waiting on an event while recording is an error");
      err.clear();
      try {
        g->graph_destroy(g->graph_end());
      } catch (const Error& e) {
        err = e.what();
      }
      check(err.find("cudaStreamEndCapture failed") != std::string::npos,
            "graph_end reports the broken recording");
      err.clear();
      try {
        g->ops().add(g->stream(), yd.data(), xd.data(), m);
        yd.download(got.data(), m);
      } catch (const Error& e) {
        err = e.what();
      }
      check(err.empty() && got[10] == 0.5f + 10.0f + 4 * 20.0f,
            "the device runs work after a broken recording, which ran nothing" +
                (err.empty() ? std::string() : ": " + err));
      // Copies from the host would replay the recording's bytes: refused while recording.
      g->graph_begin();
      err.clear();
      try {
        g->upload_async(g->stream(), xd.data(), x.data(), sizeof(float));
      } catch (const Error& e) {
        err = e.what();
      }
      std::string pinned;
      try {
        g->free_host(g->alloc_host(64), 64);
      } catch (const Error& e) {
        pinned = e.what();
      }
      g->graph_cancel();
      check(err.find("upload_async while a graph is recorded") != std::string::npos,
            "an upload while recording is an error");
      check(pinned.find("alloc_host while a graph is recorded") != std::string::npos,
            "so is page-locked memory's allocation");
      // The ops' scratch, asked to grow while recording: the allocation is refused, and the
      // scratch still grows afterwards (a size without a block would answer null).
      {
        cuda::OpsMemory mem(*g, 9);
        check(mem.scratch(100) != nullptr, "ops scratch of 100 bytes");
        g->graph_begin();
        err.clear();
        try {
          mem.scratch(1 << 20);
        } catch (const Error& e) {
          err = e.what();
        }
        g->graph_cancel();
        check(err.find("while a graph is recorded") != std::string::npos,
              "the ops' scratch cannot grow while recording");
        check(mem.scratch(1 << 20) != nullptr, "and grows afterwards");
      }
    }

    // Out of memory: a clear ft::Error, and the device still works afterwards.
    std::string msg;
    try {
      void* p = dev->alloc(size_t(1) << 50);  // 1 PiB
      dev->free(p, size_t(1) << 50);
    } catch (const Error& e) {
      msg = e.what();
    }
    std::printf("     out-of-memory message: %s\n", msg.c_str());
    check(msg.find("out of memory on cuda:") != std::string::npos &&
              msg.find("ft plan") != std::string::npos,
          "asking for 1 PiB is an out-of-memory error naming the device and ft plan");
    {
      Buffer<float> d(dev.get(), 19);
      d.upload(host.data(), 19);
      d.download(back.data(), 19);
      check(std::memcmp(back.data(), host.data(), 19 * sizeof(float)) == 0,
            "allocations work after an out-of-memory error");
    }
    dev->synchronize();
  } catch (const std::exception& e) {
    std::printf("FAIL exception: %s\n", e.what());
    return 1;
  }
  std::printf("ft_cuda_device_check: %s\n", failures ? "FAILED" : "all held");
  return failures ? 1 : 0;
#endif
}
