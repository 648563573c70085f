/* Constant folding: computes at compile time what does not depend on the inputs.
 *
 * 1. An op node whose inputs are all known (consts, and params with a weight or an
 *    initializer: pass_known_value) is evaluated by the interpreter's reference
 *    kernel, the same code `kiln run --target interp` runs, so the value is the one
 *    the model would compute. Each result becomes a new param (named after the value,
 *    made fresh) and takes over the result's uses. The walk is in dependency order
 *    and later nodes see the new params, so whole chains fold in one pass: a weight
 *    transposed and reshaped is stored in its final form.
 * 2. A batch_norm whose input is a conv or conv_transpose (same layout) used by
 *    nothing else, with known conv weight and bias and known batch_norm params, is
 *    an affine map per output channel o applied to the conv's result:
 *    y = conv(x, w, b) * s[o] + (bias[o] - mean[o] * s[o]) with
 *    s = scale / sqrt(var + epsilon). Since conv is linear in w and b, that is
 *    conv(x, w', b') with w' = w * s[o] on the weights of output channel o and
 *    b' = (b - mean) * s + bias. The conv, with the new params, takes over the
 *    batch_norm's value, so the name stays. The factors are computed in double and
 *    rounded once, like the kernels.
 *
 * Not folded: ops without a reference kernel (grad); collectives (allreduce), whose value
 * the other processes decide; a
 * node whose result is a model output (the output keeps its name; its inputs still
 * fold); anything that depends on a value a grad differentiates with respect to (the
 * gradient needs that dependence) or on a param an update changes; and a result much larger than its inputs,
 * such as a small const broadcast against another into a big tensor, since the folded value is stored in the
 * model while the op costs little to compute, or one that would take long to evaluate (the limits are below).
 */
#include "passes.h"

#include <math.h>
#include <string.h>

/* A folded result may hold at most GROWTH times the elements of its inputs
 * together, or SMALL elements, whichever is more: reshapes, transposes, slices,
 * pads and concats of known values fold, expanding broadcasts do not. */
enum { GROWTH = 2, SMALL = 4096 };
/* The most multiply-adds a fold may cost in the reference kernels (a few seconds
 * at most), so that compiling stays fast: a product of small weights folds, a
 * product of two big weights is left to the compiled code. */
#define MAX_WORK (1 << 30)

typedef struct {
    PassContext *c;
    /* Values and weights before the pass. The pass makes one value and one weight
     * at a time (pass_add_param), so value n_values + k is weight n_weights + k. */
    int n_values, n_weights;
    bool *output;    /* [n_values] a model output */
    bool *wrt;       /* [n_values] a value some grad differentiates with respect to */
    bool *has_value; /* [n_values] a const, or a param with a weight or an initializer */
    int *rep;        /* [n_values] the param that replaced a folded value, or itself */
    bool *dead;      /* [nodes before a phase] */
} Fold;

static bool flagged(const Fold *f, const bool *flags, int v) {
    return v >= 0 && v < f->n_values && flags[v];
}

/* Whether the value of v is known at compile time (an absent input counts, and so
 * does every param the pass made). A param a training step updates is not. */
static bool known(const Fold *f, int v) {
    return v < 0 || v >= f->n_values || (f->has_value[v] && !f->wrt[v] && !graph_update_of(f->c->g, v));
}

/* The value of a known v in *out (NULL for an absent input); -1 after a diagnostic. */
static int value_of(const Fold *f, int v, Tensor **out) {
    *out = NULL;
    if (v < 0)
        return 0;
    if (v >= f->n_values) { /* found by position: a search by name would take long */
        const NamedTensor *w = &f->c->weights->items[f->n_weights + v - f->n_values];
        KILN_ASSERT(strcmp(w->name, f->c->g->values[v].name) == 0);
        *out = tensor_clone(w->tensor);
        return *out ? 0 : diag_error(f->c->d, (Loc){0}, "out of memory");
    }
    int rc = pass_known_value(f->c, v, out);
    KILN_ASSERT(rc != 0); /* known() said so */
    return rc < 0 ? -1 : 0;
}

/* Runs n's reference kernel on its known inputs into new tensors out[]. */
static int evaluate(const Fold *f, const Node *n, Tensor **out) {
    Graph *g = f->c->g;
    int lo, hi;
    op_arity(n->op, &lo, &hi);
    int n_args = hi > n->n_in ? hi : n->n_in; /* absent optional inputs are NULL */
    Tensor **in = ir_calloc((size_t)n_args + 1, sizeof *in);
    int rc = in ? 0 : diag_error(f->c->d, n->loc, "out of memory");
    for (int k = 0; !rc && k < n->n_in; k++)
        rc = value_of(f, n->in[k], &in[k]);
    for (int k = 0; !rc && k < n->n_out; k++)
        if (!(out[k] = tensor_new(&g->values[n->out[k]].type)))
            rc = diag_error(f->c->d, n->loc, "out of memory");
    if (!rc)
        rc = op_table[n->op].eval(n, (const Tensor *const *)in, out, f->c->d);
    for (int k = 0; in && k < n_args; k++)
        tensor_free(in[k]);
    ir_free(in);
    return rc;
}

/* About how many multiply-adds evaluating n takes: the contractions cost the
 * size of their result times the length of what each result element sums. */
static double work(const Graph *g, const Node *n, double out_numel) {
    const Type *a = &g->values[n->in[0]].type;
    const Type *b = n->n_in > 1 ? &g->values[n->in[1]].type : a;
    switch (n->op) {
    case OP_MATMUL:
    case OP_LINEAR: return out_numel * (double)a->dims[a->rank - 1];
    case OP_GEMM: return out_numel * (double)a->dims[node_bool(n, ATTR_TRANS_A) ? 0 : 1];
    case OP_CONV:
    case OP_CONV_TRANSPOSE: return out_numel * (double)type_numel(b) / (double)b->dims[0];
    default: return out_numel;
    }
}

/* Folds node i when it can; 0 also when it cannot. */
static int fold_node(Fold *f, int i) {
    Graph *g = f->c->g;
    Node *n = g->nodes[i];
    if (op_is_decl(n->op) || !op_table[n->op].eval || op_has(n->op, F_COLLECTIVE))
        return 0;
    double in_numel = 0, out_numel = 0;
    for (int k = 0; k < n->n_in; k++) {
        if (!known(f, n->in[k]))
            return 0;
        if (n->in[k] >= 0)
            in_numel += (double)type_numel(&g->values[n->in[k]].type);
    }
    for (int k = 0; k < n->n_out; k++) {
        if (flagged(f, f->output, n->out[k]) || flagged(f, f->wrt, n->out[k]))
            return 0;
        out_numel += (double)type_numel(&g->values[n->out[k]].type);
    }
    if ((out_numel > GROWTH * in_numel && out_numel > SMALL) || work(g, n, out_numel) > MAX_WORK)
        return 0;

    Tensor **out = ir_calloc((size_t)n->n_out + 1, sizeof *out);
    int rc = out ? evaluate(f, n, out) : diag_error(f->c->d, n->loc, "out of memory");
    for (int k = 0; k < n->n_out; k++) {
        if (!rc) {
            int old = n->out[k];
            int id = pass_add_param(f->c, g->values[old].name, out[k], n->loc);
            out[k] = NULL; /* owned by the weights now, even on failure */
            if (id < 0)
                rc = -1;
            else
                f->rep[old] = id; /* the uses move as the walk reaches them */
        }
        if (out)
            tensor_free(out[k]);
    }
    ir_free(out);
    f->dead[i] = !rc;
    return rc;
}

/* The output channel that element i of a conv or conv_transpose weight w feeds. */
static int64_t out_channel(const Node *conv, const Type *w, int64_t i) {
    int64_t numel = type_numel(w), first = w->dims[0]; /* O for conv, C for conv_transpose */
    if (conv->op == OP_CONV)
        return i / (numel / first);
    /* conv_transpose: [C, O/groups, k...] (nchw) or [C, k..., O/groups] (nhwc) */
    bool nhwc = node_enum(conv, ATTR_LAYOUT) == LAYOUT_NHWC;
    int64_t per_group = nhwc ? w->dims[w->rank - 1] : w->dims[1];
    int64_t inner = numel / (first * per_group); /* the kernel's spatial size */
    int64_t oc = nhwc ? i % per_group : i / inner % per_group;
    int64_t ci = i / (numel / first), in_per_group = first / node_int(conv, ATTR_GROUPS);
    return ci / in_per_group * per_group + oc;
}

/* Folds batch_norm node i into the conv that feeds it, when it can. */
static int fold_batch_norm(Fold *f, int i, const int *uses) {
    Graph *g = f->c->g;
    Node *bn = g->nodes[i];
    int x = bn->in[0];
    Node *conv = pass_definer(g, x);
    if (!conv || (conv->op != OP_CONV && conv->op != OP_CONV_TRANSPOSE) || uses[x] != 1 ||
        node_enum(conv, ATTR_LAYOUT) != node_enum(bn, ATTR_LAYOUT) || flagged(f, f->wrt, x) ||
        flagged(f, f->wrt, bn->out[0]))
        return 0;
    int b_in = conv->n_in > 2 ? conv->in[2] : -1;
    if (!known(f, conv->in[1]) || !known(f, b_in))
        return 0;
    for (int k = 1; k < 5; k++)
        if (!known(f, bn->in[k]))
            return 0;

    Tensor *w = NULL, *b = NULL, *p[5] = {NULL}, *w2 = NULL, *b2 = NULL;
    int rc = value_of(f, conv->in[1], &w) || value_of(f, b_in, &b);
    for (int k = 1; !rc && k < 5; k++)
        rc = value_of(f, bn->in[k], &p[k]);
    if (!rc) {
        int64_t channels = p[1]->type.dims[0];
        Type bt = type_make(1, p[1]->type.dims);
        w2 = tensor_new(&w->type);
        b2 = tensor_new(&bt);
        double *s = ir_malloc(sizeof *s * (size_t)channels);
        if (!w2 || !b2 || !s)
            rc = diag_error(f->c->d, bn->loc, "out of memory");
        double eps = node_float(bn, ATTR_EPSILON);
        for (int64_t o = 0; !rc && o < channels; o++) {
            s[o] = p[1]->data[o] / sqrt((double)p[4]->data[o] + eps);
            b2->data[o] = (float)(((b ? b->data[o] : 0.0) - p[3]->data[o]) * s[o] + p[2]->data[o]);
        }
        int64_t count = type_numel(&w->type);
        for (int64_t e = 0; !rc && e < count; e++)
            w2->data[e] = (float)(w->data[e] * s[out_channel(conv, &w->type, e)]);
        ir_free(s);
    }
    tensor_free(w), tensor_free(b);
    for (int k = 1; k < 5; k++)
        tensor_free(p[k]);
    if (rc) {
        tensor_free(w2), tensor_free(b2);
        return -1;
    }

    int b_name = b_in >= 0 ? b_in : bn->in[2];
    int wid = pass_add_param(f->c, g->values[conv->in[1]].name, w2, conv->loc);
    int bid = wid < 0 ? (tensor_free(b2), -1) : pass_add_param(f->c, g->values[b_name].name, b2, bn->loc);
    if (bid < 0)
        return -1;
    /* The conv itself, in its place, computes the batch_norm's value now; a conv
     * without a bias gets an input list with room for one. */
    if (conv->n_in < 3) {
        int *in = arena_alloc(&g->arena, sizeof *in * 3);
        if (!in)
            return diag_error(f->c->d, conv->loc, "out of memory");
        in[0] = conv->in[0];
        conv->in = in;
        conv->n_in = 3;
    }
    conv->in[1] = wid;
    conv->in[2] = bid;
    graph_redefine(g, bn->out[0], conv, 0);
    g->values[x].node = -1; /* nothing defines the conv's old value, and nothing uses it */
    f->dead[i] = true;
    return 0;
}

/* Points every use of a folded value at its param. */
static void replace_uses(Fold *f, int *v) {
    if (*v >= 0 && *v < f->n_values)
        *v = f->rep[*v];
}

static int setup(Fold *f) {
    Graph *g = f->c->g;
    size_t count = (size_t)g->n_values + 1;
    f->output = ir_calloc(count, sizeof *f->output);
    f->wrt = ir_calloc(count, sizeof *f->wrt);
    f->has_value = ir_calloc(count, sizeof *f->has_value);
    f->rep = ir_malloc(count * sizeof *f->rep);
    if (!f->output || !f->wrt || !f->has_value || !f->rep)
        return diag_error(f->c->d, (Loc){0}, "out of memory");
    for (int v = 0; v < g->n_values; v++)
        f->rep[v] = v;
    graph_mark_results(g, f->output);
    for (int i = 0; i < g->n_nodes; i++) {
        const Node *n = g->nodes[i];
        if (n->op == OP_GRAD)
            for (int k = 1; k < n->n_in; k++)
                f->wrt[n->in[k]] = true;
        if (n->op == OP_CONST || (n->op == OP_PARAM && n->init.kind != INIT_NONE))
            f->has_value[n->out[0]] = true;
    }
    for (int k = 0; k < f->c->weights->n; k++) {
        const Node *n = pass_definer(g, graph_find(g, f->c->weights->items[k].name));
        if (n && n->op == OP_PARAM)
            f->has_value[n->out[0]] = true;
    }
    return 0;
}

/* Removes the nodes a phase marked dead (none of the nodes it appended). */
static int remove_dead(Fold *f, int n_marked) {
    bool *dead = ir_calloc((size_t)f->c->g->n_nodes + 1, sizeof *dead);
    if (!dead)
        return diag_error(f->c->d, (Loc){0}, "out of memory");
    memcpy(dead, f->dead, sizeof *dead * (size_t)n_marked);
    graph_remove_nodes(f->c->g, dead);
    ir_free(dead);
    return 0;
}

int pass_fold(PassContext *c) {
    Graph *g = c->g;
    Fold f = {.c = c, .n_values = g->n_values, .n_weights = c->weights->n};
    int *uses = NULL, n_nodes = g->n_nodes;
    int rc = setup(&f);

    /* 1: ops on known values, in dependency order. Each node's inputs first move to
     * the params that replaced them, so that chains fold. */
    if (!rc && !(f.dead = ir_calloc((size_t)n_nodes + 1, sizeof *f.dead)))
        rc = diag_error(c->d, (Loc){0}, "out of memory");
    for (int i = 0; !rc && i < n_nodes; i++) {
        for (int k = 0; k < g->nodes[i]->n_in; k++)
            replace_uses(&f, &g->nodes[i]->in[k]);
        rc = fold_node(&f, i);
    }
    /* (a node out of dependency order may have used a value before it folded) */
    for (int i = 0; !rc && i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i]->n_in; k++)
            replace_uses(&f, &g->nodes[i]->in[k]);
    if (!rc)
        rc = remove_dead(&f, n_nodes);
    ir_free(f.dead);
    f.dead = NULL;

    /* 2: batch_norm into conv. */
    n_nodes = g->n_nodes;
    if (!rc && (!(f.dead = ir_calloc((size_t)n_nodes + 1, sizeof *f.dead)) ||
                !(uses = ir_malloc(sizeof *uses * ((size_t)g->n_values + 1)))))
        rc = diag_error(c->d, (Loc){0}, "out of memory");
    if (!rc)
        graph_count_uses(g, uses);
    for (int i = 0; !rc && i < n_nodes; i++)
        if (g->nodes[i]->op == OP_BATCH_NORM)
            rc = fold_batch_norm(&f, i, uses);
    if (!rc)
        rc = remove_dead(&f, n_nodes);

    ir_free(f.dead), ir_free(uses);
    ir_free(f.output), ir_free(f.wrt), ir_free(f.has_value), ir_free(f.rep);
    return rc;
}
