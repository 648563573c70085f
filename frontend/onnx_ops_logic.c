/* ONNX's comparisons, logic, Where, ArgMax, ArgMin, IsNaN, IsInf, Trilu, Hardmax and
 * CumSum as kiln's ops of every dtype.
 *
 * Where every input is a constant (a mask built from a shape, ViT's
 * Where(Equal(shape, -1), ones, shape) before an Expand), the result folds at
 * import, exactly, so that an op reading it as a shape-like parameter still can;
 * otherwise each becomes the kiln op of the same meaning (docs/language.md). */
#include "onnx_internal.h"

#include <math.h>

/* The broadcast shape of the node's inputs first .. n_in - 1, all constants. */
static int broadcast_consts(Importer *im, int first, int64_t *dims, int *rank) {
    *rank = 0;
    for (int k = first; k < im_n_inputs(im); k++) {
        const OConst *c = im_folded(im, k);
        int r = c->rank > *rank ? c->rank : *rank;
        int64_t out[KILN_MAX_RANK];
        for (int j = 0; j < r; j++) {
            int jc = j - (r - c->rank), jo = j - (r - *rank);
            int64_t dc = jc >= 0 ? c->dims[jc] : 1, d = jo >= 0 ? dims[jo] : 1;
            if (dc != d && dc != 1 && d != 1)
                return im_error(im, "the constant operands do not broadcast");
            out[j] = d == 1 ? dc : d;
        }
        *rank = r;
        for (int j = 0; j < r; j++)
            dims[j] = out[j];
    }
    return 0;
}

/* The element of c that flat element i of the broadcast shape dims reads. */
static int64_t broadcast_at(const OConst *c, const int64_t *dims, int rank, int64_t i) {
    int64_t at = 0, stride = 1;
    for (int k = rank - 1; k >= 0; k--) {
        int64_t idx = i % dims[k];
        i /= dims[k];
        int kc = k - (rank - c->rank);
        if (kc >= 0) {
            at += (c->dims[kc] == 1 ? 0 : idx) * stride;
            stride *= c->dims[kc];
        }
    }
    return at;
}

/* c's element i as a double, for comparing constants of one dtype. */
static double value_at(const OConst *c, int64_t i) {
    return c->is_int ? (double)c->ints[i] : c->f[i];
}

static bool compare_consts(OpId op, const OConst *a, int64_t i, const OConst *b, int64_t j) {
    bool ints = a->is_int && b->is_int;
    int64_t x = ints ? a->ints[i] : 0, y = ints ? b->ints[j] : 0;
    double u = value_at(a, i), v = value_at(b, j);
    switch (op) {
    case OP_EQUAL: return ints ? x == y : u == v;
    case OP_LESS: return ints ? x < y : u < v;
    case OP_LESS_EQUAL: return ints ? x <= y : u <= v;
    case OP_GREATER: return ints ? x > y : u > v;
    case OP_GREATER_EQUAL: return ints ? x >= y : u >= v;
    case OP_AND: return x && y;
    case OP_OR: return x || y;
    default: return false;
    }
}

static int fold(Importer *im, OpId op) {
    int64_t dims[KILN_MAX_RANK];
    int rank;
    if (broadcast_consts(im, 0, dims, &rank))
        return -1;
    const OConst *x = im_folded(im, 0), *y = im_n_inputs(im) > 1 ? im_folded(im, 1) : NULL;
    const OConst *from = op == OP_WHERE ? im_folded(im, 1) : NULL;
    OConst *c = im_fold_new(im, op == OP_WHERE ? from->is_int : true, rank, dims);
    if (!c)
        return -1;
    c->dtype = op == OP_WHERE ? from->dtype : DT_BOOL;
    for (int64_t i = 0; i < c->numel; i++) {
        int64_t ix = broadcast_at(x, dims, rank, i);
        if (op == OP_WHERE) {
            const OConst *pick = x->ints[ix] ? from : im_folded(im, 2);
            int64_t at = broadcast_at(pick, dims, rank, i);
            c->f[i] = pick->f[at];
            if (c->is_int)
                c->ints[i] = pick->ints[at];
            continue;
        }
        bool r = op == OP_NOT ? !x->ints[ix] : compare_consts(op, x, ix, y, broadcast_at(y, dims, rank, i));
        c->ints[i] = r;
        c->f[i] = r;
    }
    return im_define_const(im, 0, c);
}

/* The node as kiln's op of the same inputs, folded when they are all constants. */
static int same_op(Importer *im, OpId op) {
    int n = im_n_inputs(im), in[3];
    if (n != (op == OP_NOT ? 1 : op == OP_WHERE ? 3 : 2))
        return im_error(im, "needs %d inputs", op == OP_NOT ? 1 : op == OP_WHERE ? 3 : 2);
    if (im_all_const(im))
        return fold(im, op);
    for (int k = 0; k < n; k++)
        if (im_input(im, k, &in[k]))
            return -1;
    Node *node = im_node(im, op, n, in);
    return node && im_finish(im, node, 0) >= 0 ? 0 : -1;
}

static int imp_equal(Importer *im) {
    return same_op(im, OP_EQUAL);
}
static int imp_less(Importer *im) {
    return same_op(im, OP_LESS);
}
static int imp_less_or_equal(Importer *im) {
    return same_op(im, OP_LESS_EQUAL);
}
static int imp_greater(Importer *im) {
    return same_op(im, OP_GREATER);
}
static int imp_greater_or_equal(Importer *im) {
    return same_op(im, OP_GREATER_EQUAL);
}
static int imp_not(Importer *im) {
    return same_op(im, OP_NOT);
}
static int imp_and(Importer *im) {
    return same_op(im, OP_AND);
}
static int imp_or(Importer *im) {
    return same_op(im, OP_OR);
}
static int imp_where(Importer *im) {
    return same_op(im, OP_WHERE);
}

/* Xor of bools: not(equal(a, b)), folded when both are constants. */
static int imp_xor(Importer *im) {
    Type t[2] = {{0}};
    if (im_n_inputs(im) != 2)
        return im_error(im, "needs 2 inputs");
    if (im_input_type(im, 0, &t[0]) || im_input_type(im, 1, &t[1]))
        return -1;
    if (t[0].dtype != DT_BOOL || t[1].dtype != DT_BOOL)
        return im_error(im, "Xor takes bool inputs");
    if (im_all_const(im)) {
        if (fold(im, OP_EQUAL))
            return -1;
        OConst *c = im_sym(im, im->node->output[0])->c;
        for (int64_t i = 0; i < c->numel; i++)
            c->f[i] = (float)(c->ints[i] = !c->ints[i]);
        return 0;
    }
    int in[2], eq;
    if (im_input(im, 0, &in[0]) || im_input(im, 1, &in[1]))
        return -1;
    Node *n = im_node(im, OP_EQUAL, 2, in);
    if (!n || (eq = im_finish(im, n, -1)) < 0)
        return -1;
    return im_unary(im, OP_NOT, eq, 0) < 0 ? -1 : 0;
}

/* ArgMax of x, or for ArgMin of -x: exact for every float, and a NaN, which stays
 * NaN, is the least, the first of them found, as NumPy's and PyTorch's argmin have
 * it (ONNX Runtime's passes over a NaN after the first element). kiln's argmax
 * takes f32. */
static int arg_extreme(Importer *im, bool min) {
    int64_t axis = 0, keepdims = 1, last = 0;
    Type t;
    int x;
    if (im_attr_int(im, "axis", &axis) < 0 || im_attr_int(im, "keepdims", &keepdims) < 0 ||
        im_attr_int(im, "select_last_index", &last) < 0 || im_input(im, 0, &x) || im_input_type(im, 0, &t))
        return -1;
    if (min && t.dtype != DT_F32)
        return im_error(im, "ArgMin takes f32 inputs: '%s' is %s", im->g->values[x].name,
                        dtype_name(t.dtype));
    if (min)
        x = im_unary(im, OP_NEG, x, -1);
    Node *n = x < 0 ? NULL : im_node(im, OP_ARGMAX, 1, &x);
    return n && !im_set_int(im, n, ATTR_AXIS, axis) && !im_set_int(im, n, ATTR_KEEPDIMS, keepdims != 0) &&
                   !im_set_int(im, n, ATTR_SELECT_LAST, last != 0) && im_finish(im, n, 0) >= 0
               ? 0
               : -1;
}

static int imp_argmax(Importer *im) {
    return arg_extreme(im, false);
}
static int imp_argmin(Importer *im) {
    return arg_extreme(im, true);
}

/* IsNaN: not(equal(x, x)). IsInf: equal(abs(x), inf), or equal(x, inf) or
 * equal(x, -inf) with only one sign detected (with neither, equal(x, NaN): false
 * everywhere). */
static int imp_isnan(Importer *im) {
    int x, eq;
    if (im_input(im, 0, &x) || (eq = im_binary(im, OP_EQUAL, x, x, -1)) < 0)
        return -1;
    return im_unary(im, OP_NOT, eq, 0) < 0 ? -1 : 0;
}

static int imp_isinf(Importer *im) {
    int64_t neg = 1, pos = 1;
    int x, c;
    if (im_attr_int(im, "detect_negative", &neg) < 0 || im_attr_int(im, "detect_positive", &pos) < 0 ||
        im_input(im, 0, &x))
        return -1;
    if (neg && pos)
        x = im_unary(im, OP_ABS, x, -1);
    c = im_scalar(im, neg && !pos ? -INFINITY : pos ? INFINITY : NAN);
    return x < 0 || c < 0 || im_binary(im, OP_EQUAL, x, c, 0) < 0 ? -1 : 0;
}

/* Trilu: where(mask, x, 0), the mask a constant [rows, cols] over the last two dims:
 * column - row >= k keeps the upper triangle from diagonal k, <= k the lower. */
static int imp_trilu(Importer *im) {
    int64_t upper = 1, k = 0;
    int n_k = 0, r, x;
    Type t;
    if (im_attr_int(im, "upper", &upper) < 0 || (r = im_input_ints(im, 1, "k", &k, &n_k)) < 0 ||
        im_input(im, 0, &x) || im_input_type(im, 0, &t))
        return -1;
    if (r && n_k != 1)
        return im_error(im, "k must be one integer");
    if (t.rank < 2)
        return im_error(im, "Trilu needs a tensor of rank 2 or more: '%s' is of rank %d",
                        im->g->values[x].name, t.rank);
    int64_t rows = t.dims[t.rank - 2], cols = t.dims[t.rank - 1];
    Tensor *mask = tensor_new(&(Type){.dtype = DT_BOOL, .rank = 2, .dims = {rows, cols}});
    for (int64_t i = 0; mask && i < rows; i++)
        for (int64_t j = 0; j < cols; j++)
            mask->b[i * cols + j] = upper ? j - i >= k : j - i <= k;
    return im_where(im, im_const_tensor(im, mask), x, im_scalar_of(im, t.dtype, 0), 0) < 0 ? -1 : 0;
}

/* Hardmax (opset 13: along one axis): cast(equal(argmax(x, axis, keepdims), iota)),
 * iota a constant 0 .. dim - 1 along the axis; the first of the largest, as ONNX has
 * it. Before opset 13 Hardmax flattens the dims from axis on, which is the same for
 * the last axis only. */
static int imp_hardmax(Importer *im) {
    int64_t axis = im->opset >= 13 ? -1 : 1;
    int x, ax, am, eq;
    Type t;
    if (im_attr_int(im, "axis", &axis) < 0 || im_input(im, 0, &x) || im_input_type(im, 0, &t) ||
        im_axis(im, axis, t.rank, &ax))
        return -1;
    if (im->opset < 13 && ax != t.rank - 1)
        return im_error(im, "Hardmax before opset 13 over more dims than the last is not supported");
    Node *n = im_node(im, OP_ARGMAX, 1, &x);
    if (!n || im_set_int(im, n, ATTR_AXIS, ax) || im_set_int(im, n, ATTR_KEEPDIMS, 1) ||
        (am = im_finish(im, n, -1)) < 0 ||
        (eq = im_binary(im, OP_EQUAL, am, im_iota(im, t.rank, ax, t.dims[ax]), -1)) < 0 ||
        !(n = im_node(im, OP_CAST, 1, &eq)))
        return -1;
    return !im_set_word(im, n, ATTR_TO, "f32") && im_finish(im, n, 0) >= 0 ? 0 : -1;
}

static int imp_cumsum(Importer *im) {
    int64_t exclusive = 0, reverse = 0, axis[ONNX_MAXL];
    int x, n_axis = 0;
    if (im_attr_int(im, "exclusive", &exclusive) < 0 || im_attr_int(im, "reverse", &reverse) < 0 ||
        im_input_ints(im, 1, "axis", axis, &n_axis) < 0 || im_input(im, 0, &x))
        return -1;
    if (n_axis != 1)
        return im_error(im, "axis must be one integer");
    Node *n = im_node(im, OP_CUMSUM, 1, &x);
    return n && !im_set_int(im, n, ATTR_AXIS, axis[0]) &&
                   !im_set_int(im, n, ATTR_EXCLUSIVE, exclusive != 0) &&
                   !im_set_int(im, n, ATTR_REVERSE, reverse != 0) && im_finish(im, n, 0) >= 0
               ? 0
               : -1;
}

/* Comparisons, logic, selection and scans, by ONNX op type. */
const OnnxOp onnx_ops_logic[] = {
    {"And", imp_and},
    {"ArgMax", imp_argmax},
    {"ArgMin", imp_argmin},
    {"CumSum", imp_cumsum},
    {"Equal", imp_equal},
    {"Greater", imp_greater},
    {"GreaterOrEqual", imp_greater_or_equal},
    {"Hardmax", imp_hardmax},
    {"IsInf", imp_isinf},
    {"IsNaN", imp_isnan},
    {"Less", imp_less},
    {"LessOrEqual", imp_less_or_equal},
    {"Not", imp_not},
    {"Or", imp_or},
    {"Trilu", imp_trilu},
    {"Where", imp_where},
    {"Xor", imp_xor},
    {NULL, NULL},
};
