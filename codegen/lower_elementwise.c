/* Lowering of the elementwise ops: one LOOP kernel over the output's elements.
 *
 * The scalar expression of each op is written once, here, in the C subset that C
 * and CUDA share; it computes in float, as the targets do. Binary ops with equal
 * shapes index both operands with `i`; with broadcasting, the output index is
 * unraveled and each operand gets its own offset with constant strides. A fused
 * `elementwise` node reads each input once per element, then computes its
 * expression as one statement per call, each written with the expression of that
 * op's own kernel; where its inputs are contiguous or constant over blocks of the
 * output's trailing dims (a per-channel scale, a bias), it loops over blocks so
 * that offsets are computed once per block and the inner loop vectorizes. Every
 * kernel here reads an operand of the result's type only at the element it writes,
 * so all are marked in_place. The copy ops (reshape, flatten, squeeze, unsqueeze,
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

/* The expression of a unary op applied to `x` (a float). Clamps are written as
 * comparisons and selects rather than fminf/fmaxf, whose NaN rules keep GCC from
 * vectorizing them; a NaN passes through every op, as in the interpreter (a NaN
 * that hardsigmoid's alpha x + beta makes from a finite x clamps to 1, as fmin does). */
static void unary_expr(const Node *n, char *e, size_t cap) {
    char a[48], b[48], h[128];
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
        float_literal(node_float(n, ATTR_ALPHA), a, sizeof a);
        snprintf(e, cap, "x < 0.0f ? %s * x : x", a);
        break;
    case OP_CLIP:
        /* NaN passes through, as in the interpreter; min > max gives max */
        float_literal(node_float(n, ATTR_MIN), a, sizeof a);
        float_literal(node_float(n, ATTR_MAX), b, sizeof b);
        if (node_float(n, ATTR_MIN) > node_float(n, ATTR_MAX))
            snprintf(e, cap, "x != x ? x : %s", b);
        else
            snprintf(e, cap, "x < %s ? %s : (x > %s ? %s : x)", a, a, b, b);
        break;
    case OP_GELU:
        if (node_enum(n, ATTR_APPROXIMATE) == GELU_TANH)
            snprintf(e, cap, "0.5f * x * (1.0f + tanhf(0.797884561f * (x + 0.044715f * x * x * x)))");
        else
            snprintf(e, cap, "0.5f * x * (1.0f + erff(x * 0.707106781f))");
        break;
    case OP_HARDSIGMOID:
        float_literal(node_float(n, ATTR_ALPHA), a, sizeof a);
        float_literal(node_float(n, ATTR_BETA), b, sizeof b);
        snprintf(h, sizeof h, "%s * x + %s", a, b);
        snprintf(e, cap, "x != x ? x : (%s < 1.0f ? (%s > 0.0f ? %s : 0.0f) : 1.0f)", h, h, h);
        break;
    case OP_HARDSWISH:
        snprintf(h, sizeof h, "x / 6.0f + 0.5f");
        snprintf(e, cap, "x != x ? x : x * (%s < 1.0f ? (%s > 0.0f ? %s : 0.0f) : 1.0f)", h, h, h);
        break;
    default: KILN_ASSERT(!"not a unary op");
    }
}

int lower_unary(Program *p, const Node *n, Diag *d) {
    Kernel *k = loop_over_output(p, n, d);
    if (!k)
        return -1;
    char e[512];
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
    case OP_MAX: return "a != a ? a : (a > b ? a : b)";
    case OP_MIN: return "a != a ? a : (a < b ? a : b)";
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

/* ---- elementwise: a fused expression in one loop ---- */

/* Emits the statements computing e and writes the C expression of its result (a
 * variable `tN`, an input `xK` or a literal) into r. Each call is a block that
 * binds the operands to the names its op's expression uses (`x`, or `a` and `b`),
 * so a fused op computes exactly what its own kernel computes. */
void emit_expr(Str *s, const Expr *e, int *next, char *r, size_t cap) {
    char a[48], b[48], body[512];
    switch (e->kind) {
    case EXPR_INPUT: snprintf(r, cap, "x%d", e->input); return;
    case EXPR_NUMBER: float_literal(e->number, r, cap); return;
    case EXPR_CALL: break;
    }
    emit_expr(s, e->arg[0], next, a, sizeof a);
    if (e->call.n_in == 2)
        emit_expr(s, e->arg[1], next, b, sizeof b);
    snprintf(r, cap, "t%d", (*next)++);
    if (e->call.n_in == 1) {
        unary_expr(&e->call, body, sizeof body);
        str_printf(s, "float %s;\n{\n    float x = %s;\n    %s = %s;\n}\n", r, a, r, body);
    } else {
        str_printf(s, "float %s;\n{\n    float a = %s, b = %s;\n    %s = %s;\n}\n", r, a, b, r,
                   binary_expr(e->call.op));
    }
}

/* Appends text with every line indented by `indent`. */
static void append_indented(Str *dst, const char *text, const char *indent) {
    for (const char *line = text; *line;) {
        const char *nl = strchr(line, '\n');
        int len = nl ? (int)(nl - line) : (int)strlen(line);
        str_printf(dst, "%s%.*s\n", indent, len, line);
        line += len + (nl != NULL);
    }
}

/* Emits, at `ind`, the statements giving `x0` (the element's value so far) the
 * epilogue and storing it into dst: n's inputs from expr_first_input(n) on are
 * read at offset `at` (when not NULL) of the element in the result. */
static void emit_element_epilogue(Str *s, const Program *p, const Node *n, const Expr *epilogue, const char *at,
                                  const char *dst, const char *ind) {
    char res[48] = "x0";
    if (epilogue) {
        int first = expr_first_input(n), next = 0;
        for (int k = first; k < n->n_in; k++) {
            bool one = type_numel(&p->g->values[n->in[k]].type) == 1;
            str_printf(s, "%sfloat x%d = %s[%s];\n", ind, k - first + 1, value_name(p, n->in[k]), one ? "0" : at);
        }
        Str calc = {0};
        emit_expr(&calc, epilogue, &next, res, sizeof res);
        append_indented(s, calc.s ? calc.s : "", ind);
        s->oom |= calc.oom;
        str_free(&calc);
    }
    str_printf(s, "%s%s = %s;\n", ind, dst, res);
}

void emit_tile_epilogue(Str *s, const Program *p, const Node *n, const Expr *epilogue, const char *bias,
                        const char *bias_at, const char *rows, const char *cols, int64_t ld, int64_t step) {
    bool biased = bias_at && bias[0];
    if (!biased && !epilogue)
        return;
    int first = expr_first_input(n);
    bool located = false; /* some input is read at the element's offset in y */
    for (int k = first; epilogue && k < n->n_in; k++)
        located |= type_numel(&p->g->values[n->in[k]].type) != 1;
    char at[96] = "", in_y[128], dst[128], plus_bias[160] = "";
    if (ld)
        append_term(at, sizeof at, "r", ld);
    append_term(at, sizeof at, "q", step);
    snprintf(in_y, sizeof in_y, "at0 + %s", at);
    snprintf(dst, sizeof dst, "tile[%s]", at);
    if (biased)
        snprintf(plus_bias, sizeof plus_bias, " + %s[%s]", bias, bias_at);
    if (located)
        str_printf(s, "int64_t at0 = tile - %s;\n", value_name(p, n->out[0]));
    str_printf(s, "for (int64_t r = 0; r < %s; r++)\n    for (int64_t q = 0; q < %s; q++) {\n", rows, cols);
    str_printf(s, "        float x0 = %s%s;\n", dst, plus_bias);
    emit_element_epilogue(s, p, n, epilogue, in_y, dst, "        ");
    str_printf(s, "    }\n");
}

void emit_gemm_store(Str *s, const Program *p, const Node *n, const Expr *epilogue, const char *bias,
                     const char *at) {
    char dst[160];
    snprintf(dst, sizeof dst, "%s[%s]", value_name(p, n->out[0]), at);
    str_printf(s, "float x0 = acc%s%s;\n", bias ? " + " : "", bias ? bias : "");
    emit_element_epilogue(s, p, n, epilogue, at, dst, "");
}

/* How an input is read inside a block of the output's last dims: FULL when
 * it has those dims as the output does (contiguous in the block), CONST when they
 * are all 1 for it (one value for the whole block). */
enum { ANY, FULL, CONST };

/* The most trailing dims of `to` over which every used input is FULL or CONST
 * (for at most 64 inputs). */
static int block_dims(const Program *p, const Node *n, const bool *used, const Type *to) {
    int state[64] = {ANY};
    KILN_ASSERT(n->n_in <= 64);
    int s = 0;
    for (int k = to->rank - 1; k >= 0; k--, s++) {
        for (int i = 0; i < n->n_in; i++) {
            const Type *t = &p->g->values[n->in[i]].type;
            int at = k - (to->rank - t->rank);
            int64_t dim = at >= 0 ? t->dims[at] : 1;
            int here = to->dims[k] == 1 ? ANY : dim == 1 ? CONST : FULL;
            if (!used[i] || here == ANY)
                continue;
            if (state[i] != ANY && state[i] != here)
                return s;
        }
        for (int i = 0; i < n->n_in; i++) {
            const Type *t = &p->g->values[n->in[i]].type;
            int at = k - (to->rank - t->rank);
            int64_t dim = at >= 0 ? t->dims[at] : 1;
            if (used[i] && to->dims[k] != 1)
                state[i] = dim == 1 ? CONST : FULL;
        }
    }
    return s;
}

static void mark_used(const Expr *e, bool *used) {
    if (e->kind == EXPR_INPUT)
        used[e->input] = true;
    for (int k = 0; e->kind == EXPR_CALL && k < e->call.n_in; k++)
        mark_used(e->arg[k], used);
}

/* Three loop shapes, by how the inputs broadcast:
 *   - none needs an index of its own (each has the output's type or one element):
 *     one iteration per element, inputs read at `i` (or 0);
 *   - the output's trailing dims form blocks of at least ELEMENTWISE_BLOCK elements
 *     in which each input is contiguous or constant (a per-channel scale, a bias):
 *     one iteration per block, the input offsets computed once per block and an
 *     inner loop over the block that compilers vectorize;
 *   - otherwise one iteration per element, the output index unraveled and each
 *     input read at its broadcast offset, as lower_binary does. */
enum { ELEMENTWISE_BLOCK = 16 };

int lower_elementwise(Program *p, const Node *n, Diag *d) {
    const char *text = node_attr(n, ATTR_EXPR)->s;
    const Type *to = &p->g->values[n->out[0]].type;
    Arena arena = {0};
    Expr *e = node_expr(&arena, n, d);
    bool *used = ir_calloc((size_t)n->n_in + 1, sizeof *used);
    Str calc = {0};
    if (!e || !used) {
        if (e)
            diag_error(d, n->loc, "out of memory");
        arena_free(&arena);
        ir_free(used);
        return -1;
    }
    mark_used(e, used);
    /* the expression, reading inputs as x0, x1, ... into its result r */
    char r[48];
    int next = 0;
    emit_expr(&calc, e, &next, r, sizeof r);
    /* some input needs an index other than i (it has the output's elements in the
     * output's order) or 0 (it has one element) */
    bool indexed = false;
    for (int i = 0; i < n->n_in; i++) {
        int64_t count = type_numel(&p->g->values[n->in[i]].type);
        indexed |= used[i] && count != 1 && count != type_numel(to);
    }
    int s = indexed && n->n_in <= 64 ? block_dims(p, n, used, to) : 0;
    Type outer = type_make(to->rank - s, to->dims);
    int64_t inner = type_numel(to) / type_numel(&outer);
    bool blocked = indexed && inner >= ELEMENTWISE_BLOCK;
    Kernel *k = calc.oom  ? NULL
                : blocked ? kernel_loop(p, n, NULL, type_numel(&outer),
                                        ELEMENTWISE_GRAIN / inner > 1 ? ELEMENTWISE_GRAIN / inner : 1, d)
                          : loop_over_output(p, n, d);
    if (!k) {
        if (calc.oom)
            diag_error(d, n->loc, "out of memory");
        str_free(&calc);
        arena_free(&arena);
        ir_free(used);
        return -1;
    }
    k->in_place = true; /* blocked or not, an input of y's type is read where y is written */
    /* the comment names the fused ops: "elementwise y: clip(add($0, $1), min=0)" */
    kernel_annotate(k, text);
    char y[80]; /* value_name's buffers are reused: an input's name would overwrite it */
    snprintf(y, sizeof y, "%s", value_name(p, n->out[0]));
    if (indexed)
        emit_unravel(&k->body, "i", blocked ? &outer : to, "o");
    Str loop = {0};
    for (int i = 0; i < n->n_in; i++) {
        const Type *t = &p->g->values[n->in[i]].type;
        char at[512] = "i";
        if (!used[i])
            continue;
        if (type_numel(t) == 1) {
            snprintf(at, sizeof at, "0");
        } else if (blocked && type_numel(t) == type_numel(to)) {
            str_printf(&loop, "float x%d = %s[i * %lld + j];\n", i, value_name(p, n->in[i]),
                       (long long)inner);
            continue;
        } else if (blocked) {
            /* the block's offset from the outer index; FULL inputs add j */
            int64_t st[KILN_MAX_RANK];
            broadcast_strides(t, to, st);
            at[0] = 0;
            for (int dim = 0; dim < outer.rank; dim++) {
                char var[16];
                snprintf(var, sizeof var, "o%d", dim);
                if (st[dim])
                    append_term(at, sizeof at, var, st[dim]);
            }
            bool full = false; /* else constant over the block */
            for (int dim = outer.rank; dim < to->rank; dim++)
                full |= st[dim] != 0 && to->dims[dim] != 1;
            if (full) {
                str_printf(&loop, "float x%d = %s[%s%sj];\n", i, value_name(p, n->in[i]), at,
                           at[0] ? " + " : "");
                continue;
            }
            if (!at[0])
                snprintf(at, sizeof at, "0");
        } else if (type_numel(t) != type_numel(to)) {
            broadcast_offset(t, to, "o", at, sizeof at);
        }
        str_printf(blocked ? &k->body : &loop, "float x%d = %s[%s];\n", i, value_name(p, n->in[i]), at);
    }
    if (blocked) {
        str_printf(&k->body, "for (int64_t j = 0; j < %lld; j++) {\n", (long long)inner);
        append_indented(&k->body, loop.s ? loop.s : "", "    ");
        append_indented(&k->body, calc.s ? calc.s : "", "    ");
        str_printf(&k->body, "    %s[i * %lld + j] = %s;\n}\n", y, (long long)inner, r);
    } else {
        str_printf(&k->body, "%s%s%s[i] = %s;\n", loop.s ? loop.s : "", calc.s ? calc.s : "", y, r);
    }
    bool oom = loop.oom;
    str_free(&loop);
    str_free(&calc);
    arena_free(&arena);
    ir_free(used);
    return oom ? diag_error(d, n->loc, "out of memory") : 0;
}
