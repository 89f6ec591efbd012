#pragma once
// The offloaded gradients' host-side adds (ZeroSharding, zero_offload.cpp), on a thread of their
// own. Internal to lib/parallel/.
#include <omp.h>

#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/device.h"
#include "runtime/ops.h"

namespace ft {

// Offload at stages 2-3: the staged gradient adds (dst += what landed in a staging buffer,
// ZeroSharding::land), on a host thread of their own so that the thread queuing the backward
// never stops for them. One thread, in the order queued: the sums are the bits that adding them
// one by one where they were queued gives. Each staging buffer comes back once its add is done.
class HostAdder {
 public:
  explicit HostAdder(Ops& ops)
      : ops_(ops), threads_(omp_get_max_threads()), thread_([this] { run(); }) {}
  ~HostAdder() {
    {
      const std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();  // after the adds still queued
  }
  void add(float* dst, HostBuffer<float> staging, size_t n) {
    {
      const std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(Task{dst, std::move(staging), n});
    }
    cv_.notify_all();
  }
  // A staging buffer whose add is done (empty when none is back; with `wait`, waits for one
  // while adds are queued or running).
  HostBuffer<float> take_back(bool wait) {
    std::unique_lock<std::mutex> lock(mu_);
    if (wait) cv_.wait(lock, [&] { return !back_.empty() || (queue_.empty() && !busy_); });
    if (back_.empty()) return {};
    HostBuffer<float> b = std::move(back_.back());
    back_.pop_back();
    return b;
  }
  void drain() {  // waits for every add queued; rethrows the first one's error
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  struct Task {
    float* dst;
    HostBuffer<float> staging;
    size_t n;
  };
  void run() {
    omp_set_num_threads(threads_);  // the rank's runtime.threads, as its other host work
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      Task t = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      const bool failed = error_ != nullptr;
      lock.unlock();
      std::exception_ptr error;
      try {
        if (!failed) ops_.add(Stream{}, Ref(t.dst), CRef(t.staging.data()), t.n);
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      if (error && !error_) error_ = error;
      busy_ = false;
      back_.push_back(std::move(t.staging));
      cv_.notify_all();
    }
  }

  Ops& ops_;
  int threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  std::vector<HostBuffer<float>> back_;
  bool busy_ = false, stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: started once the rest is made
};

}  // namespace ft
