/* The ONNX op mapping: one function per ONNX op type, each turning the current node
 * into kiln ops (docs/onnx.md has the table).
 *
 * Most ops map one to one, their attributes renamed; their opset differences (an
 * attribute that became an input, Softmax's axis semantics before opset 13) are
 * handled here. Parameters that arrive as inputs (Reshape's shape, Slice's starts,
 * Pad's pads, Clip's bounds, Resize's scales, ...) must be constants at import and
 * become kiln attributes. Integer tensors never flow at run time: ops on constants
 * that compute shapes (Shape, Gather, Concat, Unsqueeze, Cast, arithmetic, ...) are
 * folded here. A few ops kiln has no op for are written with kiln ops (Elu, PRelu,
 * Softsign, ReduceMin, DepthToSpace, Tile, ...), each by its ONNX definition.
 *
 * This file holds what the families share, the elementwise and linear-algebra ops,
 * and the lookup over the families' tables; onnx_ops_nn.c has convolution, pooling,
 * normalizations and reductions, onnx_ops_shape.c shapes, resampling and constants,
 * onnx_ops_logic.c comparisons, logic, Where, ArgMax and CumSum, onnx_ops_rnn.c the
 * recurrent layers (RNN, GRU, LSTM). */
#include "onnx_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- Shared ---- */

OConst *im_fold_new(Importer *im, bool is_int, int rank, const int64_t *dims) {
    /* an empty dim counts as 1, so that oconst_new's product of the others fits */
    int64_t numel = 1;
    for (int k = 0; k < rank; k++)
        if (dims[k] < 0 || !ck_mul(numel, dims[k] ? dims[k] : 1, &numel) || numel > ONNX_MAX_FOLDED) {
            im_error(im, "a constant computed at import would have more than %lld elements (dim %d is %lld)",
                     ONNX_MAX_FOLDED, k, (long long)dims[k]);
            return NULL;
        }
    OConst *c = oconst_new(im, is_int, rank, dims);
    if (!c)
        im_error(im, "out of memory");
    return c;
}

int im_const_ints(Importer *im, OConst *c, const char *what, int64_t *v, int *n) {
    if (c->rank > 1)
        return im_error(im, "%s must be a scalar or a 1-D tensor, not of rank %d", what, c->rank);
    if (c->numel > ONNX_MAXL)
        return im_error(im, "%s has %lld entries (at most %d)", what, (long long)c->numel, ONNX_MAXL);
    for (int64_t i = 0; i < c->numel; i++) {
        if (c->is_int)
            v[i] = c->ints[i];
        else if (c->f[i] == floorf(c->f[i]) && fabsf(c->f[i]) < 9.2e18f)
            v[i] = (int64_t)c->f[i];
        else
            return im_error(im, "%s must hold integers", what);
    }
    *n = (int)c->numel;
    return 0;
}

int im_const_floats(Importer *im, OConst *c, const char *what, double *v, int *n) {
    if (c->rank > 1)
        return im_error(im, "%s must be a scalar or a 1-D tensor, not of rank %d", what, c->rank);
    if (c->numel > ONNX_MAXL)
        return im_error(im, "%s has %lld entries (at most %d)", what, (long long)c->numel, ONNX_MAXL);
    for (int64_t i = 0; i < c->numel; i++)
        v[i] = c->f[i];
    *n = (int)c->numel;
    return 0;
}

/* Input k, a constant list of integers: 1 read, 0 absent, -1 error. */
int im_input_ints(Importer *im, int k, const char *what, int64_t *v, int *n) {
    OConst *c;
    if (im_const_input(im, k, what, &c))
        return -1;
    if (!c)
        return 0;
    return im_const_ints(im, c, what, v, n) ? -1 : 1;
}

int im_axis(Importer *im, int64_t axis, int rank, int *out) {
    *out = 0;
    if (axis < -rank || axis >= rank)
        return im_error(im, "axis %lld is out of range for rank %d", (long long)axis, rank);
    *out = (int)(axis < 0 ? axis + rank : axis);
    return 0;
}

Sym *im_in_sym(Importer *im, int k) {
    return im_has_input(im, k) ? im_sym(im, im->node->input[k]) : NULL;
}

/* Input k's constant if ops on it fold at import: a constant, except a float graph
 * input bound only where needed (the conformance runner's), which stays data. */
OConst *im_folded(Importer *im, int k) {
    Sym *s = im_in_sym(im, k);
    return s && s->c && (!s->lazy || s->c->is_int) ? s->c : NULL;
}

/* Whether every given input is a constant (then shape ops fold). */
bool im_all_const(Importer *im) {
    bool any = false;
    for (int k = 0; k < im_n_inputs(im); k++) {
        if (im_has_input(im, k) && !im_folded(im, k))
            return false;
        any |= im_has_input(im, k);
    }
    return any;
}

/* ---- Elementwise ---- */

static int unary(Importer *im, OpId op) {
    OConst *c = im_folded(im, 0);
    if (c && c->is_int && (op == OP_NEG || op == OP_ABS)) { /* shape arithmetic */
        OConst *r = oconst_new(im, true, c->rank, c->dims);
        if (!r)
            return im_error(im, "out of memory");
        for (int64_t i = 0; i < c->numel; i++) {
            int64_t v = c->ints[i] == INT64_MIN ? INT64_MAX : c->ints[i];
            r->ints[i] = op == OP_NEG ? -v : v < 0 ? -v : v;
            r->f[i] = (float)r->ints[i];
        }
        return im_define_const(im, 0, r);
    }
    int x;
    if (im_input(im, 0, &x))
        return -1;
    return im_unary(im, op, x, 0) < 0 ? -1 : 0;
}

#define UNARY(fn, OP)                                                                                        \
    static int fn(Importer *im) {                                                                            \
        return unary(im, OP);                                                                                \
    }
UNARY(imp_relu, OP_RELU)
UNARY(imp_sigmoid, OP_SIGMOID)
UNARY(imp_tanh, OP_TANH)
UNARY(imp_exp, OP_EXP)
UNARY(imp_log, OP_LOG)
UNARY(imp_sqrt, OP_SQRT)
UNARY(imp_neg, OP_NEG)
UNARY(imp_abs, OP_ABS)
UNARY(imp_erf, OP_ERF)
UNARY(imp_hardswish, OP_HARDSWISH)
UNARY(imp_softplus, OP_SOFTPLUS)
UNARY(imp_floor, OP_FLOOR)
UNARY(imp_ceil, OP_CEIL)
UNARY(imp_round, OP_ROUND)
UNARY(imp_sign, OP_SIGN)
UNARY(imp_sin, OP_SIN)
UNARY(imp_cos, OP_COS)
UNARY(imp_tan, OP_TAN)
UNARY(imp_asin, OP_ASIN)
UNARY(imp_acos, OP_ACOS)
UNARY(imp_atan, OP_ATAN)
UNARY(imp_sinh, OP_SINH)
UNARY(imp_cosh, OP_COSH)
UNARY(imp_asinh, OP_ASINH)
UNARY(imp_acosh, OP_ACOSH)
UNARY(imp_atanh, OP_ATANH)

/* Identity, Dropout in inference: the value under its new name (constants stay
 * constants). */
int im_pass_through(Importer *im) {
    if (im_folded(im, 0))
        return im_define_const(im, 0, im_folded(im, 0));
    int x;
    return im_input(im, 0, &x) || im_alias(im, 0, x);
}

static int imp_dropout(Importer *im) {
    int64_t mode = 0;
    double ratio;
    if (im_attr_float(im, "ratio", &ratio) < 0)
        return -1;
    im_attr_ignore(im, "is_test");
    im_attr_ignore(im, "seed");
    OConst *c;
    if (im_const_input(im, 2, "training_mode", &c))
        return -1;
    if (c && c->numel == 1)
        mode = c->is_int ? c->ints[0] : c->f[0] != 0;
    if (mode)
        return im_error(im, "training_mode=true is not supported (kiln imports inference graphs)");
    return im_pass_through(im);
}

static int attr_float_or(Importer *im, const char *name, double dflt, double *v) {
    *v = dflt;
    return im_attr_float(im, name, v) < 0 ? -1 : 0;
}

static int imp_leaky_relu(Importer *im) {
    double alpha;
    int x;
    if (attr_float_or(im, "alpha", 0.01, &alpha) || im_input(im, 0, &x))
        return -1;
    Node *n = im_node(im, OP_LEAKY_RELU, 1, &x);
    return !n || im_set_float(im, n, ATTR_ALPHA, alpha) || im_finish(im, n, 0) < 0 ? -1 : 0;
}

static int imp_hardsigmoid(Importer *im) {
    double alpha, beta;
    int x;
    if (attr_float_or(im, "alpha", 0.2, &alpha) || attr_float_or(im, "beta", 0.5, &beta) ||
        im_input(im, 0, &x))
        return -1;
    Node *n = im_node(im, OP_HARDSIGMOID, 1, &x);
    return !n || im_set_float(im, n, ATTR_ALPHA, alpha) || im_set_float(im, n, ATTR_BETA, beta) ||
                   im_finish(im, n, 0) < 0
               ? -1
               : 0;
}

int im_bound_input(Importer *im, int k, const char *what, double *v) {
    OConst *c;
    if (im_const_input(im, k, what, &c))
        return -1;
    if (!c)
        return 0;
    if (c->numel != 1)
        return im_error(im, "%s must be a single value", what);
    *v = c->f[0];
    return 0;
}

static int imp_clip(Importer *im) {
    double lo = -INFINITY, hi = INFINITY;
    int x;
    if (im->opset < 11) {
        if (im_attr_float(im, "min", &lo) < 0 || im_attr_float(im, "max", &hi) < 0)
            return -1;
    } else if (im_bound_input(im, 1, "min", &lo) || im_bound_input(im, 2, "max", &hi)) {
        return -1;
    }
    if (im_input(im, 0, &x))
        return -1;
    Node *n = im_node(im, OP_CLIP, 1, &x);
    return !n || im_set_float(im, n, ATTR_MIN, lo) || im_set_float(im, n, ATTR_MAX, hi) ||
                   im_finish(im, n, 0) < 0
               ? -1
               : 0;
}

/* min(0, alpha (exp(x / scale) - 1)) + relu(x), times gamma: Elu, Selu, Celu. */
static int elu_like(Importer *im, double alpha, double scale, double gamma) {
    int x, t, r;
    if (im_input(im, 0, &x))
        return -1;
    t = x;
    if (scale != 1 && (t = im_binary(im, OP_DIV, t, im_scalar(im, scale), -1)) < 0)
        return -1;
    if ((t = im_unary(im, OP_EXP, t, -1)) < 0 || (t = im_binary(im, OP_SUB, t, im_scalar(im, 1), -1)) < 0 ||
        (t = im_binary(im, OP_MUL, t, im_scalar(im, alpha), -1)) < 0 ||
        (t = im_binary(im, OP_MIN, t, im_scalar(im, 0), -1)) < 0 || (r = im_unary(im, OP_RELU, x, -1)) < 0)
        return -1;
    if (gamma == 1)
        return im_binary(im, OP_ADD, r, t, 0) < 0 ? -1 : 0;
    if ((t = im_binary(im, OP_ADD, r, t, -1)) < 0)
        return -1;
    return im_binary(im, OP_MUL, t, im_scalar(im, gamma), 0) < 0 ? -1 : 0;
}

/* Gelu (opset 20): kiln's gelu, exact or with the tanh approximation. */
static int imp_gelu(Importer *im) {
    const char *approximate = "none";
    int x;
    if (im_attr_string(im, "approximate", &approximate) < 0 || im_input(im, 0, &x))
        return -1;
    Node *n = im_node(im, OP_GELU, 1, &x);
    /* kiln checks the word against its choices and says which are allowed */
    return !n || im_set_word(im, n, ATTR_APPROXIMATE, approximate) || im_finish(im, n, 0) < 0 ? -1 : 0;
}

static int imp_elu(Importer *im) {
    double alpha;
    return attr_float_or(im, "alpha", 1, &alpha) || elu_like(im, alpha, 1, 1);
}

static int imp_selu(Importer *im) {
    double alpha, gamma;
    return attr_float_or(im, "alpha", 1.67326319217681884765625, &alpha) ||
           attr_float_or(im, "gamma", 1.05070102214813232421875, &gamma) || elu_like(im, alpha, 1, gamma);
}

static int imp_celu(Importer *im) {
    double alpha;
    return attr_float_or(im, "alpha", 1, &alpha) || elu_like(im, alpha, alpha, 1);
}

/* PRelu: relu(x) + slope min(x, 0). Before opset 7 a 1-D slope of x's channel
 * count is per channel (dim 1), so it is reshaped to [C, 1, ...] to broadcast so. */
static int imp_prelu(Importer *im) {
    int x, slope, r, m;
    Type xt = {0}, st = {0};
    if (im_input(im, 0, &x) || im_input(im, 1, &slope) || im_input_type(im, 0, &xt) ||
        im_input_type(im, 1, &st))
        return -1;
    if (im->opset < 7 && st.rank == 1 && xt.rank > 2 && st.dims[0] == xt.dims[1] && st.dims[0] > 1) {
        int64_t dims[KILN_MAX_RANK];
        for (int k = 0; k < xt.rank - 1; k++)
            dims[k] = k == 0 ? st.dims[0] : 1;
        if ((slope = im_reshape(im, slope, dims, xt.rank - 1, -1)) < 0)
            return -1;
    }
    if ((r = im_unary(im, OP_RELU, x, -1)) < 0 || (m = im_binary(im, OP_MIN, x, im_scalar(im, 0), -1)) < 0 ||
        (m = im_binary(im, OP_MUL, slope, m, -1)) < 0)
        return -1;
    return im_binary(im, OP_ADD, r, m, 0) < 0 ? -1 : 0;
}

/* ThresholdedRelu: x > alpha ? x : 0 (a NaN gives 0, as ONNX's definition does). */
static int imp_thresholded_relu(Importer *im) {
    double alpha;
    int x, above;
    if (attr_float_or(im, "alpha", 1, &alpha) || im_input(im, 0, &x))
        return -1;
    above = im_binary(im, OP_GREATER, x, im_scalar(im, alpha), -1);
    return im_where(im, above, x, im_scalar(im, 0), 0) < 0 ? -1 : 0;
}

/* Shrink: x < -lambd ? x + bias : x > lambd ? x - bias : 0. */
static int imp_shrink(Importer *im) {
    double lambd, bias;
    int x;
    if (attr_float_or(im, "lambd", 0.5, &lambd) || attr_float_or(im, "bias", 0, &bias) || im_input(im, 0, &x))
        return -1;
    /* one call a statement, so that the nodes come in the same order from every compiler */
    int above = im_binary(im, OP_GREATER, x, im_scalar(im, lambd), -1);
    int minus = im_binary(im, OP_SUB, x, im_scalar(im, bias), -1);
    int upper = im_where(im, above, minus, im_scalar(im, 0), -1);
    int below = im_binary(im, OP_LESS, x, im_scalar(im, -lambd), -1);
    int plus = im_binary(im, OP_ADD, x, im_scalar(im, bias), -1);
    return im_where(im, below, plus, upper, 0) < 0 ? -1 : 0;
}

/* Softsign: x / (1 + |x|). */
static int imp_softsign(Importer *im) {
    int x, t;
    if (im_input(im, 0, &x) || (t = im_unary(im, OP_ABS, x, -1)) < 0 ||
        (t = im_binary(im, OP_ADD, t, im_scalar(im, 1), -1)) < 0)
        return -1;
    return im_binary(im, OP_DIV, x, t, 0) < 0 ? -1 : 0;
}

static int imp_reciprocal(Importer *im) {
    int x;
    if (im_input(im, 0, &x))
        return -1;
    return im_binary(im, OP_DIV, im_scalar(im, 1), x, 0) < 0 ? -1 : 0;
}

/* Integer arithmetic on constants (shape computations), with numpy broadcasting. */
static int fold_binary(Importer *im, char op) {
    OConst *a = im_in_sym(im, 0)->c, *b = im_in_sym(im, 1)->c;
    int rank = a->rank > b->rank ? a->rank : b->rank;
    int64_t dims[KILN_MAX_RANK];
    for (int k = 0; k < rank; k++) {
        int ka = k - (rank - a->rank), kb = k - (rank - b->rank);
        int64_t da = ka >= 0 ? a->dims[ka] : 1, db = kb >= 0 ? b->dims[kb] : 1;
        if (da != db && da != 1 && db != 1)
            return im_error(im, "the constant operands do not broadcast");
        dims[k] = da == 1 ? db : da;
    }
    OConst *c = im_fold_new(im, true, rank, dims);
    if (!c)
        return -1;
    for (int64_t i = 0; i < c->numel; i++) {
        int64_t ia = 0, ib = 0, rem = i, sa = 1, sb = 1;
        for (int k = rank - 1; k >= 0; k--) {
            int64_t idx = rem % dims[k];
            rem /= dims[k];
            int ka = k - (rank - a->rank), kb = k - (rank - b->rank);
            if (ka >= 0) {
                ia += (a->dims[ka] == 1 ? 0 : idx) * sa;
                sa *= a->dims[ka];
            }
            if (kb >= 0) {
                ib += (b->dims[kb] == 1 ? 0 : idx) * sb;
                sb *= b->dims[kb];
            }
        }
        int64_t x = a->ints[ia], y = b->ints[ib], r = 0;
        if ((op == '/' || op == '%') && y == 0)
            return im_error(im, "integer division by zero in a constant");
        switch (op) {
        case '+': r = (int64_t)((uint64_t)x + (uint64_t)y); break;
        case '-': r = (int64_t)((uint64_t)x - (uint64_t)y); break;
        case '*': r = (int64_t)((uint64_t)x * (uint64_t)y); break;
        case '/': r = x == INT64_MIN && y == -1 ? INT64_MIN : x / y; break;
        }
        c->ints[i] = r;
        c->f[i] = (float)r;
    }
    return im_define_const(im, 0, c);
}

static int binary(Importer *im, OpId op, char fold) {
    Sym *a = im_in_sym(im, 0), *b = im_in_sym(im, 1);
    if (a && b && a->c && b->c && a->c->is_int && b->c->is_int && fold)
        return fold_binary(im, fold);
    int x, y;
    im_attr_ignore(im, "broadcast"); /* opset < 7: numpy-style trailing alignment, kiln's rule */
    if (im_input(im, 0, &x) || im_input(im, 1, &y))
        return -1;
    return im_binary(im, op, x, y, 0) < 0 ? -1 : 0;
}

static int imp_add(Importer *im) {
    return binary(im, OP_ADD, '+');
}
static int imp_sub(Importer *im) {
    return binary(im, OP_SUB, '-');
}
static int imp_mul(Importer *im) {
    return binary(im, OP_MUL, '*');
}
static int imp_div(Importer *im) {
    return binary(im, OP_DIV, '/');
}
static int imp_pow(Importer *im) {
    return binary(im, OP_POW, 0);
}

/* Max, Min, Sum, Mean: variadic, as a chain of binary ops. */
static int variadic(Importer *im, OpId op, bool mean) {
    int n = im_n_inputs(im), acc;
    if (n < 1 || im_input(im, 0, &acc))
        return im_error(im, "needs at least one input");
    for (int k = 1; k < n; k++) {
        int x;
        bool last = k == n - 1 && !mean;
        if (im_input(im, k, &x) || (acc = im_binary(im, op, acc, x, last ? 0 : -1)) < 0)
            return -1;
    }
    if (mean && n > 1)
        return im_binary(im, OP_DIV, acc, im_scalar(im, n), 0) < 0 ? -1 : 0;
    if (n == 1)
        return im_alias(im, 0, acc);
    return 0;
}

static int imp_max(Importer *im) {
    return variadic(im, OP_MAX, false);
}
static int imp_min(Importer *im) {
    return variadic(im, OP_MIN, false);
}
static int imp_sum(Importer *im) {
    return variadic(im, OP_ADD, false);
}
static int imp_mean(Importer *im) {
    return variadic(im, OP_ADD, true);
}

/* ---- Linear algebra ---- */

static int imp_matmul(Importer *im) {
    int a, b;
    if (im_input(im, 0, &a) || im_input(im, 1, &b))
        return -1;
    return im_binary(im, OP_MATMUL, a, b, 0) < 0 ? -1 : 0;
}

/* Gemm as PyTorch exports nn.Linear: Gemm(x, W, b, transB=1); the passes make it a
 * linear. */
static int imp_gemm(Importer *im) {
    double alpha = 1, beta = 1;
    int64_t ta = 0, tb = 0;
    int in[3], n_in = 2;
    if (im_attr_float(im, "alpha", &alpha) < 0 || im_attr_float(im, "beta", &beta) < 0 ||
        im_attr_int(im, "transA", &ta) < 0 || im_attr_int(im, "transB", &tb) < 0)
        return -1;
    im_attr_ignore(im, "broadcast");
    if (im_input(im, 0, &in[0]) || im_input(im, 1, &in[1]))
        return -1;
    if (im_has_input(im, 2) && im_input(im, 2, &in[n_in++]))
        return -1;
    Node *n = im_node(im, OP_GEMM, n_in, in);
    return !n || im_set_float(im, n, ATTR_ALPHA, alpha) || im_set_float(im, n, ATTR_BETA, beta) ||
                   im_set_int(im, n, ATTR_TRANS_A, ta != 0) || im_set_int(im, n, ATTR_TRANS_B, tb != 0) ||
                   im_finish(im, n, 0) < 0
               ? -1
               : 0;
}

/* The elementwise and linear-algebra ops, by ONNX op type. */
const OnnxOp onnx_ops_elementwise[] = {
    {"Abs", imp_abs},
    {"Acos", imp_acos},
    {"Acosh", imp_acosh},
    {"Add", imp_add},
    {"Asin", imp_asin},
    {"Asinh", imp_asinh},
    {"Atan", imp_atan},
    {"Atanh", imp_atanh},
    {"Ceil", imp_ceil},
    {"Celu", imp_celu},
    {"Clip", imp_clip},
    {"Cos", imp_cos},
    {"Cosh", imp_cosh},
    {"Div", imp_div},
    {"Dropout", imp_dropout},
    {"Elu", imp_elu},
    {"Erf", imp_erf},
    {"Exp", imp_exp},
    {"Floor", imp_floor},
    {"Gelu", imp_gelu},
    {"Gemm", imp_gemm},
    {"HardSigmoid", imp_hardsigmoid},
    {"HardSwish", imp_hardswish},
    {"Identity", im_pass_through},
    {"LeakyRelu", imp_leaky_relu},
    {"Log", imp_log},
    {"MatMul", imp_matmul},
    {"Max", imp_max},
    {"Mean", imp_mean},
    {"Min", imp_min},
    {"Mul", imp_mul},
    {"Neg", imp_neg},
    {"PRelu", imp_prelu},
    {"Pow", imp_pow},
    {"Reciprocal", imp_reciprocal},
    {"Relu", imp_relu},
    {"Round", imp_round},
    {"Selu", imp_selu},
    {"Shrink", imp_shrink},
    {"Sigmoid", imp_sigmoid},
    {"Sign", imp_sign},
    {"Sin", imp_sin},
    {"Sinh", imp_sinh},
    {"Softplus", imp_softplus},
    {"Softsign", imp_softsign},
    {"Sqrt", imp_sqrt},
    {"Sub", imp_sub},
    {"Sum", imp_sum},
    {"Tan", imp_tan},
    {"Tanh", imp_tanh},
    {"ThresholdedRelu", imp_thresholded_relu},
    {NULL, NULL},
};

OnnxImportFn onnx_find_op(const char *op_type) {
    const OnnxOp *const tables[] = {onnx_ops_elementwise, onnx_ops_nn, onnx_ops_shape, onnx_ops_logic,
                                    onnx_ops_rnn};
    for (size_t t = 0; t < sizeof tables / sizeof *tables; t++)
        for (const OnnxOp *o = tables[t]; o->op_type; o++)
            if (strcmp(o->op_type, op_type) == 0)
                return o->fn;
    return NULL;
}
