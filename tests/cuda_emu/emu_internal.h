// The CUDA emulation's scheduler as the Hopper instructions' emulation (hopper_emu.cpp) sees it:
// a few primitives of cuda_emu.cpp (the running thread, its reports, suspending and waking
// fibers) and the hooks cuda_emu.cpp calls into hopper_emu.cpp at the block's start, at a
// thread's exit and when no thread can run. A test tool's internals: only these two files
// include it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <source_location>
#include <string>

namespace ft::emu::detail {

// The running thread's index in its block (x fastest); throws Error outside a kernel, naming
// `what` as the call that was made there.
int current_thread(const char* what);
// The threads of the running block.
int block_threads();
// Reports `what` for the running thread and unwinds it (the launch throws Error).
[[noreturn]] void fail(const std::string& what);
// Records `what` for thread `linear` of the running block (the first report of a launch wins).
void note(int linear, const std::string& what);
// Suspends the running thread until wake() makes it ready again.
void suspend();
void wake(int linear);
// The launch's dynamic shared memory (1024-byte aligned here), the only shared memory the
// emulation knows.
unsigned char* shared_base();
size_t shared_bytes();
// "file:line:column".
std::string site(const std::source_location& where);

// Implemented by hopper_emu.cpp, called by the scheduler.
void hopper_block_start(int nthreads);
// A thread finished: "" or what it left undone (a report).
std::string hopper_thread_exit(int linear);
// No thread can run: completes the asynchronous copies still in flight (a GPU finishes them
// eventually); true if that made a thread ready.
bool hopper_stalled();
// A generic-proxy read (ldmatrix) by `thread` of shared [offset, offset + bytes): "" or a report
// when a TMA copy wrote a byte there on an mbarrier phase the thread has not observed complete.
std::string hopper_generic_read(int thread, uint32_t offset, uint32_t bytes);
// Every thread of the block passed one __syncthreads: what one of them observed (an mbarrier
// phase's completion) is now ordered before all of them.
void hopper_barrier_sync();
// Who waits at an mbarrier or a warpgroup instruction, for the deadlock report ("" if none).
std::string hopper_waiting();

}  // namespace ft::emu::detail
