/* The runtime every compiled model carries: instances, the workspace, and a small
 * thread pool for the generated loops.
 *
 * kiln pastes this file into each generated translation unit (after kiln/model.h),
 * so a compiled .so needs no kiln library at run time; every symbol here is static.
 * An instance owns its workspace (allocated once in create, so run allocates
 * nothing), its state (the params a training step updates, so each instance
 * trains its own copy) and its pool of KILN_NUM_THREADS - 1 worker threads; the calling thread
 * is the last worker. A parallel loop hands out chunks of at least `grain`
 * iterations through an atomic counter. */
#include "kiln/model.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The buffers a kernel sees: the caller's inputs and outputs, the workspace, the
 * weights, and the state (the params a training step updates). */
typedef struct {
    const float *const *in;
    float *const *out;
    float *ws;
    const float *wt;
    float *st;
} KilnArgs;

typedef void (*KilnKernel)(const KilnArgs *a, int64_t begin, int64_t end);

typedef struct KilnInstance KilnInstance;

/* What the generated code tells the runtime about its model. */
typedef struct {
    int64_t workspace_bytes;
    int64_t state_bytes; /* the state starts as a copy of the weights' first state_bytes */
    const unsigned char *weights;
    void (*run)(KilnInstance *inst, const KilnArgs *a);
    void (*set_blas_threads)(int n); /* NULL when the model calls no BLAS */
} KilnProgram;

struct KilnInstance {
    const KilnProgram *prog;
    float *ws;
    float *st;
    int n_threads;
    pthread_t *workers;
    pthread_mutex_t lock;
    pthread_cond_t wake, done;
    /* the loop being run: generation counts loops so workers see each one once */
    KilnKernel kernel;
    const KilnArgs *args;
    int64_t count, chunk, next;
    long generation;
    int busy; /* workers still in the current loop */
    int stopping;
};

static void kiln_rt_work(KilnInstance *in) {
    for (;;) {
        int64_t begin = __atomic_fetch_add(&in->next, in->chunk, __ATOMIC_RELAXED);
        if (begin >= in->count)
            return;
        int64_t end = begin + in->chunk < in->count ? begin + in->chunk : in->count;
        in->kernel(in->args, begin, end);
    }
}

/* Waiting on a condition variable costs tens of microseconds to wake from, about a
 * small kernel's time, so a waiting thread first spins a while on the value. */
enum { KILN_SPINS = 20000 };

static void kiln_rt_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void *kiln_rt_worker(void *arg) {
    KilnInstance *in = arg;
    long seen = 0;
    for (;;) {
        for (int spin = 0; spin < KILN_SPINS && __atomic_load_n(&in->generation, __ATOMIC_ACQUIRE) == seen &&
                           !__atomic_load_n(&in->stopping, __ATOMIC_ACQUIRE);
             spin++)
            kiln_rt_pause();
        pthread_mutex_lock(&in->lock);
        while (__atomic_load_n(&in->generation, __ATOMIC_ACQUIRE) == seen && !in->stopping)
            pthread_cond_wait(&in->wake, &in->lock);
        pthread_mutex_unlock(&in->lock);
        if (__atomic_load_n(&in->stopping, __ATOMIC_ACQUIRE))
            return NULL;
        seen = __atomic_load_n(&in->generation, __ATOMIC_ACQUIRE);
        kiln_rt_work(in);
        if (__atomic_sub_fetch(&in->busy, 1, __ATOMIC_ACQ_REL) == 0) {
            pthread_mutex_lock(&in->lock);
            pthread_cond_signal(&in->done);
            pthread_mutex_unlock(&in->lock);
        }
    }
}

/* Runs kernel k over [0, count) on the instance's threads. */
static void kiln_rt_parallel(KilnInstance *in, KilnKernel k, const KilnArgs *a, int64_t count,
                             int64_t grain) {
    int64_t chunks = grain > 0 ? count / grain : count;
    if (in->n_threads == 1 || chunks < 2) {
        k(a, 0, count);
        return;
    }
    int64_t parts = (int64_t)in->n_threads * 4; /* a few chunks per thread evens out the load */
    if (parts > chunks)
        parts = chunks;
    pthread_mutex_lock(&in->lock);
    in->kernel = k;
    in->args = a;
    in->count = count;
    in->chunk = (count + parts - 1) / parts;
    in->next = 0;
    __atomic_store_n(&in->busy, in->n_threads - 1, __ATOMIC_RELEASE);
    __atomic_add_fetch(&in->generation, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&in->wake);
    pthread_mutex_unlock(&in->lock);
    kiln_rt_work(in);
    for (int spin = 0; spin < KILN_SPINS && __atomic_load_n(&in->busy, __ATOMIC_ACQUIRE) > 0; spin++)
        kiln_rt_pause();
    pthread_mutex_lock(&in->lock);
    while (__atomic_load_n(&in->busy, __ATOMIC_ACQUIRE) > 0)
        pthread_cond_wait(&in->done, &in->lock);
    pthread_mutex_unlock(&in->lock);
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

static void kiln_rt_destroy(void *instance) {
    KilnInstance *in = instance;
    if (!in)
        return;
    if (in->workers) {
        pthread_mutex_lock(&in->lock);
        __atomic_store_n(&in->stopping, 1, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&in->wake);
        pthread_mutex_unlock(&in->lock);
        for (int i = 0; i < in->n_threads - 1; i++)
            pthread_join(in->workers[i], NULL);
        free(in->workers);
    }
    pthread_mutex_destroy(&in->lock);
    pthread_cond_destroy(&in->wake);
    pthread_cond_destroy(&in->done);
    free(in->ws);
    free(in->st);
    free(in);
}

static int kiln_rt_create(const KilnProgram *prog, void **instance, char *err, size_t errlen) {
    *instance = NULL;
    KilnInstance *in = calloc(1, sizeof *in);
    if (!in) {
        snprintf(err, errlen, "out of memory creating the instance");
        return 1;
    }
    in->prog = prog;
    in->n_threads = kiln_rt_threads();
    pthread_mutex_init(&in->lock, NULL);
    pthread_cond_init(&in->wake, NULL);
    pthread_cond_init(&in->done, NULL);
    size_t bytes = (size_t)prog->workspace_bytes;
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
    if (in->n_threads > 1) {
        in->workers = calloc((size_t)in->n_threads - 1, sizeof *in->workers);
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

static int kiln_rt_run(void *instance, const void *const *inputs, void *const *outputs) {
    KilnInstance *in = instance;
    KilnArgs a = {(const float *const *)inputs, (float *const *)outputs, in->ws,
                  (const float *)in->prog->weights, in->st};
    in->prog->run(in, &a);
    return 0;
}
