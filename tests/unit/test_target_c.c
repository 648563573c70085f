/* The C target against the reference values and the interpreter, one test per battery.
 *
 * For each battery NAME of tests/ref/ (see test_reference.c: NAME.kiln, its params in
 * NAME.safetensors, PyTorch's outputs in NAME.expected.safetensors), this test parses
 * the model, runs it in the reference interpreter, then runs the default pass pipeline
 * on it, compiles it to C and loads it with jit_graph (through the compile cache in
 * $KILN_CACHE_DIR, which CTest points into the build tree so that reruns are fast),
 * runs it once with kiln_run, and compares every output with both the expected tensor
 * of its name and the interpreter's result, within |a-b| <= 1e-4 + 1e-4*|b| (NaN
 * matches NaN, an infinity the same infinity). A failing battery lists its mismatches
 * (the first few of each output and reference in full) and their count.
 *
 * Usage: test_target_c [DIR]; DIR defaults to the source tree's tests/ref. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/jit.h"
#include "frontend/frontend.h"
#include "passes/passes.h"

#ifndef KILN_REF_DIR
#ifdef KILN_SOURCE_DIR
#define KILN_REF_DIR KILN_SOURCE_DIR "/tests/ref"
#else
#define KILN_REF_DIR "tests/ref"
#endif
#endif

enum { SHOWN_PER_OUTPUT = 5 };

typedef struct {
    const char *dir;
    char *name; /* the battery: NAME of NAME.kiln */
} Battery;

static bool close_enough(float got, float want) {
    if (isnan(want) || isnan(got))
        return isnan(want) && isnan(got);
    if (isinf(want) || isinf(got))
        return got == want;
    return fabs((double)got - want) <= 1e-4 + 1e-4 * fabs((double)want);
}

/* Compares one compiled output with a reference tensor (`what`: "expected" or
 * "interpreter"); returns the number of mismatches. */
static long compare_output(const char *battery, const char *name, const Tensor *got, const Tensor *want,
                           const char *what) {
    char a[160], b[160];
    if (!want) {
        printf("%s: output %s: no %s tensor of that name\n", battery, name, what);
        return 1;
    }
    if (!type_equal(&got->type, &want->type)) {
        printf("%s: output %s: type %s, %s %s\n", battery, name, type_str(&got->type, a, sizeof a), what,
               type_str(&want->type, b, sizeof b));
        return 1;
    }
    long bad = 0;
    int64_t count = type_numel(&got->type);
    for (int64_t i = 0; i < count; i++) {
        if (close_enough(got->data[i], want->data[i]))
            continue;
        if (bad++ < SHOWN_PER_OUTPUT)
            printf("%s: output %s [%lld]: got %.9g, %s %.9g\n", battery, name, (long long)i,
                   (double)got->data[i], what, (double)want->data[i]);
    }
    if (bad > SHOWN_PER_OUTPUT)
        printf("%s: output %s: %ld of %lld elements differ from the %s\n", battery, name, bad,
               (long long)count, what);
    return bad;
}

static bool read_tensors(const Battery *b, const char *suffix, TensorList *out, Diag *d) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s%s", b->dir, b->name, suffix);
    return safetensors_read(path, out, d) == 0;
}

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
    kiln_error err = {""};
    if (ok && kiln_run(m, no_inputs, bufs, &err) != 0) {
        printf("kiln_run: %s\n", err.message);
        ok = false;
    }
    free(bufs);
    return ok;
}

/* Parses, interprets, compiles, runs and compares one battery; returns the number of
 * mismatches, or -1 when the battery could not run at all. Frees everything before
 * returning, so that a failing assertion leaks nothing. */
static long check_battery(const Battery *b) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.kiln", b->dir, b->name);
    Diag d;
    diag_init(&d, stdout);
    TensorList weights = {0}, expected = {0};
    Tensor **ref = NULL, **got = NULL;
    Graph *g = NULL;
    kiln_module *m = NULL;
    kiln_error err = {""};
    long bad = -1;
    int n_out = 0;
    SrcFile *src = srcfile_read(path, &d);
    if (src)
        g = parse_model(src, &d);
    if (g) {
        n_out = g->n_outputs;
        ref = calloc((size_t)n_out + 1, sizeof *ref);
        got = calloc((size_t)n_out + 1, sizeof *got);
    }
    PipelineOptions po = {.level = 2, .verify = true};
    if (ref && got && verify_graph(g, &d) == 0 && read_tensors(b, ".safetensors", &weights, &d) &&
        read_tensors(b, ".expected.safetensors", &expected, &d) &&
        interp_run(g, &weights, NULL, ref, &d) == 0 && pipeline_run(g, &po, &d) == 0) {
        m = jit_graph(g, &weights, NULL, &d, &err);
        if (!m)
            printf("%s: jit_graph: %s\n", b->name, err.message);
    }
    if (m && run_compiled(g, m, got)) {
        bad = 0;
        for (int k = 0; k < n_out; k++) {
            const char *name = g->values[g->outputs[k]].name;
            bad += compare_output(b->name, name, got[k], tensors_find(&expected, name), "expected");
            bad += compare_output(b->name, name, got[k], ref[k], "interpreter");
        }
        if (expected.n != n_out)
            printf("%s: %d expected tensors for %d outputs\n", b->name, expected.n, n_out);
    }
    for (int k = 0; k < n_out; k++) {
        tensor_free(ref ? ref[k] : NULL);
        tensor_free(got ? got[k] : NULL);
    }
    free(ref);
    free(got);
    kiln_free(m);
    tensors_free(&weights);
    tensors_free(&expected);
    if (g)
        graph_free(g);
    if (src)
        srcfile_free(src);
    return bad;
}

static void test_battery(void **state) {
    const Battery *b = *state;
    long bad = check_battery(b);
    fflush(stdout); /* the details before cmocka's verdict */
    if (bad < 0)
        fail_msg("battery %s did not compile and run (see the diagnostic above)", b->name);
    if (bad > 0)
        fail_msg("battery %s: %ld mismatches", b->name, bad);
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const Battery *)a)->name, ((const Battery *)b)->name);
}

/* Every NAME.kiln in dir, sorted by name; -1 when dir cannot be read. */
static int find_batteries(const char *dir, Battery **out) {
    DIR *dp = opendir(dir);
    if (!dp)
        return -1;
    Battery *list = NULL;
    int n = 0, cap = 0;
    for (struct dirent *e; (e = readdir(dp));) {
        size_t len = strlen(e->d_name);
        if (len <= 5 || strcmp(e->d_name + len - 5, ".kiln") != 0)
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            Battery *grown = realloc(list, sizeof *list * (size_t)cap);
            if (!grown)
                abort();
            list = grown;
        }
        list[n].dir = dir;
        list[n].name = strndup(e->d_name, len - 5);
        if (!list[n++].name)
            abort();
    }
    closedir(dp);
    qsort(list, (size_t)n, sizeof *list, by_name);
    *out = list;
    return n;
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : KILN_REF_DIR;
    Battery *batteries = NULL;
    int n = find_batteries(dir, &batteries);
    if (n <= 0) {
        fprintf(stderr, "test_target_c: no batteries (NAME.kiln) in %s\n", dir);
        free(batteries);
        return 1;
    }
    struct CMUnitTest *tests = calloc((size_t)n, sizeof *tests);
    if (!tests)
        abort();
    for (int i = 0; i < n; i++)
        tests[i] = (struct CMUnitTest){batteries[i].name, test_battery, NULL, NULL, &batteries[i]};
    int failed = _cmocka_run_group_tests("target_c", tests, (size_t)n, NULL, NULL);
    for (int i = 0; i < n; i++)
        free(batteries[i].name);
    free(batteries);
    free(tests);
    return failed;
}
