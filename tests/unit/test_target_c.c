/* The C target against the reference values and the interpreter, one test per battery;
 * built a second time as test_target_cuda, with TEST_TARGET the CUDA target (which
 * CTest runs emulated on the CPU, KILN_CUDA=emulate, where there is no GPU).
 *
 * For each battery NAME of tests/ref/ (see test_reference.c: NAME.kiln, its params in
 * NAME.safetensors, PyTorch's outputs in NAME.expected.safetensors), this test parses
 * the model, runs it in the reference interpreter, then runs the pass pipeline on it
 * (at -O2, and again from the start at -O1, which keeps the layouts the battery wrote),
 * compiles it to C and loads it with jit_graph (through the compile cache in
 * $KILN_CACHE_DIR, which CTest points into the build tree so that reruns are fast),
 * runs it once with kiln_run, and compares every output with both the expected tensor
 * of its name and the interpreter's result, within |a-b| <= 1e-4 + 1e-4*|b| (NaN
 * matches NaN, an infinity the same infinity). A failing battery lists its mismatches
 * (the first few of each output and reference in full) and their count. battery.c
 * holds what this test shares with test_reference.c: loading a battery, the
 * comparison, the search for batteries and the main.
 *
 * Usage: test_target_c [DIR]; DIR defaults to the source tree's tests/ref. */
#include <stdio.h>
#include <stdlib.h>

#include "battery.h"
#include "codegen/jit.h"
#include "passes/passes.h"

#ifndef TEST_TARGET
#define TEST_TARGET TARGET_C
#define TEST_GROUP "target_c"
#endif

/* Runs the compiled model once into new tensors of the graph's output types. */
static bool run_compiled(const Graph *g, kiln_module *m, Tensor **outs) {
    void **bufs = calloc((size_t)g->n_outputs + 1, sizeof *bufs);
    bool ok = bufs != NULL;
    for (int k = 0; ok && k < g->n_outputs; k++) {
        outs[k] = tensor_new(&g->values[g->outputs[k]].type);
        if (!(ok = outs[k] != NULL))
            printf("out of memory\n");
        else
            bufs[k] = outs[k]->data;
    }
    const void *no_inputs[1] = {NULL}; /* the batteries' inputs are all params */
    kiln_error err = {.message = ""};
    if (ok && kiln_run(m, no_inputs, bufs, &err) != 0) {
        printf("kiln_run: %s\n", err.message);
        ok = false;
    }
    free(bufs);
    return ok;
}

/* Parses, interprets, compiles at -O`level`, runs and compares one battery; returns
 * the number of mismatches, or -1 when the battery could not run at all. Frees
 * everything before returning, so that a failing assertion leaks nothing. */
static long compile_and_compare(const Battery *b, int level) {
    Diag d;
    diag_init(&d, stdout);
    BatteryModel bm = {0};
    Tensor **ref = NULL, **got = NULL;
    kiln_module *m = NULL;
    kiln_error err = {.message = ""};
    long bad = -1;
    int n_out = 0;
    if (battery_load(b, &bm, &d)) {
        n_out = bm.g->n_outputs;
        ref = calloc((size_t)n_out + 1, sizeof *ref);
        got = calloc((size_t)n_out + 1, sizeof *got);
    }
    PipelineOptions po = {.level = level, .verify = true};
    if (ref && got && verify_graph(bm.g, &d) == 0 && interp_run(bm.g, &bm.weights, NULL, ref, &d) == 0 &&
        pipeline_run(bm.g, &bm.weights, &po, &d) == 0) {
        /* the environment's settings: KILN_BLAS=off and KILN_CUDA=emulate make the
           test's variants */
        JitOptions jo;
        if (jit_options_from(NULL, &jo, &d) == 0) {
            jo.target = TEST_TARGET;
            jo.memplan = pipeline_selects(&po, "memplan");
            m = jit_graph(bm.g, &bm.weights, &jo, &d, &err);
        }
        if (!m)
            printf("%s: jit_graph: %s\n", b->name, err.message);
    }
    if (m && run_compiled(bm.g, m, got))
        bad = battery_compare_outputs(b, &bm, got, ref);
    for (int k = 0; k < n_out; k++) {
        tensor_free(ref ? ref[k] : NULL);
        tensor_free(got ? got[k] : NULL);
    }
    free(ref);
    free(got);
    kiln_free(m);
    battery_unload(&bm);
    return bad;
}

/* At -O2, where the layout pass computes every conv and pool channels last, and at
 * -O1, where they keep the layout the battery wrote: both kinds of kernels. */
static long check_battery(const Battery *b) {
    long o2 = compile_and_compare(b, 2), o1 = compile_and_compare(b, 1);
    return o2 < 0 || o1 < 0 ? -1 : o2 + o1;
}

int main(int argc, char **argv) {
    static const BatterySuite suite = {TEST_GROUP, "compile and run", check_battery};
    return battery_main(argc, argv, &suite);
}
