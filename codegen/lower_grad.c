/* Lowering of the backward graph's own ops (ir/op_grad.c): one LOOP kernel over the
 * output's elements each. The derivative expressions are those of the reference
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
    const char *op = node_enum(n, "op");
    char a[48], b[48];
    if (strcmp(op, "relu") == 0)
        snprintf(e, cap, "x > 0.0f ? 1.0f : 0.0f");
    else if (strcmp(op, "sigmoid") == 0)
        snprintf(e, cap, "(1.0f / (1.0f + expf(-x))) * (1.0f - 1.0f / (1.0f + expf(-x)))");
    else if (strcmp(op, "tanh") == 0)
        snprintf(e, cap, "1.0f - tanhf(x) * tanhf(x)");
    else if (strcmp(op, "exp") == 0)
        snprintf(e, cap, "expf(x)");
    else if (strcmp(op, "log") == 0)
        snprintf(e, cap, "1.0f / x");
    else if (strcmp(op, "sqrt") == 0)
        snprintf(e, cap, "0.5f / sqrtf(x)");
    else if (strcmp(op, "neg") == 0)
        snprintf(e, cap, "-1.0f");
    else if (strcmp(op, "abs") == 0)
        snprintf(e, cap, "(float)((x > 0.0f) - (x < 0.0f))");
    else if (strcmp(op, "erf") == 0)
        snprintf(e, cap, "1.12837917f * expf(-x * x)");
    else if (strcmp(op, "leaky_relu") == 0) {
        float_literal(node_float(n, "alpha"), a, sizeof a);
        snprintf(e, cap, "x > 0.0f ? 1.0f : %s", a);
    } else if (strcmp(op, "clip") == 0) {
        float_literal(node_float(n, "min"), a, sizeof a);
        float_literal(node_float(n, "max"), b, sizeof b);
        snprintf(e, cap, "x >= %s && x <= %s ? 1.0f : 0.0f", a, b);
    } else if (strcmp(op, "gelu") == 0) {
        if (strcmp(node_enum(n, "approximate"), "tanh") == 0)
            snprintf(e, cap,
                     "0.5f * (1.0f + tanhf(0.797884561f * (x + 0.044715f * x * x * x))) + 0.5f * x * "
                     "(1.0f - tanhf(0.797884561f * (x + 0.044715f * x * x * x)) * tanhf(0.797884561f * (x + "
                     "0.044715f * x * x * x))) * 0.797884561f * (1.0f + 0.134145f * x * x)");
        else
            snprintf(e, cap,
                     "0.5f * (1.0f + erff(x * 0.707106781f)) + x * 0.398942280f * expf(-0.5f * x * x)");
    } else if (strcmp(op, "hardsigmoid") == 0) {
        float_literal(node_float(n, "alpha"), a, sizeof a);
        float_literal(node_float(n, "beta"), b, sizeof b);
        snprintf(e, cap, "%s * x + %s > 0.0f && %s * x + %s < 1.0f ? %s : 0.0f", a, b, a, b, a);
    } else if (strcmp(op, "hardswish") == 0)
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
    const char *op = node_enum(n, "op");
    bool wrt_b = strcmp(node_enum(n, "wrt"), "b") == 0;
    const char *e;
    if (strcmp(op, "pow") == 0)
        e = wrt_b ? "a == 0.0f && b >= 0.0f ? 0.0f : powf(a, b) * logf(a)"
                  : "b == 0.0f ? 0.0f : b * powf(a, b - 1.0f)";
    else if (strcmp(op, "max") == 0)
        e = wrt_b ? "a == b ? 0.5f : (b > a ? 1.0f : 0.0f)" : "a == b ? 0.5f : (a > b ? 1.0f : 0.0f)";
    else
        e = wrt_b ? "a == b ? 0.5f : (b < a ? 1.0f : 0.0f)" : "a == b ? 0.5f : (a < b ? 1.0f : 0.0f)";
    str_printf(&k->body, "float a = %s[%s], b = %s[%s];\n%s[i] = %s[i] * (%s);\n", value_name(p, n->in[1]),
               ia, value_name(p, n->in[2]), ib, value_name(p, n->out[0]), value_name(p, n->in[0]), e);
    return 0;
}
