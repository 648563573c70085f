/* Lowering of the elementwise ops: one LOOP kernel over the output's elements.
 *
 * The scalar expression of each op is written once, here, in the C subset that C
 * and CUDA share; it computes in float, as the targets do. Binary ops with equal
 * shapes index both operands with `i`; with broadcasting, the output index is
 * unraveled and each operand gets its own offset with constant strides. Every
 * kernel here reads an operand of the result's type at the element it writes, so
 * all are marked in_place. The copy ops (reshape, flatten, squeeze, unsqueeze,
 * identity) are a plain copy, or nothing when the memory plan makes the result a
 * view of its input (view_of). */
#include "codegen.h"

#include <string.h>

enum { ELEMENTWISE_GRAIN = 16384 };

static Kernel *loop_over_output(Program *p, const Node *n, Diag *d) {
    Kernel *k = kernel_loop(p, n, NULL, type_numel(&p->g->values[n->out[0]].type), ELEMENTWISE_GRAIN, d);
    if (k)
        k->in_place = true;
    return k;
}

/* The expression of a unary op applied to `x` (a float). */
static void unary_expr(const Node *n, char *e, size_t cap) {
    char a[48], b[48];
    switch (n->op) {
    case OP_RELU: snprintf(e, cap, "x > 0.0f ? x : (x == x ? 0.0f : x)"); break;
    case OP_SIGMOID: snprintf(e, cap, "1.0f / (1.0f + expf(-x))"); break;
    case OP_TANH: snprintf(e, cap, "tanhf(x)"); break;
    case OP_EXP: snprintf(e, cap, "expf(x)"); break;
    case OP_LOG: snprintf(e, cap, "logf(x)"); break;
    case OP_SQRT: snprintf(e, cap, "sqrtf(x)"); break;
    case OP_NEG: snprintf(e, cap, "-x"); break;
    case OP_ABS: snprintf(e, cap, "fabsf(x)"); break;
    case OP_ERF: snprintf(e, cap, "erff(x)"); break;
    case OP_LEAKY_RELU:
        float_literal(node_float(n, "alpha"), a, sizeof a);
        snprintf(e, cap, "x < 0.0f ? %s * x : x", a);
        break;
    case OP_CLIP:
        /* NaN passes through, as in the interpreter */
        float_literal(node_float(n, "min"), a, sizeof a);
        float_literal(node_float(n, "max"), b, sizeof b);
        snprintf(e, cap, "x != x ? x : fminf(fmaxf(x, %s), %s)", a, b);
        break;
    case OP_GELU:
        if (strcmp(node_enum(n, "approximate"), "tanh") == 0)
            snprintf(e, cap, "0.5f * x * (1.0f + tanhf(0.797884561f * (x + 0.044715f * x * x * x)))");
        else
            snprintf(e, cap, "0.5f * x * (1.0f + erff(x * 0.707106781f))");
        break;
    case OP_HARDSIGMOID:
        float_literal(node_float(n, "alpha"), a, sizeof a);
        float_literal(node_float(n, "beta"), b, sizeof b);
        snprintf(e, cap, "x != x ? x : fmaxf(0.0f, fminf(1.0f, %s * x + %s))", a, b);
        break;
    case OP_HARDSWISH: snprintf(e, cap, "x != x ? x : x * fmaxf(0.0f, fminf(1.0f, x / 6.0f + 0.5f))"); break;
    default: KILN_ASSERT(!"not a unary op");
    }
}

int lower_unary(Program *p, const Node *n, Diag *d) {
    Kernel *k = loop_over_output(p, n, d);
    if (!k)
        return -1;
    char e[256];
    unary_expr(n, e, sizeof e);
    str_printf(&k->body, "float x = %s[i];\n%s[i] = %s;\n", value_name(p, n->in[0]), value_name(p, n->out[0]),
               e);
    return 0;
}

static const char *binary_expr(OpId op) {
    switch (op) {
    case OP_ADD: return "a + b";
    case OP_SUB: return "a - b";
    case OP_MUL: return "a * b";
    case OP_DIV: return "a / b";
    case OP_POW: return "powf(a, b)";
    case OP_MAX: return "a != a || b != b ? a + b : fmaxf(a, b)";
    case OP_MIN: return "a != a || b != b ? a + b : fminf(a, b)";
    default: KILN_ASSERT(!"not a binary op");
    }
    return NULL;
}

int lower_binary(Program *p, const Node *n, Diag *d) {
    Kernel *k = loop_over_output(p, n, d);
    if (!k)
        return -1;
    const Type *ta = &p->g->values[n->in[0]].type, *tb = &p->g->values[n->in[1]].type;
    const Type *to = &p->g->values[n->out[0]].type;
    char ia[512] = "i", ib[512] = "i";
    if (!type_equal(ta, to) || !type_equal(tb, to)) {
        emit_unravel(&k->body, "i", to, "o");
        if (!type_equal(ta, to))
            broadcast_offset(ta, to, "o", ia, sizeof ia);
        if (!type_equal(tb, to))
            broadcast_offset(tb, to, "o", ib, sizeof ib);
    }
    str_printf(&k->body, "float a = %s[%s], b = %s[%s];\n%s[i] = %s;\n", value_name(p, n->in[0]), ia,
               value_name(p, n->in[1]), ib, value_name(p, n->out[0]), binary_expr(n->op));
    return 0;
}

int lower_copy(Program *p, const Node *n, Diag *d) {
    if (p->view_of && p->view_of[n->out[0]] >= 0)
        return 0;
    Kernel *k = loop_over_output(p, n, d);
    if (!k)
        return -1;
    str_printf(&k->body, "%s[i] = %s[i];\n", value_name(p, n->out[0]), value_name(p, n->in[0]));
    return 0;
}
