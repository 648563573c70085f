/* Lowering of the backward graph's own ops (ir/op_grad.c): one LOOP kernel over the
 * output's elements each, or for the pools' gradients (ir/op_pool.c) over the
 * (batch, channel) planes. The derivative expressions are the C derivative columns
 * of ir/unary.def and ir/binary.def, in float, with the reference's conventions at
 * the kinks. */
#include "codegen.h"

#include <string.h>

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
    KExpr *x = k_var(b, kb_let(b, "x", KT_F32, k_load(b, kb_value(b, n->in[1], false), i)));
    store_scaled(b, n, i, f, 1, &x);
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

/* Opens `for (int64_t VAR0 = 0; VAR0 < dims[0]; VAR0++) {` and so on for ns dims. */
static void open_loops(Str *s, const char *var, const int64_t *dims, int ns) {
    for (int k = 0; k < ns; k++)
        str_printf(s, "for (int64_t %s%d = 0; %s%d < %lld; %s%d++) {\n", var, k, var, k, (long long)dims[k],
                   var, k);
}

static void close_loops(Str *s, int ns) {
    for (int k = 0; k < ns; k++)
        str_printf(s, "}\n");
}

/* sum of VAR0 * strides[0] + ... into e (appended). */
static void offset_expr(char *e, size_t cap, const char *var, const int64_t *strides, int ns) {
    char name[16];
    for (int k = 0; k < ns; k++) {
        snprintf(name, sizeof name, "%s%d", var, k);
        append_term(e, cap, name, strides[k]);
    }
    if (!*e)
        snprintf(e, cap, "0");
}

/* The LOOP of a pool gradient, one iteration per (batch, channel) plane of dx: the
 * planes' pointers dxp and dyp (and xp, with x), the plane of dx zeroed, and the
 * loops over dy's positions p opened; *at and *yat are the offsets of q in x and of
 * p in dy. The caller emits the body and closes the loops. */
static Kernel *plane_grad_loop(Program *p, const Node *n, const View *xv, const View *yv, bool with_x,
                               char *at, char *yat, size_t cap, Diag *d) {
    int ns = xv->ns;
    int64_t plane = 1;
    for (int j = 0; j < ns; j++)
        plane *= xv->sp[j];
    Kernel *k = kernel_loop(p, n, NULL, xv->n * xv->c, 16384 / (plane ? plane : 1) + 1, d);
    if (!k)
        return NULL;
    Str *s = &k->body;
    str_printf(s, "int64_t b = i / %lld, c = i %% %lld;\n", (long long)xv->c, (long long)xv->c);
    str_printf(s, "float *dxp = %s + b * %lld + c * %lld;\n", value_name(p, n->out[0]), (long long)xv->sn,
               (long long)xv->sc);
    if (with_x)
        str_printf(s, "const float *xp = %s + b * %lld + c * %lld;\n", value_name(p, n->in[1]),
                   (long long)xv->sn, (long long)xv->sc);
    str_printf(s, "const float *dyp = %s + b * %lld + c * %lld;\n", value_name(p, n->in[0]),
               (long long)yv->sn, (long long)yv->sc);
    at[0] = yat[0] = 0;
    offset_expr(at, cap, "q", xv->ss, ns);
    open_loops(s, "q", xv->sp, ns);
    str_printf(s, "dxp[%s] = 0.0f;\n", at);
    close_loops(s, ns);
    offset_expr(yat, cap, "p", yv->ss, ns);
    open_loops(s, "p", yv->sp, ns);
    return k;
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
    char at[256], yat[256];
    Kernel *k = plane_grad_loop(p, n, &xv, &yv, true, at, yat, sizeof at, d);
    if (!k)
        return -1;
    Str *s = &k->body;
    str_printf(s, "float g = dyp[%s];\n", yat);
    for (int j = 0; j < ns; j++)
        str_printf(s, "int64_t s%d = p%d * %lld - %lld;\n", j, j, (long long)strides[j], (long long)pads[j]);
    char xat[256] = "";
    offset_expr(xat, sizeof xat, "h", xv.ss, ns);
    if (is_max) {
        str_printf(s, "int64_t best = -1;\nfloat m = -INFINITY;\n");
    } else {
        str_printf(s, "int64_t count = 1;\n");
        for (int j = 0; j < ns; j++)
            if (node_bool(n, ATTR_COUNT_INCLUDE_PAD))
                str_printf(s, "count *= (s%d + %lld < %lld ? s%d + %lld : %lld) - s%d;\n", j,
                           (long long)kernel[j], (long long)(xv.sp[j] + pads[ns + j]), j,
                           (long long)kernel[j], (long long)(xv.sp[j] + pads[ns + j]), j);
            else
                str_printf(s, "count *= (s%d + %lld < %lld ? s%d + %lld : %lld) - (s%d > 0 ? s%d : 0);\n", j,
                           (long long)kernel[j], (long long)xv.sp[j], j, (long long)kernel[j],
                           (long long)xv.sp[j], j, j);
        str_printf(s, "float share = (float)((double)g / (double)count);\n");
    }
    open_loops(s, "k", kernel, ns);
    for (int j = 0; j < ns; j++)
        str_printf(s, "int64_t h%d = s%d + k%d * %lld;\nif (h%d < 0 || h%d >= %lld) continue;\n", j, j, j,
                   (long long)dilations[j], j, j, (long long)xv.sp[j]);
    if (is_max)
        str_printf(s,
                   "int64_t at = %s;\nfloat v = xp[at];\nif (best < 0 || v != v || v > m) {\nbest = at;\nm = "
                   "v;\n}\n",
                   xat);
    else
        str_printf(s, "dxp[%s] += share;\n", xat);
    close_loops(s, ns);
    if (is_max)
        str_printf(s, "if (best >= 0)\ndxp[best] += g;\n");
    close_loops(s, ns);
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
    char at[256], yat[256];
    Kernel *k = plane_grad_loop(p, n, &xv, &yv, false, at, yat, sizeof at, d);
    if (!k)
        return -1;
    Str *s = &k->body;
    str_printf(s, "int64_t count = 1;\n");
    for (int j = 0; j < ns; j++) {
        long long in = xv.sp[j], out = yv.sp[j];
        str_printf(s, "int64_t s%d = p%d * %lld / %lld, e%d = ((p%d + 1) * %lld + %lld) / %lld;\n", j, j, in,
                   out, j, j, in, out - 1, out);
        str_printf(s, "count *= e%d - s%d;\n", j, j);
    }
    str_printf(s, "float share = (float)((double)dyp[%s] / (double)count);\n", yat);
    for (int j = 0; j < ns; j++)
        str_printf(s, "for (int64_t q%d = s%d; q%d < e%d; q%d++) {\n", j, j, j, j, j);
    str_printf(s, "dxp[%s] += share;\n", at);
    close_loops(s, ns);
    close_loops(s, ns);
    return 0;
}
