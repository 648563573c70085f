/* libkiln's public interface (kiln/kiln.h): JIT, loading, running, and its errors.
 *
 *   - kiln_jit on the language spec's autograd example, gradients included:
 *     with x all ones, loss = 40.
 *   - kiln_jit_file on examples/small_cnn.kiln and kiln_load of the .so that
 *     `kiln compile` makes of the same file give the same outputs, bit for bit.
 *   - kiln_options.cpu builds for another CPU (x86-64-v2 runs here too); an unknown
 *     one is an error naming it and the valid ones.
 *   - Errors come back as NULL and a clear message, never a crash: model text that
 *     does not parse (the message gives the position), a shared object that is not
 *     a kiln model, one whose kiln_model reports ABI version 2, a missing file.
 *   - A model of the contract's version 1 (tests/abi/v1_model.c) loads and runs.
 *   - A training step's params, read and written between runs (C and emulated
 *     CUDA), and the errors of kiln_read_param and kiln_write_param.
 *   - Each error has its kind: the input's (a bad model, an unknown setting), out
 *     of memory (an allocation failed, ir_fail_alloc_after), or kiln's own: a
 *     failed internal assertion (provoked with ir_fail_assert_after) makes kiln_jit
 *     fail, naming the file, line and condition, and the process goes on, as it
 *     does when the C compiler rejects the generated code (kiln_options.cc "false").
 *   - The settings arrive through kiln_options: kiln_options_from_env reads the
 *     environment's defaults, and an option's unknown value is an error naming
 *     the valid ones.
 *
 *   - A run-time gather index outside its dim (either sign, int64's extremes) makes
 *     kiln_run fail with a message naming the op, and the instance runs on.
 *   - A warm kiln_jit_file comes from the model cache (the weights blob as the
 *     lowering left it, beside the object file): the same outputs as the cold one,
 *     bit for bit; with its entry or the object's corrupt, the model is compiled
 *     again, the same, and the entries rewritten. Its key is what the model is read
 *     from: a weights file or an ONNX model's external data rewritten with other
 *     values gives the new values, and a model with external data has no entry.
 *
 * The JIT compiles through the cache in $KILN_CACHE_DIR (CTest points it into the
 * build tree). Usage: test_libkiln KILN NOT_A_MODEL.so WRONG_ABI.so V1_MODEL.so
 * COMM_MODEL.so CLAIMS_RUN_ERROR.so, with the kiln command (to compile the small
 * CNN) and the shared objects that CMake builds from tests/abi/not_a_model.c,
 * wrong_abi.c, v1_model.c and comm_model.c (twice). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "frontend/frontend.h"
#include "kiln/kiln.h"

#ifndef KILN_SOURCE_DIR
#define KILN_SOURCE_DIR "."
#endif

static const char *kiln_command, *not_a_model_so, *wrong_abi_so, *v1_model_so, *comm_model_so,
    *claims_run_error_so;

/* The spec's example. */
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

static void test_jit_autograd(void **state) {
    (void)state;
    kiln_error err = {.message = ""};
    kiln_module *m = kiln_jit(autograd_text, NULL, &err);
    if (!m)
        fail_msg("kiln_jit: %s", err.message);
    const kiln_model_def *def = kiln_def(m);
    assert_int_equal(def->n_inputs, 1);
    assert_int_equal(def->n_outputs, 4);
    assert_string_equal(def->inputs[0].name, "x");
    assert_string_equal(def->outputs[0].name, "loss");
    assert_string_equal(def->outputs[3].name, "g3");
    assert_int_equal(def->outputs[0].rank, 0);
    float x[4] = {1, 1, 1, 1}, loss = 0, g[3] = {0};
    const void *inputs[] = {x};
    void *outputs[] = {&loss, &g[0], &g[1], &g[2]};
    int rc = kiln_run(m, inputs, outputs, &err);
    kiln_free(m);
    if (rc)
        fail_msg("kiln_run: %s", err.message);
    assert_float_equal(loss, 40.0f, 1e-4);
    assert_float_equal(g[0], 28.0f, 1e-4);
    assert_float_equal(g[1], 8.0f, 1e-4);
    assert_float_equal(g[2], 10.0f, 1e-4);
}

static int64_t numel(const kiln_tensor_info *t) {
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++)
        n *= t->shape[i];
    return n;
}

/* Runs m once on in; a new buffer of output 0, or NULL. */
static float *run_once(kiln_module *m, const Tensor *in) {
    float *out = calloc((size_t)numel(&kiln_def(m)->outputs[0]) + 1, sizeof *out);
    const void *inputs[] = {in->data};
    void *outputs[] = {out};
    kiln_error err = {.message = ""};
    if (out && kiln_run(m, inputs, outputs, &err) != 0) {
        printf("kiln_run: %s\n", err.message);
        free(out);
        return NULL;
    }
    return out;
}

static void test_jit_matches_load(void **state) {
    (void)state;
    char dir[] = "/tmp/test_libkiln-XXXXXX", so[64], cmd[8192];
    assert_non_null(mkdtemp(dir));
    snprintf(so, sizeof so, "%s/small_cnn.so", dir);
    snprintf(cmd, sizeof cmd, "'%s' compile '%s/examples/small_cnn.kiln' -o '%s'", kiln_command,
             KILN_SOURCE_DIR, so);
    int status = system(cmd);
    kiln_error err = {.message = ""};
    kiln_module *loaded = status == 0 ? kiln_load(so, &err) : NULL;
    unlink(so);
    rmdir(dir);
    if (status != 0)
        fail_msg("'%s' failed (status %d)", cmd, status);
    if (!loaded)
        fail_msg("kiln_load: %s", err.message);
    kiln_module *jitted = kiln_jit_file(KILN_SOURCE_DIR "/examples/small_cnn.kiln", NULL, &err);
    if (!jitted) {
        kiln_free(loaded);
        fail_msg("kiln_jit_file: %s", err.message);
    }
    Diag d;
    diag_init(&d, stdout);
    Tensor *in = NULL;
    float *a = NULL, *b = NULL;
    const kiln_model_def *ld = kiln_def(loaded), *jd = kiln_def(jitted);
    int64_t n = numel(&ld->outputs[0]);
    bool same_sig = ld->n_inputs == 1 && jd->n_inputs == 1 && ld->n_outputs == 1 && jd->n_outputs == 1 &&
                    n == 10 && numel(&jd->outputs[0]) == n;
    if (same_sig && npy_read(KILN_SOURCE_DIR "/examples/small_cnn_input.npy", &in, &d) == 0) {
        a = run_once(jitted, in);
        b = run_once(loaded, in);
    }
    bool same = a && b && memcmp(a, b, (size_t)n * sizeof *a) == 0;
    tensor_free(in);
    free(a);
    free(b);
    kiln_free(jitted);
    kiln_free(loaded);
    assert_true(same_sig);
    assert_true(same);
}

static void test_jit_cpu(void **state) {
    (void)state;
    kiln_error err = {.message = ""};
    kiln_options opts = {.opt_level = 2, .cpu = "x86-64-v2"};
    kiln_module *m = kiln_jit(autograd_text, &opts, &err);
    if (!m)
        fail_msg("kiln_jit for x86-64-v2: %s", err.message);
    float x[4] = {1, 1, 1, 1}, loss = 0, g[3];
    assert_int_equal(kiln_run(m, (const void *const[]){x}, (void *const[]){&loss, &g[0], &g[1], &g[2]}, &err),
                     0);
    assert_float_equal(loss, 40, 1e-4);
    kiln_free(m);
    opts.cpu = "pentium";
    assert_null(kiln_jit(autograd_text, &opts, &err));
    printf("message: %s\n", err.message);
    assert_non_null(strstr(err.message, "unknown cpu 'pentium' (native, x86-64, x86-64-v2"));
}

static void test_jit_bad_text(void **state) {
    (void)state;
    kiln_error err = {.message = ""};
    kiln_module *m = kiln_jit("input x : f32[2]\ny = relu(x, x)\noutput y\n", NULL, &err);
    assert_null(m);
    printf("message: %s\n", err.message);
    assert_non_null(strstr(err.message, ":2:5: error: relu takes 1 input, got 2"));
}

/* kiln_jit_file on an ONNX model exported from PyTorch (tests/onnx/gen_models.py)
 * gives PyTorch's output; on a model with unsupported ops, the importer's message. */
static void test_jit_onnx(void **state) {
    (void)state;
    kiln_error err = {.message = ""};
    kiln_module *m = kiln_jit_file(KILN_SOURCE_DIR "/tests/onnx/models/tiny_cnn_opset13.onnx", NULL, &err);
    if (!m)
        fail_msg("kiln_jit_file: %s", err.message);
    Diag d;
    diag_init(&d, stdout);
    Tensor *in = NULL, *want = NULL;
    float *got = NULL;
    if (npy_read(KILN_SOURCE_DIR "/tests/onnx/models/tiny_cnn_opset13_input.npy", &in, &d) == 0 &&
        npy_read(KILN_SOURCE_DIR "/tests/onnx/models/tiny_cnn_opset13_expected.npy", &want, &d) == 0)
        got = run_once(m, in);
    bool close = got && want && numel(&kiln_def(m)->outputs[0]) == type_numel(&want->type);
    for (int64_t i = 0; close && i < type_numel(&want->type); i++)
        close = fabsf(got[i] - want->data[i]) <= 1e-4f + 1e-4f * fabsf(want->data[i]);
    free(got);
    tensor_free(in);
    tensor_free(want);
    kiln_free(m);
    assert_true(close);
    m = kiln_jit_file(KILN_SOURCE_DIR "/tests/onnx/malformed/unsupported.onnx", NULL, &err);
    printf("message: %s\n", err.message);
    assert_null(m);
    assert_non_null(strstr(err.message, "the model uses ops kiln cannot import"));
}

/* kiln_load refuses path with a message containing `want`. */
static void expect_load_error(const char *path, const char *want) {
    kiln_error err = {.message = ""};
    kiln_module *m = kiln_load(path, &err);
    printf("message: %s\n", err.message);
    kiln_free(m);
    assert_null(m);
    assert_non_null(strstr(err.message, path));
    assert_non_null(strstr(err.message, want));
}

static void test_load_not_a_model(void **state) {
    (void)state;
    expect_load_error(not_a_model_so, "is not a kiln model");
}

static void test_load_wrong_abi(void **state) {
    (void)state;
    expect_load_error(wrong_abi_so, "ABI version 2");
}

static void test_load_missing(void **state) {
    (void)state;
    expect_load_error("/nonexistent/model.so", "No such file");
}

/* A model of contract version 1 still loads and runs; it has no params to read. */
static void test_load_version_1(void **state) {
    (void)state;
    kiln_error err = {.message = ""};
    kiln_module *m = kiln_load(v1_model_so, &err);
    if (!m)
        fail_msg("kiln_load: %s", err.message);
    assert_int_equal(kiln_def(m)->extensions, 0);
    float x = 3, y = 0;
    const void *inputs[] = {&x};
    void *outputs[] = {&y};
    assert_int_equal(kiln_run(m, inputs, outputs, &err), 0);
    assert_true(y == 6);
    assert_int_not_equal(kiln_read_param(m, "w", &x, sizeof x, &err), 0);
    assert_non_null(
        strstr(err.message, "'version_1' was compiled by a kiln that did not describe its params"));
    assert_int_not_equal(kiln_set_comm(m, NULL, &err), 0);
    assert_non_null(strstr(err.message, "'version_1' was compiled by a kiln without collectives"));
    kiln_free(m);
}

/* A model with a symbolic dim: its description (the dim's name and bound, shape
 * entries -1), a run at each size from 1 to the bound that writes the rows of that
 * size and no more, kiln_run at the bound, and a size outside them refused by name. */
static const char sym_text[] = "model rows\n"
                               "dim B <= 4\n"
                               "input x : f32[B, 3]\n"
                               "param w : f32[3] = fill(2.0)\n"
                               "y = mul(x, w)\n"
                               "s = sum(y, axes=[1])\n"
                               "output s\n";

static void test_symbolic_dim(void **state) {
    (void)state;
    kiln_error err = {.message = ""};
    kiln_module *m = kiln_jit(sym_text, NULL, &err);
    if (!m)
        fail_msg("kiln_jit: %s", err.message);
    const kiln_model_def *def = kiln_def(m);
    assert_true(def->extensions & KILN_EXT_SYM);
    assert_int_equal(def->n_sym, 1);
    assert_string_equal(def->sym_names[0], "B");
    assert_int_equal(def->sym_bounds[0], 4);
    assert_int_equal(def->inputs[0].shape[0], -1);
    assert_int_equal(def->inputs[0].shape[1], 3);
    assert_int_equal(def->outputs[0].rank, 1);
    assert_int_equal(def->outputs[0].shape[0], -1);
    float x[12], s[5];
    for (int i = 0; i < 12; i++)
        x[i] = (float)i;
    for (int64_t n = 1; n <= 4; n++) {
        for (int i = 0; i < 5; i++)
            s[i] = -1;
        assert_int_equal(kiln_run_sym(m, &n, (const void *const[]){x}, (void *const[]){s}, &err), 0);
        for (int i = 0; i < 5; i++)
            assert_float_equal(s[i], i < n ? 2 * (9 * i + 3) : -1, 1e-4);
    }
    s[3] = -1;
    assert_int_equal(kiln_run(m, (const void *const[]){x}, (void *const[]){s}, &err), 0);
    assert_float_equal(s[3], 60, 1e-4);
    for (int64_t n = 0; n <= 5; n += 5) {
        assert_int_not_equal(kiln_run_sym(m, &n, (const void *const[]){x}, (void *const[]){s}, &err), 0);
        printf("message: %s\n", err.message);
        assert_non_null(strstr(err.message, "the model 'rows' runs at B from 1 to 4, not"));
    }
    kiln_free(m);
}

/* A step that updates its params: each run adds x to w and counts itself in n. */
static const char step_text[] = "model step\n"
                                "input x : f32[2]\n"
                                "param w : f32[2] = fill(1.0)\n"
                                "param n : f32[] = zeros\n"
                                "const one : f32[] = 1\n"
                                "y = add(x, w)\n"
                                "n1 = add(n, one)\n"
                                "update w = y\n"
                                "update n = n1\n"
                                "output y\n";

static void test_params(void **state) {
    (void)state;
    for (int cuda = 0; cuda < 2; cuda++) {
        kiln_options o = kiln_options_from_env();
        o.target = cuda ? "cuda" : "c";
        o.cuda = "emulate";
        kiln_error err = {.message = ""};
        kiln_module *m = kiln_jit(step_text, &o, &err);
        if (!m)
            fail_msg("kiln_jit: %s", err.message);
        const kiln_model_def *def = kiln_def(m);
        assert_true(def->extensions & KILN_EXT_PARAMS);
        assert_int_equal(def->n_params, 2);
        assert_string_equal(def->params[0].name, "w");
        assert_string_equal(def->params[1].name, "n");
        float x[2] = {1, 2}, y[2], w[2], n = -1;
        const void *inputs[] = {x};
        void *outputs[] = {y};
        assert_int_equal(kiln_run(m, inputs, outputs, &err), 0);
        assert_int_equal(kiln_read_param(m, "w", w, sizeof w, &err), 0);
        assert_int_equal(kiln_read_param(m, "n", &n, sizeof n, &err), 0);
        assert_true(w[0] == 2 && w[1] == 3 && n == 1);
        const float w2[2] = {10, 20};
        assert_int_equal(kiln_write_param(m, "w", w2, sizeof w2, &err), 0);
        assert_int_equal(kiln_run(m, inputs, outputs, &err), 0);
        assert_true(y[0] == 11 && y[1] == 22);
        assert_int_equal(kiln_read_param(m, "n", &n, sizeof n, &err), 0);
        assert_true(n == 2);

        assert_int_not_equal(kiln_read_param(m, "x", w, sizeof w, &err), 0);
        assert_non_null(strstr(err.message, "the model 'step' has no param 'x' that its runs update"));
        assert_int_not_equal(kiln_write_param(m, "w", w, sizeof w[0], &err), 0);
        assert_non_null(strstr(err.message, "the param 'w' of 'step' is 8 bytes, but the buffer is 4"));
        assert_int_not_equal(kiln_read_param(m, "w", NULL, sizeof w, &err), 0);
        assert_non_null(strstr(err.message, "the buffer for 'w' is NULL"));
        assert_int_not_equal(kiln_read_param(NULL, "w", w, sizeof w, &err), 0);
        assert_int_not_equal(kiln_read_param(m, NULL, w, sizeof w, &err), 0);
        assert_int_equal(def->read_param(NULL, 2, w), 1); /* out of range: the instance is not touched */
        assert_int_equal(def->write_param(NULL, -1, w), 1);
        kiln_free(m);
    }
}

/* A communicator of two processes whose other one holds `other`, failing when asked. */
typedef struct {
    float other[2];
    bool fail;
} FakeComm;

static int fake_allreduce_sum(void *ctx, const void *src, void *dst, int64_t count, int32_t dtype) {
    FakeComm *c = ctx;
    if (c->fail || dtype != KILN_F32 || count != 2)
        return 1;
    for (int i = 0; i < 2; i++)
        ((float *)dst)[i] = ((const float *)src)[i] + c->other[i];
    return 0;
}

static const char *fake_error(void *ctx) {
    return ((FakeComm *)ctx)->fail ? "the network is down" : NULL;
}

/* allreduce through a communicator kiln_set_comm hands the instance, on the C target
   and the CUDA target (emulated; its runtime does the allreduce on the host): the sum
   and the mean over the processes, of an input into outputs and of the workspace in
   place; the communicator's failure in kiln_run's message with the op's place; a
   malformed one refused, the instance before it kept; NULL, one process again. */
static void test_comm(void **state) {
    (void)state;
    for (int cuda = 0; cuda < 2; cuda++) {
        kiln_options o = kiln_options_from_env();
        o.target = cuda ? "cuda" : "c";
        o.cuda = "emulate";
        kiln_error err = {.message = ""};
        kiln_module *m = kiln_jit("model dp\ninput x : f32[2]\ny = allreduce(x)\nm = allreduce(x, op=mean)\n"
                                  "r = relu(x)\ns = allreduce(r)\nq = add(s, s)\noutput y, m, q\n",
                                  &o, &err);
        if (!m)
            fail_msg("kiln_jit: %s", err.message);
        assert_true(kiln_def(m)->extensions & KILN_EXT_COMM && kiln_def(m)->extensions & KILN_EXT_RUN_ERROR);
        FakeComm fake = {{10, 21}, false};
        const kiln_comm comm = {0, 2, &fake, fake_allreduce_sum, fake_error};
        assert_int_equal(kiln_set_comm(m, &comm, &err), 0);
        float x[2] = {1, 2}, y[2], mean[2], q[2];
        const void *inputs[] = {x};
        void *outputs[] = {y, mean, q};
        assert_int_equal(kiln_run(m, inputs, outputs, &err), 0);
        assert_true(y[0] == 11 && y[1] == 23 && mean[0] == 5.5f && mean[1] == 11.5f);
        assert_true(q[0] == 22 && q[1] == 46);

        fake.fail = true;
        assert_int_not_equal(kiln_run(m, inputs, outputs, &err), 0);
        assert_non_null(strstr(err.message, "the model 'dp' failed to run: allreduce '"));
        assert_non_null(strstr(err.message, "' (<model>:")); /* whichever allreduce failed last */
        assert_non_null(strstr(err.message, "): the communicator failed: the network is down"));

        const kiln_comm malformed = {0, 2, &fake, NULL, NULL};
        assert_int_not_equal(kiln_set_comm(m, &malformed, &err), 0);
        assert_non_null(
            strstr(err.message, "the communicator is malformed (rank 0 of 2 processes, no allreduce_sum)"));
        assert_int_not_equal(kiln_run(m, inputs, outputs, &err), 0); /* still through the failing one */

        assert_int_equal(kiln_set_comm(m, NULL, &err), 0);
        assert_int_equal(kiln_run(m, inputs, outputs, &err), 0);
        assert_true(y[0] == 1 && y[1] == 2 && mean[0] == 1 && mean[1] == 2 && q[0] == 2 && q[1] == 4);
        kiln_free(m);
    }
    kiln_error err = {.message = ""};
    assert_int_not_equal(kiln_set_comm(NULL, NULL, &err), 0);
}

static const char relu_text[] = "input x : f32[2]\ny = relu(x)\noutput y\n";

static void expect_error(kiln_module *m, const kiln_error *err, kiln_error_kind kind, const char *want) {
    printf("message: %s\n", err->message);
    assert_null(m);
    assert_int_equal(err->kind, kind);
    if (!strstr(err->message, want))
        fail_msg("'%s' does not say '%s'", err->message, want);
}

static void test_error_kinds(void **state) {
    (void)state;
    kiln_error err = {.message = ""};
    expect_error(kiln_jit("input x : f32[2]\ny = relu(x, x)\noutput y\n", NULL, &err), &err, KILN_ERROR_USER,
                 "relu takes 1 input");

    /* compiled every time (a warm JIT from the cache has none of this to fail) */
    kiln_options uncached = kiln_options_from_env();
    uncached.opt_level = 2;
    uncached.cache_dir = "/proc/kiln-no-cache";
    ir_fail_alloc_after(0);
    kiln_module *m = kiln_jit(relu_text, &uncached, &err);
    ir_fail_alloc_after(-1);
    expect_error(m, &err, KILN_ERROR_NO_MEMORY, "out of memory");

    /* the first assertion checked fails, and every later one holds: the compile
       goes on and fails at its end */
    ir_fail_assert_after(0);
    m = kiln_jit(relu_text, &uncached, &err);
    ir_fail_assert_after(-1);
    expect_error(m, &err, KILN_ERROR_INTERNAL, "internal error: ");
    assert_non_null(strstr(err.message, ".c:"));
    assert_non_null(strstr(err.message, "assertion '"));
    assert_non_null(strstr(err.message, "' failed (a bug in kiln)"));
    /* ... further in, too */
    ir_fail_assert_after(20);
    m = kiln_jit(relu_text, &uncached, &err);
    ir_fail_assert_after(-1);
    expect_error(m, &err, KILN_ERROR_INTERNAL, "(a bug in kiln)");

    /* the failure was reported once: the next compile succeeds */
    m = kiln_jit(relu_text, &uncached, &err);
    if (!m)
        fail_msg("kiln_jit after an internal error: %s", err.message);
    kiln_free(m);

    /* a compiler that rejects the generated code: kiln's fault as far as it knows */
    kiln_options o = {.opt_level = 2, .jit = "cc", .cc = "false", .cache_dir = "/proc/kiln-no-cache"};
    expect_error(kiln_jit(relu_text, &o, &err), &err, KILN_ERROR_INTERNAL,
                 "the compiler 'false' failed on the generated code (a bug in kiln");
}

static void test_settings(void **state) {
    (void)state;
    kiln_options env = kiln_options_from_env();
    const char *cache = getenv("KILN_CACHE_DIR");
    assert_non_null(cache); /* CTest sets it */
    assert_string_equal(env.cache_dir, cache);
    assert_true(env.target == NULL && env.cpu == NULL && env.weights == NULL);

    kiln_error err = {.message = ""};
    static const struct {
        kiln_options options;
        const char *want;
    } bad[] = {
        {{.target = "tpu"}, "unknown target 'tpu' (c or cuda)"},
        {{.jit = "gcc"}, "unknown jit 'gcc' (clang or cc)"},
        {{.blas = "maybe"}, "unknown blas 'maybe' (on or off)"},
        {{.cuda = "cpu"}, "unknown cuda 'cpu' (gpu or emulate)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        expect_error(kiln_jit(relu_text, &bad[i].options, &err), &err, KILN_ERROR_USER, bad[i].want);

    /* every setting spelt out: the system compiler, no OpenBLAS, no cache */
    kiln_options o = {.target = "c",
                      .opt_level = 1,
                      .jit = "cc",
                      .cc = "cc",
                      .cxx = "c++",
                      .blas = "off",
                      .cuda = "gpu",
                      .cpu = "x86-64",
                      .cache_dir = "/proc/kiln-no-cache"};
    kiln_module *m = kiln_jit(relu_text, &o, &err);
    if (!m)
        fail_msg("kiln_jit with every setting given: %s", err.message);
    float x[2] = {-1, 2}, y[2] = {0};
    assert_int_equal(kiln_run(m, (const void *const[]){x}, (void *const[]){y}, &err), 0);
    assert_true(y[0] == 0 && y[1] == 2);
    kiln_free(m);
}

/* The small CNN's outputs from kiln_jit_file with the cache in dir. */
static float *small_cnn_outputs(const char *dir, const Tensor *in) {
    kiln_options o = kiln_options_from_env();
    o.cache_dir = dir;
    kiln_error err = {.message = ""};
    kiln_module *m = kiln_jit_file(KILN_SOURCE_DIR "/examples/small_cnn.kiln", &o, &err);
    if (!m)
        fail_msg("kiln_jit_file: %s", err.message);
    float *out = run_once(m, in);
    kiln_free(m);
    return out;
}

/* Overwrites byte 200 of every file in dir whose name ends in suffix. */
static void corrupt_entries(const char *dir, const char *suffix) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "for f in '%s'/*%s; do printf 'X' | dd of=\"$f\" bs=1 seek=200 conv=notrunc 2>/dev/null; done",
             dir, suffix);
    assert_int_equal(system(cmd), 0);
}

static void test_model_cache(void **state) {
    (void)state;
    char dir[] = "/tmp/test_libkiln_cache-XXXXXX", cmd[256];
    assert_non_null(mkdtemp(dir));
    Diag d;
    diag_init(&d, stdout);
    Tensor *in = NULL;
    assert_int_equal(npy_read(KILN_SOURCE_DIR "/examples/small_cnn_input.npy", &in, &d), 0);
    float *cold = small_cnn_outputs(dir, in), *warm = small_cnn_outputs(dir, in);
    snprintf(cmd, sizeof cmd, "ls '%s'/*.m '%s'/*.o > /dev/null", dir, dir);
    bool entries = system(cmd) == 0;
    corrupt_entries(dir, ".m");
    float *healed_model = small_cnn_outputs(dir, in);
    corrupt_entries(dir, ".o");
    float *healed_object = small_cnn_outputs(dir, in), *again = small_cnn_outputs(dir, in);
    bool same = cold && warm && healed_model && healed_object && again;
    for (int i = 0; same && i < 10; i++)
        same = warm[i] == cold[i] && healed_model[i] == cold[i] && healed_object[i] == cold[i] &&
               again[i] == cold[i];
    free(cold), free(warm), free(healed_model), free(healed_object), free(again);
    tensor_free(in);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    assert_true(entries);
    assert_true(same);
}

/* Replaces path's bytes with data[0..n) floats. */
static void write_floats(const char *path, const float *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, sizeof *data, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* The one output of the model at path, on input x, through the cache in cache_dir;
 * opts' weights files (may be NULL) are read too. */
static void jit_output(const char *path, const char *cache_dir, const char *weights, const float *x,
                       float *y) {
    kiln_options o = kiln_options_from_env();
    o.cache_dir = cache_dir;
    o.weights = weights ? (const char *const[]){weights} : NULL;
    o.n_weights = weights != NULL;
    kiln_error err = {.message = ""};
    kiln_module *m = kiln_jit_file(path, &o, &err);
    if (!m)
        fail_msg("kiln_jit_file '%s': %s", path, err.message);
    assert_int_equal(kiln_run(m, (const void *const[]){x}, (void *const[]){y}, &err), 0);
    kiln_free(m);
}

/* The model cache is keyed by what the model is read from: a weights file or an ONNX
 * model's external data rewritten with other values is compiled again, never taken
 * from the entry of the old values; a model with external data has no model entry. */
static void test_model_cache_inputs(void **state) {
    (void)state;
    char dir[] = "/tmp/test_libkiln_inputs-XXXXXX", path[128], weights[128], onnx[128], bin[128], cache[128],
         cmd[512];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/scale.kiln", dir);
    snprintf(weights, sizeof weights, "%s/scale.safetensors", dir);
    snprintf(onnx, sizeof onnx, "%s/external_ok.onnx", dir);
    snprintf(bin, sizeof bin, "%s/external_ok.bin", dir);
    snprintf(cache, sizeof cache, "%s/cache", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("input x : f32[2]\nparam w : f32[2]\ny = mul(x, w)\noutput y\n", f);
    assert_int_equal(fclose(f), 0);
    Diag d;
    diag_init(&d, stdout);
    float x[6] = {1, 1, 1, 1, 1, 1}, y[6], w[2][2] = {{2, 3}, {5, 7}};
    for (int i = 0; i < 2; i++) {
        TensorList l = {0};
        Tensor *t = tensor_new(&(Type){.rank = 1, .dims = {2}});
        assert_non_null(t);
        memcpy(t->data, w[i], sizeof w[i]);
        assert_int_equal(tensors_add(&l, "w", t), 0);
        assert_int_equal(safetensors_write(weights, &l, &d), 0);
        tensors_free(&l);
        for (int round = 0; round < 2; round++) { /* cold, then warm */
            jit_output(path, cache, weights, x, y);
            assert_true(y[0] == w[i][0] && y[1] == w[i][1]);
        }
    }
    snprintf(cmd, sizeof cmd, "cp '%s/tests/onnx/malformed/external_ok.onnx' '%s'", KILN_SOURCE_DIR, onnx);
    assert_int_equal(system(cmd), 0);
    for (int i = 0; i < 2; i++) {
        float data[6];
        for (int k = 0; k < 6; k++)
            data[k] = (float)(k * (i + 1));
        write_floats(bin, data, 6);
        for (int round = 0; round < 2; round++) {
            jit_output(onnx, cache, NULL, x, y);
            for (int k = 0; k < 6; k++)
                assert_true(y[k] == data[k] + 1);
        }
    }
    snprintf(cmd, sizeof cmd, "test $(ls '%s'/*.m | wc -l) = 2", cache);
    int model_entries = system(cmd);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(model_entries, 0);
}

/* NULL where the API takes a path, text, module or buffer is an error, not a crash
 * (kiln_load(NULL) used to segfault); a NULL err is allowed too. */
static void test_hostile_load_null(void **state) {
    (void)state;
    kiln_error err = {.message = ""};
    assert_null(kiln_load(NULL, &err));
    assert_non_null(strstr(err.message, "kiln_load: the path is NULL"));
    assert_null(kiln_load(NULL, NULL));
    assert_null(kiln_jit(NULL, NULL, &err));
    assert_non_null(strstr(err.message, "kiln_jit: the model text is NULL"));
    assert_null(kiln_jit_file(NULL, NULL, &err));
    assert_non_null(strstr(err.message, "kiln_jit_file: the path is NULL"));
    assert_int_not_equal(kiln_run(NULL, NULL, NULL, &err), 0);
    assert_null(kiln_def(NULL));
    kiln_free(NULL);

    kiln_module *m = kiln_jit("input x : f32[2]\ny = relu(x)\noutput y\n", NULL, &err);
    if (!m)
        fail_msg("kiln_jit: %s", err.message);
    float x[2] = {-1, 2}, y[2] = {0};
    const void *inputs[] = {x}, *no_input[] = {NULL};
    void *outputs[] = {y}, *no_output[] = {NULL};
    assert_int_not_equal(kiln_run(m, NULL, outputs, &err), 0);
    assert_non_null(strstr(err.message, "the inputs array is NULL"));
    assert_int_not_equal(kiln_run(m, inputs, NULL, &err), 0);
    assert_non_null(strstr(err.message, "the outputs array is NULL"));
    assert_int_not_equal(kiln_run(m, no_input, outputs, &err), 0);
    assert_non_null(strstr(err.message, "input 0 ('x') is NULL"));
    assert_int_not_equal(kiln_run(m, inputs, no_output, &err), 0);
    assert_non_null(strstr(err.message, "output 0 ('y') is NULL"));
    assert_int_equal(kiln_run(m, inputs, outputs, NULL), 0);
    assert_true(y[0] == 0 && y[1] == 2);
    kiln_free(m);
}

/* A model with collectives made before KILN_EXT_RUN_ERROR: a failed run names only
   its check's number, and the communicator's message with it. A model that claims
   the extension without its function is refused as malformed. */
static void test_comm_without_run_error(void **state) {
    (void)state;
    kiln_error err = {.message = ""};
    kiln_module *m = kiln_load(comm_model_so, &err);
    if (!m)
        fail_msg("kiln_load: %s", err.message);
    FakeComm fake = {{10, 21}, false};
    const kiln_comm comm = {0, 2, &fake, fake_allreduce_sum, fake_error};
    assert_int_equal(kiln_set_comm(m, &comm, &err), 0);
    float x[2] = {1, 2}, y[2];
    const void *inputs[] = {x};
    void *outputs[] = {y};
    assert_int_equal(kiln_run(m, inputs, outputs, &err), 0);
    assert_true(y[0] == 11 && y[1] == 23);
    fake.fail = true;
    assert_int_not_equal(kiln_run(m, inputs, outputs, &err), 0);
    assert_string_equal(
        err.message,
        "the model 'comm_model' failed to run (its run-time check 3 failed): the network is down");
    kiln_free(m);
    expect_load_error(claims_run_error_so, "is a malformed kiln model (its kiln_model_def lacks a function");
}

/* A run-time index outside its dim fails the run, through kiln_run's return code and
 * a message naming the op and its result, and the next run with valid indices
 * succeeds; a negative index counts from the end, down to -dim. */
static void test_index_out_of_range(void **state) {
    (void)state;
    kiln_error err = {.message = ""};
    kiln_module *m = kiln_jit("model lookup\ninput ids : i64[2]\nconst table : f32[3] = [10, 20, 30]\n"
                              "e = gather(table, ids)\noutput e\n",
                              NULL, &err);
    if (!m)
        fail_msg("kiln_jit: %s", err.message);
    int64_t ids[2] = {2, -3};
    float e[2] = {0, 0};
    const void *inputs[] = {ids};
    void *outputs[] = {e};
    assert_int_equal(kiln_run(m, inputs, outputs, &err), 0);
    assert_true(e[0] == 30 && e[1] == 10);
    const int64_t bad[] = {3, -4, INT64_MAX, INT64_MIN};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ids[1] = bad[i];
        err.message[0] = 0;
        assert_int_not_equal(kiln_run(m, inputs, outputs, &err), 0);
        printf("index %lld: %s\n", (long long)bad[i], err.message);
        assert_non_null(strstr(err.message, "the model 'lookup' failed to run"));
        assert_non_null(strstr(err.message, "gather 'e'"));
        assert_non_null(strstr(err.message, "out of range"));
    }
    ids[1] = 0;
    assert_int_equal(kiln_run(m, inputs, outputs, &err), 0);
    assert_true(e[0] == 30 && e[1] == 10);
    kiln_free(m);
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: test_libkiln KILN NOT_A_MODEL.so WRONG_ABI.so V1_MODEL.so COMM_MODEL.so "
                        "CLAIMS_RUN_ERROR.so\n");
        return 1;
    }
    kiln_command = argv[1];
    not_a_model_so = argv[2];
    wrong_abi_so = argv[3];
    v1_model_so = argv[4];
    comm_model_so = argv[5];
    claims_run_error_so = argv[6];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_kinds),
        cmocka_unit_test(test_settings),
        cmocka_unit_test(test_model_cache),
        cmocka_unit_test(test_model_cache_inputs),
        cmocka_unit_test(test_jit_autograd),
        cmocka_unit_test(test_jit_matches_load),
        cmocka_unit_test(test_jit_bad_text),
        cmocka_unit_test(test_load_not_a_model),
        cmocka_unit_test(test_jit_onnx),
        cmocka_unit_test(test_load_wrong_abi),
        cmocka_unit_test(test_load_missing),
        cmocka_unit_test(test_jit_cpu),
        cmocka_unit_test(test_hostile_load_null),
        cmocka_unit_test(test_load_version_1),
        cmocka_unit_test(test_params),
        cmocka_unit_test(test_symbolic_dim),
        cmocka_unit_test(test_comm),
        cmocka_unit_test(test_comm_without_run_error),
        cmocka_unit_test(test_index_out_of_range),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
