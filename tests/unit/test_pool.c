/* The thread pool every compiled model carries (runtime/model_rt.c), on its own.
 *
 * The runtime is included here whole (its statics too), and driven by a
 * program with no kernels, so its loops run test kernels: each counts, per index,
 * how often it ran, and every loop must run every index exactly once, however the
 * chunks fall to the threads. The cases:
 *   - every count from 0 to a few hundred with grains 1 to beyond the count, so
 *     loops too small to split, one chunk, a ragged last chunk and many chunks all
 *     occur, one loop right after another as a model's kernels do;
 *   - chunks of very uneven cost, and a worker that sleeps inside its chunk while
 *     the caller finishes the rest (the late worker the pool must not wait for
 *     except for the chunk it holds);
 *   - the order of the chunks: the caller's own share from the front, then the
 *     worker's from the back, whichever of its chunks the worker takes first;
 *   - loops after the workers have gone to sleep, so each loop wakes them;
 *   - destroying an instance at once and after sleeping.
 * And what else the runtime does: the state read and written between runs, and
 * allreduce through a communicator handed to create.
 * scripts/test.sh runs this under ThreadSanitizer too. */
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "../../runtime/model_rt.c"

enum { MAX_COUNT = 400 };

static int hits[MAX_COUNT];
static pthread_t caller;
static int slow_worker; /* the worker (not the caller) sleeps 2 ms in its first chunk */

/* Counts each iteration in the array buf[0], the buffer every chunk must be handed. */
static void count_hits(const KilnArgs *a, void *const *buf, int64_t begin, int64_t end) {
    (void)a;
    int *counts = buf[0];
    if (__atomic_load_n(&slow_worker, __ATOMIC_RELAXED) && !pthread_equal(pthread_self(), caller) &&
        __atomic_exchange_n(&slow_worker, 0, __ATOMIC_RELAXED))
        usleep(2000);
    for (int64_t i = begin; i < end; i++)
        __atomic_add_fetch(&counts[i], 1, __ATOMIC_RELAXED);
}

static void uneven_hits(const KilnArgs *a, void *const *buf, int64_t begin, int64_t end) {
    if (begin % 3 == 0) { /* a costly chunk: work the compiler must keep */
        volatile double work = 0;
        for (int i = 0; i < 20000; i++)
            work = work + i;
        (void)work;
    }
    count_hits(a, buf, begin, end);
}

static const KilnProgram no_kernels = {.workspace_bytes = 0};

static KilnInstance *make(int threads) {
    char n[16], err[128];
    snprintf(n, sizeof n, "%d", threads);
    setenv("KILN_NUM_THREADS", n, 1);
    void *in = NULL;
    assert_int_equal(kiln_rt_create(&no_kernels, NULL, &in, err, sizeof err), 0);
    caller = pthread_self();
    return in;
}

static void run_and_check(KilnInstance *in, KilnKernel k, int64_t count, int64_t grain) {
    memset(hits, 0, sizeof hits);
    KilnArgs a = {0};
    void *const buf[] = {hits};
    kiln_rt_parallel(in, k, &a, buf, count, grain);
    for (int64_t i = 0; i < MAX_COUNT; i++)
        if (hits[i] != (i < count)) {
            fail_msg("count %lld, grain %lld: index %lld ran %d times", (long long)count, (long long)grain,
                     (long long)i, hits[i]);
        }
}

static void every_count_and_grain(void **state) {
    (void)state;
    for (int threads = 1; threads <= 2; threads++) {
        KilnInstance *in = make(threads);
        for (int64_t count = 0; count <= MAX_COUNT; count += count < 40 ? 1 : 37)
            for (int64_t grain = 0; grain <= count + 2; grain += grain < 8 ? 1 : 13)
                run_and_check(in, count % 2 ? uneven_hits : count_hits, count, grain);
        kiln_rt_destroy(in);
    }
}

static void many_loops_in_a_row(void **state) {
    (void)state;
    KilnInstance *in = make(2);
    for (int i = 0; i < 20000; i++)
        run_and_check(in, count_hits, 16 + i % 200, 1 + i % 5);
    kiln_rt_destroy(in);
}

static void late_worker(void **state) {
    (void)state;
    KilnInstance *in = make(2);
    if (in->n_threads < 2) {
        kiln_rt_destroy(in);
        skip();
    }
    for (int i = 0; i < 50; i++) {
        __atomic_store_n(&slow_worker, 1, __ATOMIC_RELAXED);
        run_and_check(in, count_hits, 64 + i, 1);
        run_and_check(in, count_hits, 300, 4); /* the next loop, maybe while the worker still sleeps */
    }
    __atomic_store_n(&slow_worker, 0, __ATOMIC_RELAXED);
    kiln_rt_destroy(in);
}

/* 16 chunks of 4 on two threads: the caller's share is chunks 0 to 7, the worker's
   8 to 15. The worker's first chunk waits until the caller has run 15. */
enum { ORDER_CHUNKS = 16 };
static int caller_order[ORDER_CHUNKS], caller_ran, worker_order[ORDER_CHUNKS], worker_ran;

static void record_order(const KilnArgs *a, void *const *buf, int64_t begin, int64_t end) {
    (void)a, (void)buf, (void)end;
    int chunk = (int)(begin / 4);
    if (pthread_equal(pthread_self(), caller)) {
        caller_order[caller_ran] = chunk;
        __atomic_store_n(&caller_ran, caller_ran + 1, __ATOMIC_RELEASE);
        return;
    }
    if (worker_ran++ == 0)
        for (int i = 0; i < 200000 && __atomic_load_n(&caller_ran, __ATOMIC_ACQUIRE) < ORDER_CHUNKS - 1; i++)
            usleep(10);
    worker_order[worker_ran - 1] = chunk;
}

static void chunk_order(void **state) {
    (void)state;
    KilnInstance *in = make(2);
    if (in->n_threads < 2) {
        kiln_rt_destroy(in);
        skip();
    }
    for (int round = 0; round < 20; round++) {
        caller_ran = worker_ran = 0;
        kiln_rt_parallel(in, record_order, &(KilnArgs){0}, (void *const[]){hits}, 4 * ORDER_CHUNKS, 4);
        assert_int_equal(caller_ran + worker_ran, ORDER_CHUNKS);
        assert_true(worker_ran <= 1); /* the worker waits out the caller */
        for (int i = 0; i < caller_ran; i++)
            assert_int_equal(caller_order[i],
                             i < ORDER_CHUNKS / 2 ? i : ORDER_CHUNKS / 2 + ORDER_CHUNKS - 1 - i);
        if (worker_ran)
            assert_int_equal(worker_order[0], ORDER_CHUNKS / 2);
    }
    kiln_rt_destroy(in);
}

static void loops_after_sleep(void **state) {
    (void)state;
    KilnInstance *in = make(2);
    for (int i = 0; i < 5; i++) {
        usleep(5000); /* longer than the spin: the workers are asleep on the futex */
        run_and_check(in, uneven_hits, 100 + i, 1);
    }
    kiln_rt_destroy(in);
    kiln_rt_destroy(make(2));
    in = make(2);
    usleep(5000);
    kiln_rt_destroy(in);
}

/* The state starts as the weights' first state_bytes; a param written in is read back
   out, and its neighbours are left alone. */
static void state_read_and_write(void **unused) {
    (void)unused;
    static const float weights[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    static const KilnProgram stateful = {.state_bytes = sizeof weights,
                                         .weights = (const unsigned char *)weights};
    setenv("KILN_NUM_THREADS", "1", 1);
    void *in = NULL;
    char err[128];
    assert_int_equal(kiln_rt_create(&stateful, NULL, &in, err, sizeof err), 0);
    float got[8], put[2] = {-1, -2};
    assert_int_equal(kiln_rt_read_state(in, 0, sizeof got, got), 0);
    assert_memory_equal(got, weights, sizeof got);
    assert_int_equal(kiln_rt_write_state(in, 3 * sizeof(float), sizeof put, put), 0);
    assert_int_equal(kiln_rt_read_state(in, 0, sizeof got, got), 0);
    const float want[8] = {1, 2, 3, -1, -2, 6, 7, 8};
    assert_memory_equal(got, want, sizeof got);
    kiln_rt_destroy(in);
}

/* A communicator of two processes whose other one holds `other`; or one that fails. */
typedef struct {
    float other[4];
    bool fail;
    int calls;
} FakeComm;

static int fake_allreduce_sum(void *ctx, const void *src, void *dst, int64_t count, int32_t dtype) {
    FakeComm *c = ctx;
    c->calls++;
    if (c->fail || dtype != KILN_F32 || count != 4)
        return 1;
    for (int64_t i = 0; i < count; i++)
        ((float *)dst)[i] = ((const float *)src)[i] + c->other[i];
    return 0;
}

static int mean_flag;

static void reduce_run(KilnInstance *inst, const KilnArgs *args) {
    (void)inst;
    KILN_ALLREDUCE(args->in[0], args->out[0], 4, mean_flag, 7);
}

static const KilnProgram reducing = {.run = reduce_run};

/* Runs `reducing` on x with comm (NULL: none): the fault, the result in y. */
static int reduce(const kiln_comm *comm, int mean, const float *x, float *y) {
    setenv("KILN_NUM_THREADS", "1", 1);
    void *in = NULL;
    char err[128];
    assert_int_equal(kiln_rt_create(&reducing, comm, &in, err, sizeof err), 0);
    mean_flag = mean;
    int fault = kiln_rt_run(in, (const void *const[]){x}, (void *const[]){y});
    kiln_rt_destroy(in);
    return fault;
}

/* The sum and mean over the processes; one process alone copies; a failing
   communicator raises the kernel's fault; a malformed one is refused at create. */
static void allreduce_through_a_comm(void **unused) {
    (void)unused;
    FakeComm fake = {{10, 20, 30, 40}, false, 0};
    kiln_comm comm = {1, 2, &fake, fake_allreduce_sum, NULL};
    const float x[4] = {1, 2, 3, 5};
    float y[4];
    assert_int_equal(reduce(&comm, 0, x, y), 0);
    assert_memory_equal(y, ((float[]){11, 22, 33, 45}), sizeof y);
    assert_int_equal(reduce(&comm, 1, x, y), 0);
    assert_memory_equal(y, ((float[]){5.5f, 11, 16.5f, 22.5f}), sizeof y);
    assert_int_equal(fake.calls, 2);
    assert_int_equal(reduce(NULL, 1, x, y), 0);
    assert_memory_equal(y, x, sizeof y);
    kiln_comm alone = {0, 1, &fake, fake_allreduce_sum, NULL};
    assert_int_equal(reduce(&alone, 0, x, y), 0);
    assert_memory_equal(y, x, sizeof y);
    assert_int_equal(fake.calls, 2);
    fake.fail = true;
    assert_int_equal(reduce(&comm, 0, x, y), 7);

    void *in = NULL;
    char err[128];
    kiln_comm bad = {2, 2, &fake, fake_allreduce_sum, NULL};
    assert_int_not_equal(kiln_rt_create(&reducing, &bad, &in, err, sizeof err), 0);
    assert_null(in);
    assert_string_equal(err, "the communicator is malformed (rank 2 of 2 processes)");
}

int main(void) {
    (void)kiln_rt_run; /* what a model's definition points at; unused here */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_count_and_grain),
        cmocka_unit_test(many_loops_in_a_row),
        cmocka_unit_test(late_worker),
        cmocka_unit_test(chunk_order),
        cmocka_unit_test(loops_after_sleep),
        cmocka_unit_test(state_read_and_write),
        cmocka_unit_test(allreduce_through_a_comm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
