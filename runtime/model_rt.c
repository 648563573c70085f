/* The runtime every compiled model carries: instances, the workspace, and the thread
 * pool that runs the generated loops.
 *
 * kiln compiles this file once, into the object of precompiled kernels that every
 * model links, so a compiled .so needs no kiln library at run time; the generated
 * code sees model_rt.h. Every symbol here is hidden (the object is built with
 * -fvisibility=hidden) or static.
 * An instance owns its workspace (allocated once in create, so run allocates
 * nothing), its state (the params a training step updates, so each instance
 * trains its own copy) and its pool of KILN_NUM_THREADS - 1 worker threads; the
 * calling thread is the last worker, and the only thread BLAS runs on.
 *
 * A parallel loop is split into chunks of at least `grain` iterations, a few per
 * thread, and the chunks into one contiguous share per thread. A thread claims the
 * chunks of its own share from the front, then those left in the others' from the
 * back: consecutive kernels mostly index their data alike (rows of pixels, say), so
 * what one thread's kernel wrote the next reads from that thread's own cache (two
 * threads taking chunks from one counter made a memory-bound kernel read half its
 * input from the other core's cache, and run slower on two threads than on one).
 * Each share is a 64-bit word, which holds the loop's number and the share's first
 * and last unclaimed chunks, and a claim is a compare-and-swap on it; a claim only
 * succeeds while the word still names the loop the thread was woken for, so a
 * worker that the scheduler runs late finds its loop finished (or the next one
 * started) and never touches a loop it did not claim. The caller counts finished
 * chunks, not workers: a loop ends when its last chunk is done, whoever did it, so
 * on a busy machine the caller does the work of a worker that has not been run yet
 * instead of waiting for it. Only a chunk already claimed is waited for, which is
 * why chunks are small. Waiting threads spin a little (a kernel follows another
 * within microseconds), then sleep on a futex; the side that changes the word wakes
 * sleepers only when there are some. A worker moves itself off the caller's CPU
 * when it starts and when it is woken onto it (kiln_rt_place); the scheduler places
 * it as it likes after that. */
#include "model_rt.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

void kiln_rt_allreduce(const KilnArgs *args, const float *src, float *dst, int64_t count, int mean, int f) {
    const kiln_comm *c = args->comm;
    if (!c || c->size == 1) {
        if (src != dst)
            memcpy(dst, src, (size_t)count * sizeof *dst);
        return;
    }
    if (c->allreduce_sum(c->ctx, src, dst, count, KILN_F32) != 0) {
        KILN_FAULT(f);
        return;
    }
    if (mean)
        for (int64_t i = 0; i < count; i++)
            dst[i] = dst[i] / (float)c->size;
}

/* A thread's share of a loop: loop number << 32 | end << 16 | next, its unclaimed
 * chunks [next, end), in a cache line of its own. */
typedef struct {
    uint64_t range;
    char line[56];
} KilnShare;

struct KilnInstance {
    const KilnProgram *prog;
    kiln_comm comm; /* size 0: none */
    float *ws;
    float *st;
    /* a program with a symbolic dim: each port's buffer of the bound's size (NULL for
       a port without it), and the pointers a smaller run hands its kernels */
    void **staged;
    const void **run_in;
    void **run_out;
    int n_threads;
    pthread_t *workers;
    /* The loop being run. Its fields are written by the caller before the shares
       name the loop and read by a thread only after it claims a chunk, which keeps
       the loop from finishing, so they stay put while anyone reads them. */
    KilnKernel kernel;
    const KilnArgs *args;
    void *const *buf;
    int64_t count, chunk;
    uint32_t chunks;
    KilnShare *shares; /* thread t's (the caller's 0, worker i's i + 1) */
    uint32_t done;     /* chunks of the loop finished; the caller sleeps on it */
    int caller_waits;  /* the caller is asleep on done, or about to be */
    uint32_t loop;     /* the newest loop's number; workers sleep on it */
    int sleepers;      /* workers asleep on loop, or about to be */
    int stopping;
    int home_cpu;  /* the CPU create ran on, -1 unknown; workers start on the others */
    int placed;    /* workers that have moved there */
    int waker_cpu; /* the CPU the caller last woke sleeping workers from */
};

static void kiln_rt_futex_wait(uint32_t *word, uint32_t value) {
    syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, value, NULL, NULL, 0);
}

static void kiln_rt_futex_wake(uint32_t *word) {
    syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static double kiln_rt_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void kiln_rt_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Spins until *word differs from value, for at most KILN_SPIN_SECONDS (a kernel
 * follows the last within microseconds; waking from a futex costs tens of them).
 * After the first KILN_YIELD_AFTER of it, the spin yields the core now and then, so
 * that on a busy machine a thread that waits long makes way for one with work (a
 * yield, a system call, costs a thread that spins between two kernels more time
 * than the kernels' own gap). Returns whether the word changed. */
#define KILN_SPIN_SECONDS 150e-6
#define KILN_YIELD_AFTER 50e-6

static int kiln_rt_spin_while(const uint32_t *word, uint32_t value) {
    double start = 0;
    for (int i = 1;; i++) {
        if (__atomic_load_n(word, __ATOMIC_ACQUIRE) != value)
            return 1;
        kiln_rt_pause();
        if (i % 64 == 0) {
            double now = kiln_rt_seconds();
            if (start == 0)
                start = now;
            else if (now - start > KILN_SPIN_SECONDS)
                return 0;
            else if (now - start > KILN_YIELD_AFTER)
                sched_yield();
        }
    }
}

/* Claims the next chunk of loop number `loop` in *share, from its front or (steal)
 * its back: the chunk's number, or -1 when none is left or a newer loop has begun. */
static int64_t kiln_rt_claim(KilnShare *share, uint32_t loop, int steal) {
    uint64_t range = __atomic_load_n(&share->range, __ATOMIC_ACQUIRE);
    for (;;) {
        uint32_t end = (uint32_t)(range >> 16) & 0xffff, next = (uint32_t)range & 0xffff;
        if ((uint32_t)(range >> 32) != loop || next >= end)
            return -1;
        uint64_t rest = steal ? range - ((uint64_t)1 << 16) : range + 1;
        if (__atomic_compare_exchange_n(&share->range, &range, rest, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            return steal ? end - 1 : next;
    }
}

/* Runs chunks of loop number `loop` as thread `self`, its own share's and then the
 * others', until none is left or a newer loop has begun. */
static void kiln_rt_work(KilnInstance *in, uint32_t loop, int self) {
    for (int i = 0; i < in->n_threads; i++) {
        KilnShare *share = &in->shares[(self + i) % in->n_threads];
        int64_t next;
        while ((next = kiln_rt_claim(share, loop, i > 0)) >= 0) {
            int64_t chunk = __atomic_load_n(&in->chunk, __ATOMIC_RELAXED),
                    count = __atomic_load_n(&in->count, __ATOMIC_RELAXED), begin = next * chunk,
                    end = begin + chunk < count ? begin + chunk : count;
            KilnKernel kernel = __atomic_load_n(&in->kernel, __ATOMIC_RELAXED);
            kernel(__atomic_load_n(&in->args, __ATOMIC_RELAXED), __atomic_load_n(&in->buf, __ATOMIC_RELAXED),
                   begin, end);
            /* after the last chunk's count the caller may start the next loop at once */
            uint32_t chunks = __atomic_load_n(&in->chunks, __ATOMIC_RELAXED);
            if (__atomic_add_fetch(&in->done, 1, __ATOMIC_SEQ_CST) == chunks &&
                __atomic_load_n(&in->caller_waits, __ATOMIC_SEQ_CST))
                kiln_rt_futex_wake(&in->done);
        }
    }
}

/* Moves the calling thread, the pool's worker number idx, onto the idx-th CPU it may
 * run on after `home` (the caller's), and lets it move anywhere again. Threads
 * started together start on the caller's CPU, and the scheduler can take a hundred
 * milliseconds to spread them, while every loop waits on a worker that shares the
 * caller's CPU. The raw system calls need no _GNU_SOURCE in the generated code. */
static void kiln_rt_place(int idx, int home) {
    enum { WORDS = 16 }; /* 1024 CPUs */
    uint64_t all[WORDS] = {0}, one[WORDS] = {0};
    long bytes = syscall(SYS_sched_getaffinity, 0, sizeof all, all);
    if (home < 0 || bytes <= 0)
        return;
    int cpus[WORDS * 64], n = 0, at = 0;
    for (int c = 0; c < (int)bytes * 8 && c < WORDS * 64; c++)
        if (all[c / 64] >> (c % 64) & 1) {
            if (c == home)
                at = n;
            cpus[n++] = c;
        }
    if (n < 2)
        return;
    int target = cpus[(at + 1 + idx) % n];
    one[target / 64] = (uint64_t)1 << (target % 64);
    if (syscall(SYS_sched_setaffinity, 0, sizeof one, one) == 0)
        syscall(SYS_sched_setaffinity, 0, sizeof all, all);
}

static int kiln_rt_cpu(void) {
    unsigned cpu;
    return syscall(SYS_getcpu, &cpu, NULL, NULL) == 0 ? (int)cpu : -1;
}

static void *kiln_rt_worker(void *arg) {
    KilnInstance *in = arg;
    int idx = __atomic_fetch_add(&in->placed, 1, __ATOMIC_RELAXED);
    kiln_rt_place(idx, in->home_cpu);
    uint32_t seen = 0;
    for (;;) {
        if (!kiln_rt_spin_while(&in->loop, seen)) {
            __atomic_add_fetch(&in->sleepers, 1, __ATOMIC_SEQ_CST);
            while (__atomic_load_n(&in->loop, __ATOMIC_SEQ_CST) == seen)
                kiln_rt_futex_wait(&in->loop, seen);
            __atomic_sub_fetch(&in->sleepers, 1, __ATOMIC_SEQ_CST);
            /* a thread woken is often put on its waker's CPU, to wait there for it */
            int cpu = kiln_rt_cpu();
            if (cpu >= 0 && cpu == __atomic_load_n(&in->waker_cpu, __ATOMIC_RELAXED))
                kiln_rt_place(idx, cpu);
        }
        if (__atomic_load_n(&in->stopping, __ATOMIC_ACQUIRE))
            return NULL;
        seen = __atomic_load_n(&in->loop, __ATOMIC_ACQUIRE);
        kiln_rt_work(in, seen, idx + 1);
    }
}

/* The number of the next loop; never 0, the number workers start out having seen. */
static uint32_t kiln_rt_next_loop(const KilnInstance *in) {
    return in->loop + 1 ? in->loop + 1 : 1;
}

/* Makes a new loop number visible to the workers, waking those asleep. */
static void kiln_rt_announce(KilnInstance *in, uint32_t loop) {
    __atomic_store_n(&in->loop, loop, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&in->sleepers, __ATOMIC_SEQ_CST)) {
        __atomic_store_n(&in->waker_cpu, kiln_rt_cpu(), __ATOMIC_RELAXED);
        kiln_rt_futex_wake(&in->loop);
    }
}

/* Runs kernel k on buf over [0, count) on the instance's threads: on the caller alone
 * when the loop has fewer than two chunks of `grain` iterations. */
void kiln_rt_parallel(KilnInstance *in, KilnKernel k, const KilnArgs *a, void *const *buf, int64_t count,
                      int64_t grain) {
    int64_t most = grain > 0 ? count / grain : count;
    if (in->n_threads == 1 || most < 2) {
        k(a, buf, 0, count);
        return;
    }
    /* a late or slow thread holds up one small chunk; at most 256 * 8 chunks, which
       a share's 16 bits hold */
    int64_t parts = (int64_t)in->n_threads * 8;
    if (parts > most)
        parts = most;
    int64_t chunk = (count + parts - 1) / parts;
    uint32_t chunks = (uint32_t)((count + chunk - 1) / chunk);
    uint32_t loop = kiln_rt_next_loop(in);
    __atomic_store_n(&in->kernel, k, __ATOMIC_RELAXED);
    __atomic_store_n(&in->args, a, __ATOMIC_RELAXED);
    __atomic_store_n(&in->buf, buf, __ATOMIC_RELAXED);
    __atomic_store_n(&in->count, count, __ATOMIC_RELAXED);
    __atomic_store_n(&in->chunk, chunk, __ATOMIC_RELAXED);
    __atomic_store_n(&in->chunks, chunks, __ATOMIC_RELAXED);
    __atomic_store_n(&in->done, 0, __ATOMIC_RELAXED);
    for (int t = 0, n = in->n_threads; t < n; t++) {
        uint64_t next = (uint64_t)chunks * (uint64_t)t / (uint64_t)n,
                 end = (uint64_t)chunks * (uint64_t)(t + 1) / (uint64_t)n;
        __atomic_store_n(&in->shares[t].range, (uint64_t)loop << 32 | end << 16 | next, __ATOMIC_RELEASE);
    }
    kiln_rt_announce(in, loop);
    kiln_rt_work(in, loop, 0);
    for (;;) {
        uint32_t done = __atomic_load_n(&in->done, __ATOMIC_ACQUIRE);
        if (done == chunks)
            return;
        if (kiln_rt_spin_while(&in->done, done))
            continue;
        __atomic_store_n(&in->caller_waits, 1, __ATOMIC_SEQ_CST);
        while ((done = __atomic_load_n(&in->done, __ATOMIC_SEQ_CST)) != chunks)
            kiln_rt_futex_wait(&in->done, done);
        __atomic_store_n(&in->caller_waits, 0, __ATOMIC_RELAXED);
        return;
    }
}

/* KILN_NUM_THREADS when it is a positive integer, else the number of cores (a value
 * that is not one is a warning naming it); never more than the cores, as more
 * threads than cores only contend for them. */
static int kiln_rt_threads(void) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN), n;
    cores = cores < 1 ? 1 : cores > 256 ? 256 : cores;
    n = cores;
    const char *s = getenv("KILN_NUM_THREADS");
    if (s && *s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (*end || v < 1)
            fprintf(
                stderr,
                "kiln: warning: KILN_NUM_THREADS='%.64s' is not a positive integer; using %ld threads (the "
                "number of cores)\n",
                s, cores);
        else
            n = v < cores ? v : cores;
    }
    return (int)n;
}

void kiln_rt_destroy(void *instance) {
    KilnInstance *in = instance;
    if (!in)
        return;
    if (in->workers) {
        __atomic_store_n(&in->stopping, 1, __ATOMIC_RELEASE);
        kiln_rt_announce(in, kiln_rt_next_loop(in));
        for (int i = 0; i < in->n_threads - 1; i++)
            pthread_join(in->workers[i], NULL);
        free(in->workers);
    }
    free(in->shares);
    free(in->ws);
    free(in->st);
    for (int k = 0; in->staged && k < in->prog->n_in + in->prog->n_out; k++)
        free(in->staged[k]);
    free(in->staged);
    free(in->run_in);
    free(in->run_out);
    free(in);
}

/* The buffers a run smaller than the symbolic dim's bound stages its ports in (and
 * the pointers to a split batch's items). */
static int kiln_rt_stage(KilnInstance *in, char *err, size_t errlen) {
    const KilnProgram *prog = in->prog;
    int ports = prog->n_in + prog->n_out;
    in->staged = calloc((size_t)ports + 1, sizeof *in->staged);
    in->run_in = calloc((size_t)prog->n_in + 1, sizeof *in->run_in);
    in->run_out = calloc((size_t)prog->n_out + 1, sizeof *in->run_out);
    if (!in->staged || !in->run_in || !in->run_out) {
        snprintf(err, errlen, "out of memory creating the instance");
        return 1;
    }
    for (int k = 0; prog->sym_bound && k < ports; k++) {
        int64_t unit = k < prog->n_in ? prog->in_unit_bytes[k] : prog->out_unit_bytes[k - prog->n_in];
        if (unit && !(in->staged[k] = calloc((size_t)prog->sym_bound, (size_t)unit))) {
            snprintf(err, errlen, "out of memory: a port of the symbolic dim needs %lld bytes",
                     (long long)(unit * prog->sym_bound));
            return 1;
        }
    }
    return 0;
}

/* Whether comm (NULL: none) can be used, with a message in err when not. */
static int kiln_rt_comm_valid(const kiln_comm *comm, char *err, size_t errlen) {
    if (comm && (comm->size < 1 || comm->rank < 0 || comm->rank >= comm->size || !comm->allreduce_sum)) {
        snprintf(err, errlen, "the communicator is malformed (rank %d of %d processes%s)", (int)comm->rank,
                 (int)comm->size, comm->allreduce_sum ? "" : ", no allreduce_sum");
        return 1;
    }
    return 0;
}

int kiln_rt_create(const KilnProgram *prog, const kiln_comm *comm, void **instance, char *err,
                   size_t errlen) {
    *instance = NULL;
    if (kiln_rt_comm_valid(comm, err, errlen))
        return 1;
    KilnInstance *in = calloc(1, sizeof *in);
    if (!in) {
        snprintf(err, errlen, "out of memory creating the instance");
        return 1;
    }
    in->prog = prog;
    if (comm)
        in->comm = *comm;
    in->n_threads = kiln_rt_threads();
    size_t bytes = (size_t)prog->workspace_bytes;
    if (prog->at_one && (size_t)prog->at_one->workspace_bytes > bytes)
        bytes = (size_t)prog->at_one->workspace_bytes;
    if (bytes && posix_memalign((void **)&in->ws, 64, bytes) != 0) {
        snprintf(err, errlen, "out of memory: the workspace needs %zu bytes", bytes);
        in->ws = NULL;
        kiln_rt_destroy(in);
        return 1;
    }
    bytes = (size_t)prog->state_bytes;
    if (bytes) {
        if (posix_memalign((void **)&in->st, 64, bytes) != 0) {
            snprintf(err, errlen, "out of memory: the params a step updates need %zu bytes", bytes);
            in->st = NULL;
            kiln_rt_destroy(in);
            return 1;
        }
        memcpy(in->st, prog->weights, bytes);
    }
    if ((prog->sym_bound || prog->split) && kiln_rt_stage(in, err, errlen)) {
        kiln_rt_destroy(in);
        return 1;
    }
    if (in->n_threads > 1) {
        in->home_cpu = kiln_rt_cpu();
        if (posix_memalign((void **)&in->shares, 64, (size_t)in->n_threads * sizeof *in->shares) != 0)
            in->shares = NULL;
        else {
            memset(in->shares, 0, (size_t)in->n_threads * sizeof *in->shares);
            in->workers = calloc((size_t)in->n_threads - 1, sizeof *in->workers);
        }
        for (int i = 0; in->workers && i < in->n_threads - 1; i++)
            if (pthread_create(&in->workers[i], NULL, kiln_rt_worker, in) != 0) {
                in->n_threads = i + 1; /* the threads made so far are joined by destroy */
                break;
            }
        if (!in->workers)
            in->n_threads = 1;
    }
    /* the pool runs GEMM tiles in parallel, each a single-threaded BLAS call: BLAS
       threads of its own would only compete with the pool's for the cores */
    if (prog->set_blas_threads)
        prog->set_blas_threads(1);
    *instance = in;
    return 0;
}

/* A param's bytes in the state, copied out or in between runs (kiln_model_def's
   read_param and write_param). */
int kiln_rt_read_state(void *instance, int64_t offset, int64_t bytes, void *dst) {
    const KilnInstance *in = instance;
    memcpy(dst, (const char *)in->st + offset, (size_t)bytes);
    return 0;
}

int kiln_rt_write_state(void *instance, int64_t offset, int64_t bytes, const void *src) {
    KilnInstance *in = instance;
    memcpy((char *)in->st + offset, src, (size_t)bytes);
    return 0;
}

/* A split batch (KilnProgram's split): each item in turn, on its rows of the inputs
 * and outputs. */
static int kiln_rt_run_items(KilnInstance *in, const void *const *inputs, void *const *outputs) {
    const KilnProgram *prog = in->prog;
    const void **item_in = (const void **)in->run_in;
    void **item_out = in->run_out;
    for (int64_t i = 0; i < prog->split; i++) {
        for (int k = 0; k < prog->n_in; k++)
            item_in[k] = (const char *)inputs[k] + i * prog->in_unit_bytes[k];
        for (int k = 0; k < prog->n_out; k++)
            item_out[k] = (char *)outputs[k] + i * prog->out_unit_bytes[k];
        int fault = 0;
        KilnArgs a = {(const float *const *)item_in,
                      (float *const *)item_out,
                      in->ws,
                      (const float *)prog->weights,
                      in->st,
                      &fault,
                      in->comm.size ? &in->comm : NULL,
                      0};
        prog->run(in, &a);
        if (fault)
            return fault;
    }
    return 0;
}

int kiln_rt_run_sym(void *instance, const int64_t *sizes, const void *const *inputs, void *const *outputs) {
    KilnInstance *in = instance;
    const KilnProgram *prog = in->prog;
    if (prog->split)
        return kiln_rt_run_items(in, inputs, outputs);
    int64_t size = prog->sym_bound ? sizes[0] : 0;
    if (prog->sym_bound && (size < 1 || size > prog->sym_bound))
        return -1;
    if (size == 1 && prog->at_one) { /* its buffers are the size-1 ports themselves */
        prog = prog->at_one;
        size = 0;
    }
    int staged = size < prog->sym_bound;
    for (int k = 0; staged && k < prog->n_in; k++) {
        in->run_in[k] = in->staged[k] ? in->staged[k] : inputs[k];
        if (in->staged[k])
            memcpy(in->staged[k], inputs[k], (size_t)(size * prog->in_unit_bytes[k]));
    }
    for (int k = 0; staged && k < prog->n_out; k++)
        in->run_out[k] = in->staged[prog->n_in + k] ? in->staged[prog->n_in + k] : outputs[k];
    int fault = 0;
    KilnArgs a = {(const float *const *)(staged ? in->run_in : (const void **)inputs),
                  (float *const *)(staged ? in->run_out : outputs),
                  in->ws,
                  (const float *)prog->weights,
                  in->st,
                  &fault,
                  in->comm.size ? &in->comm : NULL,
                  prog->sym_bound ? size : 0};
    prog->run(in, &a);
    for (int k = 0; staged && k < prog->n_out; k++)
        if (in->staged[prog->n_in + k])
            memcpy(outputs[k], in->staged[prog->n_in + k], (size_t)(size * prog->out_unit_bytes[k]));
    return fault;
}

int kiln_rt_run(void *instance, const void *const *inputs, void *const *outputs) {
    KilnInstance *in = instance;
    return kiln_rt_run_sym(instance, &in->prog->sym_bound, inputs, outputs);
}
