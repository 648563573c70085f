/* The ops of every dtype: comparisons, logic, selection, conversion and gather.
 *
 * Comparisons take two inputs of one dtype and give bools (a NaN compares false,
 * and unequal); not, and, or take and give bools; where(cond, a, b) picks a's or
 * b's element by a bool; all broadcast as numpy does. Integers compare exactly,
 * as integers. cast converts as C does where C defines it, and saturates where it
 * does not: a float beyond an integer type's range becomes its extreme, NaN
 * becomes 0 (what CUDA's conversions do, and no undefined behaviour in C); i64 to
 * i32 keeps the low 32 bits (two's complement, as PyTorch does); anything to bool
 * is "not zero" (NaN is not zero). gather(x, indices, axis) is ONNX's Gather and
 * PyTorch's index_select generalized: result[o.., i.., p..] = x[o.., indices[i..],
 * p..], a negative index counting from the end; one out of range is an error of the
 * run that names the value. */
#include "ops_impl.h"

#include <math.h>
#include <string.h>

static const char *value_name_of(const Graph *g, const Node *n, int i) {
    return g->values[n->in[i]].name;
}

/* Inputs first..n_in-1 broadcast together into *out (of dtype dt). */
static int broadcast_inputs(Graph *g, Node *n, int first, DType dt, Diag *d) {
    Type out = *in_type(g, n, first);
    for (int k = first + 1; k < n->n_in; k++) {
        Type t = out;
        if (!broadcast_types(&t, in_type(g, n, k), &out))
            return diag_error(d, n->loc, "%s: shapes %s and %s cannot be broadcast together",
                              op_table[n->op].name, tstr(&t), tstr(in_type(g, n, k)));
    }
    out.dtype = dt;
    set_out_type(g, n, 0, out);
    return 0;
}

/* Inputs first..n_in-1 all of one dtype, which `want` (when not -1) must be. */
static int same_dtype(Graph *g, Node *n, int first, int want, Diag *d) {
    const Type *a = in_type(g, n, first);
    for (int k = first; k < n->n_in; k++) {
        const Type *t = in_type(g, n, k);
        if (want >= 0 && t->dtype != (DType)want)
            return diag_error(d, n->loc, "%s takes %s inputs: '%s' is %s", op_table[n->op].name,
                              dtype_name((DType)want), value_name_of(g, n, k), tstr(t));
        if (t->dtype != a->dtype)
            return diag_error(d, n->loc, "%s takes inputs of one dtype: '%s' is %s, '%s' is %s",
                              op_table[n->op].name, value_name_of(g, n, first), tstr(a),
                              value_name_of(g, n, k), tstr(t));
    }
    return 0;
}

int infer_compare(Graph *g, Node *n, Diag *d) {
    return same_dtype(g, n, 0, -1, d) ? -1 : broadcast_inputs(g, n, 0, DT_BOOL, d);
}

int infer_logic(Graph *g, Node *n, Diag *d) {
    return same_dtype(g, n, 0, DT_BOOL, d) ? -1 : broadcast_inputs(g, n, 0, DT_BOOL, d);
}

int infer_where(Graph *g, Node *n, Diag *d) {
    const Type *c = in_type(g, n, 0);
    if (c->dtype != DT_BOOL)
        return diag_error(d, n->loc, "where: the condition '%s' is %s; it must be bool",
                          value_name_of(g, n, 0), tstr(c));
    if (same_dtype(g, n, 1, -1, d))
        return -1;
    return broadcast_inputs(g, n, 0, in_type(g, n, 1)->dtype, d);
}

int infer_cast(Graph *g, Node *n, Diag *d) {
    (void)d;
    Type t = *in_type(g, n, 0);
    t.dtype = cast_dtype(n);
    set_out_type(g, n, 0, t);
    return 0;
}

DType cast_dtype(const Node *n) {
    const char *word = enum_choices[ENUM_DTYPE].words[node_enum(n, ATTR_TO)];
    return (DType)dtype_lookup(word, strlen(word));
}

/* The axis of a gather (or gather_elements) of x into *axis, and its indices (input
 * indices_at) integers; -1 after a diagnostic naming `op`. */
static int gather_axis(Graph *g, Node *n, const Type *x, int indices_at, const char *op, int *axis, Diag *d) {
    const Type *idx = in_type(g, n, indices_at);
    *axis = norm_axis(node_int(n, ATTR_AXIS), x->rank);
    if (*axis < 0)
        return diag_error(d, attr_loc(n, ATTR_AXIS), "%s: axis %lld is out of range for %s", op,
                          (long long)node_int(n, ATTR_AXIS), tstr(x));
    if (!dtype_is_int(idx->dtype))
        return diag_error(d, n->loc, "%s: the indices '%s' are %s; they must be i64 or i32", op,
                          value_name_of(g, n, indices_at), tstr(idx));
    return 0;
}

/* gather's result type for x and indices; -1 after a diagnostic naming `op`. */
static int gather_type(Graph *g, Node *n, const Type *x, int indices_at, const char *op, Type *out, Diag *d) {
    const Type *idx = in_type(g, n, indices_at);
    int axis;
    if (gather_axis(g, n, x, indices_at, op, &axis, d))
        return -1;
    if (x->rank - 1 + idx->rank > KILN_MAX_RANK)
        return diag_error(d, n->loc, "%s: the result of %s at indices %s has more than %d dims", op, tstr(x),
                          tstr(idx), KILN_MAX_RANK);
    *out = (Type){x->dtype, 0, {0}, NULL, 0};
    for (int k = 0; k < x->rank; k++)
        if (k != axis)
            out->dims[out->rank++] = x->dims[k];
        else
            for (int j = 0; j < idx->rank; j++)
                out->dims[out->rank++] = idx->dims[j];
    return 0;
}

int infer_gather(Graph *g, Node *n, Diag *d) {
    Type out = {0};
    if (gather_type(g, n, in_type(g, n, 0), 1, "gather", &out, d))
        return -1;
    set_out_type(g, n, 0, out);
    return 0;
}

int infer_gather_grad(Graph *g, Node *n, Diag *d) {
    const Type *dy = in_type(g, n, 0), *x = in_type(g, n, 1);
    Type y = {0};
    if (x->dtype != DT_F32 || dy->dtype != DT_F32)
        return diag_error(d, n->loc, "gather_grad: dy %s and x %s must be f32", tstr(dy), tstr(x));
    if (gather_type(g, n, x, 2, "gather_grad", &y, d))
        return -1;
    if (!type_equal(dy, &y))
        return diag_error(d, n->loc, "gather_grad: dy must be %s, the gather's result for x %s, got %s",
                          tstr(&y), tstr(x), tstr(dy));
    set_out_type(g, n, 0, *x);
    return 0;
}

/* gather_elements' check of x and indices (same rank, no dim but axis's larger than
 * x's); -1 after a diagnostic naming `op`. */
static int gather_elements_check(Graph *g, Node *n, const Type *x, int indices_at, const char *op, Diag *d) {
    const Type *idx = in_type(g, n, indices_at);
    int axis;
    if (gather_axis(g, n, x, indices_at, op, &axis, d))
        return -1;
    bool fits = idx->rank == x->rank;
    for (int k = 0; fits && k < x->rank; k++)
        fits = k == axis || idx->dims[k] <= x->dims[k];
    if (!fits)
        return diag_error(d, n->loc,
                          "%s: the indices '%s' %s must have the rank of x %s and no dim but axis %d larger",
                          op, value_name_of(g, n, indices_at), tstr(idx), tstr(x), axis);
    return 0;
}

int infer_gather_elements(Graph *g, Node *n, Diag *d) {
    const Type *x = in_type(g, n, 0), *idx = in_type(g, n, 1);
    if (gather_elements_check(g, n, x, 1, "gather_elements", d))
        return -1;
    Type out = *idx;
    out.dtype = x->dtype;
    set_out_type(g, n, 0, out);
    return 0;
}

int infer_gather_elements_grad(Graph *g, Node *n, Diag *d) {
    const Type *dy = in_type(g, n, 0), *x = in_type(g, n, 1), *idx = in_type(g, n, 2);
    if (x->dtype != DT_F32 || dy->dtype != DT_F32)
        return diag_error(d, n->loc, "gather_elements_grad: dy %s and x %s must be f32", tstr(dy), tstr(x));
    if (gather_elements_check(g, n, x, 2, "gather_elements_grad", d))
        return -1;
    Type y = *idx;
    y.dtype = DT_F32;
    if (!type_equal(dy, &y))
        return diag_error(d, n->loc, "gather_elements_grad: dy must be %s, the indices' shape, got %s",
                          tstr(&y), tstr(dy));
    set_out_type(g, n, 0, *x);
    return 0;
}

/* ---- Reference kernels ---- */

/* The offset in each of the first n_in inputs of every element of `to`, in order,
 * by numpy broadcasting: calls f(i, offsets, ctx) for element i. */
typedef void (*ElementFn)(int64_t i, const int64_t *at, void *ctx);

static void each_broadcast(const Tensor *const *in, int n_in, const Type *to, ElementFn f, void *ctx) {
    int64_t s[3][KILN_MAX_RANK], idx[KILN_MAX_RANK] = {0}, at[3];
    KILN_ASSERT(n_in <= 3);
    for (int k = 0; k < n_in; k++)
        broadcast_strides(&in[k]->type, to, s[k]);
    int64_t count = type_numel(to);
    for (int64_t i = 0; i < count; i++) {
        for (int k = 0; k < n_in; k++) {
            at[k] = 0;
            for (int j = 0; j < to->rank; j++)
                at[k] += idx[j] * s[k][j];
        }
        f(i, at, ctx);
        next_index(idx, to->dims, to->rank);
    }
}

typedef struct {
    OpId op;
    const Tensor *const *in;
    Tensor *out;
} Args;

/* Three-way comparison of a[i] and b[j] of one dtype: -1, 0, 1, or 2 unordered. */
static int compare(const Tensor *a, int64_t i, const Tensor *b, int64_t j) {
    if (a->type.dtype == DT_F32) {
        float x = a->data[i], y = b->data[j];
        return x < y ? -1 : x > y ? 1 : x == y ? 0 : 2;
    }
    int64_t x = tensor_int(a, i), y = tensor_int(b, j);
    return x < y ? -1 : x > y;
}

static void compare_element(int64_t i, const int64_t *at, void *ctx) {
    Args *a = ctx;
    int c = compare(a->in[0], at[0], a->in[1], at[1]);
    bool r = false;
    switch (a->op) {
    case OP_EQUAL: r = c == 0; break;
    case OP_LESS: r = c == -1; break;
    case OP_LESS_EQUAL: r = c == -1 || c == 0; break;
    case OP_GREATER: r = c == 1; break;
    case OP_GREATER_EQUAL: r = c == 1 || c == 0; break;
    case OP_AND: r = a->in[0]->b[at[0]] && a->in[1]->b[at[1]]; break;
    case OP_OR: r = a->in[0]->b[at[0]] || a->in[1]->b[at[1]]; break;
    default: KILN_ASSERT(!"not a comparison");
    }
    a->out->b[i] = r;
}

int eval_compare(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    (void)d;
    if (n->op == OP_NOT) {
        for (int64_t i = 0; i < type_numel(&out[0]->type); i++)
            out[0]->b[i] = !in[0]->b[i];
        return 0;
    }
    Args a = {n->op, in, out[0]};
    each_broadcast(in, 2, &out[0]->type, compare_element, &a);
    return 0;
}

static void where_element(int64_t i, const int64_t *at, void *ctx) {
    Args *a = ctx;
    int64_t size = dtype_size(a->out->type.dtype);
    const Tensor *from = a->in[0]->b[at[0]] ? a->in[1] : a->in[2];
    memcpy((char *)a->out->bytes + i * size, (const char *)from->bytes + at[from == a->in[1] ? 1 : 2] * size,
           (size_t)size);
}

int eval_where(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    (void)n, (void)d;
    Args a = {OP_WHERE, in, out[0]};
    each_broadcast(in, 3, &out[0]->type, where_element, &a);
    return 0;
}

/* f to an integer of `bits` bits, saturating, NaN to 0. */
static int64_t float_to_int(float f, int bits) {
    double limit = ldexp(1, bits - 1);
    if (isnan(f))
        return 0;
    if (f >= limit)
        return bits == 64 ? INT64_MAX : INT32_MAX;
    if (f < -limit)
        return bits == 64 ? INT64_MIN : INT32_MIN;
    return (int64_t)f;
}

int eval_cast(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    (void)n, (void)d;
    const Tensor *x = in[0];
    Tensor *y = out[0];
    bool from_float = x->type.dtype == DT_F32;
    for (int64_t i = 0; i < type_numel(&y->type); i++) {
        float f = from_float ? x->data[i] : 0;
        int64_t v = from_float ? 0 : tensor_int(x, i);
        switch (y->type.dtype) {
        case DT_F32: y->data[i] = from_float ? f : (float)v; break;
        case DT_I64: y->i64[i] = from_float ? float_to_int(f, 64) : v; break;
        case DT_I32: y->i32[i] = from_float ? (int32_t)float_to_int(f, 32) : (int32_t)(uint32_t)v; break;
        case DT_BOOL: y->b[i] = from_float ? f != 0 : v != 0; break;
        default: KILN_ASSERT(!"a cast to an unknown dtype");
        }
    }
    return 0;
}

/* The position along the axis that element k of the indices names (a negative one
 * counts from the end); -1 after an error naming node n's op when it is out of range. */
static int64_t gathered(const Node *n, const Tensor *idx, int64_t k, int64_t dim, Diag *d) {
    int64_t at = tensor_int(idx, k), i = at < 0 ? at + dim : at;
    if (i >= 0 && i < dim)
        return i;
    diag_error(d, n->loc,
               "%s: index %lld (element %lld of the indices) is out of range for a dim of size %lld",
               op_table[n->op].name, (long long)at, (long long)k, (long long)dim);
    return -1;
}

int eval_gather(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    const Tensor *x = in[0], *idx = in[1];
    int axis = norm_axis(node_int(n, ATTR_AXIS), x->type.rank);
    int64_t outer, inner, dim = x->type.dims[axis], count = type_numel(&idx->type);
    split_at_axis(&x->type, axis, &outer, &inner);
    int64_t size = dtype_size(x->type.dtype) * inner;
    char *y = out[0]->bytes;
    const char *from = x->bytes;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t k = 0; k < count; k++) {
            int64_t i = gathered(n, idx, k, dim, d);
            if (i < 0)
                return -1;
            memcpy(y + (o * count + k) * size, from + (o * dim + i) * size, (size_t)size);
        }
    return 0;
}

/* Each slice of dy added into the slice of x it was gathered from, in the order of
 * the indices (so a repeated index sums its slices). */
int eval_gather_grad(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    const Tensor *dy = in[0], *idx = in[2];
    const Type *x = &in[1]->type;
    int axis = norm_axis(node_int(n, ATTR_AXIS), x->rank);
    int64_t outer, inner, dim = x->dims[axis], count = type_numel(&idx->type);
    split_at_axis(x, axis, &outer, &inner);
    float *dx = out[0]->data;
    memset(dx, 0, sizeof *dx * (size_t)type_numel(x));
    for (int64_t o = 0; o < outer; o++)
        for (int64_t k = 0; k < count; k++) {
            int64_t i = gathered(n, idx, k, dim, d);
            if (i < 0)
                return -1;
            for (int64_t q = 0; q < inner; q++)
                dx[(o * dim + i) * inner + q] += dy->data[(o * count + k) * inner + q];
        }
    return 0;
}

/* Element k of gather_elements' indices (of type it): the offset in x (of type xt) of
 * the element it reads, at k's coordinates but along axis at the index; -1 after an
 * error when the index is out of range. */
static int64_t element_gathered(const Node *n, const Tensor *idx, const Type *xt, int axis, int64_t k,
                                Diag *d) {
    const Type *it = &idx->type;
    int64_t at = 0, stride = 1, rest = k;
    for (int dim = it->rank - 1; dim >= 0; dim--) {
        int64_t c = rest % it->dims[dim];
        rest /= it->dims[dim];
        if (dim == axis && (c = gathered(n, idx, k, xt->dims[dim], d)) < 0)
            return -1;
        at += c * stride;
        stride *= xt->dims[dim];
    }
    return at;
}

int eval_gather_elements(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    const Tensor *x = in[0], *idx = in[1];
    int axis = norm_axis(node_int(n, ATTR_AXIS), x->type.rank);
    int64_t size = dtype_size(x->type.dtype);
    char *y = out[0]->bytes;
    const char *from = x->bytes;
    for (int64_t k = 0; k < type_numel(&idx->type); k++) {
        int64_t at = element_gathered(n, idx, &x->type, axis, k, d);
        if (at < 0)
            return -1;
        memcpy(y + k * size, from + at * size, (size_t)size);
    }
    return 0;
}

/* Each element of dy added into the element of x it was gathered from, in the order
 * of the indices (so a repeated index sums its elements). */
int eval_gather_elements_grad(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    const Tensor *dy = in[0], *idx = in[2];
    const Type *x = &in[1]->type;
    int axis = norm_axis(node_int(n, ATTR_AXIS), x->rank);
    float *dx = out[0]->data;
    memset(dx, 0, sizeof *dx * (size_t)type_numel(x));
    for (int64_t k = 0; k < type_numel(&idx->type); k++) {
        int64_t at = element_gathered(n, idx, x, axis, k, d);
        if (at < 0)
            return -1;
        dx[at] += dy->data[k];
    }
    return 0;
}
