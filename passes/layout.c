/* Layout: NCHW to NHWC. Convolutions, pools and batch_norm computed with channels
 * last, and the elementwise ops and resizes between them with them, with a
 * transpose only where a value crosses between the layouts.
 *
 * Walking the nodes in order, the pass keeps for each value v of the old graph the
 * value holding the same data channels last, when there is one (nhwc[v]). A conv or
 * conv_transpose with layout=nchw becomes the same op with layout=nhwc on
 * nhwc[x] (made with a transpose when x has none yet) and on its weight transposed
 * to [O, k..., I/groups] (a transpose of a param, which constant folding computes
 * at compile time, made once per weight); a pool or batch_norm does so only when
 * its input is channels last already, since for it alone the transposes would cost
 * more than they save. So do the gradient ops of a training step's backward pass,
 * max_pool_grad, avg_pool_grad (dy and x) and conv_weight_grad (x and dy; the
 * weight gradient comes out [O, k..., I/groups] and goes back by a transpose), when
 * either input is. An elementwise op (unary_grad included), or a resize or expand
 * (with its per-dim attributes permuted), whose
 * inputs are each channels last or small enough to transpose cheaply (a per-channel
 * [C, 1, 1] operand, reshaped to the rank and transposed; a scalar stays) moves to
 * channels last too, and so does a reduction of a channels-last value
 * (move_reduction). The old value v then becomes transpose(nhwc[v]) back to NCHW,
 * keeping its name and id (a reshape when only dims of size 1 move): every reader
 * not converted, and the outputs, read it as before; the transposes back that
 * nobody reads are dropped. A transpose of a transpose, the user's or one back from
 * a twin, becomes one transpose of the first one's input, or an identity when they
 * cancel.
 *
 * Why it is correct: each rewritten op computes on the same elements in another
 * order (the nhwc layout attribute, or a permuted resize, is defined as the
 * original op on transposed operands), and every old value is either unchanged or
 * recomputed as the inverse transpose of its channels-last twin, which holds the
 * same numbers. Broadcasting is preserved because the same permutation is applied
 * to every operand after aligning ranks. */
#include "passes.h"

#include "../ir/ops_impl.h"

#include <string.h>

typedef struct {
    PassContext *c;
    int *nhwc;   /* per value of the old graph: its channels-last twin, or -1 */
    bool *dead;  /* per node of the old graph */
    int *weight; /* per value of the old graph: its transpose as a conv weight, or -1 */
    bool twins;  /* some value has a channels-last twin already */
} Layout;

/* The permutation taking [N, C, s...] to [N, s..., C] (back: its inverse). */
static int perm_of(int rank, bool back, int64_t *perm) {
    for (int k = 0; k < rank; k++)
        perm[k] = k;
    for (int k = 1; k < rank; k++)
        perm[k] = back ? (k == 1 ? rank - 1 : k - 1) : (k == rank - 1 ? 1 : k + 1);
    return rank;
}

/* Whether permuting t by perm keeps its elements in memory order: only dims of size
 * 1 move (a [1, C, 1, 1] value, a global pool's result). */
static bool keeps_order(const Type *t, const int64_t *perm) {
    int64_t last = -1;
    for (int k = 0; k < t->rank; k++)
        if (t->dims[perm[k]] != 1) {
            if (perm[k] < last)
                return false;
            last = perm[k];
        }
    return true;
}

/* transpose(v) to channels last (a reshape when that keeps the memory order),
 * named after value `name_of`. */
static int transpose_node(Layout *l, int v, int name_of, Loc loc) {
    Graph *g = l->c->g;
    const Type *t = &g->values[v].type;
    int64_t perm[KILN_MAX_RANK], dims[KILN_MAX_RANK];
    int rank = perm_of(t->rank, false, perm);
    for (int k = 0; k < rank; k++)
        dims[k] = t->dims[perm[k]];
    bool view = keeps_order(t, perm);
    bool sym = t->sym != NULL; /* t moves when the node's result grows the values */
    char base[256];
    snprintf(base, sizeof base, "%s.nhwc", g->values[name_of].name);
    Node *n = pass_new_node(l->c, view ? OP_RESHAPE : OP_TRANSPOSE, 1, &v, base, loc);
    if (!n ||
        (view ? pass_set_shape(l->c, n, dims, rank, sym) : pass_set_ints(l->c, n, ATTR_PERM, perm, rank)))
        return -1;
    return pass_finish(l->c, n);
}

/* The channels-last twin of activation v, made when it has none. */
static int to_nhwc(Layout *l, int v, Loc loc) {
    if (l->nhwc[v] < 0)
        l->nhwc[v] = transpose_node(l, v, v, loc);
    return l->nhwc[v];
}

/* Operand v of an op whose result has rank `rank`, channels last: a scalar as it
 * is, a smaller operand aligned to the rank (leading 1s) and transposed, or just
 * reshaped when only dims of size 1 move (a per-channel [C, 1, 1]). */
static int operand_nhwc(Layout *l, int v, int rank, Loc loc) {
    Graph *g = l->c->g;
    const Type *t = &g->values[v].type;
    if (l->nhwc[v] >= 0 || type_numel(t) == 1)
        return l->nhwc[v] >= 0 ? l->nhwc[v] : v;
    int64_t aligned[KILN_MAX_RANK], perm[KILN_MAX_RANK], dims[KILN_MAX_RANK];
    for (int k = 0; k < rank; k++)
        aligned[k] = k < rank - t->rank ? 1 : t->dims[k - (rank - t->rank)];
    perm_of(rank, false, perm);
    for (int k = 0; k < rank; k++)
        dims[k] = aligned[perm[k]];
    Type at = type_make(rank, aligned);
    bool view = keeps_order(&at, perm);
    bool sym = t->sym != NULL; /* t moves when the reshape's result grows the values */
    if (!view && t->rank == rank)
        return transpose_node(l, v, v, loc);
    char base[256];
    snprintf(base, sizeof base, "%s.%s", g->values[v].name, view ? "nhwc" : "aligned");
    Node *r = pass_new_node(l->c, OP_RESHAPE, 1, &v, base, loc);
    int x;
    if (!r || pass_set_shape(l->c, r, view ? dims : aligned, rank, sym) || (x = pass_finish(l->c, r)) < 0)
        return -1;
    return view ? x : transpose_node(l, x, v, loc);
}

/* Replaces node i by its channels-last version, whose result is y_nhwc: the old
 * result becomes the transpose of y_nhwc back to NCHW (a reshape, which costs
 * nothing, when that keeps the memory order). */
static int take_over(Layout *l, int i, int y_nhwc) {
    Graph *g = l->c->g;
    Node *n = g->nodes[i];
    int y = n->out[0];
    const Type *t = &g->values[y_nhwc].type;
    int64_t perm[KILN_MAX_RANK];
    int rank = perm_of(t->rank, true, perm);
    bool view = keeps_order(t, perm), sym = t->sym != NULL;
    Node *back = graph_add_node(g, view ? OP_RESHAPE : OP_TRANSPOSE, 1, 1, n->loc);
    if (!back)
        return diag_error(l->c->d, n->loc, "out of memory");
    back->in[0] = y_nhwc;
    if (view ? pass_set_shape(l->c, back, g->values[y].type.dims, rank, sym)
             : pass_set_ints(l->c, back, ATTR_PERM, perm, rank))
        return -1;
    graph_redefine(g, y, back, 0);
    if (pass_finish(l->c, back) < 0)
        return -1;
    l->nhwc[y] = y_nhwc;
    l->twins = true;
    l->dead[i] = true;
    return 0;
}

/* A copy of node n's op on new inputs, with n's attributes. */
static Node *twin(Layout *l, const Node *n, const int *in) {
    Graph *g = l->c->g;
    char base[256];
    snprintf(base, sizeof base, "%s.nhwc", g->values[n->out[0]].name);
    Node *m = pass_new_node(l->c, n->op, n->n_in, in, base, n->loc);
    if (m)
        memcpy(m->attrs, n->attrs, sizeof *m->attrs * (size_t)op_table[n->op].n_attrs);
    return m;
}

static bool has_nchw_layout(const Node *n) {
    int a = op_attr_index(n->op, ATTR_LAYOUT);
    return a >= 0 && node_enum(n, ATTR_LAYOUT) == LAYOUT_NCHW;
}

/* The ops with a layout attribute (F_LAYOUT): conv, conv_transpose, pools,
 * batch_norm, and the gradient ops of pools and of conv's weight, whose every input
 * is an activation. */
static int convert_layout_op(Layout *l, int i) {
    Node *n = l->c->g->nodes[i];
    int in[5];
    KILN_ASSERT(n->n_in <= 5);
    memcpy(in, n->in, sizeof *in * (size_t)n->n_in);
    bool two_activations = op_has(n->op, F_GRAD_OP);
    if ((in[0] = to_nhwc(l, n->in[0], n->loc)) < 0 ||
        (two_activations && (in[1] = to_nhwc(l, n->in[1], n->loc)) < 0))
        return -1;
    /* one transpose per weight, however many convs read it (a training step's
       forward conv and the conv_transpose of its backward pass) */
    if ((n->op == OP_CONV || n->op == OP_CONV_TRANSPOSE) && l->weight[n->in[1]] < 0 &&
        (l->weight[n->in[1]] = transpose_node(l, n->in[1], n->in[1], n->loc)) < 0)
        return -1;
    if (n->op == OP_CONV || n->op == OP_CONV_TRANSPOSE)
        in[1] = l->weight[n->in[1]];
    Node *m = twin(l, n, in);
    if (!m)
        return -1;
    pass_set_enum(m, ATTR_LAYOUT, LAYOUT_NHWC);
    int y = pass_finish(l->c, m);
    return y < 0 ? -1 : take_over(l, i, y);
}

/* resize's per-dim attributes, or expand's shape, in channels-last order. */
static int permute_lists(Layout *l, Node *m, int rank) {
    int64_t perm[KILN_MAX_RANK];
    perm_of(rank, false, perm);
    if (m->op == OP_EXPAND) {
        const Attr *shape = node_attr(m, ATTR_SHAPE);
        int64_t dims[KILN_MAX_RANK];
        for (int k = 0; k < rank; k++)
            dims[k] = shape->ints[perm[k]];
        return pass_set_ints(l->c, m, ATTR_SHAPE, dims, rank);
    }
    const AttrId lists[] = {ATTR_SIZES, ATTR_SCALES, ATTR_ROI};
    for (int a = 0; a < 3; a++) {
        Attr *at = &m->attrs[op_attr_index(OP_RESIZE, lists[a])];
        if (!at->set)
            continue;
        int64_t *ints = at->ints ? arena_alloc(&l->c->g->arena, sizeof *ints * (size_t)at->n) : NULL;
        double *floats = at->floats ? arena_alloc(&l->c->g->arena, sizeof *floats * (size_t)at->n) : NULL;
        if ((at->ints && !ints) || (at->floats && !floats))
            return diag_error(l->c->d, m->loc, "out of memory");
        for (int k = 0; k < at->n; k++) { /* roi: starts, then ends */
            int from = (int)perm[k % rank] + (k >= rank ? rank : 0);
            if (ints)
                ints[k] = at->ints[from];
            if (floats)
                floats[k] = at->floats[from];
        }
        at->ints = ints, at->floats = floats;
    }
    return 0;
}

/* Whether an elementwise op, resize or expand can follow its channels-last inputs:
 * one of them has a twin, and each other one has too or is smaller than the result.
 * An expand of a smaller input moves once the graph has twins, twin or not: a
 * training step's backward pass starts from one (the gradient of a global pool, of
 * a batch norm's statistics), and the elementwise ops after it then move too. */
static bool movable(const Layout *l, const Node *n) {
    const Graph *g = l->c->g;
    if (!op_has(n->op, F_LAYOUT_FREE))
        return false;
    const Type *y = &g->values[n->out[0]].type;
    bool any = false;
    for (int k = 0; k < n->n_in; k++) {
        int v = n->in[k];
        any = any || l->nhwc[v] >= 0;
        if (l->nhwc[v] < 0 && type_numel(&g->values[v].type) >= type_numel(y))
            return false;
    }
    return (any || (n->op == OP_EXPAND && l->twins)) && y->rank >= 3;
}

static int move_op(Layout *l, int i) {
    Node *n = l->c->g->nodes[i];
    int rank = l->c->g->values[n->out[0]].type.rank;
    int in[8];
    KILN_ASSERT(n->n_in <= 8);
    for (int k = 0; k < n->n_in; k++)
        if ((in[k] = operand_nhwc(l, n->in[k], rank, n->loc)) < 0)
            return -1;
    Node *m = twin(l, n, in);
    if (!m || ((n->op == OP_RESIZE || n->op == OP_EXPAND) && permute_lists(l, m, rank)))
        return -1;
    int y = pass_finish(l->c, m);
    return y < 0 ? -1 : take_over(l, i, y);
}

/* Where dim d of an NCHW value of rank `rank` is in its channels-last twin. */
static int nhwc_position(int d, int rank) {
    return d == 0 ? 0 : d == 1 ? rank - 1 : d - 1;
}

/* A reduction (sum, mean, reduce_max) of a value with a channels-last twin reduces
 * the twin over the same dims, renumbered, instead of a transpose of it: a batch
 * norm's statistics in a training step. With keepdims, its result is channels last
 * and comes back to NCHW as any twin's (by a reshape where only dims of size 1
 * move: a [1, C, 1, 1] mean); without, it is the old result itself when the dims
 * kept keep their order (the channels are reduced, or every spatial dim is), and
 * then takes its place. 0 also when the reduction stays as it is. */
static int move_reduction(Layout *l, int i) {
    Graph *g = l->c->g;
    Node *n = g->nodes[i];
    const Type *x = &g->values[n->in[0]].type;
    bool reduced[KILN_MAX_RANK], keep = node_bool(n, ATTR_KEEPDIMS), ordered = true;
    if (reduce_axes(n, x, reduced, l->c->d))
        return -1;
    int64_t axes[KILN_MAX_RANK];
    int n_axes = 0, last_kept = -1;
    for (int d = 0; d < x->rank; d++) { /* the positions, in order: 0, then 2.., then 1 */
        int at = nhwc_position(d, x->rank);
        if (!reduced[d]) {
            ordered = ordered && at > last_kept;
            last_kept = at;
        }
    }
    for (int at = 0; at < x->rank; at++)
        for (int d = 0; d < x->rank; d++)
            if (reduced[d] && nhwc_position(d, x->rank) == at)
                axes[n_axes++] = at;
    if (!keep && !ordered)
        return 0;
    Node *m = twin(l, n, (int[]){l->nhwc[n->in[0]]});
    if (!m || pass_set_ints(l->c, m, ATTR_AXES, axes, n_axes))
        return -1;
    int y = pass_finish(l->c, m);
    if (y < 0)
        return -1;
    if (keep)
        return take_over(l, i, y);
    Node *same = graph_add_node(g, OP_IDENTITY, 1, 1, n->loc);
    if (!same)
        return diag_error(l->c->d, n->loc, "out of memory");
    same->in[0] = y;
    graph_redefine(g, n->out[0], same, 0);
    l->dead[i] = true;
    return pass_finish(l->c, same) < 0 ? -1 : 0;
}

static bool is_reduction(OpId op) {
    return op == OP_SUM || op == OP_MEAN || op == OP_REDUCE_MAX;
}

/* transpose's perm, reversed dims when not written. */
static void perm_attr(const Node *t, int rank, int64_t *perm) {
    const Attr *a = node_attr(t, ATTR_PERM);
    for (int k = 0; k < rank; k++)
        perm[k] = a->set ? a->ints[k] : rank - 1 - k;
}

/* A transpose of a transpose (one the user wrote, or the one back from a twin) is
 * one transpose of the first one's input, or, when the two cancel, that input
 * itself (an identity, which costs nothing). */
static int collapse_transposes(Layout *l, int i) {
    Graph *g = l->c->g;
    Node *n = g->nodes[i];
    int v = n->in[0], rank = g->values[v].type.rank, src;
    int64_t first[KILN_MAX_RANK], second[KILN_MAX_RANK], perm[KILN_MAX_RANK];
    if (l->nhwc[v] >= 0) {
        src = l->nhwc[v];
        perm_of(rank, true, first);
    } else {
        const Node *t = pass_definer(g, v);
        if (!t || t->op != OP_TRANSPOSE || l->dead[g->values[v].node])
            return 0;
        src = t->in[0];
        perm_attr(t, rank, first);
    }
    perm_attr(n, rank, second);
    bool identity = true;
    for (int k = 0; k < rank; k++) {
        perm[k] = first[second[k]];
        identity = identity && perm[k] == k;
    }
    int y = n->out[0];
    Node *m = graph_add_node(g, identity ? OP_IDENTITY : OP_TRANSPOSE, 1, 1, n->loc);
    if (!m)
        return diag_error(l->c->d, n->loc, "out of memory");
    m->in[0] = src;
    if (!identity && pass_set_ints(l->c, m, ATTR_PERM, perm, rank))
        return -1;
    graph_redefine(g, y, m, 0);
    l->dead[i] = true;
    return pass_finish(l->c, m) < 0 ? -1 : 0;
}

int pass_layout(PassContext *c) {
    Graph *g = c->g;
    int n_nodes = g->n_nodes, n_values = g->n_values;
    Layout l = {c, ir_malloc(sizeof(int) * (size_t)(g->n_values + 1)), ir_calloc((size_t)n_nodes + 1, 1),
                ir_malloc(sizeof(int) * (size_t)(g->n_values + 1)), false};
    int rc = l.nhwc && l.dead && l.weight ? 0 : diag_error(c->d, (Loc){0}, "out of memory");
    for (int v = 0; rc == 0 && v < g->n_values; v++)
        l.nhwc[v] = l.weight[v] = -1;
    for (int i = 0; rc == 0 && i < n_nodes; i++) {
        Node *n = g->nodes[i];
        int rank = n->n_in > 0 && n->in[0] >= 0 ? g->values[n->in[0]].type.rank : 0;
        bool conv = n->op == OP_CONV || n->op == OP_CONV_TRANSPOSE;
        bool layout_op = op_has(n->op, F_LAYOUT), grad_op = op_has(n->op, F_LAYOUT | F_GRAD_OP);
        bool twin_in = l.nhwc[n->in[0]] >= 0 || (grad_op && l.nhwc[n->in[1]] >= 0);
        if (layout_op && has_nchw_layout(n) && rank >= 3 && (conv || twin_in))
            rc = convert_layout_op(&l, i);
        else if (movable(&l, n))
            rc = move_op(&l, i);
        else if (is_reduction(n->op) && rank >= 3 && l.nhwc[n->in[0]] >= 0)
            rc = move_reduction(&l, i);
        else if (n->op == OP_TRANSPOSE)
            rc = collapse_transposes(&l, i);
    }
    bool *dead = rc == 0 ? ir_calloc((size_t)g->n_nodes + 1, 1) : NULL;
    int *uses = dead ? ir_calloc((size_t)g->n_values + 1, sizeof *uses) : NULL;
    if (rc == 0 && !uses)
        rc = diag_error(c->d, (Loc){0}, "out of memory");
    if (rc == 0) {
        memcpy(dead, l.dead, (size_t)n_nodes);
        graph_remove_nodes(g, dead);
        /* The transposes back that nothing reads go too, so that the passes after
           this one see each channels-last value with its real readers only. */
        memset(dead, 0, (size_t)g->n_nodes);
        graph_count_uses(g, uses);
        for (int v = 0; v < n_values; v++)
            if (l.nhwc[v] >= 0 && uses[v] == 0 && g->values[v].node >= 0 &&
                g->nodes[g->values[v].node]->in[0] == l.nhwc[v])
                dead[g->values[v].node] = true;
        graph_remove_nodes(g, dead);
        if (graph_sort(g))
            rc = diag_error(c->d, (Loc){0}, "out of memory");
    }
    ir_free(l.nhwc), ir_free(l.dead), ir_free(l.weight), ir_free(dead), ir_free(uses);
    return rc;
}
