/* libkiln from many threads at once: compiling, loading from the cache and running.
 *
 * Every model here is first compiled and run on the main thread alone, into a
 * cache of its own; its outputs (of several runs in a row, so that a training
 * step's changed state shows too) are the reference. Then eight threads start
 * together at a barrier and do the same, and every output must equal the
 * reference bit for bit:
 *   - lowering and emitting C alone, over and over, the same text every time (the
 *     race on value_name's buffers shows here even on two cores);
 *   - each thread a different model, in a fresh cache, so all of them really
 *     compile (parsing, passes, lowering, emitting, Clang) side by side;
 *   - two threads on each model in a fresh cache, racing to write the same entries;
 *   - every thread every model in the reference's warm cache, racing to load them;
 *   - one module, each thread running an instance of its own (abi.md: run is
 *     reentrant across instances);
 *   - the system compiler's path without a cache, where each compile goes through
 *     a temporary shared object;
 *   - the CUDA target emulated on the CPU, an instance on every thread;
 *   - shape errors (their messages), allocation failure armed on one thread, and
 *     files written while others are created (the umask).
 * The threads report to the main thread, which alone calls cmocka. The models: the
 * small CNN (examples/), the training step of train_cnn (updates), the language
 * spec's autograd example as text (kiln_jit), an ONNX CNN and four batteries of
 * tests/ref. Run under ThreadSanitizer by scripts/test.sh (KILN_SANITIZE=thread). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codegen/codegen.h"
#include "frontend/frontend.h"
#include "passes/passes.h"
#include "kiln/kiln.h"

#ifndef KILN_SOURCE_DIR
#define KILN_SOURCE_DIR "."
#endif

enum { N_THREADS = 8, RUNS = 3, WARM_ROUNDS = 4 };

typedef struct {
    const char *path;    /* a model file, or NULL for text */
    const char *text;    /* model text for kiln_jit */
    const char *weights; /* a safetensors file, or NULL */
} Model;

static const char autograd_text[] = "model autograd_example\n"
                                    "input  x  : f32[2, 2]\n"
                                    "param  w1 : f32[] = fill(2.0)\n"
                                    "param  w2 : f32[] = fill(3.0)\n"
                                    "param  w3 : f32[] = fill(4.0)\n"
                                    "l1 = mul(x, w1)\n"
                                    "l2 = add(l1, w2)\n"
                                    "l3 = mul(l1, w3)\n"
                                    "l4 = mul(l2, l3)\n"
                                    "loss = mean(l4)\n"
                                    "g1, g2, g3 = grad(loss, w1, w2, w3)\n"
                                    "output loss, g1, g2, g3\n";

#define SRC KILN_SOURCE_DIR "/"
static const Model models[N_THREADS] = {
    {SRC "examples/small_cnn.kiln", NULL, NULL},
    {SRC "examples/train_cnn.kiln", NULL, SRC "examples/train_cnn_init.safetensors"},
    {NULL, autograd_text, NULL},
    {SRC "tests/onnx/models/tiny_cnn_opset13.onnx", NULL, NULL},
    {SRC "tests/ref/softmax.kiln", NULL, SRC "tests/ref/softmax.safetensors"},
    {SRC "tests/ref/fused.kiln", NULL, SRC "tests/ref/fused.safetensors"},
    {SRC "tests/ref/shape.kiln", NULL, SRC "tests/ref/shape.safetensors"},
    {SRC "tests/ref/conv_transpose.kiln", NULL, SRC "tests/ref/conv_transpose.safetensors"},
};

/* The outputs of RUNS runs, one after another. */
typedef struct {
    unsigned char *bytes;
    size_t len;
} Outputs;

static Outputs reference[N_THREADS];
static char base_dir[] = "/tmp/test_threads-XXXXXX";
static char warm_cache[64];

static const char *model_name(int i) {
    return models[i].path ? models[i].path : "<autograd text>";
}

static kiln_module *jit_model(int i, const char *cache_dir, const char *jit, kiln_error *err) {
    const char *weights[] = {models[i].weights};
    kiln_options o = {.opt_level = 2,
                      .weights = weights,
                      .n_weights = models[i].weights ? 1 : 0,
                      .cache_dir = cache_dir,
                      .jit = jit};
    return models[i].path ? kiln_jit_file(models[i].path, &o, err) : kiln_jit(models[i].text, &o, err);
}

static size_t tensor_bytes(const kiln_tensor_info *t) {
    size_t n = t->dtype == KILN_I64 ? 8 : t->dtype == KILN_F32 ? 4 : 2;
    for (int k = 0; k < t->rank; k++)
        n *= (size_t)t->shape[k];
    return n;
}

static int set_error(kiln_error *err, const char *msg) {
    snprintf(err->message, sizeof err->message, "%s", msg);
    return -1;
}

/* Runs the model RUNS times on the same inputs (a fixed pseudo-random pattern),
 * through kiln_run on module m, else def->run on instance, appending every output
 * to *out; 0, or -1 with a message in err. */
static int run_def(const kiln_model_def *def, kiln_module *m, void *instance, Outputs *out, kiln_error *err) {
    size_t in_total = 0, out_total = 0;
    for (int k = 0; k < def->n_inputs; k++)
        in_total += tensor_bytes(&def->inputs[k]);
    for (int k = 0; k < def->n_outputs; k++)
        out_total += tensor_bytes(&def->outputs[k]);
    unsigned char *in = malloc(in_total + 1);
    const void **inputs = calloc((size_t)def->n_inputs + 1, sizeof *inputs);
    void **outputs = calloc((size_t)def->n_outputs + 1, sizeof *outputs);
    out->len = out_total * RUNS;
    out->bytes = calloc(out->len + 1, 1);
    int rc = in && inputs && outputs && out->bytes ? 0 : set_error(err, "out of memory");
    uint32_t seed = 12345;
    for (int k = 0, at = 0; !rc && k < def->n_inputs; k++) {
        inputs[k] = in + at;
        size_t n = tensor_bytes(&def->inputs[k]);
        if (def->inputs[k].dtype == KILN_F32)
            for (size_t e = 0; e < n / 4; e++) {
                seed = seed * 1664525u + 1013904223u;
                float v = (float)(seed >> 8) / (float)(1 << 24) - 0.5f;
                memcpy(in + at + e * 4, &v, 4);
            }
        else
            memset(in + at, 0, n);
        at += (int)n;
    }
    for (int r = 0; !rc && r < RUNS; r++) {
        size_t at = out_total * (size_t)r;
        for (int k = 0; k < def->n_outputs; k++) {
            outputs[k] = out->bytes + at;
            at += tensor_bytes(&def->outputs[k]);
        }
        if (m ? kiln_run(m, inputs, outputs, err) != 0 : def->run(instance, inputs, outputs) != 0)
            rc = m ? -1 : set_error(err, "a run failed");
    }
    free(in);
    free(inputs);
    free(outputs);
    return rc;
}

/* Through kiln_run, on the module's own instance. */
static int run_module(kiln_module *m, Outputs *out, kiln_error *err) {
    return run_def(kiln_def(m), m, NULL, out, err);
}

/* What one thread does, and what it found. */
typedef struct {
    int model;             /* the model it compiles (first, for `all`) */
    bool all;              /* every model in turn, from `model` on */
    const char *cache_dir; /* the compile cache it uses */
    const char *jit;       /* kiln_options.jit: NULL, the default, or "cc" */
    kiln_module *shared;   /* run an instance of this module's instead of compiling */
    const Outputs *want;   /* what its outputs must be, when not the model's reference */
    pthread_barrier_t *start;
    void *(*body)(void *job); /* what the thread runs, when not the above */
    char failure[1200];       /* empty when every output matched */
} Job;

static void compare_outputs(Job *j, int model, const Outputs *got) {
    const Outputs *want = j->want ? j->want : &reference[model];
    if (got->len != want->len)
        snprintf(j->failure, sizeof j->failure, "%s: %zu bytes of outputs, %zu single-threaded",
                 model_name(model), got->len, want->len);
    else if (memcmp(got->bytes, want->bytes, got->len) != 0)
        snprintf(j->failure, sizeof j->failure, "%s: outputs differ from the single-threaded ones",
                 model_name(model));
}

static void *thread_main(void *arg) {
    Job *j = arg;
    pthread_barrier_wait(j->start);
    for (int n = 0; n < (j->all ? WARM_ROUNDS * N_THREADS : 1) && !j->failure[0]; n++) {
        int model = (j->model + n) % N_THREADS;
        kiln_error err = {.message = ""};
        Outputs got = {0};
        if (j->shared) {
            const kiln_model_def *def = kiln_def(j->shared);
            void *instance = NULL;
            char msg[512] = "";
            if (def->create(&instance, msg, sizeof msg) != 0)
                snprintf(j->failure, sizeof j->failure, "create: %s", msg);
            else if (run_def(def, NULL, instance, &got, &err) != 0)
                snprintf(j->failure, sizeof j->failure, "%s: %s", model_name(model), err.message);
            if (instance)
                def->destroy(instance);
        } else {
            kiln_module *m = jit_model(model, j->cache_dir, j->jit, &err);
            if (!m)
                snprintf(j->failure, sizeof j->failure, "%s: %s", model_name(model), err.message);
            else if (run_module(m, &got, &err) != 0)
                snprintf(j->failure, sizeof j->failure, "%s: %s", model_name(model), err.message);
            kiln_free(m);
        }
        if (!j->failure[0])
            compare_outputs(j, model, &got);
        free(got.bytes);
    }
    return NULL;
}

/* Runs the jobs on N_THREADS threads started together; fails with every thread's
 * complaint. */
static void run_jobs(Job *jobs) {
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, N_THREADS);
    pthread_t threads[N_THREADS];
    for (int t = 0; t < N_THREADS; t++) {
        jobs[t].start = &start;
        assert_int_equal(
            pthread_create(&threads[t], NULL, jobs[t].body ? jobs[t].body : thread_main, &jobs[t]), 0);
    }
    for (int t = 0; t < N_THREADS; t++)
        pthread_join(threads[t], NULL);
    pthread_barrier_destroy(&start);
    int failed = 0;
    for (int t = 0; t < N_THREADS; t++)
        if (jobs[t].failure[0]) {
            printf("thread %d: %s\n", t, jobs[t].failure);
            failed++;
        }
    if (failed)
        fail_msg("%d of %d threads failed", failed, N_THREADS);
}

/* A new empty directory under the test's own. */
static void fresh_dir(char *buf, size_t n, const char *name) {
    snprintf(buf, n, "%s/%s", base_dir, name);
    assert_int_equal(mkdir(buf, 0700), 0);
}

static void test_hostile_jit_many_threads(void **state) {
    (void)state;
    char cache[64];
    fresh_dir(cache, sizeof cache, "cold");
    Job jobs[N_THREADS] = {0};
    for (int t = 0; t < N_THREADS; t++)
        jobs[t] = (Job){.model = t, .cache_dir = cache};
    run_jobs(jobs);
}

static void test_hostile_jit_same_model_many_threads(void **state) {
    (void)state;
    char cache[64];
    fresh_dir(cache, sizeof cache, "cold_shared");
    Job jobs[N_THREADS] = {0};
    for (int t = 0; t < N_THREADS; t++)
        jobs[t] = (Job){.model = t % 4, .cache_dir = cache};
    run_jobs(jobs);
}

static void test_hostile_jit_warm_cache_many_threads(void **state) {
    (void)state;
    Job jobs[N_THREADS] = {0};
    for (int t = 0; t < N_THREADS; t++)
        jobs[t] = (Job){.model = t, .all = true, .cache_dir = warm_cache};
    run_jobs(jobs);
}

static void test_hostile_run_instances_many_threads(void **state) {
    (void)state;
    /* the small CNN, and the training step, whose instances each keep their state */
    for (int model = 0; model < 2; model++) {
        kiln_error err = {.message = ""};
        kiln_module *m = jit_model(model, warm_cache, NULL, &err);
        if (!m)
            fail_msg("%s: %s", model_name(model), err.message);
        Job jobs[N_THREADS] = {0};
        for (int t = 0; t < N_THREADS; t++)
            jobs[t] = (Job){.model = model, .shared = m};
        run_jobs(jobs);
        kiln_free(m);
    }
}

/* The CUDA target emulated on the CPU (cuda/emulate.h): instances of one module
 * on every thread, each launching kernels whose threads are fibers of its own
 * (GEMMs synchronize, with shared memory). */
static void test_hostile_run_cuda_emulated_instances_many_threads(void **state) {
    (void)state;
    kiln_options o = {.target = "cuda", .opt_level = 2, .cache_dir = warm_cache, .cuda = "emulate"};
    kiln_error err = {.message = ""};
    kiln_module *m = kiln_jit_file(models[0].path, &o, &err);
    if (!m)
        fail_msg("%s on the emulated CUDA target: %s", model_name(0), err.message);
    Outputs want = {0};
    if (run_module(m, &want, &err) != 0) {
        kiln_free(m);
        fail_msg("%s: %s", model_name(0), err.message);
    }
    Job jobs[N_THREADS] = {0};
    for (int t = 0; t < N_THREADS; t++)
        jobs[t] = (Job){.model = 0, .shared = m, .want = &want};
    run_jobs(jobs);
    free(want.bytes);
    kiln_free(m);
}

/* The system compiler, and no cache (a directory that cannot be made): every
 * compile makes, loads and removes a temporary shared object, two threads per
 * model. */
static void test_hostile_jit_cc_many_threads(void **state) {
    (void)state;
    Job jobs[N_THREADS] = {0};
    for (int t = 0; t < N_THREADS; t++)
        jobs[t] = (Job){.model = t % 2 ? 2 : 0, .cache_dir = "/proc/kiln-no-cache", .jit = "cc"};
    run_jobs(jobs);
}

/* The generated C of model `i` (a .kiln file) after the -O2 pipeline, or NULL. */
static char *model_source(int i) {
    FILE *quiet = fopen("/dev/null", "w");
    Diag d;
    diag_init(&d, quiet);
    SrcFile *src = srcfile_read(models[i].path, &d);
    Graph *g = src ? parse_model(src, &d) : NULL;
    TensorList w = {0};
    PipelineOptions po = {.level = 2, .verify = true, .lower = true};
    Program *p = NULL;
    Source source = {0};
    char *text = NULL;
    if (g && (!models[i].weights || safetensors_read(models[i].weights, &w, &d) == 0) &&
        verify_graph(g, &d) == 0 && pipeline_run(g, &w, &po, &d) == 0 &&
        (p = program_lower(g, &w, &(LowerOptions){TARGET_C, true, true, NULL}, &d)) &&
        program_source(p, false, &source, &d) == 0 && !source.host.oom)
        text = strdup(source.host.s);
    source_free(&source);
    program_free(p);
    tensors_free(&w);
    graph_free(g);
    srcfile_free(src);
    if (quiet)
        fclose(quiet);
    return text;
}

/* Lowering and emitting alone (no Clang, which would keep the threads apart) on
 * every thread at once, again and again: each time the same C as on one thread. */
static char *lowered[2];

static void *lower_thread(void *arg) {
    Job *j = arg;
    pthread_barrier_wait(j->start);
    for (int k = 0; k < 40 && !j->failure[0]; k++) {
        int model = (j->model + k) % 2;
        char *text = model_source(model);
        if (!text || strcmp(text, lowered[model]) != 0)
            snprintf(j->failure, sizeof j->failure,
                     "%s: the generated C differs from a lowering on one thread", model_name(model));
        free(text);
    }
    return NULL;
}

static void test_hostile_lower_many_threads(void **state) {
    (void)state;
    for (int i = 0; i < 2; i++)
        assert_non_null(lowered[i] = model_source(i));
    Job jobs[N_THREADS] = {0};
    for (int t = 0; t < N_THREADS; t++)
        jobs[t] = (Job){.model = t, .body = lower_thread};
    run_jobs(jobs);
    for (int i = 0; i < 2; i++)
        free(lowered[i]);
}

/* Shape errors on every thread at once: each message must name its own thread's
 * types (they were formatted in 4 static buffers that all threads shared). */
static void *type_error_thread(void *arg) {
    Job *j = arg;
    char text[256], want[128];
    int n = j->model + 2;
    snprintf(text, sizeof text,
             "model m\ninput a : f32[%d, 3]\ninput b : f32[%d, 5]\nc = add(a, b)\noutput c\n", n, n);
    snprintf(want, sizeof want, "shapes f32[%d, 3] and f32[%d, 5]", n, n);
    pthread_barrier_wait(j->start);
    for (int k = 0; k < 200 && !j->failure[0]; k++) {
        kiln_error err = {.message = ""};
        kiln_module *m = kiln_jit(text, NULL, &err);
        if (m || !strstr(err.message, want))
            snprintf(j->failure, sizeof j->failure, "wanted '%s' in: %s", want, err.message);
        kiln_free(m);
    }
    return NULL;
}

static void test_hostile_type_messages_many_threads(void **state) {
    (void)state;
    Job jobs[N_THREADS] = {0};
    for (int t = 0; t < N_THREADS; t++)
        jobs[t] = (Job){.model = t, .body = type_error_thread};
    run_jobs(jobs);
}

/* Allocation failure armed on one thread fails only that thread's allocations. */
static void *parse_thread(void *arg) {
    Job *j = arg;
    pthread_barrier_wait(j->start);
    SrcFile *src = srcfile_from_string("<thread>", autograd_text);
    FILE *quiet = fopen("/dev/null", "w");
    Diag d;
    diag_init(&d, quiet);
    Graph *g = src ? parse_model(src, &d) : NULL;
    if (!g)
        snprintf(j->failure, sizeof j->failure, "parsing failed on a thread where no failure was armed");
    graph_free(g);
    srcfile_free(src);
    if (quiet)
        fclose(quiet);
    return NULL;
}

/* The failure disarmed even when the test fails. */
static int disarm(void **state) {
    (void)state;
    ir_fail_alloc_after(-1);
    return 0;
}

static void test_hostile_fail_alloc_is_per_thread(void **state) {
    (void)state;
    Job jobs[N_THREADS] = {0};
    for (int t = 0; t < N_THREADS; t++)
        jobs[t] = (Job){.body = parse_thread};
    ir_fail_alloc_after(0);
    kiln_error err = {.message = ""};
    kiln_module *m = kiln_jit(autograd_text, NULL, &err);
    run_jobs(jobs);
    ir_fail_alloc_after(-1);
    assert_null(m);
    assert_non_null(strstr(err.message, "out of memory"));
}

/* Files written by write_file_atomic on some threads while others create files:
 * every file gets 0666 less the umask (077 here), never more. Reading the umask
 * once meant setting it to 0 for a moment, when a file made elsewhere was 0666. */
static char umask_dir[64];

static void *umask_thread(void *arg) {
    Job *j = arg;
    char path[128];
    pthread_barrier_wait(j->start);
    FILE *quiet = fopen("/dev/null", "w");
    Diag d;
    diag_init(&d, quiet);
    for (int k = 0; k < 300 && !j->failure[0]; k++) {
        snprintf(path, sizeof path, "%s/%d-%d", umask_dir, j->model, k % 4);
        struct stat st;
        if (j->model % 2 == 0) {
            if (write_file_atomic(path, "x", 1, &d) != 0)
                snprintf(j->failure, sizeof j->failure, "cannot write %s", path);
        } else {
            unlink(path);
            int fd = open(path, O_WRONLY | O_CREAT, 0666);
            if (fd < 0 || fstat(fd, &st) != 0)
                snprintf(j->failure, sizeof j->failure, "cannot create %s", path);
            else if ((st.st_mode & 0777) != 0600)
                snprintf(j->failure, sizeof j->failure, "%s was created with mode %o under umask 077", path,
                         (unsigned)(st.st_mode & 0777));
            if (fd >= 0)
                close(fd);
        }
    }
    if (quiet)
        fclose(quiet);
    return NULL;
}

static void test_hostile_umask_many_threads(void **state) {
    (void)state;
    fresh_dir(umask_dir, sizeof umask_dir, "umask");
    mode_t old = umask(077);
    Job jobs[N_THREADS] = {0};
    for (int t = 0; t < N_THREADS; t++)
        jobs[t] = (Job){.model = t, .body = umask_thread};
    run_jobs(jobs);
    umask(old);
}

/* Removes a directory and the files in it. */
static void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[512];
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            if (e->d_type == DT_DIR)
                remove_tree(path);
            else
                unlink(path);
        }
    if (d)
        closedir(d);
    rmdir(dir);
}

/* The reference: every model compiled and run on this thread alone. */
static int setup(void **state) {
    (void)state;
    if (!mkdtemp(base_dir))
        return -1;
    snprintf(warm_cache, sizeof warm_cache, "%s/warm", base_dir);
    if (mkdir(warm_cache, 0700) != 0)
        return -1;
    for (int i = 0; i < N_THREADS; i++) {
        kiln_error err = {.message = ""};
        kiln_module *m = jit_model(i, warm_cache, NULL, &err);
        if (!m || run_module(m, &reference[i], &err) != 0) {
            printf("%s: %s\n", model_name(i), err.message);
            kiln_free(m);
            return -1;
        }
        kiln_free(m);
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    for (int i = 0; i < N_THREADS; i++)
        free(reference[i].bytes);
    remove_tree(base_dir);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hostile_lower_many_threads),
        cmocka_unit_test(test_hostile_jit_many_threads),
        cmocka_unit_test(test_hostile_jit_same_model_many_threads),
        cmocka_unit_test(test_hostile_jit_warm_cache_many_threads),
        cmocka_unit_test(test_hostile_run_instances_many_threads),
        cmocka_unit_test(test_hostile_jit_cc_many_threads),
        cmocka_unit_test(test_hostile_run_cuda_emulated_instances_many_threads),
        cmocka_unit_test(test_hostile_type_messages_many_threads),
        cmocka_unit_test_teardown(test_hostile_fail_alloc_is_per_thread, disarm),
        cmocka_unit_test(test_hostile_umask_many_threads),
    };
    return cmocka_run_group_tests_name("threads", tests, setup, teardown);
}
