/* The allocation-failure sweep: every allocation of a whole job fails in turn.
 *
 * A job takes one model (the text below, an ONNX file, a battery of tests/ref with
 * its safetensors weights) through everything kiln does before handing C to a
 * compiler: parsing (or importing), the verifier, the -O2 pass pipeline (autodiff
 * included: the text model has a grad and an update; once with --check's
 * interpreter runs after every pass), lowering for the C and CUDA
 * targets with the memory plan, their source (and the C split into kernels, as the
 * in-process JIT compiles it), and a training step in the
 * reference interpreter. For N = 0, 1, 2, ... the N-th allocation and every one
 * after it fail (ir_fail_alloc_after), until the job succeeds. Each failing N must
 * come back as an error with an "out of memory" diagnostic, of kind out of memory
 * (DIAG_NO_MEMORY, which the driver's exit status and kiln_error follow): no crash,
 * and, run under ASan as scripts/test.sh does, no leak.
 * SQLite tests its allocation failures this way.
 * kiln_jit is swept the same way, its message required to say "out of memory" and
 * its kind to be KILN_ERROR_NO_MEMORY.
 *
 * The runtime of compiled models allocates with malloc, not through the hook (it
 * is linked into models that do not link kiln), so it is outside the sweep.
 *
 * Prints "alloc failure: N injection points, all clean". */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen/codegen.h"
#include "frontend/frontend.h"
#include "kiln/kiln.h"
#include "passes/passes.h"

#ifndef KILN_SOURCE_DIR
#define KILN_SOURCE_DIR "."
#endif

/* A conv, a pool, a chain of elementwise ops, a linear layer, a loss, its
 * gradients and an SGD update. */
static const char model_text[] = "model oom\n"
                                 "input x : f32[2, 3, 8, 8]\n"
                                 "input y : f32[2, 4]\n"
                                 "param w : f32[4, 3, 3, 3] = normal(0, 0.3, seed=1)\n"
                                 "param b : f32[4] = uniform(-0.1, 0.1, seed=2)\n"
                                 "param fw : f32[4, 64] = normal(0, 0.1, seed=3)\n"
                                 "param fb : f32[4] = zeros\n"
                                 "const lr : f32[] = 0.1\n"
                                 "c = conv(x, w, b, pads=[1, 1, 1, 1])\n"
                                 "r = relu(c)\n"
                                 "p = max_pool(r, kernel=[2, 2], strides=[2, 2])\n"
                                 "s = sigmoid(p)\n"
                                 "e = mul(s, p)\n"
                                 "t = add(e, p)\n"
                                 "f = flatten(t)\n"
                                 "logits = linear(f, fw, fb)\n"
                                 "d = sub(logits, y)\n"
                                 "sq = mul(d, d)\n"
                                 "loss = mean(sq)\n"
                                 "gw, gb, gfw = grad(loss, w, b, fw)\n"
                                 "sw = mul(gw, lr)\n"
                                 "nw = sub(w, sw)\n"
                                 "update w = nw\n"
                                 "output loss, gb, gfw\n";

enum { MAX_INPUTS = 16 };

/* The job; 0, or -1 after a diagnostic. */
static int job(const char *path, const char *weights, bool check, Diag *d) {
    const char *onnx_path = path && strstr(path, ".onnx") ? path : NULL;
    SrcFile *src = NULL;
    Graph *g = NULL;
    TensorList w = {0};
    Program *p = NULL, *cuda = NULL;
    Source source = {0}, cuda_source = {0};
    CPieces pieces = {0};
    Tensor **in = NULL, **out = NULL;
    int n_in = 0, n_out = 0;
    int rc = -1;
    if (onnx_path) {
        g = onnx_import(onnx_path, NULL, 0, &w, d);
    } else {
        src = path ? srcfile_read(path, d) : srcfile_from_string("<oom>", model_text);
        if (!src && !path)
            diag_error(d, (Loc){0}, "out of memory reading the model");
        g = src ? parse_model(src, d) : NULL;
    }
    if (g && weights && safetensors_read(weights, &w, d) != 0)
        goto done;
    PipelineOptions po = {.level = 2, .verify = true, .lower = true, .check = check};
    if (!g || verify_graph(g, d) != 0 || pipeline_run(g, &w, &po, d) != 0)
        goto done;
    if (!(p = program_lower(g, &w, &(LowerOptions){TARGET_C, true, true, NULL}, d)) ||
        program_source(p, false, &source, d) != 0 || emit_c_pieces(p, &pieces, d) != 0)
        goto done;
    if (!(cuda = program_lower(g, &w, &(LowerOptions){TARGET_CUDA, true, true, NULL}, d)) ||
        program_source(cuda, false, &cuda_source, d) != 0)
        goto done;
    /* the harness's own memory, from malloc: its allocations are not the sweep's */
    int ids[MAX_INPUTS];
    n_in = graph_inputs(g, ids, MAX_INPUTS);
    n_out = g->n_outputs;
    in = calloc((size_t)n_in + 1, sizeof *in);
    out = calloc((size_t)n_out + 1, sizeof *out);
    if (n_in > MAX_INPUTS || !in || !out) {
        diag_error(d, (Loc){0}, "the harness cannot run this model");
        goto done;
    }
    for (int i = 0; i < n_in; i++) {
        if (!(in[i] = tensor_new(&g->values[ids[i]].type))) {
            diag_error(d, (Loc){0}, "out of memory for the inputs");
            goto done;
        }
        for (int64_t k = 0; k < type_numel(&in[i]->type); k++)
            in[i]->data[k] = (float)((k * 7 + i) % 11) / 11.0f - 0.5f;
    }
    rc = interp_step(g, &w, (const Tensor *const *)in, out, d);
done:
    for (int i = 0; in && i < n_in; i++)
        tensor_free(in[i]);
    for (int i = 0; out && i < n_out; i++)
        tensor_free(out[i]);
    free(in);
    free(out);
    source_free(&source);
    source_free(&cuda_source);
    c_pieces_free(&pieces);
    program_free(p);
    program_free(cuda);
    tensors_free(&w);
    graph_free(g);
    srcfile_free(src);
    return rc;
}

static long injection_points;

/* Every N until the job succeeds; returns how many failed. */
static long sweep(const char *path, const char *weights, bool check) {
    long n = 0;
    for (;; n++) {
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        assert_non_null(f);
        Diag d;
        diag_init(&d, f);
        ir_fail_alloc_after(n);
        int rc = job(path, weights, check, &d);
        ir_fail_alloc_after(-1);
        fclose(f);
        if (rc != 0 && (!strstr(text, "out of memory") || d.errors == 0)) {
            printf("allocation %ld failing: the job failed without saying it ran out of memory:\n%s\n", n,
                   text);
            free(text);
            fail();
        }
        if (rc != 0 && d.kind != DIAG_NO_MEMORY) {
            printf("allocation %ld failing: the job's errors are not of kind out of memory (%d):\n%s\n", n,
                   (int)d.kind, text);
            free(text);
            fail();
        }
        if (rc == 0 && d.errors != 0) {
            printf("allocation %ld failing: the job succeeded after an error:\n%s\n", n, text);
            free(text);
            fail();
        }
        free(text);
        if (rc == 0)
            break;
    }
    printf("%s%s: %ld allocations failed in turn, each cleanly\n", path ? path : "the text model",
           check ? " (--check)" : "", n);
    injection_points += n;
    return n;
}

static void test_hostile_alloc_failure_text_model(void **state) {
    (void)state;
    assert_true(sweep(NULL, NULL, false) > 100);
}

static void test_hostile_alloc_failure_onnx_import(void **state) {
    (void)state;
    assert_true(sweep(KILN_SOURCE_DIR "/tests/onnx/models/tiny_cnn_opset13.onnx", NULL, false) > 50);
}

/* kiln_jit, libkiln's whole path, with the model already in the compile cache (so
 * that each N costs no compile): through the system compiler's shared object, the
 * in-process JIT's code being LLVM's, whose allocations kiln does not see. */
static void test_hostile_alloc_failure_kiln_jit(void **state) {
    (void)state;
    char dir[] = "/tmp/test_alloc_failure-XXXXXX", path[128];
    assert_non_null(mkdtemp(dir));
    kiln_options o = {.opt_level = 2, .cache_dir = dir, .jit = "cc"};
    kiln_error err = {.message = ""};
    kiln_module *m = kiln_jit(model_text, &o, &err);
    if (!m)
        fail_msg("kiln_jit: %s", err.message);
    kiln_free(m);
    m = NULL;
    long n = 0;
    for (; !m; n++) {
        err = (kiln_error){.message = ""};
        ir_fail_alloc_after(n);
        m = kiln_jit(model_text, &o, &err);
        ir_fail_alloc_after(-1);
        if (!m && !strstr(err.message, "out of memory"))
            fail_msg("allocation %ld failing: kiln_jit failed without saying it ran out of memory: %s", n,
                     err.message);
        if (!m && err.kind != KILN_ERROR_NO_MEMORY)
            fail_msg("allocation %ld failing: kiln_jit's error is of kind %d, not out of memory: %s", n,
                     (int)err.kind, err.message);
    }
    kiln_free(m);
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));)
        if (e->d_name[0] != '.' && snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < (int)sizeof path)
            unlink(path);
    if (d)
        closedir(d);
    rmdir(dir);
    printf("kiln_jit: %ld allocations failed in turn, each cleanly\n", n - 1);
    injection_points += n - 1;
}

/* The recurrent layers' import: a bidirectional GRU unrolled into kiln ops, and an
 * LSTM whose sequences end early (the steps' masks). */
static void test_hostile_alloc_failure_onnx_recurrent(void **state) {
    (void)state;
    assert_true(sweep(KILN_SOURCE_DIR "/tests/onnx/models/gru_bidirectional.onnx", NULL, false) > 100);
    assert_true(sweep(KILN_SOURCE_DIR "/tests/onnx/models/lstm_seq_lens.onnx", NULL, false) > 100);
}

static int disarm(void **state) {
    (void)state;
    ir_fail_alloc_after(-1);
    return 0;
}

/* The pipeline with --check: the interpreter after every pass (passes/check.c). */
static void test_hostile_alloc_failure_check(void **state) {
    (void)state;
    assert_true(sweep(NULL, NULL, true) > 100);
}

/* Batteries of tests/ref with their weights from safetensors. */
static void test_hostile_alloc_failure_softmax_battery(void **state) {
    (void)state;
    assert_true(sweep(KILN_SOURCE_DIR "/tests/ref/softmax.kiln",
                      KILN_SOURCE_DIR "/tests/ref/softmax.safetensors", false) > 100);
}

static void test_hostile_alloc_failure_attention_battery(void **state) {
    (void)state;
    assert_true(sweep(KILN_SOURCE_DIR "/tests/ref/attention.kiln",
                      KILN_SOURCE_DIR "/tests/ref/attention.safetensors", false) > 100);
}

/* fuse_attention making attention ops from matmul and softmax, fuse_layer_norm
 * layer_norm ops from their parts. */
static void test_hostile_alloc_failure_fuse_attention(void **state) {
    (void)state;
    assert_true(sweep(KILN_SOURCE_DIR "/tests/text/pass_fuse_attention.kiln", NULL, false) > 100);
}

static void test_hostile_alloc_failure_fuse_layer_norm(void **state) {
    (void)state;
    assert_true(sweep(KILN_SOURCE_DIR "/tests/text/pass_fuse_layer_norm.kiln", NULL, false) > 100);
}

/* A model with a symbolic dim: its second lowering at size 1, sharing the bound's
 * weights and packed panels. */
static void test_hostile_alloc_failure_symbolic(void **state) {
    (void)state;
    assert_true(sweep(KILN_SOURCE_DIR "/tests/text/symbolic_shared_weights.kiln", NULL, false) > 100);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_hostile_alloc_failure_text_model, disarm),
        cmocka_unit_test_teardown(test_hostile_alloc_failure_onnx_import, disarm),
        cmocka_unit_test_teardown(test_hostile_alloc_failure_onnx_recurrent, disarm),
        cmocka_unit_test_teardown(test_hostile_alloc_failure_kiln_jit, disarm),
        cmocka_unit_test_teardown(test_hostile_alloc_failure_softmax_battery, disarm),
        cmocka_unit_test_teardown(test_hostile_alloc_failure_attention_battery, disarm),
        cmocka_unit_test_teardown(test_hostile_alloc_failure_fuse_attention, disarm),
        cmocka_unit_test_teardown(test_hostile_alloc_failure_fuse_layer_norm, disarm),
        cmocka_unit_test_teardown(test_hostile_alloc_failure_symbolic, disarm),
        cmocka_unit_test_teardown(test_hostile_alloc_failure_check, disarm),
    };
    int failed = cmocka_run_group_tests_name("alloc_failure", tests, NULL, NULL);
    if (!failed)
        printf("alloc failure: %ld injection points, all clean\n", injection_points);
    return failed;
}
