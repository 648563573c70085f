/* The symbolic dim through shape inference.
 *
 * A model with a symbolic dim N (`dim N <= 64`) is one graph for every N from 1 to
 * the bound. Every type holds N at its bound, so shape inference, the passes, the
 * memory plan and lowering see the model at its largest; a run at a smaller N
 * computes a prefix of that. A value whose type has N has it in its first dim, as a
 * multiple (f32[N*4, 3]: rows 4i to 4i + 3 are item i's), so item i's part of the
 * value is one contiguous block, the same block at every N.
 *
 * A run at n < bound is the run at the bound cut to its first n items when every
 * op keeps the items apart: item i of each result depends only on item i of the
 * inputs that have N. infer_symbolic checks it for each node as inference reaches it:
 *   - the node is inferred again with N at 1: each result must be the same there as
 *     at the bound but for its first dim, which is the same multiple of N at both, or
 *     the same size (a result without N);
 *   - a node that reads N writes N: no result of it drops the items (a reduction over
 *     dim 0, a matmul contracting them);
 *   - an op other than a view (whose data does not move) keeps the multiple: a
 *     concat of two such inputs along dim 0 or a resize of dim 0 would interleave
 *     the items;
 *   - an op that works along one axis (softmax, layer_norm, cumsum, gather and
 *     gather_elements from an input with N, slice) does not work along dim 0, where the items are, nor does a
 *     pad, or a resize whose coordinates move at scale 1 (tf_half_pixel_for_nn reads
 *     item i + 1/2). */
#include "ops_impl.h"

#include <stdio.h>
#include <string.h>

/* The axis op n works along, when it is dim 0 of an input with N: the name of the
 * attribute that chose it, else NULL. */
static const char *works_along_items(const Graph *g, const Node *n) {
    const Type *x = &g->values[n->in[0]].type;
    switch (n->op) {
    case OP_SOFTMAX:
    case OP_LOG_SOFTMAX:
    case OP_LAYER_NORM:
    case OP_CUMSUM:
    case OP_ARGMAX:
    case OP_GATHER:
    case OP_GATHER_ELEMENTS: return x->sym && norm_axis(node_int(n, ATTR_AXIS), x->rank) == 0 ? "axis" : NULL;
    case OP_SLICE: {
        int64_t start[KILN_MAX_RANK], step[KILN_MAX_RANK];
        Type out = {0};
        Diag quiet;
        diag_init(&quiet, NULL);
        return x->sym && (slice_ranges(n, x, start, step, &out, &quiet) || start[0] != 0 || step[0] != 1)
                   ? "starts"
                   : NULL;
    }
    case OP_PAD: {
        int64_t pads[2 * KILN_MAX_RANK] = {0};
        node_ints(n, ATTR_PADS, pads, 2 * KILN_MAX_RANK, 2 * x->rank);
        return x->sym && (pads[0] || pads[x->rank]) ? "pads" : NULL;
    }
    case OP_RESIZE: { /* these two move dim 0's coordinates even at scale 1 */
        int mode = node_enum(n, ATTR_COORDINATE_TRANSFORMATION_MODE);
        return x->sym && (mode == COORD_TF_HALF_PIXEL_FOR_NN || mode == COORD_TF_CROP_AND_RESIZE)
                   ? "coordinate_transformation_mode"
                   : NULL;
    }
    default: return NULL;
    }
}

/* "N", or "N*4" for mult 4. */
static const char *sym_str(const char *sym, int64_t mult, char *buf, size_t n) {
    if (mult == 1)
        snprintf(buf, n, "%s", sym);
    else
        snprintf(buf, n, "%s*%lld", sym, (long long)mult);
    return buf;
}

/* Whether a and b have one rank and the same dims from dim `from` on. */
static bool same_dims_from(const Type *a, const Type *b, int from) {
    if (a->rank != b->rank || a->rank < from)
        return false;
    for (int i = from; i < a->rank; i++)
        if (a->dims[i] != b->dims[i])
            return false;
    return true;
}

/* Error: result k of n is not one type of N. */
static int not_following(const Graph *g, const Node *n, int k, const Type *at_bound, const Type *at_one,
                         Diag *d) {
    char a[160], b[160];
    const SymDim *s = &g->sym;
    return diag_error(
        d, n->loc, "%s '%s' does not keep %s in its first dim: it is %s at %s = %lld and %s at %s = 1",
        op_table[n->op].name, g->values[n->out[k]].name, s->name, type_str(at_bound, a, sizeof a), s->name,
        (long long)s->bound, type_str(at_one, b, sizeof b), s->name);
}

/* Infers n with every input of N at N = 1 into at_one (n_out types); the message of
 * a failure in why, and -2 when memory ran out (here or in the inference). */
static int infer_at_one(Graph *g, Node *n, Type *at_one, char *why, size_t why_len) {
    Type *saved = ir_malloc(sizeof *saved * ((size_t)n->n_in + (size_t)n->n_out + 1));
    if (!saved)
        return -2;
    Type *saved_out = saved + n->n_in;
    for (int i = 0; i < n->n_in; i++)
        if (n->in[i] >= 0)
            saved[i] = g->values[n->in[i]].type;
    for (int k = 0; k < n->n_out; k++)
        saved_out[k] = g->values[n->out[k]].type;
    for (int i = 0; i < n->n_in; i++)
        if (n->in[i] >= 0 && saved[i].sym)
            g->values[n->in[i]].type = type_at(&saved[i], 1);
    why[0] = 0;
    FILE *f = fmemopen(why, why_len, "w");
    Diag quiet;
    diag_init(&quiet, f);
    int rc = f ? op_table[n->op].infer(g, n, &quiet) : -2;
    if (rc == -1 && quiet.kind == DIAG_NO_MEMORY)
        rc = -2;
    if (f)
        fclose(f);
    for (int k = 0; k < n->n_out; k++) {
        at_one[k] = g->values[n->out[k]].type;
        g->values[n->out[k]].type = saved_out[k];
    }
    for (int i = n->n_in - 1; i >= 0; i--) /* in reverse: a value read twice gets its first copy back */
        if (n->in[i] >= 0)
            g->values[n->in[i]].type = saved[i];
    ir_free(saved);
    return rc;
}

int infer_symbolic(Graph *g, Node *n, Diag *d) {
    if (op_is_decl(n->op))
        return 0; /* its type is the one declared */
    const char *sym = NULL;
    int64_t mult = 0;
    for (int i = 0; i < n->n_in; i++)
        if (n->in[i] >= 0 && g->values[n->in[i]].type.sym) {
            const Type *t = &g->values[n->in[i]].type;
            char a[100], b[100];
            if (mult && t->sym_mult != mult && !op_has(n->op, F_VIEW))
                return diag_error(d, n->loc, "%s reads first dims of %s and %s: it would mix the items of %s",
                                  op_table[n->op].name, sym_str(t->sym, mult, a, sizeof a),
                                  sym_str(t->sym, t->sym_mult, b, sizeof b), t->sym);
            sym = t->sym;
            mult = t->sym_mult;
        }
    for (int k = 0; k < n->n_out; k++) {
        Type *t = &g->values[n->out[k]].type;
        t->sym = NULL;
        t->sym_mult = 0;
    }
    if (!sym)
        return 0;
    Type *at_one = ir_malloc(sizeof *at_one * (size_t)n->n_out);
    char why[512];
    int rc = at_one ? infer_at_one(g, n, at_one, why, sizeof why) : -2;
    if (rc == -2) {
        ir_free(at_one);
        return diag_error(d, n->loc, "out of memory");
    }
    if (rc) {
        char *msg = strstr(why, "error: ");
        diag_error(d, n->loc, "%s '%s' does not hold for every %s: at %s = 1, %.*s", op_table[n->op].name,
                   g->values[n->out[0]].name, sym, sym, (int)strcspn(msg ? msg + 7 : why, "\n"),
                   msg ? msg + 7 : why);
        ir_free(at_one);
        return -1;
    }
    bool any = false;
    for (int k = 0; k < n->n_out && !rc; k++) {
        Type *t = &g->values[n->out[k]].type;
        const Type *one = &at_one[k];
        if (same_dims_from(t, one, 0))
            continue; /* a result without N */
        if (!same_dims_from(t, one, 1) || one->dims[0] * g->sym.bound != t->dims[0]) {
            rc = not_following(g, n, k, t, one, d);
        } else if (!op_has(n->op, F_VIEW) && one->dims[0] != mult) {
            char a[100], b[100];
            rc = diag_error(d, n->loc,
                            "%s '%s' would mix the items of %s: its result's first dim is %s, its input's %s",
                            op_table[n->op].name, g->values[n->out[k]].name, sym,
                            sym_str(sym, one->dims[0], a, sizeof a), sym_str(sym, mult, b, sizeof b));
        } else {
            t->sym = sym;
            t->sym_mult = one->dims[0];
            any = true;
        }
    }
    ir_free(at_one);
    if (rc)
        return -1;
    if (!any)
        return diag_error(d, n->loc, "%s '%s' combines the items of %s: its result does not have %s",
                          op_table[n->op].name, g->values[n->out[0]].name, sym, sym);
    const char *attr = works_along_items(g, n);
    if (attr)
        return diag_error(d, n->loc, "%s '%s' works along dim 0, where the items of %s are (its %s)",
                          op_table[n->op].name, g->values[n->out[0]].name, sym, attr);
    return 0;
}
