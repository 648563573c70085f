/* Lowering of the backward graph's own ops (ir/op_grad.c): one LOOP kernel over the
 * output's elements each, or for the pools' gradients (ir/op_pool.c) over the
 * (batch, channel) planes. The derivative expressions are those of the reference
 * kernels, in float, with the same conventions at the kinks. */
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
    const Type *tx = &p->g->values[n->in[0]].type, *to = &p->g->values[n->out[0]].type;
    char at[512];
    emit_unravel(&k->body, "i", to, "o");
    broadcast_offset(tx, to, "o", at, sizeof at);
    str_printf(&k->body, "%s[i] = %s[%s];\n", value_name(p, n->out[0]), value_name(p, n->in[0]), at);
    return 0;
}

/* f'(x) of unary_grad's op, as a float expression of x. */
static void derivative_expr(const Node *n, char *e, size_t cap) {
    int op = node_enum(n, ATTR_OP);
    char a[48], b[48];
    if (op == UNARY_GRAD_OP_RELU)
        snprintf(e, cap, "x > 0.0f ? 1.0f : 0.0f");
    else if (op == UNARY_GRAD_OP_SIGMOID)
        snprintf(e, cap, "(1.0f / (1.0f + expf(-x))) * (1.0f - 1.0f / (1.0f + expf(-x)))");
    else if (op == UNARY_GRAD_OP_TANH)
        snprintf(e, cap, "1.0f - tanhf(x) * tanhf(x)");
    else if (op == UNARY_GRAD_OP_EXP)
        snprintf(e, cap, "expf(x)");
    else if (op == UNARY_GRAD_OP_LOG)
        snprintf(e, cap, "1.0f / x");
    else if (op == UNARY_GRAD_OP_SQRT)
        snprintf(e, cap, "0.5f / sqrtf(x)");
    else if (op == UNARY_GRAD_OP_NEG)
        snprintf(e, cap, "-1.0f");
    else if (op == UNARY_GRAD_OP_ABS)
        snprintf(e, cap, "(float)((x > 0.0f) - (x < 0.0f))");
    else if (op == UNARY_GRAD_OP_ERF)
        snprintf(e, cap, "1.12837917f * expf(-x * x)");
    else if (op == UNARY_GRAD_OP_LEAKY_RELU) {
        float_literal(node_float(n, ATTR_ALPHA), a, sizeof a);
        snprintf(e, cap, "x > 0.0f ? 1.0f : %s", a);
    } else if (op == UNARY_GRAD_OP_CLIP) {
        float_literal(node_float(n, ATTR_MIN), a, sizeof a);
        float_literal(node_float(n, ATTR_MAX), b, sizeof b);
        snprintf(e, cap, "x >= %s && x <= %s ? 1.0f : 0.0f", a, b);
    } else if (op == UNARY_GRAD_OP_GELU) {
        if (node_enum(n, ATTR_APPROXIMATE) == GELU_TANH)
            snprintf(e, cap,
                     "0.5f * (1.0f + tanhf(0.797884561f * (x + 0.044715f * x * x * x))) + 0.5f * x * "
                     "(1.0f - tanhf(0.797884561f * (x + 0.044715f * x * x * x)) * tanhf(0.797884561f * (x + "
                     "0.044715f * x * x * x))) * 0.797884561f * (1.0f + 0.134145f * x * x)");
        else
            snprintf(e, cap,
                     "0.5f * (1.0f + erff(x * 0.707106781f)) + x * 0.398942280f * expf(-0.5f * x * x)");
    } else if (op == UNARY_GRAD_OP_HARDSIGMOID) {
        float_literal(node_float(n, ATTR_ALPHA), a, sizeof a);
        float_literal(node_float(n, ATTR_BETA), b, sizeof b);
        snprintf(e, cap, "%s * x + %s > 0.0f && %s * x + %s < 1.0f ? %s : 0.0f", a, b, a, b, a);
    } else if (op == UNARY_GRAD_OP_HARDSWISH)
        snprintf(e, cap, "x < -3.0f ? 0.0f : x <= 3.0f ? x / 3.0f + 0.5f : 1.0f");
    else
        KILN_ASSERT(!"not a unary op");
}

int lower_unary_grad(Program *p, const Node *n, Diag *d) {
    Kernel *k = loop_over_output(p, n, d);
    if (!k)
        return -1;
    char e[768];
    derivative_expr(n, e, sizeof e);
    str_printf(&k->body, "float x = %s[i];\n%s[i] = %s[i] * (%s);\n", value_name(p, n->in[1]),
               value_name(p, n->out[0]), value_name(p, n->in[0]), e);
    return 0;
}

int lower_binary_grad(Program *p, const Node *n, Diag *d) {
    Kernel *k = loop_over_output(p, n, d);
    if (!k)
        return -1;
    const Type *ta = &p->g->values[n->in[1]].type, *tb = &p->g->values[n->in[2]].type;
    const Type *to = &p->g->values[n->out[0]].type;
    char ia[512] = "i", ib[512] = "i";
    if (!type_equal(ta, to) || !type_equal(tb, to)) {
        emit_unravel(&k->body, "i", to, "o");
        if (!type_equal(ta, to))
            broadcast_offset(ta, to, "o", ia, sizeof ia);
        if (!type_equal(tb, to))
            broadcast_offset(tb, to, "o", ib, sizeof ib);
    }
    int op = node_enum(n, ATTR_OP);
    bool wrt_b = node_enum(n, ATTR_WRT) == WRT_B;
    const char *e;
    if (op == BINARY_GRAD_OP_POW)
        e = wrt_b ? "a == 0.0f && b >= 0.0f ? 0.0f : powf(a, b) * logf(a)"
                  : "b == 0.0f ? 0.0f : b * powf(a, b - 1.0f)";
    else if (op == BINARY_GRAD_OP_MAX)
        e = wrt_b ? "a == b ? 0.5f : (b > a ? 1.0f : 0.0f)" : "a == b ? 0.5f : (a > b ? 1.0f : 0.0f)";
    else
        e = wrt_b ? "a == b ? 0.5f : (b < a ? 1.0f : 0.0f)" : "a == b ? 0.5f : (a < b ? 1.0f : 0.0f)";
    str_printf(&k->body, "float a = %s[%s], b = %s[%s];\n%s[i] = %s[i] * (%s);\n", value_name(p, n->in[1]),
               ia, value_name(p, n->in[2]), ib, value_name(p, n->out[0]), value_name(p, n->in[0]), e);
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
static Kernel *plane_grad_loop(Program *p, const Node *n, const View *xv, const View *yv, bool with_x, char *at,
                               char *yat, size_t cap, Diag *d) {
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
    str_printf(s, "const float *dyp = %s + b * %lld + c * %lld;\n", value_name(p, n->in[0]), (long long)yv->sn,
               (long long)yv->sc);
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
