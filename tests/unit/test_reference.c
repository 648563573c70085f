/* The interpreter against independent reference values, one test per battery.
 *
 * tests/ref/gen_reference.py writes, for each battery NAME, a model NAME.kiln whose
 * every input is a param, the param values NAME.safetensors, and the outputs that
 * PyTorch (or numpy following the ONNX specification) computes for them,
 * NAME.expected.safetensors. This test parses each model, runs it in the reference
 * interpreter with those weights, and compares every output with its expected tensor
 * by name within the project's tolerance |a-b| <= 1e-4 + 1e-4*|b| (NaN matches NaN,
 * an infinity the same infinity). A failing battery lists its mismatches (the first
 * few of each output in full) and their count.
 *
 * Usage: test_reference [DIR]; DIR defaults to KILN_REF_DIR (else the source tree's
 * tests/ref). */
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

#include "frontend/frontend.h"

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

/* Compares one output with its expected tensor; returns the number of mismatches. */
static long compare_output(const char *battery, const char *name, const Tensor *got, const Tensor *want) {
    char a[160], b[160];
    if (!want) {
        printf("%s: output %s: no expected tensor of that name\n", battery, name);
        return 1;
    }
    if (!type_equal(&got->type, &want->type)) {
        printf("%s: output %s: type %s, expected %s\n", battery, name, type_str(&got->type, a, sizeof a),
               type_str(&want->type, b, sizeof b));
        return 1;
    }
    long bad = 0;
    int64_t count = type_numel(&got->type);
    for (int64_t i = 0; i < count; i++) {
        if (close_enough(got->data[i], want->data[i]))
            continue;
        if (bad++ < SHOWN_PER_OUTPUT)
            printf("%s: output %s [%lld]: got %.9g, expected %.9g\n", battery, name, (long long)i,
                   (double)got->data[i], (double)want->data[i]);
    }
    if (bad > SHOWN_PER_OUTPUT)
        printf("%s: output %s: %ld of %lld elements differ\n", battery, name, bad, (long long)count);
    return bad;
}

static bool read_tensors(const Battery *b, const char *suffix, TensorList *out, Diag *d) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s%s", b->dir, b->name, suffix);
    return safetensors_read(path, out, d) == 0;
}

/* Parses, runs and compares one battery; returns the number of mismatches, or -1
 * when the battery could not run at all. Frees everything before returning, so that
 * a failing assertion leaks nothing. */
static long check_battery(const Battery *b) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.kiln", b->dir, b->name);
    Diag d;
    diag_init(&d, stdout);
    TensorList weights = {0}, expected = {0};
    Tensor **outs = NULL;
    Graph *g = NULL;
    long bad = -1;
    SrcFile *src = srcfile_read(path, &d);
    if (src)
        g = parse_model(src, &d);
    if (g && read_tensors(b, ".safetensors", &weights, &d) &&
        read_tensors(b, ".expected.safetensors", &expected, &d)) {
        outs = calloc((size_t)g->n_outputs + 1, sizeof *outs);
        if (outs && interp_run(g, &weights, NULL, outs, &d) == 0) {
            bad = 0;
            for (int k = 0; k < g->n_outputs; k++) {
                const char *name = g->values[g->outputs[k]].name;
                bad += compare_output(b->name, name, outs[k], tensors_find(&expected, name));
            }
            if (expected.n != g->n_outputs)
                printf("%s: %d expected tensors for %d outputs\n", b->name, expected.n, g->n_outputs);
        }
    }
    if (outs)
        for (int k = 0; k < g->n_outputs; k++)
            tensor_free(outs[k]);
    free(outs);
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
        fail_msg("battery %s did not run (see the diagnostic above)", b->name);
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
        fprintf(stderr, "test_reference: no batteries (NAME.kiln) in %s\n", dir);
        free(batteries);
        return 1;
    }
    struct CMUnitTest *tests = calloc((size_t)n, sizeof *tests);
    if (!tests)
        abort();
    for (int i = 0; i < n; i++)
        tests[i] = (struct CMUnitTest){batteries[i].name, test_battery, NULL, NULL, &batteries[i]};
    int failed = _cmocka_run_group_tests("reference", tests, (size_t)n, NULL, NULL);
    for (int i = 0; i < n; i++)
        free(batteries[i].name);
    free(batteries);
    free(tests);
    return failed;
}
