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
        double a = tensor_double(got, i), b = tensor_double(want, i);
        bool exact = want->type.dtype != DT_F32; /* integers and bools, with no tolerance */
        if (exact ? tensor_int(got, i) == tensor_int(want, i) : (isnan(a) && isnan(b)) || a == b)
            continue;
        if (exact)
            diff->ok = false;
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
    free_tensors(k->want, k->n_outputs + k->n_updates);
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
        else if (!type_admits(&g->values[ids[i]].type, &in[i]->type, &(int64_t){0}))
            rc = diag_error(d, (Loc){0}, "check: input '%s' changed its type", name);
    }
    ir_free(ids);
    return rc;
}

/* The graph's outputs on the check's inputs, then its updates' values, in *out
 * (n_outputs + n_updates new tensors). */
static int run_graph(const Check *k, const Graph *g, const TensorList *w, Tensor ***out, Diag *d) {
    const Tensor **in = ir_calloc((size_t)graph_inputs(g, NULL, 0) + 1, sizeof *in);
    *out = ir_calloc((size_t)(g->n_outputs + g->n_updates) + 1, sizeof **out);
    int rc = in && *out ? 0 : diag_error(d, (Loc){0}, "out of memory");
    if (!rc)
        rc = check_bind_inputs(k, g, in, d);
    if (!rc)
        rc = interp_run_updates(g, w, in, *out, *out + g->n_outputs, d);
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
        k->n_updates = g->n_updates;
        if (run_graph(k, g, w, &k->want, d))
            rc = diag_error(d, (Loc){0}, "check: the interpreter cannot run the unoptimized model");
    }
    if (rc)
        check_free(k);
    return rc;
}

/* Compares result i (an output, or after them an update) with the reference;
 * its largest error goes into *worst. */
static int check_result(const Check *k, const Graph *g, int i, const Tensor *got, const char *what,
                        double *worst, Diag *d) {
    bool output = i < k->n_outputs;
    const char *kind = output ? "output" : "the new value of param";
    const char *name =
        output ? g->values[g->outputs[i]].name : g->values[g->updates[i - k->n_outputs].param].name;
    const Tensor *want = k->want[i];
    char ty[160], want_ty[160];
    if (!type_equal(&got->type, &want->type))
        return diag_error(d, (Loc){0}, "check: %s changed the type of %s '%s' from %s to %s", what, kind,
                          name, type_str(&want->type, want_ty, sizeof want_ty),
                          type_str(&got->type, ty, sizeof ty));
    CheckDiff diff;
    check_compare(got, want, &diff);
    if (!diff.ok) {
        char where[256];
        index_str(&got->type, diff.index, where, sizeof where);
        return diag_error(d, (Loc){0},
                          "check: %s changed %s '%s': largest error %.3g at %s (element %lld): "
                          "got %.9g, expected %.9g",
                          what, kind, name, diff.max_error, where, (long long)diff.index, diff.got,
                          diff.want);
    }
    if (diff.max_error > *worst)
        *worst = diff.max_error;
    return 0;
}

static int check_count(const Check *k, const Graph *g, const char *what, Diag *d) {
    if (g->n_outputs != k->n_outputs)
        return diag_error(d, (Loc){0}, "check: %s changed the number of outputs from %d to %d", what,
                          k->n_outputs, g->n_outputs);
    if (g->n_updates != k->n_updates)
        return diag_error(d, (Loc){0}, "check: %s changed the number of updates from %d to %d", what,
                          k->n_updates, g->n_updates);
    return 0;
}

int check_outputs(const Check *k, const Graph *g, Tensor *const *got, const char *name, const char *what,
                  Diag *d) {
    double worst = 0;
    if (check_count(k, g, what, d))
        return -1;
    for (int i = 0; i < k->n_outputs; i++)
        if (check_result(k, g, i, got[i], what, &worst, d))
            return -1;
    fprintf(d->out, "check: %s ok (max error %.2g)\n", name, worst);
    return 0;
}

int check_stage(Check *k, const Graph *g, const TensorList *w, const char *pass, Diag *d) {
    char what[128];
    snprintf(what, sizeof what, "pass '%s'", pass);
    if (check_count(k, g, what, d))
        return -1;
    Tensor **got;
    if (run_graph(k, g, w, &got, d))
        return diag_error(d, (Loc){0}, "check: the interpreter cannot run the model after %s", what);
    double worst = 0;
    int rc = 0;
    for (int i = 0; !rc && i < k->n_outputs + k->n_updates; i++)
        rc = check_result(k, g, i, got[i], what, &worst, d);
    if (!rc)
        fprintf(d->out, "check: %s ok (max error %.2g)\n", pass, worst);
    free_tensors(got, k->n_outputs + k->n_updates);
    return rc;
}
