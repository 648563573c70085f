/* The ONNX op mapping (see onnx_ops.c): convolution and pooling (with auto_pad made
 * explicit pads), the normalizations, and the reductions, some written with kiln ops
 * (ReduceMin, ReduceL2, InstanceNormalization, LayerNormalization's extra outputs). */
#include "onnx_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- Convolution and pooling ---- */

typedef struct {
    int nsp; /* spatial dims */
    int64_t kernel[3], strides[3], dilations[3], pads[6];
} Window;

/* Each entry of a window attribute within +-KILN_MAX_NUMEL (kiln's inference checks
 * the rest), so that the auto_pad sums below stay in int64. */
static int check_window_ints(Importer *im, const char *name, const int64_t *v, int n) {
    for (int k = 0; k < n; k++)
        if (v[k] > KILN_MAX_NUMEL || v[k] < -KILN_MAX_NUMEL)
            return im_error(im, "%s[%d] = %lld is too large", name, k, (long long)v[k]);
    return 0;
}

/* The dilated kernel's extent (kernel - 1) * dilation + 1 along spatial dim k. */
static int window_extent(Importer *im, const Window *w, int k, int64_t *e) {
    if (!ck_mul(w->kernel[k] - 1, w->dilations[k], e) || !ck_add(*e, 1, e))
        return im_error(im, "dilations[%d] = %lld makes the kernel extent overflow", k,
                        (long long)w->dilations[k]);
    return 0;
}

/* kernel_shape (or the weights' spatial dims), strides, dilations, pads and
 * auto_pad, with SAME_UPPER / SAME_LOWER / VALID turned into explicit pads. */
static int read_window(Importer *im, const Type *x, const int64_t *kernel_from_w, bool has_dilations,
                       Window *w) {
    w->nsp = x->rank - 2;
    if (w->nsp < 1 || w->nsp > 3)
        return im_error(im, "the input has rank %d; kiln takes 1 to 3 spatial dims", x->rank);
    int n;
    int64_t buf[ONNX_MAXL];
    for (int k = 0; k < w->nsp; k++) {
        w->kernel[k] = kernel_from_w ? kernel_from_w[k] : 0;
        w->strides[k] = w->dilations[k] = 1;
        w->pads[k] = w->pads[k + w->nsp] = 0;
    }
    int r = im_attr_ints(im, "kernel_shape", buf, ONNX_MAXL, &n);
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
    if ((r = im_attr_ints(im, "strides", buf, ONNX_MAXL, &n)) < 0)
        return -1;
    if (r == 1 && n != w->nsp)
        return im_error(im, "strides has %d entries, the input %d spatial dims", n, w->nsp);
    if (r == 1)
        memcpy(w->strides, buf, sizeof(int64_t) * (size_t)n);
    if (has_dilations) {
        if ((r = im_attr_ints(im, "dilations", buf, ONNX_MAXL, &n)) < 0)
            return -1;
        if (r == 1 && n != w->nsp)
            return im_error(im, "dilations has %d entries, the input %d spatial dims", n, w->nsp);
        if (r == 1)
            memcpy(w->dilations, buf, sizeof(int64_t) * (size_t)n);
    }
    if ((r = im_attr_ints(im, "pads", buf, ONNX_MAXL, &n)) < 0)
        return -1;
    if (r == 1 && n != 2 * w->nsp)
        return im_error(im, "pads has %d entries, expected %d", n, 2 * w->nsp);
    if (r == 1)
        memcpy(w->pads, buf, sizeof(int64_t) * (size_t)n);
    if (check_window_ints(im, "kernel_shape", w->kernel, w->nsp) ||
        check_window_ints(im, "strides", w->strides, w->nsp) ||
        check_window_ints(im, "dilations", w->dilations, w->nsp) ||
        check_window_ints(im, "pads", w->pads, 2 * w->nsp))
        return -1;
    const char *auto_pad = "NOTSET";
    if (im_attr_string(im, "auto_pad", &auto_pad) < 0)
        return -1;
    bool upper = strcmp(auto_pad, "SAME_UPPER") == 0, lower = strcmp(auto_pad, "SAME_LOWER") == 0;
    if (strcmp(auto_pad, "VALID") == 0) {
        for (int k = 0; k < 2 * w->nsp; k++)
            w->pads[k] = 0;
    } else if (upper || lower) {
        for (int k = 0; k < w->nsp; k++) {
            int64_t in = x->dims[k + 2], s = w->strides[k] > 0 ? w->strides[k] : 1, e;
            if (window_extent(im, w, k, &e))
                return -1;
            int64_t out = (in + s - 1) / s, total = (out - 1) * s + e - in; /* all within 2^62 */
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
    return (kernel && im_set_ints(im, n, ATTR_KERNEL, w->kernel, w->nsp)) ||
           im_set_ints(im, n, ATTR_STRIDES, w->strides, w->nsp) ||
           im_set_ints(im, n, ATTR_PADS, w->pads, 2 * w->nsp) ||
           (dilations && im_set_ints(im, n, ATTR_DILATIONS, w->dilations, w->nsp));
}

static int imp_conv(Importer *im, bool transpose) {
    int in[3], n_in = 2;
    Type x = {0}, wt = {0};
    if (im_input(im, 0, &in[0]) || im_input(im, 1, &in[1]) || im_input_type(im, 0, &x) ||
        im_input_type(im, 1, &wt))
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
        int64_t outpad[3] = {0, 0, 0}, shape[ONNX_MAXL];
        int no = 0, ns = 0, r;
        if (im_attr_ints(im, "output_padding", outpad, 3, &no) < 0 ||
            (r = im_attr_ints(im, "output_shape", shape, ONNX_MAXL, &ns)) < 0)
            return -1;
        if (no && no != w.nsp)
            return im_error(im, "output_padding has %d entries, the input %d spatial dims", no, w.nsp);
        if (check_window_ints(im, "output_padding", outpad, no) ||
            (r == 1 && check_window_ints(im, "output_shape", shape, ns)))
            return -1;
        const char *auto_pad = "NOTSET";
        im_attr_string(im, "auto_pad", &auto_pad);
        bool same = strncmp(auto_pad, "SAME", 4) == 0;
        if (r == 1 || same) {
            if (r == 1 && ns != w.nsp && ns != x.rank)
                return im_error(im, "output_shape has %d entries, the input %d spatial dims", ns, w.nsp);
            for (int k = 0; k < w.nsp; k++) {
                int64_t in_k = x.dims[k + 2];
                int64_t want = r == 1 ? shape[ns == x.rank ? k + 2 : k] : 0, e, total;
                if (window_extent(im, &w, k, &e))
                    return -1;
                if (r != 1 && !ck_mul(in_k, w.strides[k], &want))
                    return im_error(im, "strides[%d] = %lld makes the output overflow", k,
                                    (long long)w.strides[k]);
                /* stride * (in - 1) + output_padding + extent - want */
                if (!ck_mul(w.strides[k], in_k - 1, &total) || !ck_add(total, outpad[k], &total) ||
                    !ck_add(total, e, &total) || !ck_sub(total, want, &total))
                    return im_error(im, "strides[%d] = %lld makes the output overflow", k,
                                    (long long)w.strides[k]);
                if (total < 0) { /* a longer output than the kernel reaches: zeros after */
                    outpad[k] -= total;
                    total = 0;
                }
                bool upper = strcmp(auto_pad, "SAME_UPPER") == 0;
                w.pads[k] = upper ? total / 2 : total - total / 2;
                w.pads[k + w.nsp] = total - w.pads[k];
            }
        }
        if (im_set_ints(im, n, ATTR_OUTPUT_PADDING, outpad, w.nsp))
            return -1;
    }
    if (set_window(im, n, &w, false, true) || im_set_int(im, n, ATTR_GROUPS, group))
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
    Type x = {0};
    if (im_input(im, 0, &xv) || im_input_type(im, 0, &x))
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
    if (!max && im->opset >= 19) { /* AveragePool-19's dilations; kiln's avg_pool has none */
        int64_t dilations[ONNX_MAXL];
        int n_dilations = 0;
        if (im_attr_ints(im, "dilations", dilations, ONNX_MAXL, &n_dilations) < 0)
            return -1;
        for (int k = 0; k < n_dilations; k++)
            if (dilations[k] != 1)
                return im_error(im, "dilations[%d] = %lld: a dilated average pool is not supported", k,
                                (long long)dilations[k]);
    }
    Node *n = im_node(im, max ? OP_MAX_POOL : OP_AVG_POOL, 1, &xv);
    if (!n || set_window(im, n, &w, true, max) || im_set_int(im, n, ATTR_CEIL_MODE, ceil_mode != 0))
        return -1;
    if (!max && im_set_int(im, n, ATTR_COUNT_INCLUDE_PAD, count_pad != 0))
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
    int x;
    if (im_input(im, 0, &x))
        return -1;
    return im_unary(im, OP_GLOBAL_AVG_POOL, x, 0) < 0 ? -1 : 0;
}

/* GlobalMaxPool: reduce_max over the spatial dims, kept. */
static int imp_global_max_pool(Importer *im) {
    int x;
    Type t = {0};
    if (im_input(im, 0, &x) || im_input_type(im, 0, &t))
        return -1;
    int64_t axes[KILN_MAX_RANK];
    for (int k = 2; k < t.rank; k++)
        axes[k - 2] = k;
    Node *n = im_node(im, OP_REDUCE_MAX, 1, &x);
    return !n || im_set_ints(im, n, ATTR_AXES, axes, t.rank - 2) || im_set_int(im, n, ATTR_KEEPDIMS, 1) ||
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
    return !n || im_set_float(im, n, ATTR_EPSILON, eps) || im_finish(im, n, 0) < 0 ? -1 : 0;
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
    if (!n || im_set_int(im, n, ATTR_AXIS, axis) || im_set_float(im, n, ATTR_EPSILON, eps) ||
        im_finish(im, n, 0) < 0)
        return -1;
    bool want_mean = im_n_outputs(im) > 1 && *im->node->output[1];
    bool want_inv = im_n_outputs(im) > 2 && *im->node->output[2];
    if (!want_mean && !want_inv)
        return 0;
    /* The optional outputs: the mean and 1 / sqrt(var + epsilon) over the normalized
     * dims, kept with size 1. */
    Type t = {0};
    int a;
    if (im_input_type(im, 0, &t) || im_axis(im, axis, t.rank, &a))
        return -1;
    int64_t axes[KILN_MAX_RANK];
    for (int k = a; k < t.rank; k++)
        axes[k - a] = k;
    int mean, diff, var;
    if (!(n = im_node(im, OP_MEAN, 1, in)) || im_set_ints(im, n, ATTR_AXES, axes, t.rank - a) ||
        im_set_int(im, n, ATTR_KEEPDIMS, 1) || (mean = im_finish(im, n, want_mean ? 1 : -1)) < 0)
        return -1;
    if (!want_inv)
        return 0;
    if ((diff = im_binary(im, OP_SUB, in[0], mean, -1)) < 0 ||
        (var = im_binary(im, OP_MUL, diff, diff, -1)) < 0 || !(n = im_node(im, OP_MEAN, 1, &var)) ||
        im_set_ints(im, n, ATTR_AXES, axes, t.rank - a) || im_set_int(im, n, ATTR_KEEPDIMS, 1) ||
        (var = im_finish(im, n, -1)) < 0 || (var = im_binary(im, OP_ADD, var, im_scalar(im, eps), -1)) < 0 ||
        (var = im_unary(im, OP_SQRT, var, -1)) < 0)
        return -1;
    return im_binary(im, OP_DIV, im_scalar(im, 1), var, 2) < 0 ? -1 : 0;
}

/* InstanceNormalization: per sample and channel over the spatial dims,
 * (x - mean) / sqrt(var + epsilon) * scale + bias, scale and bias [C]. */
static int imp_instance_norm(Importer *im) {
    double eps = 1e-5;
    int x, scale, bias;
    Type t = {0};
    if (im_attr_float(im, "epsilon", &eps) < 0 || im_input(im, 0, &x) || im_input_type(im, 0, &t) ||
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
    if (!n || im_set_ints(im, n, ATTR_AXES, axes, t.rank - 2) || im_set_int(im, n, ATTR_KEEPDIMS, 1) ||
        (mean = im_finish(im, n, -1)) < 0 || (diff = im_binary(im, OP_SUB, x, mean, -1)) < 0 ||
        (var = im_binary(im, OP_MUL, diff, diff, -1)) < 0 || !(n = im_node(im, OP_MEAN, 1, &var)) ||
        im_set_ints(im, n, ATTR_AXES, axes, t.rank - 2) || im_set_int(im, n, ATTR_KEEPDIMS, 1) ||
        (var = im_finish(im, n, -1)) < 0 || (sd = im_binary(im, OP_ADD, var, im_scalar(im, eps), -1)) < 0 ||
        (sd = im_unary(im, OP_SQRT, sd, -1)) < 0 || (diff = im_binary(im, OP_DIV, diff, sd, -1)) < 0 ||
        (scale = im_reshape(im, scale, cshape, t.rank - 1, -1)) < 0 ||
        (bias = im_reshape(im, bias, cshape, t.rank - 1, -1)) < 0 ||
        (diff = im_binary(im, OP_MUL, diff, scale, -1)) < 0)
        return -1;
    return im_binary(im, OP_ADD, diff, bias, 0) < 0 ? -1 : 0;
}

/* Softmax, LogSoftmax: from opset 13 along one axis (default -1); before, over the
 * input flattened to 2-D at axis (default 1), which is a reshape around it. */
static int imp_softmax_op(Importer *im, OpId op) {
    int x;
    Type t = {0};
    int64_t axis = im->opset >= 13 ? -1 : 1;
    if (im_attr_int(im, "axis", &axis) < 0 || im_input(im, 0, &x) || im_input_type(im, 0, &t))
        return -1;
    int a;
    if (t.rank == 0)
        return im_error(im, "the input is a scalar");
    if (im_axis(im, axis, t.rank, &a))
        return -1;
    bool flatten = im->opset < 13 && a != t.rank - 1;
    if (flatten) {
        int64_t dims[2] = {1, 1};
        for (int k = 0; k < t.rank; k++)
            dims[k >= a] *= t.dims[k];
        if ((x = im_reshape(im, x, dims, 2, -1)) < 0)
            return -1;
    }
    Node *n = im_node(im, op, 1, &x);
    if (!n || im_set_int(im, n, ATTR_AXIS, flatten ? -1 : a))
        return -1;
    int y = im_finish(im, n, flatten ? -1 : 0);
    if (y < 0)
        return -1;
    return flatten ? (im_reshape(im, y, t.dims, t.rank, 0) < 0 ? -1 : 0) : 0;
}

static int imp_softmax(Importer *im) {
    return imp_softmax_op(im, OP_SOFTMAX);
}
static int imp_log_softmax(Importer *im) {
    return imp_softmax_op(im, OP_LOG_SOFTMAX);
}

/* ---- Losses ---- */

/* op(x) over axes (NULL: the op's default, all of them for a reduction), as an
 * intermediate value, or as output out_k when out_k >= 0. */
static int with_axes(Importer *im, OpId op, int x, const int64_t *axes, int n_axes, int out_k) {
    Node *n = x < 0 ? NULL : im_node(im, op, 1, &x);
    if (!n || (axes && im_set_ints(im, n, ATTR_AXES, axes, n_axes)))
        return -1;
    return im_finish(im, n, out_k);
}

/* NegativeLogLikelihoodLoss of log_prob [N, C, d...] at target [N, d...] (int64) as
 * output 0: -log_prob[n, target[n, d], d] times weight[target] (1 without weight),
 * 0 where target is ignore_index; reduced by `reduction`, mean dividing by the sum
 * of the weights. The picked element is a sum over C of a one-hot where(); the
 * weight is a gather at the target with ignore_index made 0, so no index it holds
 * reaches outside the weight. */
static int nll_loss(Importer *im, int log_prob, int target, int weight) {
    const char *reduction = "mean";
    int64_t ii = 0, one = 1;
    Type t;
    if (im_attr_string(im, "reduction", &reduction) < 0 || im_input_type(im, 0, &t))
        return -1;
    int has_ii = im_attr_int(im, "ignore_index", &ii);
    if (has_ii < 0)
        return -1;
    if (strcmp(reduction, "none") != 0 && strcmp(reduction, "sum") != 0 && strcmp(reduction, "mean") != 0)
        return im_error(im, "reduction '%s' is not none, sum or mean", reduction);
    if (t.rank < 2)
        return im_error(im, "the input must be [N, C, ...], not of rank %d", t.rank);
    /* one node-making call a statement, in the same order from every compiler */
    int unsqueezed = with_axes(im, OP_UNSQUEEZE, target, &one, 1, -1);
    int one_hot = im_binary(im, OP_EQUAL, unsqueezed, im_iota(im, t.rank, 1, t.dims[1]), -1);
    int picked = with_axes(im, OP_SUM, im_where(im, one_hot, log_prob, im_scalar(im, 0), -1), &one, 1, -1);
    int loss = im_unary(im, OP_NEG, picked, -1), w = -1, valid = -1;
    if (loss < 0)
        return -1;
    if (has_ii &&
        (valid =
             im_unary(im, OP_NOT, im_binary(im, OP_EQUAL, target, im_scalar_of(im, DT_I64, ii), -1), -1)) < 0)
        return -1;
    if (weight >= 0) { /* gathered at the target, or where it is ignored at 0 */
        int at = valid >= 0 ? im_where(im, valid, target, im_scalar_of(im, DT_I64, 0), -1) : target;
        int g[2] = {weight, at};
        Node *n = im_node(im, OP_GATHER, 2, g);
        if (!n || (w = im_finish(im, n, -1)) < 0)
            return -1;
    }
    if (valid >= 0) {
        int kept = w >= 0 ? w : im_scalar(im, 1);
        if ((w = im_where(im, valid, kept, im_scalar(im, 0), -1)) < 0)
            return -1;
    }
    bool sum = strcmp(reduction, "sum") == 0, mean = strcmp(reduction, "mean") == 0;
    if (w >= 0 && (loss = im_binary(im, OP_MUL, loss, w, sum || mean ? -1 : 0)) < 0)
        return -1;
    if (!sum && !mean)
        return w >= 0 ? 0 : (im_alias(im, 0, loss) < 0 ? -1 : 0);
    if (mean && w < 0)
        return with_axes(im, OP_MEAN, loss, NULL, 0, 0) < 0 ? -1 : 0;
    int total = with_axes(im, OP_SUM, loss, NULL, 0, mean ? -1 : 0);
    if (!mean)
        return total < 0 ? -1 : 0;
    return im_binary(im, OP_DIV, total, with_axes(im, OP_SUM, w, NULL, 0, -1), 0) < 0 ? -1 : 0;
}

static int imp_nll_loss(Importer *im) {
    int x, target, weight = -1;
    if (im_input(im, 0, &x) || im_input(im, 1, &target) || (im_has_input(im, 2) && im_input(im, 2, &weight)))
        return -1;
    return nll_loss(im, x, target, weight);
}

/* SoftmaxCrossEntropyLoss: the NLL loss of log_softmax(scores) along the classes,
 * which is output 1 (log_prob) when the node has it. */
static int imp_softmax_cross_entropy(Importer *im) {
    int x, target, weight = -1, log_prob;
    if (im_input(im, 0, &x) || im_input(im, 1, &target) || (im_has_input(im, 2) && im_input(im, 2, &weight)))
        return -1;
    Node *n = im_node(im, OP_LOG_SOFTMAX, 1, &x);
    if (!n || im_set_int(im, n, ATTR_AXIS, 1) ||
        (log_prob = im_finish(im, n, im_n_outputs(im) > 1 ? 1 : -1)) < 0)
        return -1;
    return nll_loss(im, log_prob, target, weight);
}

/* ---- Reductions ---- */

typedef enum { R_SUM, R_MEAN, R_MAX, R_MIN, R_L1, R_L2, R_SUMSQ, R_LOGSUM, R_LOGSUMEXP } Reduce;

static int reduce(Importer *im, Reduce kind) {
    int64_t keep = 1, noop = 0, axes[ONNX_MAXL];
    int n_axes = 0, r;
    if (im_attr_int(im, "keepdims", &keep) < 0 || im_attr_int(im, "noop_with_empty_axes", &noop) < 0)
        return -1;
    if ((r = im_attr_ints(im, "axes", axes, ONNX_MAXL, &n_axes)) < 0)
        return -1;
    if (r == 0 && (r = im_input_ints(im, 1, "axes", axes, &n_axes)) < 0)
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
    if (!n || (n_axes && im_set_ints(im, n, ATTR_AXES, axes, n_axes)) ||
        im_set_int(im, n, ATTR_KEEPDIMS, keep != 0))
        return -1;
    int y = im_finish(im, n, last ? 0 : -1);
    if (y < 0 || last)
        return y < 0 ? -1 : 0;
    OpId after = kind == R_MIN ? OP_NEG : kind == R_L2 ? OP_SQRT : OP_LOG;
    return im_unary(im, after, y, 0) < 0 ? -1 : 0;
}

#define REDUCE(fn, KIND)                                                                                     \
    static int fn(Importer *im) {                                                                            \
        return reduce(im, KIND);                                                                             \
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

/* Convolution, pooling, normalizations and reductions, by ONNX op type. */
const OnnxOp onnx_ops_nn[] = {
    {"AveragePool", imp_avg_pool},
    {"BatchNormalization", imp_batch_norm},
    {"Conv", imp_conv2},
    {"ConvTranspose", imp_conv_transpose},
    {"GlobalAveragePool", imp_global_avg_pool},
    {"GlobalMaxPool", imp_global_max_pool},
    {"InstanceNormalization", imp_instance_norm},
    {"LayerNormalization", imp_layer_norm},
    {"LogSoftmax", imp_log_softmax},
    {"MaxPool", imp_max_pool},
    {"NegativeLogLikelihoodLoss", imp_nll_loss},
    {"ReduceL1", imp_reduce_l1},
    {"ReduceL2", imp_reduce_l2},
    {"ReduceLogSum", imp_reduce_logsum},
    {"ReduceLogSumExp", imp_reduce_logsumexp},
    {"ReduceMax", imp_reduce_max},
    {"ReduceMean", imp_reduce_mean},
    {"ReduceMin", imp_reduce_min},
    {"ReduceSum", imp_reduce_sum},
    {"ReduceSumSquare", imp_reduce_sumsq},
    {"Softmax", imp_softmax},
    {"SoftmaxCrossEntropyLoss", imp_softmax_cross_entropy},
    {NULL, NULL},
};
