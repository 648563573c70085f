/* The ops the autodiff pass builds backward graphs from, beyond the ordinary ones:
 *
 *   expand(x, shape)            x broadcast to `shape` (numpy broadcast_to)
 *   unary_grad(dy, x, op, ...)  dy * f'(x) for the unary op f, with f's attributes
 *   binary_grad(dy, a, b, op, wrt)
 *                               dy * d f(a, b) / d a (or b) for pow, max, min,
 *                               at the broadcast shape of a and b
 *
 * Where f is not differentiable the derivative is PyTorch's: relu' and the step
 * of leaky_relu at 0 take the x <= 0 side; clip passes the gradient on [min, max]
 * inclusive (torch.clamp); hardswish' is 0 below -3 and x/3 + 1/2 up to 3 inclusive;
 * abs' (0) = 0; max and min split the gradient evenly on ties (torch.maximum). */
#include "ops_impl.h"

#include <math.h>
#include <string.h>

int infer_expand(Graph *g, Node *n, Diag *d) {
    const Type *x = in_type(g, n, 0);
    int64_t dims[KILN_MAX_RANK];
    int rank = node_attr(n, ATTR_SHAPE)->n; /* counted before reading it into dims */
    if (rank > KILN_MAX_RANK)
        return diag_error(d, attr_loc(n, ATTR_SHAPE), "expand: shape has %d dims; at most %d", rank,
                          KILN_MAX_RANK);
    node_ints(n, ATTR_SHAPE, dims, KILN_MAX_RANK, 0);
    if (check_size_attr(n, ATTR_SHAPE, dims, rank, 0, d))
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
        out[0]->data[i] = in[0]->data[at];
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
    Type ab;
    if (!broadcast_types(a, b, &ab))
        return diag_error(d, n->loc, "binary_grad: shapes %s and %s cannot be broadcast together", tstr(a),
                          tstr(b));
    if (!type_equal(dy, &ab))
        return diag_error(d, n->loc, "binary_grad: dy is %s but a and b broadcast to %s", tstr(dy),
                          tstr(&ab));
    set_out_type(g, n, 0, ab);
    return 0;
}

/* The standard normal density and distribution. */
static double normal_pdf(double x) {
    return exp(-0.5 * x * x) / sqrt(2 * M_PI);
}

double unary_derivative(int op, const Node *n, double x) {
    if (op == UNARY_GRAD_OP_RELU)
        return x > 0;
    if (op == UNARY_GRAD_OP_SIGMOID) {
        double s = 1 / (1 + exp(-x));
        return s * (1 - s);
    }
    if (op == UNARY_GRAD_OP_TANH)
        return 1 - tanh(x) * tanh(x);
    if (op == UNARY_GRAD_OP_EXP)
        return exp(x);
    if (op == UNARY_GRAD_OP_LOG)
        return 1 / x;
    if (op == UNARY_GRAD_OP_SQRT)
        return 0.5 / sqrt(x);
    if (op == UNARY_GRAD_OP_NEG)
        return -1;
    if (op == UNARY_GRAD_OP_ABS)
        return (x > 0) - (x < 0);
    if (op == UNARY_GRAD_OP_ERF)
        return 2 / sqrt(M_PI) * exp(-x * x);
    if (op == UNARY_GRAD_OP_LEAKY_RELU)
        return x > 0 ? 1 : node_float(n, ATTR_ALPHA);
    if (op == UNARY_GRAD_OP_CLIP)
        return x >= node_float(n, ATTR_MIN) && x <= node_float(n, ATTR_MAX);
    if (op == UNARY_GRAD_OP_GELU) {
        if (node_enum(n, ATTR_APPROXIMATE) == GELU_TANH) {
            double k = sqrt(2 / M_PI), inner = k * (x + 0.044715 * x * x * x), t = tanh(inner);
            return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
        }
        return 0.5 * (1 + erf(x / sqrt(2))) + x * normal_pdf(x);
    }
    if (op == UNARY_GRAD_OP_HARDSIGMOID) {
        double v = node_float(n, ATTR_ALPHA) * x + node_float(n, ATTR_BETA);
        return v > 0 && v < 1 ? node_float(n, ATTR_ALPHA) : 0;
    }
    if (op == UNARY_GRAD_OP_HARDSWISH)
        return x < -3 ? 0 : x <= 3 ? x / 3 + 0.5 : 1;
    KILN_ASSERT(!"not a unary op");
    return 0;
}

int eval_unary_grad(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    (void)d;
    int op = node_enum(n, ATTR_OP);
    int64_t count = type_numel(&in[0]->type);
    for (int64_t i = 0; i < count; i++)
        out[0]->data[i] = (float)(in[0]->data[i] * unary_derivative(op, n, in[1]->data[i]));
    return 0;
}

/* d f(a, b) / d a, or / d b when wrt_b. */
double binary_derivative(int op, bool wrt_b, double a, double b) {
    if (op == BINARY_GRAD_OP_POW) {
        if (!wrt_b)
            return b == 0 ? 0 : b * pow(a, b - 1);
        return a == 0 && b >= 0 ? 0 : pow(a, b) * log(a);
    }
    bool is_max = op == BINARY_GRAD_OP_MAX;
    KILN_ASSERT(is_max || op == BINARY_GRAD_OP_MIN);
    double mine = wrt_b ? b : a, other = wrt_b ? a : b;
    if (mine == other)
        return 0.5;
    return is_max ? mine > other : mine < other;
}

int eval_binary_grad(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    (void)d;
    int op = node_enum(n, ATTR_OP);
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
