/* Lowering of the backward graph's own ops (ir/op_grad.c): one LOOP kernel over the
 * output's elements each, or for the pools' gradients (ir/op_pool.c) over the
 * (batch, channel) planes. The derivative expressions are the C derivative columns
 * of ir/unary.def and ir/binary.def, in float, with the reference's conventions at
 * the kinks. */
#include "codegen.h"

#include <string.h>

#include <math.h>

enum { GRAD_GRAIN = 16384 };

/* Every input of the output's type is read only at the element written. */
static Kernel *loop_over_output(Program *p, const Node *n, Diag *d) {
    Kernel *k = kernel_loop(p, n, NULL, type_numel(&p->g->values[n->out[0]].type), GRAD_GRAIN, d);
    if (k)
        k->in_place = true;
    return k;
}

int lower_expand(Program *p, const Node *n, Diag *d) {
    Kernel *k = loop_over_output(p, n, d);
    if (!k)
        return -1;
    KBuilder *b = &k->b;
    const Type *to = &p->g->values[n->out[0]].type;
    KExpr *i = k_var(b, k->iter), *o[KILN_MAX_RANK];
    kb_unravel(b, i, to, "o", o);
    KView x = kview_broadcast(&p->g->values[n->in[0]].type, to);
    kb_store(b, kb_value(b, n->out[0], true), i,
             k_load(b, kb_value(b, n->in[0], false), kview_index(b, &x, o)));
    return 0;
}

/* dy[i] * the derivative formula f over operands (each a let of the element it reads). */
static void store_scaled(KBuilder *b, const Node *n, KExpr *i, const char *f, int count, KExpr **operands) {
    KExpr *dy = k_load(b, kb_value(b, n->in[0], false), i);
    kb_store(b, kb_value(b, n->out[0], true), i, k_mul(b, dy, k_formula(b, KT_F32, f, count, operands)));
}

int lower_unary_grad(Program *p, const Node *n, Diag *d) {
    Kernel *k = loop_over_output(p, n, d);
    if (!k)
        return -1;
    KBuilder *b = &k->b;
    KExpr *i = k_var(b, k->iter);
    char f[768];
    unary_derivative_formula(differentiated_op(n), n, f, sizeof f);
    /* a constant derivative (floor's 0) names no x, its operand $0 */
    KExpr *x =
        strstr(f, "$0") ? k_var(b, kb_let(b, "x", KT_F32, k_load(b, kb_value(b, n->in[1], false), i))) : NULL;
    store_scaled(b, n, i, f, x ? 1 : 0, &x);
    return 0;
}

int lower_binary_grad(Program *p, const Node *n, Diag *d) {
    Kernel *k = loop_over_output(p, n, d);
    if (!k)
        return -1;
    KBuilder *b = &k->b;
    const Type *to = &p->g->values[n->out[0]].type;
    KExpr *i = k_var(b, k->iter), *o[KILN_MAX_RANK], *at[2] = {i, i}, *x[2];
    bool broadcast = false;
    for (int j = 0; j < 2; j++)
        broadcast |= !type_equal(&p->g->values[n->in[1 + j]].type, to);
    if (broadcast)
        kb_unravel(b, i, to, "o", o);
    for (int j = 0; j < 2; j++) {
        const Type *t = &p->g->values[n->in[1 + j]].type;
        if (!type_equal(t, to)) {
            KView v = kview_broadcast(t, to);
            at[j] = kview_index(b, &v, o);
        }
    }
    x[0] = k_var(b, kb_let(b, "a", KT_F32, k_load(b, kb_value(b, n->in[1], false), at[0])));
    x[1] = k_var(b, kb_let(b, "b", KT_F32, k_load(b, kb_value(b, n->in[2], false), at[1])));
    char f[512];
    binary_formula(differentiated_op(n), node_enum(n, ATTR_WRT) == WRT_B ? 2 : 1, f, sizeof f);
    store_scaled(b, n, i, f, 2, x);
    return 0;
}

/* Opens loops VAR0 < dims[0], VAR1 < dims[1], ... (closed by ns kb_end), their
 * variables into idx. */
static void open_loops(KBuilder *b, const char *var, const int64_t *dims, int ns, KExpr **idx) {
    for (int j = 0; j < ns; j++)
        idx[j] = k_var(b, kb_for(b, kb_name(b, var, j), KT_I64, k_int(b, 0), k_int(b, dims[j]), NULL, 0));
}

static void close_blocks(KBuilder *b, int count) {
    for (int j = 0; j < count; j++)
        kb_end(b);
}

/* sum of idx[j] * strides[j]. */
static KExpr *offset_of(KBuilder *b, KExpr *const *idx, const int64_t *strides, int ns) {
    KExpr *e = k_int(b, 0);
    for (int j = 0; j < ns; j++)
        e = k_add(b, e, k_mul(b, idx[j], k_int(b, strides[j])));
    return e;
}

/* A pool gradient's plane: iteration i of its LOOP is one (batch, channel) plane of
 * dx, at offset dxo in dx (xo in x, yo in dy); the plane zeroed, then the loops
 * over dy's positions p opened (the caller closes them). */
typedef struct {
    Kernel *k;
    int dx, x, dy;
    KExpr *dxo, *xo, *yo;
    KExpr *p[3];
} PlaneLoop;

static int plane_grad_loop(Program *p, const Node *n, const View *xv, const View *yv, bool with_x,
                           PlaneLoop *pl, Diag *d) {
    int ns = xv->ns;
    int64_t plane = 1;
    for (int j = 0; j < ns; j++)
        plane *= xv->sp[j];
    Kernel *k = kernel_loop(p, n, NULL, xv->n * xv->c, 16384 / (plane ? plane : 1) + 1, d);
    if (!k)
        return -1;
    KBuilder *b = &k->b;
    KExpr *i = k_var(b, k->iter);
    KExpr *bi = k_var(b, kb_let(b, "b", KT_I64, k_div(b, i, k_int(b, xv->c))));
    KExpr *c = k_var(b, kb_let(b, "c", KT_I64, k_mod(b, i, k_int(b, xv->c))));
    *pl = (PlaneLoop){.k = k, .dx = kb_value(b, n->out[0], true), .dy = kb_value(b, n->in[0], false)};
    pl->dxo = k_var(
        b, kb_let(b, "dxo", KT_I64, k_add(b, k_mul(b, bi, k_int(b, xv->sn)), k_mul(b, c, k_int(b, xv->sc)))));
    if (with_x) {
        pl->x = kb_value(b, n->in[1], false);
        pl->xo = k_var(b, kb_let(b, "xo", KT_I64,
                                 k_add(b, k_mul(b, bi, k_int(b, xv->sn)), k_mul(b, c, k_int(b, xv->sc)))));
    }
    pl->yo = k_var(
        b, kb_let(b, "yo", KT_I64, k_add(b, k_mul(b, bi, k_int(b, yv->sn)), k_mul(b, c, k_int(b, yv->sc)))));
    KExpr *q[3];
    open_loops(b, "q", xv->sp, ns, q);
    kb_store(b, pl->dx, k_add(b, pl->dxo, offset_of(b, q, xv->ss, ns)), k_f32(b, 0));
    close_blocks(b, ns);
    open_loops(b, "p", yv->sp, ns, pl->p);
    return 0;
}

/* min(v, hi) as C's v < hi ? v : hi. */
static KExpr *at_most(KBuilder *b, KExpr *v, KExpr *hi) {
    return k_select(b, k_lt(b, v, hi), v, hi);
}

enum { MAX_NHWC_CHANNELS = 4096 }; /* max_pool_grad_nhwc's local arrays: 48 KiB at most */

/* for (NAME = 0; NAME < count; NAME++) over channels, vectorized; opened. */
static KExpr *channel_loop(KBuilder *b, const char *name, int64_t count) {
    return k_var(b, kb_for(b, name, KT_I64, k_int(b, 0), k_int(b, count), NULL, K_VECTOR));
}

/* max_pool_grad with channels last on the C target: iteration i is batch item i of
 * dx, zeroed; then each of dy's windows finds its first maximum in every channel at
 * once, the loop over the channels innermost (contiguous elements, vectorized) and
 * the running maxima in local arrays, and adds dy there. Each element of dx takes
 * its windows in the reference's order, as in lower_pool_grad, whose planes would
 * read one float of every cache line of x (CUDA's threads, one a plane, read
 * adjacent channels together, and keep them). */
static int max_pool_grad_nhwc(Program *p, const Node *n, const View *xv, const View *yv,
                              const int64_t *kernel, const int64_t *strides, const int64_t *pads,
                              const int64_t *dilations, Diag *d) {
    int ns = xv->ns;
    int64_t c = xv->c, item = c;
    for (int j = 0; j < ns; j++)
        item *= xv->sp[j];
    Kernel *k = kernel_loop(p, n, NULL, xv->n, 1, d);
    if (!k)
        return -1;
    KBuilder *b = &k->b;
    KExpr *i = k_var(b, k->iter);
    int dx = kb_value(b, n->out[0], true), dy = kb_value(b, n->in[0], false),
        x = kb_value(b, n->in[1], false);
    KExpr *xo = k_var(b, kb_let(b, "xo", KT_I64, k_mul(b, i, k_int(b, xv->sn))));
    KExpr *yo = k_var(b, kb_let(b, "yo", KT_I64, k_mul(b, i, k_int(b, yv->sn))));
    KExpr *e = channel_loop(b, "e", item);
    kb_store(b, dx, k_add(b, xo, e), k_f32(b, 0));
    kb_end(b);
    int best = kb_array(b, "best", KT_I64, c, 0, false, false),
        m = kb_array(b, "m", KT_F32, c, 0, false, false);
    KExpr *pp[3], *st[3], *kk[3], *h[3];
    open_loops(b, "p", yv->sp, ns, pp);
    for (int j = 0; j < ns; j++)
        st[j] = k_var(b, kb_let(b, kb_name(b, "s", j), KT_I64,
                                k_sub(b, k_mul(b, pp[j], k_int(b, strides[j])), k_int(b, pads[j]))));
    KExpr *ch = channel_loop(b, "ch", c);
    kb_store(b, best, ch, k_int(b, -1));
    kb_store(b, m, ch, k_f32(b, -INFINITY));
    kb_end(b);
    open_loops(b, "k", kernel, ns, kk);
    for (int j = 0; j < ns; j++) { /* a tap outside x takes no part */
        h[j] = k_var(b, kb_let(b, kb_name(b, "h", j), KT_I64,
                               k_add(b, st[j], k_mul(b, kk[j], k_int(b, dilations[j])))));
        kb_if(b, k_and(b, k_bin(b, KE_GE, h[j], k_int(b, 0)), k_lt(b, h[j], k_int(b, xv->sp[j]))));
    }
    KExpr *at = k_var(b, kb_let(b, "at", KT_I64, offset_of(b, h, xv->ss, ns)));
    KExpr *xat = k_var(b, kb_let(b, "xat", KT_I64, k_add(b, xo, at)));
    ch = channel_loop(b, "ch", c);
    KExpr *v = k_var(b, kb_let(b, "v", KT_F32, k_load(b, x, k_add(b, xat, ch))));
    KExpr *was = k_var(b, kb_let(b, "was", KT_I64, k_load(b, best, ch)));
    KExpr *high = k_var(b, kb_let(b, "high", KT_F32, k_load(b, m, ch)));
    KExpr *wins =
        k_var(b, kb_let(b, "wins", KT_BOOL,
                        k_bin(b, KE_OR, k_bin(b, KE_OR, k_lt(b, was, k_int(b, 0)), k_bin(b, KE_NE, v, v)),
                              k_bin(b, KE_GT, v, high))));
    kb_store(b, best, ch, k_select(b, wins, at, was));
    kb_store(b, m, ch, k_select(b, wins, v, high));
    kb_end(b);
    close_blocks(b, 2 * ns); /* the ifs and the tap loops */
    KExpr *yat = k_var(b, kb_let(b, "yat", KT_I64, k_add(b, yo, offset_of(b, pp, yv->ss, ns))));
    ch = k_var(b, kb_for(b, "ch", KT_I64, k_int(b, 0), k_int(b, c), NULL, 0));
    KExpr *winner = k_var(b, kb_let(b, "winner", KT_I64, k_load(b, best, ch)));
    kb_if(b, k_bin(b, KE_GE, winner, k_int(b, 0)));
    kb_store_add(b, dx, k_add(b, k_add(b, xo, winner), ch), k_load(b, dy, k_add(b, yat, ch)));
    kb_end(b);
    kb_end(b);
    close_blocks(b, ns);
    return 0;
}

/* Iteration i is one (batch, channel) plane of dx: zeroed, then each of dy's windows
 * adds its share, in the reference's order, so no two iterations write one element. */
int lower_pool_grad(Program *p, const Node *n, Diag *d) {
    const Graph *g = p->g;
    bool nhwc = layout_is_nhwc(n), is_max = n->op == OP_MAX_POOL_GRAD;
    View yv = view_of(&g->values[n->in[0]].type, nhwc), xv = view_of(&g->values[n->in[1]].type, nhwc);
    int ns = xv.ns;
    int64_t kernel[3], strides[3], pads[6], dilations[3] = {1, 1, 1};
    node_ints(n, ATTR_KERNEL, kernel, 3, ns);
    node_ints(n, ATTR_STRIDES, strides, 3, ns);
    node_ints(n, ATTR_PADS, pads, 6, 2 * ns);
    if (is_max)
        node_ints(n, ATTR_DILATIONS, dilations, 3, ns);
    if (p->target == TARGET_C && is_max && nhwc && xv.c <= MAX_NHWC_CHANNELS)
        return max_pool_grad_nhwc(p, n, &xv, &yv, kernel, strides, pads, dilations, d);
    PlaneLoop pl;
    if (plane_grad_loop(p, n, &xv, &yv, true, &pl, d))
        return -1;
    KBuilder *b = &pl.k->b;
    KExpr *gv =
        k_var(b, kb_let(b, "g", KT_F32, k_load(b, pl.dy, k_add(b, pl.yo, offset_of(b, pl.p, yv.ss, ns)))));
    KExpr *st[3], *h[3] = {NULL, NULL, NULL}, *kk[3];
    for (int j = 0; j < ns; j++)
        st[j] = k_var(b, kb_let(b, kb_name(b, "s", j), KT_I64,
                                k_sub(b, k_mul(b, pl.p[j], k_int(b, strides[j])), k_int(b, pads[j]))));
    int best = -1, m = -1;
    KExpr *share = NULL;
    if (is_max) {
        best = kb_decl(b, "best", KT_I64, k_int(b, -1));
        m = kb_decl(b, "m", KT_F32, k_f32(b, -INFINITY));
    } else {
        int count = kb_decl(b, "count", KT_I64, k_int(b, 1));
        bool include_pad = node_bool(n, ATTR_COUNT_INCLUDE_PAD);
        for (int j = 0; j < ns; j++) {
            KExpr *end = at_most(b, k_add(b, st[j], k_int(b, kernel[j])),
                                 k_int(b, include_pad ? xv.sp[j] + pads[ns + j] : xv.sp[j]));
            KExpr *start =
                include_pad ? st[j] : k_select(b, k_bin(b, KE_GT, st[j], k_int(b, 0)), st[j], k_int(b, 0));
            kb_assign(b, count, k_mul(b, k_var(b, count), k_sub(b, end, start)));
        }
        share = k_var(b, kb_let(b, "share", KT_F32,
                                k_cast(b, KT_F32,
                                       k_div(b, k_cast(b, KT_F64, gv), k_cast(b, KT_F64, k_var(b, count))))));
    }
    open_loops(b, "k", kernel, ns, kk);
    for (int j = 0; j < ns; j++) { /* a tap outside x adds nothing */
        h[j] = k_var(b, kb_let(b, kb_name(b, "h", j), KT_I64,
                               k_add(b, st[j], k_mul(b, kk[j], k_int(b, dilations[j])))));
        kb_if(b, k_and(b, k_bin(b, KE_GE, h[j], k_int(b, 0)), k_lt(b, h[j], k_int(b, xv.sp[j]))));
    }
    KExpr *xat = offset_of(b, h, xv.ss, ns);
    if (is_max) {
        KExpr *at = k_var(b, kb_let(b, "at", KT_I64, xat));
        KExpr *v = k_var(b, kb_let(b, "v", KT_F32, k_load(b, pl.x, k_add(b, pl.xo, at))));
        kb_if(b, k_bin(b, KE_OR, k_bin(b, KE_OR, k_lt(b, k_var(b, best), k_int(b, 0)), k_bin(b, KE_NE, v, v)),
                       k_bin(b, KE_GT, v, k_var(b, m))));
        kb_assign(b, best, at);
        kb_assign(b, m, v);
        kb_end(b);
    } else
        kb_store_add(b, pl.dx, k_add(b, pl.dxo, xat), share);
    close_blocks(b, 2 * ns); /* the ifs and the tap loops */
    if (is_max) {
        kb_if(b, k_bin(b, KE_GE, k_var(b, best), k_int(b, 0)));
        kb_store_add(b, pl.dx, k_add(b, pl.dxo, k_var(b, best)), gv);
        kb_end(b);
    }
    close_blocks(b, ns);
    return 0;
}

/* As lower_pool_grad: iteration i is one (batch, channel) plane of dx, zeroed, then
 * each of dy's windows adds its share to every element of the window, in the
 * reference's order. The windows are torch's, [floor(p in / out), ceil((p + 1) in /
 * out)) along each dim, and may overlap. */
int lower_adaptive_avg_pool_grad(Program *p, const Node *n, Diag *d) {
    const Graph *g = p->g;
    bool nhwc = layout_is_nhwc(n);
    View yv = view_of(&g->values[n->in[0]].type, nhwc), xv = view_of(&g->values[n->in[1]].type, nhwc);
    int ns = xv.ns;
    PlaneLoop pl;
    if (plane_grad_loop(p, n, &xv, &yv, false, &pl, d))
        return -1;
    KBuilder *b = &pl.k->b;
    int count = kb_decl(b, "count", KT_I64, k_int(b, 1));
    KExpr *st[3], *en[3], *q[3] = {NULL, NULL, NULL};
    for (int j = 0; j < ns; j++) {
        int64_t in = xv.sp[j], out = yv.sp[j];
        st[j] = k_var(b, kb_let(b, kb_name(b, "s", j), KT_I64,
                                k_div(b, k_mul(b, pl.p[j], k_int(b, in)), k_int(b, out))));
        en[j] = k_var(b, kb_let(b, kb_name(b, "e", j), KT_I64,
                                k_div(b,
                                      k_add(b, k_mul(b, k_add(b, pl.p[j], k_int(b, 1)), k_int(b, in)),
                                            k_int(b, out - 1)),
                                      k_int(b, out))));
        kb_assign(b, count, k_mul(b, k_var(b, count), k_sub(b, en[j], st[j])));
    }
    KExpr *dy = k_load(b, pl.dy, k_add(b, pl.yo, offset_of(b, pl.p, yv.ss, ns)));
    KExpr *share = k_var(
        b, kb_let(b, "share", KT_F32,
                  k_cast(b, KT_F32, k_div(b, k_cast(b, KT_F64, dy), k_cast(b, KT_F64, k_var(b, count))))));
    for (int j = 0; j < ns; j++)
        q[j] = k_var(b, kb_for(b, kb_name(b, "q", j), KT_I64, st[j], en[j], NULL, 0));
    kb_store_add(b, pl.dx, k_add(b, pl.dxo, offset_of(b, q, xv.ss, ns)), share);
    close_blocks(b, 2 * ns);
    return 0;
}
