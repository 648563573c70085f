/* Reductions and normalizations: sum, mean, reduce_max, softmax, log_softmax,
 * batch_norm and layer_norm; and the scans along one axis, argmax and cumsum.
 *
 * Every kernel accumulates in double and rounds once per result, so the reference is
 * at least as exact as any target. A reduction sees its input through the "kept"
 * shape, x with every reduced dim set to 1 (whether or not keepdims keeps them): an
 * input element lands on the result whose index is its own with the reduced
 * coordinates zeroed, and dropping dims of size 1 does not move data. softmax walks
 * x as [outer, length, inner] and layer_norm as [rows, normalized size]; both make
 * separate passes for the statistics and the results, subtracting the max (softmax)
 * or the mean (layer_norm) first so that large inputs neither overflow nor cancel. */
#include "ops_impl.h"

#include <math.h>

/* ---- sum, mean, reduce_max ---- */

int reduce_axes(const Node *n, const Type *x, bool *reduced, Diag *d) {
    const Attr *a = node_attr(n, ATTR_AXES);
    const char *op = op_table[n->op].name;
    bool all = !a->set || a->n == 0;
    for (int k = 0; k < x->rank; k++)
        reduced[k] = all;
    for (int i = 0; !all && i < a->n; i++) {
        int axis = norm_axis(a->ints[i], x->rank);
        if (axis < 0)
            return diag_error(d, a->loc, "%s: axis %lld is out of range for x of type %s", op,
                              (long long)a->ints[i], tstr(x));
        if (reduced[axis])
            return diag_error(d, a->loc, "%s: axes name dimension %d of x (%s) twice", op, axis, tstr(x));
        reduced[axis] = true;
    }
    return 0;
}

int infer_reduce(Graph *g, Node *n, Diag *d) {
    const Type *x = in_type(g, n, 0);
    bool reduced[KILN_MAX_RANK];
    if (reduce_axes(n, x, reduced, d))
        return -1;
    bool keep = node_bool(n, ATTR_KEEPDIMS);
    Type out = {DT_F32, 0, {0}, NULL, 0};
    for (int k = 0; k < x->rank; k++)
        if (!reduced[k] || keep)
            out.dims[out.rank++] = reduced[k] ? 1 : x->dims[k];
    set_out_type(g, n, 0, out);
    return 0;
}

int eval_reduce(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    const Type *x = &in[0]->type;
    bool reduced[KILN_MAX_RANK];
    if (reduce_axes(n, x, reduced, d))
        return -1;
    Type kept = *x;
    int64_t group = 1; /* input elements per result */
    for (int k = 0; k < x->rank; k++)
        if (reduced[k]) {
            group *= x->dims[k];
            kept.dims[k] = 1;
        }
    int64_t ks[KILN_MAX_RANK], idx[KILN_MAX_RANK] = {0};
    int64_t results = type_strides(&kept, ks);
    for (int k = 0; k < x->rank; k++)
        if (reduced[k])
            ks[k] = 0;
    double *acc = ir_malloc(sizeof *acc * (size_t)(results > 0 ? results : 1));
    if (!acc)
        return diag_error(d, n->loc, "out of memory");
    bool is_max = n->op == OP_REDUCE_MAX;
    for (int64_t o = 0; o < results; o++)
        acc[o] = is_max ? -INFINITY : 0;
    int64_t count = type_numel(x);
    for (int64_t i = 0; i < count; i++) {
        int64_t o = 0;
        for (int k = 0; k < x->rank; k++)
            o += idx[k] * ks[k];
        double v = in[0]->data[i];
        if (!is_max)
            acc[o] += v;
        else if (isnan(v) || v > acc[o]) /* NaN wins, as in numpy and torch */
            acc[o] = v;
        next_index(idx, x->dims, x->rank);
    }
    /* an empty mean is 0 / 0 = NaN, as in numpy and torch */
    for (int64_t o = 0; o < results; o++)
        out[0]->data[o] = (float)(n->op == OP_MEAN ? acc[o] / (double)group : acc[o]);
    ir_free(acc);
    return 0;
}

/* ---- softmax, log_softmax ---- */

int infer_softmax(Graph *g, Node *n, Diag *d) {
    const Type *x = in_type(g, n, 0);
    int64_t axis = node_int(n, ATTR_AXIS);
    if (norm_axis(axis, x->rank) < 0)
        return diag_error(d, attr_loc(n, ATTR_AXIS), "%s: axis %lld is out of range for x of type %s",
                          op_table[n->op].name, (long long)axis, tstr(x));
    set_out_type(g, n, 0, *x);
    return 0;
}

int eval_softmax(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    (void)d;
    const Type *x = &in[0]->type;
    int axis = norm_axis(node_int(n, ATTR_AXIS), x->rank);
    int64_t outer, len = x->dims[axis], inner;
    split_at_axis(x, axis, &outer, &inner);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            const float *xs = in[0]->data + o * len * inner + i;
            float *ys = out[0]->data + o * len * inner + i;
            /* NaN is skipped here, but reaches every result through the sum */
            double max = -INFINITY, sum = 0;
            for (int64_t k = 0; k < len; k++)
                if (xs[k * inner] > max)
                    max = xs[k * inner];
            for (int64_t k = 0; k < len; k++)
                sum += exp(xs[k * inner] - max);
            for (int64_t k = 0; k < len; k++) {
                double shifted = xs[k * inner] - max;
                ys[k * inner] = (float)(n->op == OP_SOFTMAX ? exp(shifted) / sum : shifted - log(sum));
            }
        }
    return 0;
}

/* ---- batch_norm ---- */

int infer_batch_norm(Graph *g, Node *n, Diag *d) {
    static const char *const names[] = {"x", "scale", "bias", "mean", "var"};
    const Type *x = in_type(g, n, 0);
    if (x->rank < 2)
        return diag_error(d, n->loc, "batch_norm: x must have a batch and a channel dimension, got %s",
                          tstr(x));
    int c = layout_is_nhwc(n) ? x->rank - 1 : 1;
    for (int i = 1; i < 5; i++) {
        const Type *t = in_type(g, n, i);
        if (t->rank != 1 || t->dims[0] != x->dims[c])
            return diag_error(d, n->loc,
                              "batch_norm: %s must be f32[%lld], one value per channel of x %s "
                              "(layout %s), got %s",
                              names[i], (long long)x->dims[c], tstr(x), node_enum_word(n, ATTR_LAYOUT),
                              tstr(t));
    }
    set_out_type(g, n, 0, *x);
    return 0;
}

int eval_batch_norm(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    (void)d;
    const Type *x = &in[0]->type;
    int c = layout_is_nhwc(n) ? x->rank - 1 : 1;
    int64_t channels = x->dims[c], inner = 1; /* elements between one channel and the next */
    for (int k = c + 1; k < x->rank; k++)
        inner *= x->dims[k];
    const float *scale = in[1]->data, *bias = in[2]->data, *mean = in[3]->data, *var = in[4]->data;
    double eps = node_float(n, ATTR_EPSILON);
    int64_t count = type_numel(x);
    for (int64_t i = 0; i < count; i++) {
        int64_t ch = i / inner % channels;
        double y = (in[0]->data[i] - (double)mean[ch]) / sqrt(var[ch] + eps);
        out[0]->data[i] = (float)(y * scale[ch] + bias[ch]);
    }
    return 0;
}

/* ---- layer_norm ---- */

int infer_layer_norm(Graph *g, Node *n, Diag *d) {
    static const char *const names[] = {"x", "scale", "bias"};
    const Type *x = in_type(g, n, 0);
    int64_t given = node_int(n, ATTR_AXIS);
    int axis = norm_axis(given, x->rank);
    if (axis < 0)
        return diag_error(d, attr_loc(n, ATTR_AXIS), "layer_norm: axis %lld is out of range for x of type %s",
                          (long long)given, tstr(x));
    Type norm = type_make(x->rank - axis, x->dims + axis);
    for (int i = 1; i < 3; i++) {
        const Type *t = in_type(g, n, i);
        if (t && !broadcasts_to(t, &norm))
            return diag_error(d, n->loc,
                              "layer_norm: %s %s does not broadcast to the normalized shape %s "
                              "(x %s from axis %d)",
                              names[i], tstr(t), tstr(&norm), tstr(x), axis);
    }
    set_out_type(g, n, 0, *x);
    return 0;
}

static int64_t offset(const int64_t *idx, const int64_t *strides, int rank) {
    int64_t o = 0;
    for (int k = 0; k < rank; k++)
        o += idx[k] * strides[k];
    return o;
}

int eval_layer_norm(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    (void)d;
    const Type *x = &in[0]->type;
    int axis = norm_axis(node_int(n, ATTR_AXIS), x->rank);
    Type norm = type_make(x->rank - axis, x->dims + axis);
    int64_t size = type_numel(&norm), rows = 1;
    for (int k = 0; k < axis; k++)
        rows *= x->dims[k];
    /* a trailing absent input is dropped from the node, so in[] may be shorter */
    const Tensor *scale = n->n_in > 1 ? in[1] : NULL, *bias = n->n_in > 2 ? in[2] : NULL;
    int64_t ss[KILN_MAX_RANK], bs[KILN_MAX_RANK];
    if (scale)
        broadcast_strides(&scale->type, &norm, ss);
    if (bias)
        broadcast_strides(&bias->type, &norm, bs);
    double eps = node_float(n, ATTR_EPSILON);
    for (int64_t r = 0; r < rows; r++) {
        const float *xs = in[0]->data + r * size;
        float *ys = out[0]->data + r * size;
        double mean = 0, var = 0;
        for (int64_t j = 0; j < size; j++)
            mean += xs[j];
        mean /= (double)size;
        for (int64_t j = 0; j < size; j++)
            var += (xs[j] - mean) * (xs[j] - mean);
        double std = sqrt(var / (double)size + eps);
        int64_t idx[KILN_MAX_RANK] = {0};
        for (int64_t j = 0; j < size; j++) {
            double y = (xs[j] - mean) / std;
            if (scale)
                y *= scale->data[offset(idx, ss, norm.rank)];
            if (bias)
                y += bias->data[offset(idx, bs, norm.rank)];
            ys[j] = (float)y;
            next_index(idx, norm.dims, norm.rank);
        }
    }
    return 0;
}

/* ---- argmax, cumsum: along one axis ---- */

/* x's dims as [outer, dim, inner] around `axis`, checked for x's rank. */
static int scan_axis(const Node *n, const Type *x, int *axis, Diag *d) {
    *axis = norm_axis(node_int(n, ATTR_AXIS), x->rank > 0 ? x->rank : 1);
    if (*axis < 0 || (x->rank == 0 && *axis != 0))
        return diag_error(d, attr_loc(n, ATTR_AXIS), "%s: axis %lld is out of range for x of type %s",
                          op_table[n->op].name, (long long)node_int(n, ATTR_AXIS), tstr(x));
    return 0;
}

int infer_argmax(Graph *g, Node *n, Diag *d) {
    const Type *x = in_type(g, n, 0);
    int axis;
    if (scan_axis(n, x, &axis, d))
        return -1;
    Type out = {DT_I64, 0, {0}, NULL, 0};
    for (int k = 0; k < x->rank; k++)
        if (k != axis || node_bool(n, ATTR_KEEPDIMS))
            out.dims[out.rank++] = k == axis ? 1 : x->dims[k];
    set_out_type(g, n, 0, out);
    return 0;
}

int infer_cumsum(Graph *g, Node *n, Diag *d) {
    const Type *x = in_type(g, n, 0);
    int axis;
    if (x->dtype != DT_F32 && !dtype_is_int(x->dtype))
        return diag_error(d, n->loc, "cumsum takes f32, i64 or i32: '%s' is %s", g->values[n->in[0]].name,
                          tstr(x));
    if (scan_axis(n, x, &axis, d))
        return -1;
    set_out_type(g, n, 0, *x);
    return 0;
}

int eval_argmax(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    (void)d;
    const Type *x = &in[0]->type;
    int axis = norm_axis(node_int(n, ATTR_AXIS), x->rank > 0 ? x->rank : 1);
    int64_t outer = 1, inner = 1, dim = x->rank ? x->dims[axis] : 1;
    if (x->rank)
        split_at_axis(x, axis, &outer, &inner);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            /* the first largest along the axis read forwards, or backwards for the last */
            const float *v = in[0]->data + o * dim * inner + i;
            bool last = node_bool(n, ATTR_SELECT_LAST);
            int64_t best = last ? dim - 1 : 0, step = last ? -1 : 1;
            for (int64_t k = best + step; k >= 0 && k < dim && !isnan(v[best * inner]); k += step)
                if (isnan(v[k * inner]) || v[k * inner] > v[best * inner])
                    best = k;
            out[0]->i64[o * inner + i] = best;
        }
    return 0;
}

int eval_cumsum(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    (void)d;
    const Tensor *x = in[0];
    int axis = norm_axis(node_int(n, ATTR_AXIS), x->type.rank > 0 ? x->type.rank : 1);
    bool exclusive = node_bool(n, ATTR_EXCLUSIVE), reverse = node_bool(n, ATTR_REVERSE);
    int64_t outer = 1, inner = 1, dim = x->type.rank ? x->type.dims[axis] : 1;
    if (x->type.rank)
        split_at_axis(&x->type, axis, &outer, &inner);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            double sum = 0;
            uint64_t isum = 0; /* integers wrap around, two's complement */
            for (int64_t step = 0; step < dim; step++) {
                int64_t at = (o * dim + (reverse ? dim - 1 - step : step)) * inner + i;
                double v = x->type.dtype == DT_F32 ? x->data[at] : 0;
                uint64_t iv = x->type.dtype == DT_F32 ? 0 : (uint64_t)tensor_int(x, at);
                if (!exclusive)
                    sum += v, isum += iv;
                if (x->type.dtype == DT_F32)
                    out[0]->data[at] = (float)sum;
                else if (x->type.dtype == DT_I64)
                    out[0]->i64[at] = (int64_t)isum;
                else
                    out[0]->i32[at] = (int32_t)(uint32_t)isum;
                if (exclusive)
                    sum += v, isum += iv;
            }
        }
    return 0;
}
