// The SIMT scheduler's interface to its extensions (simt_hopper.cpp): blocking on a condition,
// the current thread, the block's dynamic shared memory, and the per-block / per-thread hooks.
#pragma once
#include <cstddef>
#include <string>

namespace llmk {
namespace simt {
namespace emu {

// Yield until cond(arg) holds (re-tested whenever the scheduler looks for a runnable thread); a
// block in which nothing can run reports `what` at file:line in its deadlock message.
void block_until(bool (*cond)(void*), void* arg, const char* what, const char* file, int line);
int thread_linear();
int block_size();
unsigned char* smem_base();
size_t smem_size();
std::string site_str(const char* file, int line);

// Hooks implemented by simt_hopper.cpp: reset per-block state; on a thread's normal exit and at
// the end of a block, an error message ("" when fine).
void hopper_block_begin(int threads);
std::string hopper_thread_exit(int thread);
std::string hopper_block_end();

}  // namespace emu
}  // namespace simt
}  // namespace llmk
