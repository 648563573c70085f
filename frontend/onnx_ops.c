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
 * Softplus, ReduceMin, DepthToSpace, Tile, ...), each by its ONNX definition. */
#include "onnx_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { MAXL = 64 }; /* longest list attribute or shape input read */

/* The most elements a constant computed at import may have: shape arithmetic is
 * small, and a hostile model must not make the importer allocate without bound. */
#define MAX_FOLDED (1LL << 24)

/* A new constant for a folded result, refused when too large. */
static OConst *fold_new(Importer *im, bool is_int, int rank, const int64_t *dims) {
    double numel = 1;
    for (int k = 0; k < rank; k++)
        numel *= (double)dims[k];
    if (numel > (double)MAX_FOLDED) {
        im_error(im, "a constant computed at import would have %.0f elements (at most %lld)", numel, MAX_FOLDED);
        return NULL;
    }
    OConst *c = oconst_new(im, is_int, rank, dims);
    if (!c)
        im_error(im, "out of memory");
    return c;
}

/* ---- Reading constants ---- */

static int const_ints(Importer *im, OConst *c, const char *what, int64_t *v, int *n) {
    if (c->rank > 1)
        return im_error(im, "%s must be a scalar or a 1-D tensor, not of rank %d", what, c->rank);
    if (c->numel > MAXL)
        return im_error(im, "%s has %lld entries (at most %d)", what, (long long)c->numel, MAXL);
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

static int const_floats(Importer *im, OConst *c, const char *what, double *v, int *n) {
    if (c->rank > 1)
        return im_error(im, "%s must be a scalar or a 1-D tensor, not of rank %d", what, c->rank);
    if (c->numel > MAXL)
        return im_error(im, "%s has %lld entries (at most %d)", what, (long long)c->numel, MAXL);
    for (int64_t i = 0; i < c->numel; i++)
        v[i] = c->f[i];
    *n = (int)c->numel;
    return 0;
}

/* Input k, a constant list of integers: 1 read, 0 absent, -1 error. */
static int input_ints(Importer *im, int k, const char *what, int64_t *v, int *n) {
    OConst *c;
    if (im_const_input(im, k, what, &c))
        return -1;
    if (!c)
        return 0;
    return const_ints(im, c, what, v, n) ? -1 : 1;
}

static int axis_in(Importer *im, int64_t axis, int rank, int *out) {
    *out = 0;
    if (axis < -rank || axis >= rank)
        return im_error(im, "axis %lld is out of range for rank %d", (long long)axis, rank);
    *out = (int)(axis < 0 ? axis + rank : axis);
    return 0;
}

static int input_type(Importer *im, int k, Type *t) {
    return im_input_type(im, k, t);
}

static Sym *sym_in(Importer *im, int k) {
    return im_has_input(im, k) ? im_sym(im, im->node->input[k]) : NULL;
}

/* Input k's constant if ops on it fold at import: a constant, except a float graph
 * input bound only where needed (the conformance runner's), which stays data. */
static OConst *folded(Importer *im, int k) {
    Sym *s = sym_in(im, k);
    return s && s->c && (!s->lazy || s->c->is_int) ? s->c : NULL;
}

/* Whether every given input is a constant (then shape ops fold). */
static bool all_const(Importer *im) {
    bool any = false;
    for (int k = 0; k < im_n_inputs(im); k++) {
        if (im_has_input(im, k) && !folded(im, k))
            return false;
        any |= im_has_input(im, k);
    }
    return any;
}

static int reshape_to(Importer *im, int x, const int64_t *dims, int rank, int out_k);

/* ---- Elementwise ---- */

static int unary(Importer *im, OpId op) {
    OConst *c = folded(im, 0);
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

#define UNARY(fn, OP)                                                                                              \
    static int fn(Importer *im) {                                                                                  \
        return unary(im, OP);                                                                                      \
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

/* Identity, Dropout in inference: the value under its new name (constants stay
 * constants). */
static int imp_identity(Importer *im) {
    if (folded(im, 0))
        return im_define_const(im, 0, folded(im, 0));
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
    return imp_identity(im);
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
    return !n || im_set_float(im, n, "alpha", alpha) || im_finish(im, n, 0) < 0 ? -1 : 0;
}

static int imp_hardsigmoid(Importer *im) {
    double alpha, beta;
    int x;
    if (attr_float_or(im, "alpha", 0.2, &alpha) || attr_float_or(im, "beta", 0.5, &beta) || im_input(im, 0, &x))
        return -1;
    Node *n = im_node(im, OP_HARDSIGMOID, 1, &x);
    return !n || im_set_float(im, n, "alpha", alpha) || im_set_float(im, n, "beta", beta) || im_finish(im, n, 0) < 0
               ? -1
               : 0;
}

static int bound_input(Importer *im, int k, const char *what, double *v) {
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
    } else if (bound_input(im, 1, "min", &lo) || bound_input(im, 2, "max", &hi)) {
        return -1;
    }
    if (im_input(im, 0, &x))
        return -1;
    Node *n = im_node(im, OP_CLIP, 1, &x);
    return !n || im_set_float(im, n, "min", lo) || im_set_float(im, n, "max", hi) || im_finish(im, n, 0) < 0 ? -1 : 0;
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
    Type xt, st;
    if (im_input(im, 0, &x) || im_input(im, 1, &slope) || input_type(im, 0, &xt) || input_type(im, 1, &st))
        return -1;
    if (im->opset < 7 && st.rank == 1 && xt.rank > 2 && st.dims[0] == xt.dims[1] && st.dims[0] > 1) {
        int64_t dims[KILN_MAX_RANK];
        for (int k = 0; k < xt.rank - 1; k++)
            dims[k] = k == 0 ? st.dims[0] : 1;
        if ((slope = reshape_to(im, slope, dims, xt.rank - 1, -1)) < 0)
            return -1;
    }
    if ((r = im_unary(im, OP_RELU, x, -1)) < 0 ||
        (m = im_binary(im, OP_MIN, x, im_scalar(im, 0), -1)) < 0 || (m = im_binary(im, OP_MUL, slope, m, -1)) < 0)
        return -1;
    return im_binary(im, OP_ADD, r, m, 0) < 0 ? -1 : 0;
}

/* Softplus: log(exp(x) + 1). */
static int imp_softplus(Importer *im) {
    int x, t;
    if (im_input(im, 0, &x) || (t = im_unary(im, OP_EXP, x, -1)) < 0 ||
        (t = im_binary(im, OP_ADD, t, im_scalar(im, 1), -1)) < 0)
        return -1;
    return im_unary(im, OP_LOG, t, 0) < 0 ? -1 : 0;
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
    OConst *a = sym_in(im, 0)->c, *b = sym_in(im, 1)->c;
    int rank = a->rank > b->rank ? a->rank : b->rank;
    int64_t dims[KILN_MAX_RANK];
    for (int k = 0; k < rank; k++) {
        int ka = k - (rank - a->rank), kb = k - (rank - b->rank);
        int64_t da = ka >= 0 ? a->dims[ka] : 1, db = kb >= 0 ? b->dims[kb] : 1;
        if (da != db && da != 1 && db != 1)
            return im_error(im, "the constant operands do not broadcast");
        dims[k] = da == 1 ? db : da;
    }
    OConst *c = fold_new(im, true, rank, dims);
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
    Sym *a = sym_in(im, 0), *b = sym_in(im, 1);
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
    return !n || im_set_float(im, n, "alpha", alpha) || im_set_float(im, n, "beta", beta) ||
                   im_set_int(im, n, "trans_a", ta != 0) || im_set_int(im, n, "trans_b", tb != 0) ||
                   im_finish(im, n, 0) < 0
               ? -1
               : 0;
}

/* ---- Convolution and pooling ---- */

typedef struct {
    int nsp; /* spatial dims */
    int64_t kernel[3], strides[3], dilations[3], pads[6];
} Window;

/* kernel_shape (or the weights' spatial dims), strides, dilations, pads and
 * auto_pad, with SAME_UPPER / SAME_LOWER / VALID turned into explicit pads. */
static int read_window(Importer *im, const Type *x, const int64_t *kernel_from_w, bool has_dilations, Window *w) {
    w->nsp = x->rank - 2;
    if (w->nsp < 1 || w->nsp > 3)
        return im_error(im, "the input has rank %d; kiln takes 1 to 3 spatial dims", x->rank);
    int n;
    int64_t buf[MAXL];
    for (int k = 0; k < w->nsp; k++) {
        w->kernel[k] = kernel_from_w ? kernel_from_w[k] : 0;
        w->strides[k] = w->dilations[k] = 1;
        w->pads[k] = w->pads[k + w->nsp] = 0;
    }
    int r = im_attr_ints(im, "kernel_shape", buf, MAXL, &n);
    if (r < 0)
        return -1;
    if (r == 1) {
        if (n != w->nsp)
            return im_error(im, "kernel_shape has %d entries, the input %d spatial dims", n, w->nsp);
        for (int k = 0; k < n; k++)
            if (kernel_from_w && buf[k] != kernel_from_w[k])
                return im_error(im, "kernel_shape does not match the weights' shape");
        memcpy(w->kernel, buf, sizeof(int64_t) * (size_t)n);
    } else if (!kernel_from_w) {
        return im_error(im, "kernel_shape is required");
    }
    if ((r = im_attr_ints(im, "strides", buf, MAXL, &n)) < 0)
        return -1;
    if (r == 1 && n != w->nsp)
        return im_error(im, "strides has %d entries, the input %d spatial dims", n, w->nsp);
    if (r == 1)
        memcpy(w->strides, buf, sizeof(int64_t) * (size_t)n);
    if (has_dilations) {
        if ((r = im_attr_ints(im, "dilations", buf, MAXL, &n)) < 0)
            return -1;
        if (r == 1 && n != w->nsp)
            return im_error(im, "dilations has %d entries, the input %d spatial dims", n, w->nsp);
        if (r == 1)
            memcpy(w->dilations, buf, sizeof(int64_t) * (size_t)n);
    }
    if ((r = im_attr_ints(im, "pads", buf, MAXL, &n)) < 0)
        return -1;
    if (r == 1 && n != 2 * w->nsp)
        return im_error(im, "pads has %d entries, expected %d", n, 2 * w->nsp);
    if (r == 1)
        memcpy(w->pads, buf, sizeof(int64_t) * (size_t)n);
    const char *auto_pad = "NOTSET";
    if (im_attr_string(im, "auto_pad", &auto_pad) < 0)
        return -1;
    bool upper = strcmp(auto_pad, "SAME_UPPER") == 0, lower = strcmp(auto_pad, "SAME_LOWER") == 0;
    if (strcmp(auto_pad, "VALID") == 0) {
        for (int k = 0; k < 2 * w->nsp; k++)
            w->pads[k] = 0;
    } else if (upper || lower) {
        for (int k = 0; k < w->nsp; k++) {
            int64_t in = x->dims[k + 2], s = w->strides[k] > 0 ? w->strides[k] : 1;
            int64_t out = (in + s - 1) / s, e = (w->kernel[k] - 1) * w->dilations[k] + 1;
            int64_t total = (out - 1) * s + e - in;
            if (total < 0)
                total = 0;
            w->pads[k] = upper ? total / 2 : total - total / 2;
            w->pads[k + w->nsp] = total - w->pads[k];
        }
    } else if (strcmp(auto_pad, "NOTSET") != 0) {
        return im_error(im, "auto_pad '%s' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID", auto_pad);
    }
    return 0;
}

static int set_window(Importer *im, Node *n, const Window *w, bool kernel, bool dilations) {
    return (kernel && im_set_ints(im, n, "kernel", w->kernel, w->nsp)) ||
           im_set_ints(im, n, "strides", w->strides, w->nsp) || im_set_ints(im, n, "pads", w->pads, 2 * w->nsp) ||
           (dilations && im_set_ints(im, n, "dilations", w->dilations, w->nsp));
}

static int imp_conv(Importer *im, bool transpose) {
    int in[3], n_in = 2;
    Type x, wt;
    if (im_input(im, 0, &in[0]) || im_input(im, 1, &in[1]) || input_type(im, 0, &x) || input_type(im, 1, &wt))
        return -1;
    if (im_has_input(im, 2) && im_input(im, 2, &in[n_in++]))
        return -1;
    if (wt.rank != x.rank || x.rank < 3)
        return im_error(im, "the weights have rank %d, the input %d", wt.rank, x.rank);
    int64_t group = 1;
    Window w;
    if (im_attr_int(im, "group", &group) < 0 || read_window(im, &x, wt.dims + 2, true, &w))
        return -1;
    Node *n = im_node(im, transpose ? OP_CONV_TRANSPOSE : OP_CONV, n_in, in);
    if (!n)
        return -1;
    if (transpose) {
        int64_t outpad[3] = {0, 0, 0}, shape[MAXL];
        int no = 0, ns = 0, r;
        if (im_attr_ints(im, "output_padding", outpad, 3, &no) < 0 ||
            (r = im_attr_ints(im, "output_shape", shape, MAXL, &ns)) < 0)
            return -1;
        if (no && no != w.nsp)
            return im_error(im, "output_padding has %d entries, the input %d spatial dims", no, w.nsp);
        const char *auto_pad = "NOTSET";
        im_attr_string(im, "auto_pad", &auto_pad);
        bool same = strncmp(auto_pad, "SAME", 4) == 0;
        if (r == 1 || same) {
            if (r == 1 && ns != w.nsp && ns != x.rank)
                return im_error(im, "output_shape has %d entries, the input %d spatial dims", ns, w.nsp);
            for (int k = 0; k < w.nsp; k++) {
                int64_t in_k = x.dims[k + 2];
                int64_t want = r == 1 ? shape[ns == x.rank ? k + 2 : k] : in_k * w.strides[k];
                int64_t e = (w.kernel[k] - 1) * w.dilations[k] + 1;
                int64_t total = w.strides[k] * (in_k - 1) + outpad[k] + e - want;
                if (total < 0) { /* a longer output than the kernel reaches: zeros after */
                    outpad[k] -= total;
                    total = 0;
                }
                bool upper = strcmp(auto_pad, "SAME_UPPER") == 0;
                w.pads[k] = upper ? total / 2 : total - total / 2;
                w.pads[k + w.nsp] = total - w.pads[k];
            }
        }
        if (im_set_ints(im, n, "output_padding", outpad, w.nsp))
            return -1;
    }
    if (set_window(im, n, &w, false, true) || im_set_int(im, n, "groups", group))
        return -1;
    return im_finish(im, n, 0) < 0 ? -1 : 0;
}

static int imp_conv2(Importer *im) {
    return imp_conv(im, false);
}
static int imp_conv_transpose(Importer *im) {
    return imp_conv(im, true);
}

static int imp_pool(Importer *im, bool max) {
    int xv;
    Type x;
    if (im_input(im, 0, &xv) || input_type(im, 0, &x))
        return -1;
    Window w;
    int64_t ceil_mode = 0, count_pad = 0, storage = 0;
    if (read_window(im, &x, NULL, max, &w) || im_attr_int(im, "ceil_mode", &ceil_mode) < 0)
        return -1;
    if (max && im_attr_int(im, "storage_order", &storage) < 0)
        return -1;
    if (storage)
        return im_error(im, "storage_order=1 is not supported");
    if (!max && im_attr_int(im, "count_include_pad", &count_pad) < 0)
        return -1;
    Node *n = im_node(im, max ? OP_MAX_POOL : OP_AVG_POOL, 1, &xv);
    if (!n || set_window(im, n, &w, true, max) || im_set_int(im, n, "ceil_mode", ceil_mode != 0))
        return -1;
    if (!max && im_set_int(im, n, "count_include_pad", count_pad != 0))
        return -1;
    return im_finish(im, n, 0) < 0 ? -1 : 0;
}

static int imp_max_pool(Importer *im) {
    return imp_pool(im, true);
}
static int imp_avg_pool(Importer *im) {
    return imp_pool(im, false);
}

static int imp_global_avg_pool(Importer *im) {
    return unary(im, OP_GLOBAL_AVG_POOL);
}

/* GlobalMaxPool: reduce_max over the spatial dims, kept. */
static int imp_global_max_pool(Importer *im) {
    int x;
    Type t;
    if (im_input(im, 0, &x) || input_type(im, 0, &t))
        return -1;
    int64_t axes[KILN_MAX_RANK];
    for (int k = 2; k < t.rank; k++)
        axes[k - 2] = k;
    Node *n = im_node(im, OP_REDUCE_MAX, 1, &x);
    return !n || im_set_ints(im, n, "axes", axes, t.rank - 2) || im_set_int(im, n, "keepdims", 1) ||
                   im_finish(im, n, 0) < 0
               ? -1
               : 0;
}

/* ---- Normalizations ---- */

static int imp_batch_norm(Importer *im) {
    double eps = 1e-5, momentum;
    int64_t training = 0, spatial = 1;
    if (im_attr_float(im, "epsilon", &eps) < 0 || im_attr_float(im, "momentum", &momentum) < 0 ||
        im_attr_int(im, "training_mode", &training) < 0 || im_attr_int(im, "spatial", &spatial) < 0)
        return -1;
    im_attr_ignore(im, "is_test");
    im_attr_ignore(im, "consumed_inputs");
    if (training)
        return im_error(im, "training_mode=1 is not supported (kiln imports inference graphs)");
    if (!spatial)
        return im_error(im, "spatial=0 is not supported");
    int in[5];
    for (int k = 0; k < 5; k++)
        if (im_input(im, k, &in[k]))
            return -1;
    Node *n = im_node(im, OP_BATCH_NORM, 5, in);
    return !n || im_set_float(im, n, "epsilon", eps) || im_finish(im, n, 0) < 0 ? -1 : 0;
}

static int imp_layer_norm(Importer *im) {
    int64_t axis = -1, stash = 1;
    double eps = 1e-5;
    if (im_attr_int(im, "axis", &axis) < 0 || im_attr_float(im, "epsilon", &eps) < 0 ||
        im_attr_int(im, "stash_type", &stash) < 0)
        return -1;
    int in[3], n_in = 2;
    if (im_input(im, 0, &in[0]) || im_input(im, 1, &in[1]))
        return -1;
    if (im_has_input(im, 2) && im_input(im, 2, &in[n_in++]))
        return -1;
    Node *n = im_node(im, OP_LAYER_NORM, n_in, in);
    if (!n || im_set_int(im, n, "axis", axis) || im_set_float(im, n, "epsilon", eps) || im_finish(im, n, 0) < 0)
        return -1;
    bool want_mean = im_n_outputs(im) > 1 && *im->node->output[1];
    bool want_inv = im_n_outputs(im) > 2 && *im->node->output[2];
    if (!want_mean && !want_inv)
        return 0;
    /* The optional outputs: the mean and 1 / sqrt(var + epsilon) over the normalized
     * dims, kept with size 1. */
    Type t;
    int a;
    if (input_type(im, 0, &t) || axis_in(im, axis, t.rank, &a))
        return -1;
    int64_t axes[KILN_MAX_RANK];
    for (int k = a; k < t.rank; k++)
        axes[k - a] = k;
    int mean, diff, var;
    if (!(n = im_node(im, OP_MEAN, 1, in)) || im_set_ints(im, n, "axes", axes, t.rank - a) ||
        im_set_int(im, n, "keepdims", 1) || (mean = im_finish(im, n, want_mean ? 1 : -1)) < 0)
        return -1;
    if (!want_inv)
        return 0;
    if ((diff = im_binary(im, OP_SUB, in[0], mean, -1)) < 0 || (var = im_binary(im, OP_MUL, diff, diff, -1)) < 0 ||
        !(n = im_node(im, OP_MEAN, 1, &var)) || im_set_ints(im, n, "axes", axes, t.rank - a) ||
        im_set_int(im, n, "keepdims", 1) || (var = im_finish(im, n, -1)) < 0 ||
        (var = im_binary(im, OP_ADD, var, im_scalar(im, eps), -1)) < 0 || (var = im_unary(im, OP_SQRT, var, -1)) < 0)
        return -1;
    return im_binary(im, OP_DIV, im_scalar(im, 1), var, 2) < 0 ? -1 : 0;
}

/* InstanceNormalization: per sample and channel over the spatial dims,
 * (x - mean) / sqrt(var + epsilon) * scale + bias, scale and bias [C]. */
static int imp_instance_norm(Importer *im) {
    double eps = 1e-5;
    int x, scale, bias;
    Type t;
    if (im_attr_float(im, "epsilon", &eps) < 0 || im_input(im, 0, &x) || input_type(im, 0, &t) ||
        im_input(im, 1, &scale) || im_input(im, 2, &bias))
        return -1;
    if (t.rank < 3)
        return im_error(im, "the input has rank %d; at least 3", t.rank);
    int64_t axes[KILN_MAX_RANK], cshape[KILN_MAX_RANK];
    for (int k = 2; k < t.rank; k++)
        axes[k - 2] = k;
    for (int k = 0; k < t.rank - 1; k++)
        cshape[k] = k == 0 ? t.dims[1] : 1;
    Node *n = im_node(im, OP_MEAN, 1, &x);
    int mean, diff, var, sd;
    if (!n || im_set_ints(im, n, "axes", axes, t.rank - 2) || im_set_int(im, n, "keepdims", 1) ||
        (mean = im_finish(im, n, -1)) < 0 || (diff = im_binary(im, OP_SUB, x, mean, -1)) < 0 ||
        (var = im_binary(im, OP_MUL, diff, diff, -1)) < 0 || !(n = im_node(im, OP_MEAN, 1, &var)) ||
        im_set_ints(im, n, "axes", axes, t.rank - 2) || im_set_int(im, n, "keepdims", 1) ||
        (var = im_finish(im, n, -1)) < 0 || (sd = im_binary(im, OP_ADD, var, im_scalar(im, eps), -1)) < 0 ||
        (sd = im_unary(im, OP_SQRT, sd, -1)) < 0 || (diff = im_binary(im, OP_DIV, diff, sd, -1)) < 0 ||
        (scale = reshape_to(im, scale, cshape, t.rank - 1, -1)) < 0 ||
        (bias = reshape_to(im, bias, cshape, t.rank - 1, -1)) < 0 ||
        (diff = im_binary(im, OP_MUL, diff, scale, -1)) < 0)
        return -1;
    return im_binary(im, OP_ADD, diff, bias, 0) < 0 ? -1 : 0;
}

/* Softmax, LogSoftmax: from opset 13 along one axis (default -1); before, over the
 * input flattened to 2-D at axis (default 1), which is a reshape around it. */
static int imp_softmax_op(Importer *im, OpId op) {
    int x;
    Type t;
    int64_t axis = im->opset >= 13 ? -1 : 1;
    if (im_attr_int(im, "axis", &axis) < 0 || im_input(im, 0, &x) || input_type(im, 0, &t))
        return -1;
    int a;
    if (t.rank == 0)
        return im_error(im, "the input is a scalar");
    if (axis_in(im, axis, t.rank, &a))
        return -1;
    bool flatten = im->opset < 13 && a != t.rank - 1;
    if (flatten) {
        int64_t dims[2] = {1, 1};
        for (int k = 0; k < t.rank; k++)
            dims[k >= a] *= t.dims[k];
        if ((x = reshape_to(im, x, dims, 2, -1)) < 0)
            return -1;
    }
    Node *n = im_node(im, op, 1, &x);
    if (!n || im_set_int(im, n, "axis", flatten ? -1 : a))
        return -1;
    int y = im_finish(im, n, flatten ? -1 : 0);
    if (y < 0)
        return -1;
    return flatten ? (reshape_to(im, y, t.dims, t.rank, 0) < 0 ? -1 : 0) : 0;
}

static int imp_softmax(Importer *im) {
    return imp_softmax_op(im, OP_SOFTMAX);
}
static int imp_log_softmax(Importer *im) {
    return imp_softmax_op(im, OP_LOG_SOFTMAX);
}

/* ---- Reductions ---- */

typedef enum { R_SUM, R_MEAN, R_MAX, R_MIN, R_L1, R_L2, R_SUMSQ, R_LOGSUM, R_LOGSUMEXP } Reduce;

static int reduce(Importer *im, Reduce kind) {
    int64_t keep = 1, noop = 0, axes[MAXL];
    int n_axes = 0, r;
    if (im_attr_int(im, "keepdims", &keep) < 0 || im_attr_int(im, "noop_with_empty_axes", &noop) < 0)
        return -1;
    if ((r = im_attr_ints(im, "axes", axes, MAXL, &n_axes)) < 0)
        return -1;
    if (r == 0 && (r = input_ints(im, 1, "axes", axes, &n_axes)) < 0)
        return -1;
    int x;
    if (im_input(im, 0, &x))
        return -1;
    if (n_axes == 0 && noop)
        return im_alias(im, 0, x);
    OpId op = kind == R_MEAN ? OP_MEAN : kind == R_MAX || kind == R_MIN ? OP_REDUCE_MAX : OP_SUM;
    if (kind == R_MIN && (x = im_unary(im, OP_NEG, x, -1)) < 0)
        return -1;
    if (kind == R_L1 && (x = im_unary(im, OP_ABS, x, -1)) < 0)
        return -1;
    if ((kind == R_L2 || kind == R_SUMSQ) && (x = im_binary(im, OP_MUL, x, x, -1)) < 0)
        return -1;
    if (kind == R_LOGSUMEXP && (x = im_unary(im, OP_EXP, x, -1)) < 0)
        return -1;
    bool last = kind == R_SUM || kind == R_MEAN || kind == R_MAX || kind == R_L1 || kind == R_SUMSQ;
    Node *n = im_node(im, op, 1, &x);
    if (!n || (n_axes && im_set_ints(im, n, "axes", axes, n_axes)) || im_set_int(im, n, "keepdims", keep != 0))
        return -1;
    int y = im_finish(im, n, last ? 0 : -1);
    if (y < 0 || last)
        return y < 0 ? -1 : 0;
    OpId after = kind == R_MIN ? OP_NEG : kind == R_L2 ? OP_SQRT : OP_LOG;
    return im_unary(im, after, y, 0) < 0 ? -1 : 0;
}

#define REDUCE(fn, KIND)                                                                                           \
    static int fn(Importer *im) {                                                                                  \
        return reduce(im, KIND);                                                                                   \
    }
REDUCE(imp_reduce_sum, R_SUM)
REDUCE(imp_reduce_mean, R_MEAN)
REDUCE(imp_reduce_max, R_MAX)
REDUCE(imp_reduce_min, R_MIN)
REDUCE(imp_reduce_l1, R_L1)
REDUCE(imp_reduce_l2, R_L2)
REDUCE(imp_reduce_sumsq, R_SUMSQ)
REDUCE(imp_reduce_logsum, R_LOGSUM)
REDUCE(imp_reduce_logsumexp, R_LOGSUMEXP)

/* ---- Shapes ---- */

static int reshape_to(Importer *im, int x, const int64_t *dims, int rank, int out_k) {
    Node *n = im_node(im, OP_RESHAPE, 1, &x);
    return !n || im_set_ints(im, n, "shape", dims, rank) ? -1 : im_finish(im, n, out_k);
}

/* A constant with the same values and a new shape. */
static int const_reshape(Importer *im, OConst *c, const int64_t *dims, int rank) {
    OConst *r = oconst_new(im, c->is_int, rank, dims);
    if (!r)
        return im_error(im, "out of memory");
    if (r->numel != c->numel)
        return im_error(im, "cannot reshape %lld elements to %lld", (long long)c->numel, (long long)r->numel);
    memcpy(r->f, c->f, sizeof(float) * (size_t)c->numel);
    if (c->is_int)
        memcpy(r->ints, c->ints, sizeof(int64_t) * (size_t)c->numel);
    return im_define_const(im, 0, r);
}

static int imp_reshape(Importer *im) {
    int64_t shape[MAXL], allowzero = 0;
    int n = 0, r;
    if (im_attr_int(im, "allowzero", &allowzero) < 0)
        return -1;
    if (im->opset < 5)
        r = im_attr_ints(im, "shape", shape, MAXL, &n);
    else
        r = input_ints(im, 1, "shape", shape, &n);
    if (r < 0)
        return -1;
    if (r == 0)
        return im_error(im, "the shape is required");
    Type t;
    if (input_type(im, 0, &t))
        return -1;
    if (n > KILN_MAX_RANK)
        return im_error(im, "the shape has %d dims (kiln's largest rank is %d)", n, KILN_MAX_RANK);
    int64_t dims[KILN_MAX_RANK], known = 1;
    int infer = -1;
    for (int k = 0; k < n; k++) {
        dims[k] = shape[k];
        if (shape[k] == 0 && !allowzero) {
            if (k >= t.rank)
                return im_error(im, "shape entry %d is 0 (copy the input's dim), but the input has rank %d", k, t.rank);
            dims[k] = t.dims[k];
        }
        if (dims[k] == -1) {
            if (infer >= 0)
                return im_error(im, "the shape has more than one -1");
            infer = k;
        } else if (dims[k] < 1) {
            return im_error(im, "shape entry %d is %lld; kiln's dims are >= 1", k, (long long)dims[k]);
        } else if (known > KILN_MAX_NUMEL / dims[k]) {
            return im_error(im, "the shape is too large");
        } else {
            known *= dims[k];
        }
    }
    int64_t numel = type_numel(&t);
    if (infer >= 0) {
        if (numel % known)
            return im_error(im, "cannot reshape %lld elements to the given shape", (long long)numel);
        dims[infer] = numel / known;
    }
    if (folded(im, 0))
        return const_reshape(im, folded(im, 0), dims, n);
    int x;
    if (im_input(im, 0, &x))
        return -1;
    return reshape_to(im, x, dims, n, 0) < 0 ? -1 : 0;
}

static int imp_flatten(Importer *im) {
    int64_t axis = 1;
    int x;
    if (im_attr_int(im, "axis", &axis) < 0 || im_input(im, 0, &x))
        return -1;
    Node *n = im_node(im, OP_FLATTEN, 1, &x);
    return !n || im_set_int(im, n, "axis", axis) || im_finish(im, n, 0) < 0 ? -1 : 0;
}

static int imp_transpose(Importer *im) {
    int64_t perm[MAXL];
    int n_perm = 0, r, x;
    if ((r = im_attr_ints(im, "perm", perm, MAXL, &n_perm)) < 0 || im_input(im, 0, &x))
        return -1;
    Node *n = im_node(im, OP_TRANSPOSE, 1, &x);
    return !n || (r == 1 && im_set_ints(im, n, "perm", perm, n_perm)) || im_finish(im, n, 0) < 0 ? -1 : 0;
}

/* Squeeze, Unsqueeze: axes an attribute before opset 13, an input from it. */
static int squeeze_like(Importer *im, bool un) {
    int64_t axes[MAXL];
    int n_axes = 0, r;
    if (im->opset < 13)
        r = im_attr_ints(im, "axes", axes, MAXL, &n_axes);
    else
        r = input_ints(im, 1, "axes", axes, &n_axes);
    if (r < 0)
        return -1;
    if (un && r == 0)
        return im_error(im, "axes is required");
    Type t;
    if (input_type(im, 0, &t))
        return -1;
    OConst *c0 = folded(im, 0);
    if (c0) { /* fold: the new shape by the same rule */
        int64_t dims[KILN_MAX_RANK];
        int rank = 0;
        bool mark[KILN_MAX_RANK + MAXL] = {0};
        int out_rank = un ? t.rank + n_axes : t.rank;
        if (out_rank > KILN_MAX_RANK)
            return im_error(im, "the result has rank %d (at most %d)", out_rank, KILN_MAX_RANK);
        for (int k = 0; k < n_axes; k++) {
            int a;
            if (axis_in(im, axes[k], out_rank, &a))
                return -1;
            mark[a] = true;
        }
        if (un) {
            for (int k = 0, j = 0; k < out_rank; k++)
                dims[rank++] = mark[k] ? 1 : t.dims[j++];
        } else {
            for (int k = 0; k < t.rank; k++)
                if (!(n_axes ? mark[k] : t.dims[k] == 1))
                    dims[rank++] = t.dims[k];
        }
        return const_reshape(im, c0, dims, rank);
    }
    int x;
    if (im_input(im, 0, &x))
        return -1;
    Node *n = im_node(im, un ? OP_UNSQUEEZE : OP_SQUEEZE, 1, &x);
    return !n || ((un || n_axes) && im_set_ints(im, n, "axes", axes, n_axes)) || im_finish(im, n, 0) < 0 ? -1 : 0;
}

static int imp_squeeze(Importer *im) {
    return squeeze_like(im, false);
}
static int imp_unsqueeze(Importer *im) {
    return squeeze_like(im, true);
}

static int imp_concat(Importer *im) {
    int64_t axis;
    int r = im_attr_int(im, "axis", &axis);
    if (r < 0)
        return -1;
    if (r == 0)
        return im_error(im, "axis is required");
    int n_in = im_n_inputs(im);
    if (n_in < 1)
        return im_error(im, "needs at least one input");
    if (all_const(im)) { /* fold */
        OConst *first = sym_in(im, 0)->c;
        int a;
        if (axis_in(im, axis, first->rank, &a))
            return -1;
        int64_t dims[KILN_MAX_RANK];
        memcpy(dims, first->dims, sizeof dims);
        dims[a] = 0;
        bool is_int = first->is_int;
        for (int k = 0; k < n_in; k++) {
            OConst *c = sym_in(im, k)->c;
            if (c->rank != first->rank || c->is_int != is_int)
                return im_error(im, "the constant inputs differ in rank or dtype");
            for (int j = 0; j < c->rank; j++)
                if (j != a && c->dims[j] != first->dims[j])
                    return im_error(im, "the constant inputs' shapes do not agree");
            dims[a] += c->dims[a];
        }
        OConst *out = oconst_new(im, is_int, first->rank, dims);
        if (!out)
            return im_error(im, "out of memory");
        int64_t outer = 1, inner = 1;
        for (int j = 0; j < a; j++)
            outer *= dims[j];
        for (int j = a + 1; j < first->rank; j++)
            inner *= dims[j];
        int64_t pos = 0;
        for (int64_t o = 0; o < outer; o++)
            for (int k = 0; k < n_in; k++) {
                OConst *c = sym_in(im, k)->c;
                int64_t len = c->dims[a] * inner;
                memcpy(out->f + pos, c->f + o * len, sizeof(float) * (size_t)len);
                if (is_int)
                    memcpy(out->ints + pos, c->ints + o * len, sizeof(int64_t) * (size_t)len);
                pos += len;
            }
        return im_define_const(im, 0, out);
    }
    int *in = arena_alloc(&im->arena, sizeof(int) * (size_t)n_in);
    if (!in)
        return im_error(im, "out of memory");
    for (int k = 0; k < n_in; k++)
        if (im_input(im, k, &in[k]))
            return -1;
    Node *n = im_node(im, OP_CONCAT, n_in, in);
    return !n || im_set_int(im, n, "axis", axis) || im_finish(im, n, 0) < 0 ? -1 : 0;
}

/* Slice's start/end along a dim of length len, clamped as ONNX defines. */
static void slice_range(int64_t len, int64_t start, int64_t end, int64_t step, int64_t *s, int64_t *e) {
    if (start < 0)
        start = start < -len ? 0 : start + len;
    if (end < 0)
        end = end < -len ? -1 : end + len;
    if (step > 0) {
        *s = start > len ? len : start;
        *e = end > len ? len : end < 0 ? 0 : end;
    } else {
        *s = start > len - 1 ? len - 1 : start;
        *e = end > len - 1 ? len - 1 : end;
    }
}

/* Slicing a constant: the general strided copy. */
static int fold_slice(Importer *im, OConst *c, const int64_t *starts, const int64_t *ends, const int64_t *axes,
                      const int64_t *steps, int n) {
    int64_t begin[KILN_MAX_RANK], step[KILN_MAX_RANK], dims[KILN_MAX_RANK];
    for (int k = 0; k < c->rank; k++)
        begin[k] = 0, step[k] = 1, dims[k] = c->dims[k];
    for (int i = 0; i < n; i++) {
        int a;
        if (axis_in(im, axes[i], c->rank, &a))
            return -1;
        if (steps[i] == 0)
            return im_error(im, "a step is 0");
        int64_t s, e;
        slice_range(c->dims[a], starts[i], ends[i], steps[i], &s, &e);
        int64_t len = steps[i] > 0 ? (e > s ? (e - s + steps[i] - 1) / steps[i] : 0)
                                   : (s > e ? (s - e - steps[i] - 1) / -steps[i] : 0);
        begin[a] = s, step[a] = steps[i], dims[a] = len;
    }
    OConst *out = oconst_new(im, c->is_int, c->rank, dims);
    if (!out)
        return im_error(im, "out of memory");
    for (int64_t i = 0; i < out->numel; i++) {
        int64_t rem = i, src = 0, stride = 1;
        for (int k = c->rank - 1; k >= 0; k--) {
            int64_t idx = rem % dims[k];
            rem /= dims[k];
            src += (begin[k] + idx * step[k]) * stride;
            stride *= c->dims[k];
        }
        out->f[i] = c->f[src];
        if (c->is_int)
            out->ints[i] = c->ints[src];
    }
    return im_define_const(im, 0, out);
}

static int imp_slice(Importer *im) {
    int64_t starts[MAXL], ends[MAXL], axes[MAXL], steps[MAXL];
    int ns = 0, ne = 0, na = 0, nst = 0, ra, rs;
    if (im->opset < 10) {
        if (im_attr_ints(im, "starts", starts, MAXL, &ns) < 0 || im_attr_ints(im, "ends", ends, MAXL, &ne) < 0 ||
            (ra = im_attr_ints(im, "axes", axes, MAXL, &na)) < 0)
            return -1;
        rs = 0;
    } else if (input_ints(im, 1, "starts", starts, &ns) < 0 || input_ints(im, 2, "ends", ends, &ne) < 0 ||
               (ra = input_ints(im, 3, "axes", axes, &na)) < 0 || (rs = input_ints(im, 4, "steps", steps, &nst)) < 0) {
        return -1;
    }
    if (ns != ne || (ra && na != ns) || (rs && nst != ns))
        return im_error(im, "starts, ends, axes and steps differ in length");
    if (!ra)
        for (int k = 0; k < ns; k++)
            axes[k] = k;
    if (!rs)
        for (int k = 0; k < ns; k++)
            steps[k] = 1;
    if (folded(im, 0))
        return fold_slice(im, folded(im, 0), starts, ends, axes, steps, ns);
    int x;
    if (im_input(im, 0, &x))
        return -1;
    Node *n = im_node(im, OP_SLICE, 1, &x);
    return !n || im_set_ints(im, n, "starts", starts, ns) || im_set_ints(im, n, "ends", ends, ns) ||
                   im_set_ints(im, n, "axes", axes, ns) || im_set_ints(im, n, "steps", steps, ns) ||
                   im_finish(im, n, 0) < 0
               ? -1
               : 0;
}

static int imp_pad(Importer *im) {
    int64_t pads[MAXL];
    int np = 0, r;
    double value = 0;
    const char *mode = "constant";
    if (im_attr_string(im, "mode", &mode) < 0)
        return -1;
    if (im->opset < 11) {
        if ((r = im_attr_ints(im, im->opset < 2 ? "paddings" : "pads", pads, MAXL, &np)) < 0 ||
            im_attr_float(im, "value", &value) < 0)
            return -1;
    } else {
        if ((r = input_ints(im, 1, "pads", pads, &np)) < 0 || bound_input(im, 2, "constant_value", &value))
            return -1;
        if (im_has_input(im, 3))
            return im_error(im, "the axes input is not supported");
    }
    if (r == 0)
        return im_error(im, "pads is required");
    int x;
    if (im_input(im, 0, &x))
        return -1;
    Node *n = im_node(im, OP_PAD, 1, &x);
    return !n || im_set_ints(im, n, "pads", pads, np) || im_set_word(im, n, "mode", mode) ||
                   im_set_float(im, n, "value", value) || im_finish(im, n, 0) < 0
               ? -1
               : 0;
}

/* Expand: x broadcast with the shape (both ways: the result is their broadcast). */
static int imp_expand(Importer *im) {
    int64_t shape[MAXL];
    int ns = 0, r, x;
    Type t;
    if ((r = input_ints(im, 1, "shape", shape, &ns)) < 0 || input_type(im, 0, &t))
        return -1;
    if (r == 0)
        return im_error(im, "the shape is required");
    int rank = ns > t.rank ? ns : t.rank;
    if (rank > KILN_MAX_RANK)
        return im_error(im, "the result has rank %d (at most %d)", rank, KILN_MAX_RANK);
    int64_t dims[KILN_MAX_RANK];
    for (int k = 0; k < rank; k++) {
        int ks = k - (rank - ns), kt = k - (rank - t.rank);
        int64_t a = ks >= 0 ? shape[ks] : 1, b = kt >= 0 ? t.dims[kt] : 1;
        if (a != b && a != 1 && b != 1)
            return im_error(im, "the shape does not broadcast with the input's");
        dims[k] = a == 1 ? b : a;
    }
    if (im_input(im, 0, &x))
        return -1;
    Node *n = im_node(im, OP_EXPAND, 1, &x);
    return !n || im_set_ints(im, n, "shape", dims, rank) || im_finish(im, n, 0) < 0 ? -1 : 0;
}

/* Split: one slice per output. */
static int imp_split(Importer *im) {
    int64_t axis = 0, split[MAXL];
    int n_split = 0, r;
    Type t;
    if (im_attr_int(im, "axis", &axis) < 0 || input_type(im, 0, &t))
        return -1;
    if (im->opset < 13)
        r = im_attr_ints(im, "split", split, MAXL, &n_split);
    else
        r = input_ints(im, 1, "split", split, &n_split);
    if (r < 0)
        return -1;
    int a, n_out = im_n_outputs(im), x;
    if (axis_in(im, axis, t.rank, &a) || im_input(im, 0, &x))
        return -1;
    if (n_out < 1 || n_out > MAXL)
        return im_error(im, "has %d outputs", n_out);
    if (r == 0) {
        if (t.dims[a] % n_out)
            return im_error(im, "dim %d (%lld) does not split into %d equal parts", a, (long long)t.dims[a], n_out);
        for (int k = 0; k < n_out; k++)
            split[k] = t.dims[a] / n_out;
        n_split = n_out;
    }
    if (n_split != n_out)
        return im_error(im, "split has %d entries for %d outputs", n_split, n_out);
    int64_t pos = 0;
    for (int k = 0; k < n_out; k++) {
        int64_t start = pos, end = pos + split[k], ax = a, one = 1;
        pos = end;
        if (!*(im->node->output[k] ? im->node->output[k] : ""))
            continue;
        Node *n = im_node(im, OP_SLICE, 1, &x);
        if (!n || im_set_ints(im, n, "starts", &start, 1) || im_set_ints(im, n, "ends", &end, 1) ||
            im_set_ints(im, n, "axes", &ax, 1) || im_set_ints(im, n, "steps", &one, 1) || im_finish(im, n, k) < 0)
            return -1;
    }
    if (pos != t.dims[a])
        return im_error(im, "the split sizes add up to %lld, the dim is %lld", (long long)pos, (long long)t.dims[a]);
    return 0;
}

/* Tile: x reshaped with a 1 before each dim, expanded to the repeats, reshaped to
 * the product. */
static int imp_tile(Importer *im) {
    int64_t reps[MAXL];
    int nr = 0, x;
    Type t;
    if (input_ints(im, 1, "repeats", reps, &nr) < 0 || input_type(im, 0, &t) || im_input(im, 0, &x))
        return -1;
    if (nr != t.rank)
        return im_error(im, "repeats has %d entries for an input of rank %d", nr, t.rank);
    if (2 * t.rank > KILN_MAX_RANK)
        return im_error(im, "rank %d is too large to tile (at most %d)", t.rank, KILN_MAX_RANK / 2);
    int64_t split[KILN_MAX_RANK], big[KILN_MAX_RANK], out[KILN_MAX_RANK];
    for (int k = 0; k < t.rank; k++) {
        if (reps[k] < 1)
            return im_error(im, "repeat %lld is not at least 1", (long long)reps[k]);
        split[2 * k] = 1, split[2 * k + 1] = t.dims[k];
        big[2 * k] = reps[k], big[2 * k + 1] = t.dims[k];
        out[k] = reps[k] * t.dims[k];
    }
    int y;
    Node *n;
    if ((y = reshape_to(im, x, split, 2 * t.rank, -1)) < 0 || !(n = im_node(im, OP_EXPAND, 1, &y)) ||
        im_set_ints(im, n, "shape", big, 2 * t.rank) || (y = im_finish(im, n, -1)) < 0)
        return -1;
    return reshape_to(im, y, out, t.rank, 0) < 0 ? -1 : 0;
}

/* DepthToSpace (DCR or CRD) and SpaceToDepth: reshape, transpose, reshape. */
static int space_depth(Importer *im, bool to_space) {
    int64_t bs = 0;
    const char *mode = "DCR";
    int x;
    Type t;
    if (im_attr_int(im, "blocksize", &bs) < 0 || (to_space && im_attr_string(im, "mode", &mode) < 0) ||
        im_input(im, 0, &x) || input_type(im, 0, &t))
        return -1;
    if (t.rank != 4 || bs < 1)
        return im_error(im, "needs a 4-D input and a blocksize >= 1");
    int64_t N = t.dims[0], C = t.dims[1], H = t.dims[2], W = t.dims[3];
    int64_t mid[6], perm[6], out[4];
    if (to_space) {
        if (C % (bs * bs))
            return im_error(im, "channels %lld are not a multiple of blocksize^2", (long long)C);
        bool dcr = strcmp(mode, "DCR") == 0;
        if (!dcr && strcmp(mode, "CRD") != 0)
            return im_error(im, "mode '%s' is not DCR or CRD", mode);
        int64_t c = C / (bs * bs);
        int64_t m1[6] = {N, bs, bs, c, H, W}, m2[6] = {N, c, bs, bs, H, W};
        int64_t p1[6] = {0, 3, 4, 1, 5, 2}, p2[6] = {0, 1, 4, 2, 5, 3};
        memcpy(mid, dcr ? m1 : m2, sizeof mid);
        memcpy(perm, dcr ? p1 : p2, sizeof perm);
        out[0] = N, out[1] = c, out[2] = H * bs, out[3] = W * bs;
    } else {
        if (H % bs || W % bs)
            return im_error(im, "the spatial dims are not multiples of the blocksize");
        int64_t m[6] = {N, C, H / bs, bs, W / bs, bs}, p[6] = {0, 3, 5, 1, 2, 4};
        memcpy(mid, m, sizeof mid);
        memcpy(perm, p, sizeof perm);
        out[0] = N, out[1] = C * bs * bs, out[2] = H / bs, out[3] = W / bs;
    }
    int y;
    Node *n;
    if ((y = reshape_to(im, x, mid, 6, -1)) < 0 || !(n = im_node(im, OP_TRANSPOSE, 1, &y)) ||
        im_set_ints(im, n, "perm", perm, 6) || (y = im_finish(im, n, -1)) < 0)
        return -1;
    return reshape_to(im, y, out, 4, 0) < 0 ? -1 : 0;
}

static int imp_depth_to_space(Importer *im) {
    return space_depth(im, true);
}
static int imp_space_to_depth(Importer *im) {
    return space_depth(im, false);
}

/* ---- Resampling ---- */

/* Resize (opsets 10, 11, 13) and Upsample (opsets 7 and 9, scales as an attribute
 * and then an input): kiln's resize, whose attributes are Resize's. Resize-10 and
 * Upsample compute with asymmetric coordinates and, for nearest, floor. */
static int imp_resize_op(Importer *im, bool upsample) {
    double scales[MAXL];
    int64_t sizes[MAXL];
    int n_scales = 0, n_sizes = 0;
    bool old = upsample || im->opset < 11;
    const char *mode = "nearest", *coord = old ? "asymmetric" : "half_pixel", *nearest = old ? "floor" : "round_prefer_floor";
    double cubic = -0.75, extrap = 0;
    int64_t exclude = 0;
    if (im_attr_string(im, "mode", &mode) < 0)
        return -1;
    if (!old && (im_attr_string(im, "coordinate_transformation_mode", &coord) < 0 ||
                 im_attr_string(im, "nearest_mode", &nearest) < 0 || im_attr_float(im, "cubic_coeff_a", &cubic) < 0 ||
                 im_attr_int(im, "exclude_outside", &exclude) < 0 ||
                 im_attr_float(im, "extrapolation_value", &extrap) < 0))
        return -1;
    if (strcmp(mode, "bilinear") == 0) /* Upsample-7's name for it */
        mode = "linear";
    OConst *roi = NULL, *sc = NULL, *sz = NULL;
    if (upsample && im->opset < 9) {
        if (im_attr_floats(im, "scales", scales, MAXL, &n_scales) < 0)
            return -1;
    } else {
        int k_scales = old ? 1 : 2;
        if ((!old && im_const_input(im, 1, "roi", &roi)) || im_const_input(im, k_scales, "scales", &sc) ||
            (!old && im_const_input(im, 3, "sizes", &sz)))
            return -1;
        if (sc && const_floats(im, sc, "scales", scales, &n_scales))
            return -1;
        if (sz && const_ints(im, sz, "sizes", sizes, &n_sizes))
            return -1;
    }
    if (!n_scales && !n_sizes)
        return im_error(im, "neither scales nor sizes is given");
    if (n_scales && n_sizes)
        return im_error(im, "both scales and sizes are given");
    int x;
    if (im_input(im, 0, &x))
        return -1;
    Node *n = im_node(im, OP_RESIZE, 1, &x);
    if (!n || (n_scales && im_set_floats(im, n, "scales", scales, n_scales)) ||
        (n_sizes && im_set_ints(im, n, "sizes", sizes, n_sizes)) || im_set_word(im, n, "mode", mode) ||
        im_set_word(im, n, "coordinate_transformation_mode", coord) || im_set_word(im, n, "nearest_mode", nearest) ||
        im_set_float(im, n, "cubic_coeff_a", cubic) || im_set_int(im, n, "exclude_outside", exclude != 0) ||
        im_set_float(im, n, "extrapolation_value", extrap))
        return -1;
    if (strcmp(coord, "tf_crop_and_resize") == 0) {
        double r[MAXL];
        int nr = 0;
        if (!roi)
            return im_error(im, "tf_crop_and_resize needs the roi input");
        if (const_floats(im, roi, "roi", r, &nr) || im_set_floats(im, n, "roi", r, nr))
            return -1;
    }
    /* kiln checks the words against its choices and says which are allowed */
    return im_finish(im, n, 0) < 0 ? -1 : 0;
}

static int imp_resize(Importer *im) {
    return imp_resize_op(im, false);
}
static int imp_upsample(Importer *im) {
    return imp_resize_op(im, true);
}

/* ---- Constants and shape computations, folded ---- */

static int imp_constant(Importer *im) {
    OConst *c = NULL;
    double f, fs[MAXL];
    int64_t i, is[MAXL];
    int n, r;
    if ((r = im_attr_tensor(im, "value", &c)) < 0)
        return -1;
    if (!r && (r = im_attr_float(im, "value_float", &f)) == 1) {
        if (!(c = oconst_new(im, false, 0, NULL)))
            return im_error(im, "out of memory");
        c->f[0] = (float)f;
    }
    if (!c && r >= 0 && (r = im_attr_int(im, "value_int", &i)) == 1) {
        if (!(c = oconst_new(im, true, 0, NULL)))
            return im_error(im, "out of memory");
        c->ints[0] = i, c->f[0] = (float)i;
    }
    if (!c && r >= 0 && (r = im_attr_floats(im, "value_floats", fs, MAXL, &n)) == 1) {
        int64_t d = n;
        if (!(c = oconst_new(im, false, 1, &d)))
            return im_error(im, "out of memory");
        for (int k = 0; k < n; k++)
            c->f[k] = (float)fs[k];
    }
    if (!c && r >= 0 && (r = im_attr_ints(im, "value_ints", is, MAXL, &n)) == 1) {
        int64_t d = n;
        if (!(c = oconst_new(im, true, 1, &d)))
            return im_error(im, "out of memory");
        for (int k = 0; k < n; k++)
            c->ints[k] = is[k], c->f[k] = (float)is[k];
    }
    if (r < 0)
        return -1;
    if (!c)
        return im_error(im, "no value kiln reads (value, value_float(s) or value_int(s))");
    return im_define_const(im, 0, c);
}

static int int_list_const(Importer *im, const int64_t *v, int n, int rank) {
    int64_t d = n;
    OConst *c = oconst_new(im, true, rank, &d);
    if (!c)
        return im_error(im, "out of memory");
    for (int k = 0; k < n; k++)
        c->ints[k] = v[k], c->f[k] = (float)v[k];
    return im_define_const(im, 0, c);
}

static int imp_shape(Importer *im) {
    Type t;
    int64_t start = 0, end = KILN_MAX_RANK;
    int r;
    if (im_attr_int(im, "start", &start) < 0 || (r = im_attr_int(im, "end", &end)) < 0 || input_type(im, 0, &t))
        return -1;
    if (r == 0)
        end = t.rank;
    int64_t s, e;
    slice_range(t.rank, start, end, 1, &s, &e);
    return int_list_const(im, t.dims + s, e > s ? (int)(e - s) : 0, 1);
}

static int imp_size(Importer *im) {
    Type t;
    if (input_type(im, 0, &t))
        return -1;
    int64_t n = type_numel(&t);
    return int_list_const(im, &n, 1, 0);
}

/* Cast: of a constant, folded; of a run-time value, only to float. */
static int imp_cast(Importer *im) {
    int64_t to = 0;
    if (im_attr_int(im, "to", &to) < 0)
        return -1;
    OConst *src = folded(im, 0);
    bool to_float = to == 1 || to == 10 || to == 11 || to == 16;
    bool to_int = to == 2 || to == 3 || to == 4 || to == 5 || to == 6 || to == 7 || to == 9 || to == 12 || to == 13;
    if (src) {
        OConst *c = oconst_new(im, to_int, src->rank, src->dims);
        if (!c)
            return im_error(im, "out of memory");
        if (!to_float && !to_int)
            return im_error(im, "cast to %s is not supported", onnx_dtype_name((int32_t)to));
        for (int64_t i = 0; i < c->numel; i++) {
            double v = src->is_int ? (double)src->ints[i] : src->f[i];
            if (to_int) {
                int64_t iv = src->is_int ? src->ints[i]
                             : isnan(v)      ? 0
                             : v >= 9.2e18   ? INT64_MAX
                             : v <= -9.2e18  ? INT64_MIN
                                             : (int64_t)v;
                c->ints[i] = to == 9 ? iv != 0 : iv;
                c->f[i] = (float)c->ints[i];
            } else {
                c->f[i] = (float)v;
            }
        }
        return im_define_const(im, 0, c);
    }
    if (!to_float || to != 1)
        return im_error(im, "cast of a run-time tensor to %s; kiln computes in f32", onnx_dtype_name((int32_t)to));
    return imp_identity(im);
}

static int imp_constant_of_shape(Importer *im) {
    int64_t dims[MAXL];
    int n = 0, r;
    OConst *value = NULL;
    if ((r = input_ints(im, 0, "the shape", dims, &n)) < 0 || im_attr_tensor(im, "value", &value) < 0)
        return -1;
    if (r == 0 || n > KILN_MAX_RANK)
        return im_error(im, "the shape is missing or has more than %d dims", KILN_MAX_RANK);
    double numel = 1;
    for (int k = 0; k < n; k++) {
        if (dims[k] < 0)
            return im_error(im, "the shape has a negative dim");
        numel *= (double)dims[k];
    }
    if (numel > (double)KILN_MAX_NUMEL)
        return im_error(im, "the shape is too large");
    if (value && value->numel != 1)
        return im_error(im, "value must hold one element");
    OConst *c = fold_new(im, value && value->is_int, n, dims);
    if (!c)
        return -1;
    for (int64_t i = 0; i < c->numel; i++) {
        c->f[i] = value ? value->f[0] : 0;
        if (c->is_int)
            c->ints[i] = value->ints[0];
    }
    return im_define_const(im, 0, c);
}

static int imp_range(Importer *im) {
    OConst *s, *l, *d;
    if (im_const_input(im, 0, "start", &s) || im_const_input(im, 1, "limit", &l) || im_const_input(im, 2, "delta", &d))
        return -1;
    if (!s || !l || !d || s->numel != 1 || l->numel != 1 || d->numel != 1)
        return im_error(im, "start, limit and delta must be single constants");
    bool is_int = s->is_int;
    double a = is_int ? (double)s->ints[0] : s->f[0], b = l->is_int ? (double)l->ints[0] : l->f[0];
    double step = d->is_int ? (double)d->ints[0] : d->f[0];
    if (step == 0)
        return im_error(im, "delta is 0");
    double count = ceil((b - a) / step);
    if (count < 0)
        count = 0;
    if (count > (double)MAX_FOLDED)
        return im_error(im, "the range is too long");
    int64_t n = (int64_t)count;
    OConst *c = oconst_new(im, is_int, 1, &n);
    if (!c)
        return im_error(im, "out of memory");
    for (int64_t i = 0; i < n; i++) {
        if (is_int)
            c->ints[i] = s->ints[0] + i * d->ints[0], c->f[i] = (float)c->ints[i];
        else
            c->f[i] = (float)(s->f[0] + (float)i * d->f[0]);
    }
    return im_define_const(im, 0, c);
}

/* Gather: on constants, folded (shape arithmetic); on a run-time tensor with
 * constant indices, a slice per index, concatenated along the axis in the indices'
 * row-major order, then reshaped to the input's dims with the axis replaced by the
 * indices' dims (none for a scalar index). */
static int imp_gather(Importer *im) {
    int64_t axis = 0;
    OConst *idx;
    Type t;
    if (im_attr_int(im, "axis", &axis) < 0 || im_const_input(im, 1, "indices", &idx) || input_type(im, 0, &t))
        return -1;
    if (!idx)
        return im_error(im, "indices is required");
    int a;
    if (axis_in(im, axis, t.rank, &a))
        return -1;
    if (!idx->is_int)
        return im_error(im, "indices must be integers");
    if (t.rank - 1 + idx->rank > KILN_MAX_RANK)
        return im_error(im, "the result would have rank %d (at most %d)", t.rank - 1 + idx->rank, KILN_MAX_RANK);
    if (idx->numel == 0 || idx->numel > MAXL)
        return im_error(im, "indices has %lld entries (1 to %d)", (long long)idx->numel, MAXL);
    int64_t ids[MAXL];
    for (int64_t i = 0; i < idx->numel; i++) {
        ids[i] = idx->ints[i] < 0 ? idx->ints[i] + t.dims[a] : idx->ints[i];
        if (ids[i] < 0 || ids[i] >= t.dims[a])
            return im_error(im, "index %lld is out of range for a dim of %lld", (long long)idx->ints[i],
                            (long long)t.dims[a]);
    }
    int64_t dims[KILN_MAX_RANK];
    int rank = 0;
    for (int k = 0; k < t.rank; k++) {
        if (k == a) {
            for (int j = 0; j < idx->rank; j++)
                dims[rank++] = idx->dims[j];
        } else {
            dims[rank++] = t.dims[k];
        }
    }
    if (folded(im, 0)) {
        OConst *c = folded(im, 0), *out = fold_new(im, c->is_int, rank, dims);
        if (!out)
            return -1;
        int64_t outer = 1, inner = 1;
        for (int k = 0; k < a; k++)
            outer *= t.dims[k];
        for (int k = a + 1; k < t.rank; k++)
            inner *= t.dims[k];
        int64_t pos = 0;
        for (int64_t o = 0; o < outer; o++)
            for (int64_t i = 0; i < idx->numel; i++)
                for (int64_t j = 0; j < inner; j++, pos++) {
                    int64_t src = (o * t.dims[a] + ids[i]) * inner + j;
                    out->f[pos] = c->f[src];
                    if (c->is_int)
                        out->ints[pos] = c->ints[src];
                }
        return im_define_const(im, 0, out);
    }
    int x, parts[MAXL];
    if (im_input(im, 0, &x))
        return -1;
    for (int64_t i = 0; i < idx->numel; i++) {
        int64_t start = ids[i], end = ids[i] + 1, ax = a, one = 1;
        Node *n = im_node(im, OP_SLICE, 1, &x);
        if (!n || im_set_ints(im, n, "starts", &start, 1) || im_set_ints(im, n, "ends", &end, 1) ||
            im_set_ints(im, n, "axes", &ax, 1) || im_set_ints(im, n, "steps", &one, 1) ||
            (parts[i] = im_finish(im, n, -1)) < 0)
            return -1;
    }
    int y = parts[0];
    if (idx->numel > 1) {
        Node *n = im_node(im, OP_CONCAT, (int)idx->numel, parts);
        if (!n || im_set_int(im, n, "axis", a) || (y = im_finish(im, n, -1)) < 0)
            return -1;
    }
    return reshape_to(im, y, dims, rank, 0) < 0 ? -1 : 0;
}

/* ---- The table ---- */

typedef struct {
    const char *op_type;
    OnnxImportFn fn;
} OnnxOp;

static const OnnxOp ops[] = {
    {"Abs", imp_abs},
    {"Add", imp_add},
    {"AveragePool", imp_avg_pool},
    {"BatchNormalization", imp_batch_norm},
    {"Cast", imp_cast},
    {"Celu", imp_celu},
    {"Clip", imp_clip},
    {"Concat", imp_concat},
    {"Constant", imp_constant},
    {"ConstantOfShape", imp_constant_of_shape},
    {"Conv", imp_conv2},
    {"ConvTranspose", imp_conv_transpose},
    {"DepthToSpace", imp_depth_to_space},
    {"Div", imp_div},
    {"Dropout", imp_dropout},
    {"Elu", imp_elu},
    {"Erf", imp_erf},
    {"Exp", imp_exp},
    {"Expand", imp_expand},
    {"Flatten", imp_flatten},
    {"Gather", imp_gather},
    {"Gemm", imp_gemm},
    {"GlobalAveragePool", imp_global_avg_pool},
    {"GlobalMaxPool", imp_global_max_pool},
    {"HardSigmoid", imp_hardsigmoid},
    {"HardSwish", imp_hardswish},
    {"Identity", imp_identity},
    {"InstanceNormalization", imp_instance_norm},
    {"LayerNormalization", imp_layer_norm},
    {"LeakyRelu", imp_leaky_relu},
    {"Log", imp_log},
    {"LogSoftmax", imp_log_softmax},
    {"MatMul", imp_matmul},
    {"Max", imp_max},
    {"MaxPool", imp_max_pool},
    {"Mean", imp_mean},
    {"Min", imp_min},
    {"Mul", imp_mul},
    {"Neg", imp_neg},
    {"PRelu", imp_prelu},
    {"Pad", imp_pad},
    {"Pow", imp_pow},
    {"Range", imp_range},
    {"Reciprocal", imp_reciprocal},
    {"ReduceL1", imp_reduce_l1},
    {"ReduceL2", imp_reduce_l2},
    {"ReduceLogSum", imp_reduce_logsum},
    {"ReduceLogSumExp", imp_reduce_logsumexp},
    {"ReduceMax", imp_reduce_max},
    {"ReduceMean", imp_reduce_mean},
    {"ReduceMin", imp_reduce_min},
    {"ReduceSum", imp_reduce_sum},
    {"ReduceSumSquare", imp_reduce_sumsq},
    {"Relu", imp_relu},
    {"Reshape", imp_reshape},
    {"Resize", imp_resize},
    {"Selu", imp_selu},
    {"Shape", imp_shape},
    {"Sigmoid", imp_sigmoid},
    {"Size", imp_size},
    {"Slice", imp_slice},
    {"Softmax", imp_softmax},
    {"Softplus", imp_softplus},
    {"Softsign", imp_softsign},
    {"SpaceToDepth", imp_space_to_depth},
    {"Split", imp_split},
    {"Sqrt", imp_sqrt},
    {"Squeeze", imp_squeeze},
    {"Sub", imp_sub},
    {"Sum", imp_sum},
    {"Tanh", imp_tanh},
    {"Tile", imp_tile},
    {"Transpose", imp_transpose},
    {"Unsqueeze", imp_unsqueeze},
    {"Upsample", imp_upsample},
};

OnnxImportFn onnx_find_op(const char *op_type) {
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++)
        if (strcmp(ops[i].op_type, op_type) == 0)
            return ops[i].fn;
    return NULL;
}
