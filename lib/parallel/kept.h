// Buffers kept for graphs (ZeroSharding, DESIGN.md §2 "Graphs"), and the handle through which
// ZeRO holds a buffer for one use whether it was made for that use or taken from such a pool.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace ft {

// Buffers of type B (Buffer<float>, DBuffer) kept for the run so that every micro-batch uses the
// same addresses (a recording makes no allocation, and a graph keeps what it recorded). take(n)
// hands out a free one of exactly n elements, else a new one made by `make` (so that an op-by-op
// warm-up makes all a recording needs, and a buffer is never held by a user of another size);
// give hands it back.
template <typename B>
class Kept {
 public:
  template <typename Make>
  int take(size_t n, Make make) {
    for (size_t i = 0; i < entries_.size(); ++i)
      if (!entries_[i].busy && entries_[i].buf.size() == n) {
        entries_[i].busy = true;
        return int(i);
      }
    entries_.push_back(Entry{make(n), true});
    return int(entries_.size()) - 1;
  }
  B& operator[](int i) { return entries_[size_t(i)].buf; }
  void give(int i) {
    if (i >= 0) entries_[size_t(i)].busy = false;
  }
  bool in_use() const {
    for (const Entry& e : entries_)
      if (e.busy) return true;
    return false;
  }
  void clear() { entries_.clear(); }  // with none in use

 private:
  struct Entry {
    B buf;
    bool busy = false;
  };
  std::vector<Entry> entries_;
};

// A buffer held for one use: made for it (owned, freed by reset), or taken from a Kept pool (given
// back by reset). Either way reset (or destruction) is where the use ends, which a later use of
// the memory is ordered after (on the compute stream, or by a communicator). The pool must
// outlive the handle.
template <typename B>
class Held {
 public:
  Held() = default;
  explicit Held(B own) : own_(std::move(own)) {}
  Held(Kept<B>& pool, int i) : pool_(&pool), i_(i) {}
  Held(Held&& o) noexcept
      : own_(std::exchange(o.own_, B())),
        pool_(std::exchange(o.pool_, nullptr)),
        i_(std::exchange(o.i_, -1)) {}
  Held& operator=(Held&& o) noexcept {
    if (this != &o) {
      reset();
      own_ = std::exchange(o.own_, B());  // (a moved-from DBuffer keeps its size)
      pool_ = std::exchange(o.pool_, nullptr);
      i_ = std::exchange(o.i_, -1);
    }
    return *this;
  }
  Held(const Held&) = delete;
  Held& operator=(const Held&) = delete;
  ~Held() { reset(); }

  auto data() { return pool_ ? (*pool_)[i_].data() : own_.data(); }
  explicit operator bool() const { return pool_ != nullptr || own_.size() > 0; }
  bool kept() const { return pool_ != nullptr; }
  // The owned buffer, for a use that ends elsewhere (an offload landing); empty when kept.
  B take_owned() { return std::exchange(own_, B()); }
  void reset() {
    if (pool_) pool_->give(i_);
    pool_ = nullptr;
    i_ = -1;
    own_ = B();
  }

 private:
  B own_;
  Kept<B>* pool_ = nullptr;
  int i_ = -1;
};

}  // namespace ft
