/* Every battery with a symbolic batch: the C target against the interpreter at two
 * sizes of the dim. Built a second time as test_symbolic_cuda, with TEST_TARGET the
 * CUDA target (emulated where there is no GPU).
 *
 * For each battery NAME of tests/ref (battery.h), each case (the statements after a
 * `# ` comment) has its first op's first input, an f32 param, and its other inputs
 * that are f32 params with the same first dim (attention's k, v and mask, a binary
 * op's other operand), made inputs `input X : f32[N, ...]` of the symbolic dim
 * `dim N <= 4` in place of that dim. A case whose op cannot take that (it mixes the
 * items: a reduction over dim 0, a softmax along it, a broadcast of the bound's
 * size) is an error of the parser naming its line; that case then makes only its
 * first input symbolic, then none, and the model is parsed again. The model then
 * runs the pass pipeline, is
 * compiled for the C target, and runs at N = 1 and N = 3 on pseudo-random inputs;
 * every output must match the interpreter's at that size within the project's
 * tolerance. At those sizes a compiled model runs only the rows its kernels declare
 * they need (kernel_follows), so a kernel that declares too few leaves rows of the
 * outputs unwritten, and one that reads another item's rows changes them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "battery.h"
#include "codegen/jit.h"
#include "passes/passes.h"

#ifndef TEST_TARGET
#define TEST_TARGET TARGET_C
#endif

enum { BOUND = 4, MAX_CASES = 512, MAX_INPUTS = 8, NAME_MAX = 128 };

/* The cases of a battery's text: where each starts, the params of its first op that
 * may take N (the first input's, and the others' whose first dim is the same), and
 * how many of them it makes symbolic now: all, then the first, then none. */
typedef struct {
    const char *start[MAX_CASES];
    char input[MAX_CASES][MAX_INPUTS][NAME_MAX];
    int n_inputs[MAX_CASES];
    int n;
} Cases;

/* The line in [from, to) that declares param name as an f32, or NULL. */
static const char *param_line(const char *from, const char *to, const char *name) {
    char prefix[NAME_MAX + 32];
    snprintf(prefix, sizeof prefix, "param %s : f32[", name);
    for (const char *line = from, *end; line < to && (end = strchr(line, '\n')); line = end + 1)
        if (strncmp(line, prefix, strlen(prefix)) == 0)
            return line;
    return NULL;
}

/* The first dim of an f32 param's line, as written ("" where there is none). */
static void first_dim(const char *line, char *dim, size_t cap) {
    const char *at = strchr(line, '[') + 1;
    size_t len = strcspn(at, ",]\n");
    snprintf(dim, cap, "%.*s", (int)(len < cap ? len : cap - 1), at);
}

/* The case's params that may take N: the inputs of its first op statement that are
 * f32 params with the first one's first dim, first input first. */
static void case_inputs(const char *from, const char *to, Cases *c, int k) {
    c->n_inputs[k] = 0;
    for (const char *line = from, *end; line < to && (end = strchr(line, '\n')); line = end + 1) {
        const char *eq = strstr(line, " = ");
        if (!eq || eq > end || strncmp(line, "param", 5) == 0 || line[0] == '#')
            continue;
        const char *arg = strchr(eq, '(');
        char first[64] = "";
        while (arg && arg < end && *arg != ')' && c->n_inputs[k] < MAX_INPUTS) {
            arg++;
            arg += strspn(arg, " ");
            size_t len = strcspn(arg, ",)");
            char name[NAME_MAX], dim[64];
            const char *decl = NULL;
            if (len < sizeof name && !memchr(arg, '=', len) && !memchr(arg, '[', len)) {
                snprintf(name, sizeof name, "%.*s", (int)len, arg);
                decl = param_line(from, to, name);
            }
            if (decl)
                first_dim(decl, dim, sizeof dim);
            bool again = false;
            for (int i = 0; decl && i < c->n_inputs[k]; i++)
                again = again || strcmp(c->input[k][i], name) == 0;
            if (decl && !again && (!c->n_inputs[k] || strcmp(dim, first) == 0)) {
                if (!c->n_inputs[k])
                    snprintf(first, sizeof first, "%s", dim);
                snprintf(c->input[k][c->n_inputs[k]++], NAME_MAX, "%s", name);
            } else if (!c->n_inputs[k]) {
                return; /* the first input is no f32 param: the case keeps its params */
            }
            arg += len;
        }
        return;
    }
}

static void find_cases(const char *text, Cases *c) {
    c->n = 0;
    for (const char *line = text; *line && c->n < MAX_CASES; line = strchr(line, '\n') + 1) {
        if (strncmp(line, "# ", 2) == 0)
            c->start[c->n++] = line;
        if (!strchr(line, '\n'))
            break;
    }
    for (int k = 0; k < c->n; k++)
        case_inputs(c->start[k], k + 1 < c->n ? c->start[k + 1] : text + strlen(text), c, k);
}

/* Whether line declares one of the params case k makes symbolic now. */
static bool made_symbolic(const Cases *c, int k, const char *line) {
    for (int i = 0; k >= 0 && i < c->n_inputs[k]; i++)
        if (param_line(line, strchr(line, '\n') + 1, c->input[k][i]))
            return true;
    return false;
}

/* The battery's text with each case's chosen params made symbolic inputs: into out. */
static void rewrite(const char *text, const Cases *c, char *out, size_t cap) {
    size_t len = 0;
    int k = -1;
    for (const char *line = text; *line; line = strchr(line, '\n') + 1) {
        while (k + 1 < c->n && c->start[k + 1] <= line)
            k++;
        int n = (int)strcspn(line, "\n");
        const char *dims = line[n] ? strchr(line, '[') : NULL;
        dims = dims ? dims + 1 + strcspn(dims + 1, ",]") : NULL;
        if (dims && dims - line < n && made_symbolic(c, k, line))
            len += (size_t)snprintf(out + len, cap - len, "input %.*s[N%.*s\n",
                                    (int)(strchr(line, '[') - line - 6), line + 6, (int)(n - (dims - line)),
                                    dims);
        else
            len += (size_t)snprintf(out + len, cap - len, "%.*s\n", n, line);
        if (strncmp(line, "model ", 6) == 0)
            len += (size_t)snprintf(out + len, cap - len, "dim N <= %d\n", BOUND);
        if (!line[n] || len >= cap)
            break;
    }
}

/* Parses src and expands grad (as battery_load does), or on an error returns NULL
 * with the line it names in *line. The graph points into src, which must outlive it. */
static Graph *parse_quietly(const SrcFile *src, TensorList *weights, int *line) {
    char msg[4096] = "";
    FILE *f = fmemopen(msg, sizeof msg - 1, "w");
    Diag d;
    diag_init(&d, f);
    Graph *g = parse_model(src, &d);
    PipelineOptions autodiff_only = {.level = 0, .lower = true, .verify = true};
    if (g && pipeline_run(g, weights, &autodiff_only, &d) != 0) {
        graph_free(g);
        g = NULL;
    }
    fclose(f);
    *line = 0;
    const char *at = strstr(msg, src->name);
    if (!g && at)
        sscanf(at + strlen(src->name), ":%d", line);
    return g;
}

/* The case of the battery's text that line `line` of its rewrite falls in (the
 * rewrite adds one line, the dim's, after `model`), or -1. */
static int case_of_line(const Cases *c, const char *text, int line) {
    const char *p = text;
    for (int i = 1; i < line - 1 && strchr(p, '\n'); i++)
        p = strchr(p, '\n') + 1;
    int k = -1;
    while (k + 1 < c->n && c->start[k + 1] <= p)
        k++;
    return k;
}

static void fill(Tensor *t, uint64_t seed) {
    uint64_t s = 0x9E3779B97F4A7C15ull * (seed + 1);
    for (int64_t i = 0; i < type_numel(&t->type); i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        t->data[i] = (float)((double)(s >> 40) / (double)(1 << 24) * 2.0 - 1.0);
    }
}

/* Runs g's compiled model m and the interpreter at size n; returns the mismatches. */
static long compare_at(const Battery *b, const Graph *g, const TensorList *weights, kiln_module *m,
                       int64_t n) {
    size_t slots = (size_t)g->n_values + 1;
    int *ids = calloc(slots, sizeof *ids), n_in = ids ? graph_inputs(g, ids, g->n_values) : 0;
    Tensor **in = calloc(slots, sizeof *in), **ref = calloc(slots, sizeof *ref),
           **got = calloc(slots, sizeof *got);
    const void **inputs = calloc(slots, sizeof *inputs);
    void **outputs = calloc(slots, sizeof *outputs);
    long bad = ids && in && ref && got && inputs && outputs ? 0 : -1;
    for (int i = 0; bad == 0 && i < n_in; i++) {
        Type t = type_at(&g->values[ids[i]].type, n);
        in[i] = tensor_new(&t);
        fill(in[i], (uint64_t)i);
        inputs[i] = in[i]->data;
    }
    for (int k = 0; bad == 0 && k < g->n_outputs; k++) {
        Type t = type_at(&g->values[g->outputs[k]].type, n);
        got[k] = tensor_new(&t);
        outputs[k] = got[k]->data;
    }
    Diag d;
    diag_init(&d, stdout);
    kiln_error err = {.message = ""};
    if (bad == 0 && interp_run(g, weights, (const Tensor *const *)in, ref, &d) != 0) {
        bad = -1;
    } else if (bad == 0 && kiln_run_sym(m, &n, inputs, outputs, &err) != 0) {
        printf("%s at N = %lld: %s\n", b->name, (long long)n, err.message);
        bad = -1;
    }
    for (int k = 0; bad >= 0 && k < g->n_outputs; k++) {
        CheckDiff diff;
        check_compare(got[k], ref[k], &diff);
        if (!diff.ok) {
            printf("%s at N = %lld: output '%s' differs at element %lld: got %.9g, expected %.9g\n", b->name,
                   (long long)n, g->values[g->outputs[k]].name, (long long)diff.index, diff.got, diff.want);
            bad++;
        }
    }
    for (size_t k = 0; in && ref && got && k < slots; k++) {
        tensor_free(in[k]);
        tensor_free(ref[k]);
        tensor_free(got[k]);
    }
    free(ids), free(in), free(ref), free(got), free(inputs), free(outputs);
    return bad;
}

static long check_symbolic(const Battery *b) {
    char path[4096], weights_path[4096];
    snprintf(path, sizeof path, "%s/%s.kiln", b->dir, b->name);
    snprintf(weights_path, sizeof weights_path, "%s/%s.safetensors", b->dir, b->name);
    Diag d;
    diag_init(&d, stdout);
    SrcFile *src = srcfile_read(path, &d);
    Cases *c = calloc(1, sizeof *c);
    size_t cap = src ? 2 * src->len + 4096 : 0;
    char *text = src ? malloc(cap) : NULL;
    TensorList weights = {0};
    SrcFile rewritten; /* the text the graph points into */
    Graph *g = NULL;
    kiln_module *m = NULL;
    kiln_error err = {.message = ""};
    long bad = -1;
    if (text && c && safetensors_read(weights_path, &weights, &d) == 0) {
        find_cases(src->text, c);
        for (int tries = 0; !g && tries <= 2 * c->n; tries++) {
            int line;
            rewrite(src->text, c, text, cap);
            rewritten = (SrcFile){path, text, strlen(text)};
            g = parse_quietly(&rewritten, &weights, &line);
            int k = g ? -1 : case_of_line(c, src->text, line);
            if (!g && (k < 0 || !c->n_inputs[k])) {
                printf("%s: line %d of the rewritten battery is an error no case explains\n", b->name, line);
                break;
            }
            if (!g) /* that case mixes the items: fewer of its params take N, or none */
                c->n_inputs[k] = c->n_inputs[k] > 1 ? 1 : 0;
        }
    }
    int symbolic = 0;
    for (int k = 0; c && k < c->n; k++)
        symbolic += c->n_inputs[k] != 0;
    PipelineOptions po = {.level = 2, .verify = true};
    JitOptions jo;
    if (g && pipeline_run(g, &weights, &po, &d) == 0 && jit_options_from(NULL, &jo, &d) == 0) {
        jo.target = TEST_TARGET;
        jo.memplan = true;
        m = jit_graph(g, &weights, &jo, &d, &err);
        if (!m)
            printf("%s: %s\n", b->name, err.message);
    }
    if (m) {
        printf("%s: %d of %d cases with N\n", b->name, symbolic, c->n);
        long at1 = compare_at(b, g, &weights, m, 1), at3 = at1 < 0 ? -1 : compare_at(b, g, &weights, m, 3);
        bad = at1 < 0 || at3 < 0 ? -1 : at1 + at3;
    }
    kiln_free(m);
    free(text);
    free(c);
    if (src)
        srcfile_free(src);
    tensors_free(&weights);
    if (g)
        graph_free(g);
    return bad;
}

static const BatterySuite suite = {TEST_TARGET == TARGET_C ? "symbolic" : "symbolic_cuda",
                                   "run with a symbolic batch", check_symbolic};

int main(int argc, char **argv) {
    return battery_main(argc, argv, &suite);
}
