/* Elementwise ops: the unary activations and the broadcasting binary ops, whose
 * reference values are the rows of unary.def and binary.def, and the fused
 * `elementwise` op, which calls them.
 *
 * Kernels compute each element in double and round once to float, which makes the
 * reference at least as exact as any target. Binary ops follow numpy broadcasting:
 * shapes align at the right, and a dim of 1 stretches. */
#include "ops_impl.h"

#include <math.h>

int infer_unary(Graph *g, Node *n, Diag *d) {
    (void)d;
    set_out_type(g, n, 0, *in_type(g, n, 0));
    return 0;
}

int infer_broadcast(Graph *g, Node *n, Diag *d) {
    const Type *a = in_type(g, n, 0), *b = in_type(g, n, 1);
    Type out = {0};
    if (!broadcast_types(a, b, &out))
        return diag_error(d, n->loc, "%s: shapes %s and %s cannot be broadcast together",
                          op_table[n->op].name, tstr(a), tstr(b));
    set_out_type(g, n, 0, out);
    return 0;
}

/* f(x) for the unary op with attributes p: its row's reference. */
static double unary(OpId op, const double *p, double x) {
    switch (op) {
#define UNARY(id, name, attrs, reference, ...)                                                               \
    case OP_##id:                                                                                            \
        return reference;
#include "unary.def"
#undef UNARY
    default: KILN_ASSERT(!"not a unary op");
    }
    return 0;
}

/* x wrapped to the integer dtype t (two's complement). */
static int64_t wrap(DType t, uint64_t x) {
    return t == DT_I32 ? (int64_t)(int32_t)(uint32_t)x : (int64_t)x;
}

static void store_int(Tensor *t, int64_t i, int64_t v) {
    if (t->type.dtype == DT_I32)
        t->i32[i] = (int32_t)v;
    else
        t->i64[i] = v;
}

/* The integer ops (op_takes_ints), wrapping as two's complement: a division truncates
 * toward zero, by zero gives 0, and INT_MIN / -1 wraps to INT_MIN. */
static int64_t int_op(OpId op, DType t, int64_t a, int64_t b) {
    switch (op) {
    case OP_ADD: return wrap(t, (uint64_t)a + (uint64_t)b);
    case OP_SUB: return wrap(t, (uint64_t)a - (uint64_t)b);
    case OP_MUL: return wrap(t, (uint64_t)a * (uint64_t)b);
    case OP_DIV: return b == 0 ? 0 : b == -1 ? wrap(t, 0 - (uint64_t)a) : a / b;
    case OP_MAX: return a > b ? a : b;
    case OP_MIN: return a < b ? a : b;
    case OP_NEG: return wrap(t, 0 - (uint64_t)a);
    case OP_ABS: return a < 0 ? wrap(t, 0 - (uint64_t)a) : a;
    default: KILN_ASSERT(!"not an integer op");
    }
    return 0;
}

int eval_unary(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    (void)d;
    if (dtype_is_int(in[0]->type.dtype)) {
        for (int64_t i = 0; i < type_numel(&in[0]->type); i++)
            store_int(out[0], i, int_op(n->op, in[0]->type.dtype, tensor_int(in[0], i), 0));
        return 0;
    }
    double p[UNARY_MAX_PARAMS];
    unary_params(n->op, n, p);
    int64_t count = type_numel(&in[0]->type);
    const float *x = in[0]->data;
    float *y = out[0]->data;
    /* clip passes NaN through, as fmin/fmax alone would not */
    for (int64_t i = 0; i < count; i++)
        y[i] = isnan(x[i]) ? x[i] : (float)unary(n->op, p, x[i]);
    return 0;
}

/* f(a, b) for the binary op: its row's reference. */
static double binary(OpId op, double a, double b) {
    switch (op) {
#define BINARY(id, name, reference, ...)                                                                     \
    case OP_##id:                                                                                            \
        return reference;
#include "binary.def"
#undef BINARY
    default: KILN_ASSERT(!"not a binary op");
    }
    return 0;
}

int eval_binary(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    (void)d;
    const Type *to = &out[0]->type;
    int64_t sa[KILN_MAX_RANK], sb[KILN_MAX_RANK], idx[KILN_MAX_RANK] = {0};
    broadcast_strides(&in[0]->type, to, sa);
    broadcast_strides(&in[1]->type, to, sb);
    int64_t count = type_numel(to);
    for (int64_t i = 0; i < count; i++) {
        int64_t ia = 0, ib = 0;
        for (int k = 0; k < to->rank; k++) {
            ia += idx[k] * sa[k];
            ib += idx[k] * sb[k];
        }
        if (dtype_is_int(to->dtype))
            store_int(out[0], i, int_op(n->op, to->dtype, tensor_int(in[0], ia), tensor_int(in[1], ib)));
        else
            out[0]->data[i] = (float)binary(n->op, in[0]->data[ia], in[1]->data[ib]);
        next_index(idx, to->dims, to->rank);
    }
    return 0;
}

/* ---- elementwise: a fused expression over broadcast inputs ---- */

int infer_elementwise(Graph *g, Node *n, Diag *d) {
    const Attr *a = node_attr(n, ATTR_EXPR);
    if (!a->set)
        return diag_error(d, n->loc, "elementwise needs the attribute 'expr'");
    Type out = *in_type(g, n, 0);
    for (int k = 1; k < n->n_in; k++) {
        Type t = out;
        if (!broadcast_types(&t, in_type(g, n, k), &out))
            return diag_error(d, n->loc, "elementwise: input $%d of type %s cannot be broadcast with %s", k,
                              tstr(in_type(g, n, k)), tstr(&t));
    }
    if (check_size(n, &out, d))
        return -1;
    Arena arena = {0};
    Expr *e = node_expr(&arena, n, d);
    arena_free(&arena);
    if (!e)
        return -1;
    set_out_type(g, n, 0, out);
    return 0;
}

/* Every call's result is rounded to f32 as its own op's kernel rounds it, so a
 * fused expression gives exactly what the ops it replaces give one by one. */
static double eval_expr(const Expr *e, const double *in) {
    switch (e->kind) {
    case EXPR_INPUT: return in[e->input];
    case EXPR_NUMBER: return (float)e->number;
    case EXPR_CALL: break;
    }
    double a = eval_expr(e->arg[0], in);
    if (e->call.n_in == 2)
        return (float)binary(e->call.op, a, eval_expr(e->arg[1], in));
    double p[UNARY_MAX_PARAMS];
    unary_params(e->call.op, &e->call, p);
    return isnan(a) ? a : (float)unary(e->call.op, p, a);
}

int expr_eval(const Expr *e, int n_in, const Tensor *const *in, Tensor *out) {
    const Type *to = &out->type;
    int64_t(*strides)[KILN_MAX_RANK] = ir_malloc(sizeof *strides * (size_t)n_in);
    double *x = ir_malloc(sizeof *x * (size_t)n_in);
    if (!strides || !x) {
        ir_free(strides);
        ir_free(x);
        return -1;
    }
    for (int k = 0; k < n_in; k++)
        broadcast_strides(&in[k]->type, to, strides[k]);
    int64_t idx[KILN_MAX_RANK] = {0}, count = type_numel(to);
    for (int64_t i = 0; i < count; i++) {
        for (int k = 0; k < n_in; k++) {
            int64_t at = 0;
            for (int r = 0; r < to->rank; r++)
                at += idx[r] * strides[k][r];
            x[k] = in[k]->data[at];
        }
        out->data[i] = (float)eval_expr(e, x);
        next_index(idx, to->dims, to->rank);
    }
    ir_free(strides);
    ir_free(x);
    return 0;
}

int eval_elementwise(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    Arena arena = {0};
    Expr *e = node_expr(&arena, n, d);
    int rc = !e ? -1 : expr_eval(e, n->n_in, in, out[0]) ? diag_error(d, n->loc, "out of memory") : 0;
    arena_free(&arena);
    return rc;
}

/* ---- The epilogues of the fused ops (fused_conv, fused_linear) ---- */

/* The inputs e1 ... have the head op's result type or one element, so that a kernel
 * finds each where it writes the result, whatever its tiling. */
int infer_epilogue(Graph *g, Node *n, Diag *d) {
    const char *op = op_table[n->op].name;
    const Type *y = &g->values[n->out[0]].type;
    int first = expr_first_input(n);
    for (int k = first; k < n->n_in; k++) {
        const Type *e = in_type(g, n, k);
        int j = k - first + 1;
        if (!e)
            return diag_error(d, n->loc, "%s: e%d may not be absent", op, j);
        if (!type_equal(e, y) && type_numel(e) != 1)
            return diag_error(d, n->loc,
                              "%s: e%d ($%d of expr) must have the result type %s or one element, got %s", op,
                              j, j, tstr(y), tstr(e));
    }
    Arena arena = {0};
    Expr *e = node_expr(&arena, n, d);
    arena_free(&arena);
    return e ? 0 : -1;
}

int eval_epilogue(const Node *n, const Tensor *const *in, Tensor *y, Diag *d) {
    int first = expr_first_input(n), n_expr = n->n_in > first ? 1 + n->n_in - first : 1;
    Arena arena = {0};
    Expr *e = node_expr(&arena, n, d);
    const Tensor **args = ir_calloc((size_t)n_expr, sizeof *args);
    int rc = e ? 0 : -1;
    if (e && !args)
        rc = diag_error(d, n->loc, "out of memory");
    if (!rc) {
        args[0] = y;
        for (int k = 1; k < n_expr; k++)
            args[k] = in[first + k - 1];
        if (expr_eval(e, n_expr, args, y))
            rc = diag_error(d, n->loc, "out of memory");
    }
    ir_free(args);
    arena_free(&arena);
    return rc;
}
