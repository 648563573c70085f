/* The battery tests' shared part (see battery.h): loading a battery, the tolerance,
 * the comparison that lists mismatches, the directory scan for NAME.kiln, and the
 * cmocka main. The main finds the batteries, sorts them by name, and gives each a
 * cmocka test that calls the suite's check and fails with what it returns. */
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

#include "battery.h"
#include "passes/passes.h"

#ifndef KILN_REF_DIR
#ifdef KILN_SOURCE_DIR
#define KILN_REF_DIR KILN_SOURCE_DIR "/tests/ref"
#else
#define KILN_REF_DIR "tests/ref"
#endif
#endif

enum { SHOWN_PER_OUTPUT = 5 };

static bool read_tensors(const Battery *b, const char *suffix, TensorList *out, Diag *d) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s%s", b->dir, b->name, suffix);
    return safetensors_read(path, out, d) == 0;
}

bool battery_load(const Battery *b, BatteryModel *m, Diag *d) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.kiln", b->dir, b->name);
    m->src = srcfile_read(path, d);
    if (m->src)
        m->g = parse_model(m->src, d);
    PipelineOptions autodiff_only = {.level = 0, .lower = true, .verify = true};
    return m->g && read_tensors(b, ".safetensors", &m->weights, d) &&
           read_tensors(b, ".expected.safetensors", &m->expected, d) &&
           pipeline_run(m->g, &m->weights, &autodiff_only, d) == 0;
}

void battery_unload(BatteryModel *m) {
    tensors_free(&m->weights);
    tensors_free(&m->expected);
    if (m->g)
        graph_free(m->g);
    if (m->src)
        srcfile_free(m->src);
}

static bool close_enough(float got, float want) {
    if (isnan(want) || isnan(got))
        return isnan(want) && isnan(got);
    if (isinf(want) || isinf(got))
        return got == want;
    return fabs((double)got - want) <= 1e-4 + 1e-4 * fabs((double)want);
}

/* Compares output `name` with a reference tensor (`what`: "expected", "interpreter";
 * want NULL when there is none of that name); returns the number of mismatches. */
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
    bool exact = got->type.dtype != DT_F32; /* integers and bools */
    for (int64_t i = 0; i < count; i++) {
        if (exact ? tensor_int(got, i) == tensor_int(want, i) : close_enough(got->data[i], want->data[i]))
            continue;
        if (bad++ < SHOWN_PER_OUTPUT && exact)
            printf("%s: output %s [%lld]: got %lld, %s %lld\n", battery, name, (long long)i,
                   (long long)tensor_int(got, i), what, (long long)tensor_int(want, i));
        else if (bad <= SHOWN_PER_OUTPUT)
            printf("%s: output %s [%lld]: got %.9g, %s %.9g\n", battery, name, (long long)i,
                   (double)got->data[i], what, (double)want->data[i]);
    }
    if (bad > SHOWN_PER_OUTPUT)
        printf("%s: output %s: %ld of %lld elements differ from the %s\n", battery, name, bad,
               (long long)count, what);
    return bad;
}

long battery_compare_outputs(const Battery *b, const BatteryModel *m, Tensor *const *got,
                             Tensor *const *ref) {
    const Graph *g = m->g;
    long bad = 0;
    for (int k = 0; k < g->n_outputs; k++) {
        const char *name = g->values[g->outputs[k]].name;
        bad += compare_output(b->name, name, got[k], tensors_find(&m->expected, name), "expected");
        if (ref)
            bad += compare_output(b->name, name, got[k], ref[k], "interpreter");
    }
    if (m->expected.n != g->n_outputs)
        printf("%s: %d expected tensors for %d outputs\n", b->name, m->expected.n, g->n_outputs);
    return bad;
}

static const BatterySuite *suite; /* the running test's, for test_battery */

static void test_battery(void **state) {
    const Battery *b = *state;
    long bad = suite->check(b);
    fflush(stdout); /* the details before cmocka's verdict */
    if (bad < 0)
        fail_msg("battery %s did not %s (see the diagnostic above)", b->name, suite->doing);
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

int battery_main(int argc, char **argv, const BatterySuite *s) {
    const char *dir = argc > 1 ? argv[1] : KILN_REF_DIR;
    Battery *batteries = NULL;
    int n = find_batteries(dir, &batteries);
    if (n <= 0) {
        fprintf(stderr, "test_%s: no batteries (NAME.kiln) in %s\n", s->group, dir);
        free(batteries);
        return 1;
    }
    struct CMUnitTest *tests = calloc((size_t)n, sizeof *tests);
    if (!tests)
        abort();
    for (int i = 0; i < n; i++)
        tests[i] = (struct CMUnitTest){batteries[i].name, test_battery, NULL, NULL, &batteries[i]};
    suite = s;
    int failed = _cmocka_run_group_tests(s->group, tests, (size_t)n, NULL, NULL);
    for (int i = 0; i < n; i++)
        free(batteries[i].name);
    free(batteries);
    free(tests);
    return failed;
}
