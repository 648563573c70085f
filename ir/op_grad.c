/* The ops the autodiff pass builds backward graphs from, beyond the ordinary ones:
 *
 *   expand(x, shape)            x broadcast to `shape` (numpy broadcast_to)
 *   unary_grad(dy, x, op, ...)  dy * f'(x) for the unary op f, with f's attributes
 *   binary_grad(dy, a, b, op, wrt)
 *                               dy * d f(a, b) / d a (or b) for the binary op f,
 *                               at the broadcast shape of a and b
 *
 * The derivatives are the rows of unary.def and binary.def, where f is not
 * differentiable PyTorch's choice (each row says which). */
#include "ops_impl.h"

#include <math.h>
#include <string.h>

int infer_expand(Graph *g, Node *n, Diag *d) {
    const Type *x = in_type(g, n, 0);
    int64_t dims[KILN_MAX_RANK];
    int rank = shape_attr(n, dims, 0, d);
    if (rank < 0)
        return -1;
    Type to = type_make(rank, dims);
    to.dtype = x->dtype;
    if (!broadcasts_to(x, &to))
        return diag_error(d, attr_loc(n, ATTR_SHAPE), "expand: %s does not broadcast to %s", tstr(x),
                          tstr(&to));
    if (check_size(n, &to, d))
        return -1;
    set_out_type(g, n, 0, to);
    return 0;
}

int eval_expand(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    (void)n, (void)d;
    const Type *to = &out[0]->type;
    int64_t s[KILN_MAX_RANK], idx[KILN_MAX_RANK] = {0};
    broadcast_strides(&in[0]->type, to, s);
    int64_t count = type_numel(to);
    for (int64_t i = 0; i < count; i++) {
        int64_t at = 0;
        for (int k = 0; k < to->rank; k++)
            at += idx[k] * s[k];
        copy_elements(out[0], i, in[0], at, 1);
        next_index(idx, to->dims, to->rank);
    }
    return 0;
}

int infer_unary_grad(Graph *g, Node *n, Diag *d) {
    const Type *dy = in_type(g, n, 0), *x = in_type(g, n, 1);
    if (!type_equal(dy, x))
        return diag_error(d, n->loc, "unary_grad: dy is %s but x is %s; they must be equal", tstr(dy),
                          tstr(x));
    set_out_type(g, n, 0, *x);
    return 0;
}

int infer_binary_grad(Graph *g, Node *n, Diag *d) {
    const Type *dy = in_type(g, n, 0), *a = in_type(g, n, 1), *b = in_type(g, n, 2);
    Type ab = {0};
    if (!broadcast_types(a, b, &ab))
        return diag_error(d, n->loc, "binary_grad: shapes %s and %s cannot be broadcast together", tstr(a),
                          tstr(b));
    if (!type_equal(dy, &ab))
        return diag_error(d, n->loc, "binary_grad: dy is %s but a and b broadcast to %s", tstr(dy),
                          tstr(&ab));
    set_out_type(g, n, 0, ab);
    return 0;
}

/* f'(x) for the unary op with attributes p: its row's derivative. */
static double unary_derivative(OpId op, const double *p, double x) {
    switch (op) {
#define UNARY(id, name, attrs, reference, c, derivative, ...)                                                \
    case OP_##id:                                                                                            \
        return derivative;
#include "unary.def"
#undef UNARY
    default: KILN_ASSERT(!"not a unary op");
    }
    return 0;
}

int eval_unary_grad(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    (void)d;
    OpId op = differentiated_op(n);
    double p[UNARY_MAX_PARAMS];
    unary_params(op, n, p);
    int64_t count = type_numel(&in[0]->type);
    for (int64_t i = 0; i < count; i++)
        out[0]->data[i] = (float)(in[0]->data[i] * unary_derivative(op, p, in[1]->data[i]));
    return 0;
}

/* d f(a, b) / d a, or / d b when wrt_b: the binary op's row. */
static double binary_derivative(OpId op, bool wrt_b, double a, double b) {
    switch (op) {
#define BINARY(id, name, reference, c, d_da, d_db, ...)                                                      \
    case OP_##id:                                                                                            \
        return wrt_b ? (double)(d_db) : (double)(d_da);
#include "binary.def"
#undef BINARY
    default: KILN_ASSERT(!"not a binary op");
    }
    return 0;
}

int eval_binary_grad(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    (void)d;
    OpId op = differentiated_op(n);
    bool wrt_b = node_enum(n, ATTR_WRT) == WRT_B;
    const Type *to = &out[0]->type;
    int64_t sa[KILN_MAX_RANK], sb[KILN_MAX_RANK], idx[KILN_MAX_RANK] = {0};
    broadcast_strides(&in[1]->type, to, sa);
    broadcast_strides(&in[2]->type, to, sb);
    int64_t count = type_numel(to);
    for (int64_t i = 0; i < count; i++) {
        int64_t ia = 0, ib = 0;
        for (int k = 0; k < to->rank; k++) {
            ia += idx[k] * sa[k];
            ib += idx[k] * sb[k];
        }
        out[0]->data[i] =
            (float)(in[0]->data[i] * binary_derivative(op, wrt_b, in[1]->data[ia], in[2]->data[ib]));
        next_index(idx, to->dims, to->rank);
    }
    return 0;
}

int infer_grad(Graph *g, Node *n, Diag *d) {
    const Type *y = in_type(g, n, 0);
    if (y->rank != 0 || y->dtype != DT_F32)
        return diag_error(d, n->loc, "grad: y must be a scalar f32[], got %s", tstr(y));
    if (n->n_in < 2)
        return diag_error(d, n->loc, "grad needs at least one value to differentiate y with respect to");
    KILN_ASSERT(n->n_out == n->n_in - 1);
    for (int i = 1; i < n->n_in; i++)
        set_out_type(g, n, i - 1, *in_type(g, n, i));
    return 0;
}
