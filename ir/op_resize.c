/* Shape inference for resampling (resize, interpolate) and for grad.
 *
 * resize follows ONNX Resize (opset 13) and interpolate torch.nn.functional
 * .interpolate, including each one's arithmetic for the output size: ONNX stores
 * scales as float32, so a resize scale is rounded to float before the length is
 * floor(length * scale), taken exactly (in double, as ONNX's reference does);
 * torch takes floor(length * scale_factor) in double from the scale as given. Both
 * reject a result dim below 1, since kiln shapes are positive. grad only checks
 * that it differentiates a scalar: each result has the type of the value it is the
 * gradient for, and the autodiff pass replaces the node before anything runs it. */
#include "ops_impl.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* floor(length * scale) for entry k of the scale list a, called `what`, or -1 after
 * a diagnostic when that is not a positive size. resize rounds the scale to float32
 * first, as ONNX stores it; past FLT_MAX that rounding is undefined, and the result
 * is too large either way. */
static int64_t scaled_length(const Node *n, const Attr *a, const char *what, int k, int64_t length, Diag *d) {
    const char *op = op_table[n->op].name;
    double scale = a->floats[k];
    if (!(scale > 0))
        return diag_error(d, a->loc, "%s: %s[%d] is %g; it must be positive", op, what, k, scale);
    if (n->op == OP_RESIZE && scale <= FLT_MAX)
        scale = (float)scale;
    double v = floor((double)length * scale);
    if (v < 1)
        return diag_error(d, a->loc,
                          "%s: %s[%d] = %g scales length %lld to %.0f, and sizes must be at least 1", op,
                          what, k, a->floats[k], (long long)length, v);
    if (too_large(v))
        return diag_error(d, a->loc, "%s: %s[%d] = %g makes the result too large", op, what, k, a->floats[k]);
    return (int64_t)v;
}

int infer_resize(Graph *g, Node *n, Diag *d) {
    const Type *x = in_type(g, n, 0);
    const Attr *sizes = node_attr(n, "sizes"), *scales = node_attr(n, "scales"), *roi = node_attr(n, "roi");
    if (sizes->set == scales->set)
        return diag_error(d, n->loc, "resize needs exactly one of 'sizes' and 'scales', got %s",
                          sizes->set ? "both" : "neither");
    bool crop = strcmp(node_enum(n, "coordinate_transformation_mode"), "tf_crop_and_resize") == 0;
    if (roi->set && !crop)
        return diag_error(d, roi->loc,
                          "resize: roi is only used with coordinate_transformation_mode=tf_crop_and_resize");
    if (crop && !roi->set)
        return diag_error(d, attr_loc(n, "coordinate_transformation_mode"),
                          "resize: coordinate_transformation_mode=tf_crop_and_resize needs roi");
    Type out = *x;
    for (int k = 0; k < x->rank; k++) {
        if (sizes->set) {
            if (sizes->ints[k] < 1)
                return diag_error(d, sizes->loc, "resize: sizes[%d] is %lld; sizes must be positive", k,
                                  (long long)sizes->ints[k]);
            out.dims[k] = sizes->ints[k];
            continue;
        }
        out.dims[k] = scaled_length(n, scales, "scales", k, x->dims[k], d);
        if (out.dims[k] < 0)
            return -1;
    }
    if (check_size(n, &out, d))
        return -1;
    set_out_type(g, n, 0, out);
    return 0;
}

/* The rank of input a torch interpolation mode needs, or 0 for any of 3 to 5. */
static int mode_rank(const char *mode) {
    if (strcmp(mode, "linear") == 0)
        return 3;
    if (strcmp(mode, "bilinear") == 0 || strcmp(mode, "bicubic") == 0)
        return 4;
    if (strcmp(mode, "trilinear") == 0)
        return 5;
    return 0;
}

int infer_interpolate(Graph *g, Node *n, Diag *d) {
    const Type *x = in_type(g, n, 0);
    const Attr *size = node_attr(n, "size"), *scale = node_attr(n, "scale_factor");
    const char *mode = node_enum(n, "mode");
    if (x->rank < 3 || x->rank > 5)
        return diag_error(
            d, n->loc,
            "interpolate: x of type %s needs rank 3, 4 or 5 (batch, channels and 1 to 3 spatial dimensions)",
            tstr(x));
    int want = mode_rank(mode);
    if (want && x->rank != want)
        return diag_error(d, attr_loc(n, "mode"), "interpolate: mode %s needs a %dD input, got x of type %s",
                          mode, want, tstr(x));
    if (node_bool(n, "align_corners") && !want)
        return diag_error(d, attr_loc(n, "align_corners"),
                          "interpolate: align_corners can only be set with the modes linear, bilinear, "
                          "bicubic and trilinear, not %s",
                          mode);
    if (size->set == scale->set)
        return diag_error(d, n->loc, "interpolate needs exactly one of 'size' and 'scale_factor', got %s",
                          size->set ? "both" : "neither");
    if (size->set && node_bool(n, "recompute_scale_factor"))
        return diag_error(d, attr_loc(n, "recompute_scale_factor"),
                          "interpolate: recompute_scale_factor is not meaningful with an explicit size");
    Type out = *x;
    for (int k = 0; k < x->rank - 2; k++) {
        if (size->set) {
            if (size->ints[k] < 1)
                return diag_error(d, size->loc, "interpolate: size[%d] is %lld; sizes must be positive", k,
                                  (long long)size->ints[k]);
            out.dims[k + 2] = size->ints[k];
            continue;
        }
        out.dims[k + 2] = scaled_length(n, scale, "scale_factor", k, x->dims[k + 2], d);
        if (out.dims[k + 2] < 0)
            return -1;
    }
    if (check_size(n, &out, d))
        return -1;
    set_out_type(g, n, 0, out);
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
