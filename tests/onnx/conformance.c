/* The ONNX backend node tests (Debian's libonnx-testdata) on kiln's interpreter and C
 * target, checked against a list of the tests expected to fail.
 *
 * Each test is a directory holding model.onnx and test_data_set_0/ with input_N.pb
 * and output_N.pb (TensorProto files). The runner binds every graph input to its
 * test value where an op needs it constant (OnnxBind.if_needed: Reshape's shape,
 * Resize's scales, Clip's bounds, ... which kiln's static shapes need at import),
 * feeds the others as inputs, runs the model in the reference interpreter and, after
 * the -O2 pipeline, compiled for each target (C, and CUDA: on the GPU, or emulated on
 * the CPU with KILN_CUDA=emulate; jit_graph, through the compile cache), and
 * compares each output with output_N.pb within cli.md's tolerance
 * |a - b| <= 1e-4 + 1e-4 |b| (NaN matches NaN, an infinity itself).
 *
 * The expected-failures file lists one test a line, `NAME  REASON` ('#' starts a
 * comment). A test that fails and is not listed is an error, and so is one that is
 * listed and passes (the list must stay true). --write-expected FILE writes the list
 * the run found, each failure with its reason (the importer's message, or the
 * mismatch), for review before it replaces the committed one.
 *
 * usage: onnx_conformance [--write-expected FILE] [--filter SUBSTRING] [--targets c,cuda|c|cuda|none] [-v]
 *                         EXPECTED_FILE DATA_DIR...   (the node tests, and the older
 *                         pytorch-converted, pytorch-operator and simple ones) */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "codegen/jit.h"
#include "frontend/frontend.h"
#include "passes/passes.h"

enum { MAX_IO = 64, REASON = 512 };

typedef struct {
    char name[256];
    char reason[REASON];
    bool seen;
} Expected;

static Expected *expected;
static int n_expected;
static bool verbose;
/* The compiled targets each test runs on after the interpreter (--targets). */
static Target targets[2] = {TARGET_C, TARGET_CUDA};
static int n_targets = 2;

static void trim(char *s) {
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == ' ' || s[n - 1] == '\t'))
        s[--n] = 0;
}

static int read_expected(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "cannot open the expected-failures list '%s'\n", path);
        return -1;
    }
    char line[1024];
    int cap = 0;
    while (fgets(line, sizeof line, f)) {
        trim(line);
        if (!line[0] || line[0] == '#')
            continue;
        if (n_expected == cap) {
            cap = cap ? 2 * cap : 256;
            expected = realloc(expected, sizeof *expected * (size_t)cap);
            if (!expected)
                return -1;
        }
        Expected *e = &expected[n_expected++];
        memset(e, 0, sizeof *e);
        size_t k = strcspn(line, " \t");
        snprintf(e->name, sizeof e->name, "%.*s", (int)k, line);
        const char *r = line + k;
        while (*r == ' ' || *r == '\t')
            r++;
        snprintf(e->reason, sizeof e->reason, "%s", r);
    }
    fclose(f);
    return 0;
}

static Expected *find_expected(const char *name) {
    for (int i = 0; i < n_expected; i++)
        if (strcmp(expected[i].name, name) == 0)
            return &expected[i];
    return NULL;
}

/* The reason of a failed import, from the diagnostics: the unsupported op types,
 * or the first error without the model's path. */
static void import_reason(const char *msg, const char *model, char *reason) {
    if (strstr(msg, "the model uses ops kiln cannot import")) {
        char ops[REASON] = "";
        for (const char *p = strstr(msg, ": op "); p; p = strstr(p + 1, ": op ")) {
            char op[128];
            sscanf(p + 5, "%127[^,]", op);
            if (!strstr(ops, op) && strlen(ops) + strlen(op) + 3 < sizeof ops)
                snprintf(ops + strlen(ops), sizeof ops - strlen(ops), "%s%s", ops[0] ? ", " : "", op);
        }
        snprintf(reason, REASON, "no kiln op: %s", ops);
        return;
    }
    const char *line = msg;
    const char *e = strstr(msg, "error: ");
    if (e)
        line = e + 7;
    size_t ml = strlen(model);
    if (strncmp(line, model, ml) == 0 && line[ml] == ':')
        line += ml + 2;
    const char *hint = strstr(line, ". If it is a shape-like parameter"); /* the CLI's advice */
    size_t len = strcspn(line, "\n");
    if (hint && (size_t)(hint - line) < len)
        len = (size_t)(hint - line);
    snprintf(reason, REASON, "%.*s", (int)len, line);
}

static bool close_enough(float got, float want) {
    if (isnan(want) || isnan(got))
        return isnan(want) && isnan(got);
    if (isinf(want) || isinf(got))
        return got == want;
    return fabs((double)got - want) <= 1e-4 + 1e-4 * fabs((double)want);
}

/* Compares outputs; fills reason with the first mismatch. */
static bool compare(const Graph *g, Tensor *const *got, Tensor *const *want, const char *target,
                    char *reason) {
    for (int k = 0; k < g->n_outputs; k++) {
        char a[160], b[160];
        if (!type_equal(&got[k]->type, &want[k]->type)) {
            snprintf(reason, REASON, "%s: output %d is %s, the test's %s", target, k,
                     type_str(&got[k]->type, a, sizeof a), type_str(&want[k]->type, b, sizeof b));
            return false;
        }
        int64_t n = type_numel(&got[k]->type), bad = 0, first = -1;
        double worst = 0;
        bool exact = got[k]->type.dtype != DT_F32; /* integers and bools */
        for (int64_t i = 0; i < n; i++)
            if (exact ? tensor_int(got[k], i) != tensor_int(want[k], i)
                      : !close_enough(got[k]->data[i], want[k]->data[i])) {
                if (first < 0)
                    first = i;
                bad++;
                double e = fabs(tensor_double(got[k], i) - tensor_double(want[k], i));
                if (e > worst || isnan(e))
                    worst = e;
            }
        if (bad) {
            snprintf(reason, REASON,
                     "%s: output %d: %lld of %lld elements differ (max error %.3g; [%lld] %.7g vs %.7g)",
                     target, k, (long long)bad, (long long)n, worst, (long long)first,
                     tensor_double(got[k], first), tensor_double(want[k], first));
            return false;
        }
    }
    return true;
}

static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

typedef struct {
    Tensor *in[MAX_IO], *out[MAX_IO];
    char *in_name[MAX_IO];
    char in_path[MAX_IO][4096];
    int n_in, n_out;
} TestData;

static void free_data(TestData *t) {
    for (int k = 0; k < t->n_in; k++) {
        tensor_free(t->in[k]);
        ir_free(t->in_name[k]);
    }
    for (int k = 0; k < t->n_out; k++)
        tensor_free(t->out[k]);
}

/* Runs one test; true when it passes, else the reason. */
static bool run_test(const char *dir, const char *name, char *reason) {
    char model[4096], path[4096];
    snprintf(model, sizeof model, "%s/%s/model.onnx", dir, name);
    TestData td = {0};
    char *msg = NULL;
    size_t msg_len = 0;
    FILE *mf = open_memstream(&msg, &msg_len);
    Diag d;
    diag_init(&d, mf);
    bool ok = true;
    /* An input kiln cannot hold (an empty tensor, a string) may still be a constant
     * the importer reads itself: only its name is needed here. */
    FILE *null = fopen("/dev/null", "w");
    Diag quiet;
    diag_init(&quiet, null ? null : mf);
    for (int k = 0; k < MAX_IO && ok; k++) {
        snprintf(td.in_path[k], sizeof td.in_path[k], "%s/%s/test_data_set_0/input_%d.pb", dir, name, k);
        if (!exists(td.in_path[k]))
            break;
        onnx_read_tensor(td.in_path[k], &td.in[k], &td.in_name[k], &quiet);
        td.n_in = k + 1;
    }
    /* Older test data (pytorch-converted, pytorch-operator) leaves the tensors unnamed:
     * input_k is then the model's k-th graph input, as an import without bindings
     * declares them. */
    bool unnamed = false;
    for (int k = 0; k < td.n_in; k++)
        unnamed |= td.in[k] && (!td.in_name[k] || !td.in_name[k][0]);
    if (unnamed) {
        TensorList w = {0};
        Graph *probe = onnx_import(model, NULL, 0, &w, &d);
        ok = probe != NULL; /* else its message is the reason */
        int ids[MAX_IO], n = probe ? graph_inputs(probe, ids, MAX_IO) : 0;
        for (int k = 0; k < td.n_in && k < n; k++) {
            ir_free(td.in_name[k]);
            td.in_name[k] = ir_strdup(probe->values[ids[k]].name);
        }
        tensors_free(&w);
        if (probe)
            graph_free(probe);
    }
    for (int k = 0; k < td.n_in && ok; k++)
        if (!td.in_name[k] || !td.in_name[k][0])
            ok = false,
            fprintf(mf, "error: input_%d.pb is not a tensor kiln reads (a sequence, an optional?)\n", k);
    if (null)
        fclose(null);
    for (int k = 0; k < MAX_IO && ok; k++) {
        snprintf(path, sizeof path, "%s/%s/test_data_set_0/output_%d.pb", dir, name, k);
        if (!exists(path))
            break;
        ok = onnx_read_tensor(path, &td.out[k], NULL, &d) == 0;
        td.n_out = k + 1;
    }
    OnnxBind binds[MAX_IO];
    for (int k = 0; k < td.n_in; k++)
        binds[k] = (OnnxBind){.name = td.in_name[k], .file = td.in_path[k], .if_needed = true};
    TensorList weights = {0};
    Graph *g = NULL;
    if (ok && !(g = onnx_import(model, binds, td.n_in, &weights, &d)))
        ok = false;
    fflush(mf);
    if (!ok)
        import_reason(msg ? msg : "", model, reason);
    /* inputs in declaration order, by name */
    const Tensor *inputs[MAX_IO] = {0};
    int ids[MAX_IO], n_in = 0;
    if (ok) {
        n_in = graph_inputs(g, ids, MAX_IO);
        for (int i = 0; i < n_in && ok; i++) {
            for (int k = 0; k < td.n_in; k++)
                if (strcmp(td.in_name[k], g->values[ids[i]].name) == 0)
                    inputs[i] = td.in[k];
            if (!inputs[i] || !type_equal(&inputs[i]->type, &g->values[ids[i]].type)) {
                if (verbose)
                    fprintf(stderr, "%s", msg ? msg : "");
                snprintf(reason, REASON, "no test value of the type of input '%s'", g->values[ids[i]].name);
                ok = false;
            }
        }
        if (ok && g->n_outputs != td.n_out) {
            snprintf(reason, REASON, "%d outputs, the test has %d", g->n_outputs, td.n_out);
            ok = false;
        }
    }
    Tensor *got[MAX_IO] = {0};
    if (ok) {
        if (interp_run(g, &weights, inputs, got, &d)) {
            fflush(mf);
            import_reason(msg ? msg : "", model, reason);
            ok = false;
        } else {
            ok = compare(g, got, td.out, "interp", reason);
        }
        for (int k = 0; k < g->n_outputs; k++)
            tensor_free(got[k]), got[k] = NULL;
    }
    /* Each compiled target on a fresh import: the pipeline rewrites the graph. */
    for (int t = 0; ok && t < n_targets; t++) {
        const char *tname = targets[t] == TARGET_CUDA ? "cuda" : "c";
        TensorList tw = {0};
        Graph *tg = onnx_import(model, binds, td.n_in, &tw, &d);
        PipelineOptions po = {.level = 2, .verify = true, .lower = true};
        kiln_error err = {.message = ""};
        kiln_module *m = NULL;
        if (tg && pipeline_run(tg, &tw, &po, &d) == 0) {
            JitOptions jo; /* the environment's settings: KILN_CUDA=emulate without a GPU */
            if (jit_options_from(NULL, &jo, &d) == 0) {
                jo.target = targets[t];
                jo.memplan = pipeline_selects(&po, "memplan");
                m = jit_graph(tg, &tw, &jo, &d, &err);
            }
        }
        void *bufs[MAX_IO];
        const void *inbufs[MAX_IO];
        for (int i = 0; i < n_in; i++)
            inbufs[i] = inputs[i]->data;
        for (int k = 0; m && k < tg->n_outputs; k++) {
            got[k] = tensor_new(&tg->values[tg->outputs[k]].type);
            bufs[k] = got[k]->data;
        }
        if (!m) {
            fflush(mf);
            snprintf(reason, REASON, "%s: %.480s", tname,
                     err.message[0] ? err.message : "the pipeline failed");
            ok = false;
        } else if (kiln_run(m, inbufs, bufs, &err)) {
            snprintf(reason, REASON, "%s: %.480s", tname, err.message);
            ok = false;
        } else {
            ok = compare(tg, got, td.out, tname, reason);
        }
        for (int k = 0; tg && k < tg->n_outputs; k++)
            tensor_free(got[k]), got[k] = NULL;
        kiln_free(m);
        tensors_free(&tw);
        graph_free(tg);
    }
    if (verbose && msg && *msg && !ok)
        fprintf(stderr, "%s", msg);
    fclose(mf);
    free(msg);
    tensors_free(&weights);
    if (g)
        graph_free(g);
    free_data(&td);
    for (char *p = reason; *p; p++)
        if (*p == '\n' || *p == '\t')
            *p = ' ';
    /* paths inside the test's directory, relative to it */
    char prefix[4096];
    int pl = snprintf(prefix, sizeof prefix, "%s/%s/", dir, name);
    for (char *p; (p = strstr(reason, prefix));)
        memmove(p, p + pl, strlen(p + pl) + 1);
    return ok;
}

typedef struct {
    const char *dir;
    char *name;
} Test;

static int by_name(const void *a, const void *b) {
    return strcmp(((const Test *)a)->name, ((const Test *)b)->name);
}

int main(int argc, char **argv) {
    const char *write_to = NULL, *filter = NULL, *list = NULL;
    const char *dirs[16];
    int n_dirs = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--write-expected") == 0 && i + 1 < argc)
            write_to = argv[++i];
        else if (strcmp(argv[i], "--filter") == 0 && i + 1 < argc)
            filter = argv[++i];
        else if (strcmp(argv[i], "--targets") == 0 && i + 1 < argc) {
            const char *v = argv[++i];
            n_targets = 0;
            if (strstr(v, "c") == v || strstr(v, ",c"))
                targets[n_targets++] = TARGET_C;
            if (strstr(v, "cuda"))
                targets[n_targets++] = TARGET_CUDA;
        } else if (strcmp(argv[i], "-v") == 0)
            verbose = true;
        else if (!list)
            list = argv[i];
        else if (n_dirs < 16)
            dirs[n_dirs++] = argv[i];
    }
    if (!list || !n_dirs) {
        fprintf(stderr,
                "usage: %s [--write-expected FILE] [--filter S] [--targets c,cuda|c|cuda|none] [-v] EXPECTED "
                "DATA_DIR...\n",
                argv[0]);
        return 2;
    }
    if (read_expected(list))
        return 1;
    Test *tests = NULL;
    int n = 0, cap = 0;
    for (int k = 0; k < n_dirs; k++) {
        DIR *dp = opendir(dirs[k]);
        if (!dp) {
            fprintf(stderr, "cannot read the test data directory '%s' (Debian's libonnx-testdata)\n",
                    dirs[k]);
            return 1;
        }
        int first = n;
        for (struct dirent *e; (e = readdir(dp));) {
            if (strncmp(e->d_name, "test_", 5) != 0 || (filter && !strstr(e->d_name, filter)))
                continue;
            if (n == cap) {
                cap = cap ? 2 * cap : 1024;
                tests = realloc(tests, sizeof *tests * (size_t)cap);
            }
            tests[n++] = (Test){dirs[k], strdup(e->d_name)};
        }
        closedir(dp);
        qsort(tests + first, (size_t)(n - first), sizeof *tests, by_name);
    }
    FILE *out = write_to ? fopen(write_to, "w") : NULL;
    if (write_to && !out) {
        fprintf(stderr, "cannot write '%s'\n", write_to);
        return 1;
    }
    if (out)
        fprintf(out, "# ONNX backend tests (libonnx-testdata) expected to fail on kiln, with why.\n"
                     "# Written by onnx_conformance --write-expected; see docs/onnx.md.\n");
    int passed = 0, xfail = 0, unexpected_fail = 0, unexpected_pass = 0;
    time_t start = time(NULL);
    for (int i = 0; i < n; i++) {
        const char *name = tests[i].name;
        char reason[REASON] = "";
        bool ok = run_test(tests[i].dir, name, reason);
        Expected *e = find_expected(name);
        if (e)
            e->seen = true;
        if (ok && !e) {
            passed++;
            if (verbose)
                printf("PASS   %s\n", name);
        } else if (ok) {
            unexpected_pass++;
            printf("UNEXPECTED PASS  %s (listed as expected to fail: %s)\n", name, e->reason);
        } else if (e) {
            xfail++;
            if (verbose)
                printf("XFAIL  %s: %s\n", name, reason);
        } else {
            unexpected_fail++;
            printf("FAIL   %s: %s\n", name, reason);
        }
        if (out && !ok)
            fprintf(out, "%-60s %s\n", name, reason);
        fflush(stdout);
    }
    for (int i = 0; i < n_expected && !filter; i++)
        if (!expected[i].seen)
            printf("note: %s is listed but not in the test data\n", expected[i].name);
    if (out)
        fclose(out);
    printf("onnx conformance (%s): %d tests, %d pass, %d expected failures, %d unexpected failures, "
           "%d unexpected passes (%lds)\n",
           n_targets == 2 ? "interp, c and cuda"
           : n_targets    ? (targets[0] == TARGET_C ? "interp and c" : "interp and cuda")
                          : "interp",
           n, passed, xfail, unexpected_fail, unexpected_pass, (long)(time(NULL) - start));
    for (int i = 0; i < n; i++)
        free(tests[i].name);
    free(tests);
    free(expected);
    return unexpected_fail || unexpected_pass ? 1 : 0;
}
