/* Autodiff: replaces every `g1, ..., gk = grad(y, x1, ..., xk)` by the backward
 * graph, reverse-mode.
 *
 * The values that matter are those that depend on some xi and on which y depends;
 * only their adjoints are built, so no gradient nobody asks for is computed. The
 * adjoint of y is 1; walking the nodes backwards from the grad (dependency order
 * means every use of a value is visited before its definition), each node with an
 * adjoint adds its inputs' contributions, summed when a value has several uses and
 * summed back to an operand's shape where it was broadcast. Each gi then takes over
 * the node computing xi's adjoint (a zero tensor when y does not depend on xi), so
 * the names and outputs of the model stay. The backward graph is made of ordinary
 * ops and the gradient ops (those of ir/op_grad.c, the pools', resampling's and
 * pad's), which the later passes fold, fuse and plan like the rest. Correctness is
 * the chain rule applied op by op; each op's rule is below, with PyTorch's
 * conventions where the op is not differentiable. Every op has one but the gradient
 * ops themselves: kiln takes no second derivatives. */
#include "passes.h"

#include "../ir/ops_impl.h"

#include <math.h>
#include <string.h>

typedef struct {
    PassContext *c;
    Loc loc;       /* the grad statement, for every node it makes */
    int n_before;  /* values that existed before this expansion */
    int n_tracked; /* values adj and wanted cover: n_before, and the forward values of
                      fused ops taken apart (fused_rule) */
    int *adj;      /* adjoint value per tracked value id; -1: none */
    bool *wanted;  /* depends on some xi, and y depends on it */
} AD;

/* The type of value v, as a copy: making a node may move the graph's values. */
static Type vtype(AD *a, int v) {
    return a->c->g->values[v].type;
}

/* A node of op computing (part of) the gradient of value `of`, named after it. */
static Node *start(AD *a, OpId op, int of, int n_in, const int *in) {
    char base[512];
    snprintf(base, sizeof base, "%s.grad", a->c->g->values[of].name);
    return pass_new_node(a->c, op, n_in, in, base, a->loc);
}

static int build(AD *a, OpId op, int of, int n_in, const int *in) {
    Node *n = start(a, op, of, n_in, in);
    return n ? pass_finish(a->c, n) : -1;
}

static int unary(AD *a, OpId op, int of, int x) {
    return build(a, op, of, 1, (int[]){x});
}

static int binary(AD *a, OpId op, int of, int x, int y) {
    return x < 0 || y < 0 ? -1 : build(a, op, of, 2, (int[]){x, y});
}

static int with_ints(AD *a, OpId op, int of, int x, AttrId attr, const int64_t *v, int count) {
    Node *n = x >= 0 ? start(a, op, of, 1, &x) : NULL;
    if (!n || pass_set_ints(a->c, n, attr, v, count))
        return -1;
    return pass_finish(a->c, n);
}

static int scalar(AD *a, int of, double value) {
    char base[512];
    snprintf(base, sizeof base, "%s.grad", a->c->g->values[of].name);
    Node *n = pass_new_node(a->c, OP_CONST, 0, NULL, base, a->loc);
    Type t = {DT_F32, 0, {0}, NULL, 0};
    if (!n || !(n->data = tensor_new(&t)))
        return n ? diag_error(a->c->d, a->loc, "out of memory") : -1;
    n->data->data[0] = (float)value;
    a->c->g->values[n->out[0]].type = t;
    return n->out[0];
}

static int reshape_to(AD *a, int of, int v, Type t) {
    if (v < 0 || type_equal(&a->c->g->values[v].type, &t))
        return v;
    return with_ints(a, OP_RESHAPE, of, v, ATTR_SHAPE, t.dims, t.rank);
}

static int expand_to(AD *a, int of, int v, Type t) {
    if (v < 0 || type_equal(&a->c->g->values[v].type, &t))
        return v;
    return with_ints(a, OP_EXPAND, of, v, ATTR_SHAPE, t.dims, t.rank);
}

/* g (of a broadcast shape) summed back to type t, which broadcasts to it. */
static int unbroadcast_to(AD *a, int of, int g, Type t) {
    if (g < 0)
        return g;
    Type tg = vtype(a, g);
    if (type_equal(&t, &tg))
        return g;
    int64_t axes[KILN_MAX_RANK];
    int n = 0, lead = tg.rank - t.rank;
    for (int k = 0; k < tg.rank; k++)
        if (k < lead || (t.dims[k - lead] == 1 && tg.dims[k] != 1))
            axes[n++] = k;
    int s = n ? with_ints(a, OP_SUM, of, g, ATTR_AXES, axes, n) : g;
    return reshape_to(a, of, s, t);
}

static int unbroadcast(AD *a, int x, int g) {
    return unbroadcast_to(a, x, g, vtype(a, x));
}

static int accumulate(AD *a, int x, int g) {
    if (g < 0)
        return -1;
    if (a->adj[x] >= 0)
        g = binary(a, OP_ADD, x, a->adj[x], g);
    a->adj[x] = g;
    return g < 0 ? -1 : 0;
}

/* ---- The rules, one per op family: contributions to the inputs' adjoints ---- */

/* unary_grad(dy, x) with the op's choice and its attributes (unary_grad has each
 * under the same id); neg's derivative is the constant -1, so its adjoint is
 * -dy, which fuses. */
static int unary_rule(AD *a, const Node *n, int dy) {
    int x = n->in[0];
    if (n->op == OP_NEG)
        return accumulate(a, x, unary(a, OP_NEG, x, dy));
    Node *m = start(a, OP_UNARY_GRAD, x, 2, (int[]){dy, x});
    if (!m)
        return -1;
    pass_set_enum(m, ATTR_OP, grad_op_choice(n->op));
    const OpInfo *o = &op_table[n->op];
    for (int k = 0; k < o->n_attrs; k++) {
        AttrId id = o->attrs[k].id;
        if (o->attrs[k].kind == A_FLOAT)
            pass_set_float(m, id, node_float(n, id));
        else
            pass_set_enum(m, id, node_enum(n, id));
    }
    return accumulate(a, x, pass_finish(a->c, m));
}

static int binary_rule(AD *a, const Node *n, int dy) {
    int x = n->in[0], y = n->in[1], out = n->out[0];
    int gx = -1, gy = -1;
    switch (n->op) {
    case OP_ADD: gx = dy, gy = dy; break;
    case OP_SUB: gx = dy, gy = a->wanted[y] ? unary(a, OP_NEG, y, dy) : -1; break;
    case OP_MUL:
        gx = a->wanted[x] ? binary(a, OP_MUL, x, dy, y) : -1;
        gy = a->wanted[y] ? binary(a, OP_MUL, y, dy, x) : -1;
        break;
    case OP_DIV: /* d(x/y)/dy = -(x/y)/y */
        gx = a->wanted[x] ? binary(a, OP_DIV, x, dy, y) : -1;
        gy = a->wanted[y] ? unary(a, OP_NEG, y, binary(a, OP_DIV, y, binary(a, OP_MUL, y, dy, out), y)) : -1;
        break;
    default: /* binary_grad, from the op's row */
        for (int k = 0; k < 2; k++) {
            Node *m = a->wanted[n->in[k]] ? start(a, OP_BINARY_GRAD, n->in[k], 3, (int[]){dy, x, y}) : NULL;
            if (!m)
                continue;
            pass_set_enum(m, ATTR_OP, grad_op_choice(n->op));
            pass_set_enum(m, ATTR_WRT, k ? WRT_B : WRT_A);
            *(k ? &gy : &gx) = pass_finish(a->c, m);
        }
    }
    if (a->wanted[x] && accumulate(a, x, unbroadcast(a, x, gx)))
        return -1;
    if (a->wanted[y] && accumulate(a, y, unbroadcast(a, y, gy)))
        return -1;
    return 0;
}

/* The type of reduction n's result with keepdims: x's with the reduced dims 1. The
 * reduced dims go to axes (their count to *n_axes), and how many elements each
 * result element reduces to *count. */
static Type reduced_kept(AD *a, const Node *n, int64_t *axes, int *n_axes, int64_t *count) {
    Type tx = vtype(a, n->in[0]);
    int64_t given[KILN_MAX_RANK];
    int n_given = node_has(n, ATTR_AXES) ? node_ints(n, ATTR_AXES, given, KILN_MAX_RANK, 0) : 0;
    Type kept = tx;
    *count = 1;
    *n_axes = 0;
    for (int k = 0; k < tx.rank; k++) {
        bool reduced = n_given == 0; /* no axes, or axes=[]: every dim */
        for (int j = 0; j < n_given; j++)
            reduced |= norm_axis(given[j], tx.rank) == k;
        if (reduced) {
            *count *= tx.dims[k];
            kept.dims[k] = 1;
            axes[(*n_axes)++] = k;
        }
    }
    return kept;
}

/* v, a value of the reduction's result type, broadcast back over the reduced axes
 * to type t (a scalar broadcasts as it is). */
static int spread(AD *a, int of, int v, Type kept, Type t) {
    return expand_to(a, of, v >= 0 && vtype(a, v).rank ? reshape_to(a, of, v, kept) : v, t);
}

/* sum and mean: dy spread back over the reduced axes. */
static int reduce_rule(AD *a, const Node *n, int dy) {
    int x = n->in[0], n_axes;
    int64_t axes[KILN_MAX_RANK], count;
    Type kept = reduced_kept(a, n, axes, &n_axes, &count);
    int g = spread(a, x, dy, kept, vtype(a, x));
    if (n->op == OP_MEAN)
        g = binary(a, OP_MUL, x, g, scalar(a, x, 1.0 / (double)(count ? count : 1)));
    return accumulate(a, x, g);
}

/* binary_grad(g, x, m, op=max): g where x > m, half of it where they tie, else 0. */
static int max_share(AD *a, int of, int g, int x, int m) {
    Node *b = g >= 0 && m >= 0 ? start(a, OP_BINARY_GRAD, of, 3, (int[]){g, x, m}) : NULL;
    if (!b)
        return -1;
    pass_set_enum(b, ATTR_OP, BINARY_GRAD_OP_MAX);
    return pass_finish(a->c, b);
}

/* reduce_max: dy goes to the maxima, split evenly among ties as torch.amax does:
 * with m the max kept over the reduced dims, dx = dy [x == m] / sum([x == m]).
 * binary_grad of max with respect to its first operand at (x, m) is that indicator
 * halved (x never exceeds m, and a tie takes half), so the quotient of two of them,
 * for dy and for ones, is exact. A NaN makes m NaN and the indicator 0, so its group
 * gets 0 / 0 = NaN, as in PyTorch. */
static int reduce_max_rule(AD *a, const Node *n, int dy) {
    int x = n->in[0], n_axes;
    int64_t axes[KILN_MAX_RANK], count;
    Type tx = vtype(a, x), kept = reduced_kept(a, n, axes, &n_axes, &count);
    int m = reshape_to(a, x, n->out[0], kept);
    int share = max_share(a, x, spread(a, x, dy, kept, tx), x, m);
    int ties = max_share(a, x, expand_to(a, x, scalar(a, x, 1), tx), x, m);
    Node *sum = ties >= 0 ? start(a, OP_SUM, x, 1, &ties) : NULL;
    if (!sum || pass_set_ints(a->c, sum, ATTR_AXES, axes, n_axes))
        return -1;
    pass_set_int(sum, ATTR_KEEPDIMS, 1);
    return accumulate(a, x, binary(a, OP_DIV, x, share, pass_finish(a->c, sum)));
}

static int sum_along(AD *a, int of, int v, int64_t axis) {
    Node *m = v >= 0 ? start(a, OP_SUM, of, 1, &v) : NULL;
    if (!m || pass_set_ints(a->c, m, ATTR_AXES, &axis, 1))
        return -1;
    pass_set_int(m, ATTR_KEEPDIMS, 1);
    return pass_finish(a->c, m);
}

/* softmax: y (dy - sum(dy y)); log_softmax: dy - exp(y) sum(dy), along the axis. */
static int softmax_rule(AD *a, const Node *n, int dy) {
    int x = n->in[0], y = n->out[0];
    int64_t axis = node_int(n, ATTR_AXIS);
    int g;
    if (n->op == OP_SOFTMAX)
        g = binary(a, OP_MUL, x, y,
                   binary(a, OP_SUB, x, dy, sum_along(a, x, binary(a, OP_MUL, x, dy, y), axis)));
    else
        g = binary(a, OP_SUB, x, dy, binary(a, OP_MUL, x, unary(a, OP_EXP, x, y), sum_along(a, x, dy, axis)));
    return accumulate(a, x, g);
}

static int transpose_rule(AD *a, const Node *n, int dy) {
    int x = n->in[0], rank = vtype(a, x).rank;
    int64_t perm[KILN_MAX_RANK], inverse[KILN_MAX_RANK];
    if (!node_has(n, ATTR_PERM))
        for (int k = 0; k < rank; k++)
            perm[k] = rank - 1 - k;
    else
        node_ints(n, ATTR_PERM, perm, KILN_MAX_RANK, rank);
    for (int k = 0; k < rank; k++)
        inverse[perm[k]] = k;
    return accumulate(a, x, with_ints(a, OP_TRANSPOSE, x, dy, ATTR_PERM, inverse, rank));
}

static int concat_rule(AD *a, const Node *n, int dy) {
    int rank = vtype(a, n->out[0]).rank;
    int64_t axis = norm_axis(node_int(n, ATTR_AXIS), rank), at = 0;
    for (int k = 0; k < n->n_in; k++) {
        int x = n->in[k];
        int64_t end = at + vtype(a, x).dims[axis];
        if (a->wanted[x]) {
            Node *m = start(a, OP_SLICE, x, 1, &dy);
            if (!m || pass_set_ints(a->c, m, ATTR_STARTS, &at, 1) ||
                pass_set_ints(a->c, m, ATTR_ENDS, &end, 1) || pass_set_ints(a->c, m, ATTR_AXES, &axis, 1) ||
                accumulate(a, x, pass_finish(a->c, m)))
                return -1;
        }
        at = end;
    }
    return 0;
}

/* The last two dims swapped. */
static int transposed(AD *a, int of, int v) {
    int rank = vtype(a, v).rank;
    int64_t perm[KILN_MAX_RANK];
    for (int k = 0; k < rank; k++)
        perm[k] = k;
    perm[rank - 2] = rank - 1, perm[rank - 1] = rank - 2;
    return with_ints(a, OP_TRANSPOSE, of, v, ATTR_PERM, perm, rank);
}

static Type with_unit_dim(Type t, int at) {
    for (int k = t.rank; k > at; k--)
        t.dims[k] = t.dims[k - 1];
    t.dims[at] = 1;
    t.rank++;
    return t;
}

/* numpy matmul: a 1-D a is a row [1, K] and a 1-D b a column [K, 1] (and dY gets
 * those unit dims back); then dA = dY B^T and dB = A^T dY, summed back over the
 * batch dims that were broadcast. */
static int matmul_rule(AD *a, const Node *n, int dy) {
    int x = n->in[0], w = n->in[1];
    Type ta = vtype(a, x), tb = vtype(a, w), ty = vtype(a, n->out[0]);
    if (ta.rank == 1) {
        ta = with_unit_dim(ta, 0);
        ty = with_unit_dim(ty, ty.rank - (tb.rank == 1 ? 0 : 1));
    }
    if (tb.rank == 1) {
        tb = with_unit_dim(tb, 1);
        ty = with_unit_dim(ty, ty.rank);
    }
    int A = reshape_to(a, x, x, ta), B = reshape_to(a, w, w, tb), dY = reshape_to(a, n->out[0], dy, ty);
    if (a->wanted[x]) {
        int g = unbroadcast_to(a, x, binary(a, OP_MATMUL, x, dY, transposed(a, w, B)), ta);
        if (accumulate(a, x, reshape_to(a, x, g, vtype(a, x))))
            return -1;
    }
    if (a->wanted[w]) {
        int g = unbroadcast_to(a, w, binary(a, OP_MATMUL, w, transposed(a, x, A), dY), tb);
        if (accumulate(a, w, reshape_to(a, w, g, vtype(a, w))))
            return -1;
    }
    return 0;
}

static int gemm_node(AD *a, int of, int p, int q, double alpha, bool trans_p, bool trans_q) {
    Node *m = start(a, OP_GEMM, of, 2, (int[]){p, q});
    if (!m)
        return -1;
    pass_set_float(m, ATTR_ALPHA, alpha);
    pass_set_int(m, ATTR_TRANS_A, trans_p);
    pass_set_int(m, ATTR_TRANS_B, trans_q);
    return pass_finish(a->c, m);
}

/* y = alpha op(a) op(b) + beta c: d op(a) = alpha dy op(b)^T, d op(b) = alpha op(a)^T dy,
 * each transposed back when the operand was; dc = beta dy summed to c's shape. */
static int gemm_rule(AD *a, const Node *n, int dy) {
    int x = n->in[0], w = n->in[1], c = n->n_in > 2 ? n->in[2] : -1;
    double alpha = node_float(n, ATTR_ALPHA), beta = node_float(n, ATTR_BETA);
    bool ta = node_bool(n, ATTR_TRANS_A), tb = node_bool(n, ATTR_TRANS_B);
    if (a->wanted[x] &&
        accumulate(a, x,
                   ta ? gemm_node(a, x, w, dy, alpha, tb, true) : gemm_node(a, x, dy, w, alpha, false, !tb)))
        return -1;
    if (a->wanted[w] &&
        accumulate(a, w,
                   tb ? gemm_node(a, w, dy, x, alpha, true, ta) : gemm_node(a, w, x, dy, alpha, !ta, false)))
        return -1;
    if (c >= 0 && a->wanted[c]) {
        int g = beta == 1 ? dy : binary(a, OP_MUL, c, dy, scalar(a, c, beta));
        if (accumulate(a, c, unbroadcast(a, c, g)))
            return -1;
    }
    return 0;
}

/* y = x w^T + b, x [..., K]: dx = dy w; dw = dY^T X with the leading dims of x
 * and dy flattened into rows; db = dy summed over every dim but the last. */
static int linear_rule(AD *a, const Node *n, int dy) {
    int x = n->in[0], w = n->in[1], b = n->n_in > 2 ? n->in[2] : -1;
    Type tx = vtype(a, x), ty = vtype(a, n->out[0]);
    if (a->wanted[x] && accumulate(a, x, binary(a, OP_MATMUL, x, dy, w)))
        return -1;
    if (a->wanted[w]) {
        int64_t rows = tx.rank > 1 ? type_numel(&tx) / tx.dims[tx.rank - 1] : 1;
        Type x2 = type_make(2, (int64_t[]){rows, tx.dims[tx.rank - 1]});
        Type y2 = type_make(2, (int64_t[]){rows, ty.dims[ty.rank - 1]});
        int g = gemm_node(a, w, reshape_to(a, n->out[0], dy, y2), reshape_to(a, x, x, x2), 1, true, false);
        if (accumulate(a, w, g))
            return -1;
    }
    if (b >= 0 && a->wanted[b] && accumulate(a, b, unbroadcast(a, b, dy)))
        return -1;
    return 0;
}

/* [N, C, 1...] from [N, C, spatial...]: dy spread evenly over the spatial dims. */
static int global_avg_pool_rule(AD *a, const Node *n, int dy) {
    int x = n->in[0];
    Type tx = vtype(a, x), ty = vtype(a, n->out[0]);
    double spatial = (double)type_numel(&tx) / (double)type_numel(&ty);
    int g = expand_to(a, x, dy, tx);
    return accumulate(a, x, binary(a, OP_MUL, x, g, scalar(a, x, spatial > 0 ? 1 / spatial : 0)));
}

/* Gives m the attribute `name` of n (their ops both have it) as n has it. */
static void copy_attr(Node *m, const Node *n, AttrId id) {
    int from = op_attr_index(n->op, id), to = op_attr_index(m->op, id);
    KILN_ASSERT(from >= 0 && to >= 0);
    m->attrs[to] = n->attrs[from];
}

static void copy_conv_attrs(Node *m, const Node *n) {
    static const AttrId ids[] = {ATTR_STRIDES, ATTR_PADS, ATTR_DILATIONS, ATTR_GROUPS, ATTR_LAYOUT};
    for (size_t k = 0; k < sizeof ids / sizeof *ids; k++)
        copy_attr(m, n, ids[k]);
}

/* Every dim of t but its channel dim (1, or the last with nhwc). */
static int non_channel_axes(const Type *t, bool nhwc, int64_t *axes) {
    int count = 0, channel = nhwc ? t->rank - 1 : 1;
    for (int k = 0; k < t->rank; k++)
        if (k != channel)
            axes[count++] = k;
    return count;
}

static int bias_grad(AD *a, int b, int dy, bool nhwc) {
    int64_t axes[KILN_MAX_RANK];
    Type ty = vtype(a, dy);
    int count = non_channel_axes(&ty, nhwc, axes);
    return accumulate(a, b, with_ints(a, OP_SUM, b, dy, ATTR_AXES, axes, count));
}

/* conv: dx is conv_transpose of dy with the same weight (its output_padding restores
 * the rows the forward stride dropped), dw is conv_weight_grad, db sums dy per channel.
 * conv_transpose is conv's adjoint the other way round: dx is conv of dy, and dw is
 * conv_weight_grad with dy and x exchanged (both weights are [in, out/groups, k...]). */
static int conv_rule(AD *a, const Node *n, int dy) {
    int x = n->in[0], w = n->in[1], b = n->n_in > 2 ? n->in[2] : -1;
    bool nhwc = layout_is_nhwc(n), transpose = n->op == OP_CONV_TRANSPOSE;
    Type tx = vtype(a, x), tw = vtype(a, w), ty = vtype(a, dy);
    View xv = view_of(&tx, nhwc), wv = view_of(&tw, nhwc), yv = view_of(&ty, nhwc);
    if (a->wanted[x]) {
        Node *m = start(a, transpose ? OP_CONV : OP_CONV_TRANSPOSE, x, 2, (int[]){dy, w});
        if (!m)
            return -1;
        copy_conv_attrs(m, n);
        if (!transpose) {
            int ns = xv.ns;
            int64_t strides[3], pads[6], dilations[3], extra[3];
            node_ints(n, ATTR_STRIDES, strides, 3, ns);
            node_ints(n, ATTR_PADS, pads, 6, 2 * ns);
            node_ints(n, ATTR_DILATIONS, dilations, 3, ns);
            for (int k = 0; k < ns; k++)
                extra[k] = xv.sp[k] - ((yv.sp[k] - 1) * strides[k] - pads[k] - pads[ns + k] +
                                       dilations[k] * (wv.sp[k] - 1) + 1);
            if (pass_set_ints(a->c, m, ATTR_OUTPUT_PADDING, extra, ns))
                return -1;
        }
        if (accumulate(a, x, pass_finish(a->c, m)))
            return -1;
    }
    if (a->wanted[w]) {
        Node *m = start(a, OP_CONV_WEIGHT_GRAD, w, 2, transpose ? (int[]){dy, x} : (int[]){x, dy});
        if (!m || pass_set_ints(a->c, m, ATTR_KERNEL, wv.sp, wv.ns))
            return -1;
        copy_conv_attrs(m, n);
        if (accumulate(a, w, pass_finish(a->c, m)))
            return -1;
    }
    return b >= 0 && a->wanted[b] ? bias_grad(a, b, dy, nhwc) : 0;
}

/* The gradient as an op of its own, grad_op(dy, x), sharing the forward op's schema. */
static int grad_op_rule(AD *a, const Node *n, int dy, OpId grad_op) {
    int x = n->in[0];
    Node *m = start(a, grad_op, x, 2, (int[]){dy, x});
    if (!m)
        return -1;
    for (int k = 0; k < op_table[n->op].n_attrs; k++)
        m->attrs[k] = n->attrs[k];
    return accumulate(a, x, pass_finish(a->c, m));
}

/* A per-channel vector [C] shaped to broadcast against t: [C, 1, ...] with nchw. */
static int per_channel(AD *a, int of, int v, const Type *t, bool nhwc) {
    if (v < 0 || nhwc)
        return v;
    int64_t dims[KILN_MAX_RANK];
    dims[0] = t->dims[1];
    for (int k = 1; k < t->rank - 1; k++)
        dims[k] = 1;
    Type shaped = type_make(t->rank - 1, dims);
    return reshape_to(a, of, v, shaped);
}

/* y = (x - mean) r scale + bias with r = (var + eps)^-1/2, per channel:
 * dx = dy scale r; dscale = sum(dy (x - mean) r); dbias = sum(dy);
 * dmean = -dbias scale r; dvar = -1/2 scale r^3 sum(dy (x - mean)). */
static int batch_norm_rule(AD *a, const Node *n, int dy) {
    int x = n->in[0], scale = n->in[1], bias = n->in[2], mean = n->in[3], var = n->in[4];
    bool nhwc = layout_is_nhwc(n);
    Type tx = vtype(a, x);
    int64_t axes[KILN_MAX_RANK];
    int n_axes = non_channel_axes(&tx, nhwc, axes);
    int r = binary(a, OP_POW, var, binary(a, OP_ADD, var, var, scalar(a, var, node_float(n, ATTR_EPSILON))),
                   scalar(a, var, -0.5));
    int k = binary(a, OP_MUL, x, scale, r);
    if (a->wanted[x] && accumulate(a, x, binary(a, OP_MUL, x, dy, per_channel(a, x, k, &tx, nhwc))))
        return -1;
    int centered = -1, sum_dy = -1;
    if (a->wanted[scale] || a->wanted[var])
        centered = binary(a, OP_MUL, x, dy, binary(a, OP_SUB, x, x, per_channel(a, x, mean, &tx, nhwc)));
    if (a->wanted[bias] || a->wanted[mean])
        sum_dy = with_ints(a, OP_SUM, bias, dy, ATTR_AXES, axes, n_axes);
    if (a->wanted[scale] &&
        accumulate(
            a, scale,
            binary(a, OP_MUL, scale, with_ints(a, OP_SUM, scale, centered, ATTR_AXES, axes, n_axes), r)))
        return -1;
    if (a->wanted[bias] && accumulate(a, bias, sum_dy))
        return -1;
    if (a->wanted[mean] && accumulate(a, mean, unary(a, OP_NEG, mean, binary(a, OP_MUL, mean, sum_dy, k))))
        return -1;
    if (a->wanted[var]) {
        int r3 = binary(a, OP_MUL, var, binary(a, OP_MUL, var, r, r),
                        binary(a, OP_MUL, var, k, scalar(a, var, -0.5)));
        if (accumulate(
                a, var,
                binary(a, OP_MUL, var, with_ints(a, OP_SUM, var, centered, ATTR_AXES, axes, n_axes), r3)))
            return -1;
    }
    return 0;
}

static int mean_keep(AD *a, int of, int v, const int64_t *axes, int n_axes) {
    Node *m = v >= 0 ? start(a, OP_MEAN, of, 1, &v) : NULL;
    if (!m || pass_set_ints(a->c, m, ATTR_AXES, axes, n_axes))
        return -1;
    pass_set_int(m, ATTR_KEEPDIMS, 1);
    return pass_finish(a->c, m);
}

/* Over the normalized dims, with xhat = (x - mu) r and g = dy scale:
 * dx = r (g - mean(g) - xhat mean(g xhat)); dscale = sum(dy xhat) and dbias = sum(dy)
 * over the leading dims. mu and r are recomputed from x. */
static int layer_norm_rule(AD *a, const Node *n, int dy) {
    int x = n->in[0], scale = n->n_in > 1 ? n->in[1] : -1, bias = n->n_in > 2 ? n->in[2] : -1;
    Type tx = vtype(a, x);
    int axis = norm_axis(node_int(n, ATTR_AXIS), tx.rank);
    int64_t norm_axes[KILN_MAX_RANK], lead_axes[KILN_MAX_RANK];
    int n_norm = 0, n_lead = 0;
    for (int k = 0; k < tx.rank; k++)
        if (k < axis)
            lead_axes[n_lead++] = k;
        else
            norm_axes[n_norm++] = k;
    int centered = binary(a, OP_SUB, x, x, mean_keep(a, x, x, norm_axes, n_norm));
    int variance = mean_keep(a, x, binary(a, OP_MUL, x, centered, centered), norm_axes, n_norm);
    int r = binary(a, OP_POW, x, binary(a, OP_ADD, x, variance, scalar(a, x, node_float(n, ATTR_EPSILON))),
                   scalar(a, x, -0.5));
    int xhat = binary(a, OP_MUL, x, centered, r);
    if (a->wanted[x]) {
        int g = scale >= 0 ? binary(a, OP_MUL, x, dy, scale) : dy;
        int inner = binary(
            a, OP_SUB, x, binary(a, OP_SUB, x, g, mean_keep(a, x, g, norm_axes, n_norm)),
            binary(a, OP_MUL, x, xhat, mean_keep(a, x, binary(a, OP_MUL, x, g, xhat), norm_axes, n_norm)));
        if (accumulate(a, x, binary(a, OP_MUL, x, r, inner)))
            return -1;
    }
    if (scale >= 0 && a->wanted[scale]) {
        int g = binary(a, OP_MUL, scale, dy, xhat);
        if (accumulate(a, scale, n_lead ? with_ints(a, OP_SUM, scale, g, ATTR_AXES, lead_axes, n_lead) : g))
            return -1;
    }
    if (bias >= 0 && a->wanted[bias] &&
        accumulate(a, bias, n_lead ? with_ints(a, OP_SUM, bias, dy, ATTR_AXES, lead_axes, n_lead) : dy))
        return -1;
    return 0;
}

/* A node of op with the list attributes given (count entries each). */
static int with_lists(AD *a, OpId op, int of, int x, int count, const AttrId *ids,
                      const int64_t *const *lists) {
    Node *m = x >= 0 ? start(a, op, of, 1, &x) : NULL;
    if (!m)
        return -1;
    for (int k = 0; ids[k] != ATTR_COUNT; k++)
        if (pass_set_ints(a->c, m, ids[k], lists[k], count))
            return -1;
    return pass_finish(a->c, m);
}

/* slice: dy put back where it was taken from, zeros elsewhere. Along a dim with a
 * negative step, dy is reversed first: the slice reads as one with the opposite step
 * from its last element. Along a dim with step m > 1 (and more than one element),
 * m - 1 zeros go after each element: g as [outer, len, 1, inner] padded to
 * [outer, len, m, inner] and read as len m elements. Then one pad puts each dim's
 * lowest element where it came from and crops the zeros past the last. */
static int slice_rule(AD *a, const Node *n, int dy) {
    int x = n->in[0];
    Type tx = vtype(a, x);
    int rank = tx.rank;
    int64_t first[KILN_MAX_RANK], step[KILN_MAX_RANK], low[KILN_MAX_RANK], pads[2 * KILN_MAX_RANK];
    Type ty = {0};
    if (slice_ranges(n, &tx, first, step, &ty, a->c->d))
        return -1;
    int64_t rev_axes[KILN_MAX_RANK], rev_starts[KILN_MAX_RANK], rev_ends[KILN_MAX_RANK],
        rev_steps[KILN_MAX_RANK];
    int n_rev = 0;
    for (int k = 0; k < rank; k++) {
        int64_t len = ty.dims[k], m = step[k] < 0 ? -step[k] : step[k];
        low[k] = step[k] < 0 && len > 1 ? first[k] - (len - 1) * m : first[k];
        if (step[k] < 0 && len > 1) { /* from the last element back past the first */
            rev_axes[n_rev] = k, rev_starts[n_rev] = -1, rev_ends[n_rev] = -INT64_MAX, rev_steps[n_rev] = -1;
            n_rev++;
        }
    }
    int g = dy;
    if (n_rev)
        g = with_lists(a, OP_SLICE, x, g, n_rev,
                       (const AttrId[]){ATTR_STARTS, ATTR_ENDS, ATTR_AXES, ATTR_STEPS, ATTR_COUNT},
                       (const int64_t *const[]){rev_starts, rev_ends, rev_axes, rev_steps});
    for (int k = 0; k < rank; k++) {
        int64_t len = ty.dims[k], m = step[k] < 0 ? -step[k] : step[k];
        if (m == 1 || len == 1 || g < 0)
            continue;
        Type t = vtype(a, g);
        int64_t outer, inner, pad4[8] = {0};
        split_at_axis(&t, k, &outer, &inner);
        pad4[4 + 2] = m - 1; /* the end of dim 2 */
        g = with_ints(a, OP_PAD, x, reshape_to(a, x, g, type_make(4, (int64_t[]){outer, len, 1, inner})),
                      ATTR_PADS, pad4, 8);
        t.dims[k] = len * m;
        g = reshape_to(a, x, g, t);
    }
    for (int k = 0; k < rank && g >= 0; k++) {
        pads[k] = low[k];
        pads[rank + k] = tx.dims[k] - low[k] - vtype(a, g).dims[k];
    }
    return accumulate(a, x, with_ints(a, OP_PAD, x, g, ATTR_PADS, pads, 2 * rank));
}

/* pad: constant padding's adjoint crops dy back, a pad with the widths negated;
 * with reflect and edge, an element of x is copied to several places, and pad_grad
 * sums them back. */
static int pad_rule(AD *a, const Node *n, int dy) {
    int x = n->in[0];
    int rank = vtype(a, x).rank;
    if (node_enum(n, ATTR_MODE) != PAD_MODE_CONSTANT)
        return grad_op_rule(a, n, dy, OP_PAD_GRAD);
    int64_t pads[2 * KILN_MAX_RANK];
    node_ints(n, ATTR_PADS, pads, 2 * KILN_MAX_RANK, 2 * rank);
    for (int k = 0; k < 2 * rank; k++)
        pads[k] = -pads[k];
    return accumulate(a, x, with_ints(a, OP_PAD, x, dy, ATTR_PADS, pads, 2 * rank));
}

/* ---- Fused ops, taken apart ---- */

static int backprop(AD *a, const Node *n, int dy);

/* Room in adj and wanted for every value made so far: no adjoint, not wanted. */
static int track_values(AD *a) {
    int n = a->c->g->n_values;
    if (n <= a->n_tracked)
        return 0;
    int *adj = ir_realloc(a->adj, sizeof *adj * (size_t)(n + 1));
    if (adj)
        a->adj = adj;
    bool *wanted = adj ? ir_realloc(a->wanted, sizeof *wanted * (size_t)(n + 1)) : NULL;
    if (!wanted)
        return diag_error(a->c->d, a->loc, "out of memory");
    a->wanted = wanted;
    for (int v = a->n_tracked; v < n; v++) {
        a->adj[v] = -1;
        a->wanted[v] = false;
    }
    a->n_tracked = n;
    return 0;
}

/* A node of the forward ops a fused op stands for, named after the fused op's value. */
static Node *forward_node(AD *a, const Node *fused, OpId op, int n_in, const int *in) {
    char base[512];
    snprintf(base, sizeof base, "%s.unfused", a->c->g->values[fused->out[0]].name);
    return pass_new_node(a->c, op, n_in, in, base, a->loc);
}

/* Nodes computing expression e over the values ins ($k is ins[k]), one per call, a
 * number an f32[] const; the value of e. */
static int build_expr(AD *a, const Node *fused, const Expr *e, const int *ins) {
    if (e->kind == EXPR_INPUT)
        return ins[e->input];
    if (e->kind == EXPR_NUMBER)
        return scalar(a, fused->out[0], e->number);
    int args[2];
    for (int k = 0; k < e->call.n_in; k++)
        if ((args[k] = build_expr(a, fused, e->arg[k], ins)) < 0)
            return -1;
    Node *m = forward_node(a, fused, e->call.op, e->call.n_in, args);
    if (!m)
        return -1;
    for (int k = 0; k < op_table[e->call.op].n_attrs; k++)
        m->attrs[k] = e->call.attrs[k];
    return pass_finish(a->c, m);
}

/* The inputs of fused op n's expression, $0, $1, ...: an `elementwise` node's own;
 * for fused_conv and fused_linear a new node of the head (conv or linear of x, w and
 * b, with the conv's attributes), then e1, ..., each one-element operand of another
 * type as f32[] (which computes the same, and broadcasts into the head's result). */
static int expression_inputs(AD *a, const Node *n, int *ins, int n_ins) {
    if (n->op == OP_ELEMENTWISE) {
        memcpy(ins, n->in, sizeof *ins * (size_t)n_ins);
        return 0;
    }
    bool bias = n->n_in > 2 && n->in[2] >= 0;
    Node *head = forward_node(a, n, n->op == OP_FUSED_CONV ? OP_CONV : OP_LINEAR, bias ? 3 : 2, n->in);
    if (!head)
        return -1;
    if (n->op == OP_FUSED_CONV)
        copy_conv_attrs(head, n);
    if ((ins[0] = pass_finish(a->c, head)) < 0)
        return -1;
    Type ty = vtype(a, n->out[0]);
    for (int k = 1; k < n_ins; k++) {
        ins[k] = n->in[expr_first_input(n) + k - 1];
        Type te = vtype(a, ins[k]);
        if (type_equal(&te, &ty))
            continue;
        Node *m = forward_node(a, n, OP_RESHAPE, 1, &ins[k]);
        if (!m || pass_set_ints(a->c, m, ATTR_SHAPE, (int64_t[]){1}, 0) ||
            (ins[k] = pass_finish(a->c, m)) < 0)
            return -1;
    }
    return 0;
}

/* elementwise, fused_conv and fused_linear (the fusion passes make them, and a model
 * may write them): differentiated through the ops they stand for. Those are built
 * again as nodes of their own, computing the fused op's result from its inputs (see
 * expression_inputs), and backprop runs over them, last first, from dy as over the
 * rest of the graph; so every fused op has the rules of its parts. The expression's
 * result may be smaller than the fused op's where an input the expression does not
 * read widened it, so dy is summed back to it first. The later passes remove what
 * no gradient reads of the forward nodes, and fuse the rest again. */
/* Backpropagates dy, the adjoint of root, through the forward nodes lo .. hi - 1 that
 * a rule built to stand for one node (a fused op's expression, attention's
 * definition), which the graph has only now. */
static int backprop_through(AD *a, int lo, int hi, int root, int dy) {
    Graph *g = a->c->g;
    if (track_values(a))
        return -1;
    for (int i = lo; i < hi; i++) { /* a forward value is wanted when an operand is */
        const Node *m = g->nodes[i];
        for (int k = 0; k < m->n_in; k++)
            a->wanted[m->out[0]] |= m->in[k] >= 0 && a->wanted[m->in[k]];
    }
    if (a->wanted[root] && accumulate(a, root, unbroadcast_to(a, root, dy, vtype(a, root))))
        return -1;
    for (int i = hi - 1; i >= lo; i--) {
        const Node *m = g->nodes[i];
        int out = m->out[0];
        if (a->wanted[out] && a->adj[out] >= 0 && backprop(a, m, a->adj[out]))
            return -1;
    }
    return 0;
}

static int fused_rule(AD *a, const Node *n, int dy) {
    Graph *g = a->c->g;
    int first = expr_first_input(n),
        n_ins = first == 0 ? n->n_in : 1 + (n->n_in > first ? n->n_in - first : 0);
    int *ins = ir_malloc(sizeof *ins * (size_t)n_ins);
    /* in the graph's arena: the forward nodes keep its calls' attributes as they are */
    Expr *e = ins ? node_expr(&g->arena, n, a->c->d) : NULL;
    if (!e) {
        ir_free(ins);
        return ins ? -1 : diag_error(a->c->d, n->loc, "out of memory");
    }
    int lo = g->n_nodes; /* the forward nodes are appended: nodes lo .. hi - 1 */
    int root = expression_inputs(a, n, ins, n_ins) ? -1 : build_expr(a, n, e, ins);
    ir_free(ins);
    return root < 0 ? -1 : backprop_through(a, lo, g->n_nodes, root, dy);
}

/* The [L, S] const of is_causal: 0 where key j <= query i, -inf above. */
static int causal_mask(AD *a, int of, int64_t rows, int64_t cols) {
    char base[512];
    snprintf(base, sizeof base, "%s.causal", a->c->g->values[of].name);
    Node *n = pass_new_node(a->c, OP_CONST, 0, NULL, base, a->loc);
    Type t = type_make(2, (int64_t[]){rows, cols});
    if (!n || !(n->data = tensor_new(&t)))
        return n ? diag_error(a->c->d, a->loc, "out of memory") : -1;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++)
            n->data->data[i * cols + j] = j > i ? -INFINITY : 0.0f;
    a->c->g->values[n->out[0]].type = t;
    return n->out[0];
}

/* attention: its definition written with ops, softmax(q k^T scale + mask) v (a bool
 * mask as a where, is_causal as an added const), whose rules give the gradient. The
 * backward graph reads the probabilities, so this forward is computed again. */
static int attention_rule(AD *a, const Node *n, int dy) {
    Graph *g = a->c->g;
    int q = n->in[0], k = n->in[1], v = n->in[2], mask = n->n_in > 3 ? n->in[3] : -1, y = n->out[0];
    Type tq = vtype(a, q);
    int lo = g->n_nodes;
    int s = binary(a, OP_MATMUL, y, q, transposed(a, y, k));
    s = binary(a, OP_MUL, y, s, scalar(a, y, attention_scale(n, &tq)));
    if (mask >= 0 && vtype(a, mask).dtype == DT_BOOL)
        s = s < 0 ? -1 : build(a, OP_WHERE, y, 3, (int[]){mask, s, scalar(a, y, -INFINITY)});
    else if (mask >= 0)
        s = binary(a, OP_ADD, y, s, mask);
    if (node_bool(n, ATTR_IS_CAUSAL))
        s = binary(a, OP_ADD, y, s, causal_mask(a, y, tq.dims[tq.rank - 2], vtype(a, k).dims[tq.rank - 2]));
    Node *m = s >= 0 ? start(a, OP_SOFTMAX, y, 1, &s) : NULL;
    if (!m)
        return -1;
    pass_set_int(m, ATTR_AXIS, -1);
    int root = binary(a, OP_MATMUL, y, pass_finish(a->c, m), v);
    return root < 0 ? -1 : backprop_through(a, lo, g->n_nodes, root, dy);
}

/* where(c, a, b): dy where c picks a, zero elsewhere, and the other way round for
 * b (a zero, not dy * 0, which a NaN in dy would turn into NaN). */
static int where_rule(AD *a, const Node *n, int dy) {
    int zero = scalar(a, n->out[0], 0);
    for (int k = 1; k <= 2 && zero >= 0; k++) {
        int x = n->in[k], g = a->wanted[x] ? build(a, OP_WHERE, x, 3,
                                                   (int[]){n->in[0], k == 1 ? dy : zero, k == 1 ? zero : dy})
                                           : 0;
        if (g < 0 || (a->wanted[x] && accumulate(a, x, unbroadcast(a, x, g))))
            return -1;
    }
    return zero < 0 ? -1 : 0;
}

/* gather (gather_elements): dy's slices (elements) summed back into the ones of x
 * they came from (gather_grad, gather_elements_grad); the indices have none. */
static int gather_rule(AD *a, const Node *n, int dy) {
    int x = n->in[0];
    if (vtype(a, x).dtype != DT_F32)
        return 0;
    Node *m = start(a, n->op == OP_GATHER ? OP_GATHER_GRAD : OP_GATHER_ELEMENTS_GRAD, x, 3,
                    (int[]){dy, x, n->in[1]});
    if (!m)
        return -1;
    pass_set_int(m, ATTR_AXIS, node_int(n, ATTR_AXIS));
    return accumulate(a, x, pass_finish(a->c, m));
}

/* Element k of cumsum's result sums x's elements up to k (or from k, reversed): so
 * x's element k gets the sum of dy's from k on, the cumsum of dy the other way. */
static int cumsum_rule(AD *a, const Node *n, int dy) {
    int x = n->in[0];
    Node *m = start(a, OP_CUMSUM, x, 1, &dy);
    if (!m)
        return -1;
    pass_set_int(m, ATTR_AXIS, node_int(n, ATTR_AXIS));
    pass_set_int(m, ATTR_EXCLUSIVE, node_bool(n, ATTR_EXCLUSIVE)); /* a bool is set as 0 or 1 */
    pass_set_int(m, ATTR_REVERSE, !node_bool(n, ATTR_REVERSE));
    return accumulate(a, x, pass_finish(a->c, m));
}

/* dropout: dy * (keep ? s : 0) with the mask of the forward op, which is
 * dropout(dy) at the same key and p; the key has no gradient. */
static int dropout_rule(AD *a, const Node *n, int dy) {
    int x = n->in[0];
    Node *m = start(a, OP_DROPOUT, x, 2, (int[]){dy, n->in[1]});
    if (!m)
        return -1;
    copy_attr(m, n, ATTR_P);
    return accumulate(a, x, pass_finish(a->c, m));
}

/* allreduce: the gradient of a sum over the processes by each process's x is the
 * sum of their dy (each process's loss depends on every x), and of a mean, the mean. */
static int allreduce_rule(AD *a, const Node *n, int dy) {
    int x = n->in[0];
    Node *m = start(a, OP_ALLREDUCE, x, 1, (int[]){dy});
    if (!m)
        return -1;
    copy_attr(m, n, ATTR_OP);
    return accumulate(a, x, pass_finish(a->c, m));
}

static int backprop(AD *a, const Node *n, int dy) {
    switch (n->op) { /* every op, no default: -Wswitch names one left out */
#define UNARY(id, ...) case OP_##id:
#include "../ir/unary.def"
#undef UNARY
        return unary_rule(a, n, dy);
#define BINARY(id, ...) case OP_##id:
#include "../ir/binary.def"
#undef BINARY
        return binary_rule(a, n, dy);
    case OP_SUM:
    case OP_MEAN: return reduce_rule(a, n, dy);
    case OP_REDUCE_MAX: return reduce_max_rule(a, n, dy);
    case OP_SOFTMAX:
    case OP_LOG_SOFTMAX: return softmax_rule(a, n, dy);
    case OP_MATMUL: return matmul_rule(a, n, dy);
    case OP_GEMM: return gemm_rule(a, n, dy);
    case OP_LINEAR: return linear_rule(a, n, dy);
    case OP_GLOBAL_AVG_POOL: return global_avg_pool_rule(a, n, dy);
    case OP_RESHAPE:
    case OP_FLATTEN:
    case OP_SQUEEZE:
    case OP_UNSQUEEZE:
    case OP_IDENTITY:
    case OP_EXPAND:
        if (n->op == OP_EXPAND)
            return accumulate(a, n->in[0], unbroadcast(a, n->in[0], dy));
        return accumulate(a, n->in[0], reshape_to(a, n->in[0], dy, vtype(a, n->in[0])));
    case OP_CONV:
    case OP_CONV_TRANSPOSE: return conv_rule(a, n, dy);
    case OP_MAX_POOL: return grad_op_rule(a, n, dy, OP_MAX_POOL_GRAD);
    case OP_AVG_POOL: return grad_op_rule(a, n, dy, OP_AVG_POOL_GRAD);
    case OP_ADAPTIVE_AVG_POOL: return grad_op_rule(a, n, dy, OP_ADAPTIVE_AVG_POOL_GRAD);
    case OP_RESIZE: return grad_op_rule(a, n, dy, OP_RESIZE_GRAD);
    case OP_INTERPOLATE: return grad_op_rule(a, n, dy, OP_INTERPOLATE_GRAD);
    case OP_BATCH_NORM: return batch_norm_rule(a, n, dy);
    case OP_ELEMENTWISE:
    case OP_FUSED_CONV:
    case OP_FUSED_LINEAR: return fused_rule(a, n, dy);
    case OP_LAYER_NORM: return layer_norm_rule(a, n, dy);
    case OP_SLICE: return slice_rule(a, n, dy);
    case OP_PAD: return pad_rule(a, n, dy);
    case OP_TRANSPOSE: return transpose_rule(a, n, dy);
    case OP_CONCAT: return concat_rule(a, n, dy);
    case OP_WHERE: return where_rule(a, n, dy);
    case OP_CAST: /* f32 to f32 is the identity; other casts carry no gradient */
        return vtype(a, n->in[0]).dtype == DT_F32 && vtype(a, n->out[0]).dtype == DT_F32
                   ? accumulate(a, n->in[0], dy)
                   : 0;
    case OP_EQUAL:
    case OP_LESS:
    case OP_LESS_EQUAL:
    case OP_GREATER:
    case OP_GREATER_EQUAL:
    case OP_NOT:
    case OP_AND:
    case OP_OR:
    case OP_ARGMAX: return 0; /* bools and indices: no gradient reaches their inputs */
    case OP_CUMSUM: return cumsum_rule(a, n, dy);
    case OP_ATTENTION: return attention_rule(a, n, dy);
    case OP_GATHER:
    case OP_GATHER_ELEMENTS: return gather_rule(a, n, dy);
    case OP_DROPOUT: return dropout_rule(a, n, dy);
    case OP_UNIFORM: return 0; /* a function of the key alone, which has no gradient */
    case OP_ALLREDUCE: return allreduce_rule(a, n, dy);
    case OP_UNARY_GRAD:
    case OP_BINARY_GRAD:
    case OP_CONV_WEIGHT_GRAD:
    case OP_MAX_POOL_GRAD:
    case OP_AVG_POOL_GRAD:
    case OP_ADAPTIVE_AVG_POOL_GRAD:
    case OP_RESIZE_GRAD:
    case OP_INTERPOLATE_GRAD:
    case OP_PAD_GRAD:
    case OP_GATHER_GRAD:
    case OP_GATHER_ELEMENTS_GRAD:
        return diag_error(a->c->d, n->loc,
                          "autodiff: no gradient for '%s' (needed for value '%s'): it is a gradient op, and "
                          "kiln does not take second derivatives",
                          op_table[n->op].name, a->c->g->values[n->out[0]].name);
    case OP_INPUT:
    case OP_PARAM:
    case OP_CONST:
    case OP_GRAD:
        return diag_error(a->c->d, n->loc, "autodiff: no gradient for '%s' (needed for value '%s')",
                          op_table[n->op].name, a->c->g->values[n->out[0]].name);
    case OP_COUNT: break;
    }
    KILN_ASSERT(!"an op id outside the table");
    return -1;
}

/* ---- Expanding one grad ---- */

/* Marks the values that depend on some xi and on which y depends. */
static void mark_wanted(AD *a, const Node *grad, int at) {
    Graph *g = a->c->g;
    bool *from_x = ir_calloc((size_t)a->n_before + 1, sizeof *from_x);
    if (!from_x)
        return;
    for (int k = 1; k < grad->n_in; k++)
        from_x[grad->in[k]] = true;
    for (int i = 0; i < at; i++) {
        const Node *n = g->nodes[i];
        bool dep = false;
        for (int k = 0; k < n->n_in; k++)
            dep |= n->in[k] >= 0 && from_x[n->in[k]];
        for (int k = 0; dep && k < n->n_out; k++)
            from_x[n->out[k]] = true;
    }
    a->wanted[grad->in[0]] = from_x[grad->in[0]];
    for (int i = at - 1; i >= 0; i--) {
        const Node *n = g->nodes[i];
        bool reaches = false;
        for (int k = 0; k < n->n_out; k++)
            reaches |= a->wanted[n->out[k]];
        for (int k = 0; reaches && k < n->n_in; k++)
            if (n->in[k] >= 0 && from_x[n->in[k]])
                a->wanted[n->in[k]] = true;
    }
    ir_free(from_x);
}

/* Makes value `id` (a grad result) the value v computes: v's node takes it over and
 * v's uses move to it. */
static void take_over(Graph *g, int v, int id) {
    Node *n = g->nodes[g->values[v].node];
    graph_replace_uses(g, v, id);
    graph_redefine(g, id, n, g->values[v].index);
    g->values[v].node = -1;
}

static int expand_grad(PassContext *c, int at) {
    Graph *g = c->g;
    Node *grad = g->nodes[at];
    AD a = {c,
            grad->loc,
            g->n_values,
            g->n_values,
            ir_malloc(sizeof(int) * (size_t)(g->n_values + 1)),
            ir_calloc((size_t)g->n_values + 1, sizeof(bool))};
    int rc = -1;
    if (!a.adj || !a.wanted) {
        diag_error(c->d, grad->loc, "out of memory");
        goto done;
    }
    for (int v = 0; v < a.n_before; v++)
        a.adj[v] = -1;
    mark_wanted(&a, grad, at);
    int y = grad->in[0];
    if (a.wanted[y] && (a.adj[y] = scalar(&a, y, 1)) < 0)
        goto done;
    for (int i = at - 1; i >= 0; i--) {
        const Node *n = g->nodes[i];
        int out = n->n_out == 1 ? n->out[0] : -1;
        if (out >= 0 && !op_is_decl(n->op) && a.wanted[out] && a.adj[out] >= 0 && backprop(&a, n, a.adj[out]))
            goto done;
    }
    for (int k = 1; k < grad->n_in; k++) {
        int x = grad->in[k], id = grad->out[k - 1];
        int v = a.adj[x];
        if (v < 0) /* y does not depend on x */
            v = expand_to(&a, x, scalar(&a, x, 0), vtype(&a, x));
        else if (v < a.n_before) /* an earlier gi has taken this adjoint over */
            v = unary(&a, OP_IDENTITY, x, v);
        if (v < 0)
            goto done;
        take_over(g, v, id);
        for (int j = 0; j < a.n_before; j++) /* later gi with the same adjoint find it under its new id */
            if (a.adj[j] == v)
                a.adj[j] = id;
    }
    bool *dead = ir_calloc((size_t)g->n_nodes + 1, sizeof *dead);
    if (!dead) {
        diag_error(c->d, grad->loc, "out of memory");
        goto done;
    }
    dead[at] = true;
    graph_remove_nodes(g, dead);
    ir_free(dead);
    rc = graph_sort(g) ? diag_error(c->d, (Loc){0}, "out of memory") : 0;
done:
    ir_free(a.adj);
    ir_free(a.wanted);
    return rc;
}

int pass_autodiff(PassContext *c) {
    for (int i = 0; i < c->g->n_nodes; i++)
        if (c->g->nodes[i]->op == OP_GRAD) {
            if (expand_grad(c, i))
                return -1;
            i = -1; /* the graph was re-sorted */
        }
    return 0;
}
