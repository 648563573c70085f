/* CUDA kernels on the CPU: what kiln puts before a model's kernel source, compiled
 * as C++, when the CUDA target is emulated (KILN_CUDA=emulate), so that machines
 * without a GPU run and test the very kernels NVRTC would compile.
 *
 * A launch runs the grid's blocks one after another on the calling thread. In a
 * kernel that never synchronizes, each block's threads run one after another as
 * plain calls. In a cooperative one (__syncthreads, shared memory), every thread of
 * the block is a fiber with its own stack: __syncthreads switches back to the
 * scheduler, which resumes the threads in turn, so each passes the barrier only
 * once all of its block have reached it. Shared memory is a static variable of
 * the kernel, one copy per OS thread, which is right because one block runs at a
 * time on a thread. Everything a launch keeps (the indices, the fibers, the
 * kernel) is thread_local too: instances run on different threads at once (abi.md),
 * each launching on its own thread. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <ucontext.h>

/* Kernels are entry points, reached only through kiln_emulated[]: nothing gains from
 * optimizing across them, and GCC 12 loses one that way. It folds a kernel identical
 * to an earlier one (the same transpose between the same offsets, say) into a tail
 * call to it, then deletes that call, which it takes for free of side effects since
 * its stores go through pointers read from the by-value KilnArgs, leaving the later
 * kernel empty. */
#if defined(__GNUC__) && !defined(__clang__)
#define __global__ __attribute__((noipa))
#else
#define __global__
#endif
#define __device__
#define __forceinline__ inline
#define __shared__ static thread_local
#define __launch_bounds__(threads)

struct KilnDim3 {
    unsigned x, y, z;
};
static thread_local KilnDim3 threadIdx, blockIdx, blockDim, gridDim;

namespace kiln_emu {

enum { STACK_BYTES = 64 * 1024, MAX_THREADS = 1024 };

struct Fiber {
    ucontext_t context;
    bool done;
};

static thread_local ucontext_t scheduler;
static thread_local Fiber *fibers;
static thread_local char *stacks;
static thread_local unsigned current;
static thread_local bool in_fiber;
static thread_local void (*kernel)(KilnArgs, int64_t);
static thread_local KilnArgs kernel_args;
static thread_local int64_t kernel_count;

static void fiber_main() {
    kernel(kernel_args, kernel_count);
    fibers[current].done = true;
} /* returns into uc_link: the scheduler */

static void fail(const char *what) {
    fprintf(stderr, "kiln: CUDA emulation: %s\n", what);
    abort();
}

/* The threads of one block, as fibers, until all of them have returned. */
static void run_block_fibers(unsigned block) {
    for (unsigned t = 0; t < block; t++) {
        Fiber *f = &fibers[t];
        if (getcontext(&f->context) != 0)
            fail("getcontext failed");
        f->context.uc_stack.ss_sp = stacks + (size_t)t * STACK_BYTES;
        f->context.uc_stack.ss_size = STACK_BYTES;
        f->context.uc_link = &scheduler;
        f->done = false;
        makecontext(&f->context, fiber_main, 0);
    }
    in_fiber = true;
    for (unsigned left = block; left > 0;)
        for (unsigned t = 0; t < block; t++) {
            if (fibers[t].done)
                continue;
            current = t;
            threadIdx.x = t;
            if (swapcontext(&scheduler, &fibers[t].context) != 0)
                fail("swapcontext failed");
            left -= fibers[t].done;
        }
    in_fiber = false;
}

} // namespace kiln_emu

static void __syncthreads() {
    using namespace kiln_emu;
    if (in_fiber && swapcontext(&fibers[current].context, &scheduler) != 0)
        fail("swapcontext failed");
}

extern "C" void kiln_emu_launch(void (*fn)(KilnArgs, int64_t), KilnArgs args, int64_t count,
                                const unsigned grid[3], unsigned block, int cooperative) {
    using namespace kiln_emu;
    if (block > MAX_THREADS)
        fail("more threads in a block than a GPU has");
    kernel = fn;
    kernel_args = args;
    kernel_count = count;
    gridDim = {grid[0], grid[1], grid[2]};
    blockDim = {block, 1, 1};
    threadIdx = {0, 0, 0};
    if (cooperative) { /* the fibers of one block, reused by the next */
        fibers = static_cast<Fiber *>(calloc(block, sizeof(Fiber)));
        stacks = static_cast<char *>(malloc((size_t)block * STACK_BYTES));
        if (!fibers || !stacks)
            fail("out of memory for the fibers");
    }
    for (unsigned z = 0; z < grid[2]; z++)
        for (unsigned y = 0; y < grid[1]; y++)
            for (unsigned x = 0; x < grid[0]; x++) {
                blockIdx = {x, y, z};
                if (cooperative) {
                    run_block_fibers(block);
                    continue;
                }
                for (unsigned t = 0; t < block; t++) {
                    threadIdx.x = t;
                    fn(args, count);
                }
            }
    free(fibers);
    free(stacks);
    fibers = nullptr;
    stacks = nullptr;
}
