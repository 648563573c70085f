/* --check: every pass is checked numerically as it runs.
 *
 * Before the first pass the reference interpreter runs the unoptimized graph on
 * the given inputs, or on deterministic random ones (uniform in [-1, 1], one seed
 * per input); its outputs are the reference. After every pass that changed the
 * graph, the interpreter runs the new graph, with the params the passes made, on
 * the same inputs, and each output is compared with the reference under cli.md's
 * tolerance |a - b| <= 1e-4 + 1e-4 |b| (NaN matching NaN). The first pass whose
 * outputs drift is an error naming the pass, the output, the largest error and its
 * index; otherwise each pass gets a one-line summary on stderr. Inputs are matched
 * by name, so a pass may reorder declarations without confusing the check. */
#include "passes.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Seeds of the random inputs: input i gets CHECK_SEED + i. */
enum { CHECK_SEED = 20260101 };

void check_compare(const Tensor *got, const Tensor *want, CheckDiff *diff) {
    *diff = (CheckDiff){0, -1, 0, 0, true};
    int64_t n = type_numel(&want->type);
    for (int64_t i = 0; i < n; i++) {
        double a = got->data[i], b = want->data[i];
        if ((isnan(a) && isnan(b)) || a == b)
            continue;
        /* NaN against a number, or infinities of opposite sign, is the worst error */
        double err = fabs(a - b);
        if (isnan(err))
            err = INFINITY;
        if (!(err <= 1e-4 + 1e-4 * fabs(b)))
            diff->ok = false;
        if (diff->index < 0 || err > diff->max_error) {
            diff->max_error = err;
            diff->index = i;
            diff->got = a;
            diff->want = b;
        }
    }
}

/* "[0, 3, 1]": the multi-index of flat index i in type t. */
static void index_str(const Type *t, int64_t i, char *buf, size_t cap) {
    int64_t idx[KILN_MAX_RANK];
    for (int k = t->rank - 1; k >= 0; k--) {
        idx[k] = i % t->dims[k];
        i /= t->dims[k];
    }
    size_t len = (size_t)snprintf(buf, cap, "[");
    for (int k = 0; k < t->rank && len < cap; k++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%lld", k ? ", " : "", (long long)idx[k]);
    if (len < cap)
        snprintf(buf + len, cap - len, "]");
}

static void free_tensors(Tensor **t, int n) {
    for (int i = 0; t && i < n; i++)
        tensor_free(t[i]);
    ir_free(t);
}

void check_free(Check *k) {
    free_tensors(k->inputs, k->n_inputs);
    free_tensors(k->want, k->n_outputs);
    ir_free(k->input_names);
    *k = (Check){0};
}

int check_bind_inputs(const Check *k, const Graph *g, const Tensor **in, Diag *d) {
    int n_in = graph_inputs(g, NULL, 0);
    int *ids = ir_calloc((size_t)n_in + 1, sizeof *ids);
    if (!ids)
        return diag_error(d, (Loc){0}, "out of memory");
    graph_inputs(g, ids, n_in);
    int rc = 0;
    for (int i = 0; !rc && i < n_in; i++) {
        const char *name = g->values[ids[i]].name;
        in[i] = NULL;
        for (int j = 0; j < k->n_inputs && !in[i]; j++)
            if (strcmp(k->input_names[j], name) == 0)
                in[i] = k->inputs[j];
        if (!in[i])
            rc = diag_error(d, (Loc){0}, "check: input '%s' is not an input of the unoptimized model", name);
        else if (!type_equal(&in[i]->type, &g->values[ids[i]].type))
            rc = diag_error(d, (Loc){0}, "check: input '%s' changed its type", name);
    }
    ir_free(ids);
    return rc;
}

/* The graph's outputs on the check's inputs, in *out (n_outputs new tensors). */
static int run_graph(const Check *k, const Graph *g, const TensorList *w, Tensor ***out, Diag *d) {
    const Tensor **in = ir_calloc((size_t)graph_inputs(g, NULL, 0) + 1, sizeof *in);
    *out = ir_calloc((size_t)g->n_outputs + 1, sizeof **out);
    int rc = in && *out ? 0 : diag_error(d, (Loc){0}, "out of memory");
    if (!rc)
        rc = check_bind_inputs(k, g, in, d);
    if (!rc)
        rc = interp_run(g, w, in, *out, d);
    ir_free(in);
    if (rc) {
        ir_free(*out);
        *out = NULL;
    }
    return rc;
}

int check_begin(Check *k, const Graph *g, const TensorList *w, const Tensor *const *given, Diag *d) {
    *k = (Check){0};
    k->n_inputs = graph_inputs(g, NULL, 0);
    int *ids = ir_calloc((size_t)k->n_inputs + 1, sizeof *ids);
    k->inputs = ir_calloc((size_t)k->n_inputs + 1, sizeof *k->inputs);
    k->input_names = ir_calloc((size_t)k->n_inputs + 1, sizeof *k->input_names);
    int rc = ids && k->inputs && k->input_names ? 0 : diag_error(d, (Loc){0}, "out of memory");
    if (!rc)
        graph_inputs(g, ids, k->n_inputs);
    for (int i = 0; !rc && i < k->n_inputs; i++) {
        const Value *v = &g->values[ids[i]];
        k->input_names[i] = v->name; /* from the graph's arena, which outlives the check */
        k->inputs[i] = given ? tensor_clone(given[i]) : tensor_new(&v->type);
        if (!k->inputs[i])
            rc = diag_error(d, (Loc){0}, "out of memory");
        else if (!given)
            param_init_fill(&(ParamInit){INIT_UNIFORM, -1, 1, (uint64_t)CHECK_SEED + (uint64_t)i},
                            k->inputs[i]);
    }
    ir_free(ids);
    if (!rc) {
        k->n_outputs = g->n_outputs;
        if (run_graph(k, g, w, &k->want, d))
            rc = diag_error(d, (Loc){0}, "check: the interpreter cannot run the unoptimized model");
    }
    if (rc)
        check_free(k);
    return rc;
}

int check_outputs(const Check *k, const Graph *g, Tensor *const *got, const char *name, const char *what,
                  Diag *d) {
    if (g->n_outputs != k->n_outputs)
        return diag_error(d, (Loc){0}, "check: %s changed the number of outputs from %d to %d", what,
                          k->n_outputs, g->n_outputs);
    double worst = 0;
    for (int i = 0; i < k->n_outputs; i++) {
        const char *out = g->values[g->outputs[i]].name;
        char ty[160], want_ty[160];
        if (!type_equal(&got[i]->type, &k->want[i]->type))
            return diag_error(d, (Loc){0}, "check: %s changed the type of output '%s' from %s to %s", what,
                              out, type_str(&k->want[i]->type, want_ty, sizeof want_ty),
                              type_str(&got[i]->type, ty, sizeof ty));
        CheckDiff diff;
        check_compare(got[i], k->want[i], &diff);
        if (!diff.ok) {
            char where[256];
            index_str(&got[i]->type, diff.index, where, sizeof where);
            return diag_error(d, (Loc){0},
                              "check: %s changed output '%s': largest error %.3g at %s (element %lld): "
                              "got %.9g, expected %.9g",
                              what, out, diff.max_error, where, (long long)diff.index, diff.got, diff.want);
        }
        if (diff.max_error > worst)
            worst = diff.max_error;
    }
    fprintf(d->out, "check: %s ok (max error %.2g)\n", name, worst);
    return 0;
}

int check_stage(Check *k, const Graph *g, const TensorList *w, const char *pass, Diag *d) {
    char what[128];
    snprintf(what, sizeof what, "pass '%s'", pass);
    if (g->n_outputs != k->n_outputs)
        return diag_error(d, (Loc){0}, "check: %s changed the number of outputs from %d to %d", what,
                          k->n_outputs, g->n_outputs);
    Tensor **got;
    if (run_graph(k, g, w, &got, d))
        return diag_error(d, (Loc){0}, "check: the interpreter cannot run the model after %s", what);
    int rc = check_outputs(k, g, got, pass, what, d);
    free_tensors(got, k->n_outputs);
    return rc;
}
