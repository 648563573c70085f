/* Resampling: resize (ONNX Resize, opset 13), interpolate (torch.nn.functional
 * .interpolate) and their gradients resize_grad and interpolate_grad.
 *
 * Sizes. resize stores its scales as float32, as ONNX does, so a scale is rounded
 * to float before the length is floor(length * scale), taken exactly in double (as
 * ONNX's reference does); interpolate takes floor(length * scale_factor) in double
 * from the factor as given, as torch does. A result dim below 1 is an error.
 *
 * Values. Every mode of both ops is separable: along each resized axis, output
 * index o reads a few input indices with weights (nearest 1, linear 2, cubic 4,
 * area a window), and the whole op is those 1-D maps applied one axis after the
 * other. resample_plan builds the tables, one per axis that is not the identity,
 * with each framework's own arithmetic, so the interpreter and every target share
 * one definition of the index math:
 *   - resize follows onnx/backend/test/case/node/resize.py (the reference the
 *     conformance data comes from): the source coordinate in double from the
 *     float32 scale (or out/in for sizes) and output width scale * in, the taps
 *     nearest to it with edge clamping, exclude_outside renormalizing the taps
 *     inside, and tf_crop_and_resize marking outputs outside the input, which take
 *     extrapolation_value.
 *   - interpolate follows ATen's CPU kernels (torch 1.13): scales are float
 *     (1 / scale_factor when a factor is given and not recomputed, else in / out);
 *     nearest and nearest-exact take floorf of a float product, with no special
 *     case for out = in (a factor of 1.1 on 5 elements moves them); linear computes
 *     the source index in double and is the identity when out = in; cubic too,
 *     with its weights in float (A = -0.75, taps clamped, no identity case); area
 *     is adaptive average pooling.
 * The interpreter applies the tables in double; the gradient is their adjoint,
 * applied in the opposite order. Outputs outside the input have no gradient. */
#include "ops_impl.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* ---- Shapes ---- */

/* floor(length * scale) for entry k of the scale list a, called `what`, or -1 after
 * a diagnostic when that is not a positive size. resize rounds the scale to float32
 * first, as ONNX stores it; past FLT_MAX that rounding is undefined, and the result
 * is too large either way. */
static int64_t scaled_length(const Node *n, const Attr *a, const char *what, int k, int64_t length, Diag *d) {
    const char *op = op_table[n->op].name;
    double scale = a->floats[k];
    if (!(scale > 0))
        return diag_error(d, a->loc, "%s: %s[%d] is %g; it must be positive", op, what, k, scale);
    if (strstr(op, "resize") && scale <= FLT_MAX)
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

static int resize_type(const Node *n, const Type *x, Type *out, Diag *d) {
    const char *op = op_table[n->op].name;
    const Attr *sizes = node_attr(n, ATTR_SIZES), *scales = node_attr(n, ATTR_SCALES),
               *roi = node_attr(n, ATTR_ROI);
    if (sizes->set == scales->set)
        return diag_error(d, n->loc, "%s needs exactly one of 'sizes' and 'scales', got %s", op,
                          sizes->set ? "both" : "neither");
    bool crop = node_enum(n, ATTR_COORDINATE_TRANSFORMATION_MODE) == COORD_TF_CROP_AND_RESIZE;
    if (roi->set && !crop)
        return diag_error(d, roi->loc,
                          "%s: roi is only used with coordinate_transformation_mode=tf_crop_and_resize", op);
    if (crop && !roi->set)
        return diag_error(d, attr_loc(n, ATTR_COORDINATE_TRANSFORMATION_MODE),
                          "%s: coordinate_transformation_mode=tf_crop_and_resize needs roi", op);
    /* roi is float32 in ONNX, and an infinite or NaN bound has no source coordinate */
    for (int k = 0; roi->set && k < roi->n; k++)
        if (!(fabs(roi->floats[k]) <= FLT_MAX))
            return diag_error(d, roi->loc, "%s: roi[%d] = %g is not a finite float32", op, k, roi->floats[k]);
    *out = *x;
    for (int k = 0; k < x->rank; k++) {
        if (sizes->set) {
            if (sizes->ints[k] < 1)
                return diag_error(d, sizes->loc, "%s: sizes[%d] is %lld; sizes must be positive", op, k,
                                  (long long)sizes->ints[k]);
            out->dims[k] = sizes->ints[k];
            continue;
        }
        out->dims[k] = scaled_length(n, scales, "scales", k, x->dims[k], d);
        if (out->dims[k] < 0)
            return -1;
    }
    return check_size(n, out, d);
}

/* The rank of input a torch interpolation mode needs, or 0 for any of 3 to 5. */
static int mode_rank(int mode) {
    if (mode == INTERPOLATE_MODE_LINEAR)
        return 3;
    if (mode == INTERPOLATE_MODE_BILINEAR || mode == INTERPOLATE_MODE_BICUBIC)
        return 4;
    if (mode == INTERPOLATE_MODE_TRILINEAR)
        return 5;
    return 0;
}

static int interpolate_type(const Node *n, const Type *x, Type *out, Diag *d) {
    const char *op = op_table[n->op].name;
    const Attr *size = node_attr(n, ATTR_SIZE), *scale = node_attr(n, ATTR_SCALE_FACTOR);
    int mode = node_enum(n, ATTR_MODE);
    if (x->rank < 3 || x->rank > 5)
        return diag_error(
            d, n->loc,
            "%s: x of type %s needs rank 3, 4 or 5 (batch, channels and 1 to 3 spatial dimensions)", op,
            tstr(x));
    int want = mode_rank(mode);
    if (want && x->rank != want)
        return diag_error(d, attr_loc(n, ATTR_MODE), "%s: mode %s needs a %dD input, got x of type %s", op,
                          node_enum_word(n, ATTR_MODE), want, tstr(x));
    if (node_bool(n, ATTR_ALIGN_CORNERS) && !want)
        return diag_error(d, attr_loc(n, ATTR_ALIGN_CORNERS),
                          "%s: align_corners can only be set with the modes linear, bilinear, "
                          "bicubic and trilinear, not %s",
                          op, node_enum_word(n, ATTR_MODE));
    if (size->set == scale->set)
        return diag_error(d, n->loc, "%s needs exactly one of 'size' and 'scale_factor', got %s", op,
                          size->set ? "both" : "neither");
    if (size->set && node_bool(n, ATTR_RECOMPUTE_SCALE_FACTOR))
        return diag_error(d, attr_loc(n, ATTR_RECOMPUTE_SCALE_FACTOR),
                          "%s: recompute_scale_factor is not meaningful with an explicit size", op);
    *out = *x;
    for (int k = 0; k < x->rank - 2; k++) {
        if (size->set) {
            if (size->ints[k] < 1)
                return diag_error(d, size->loc, "%s: size[%d] is %lld; sizes must be positive", op, k,
                                  (long long)size->ints[k]);
            out->dims[k + 2] = size->ints[k];
            continue;
        }
        out->dims[k + 2] = scaled_length(n, scale, "scale_factor", k, x->dims[k + 2], d);
        if (out->dims[k + 2] < 0)
            return -1;
    }
    return check_size(n, out, d);
}

static bool is_resize(const Node *n) {
    return n->op == OP_RESIZE || n->op == OP_RESIZE_GRAD;
}

/* The result type of resize or interpolate (or of the op a grad node differentiates)
 * for input type x. */
static int resampled_type(const Node *n, const Type *x, Type *out, Diag *d) {
    return is_resize(n) ? resize_type(n, x, out, d) : interpolate_type(n, x, out, d);
}

int infer_resample(Graph *g, Node *n, Diag *d) {
    Type out = {0};
    if (resampled_type(n, in_type(g, n, 0), &out, d))
        return -1;
    set_out_type(g, n, 0, out);
    return 0;
}

int infer_resample_grad(Graph *g, Node *n, Diag *d) {
    const Type *dy = in_type(g, n, 0), *x = in_type(g, n, 1);
    Type y = {0};
    if (check_grad_ranks(n, dy, x, d) || resampled_type(n, x, &y, d))
        return -1;
    if (!type_equal(dy, &y))
        return diag_error(d, n->loc, "%s: dy must be %s, the result for x %s, got %s", op_table[n->op].name,
                          tstr(&y), tstr(x), tstr(dy));
    set_out_type(g, n, 0, *x);
    return 0;
}

/* ---- The tables ---- */

/* The taps of one output position, written into its table row: input indices (not
 * yet clamped) and weights; returns how many. */
typedef struct {
    int64_t *at;
    double *w;
    bool outside; /* tf_crop_and_resize: beyond the input; takes extrapolation_value */
} Row;

/* Keys cubic convolution with coefficient A at distance t in [0, 1) of the left
 * middle tap: weights of the taps at -1, 0, 1, 2 (ONNX's cubic_coeffs). */
static void cubic_weights(double t, double a, double *w) {
    double s = t + 1, u = 1 - t, v = 2 - t;
    w[0] = ((a * s - 5 * a) * s + 8 * a) * s - 4 * a;
    w[1] = ((a + 2) * t - (a + 3)) * t * t + 1;
    w[2] = ((a + 2) * u - (a + 3)) * u * u + 1;
    w[3] = ((a * v - 5 * a) * v + 8 * a) * v - 4 * a;
}

/* The same in float with A = -0.75, as ATen computes it. */
static void cubic_weights_f(float t, float *w) {
    const float a = -0.75f;
    float s = t + 1.0f, u = 1.0f - t, v = u + 1.0f;
    w[0] = ((a * s - 5 * a) * s + 8 * a) * s - 4 * a;
    w[1] = ((a + 2) * t - (a + 3)) * t * t + 1;
    w[2] = ((a + 2) * u - (a + 3)) * u * u + 1;
    w[3] = ((a * v - 5 * a) * v + 8 * a) * v - 4 * a;
}

/* ONNX Resize along axis k: output o of out_len from in_len. */
static int resize_taps(const Node *n, int k, int64_t o, int64_t in_len, int64_t out_len, Row *r) {
    const Attr *scales = node_attr(n, ATTR_SCALES);
    double scale = scales->set ? (double)(float)scales->floats[k] : (double)out_len / (double)in_len;
    double width = scale * (double)in_len; /* the reference's output width, not floored */
    int ctm = node_enum(n, ATTR_COORDINATE_TRANSFORMATION_MODE), mode = node_enum(n, ATTR_MODE);
    double x = (double)o, src;
    if (ctm == COORD_ALIGN_CORNERS)
        src = width == 1 ? 0 : x * (double)(in_len - 1) / (width - 1);
    else if (ctm == COORD_ASYMMETRIC)
        src = x / scale;
    else if (ctm == COORD_TF_HALF_PIXEL_FOR_NN)
        src = (x + 0.5) / scale;
    else if (ctm == COORD_PYTORCH_HALF_PIXEL)
        src = width == 1 ? -0.5 : (x + 0.5) / scale - 0.5;
    else if (ctm == COORD_HALF_PIXEL)
        src = (x + 0.5) / scale - 0.5;
    else { /* tf_crop_and_resize, with the roi in float32 as ONNX stores it */
        const Attr *roi = node_attr(n, ATTR_ROI);
        float start = (float)roi->floats[k], end = (float)roi->floats[k + roi->n / 2];
        double extent = (double)(end - start);
        src =
            width == 1 ? extent * (double)(in_len - 1) / 2 : x * extent * (double)(in_len - 1) / (width - 1);
        src += (double)start * (double)(in_len - 1);
        r->outside = src < 0 || src > (double)(in_len - 1);
    }
    /* a tiny scale or a wide roi puts src far outside the input, where every tap
       clamps to an edge: bounded there, it converts to int64 */
    if (src < -0x1p52 || src > 0x1p52)
        src = src < 0 ? -0x1p52 : 0x1p52;
    double base = floor(src), frac = src - base;
    int64_t b = (int64_t)base;
    if (mode == RESIZE_MODE_NEAREST) {
        int nm = node_enum(n, ATTR_NEAREST_MODE);
        bool up =
            frac > 0 && (nm == NEAREST_MODE_CEIL || (nm == NEAREST_MODE_ROUND_PREFER_FLOOR && frac > 0.5) ||
                         (nm == NEAREST_MODE_ROUND_PREFER_CEIL && frac >= 0.5));
        r->at[0] = b + up, r->w[0] = 1;
        return 1;
    }
    int taps = 2;
    if (mode == RESIZE_MODE_LINEAR) {
        r->at[0] = b, r->at[1] = b + 1, r->w[0] = 1 - frac, r->w[1] = frac;
    } else {
        taps = 4;
        for (int j = 0; j < 4; j++)
            r->at[j] = b - 1 + j;
        cubic_weights(frac, (double)(float)node_float(n, ATTR_CUBIC_COEFF_A), r->w);
    }
    if (node_bool(n, ATTR_EXCLUDE_OUTSIDE)) {
        double sum = 0;
        for (int j = 0; j < taps; j++) {
            if (r->at[j] < 0 || r->at[j] >= in_len)
                r->w[j] = 0;
            sum += r->w[j];
        }
        for (int j = 0; j < taps; j++)
            r->w[j] /= sum;
    }
    return taps;
}

/* torch's float scale of an axis (ATen's area_pixel_compute_scale): how far a source
 * index moves per output index. */
static float torch_scale(const Node *n, int k, int64_t in_len, int64_t out_len, bool align) {
    const Attr *factor = node_attr(n, ATTR_SCALE_FACTOR);
    if (align)
        return out_len > 1 ? (float)(in_len - 1) / (float)(out_len - 1) : 0.0f;
    if (factor->set && !node_bool(n, ATTR_RECOMPUTE_SCALE_FACTOR))
        return (float)(1.0 / factor->floats[k]);
    return (float)in_len / (float)out_len;
}

/* torch interpolate along spatial axis k: output o of out_len from in_len. */
static int interpolate_taps(const Node *n, int k, int64_t o, int64_t in_len, int64_t out_len, Row *r) {
    int mode = node_enum(n, ATTR_MODE);
    bool align = node_bool(n, ATTR_ALIGN_CORNERS);
    r->at[0] = o, r->w[0] = 1;
    if (mode == INTERPOLATE_MODE_NEAREST) {
        r->at[0] = (int64_t)floorf((float)o * torch_scale(n, k, in_len, out_len, false));
    } else if (mode == INTERPOLATE_MODE_NEAREST_EXACT) {
        r->at[0] = (int64_t)floorf((float)(((double)o + 0.5) * torch_scale(n, k, in_len, out_len, false)));
    } else if (mode == INTERPOLATE_MODE_AREA) { /* adaptive average pooling's windows */
        int64_t start = o * in_len / out_len, end = ((o + 1) * in_len + out_len - 1) / out_len;
        for (int64_t j = 0; j < end - start; j++)
            r->at[j] = start + j, r->w[j] = 1.0 / (double)(end - start);
        return (int)(end - start);
    } else if (mode == INTERPOLATE_MODE_BICUBIC) {
        double scale = torch_scale(n, k, in_len, out_len, align);
        double src = align ? scale * (double)o : scale * ((double)o + 0.5) - 0.5, base = floor(src);
        float w[4];
        cubic_weights_f((float)(src - base), w);
        for (int j = 0; j < 4; j++)
            r->at[j] = (int64_t)base - 1 + j, r->w[j] = w[j];
        return 4;
    } else if (out_len != in_len) { /* linear, bilinear, trilinear */
        double scale = torch_scale(n, k, in_len, out_len, align);
        double src = align ? scale * (double)o : scale * ((double)o + 0.5) - 0.5;
        if (src < 0)
            src = 0;
        float frac = (float)(src - floor(src));
        r->at[0] = (int64_t)src, r->at[1] = r->at[0] + 1;
        r->w[0] = 1.0f - frac, r->w[1] = frac;
        return 2;
    }
    return 1;
}

/* The most taps an output position of the axis needs. */
static int max_taps(const Node *n, int64_t in_len, int64_t out_len) {
    int mode = node_enum(n, ATTR_MODE);
    if (is_resize(n))
        return mode == RESIZE_MODE_NEAREST ? 1 : mode == RESIZE_MODE_LINEAR ? 2 : 4;
    if (mode == INTERPOLATE_MODE_LINEAR || mode == INTERPOLATE_MODE_BILINEAR ||
        mode == INTERPOLATE_MODE_TRILINEAR)
        return 2;
    if (mode == INTERPOLATE_MODE_BICUBIC)
        return 4;
    int64_t most = 1;
    for (int64_t o = 0; mode == INTERPOLATE_MODE_AREA && o < out_len; o++) {
        int64_t start = o * in_len / out_len, end = ((o + 1) * in_len + out_len - 1) / out_len;
        most = end - start > most ? end - start : most;
    }
    return (int)most;
}

/* Whether each output position takes its own input position whole. Cubic taps
 * land on whole positions with weights (0, 1, 0, 0): the neighbours' zero weights
 * must not keep the axis, whose pass would read them (a NaN or an infinity there
 * would spread, and along a symbolic dim another item's rows). */
static bool is_identity(const ResampleAxis *a) {
    if (a->in_len != a->out_len)
        return false;
    for (int64_t o = 0; o < a->out_len; o++) {
        const int64_t *at = a->index + o * a->taps;
        const double *w = a->weight + o * a->taps;
        double own = 0;
        for (int j = 0; j < a->taps; j++)
            if (at[j] == o)
                own += w[j];
            else if (w[j] != 0)
                return false;
        if (at[0] < 0 || own != 1)
            return false;
    }
    return true;
}

/* Fills axis `axis` of r; false when memory runs out. */
static bool build_axis(const Node *n, int axis, int64_t in_len, int64_t out_len, ResampleAxis *a) {
    int k = is_resize(n) ? axis : axis - 2;
    *a = (ResampleAxis){
        .axis = axis, .in_len = in_len, .out_len = out_len, .taps = max_taps(n, in_len, out_len)};
    size_t count = (size_t)out_len * (size_t)a->taps;
    a->index = ir_malloc(count * sizeof *a->index);
    a->weight = ir_malloc(count * sizeof *a->weight);
    if (!a->index || !a->weight)
        return false;
    for (int64_t o = 0; o < out_len; o++) {
        Row r = {a->index + o * a->taps, a->weight + o * a->taps, false};
        int used = is_resize(n) ? resize_taps(n, k, o, in_len, out_len, &r)
                                : interpolate_taps(n, k, o, in_len, out_len, &r);
        for (int j = 0; j < a->taps; j++) {
            if (j >= used) /* a shorter window: pad with taps of weight 0 */
                r.at[j] = r.at[0], r.w[j] = 0;
            r.at[j] = r.at[j] < 0 ? 0 : r.at[j] >= in_len ? in_len - 1 : r.at[j];
        }
        if (r.outside) {
            for (int j = 0; j < a->taps; j++)
                r.at[j] = 0, r.w[j] = 0;
            r.at[0] = -1;
        }
    }
    return true;
}

/* Shrinking axes first keeps the intermediates small; among equals the innermost
 * first, whose pass reads scattered elements, while the others move whole rows. */
static bool applied_before(const ResampleAxis *a, const ResampleAxis *b) {
    double ra = (double)a->out_len / (double)a->in_len, rb = (double)b->out_len / (double)b->in_len;
    return ra != rb ? ra < rb : a->axis > b->axis;
}

int resample_plan(const Node *n, const Type *x, const Type *y, Resampling *r) {
    *r = (Resampling){.extrapolation = is_resize(n) ? node_float(n, ATTR_EXTRAPOLATION_VALUE) : 0};
    for (int axis = is_resize(n) ? 0 : 2; axis < x->rank; axis++) {
        ResampleAxis a;
        bool ok = build_axis(n, axis, x->dims[axis], y->dims[axis], &a);
        if (ok && !is_identity(&a)) {
            int at = r->n_axes++;
            for (; at > 0 && applied_before(&a, &r->axes[at - 1]); at--)
                r->axes[at] = r->axes[at - 1];
            r->axes[at] = a;
            continue;
        }
        ir_free(a.index);
        ir_free(a.weight);
        if (!ok) {
            resample_free(r);
            return -1;
        }
    }
    return 0;
}

void resample_free(Resampling *r) {
    for (int i = 0; i < r->n_axes; i++) {
        ir_free(r->axes[i].index);
        ir_free(r->axes[i].weight);
    }
    r->n_axes = 0;
}

void resample_pass_shape(const Resampling *r, const Type *x, int pass, int64_t *outer, int64_t *inner) {
    const ResampleAxis *a = &r->axes[pass];
    Type t = *x;
    for (int i = 0; i < pass; i++)
        t.dims[r->axes[i].axis] = r->axes[i].out_len;
    split_at_axis(&t, a->axis, outer, inner);
}

/* ---- The reference kernels ---- */

/* One pass: y[b, o, q] = sum_j w[o, j] x[b, index[o, j], q], or the extrapolation
 * value where o lies outside; adjoint: x[b, index[o, j], q] += w[o, j] y[b, o, q]. */
static void apply_axis(const ResampleAxis *a, int64_t outer, int64_t inner, double e, bool adjoint,
                       const double *from, double *to) {
    int64_t in_len = a->in_len, out_len = a->out_len, taps = a->taps;
    if (adjoint)
        memset(to, 0, sizeof *to * (size_t)(outer * in_len * inner));
    for (int64_t b = 0; b < outer; b++)
        for (int64_t o = 0; o < out_len; o++) {
            const int64_t *at = a->index + o * taps;
            const double *w = a->weight + o * taps;
            for (int64_t q = 0; q < inner; q++) {
                int64_t yi = (b * out_len + o) * inner + q;
                if (at[0] < 0) {
                    if (!adjoint)
                        to[yi] = e;
                    continue;
                }
                double sum = 0;
                for (int64_t j = 0; j < taps; j++) {
                    int64_t xi = (b * in_len + at[j]) * inner + q;
                    if (adjoint)
                        to[xi] += w[j] * from[yi];
                    else
                        sum += w[j] * from[xi];
                }
                if (!adjoint)
                    to[yi] = sum;
            }
        }
}

/* Runs the passes over `from` (of type `start`), forward or adjoint, into out. */
static int run_passes(const Resampling *r, const Type *x, const Tensor *from, bool adjoint, Tensor *out,
                      const Node *n, Diag *d) {
    int64_t most = type_numel(x) > type_numel(&out->type) ? type_numel(x) : type_numel(&out->type);
    for (int i = 0; i < r->n_axes; i++) {
        int64_t outer, inner;
        resample_pass_shape(r, x, i, &outer, &inner);
        int64_t size =
            outer * inner * (r->axes[i].out_len > r->axes[i].in_len ? r->axes[i].out_len : r->axes[i].in_len);
        most = size > most ? size : most;
    }
    double *buf[2] = {ir_malloc(sizeof(double) * (size_t)most), ir_malloc(sizeof(double) * (size_t)most)};
    if (!buf[0] || !buf[1]) {
        ir_free(buf[0]), ir_free(buf[1]);
        return diag_error(d, n->loc, "out of memory");
    }
    int64_t count = type_numel(&from->type);
    for (int64_t i = 0; i < count; i++)
        buf[0][i] = from->data[i];
    int cur = 0;
    for (int step = 0; step < r->n_axes; step++, cur ^= 1) {
        int pass = adjoint ? r->n_axes - 1 - step : step;
        int64_t outer, inner;
        resample_pass_shape(r, x, pass, &outer, &inner);
        apply_axis(&r->axes[pass], outer, inner, r->extrapolation, adjoint, buf[cur], buf[cur ^ 1]);
    }
    for (int64_t i = 0; i < type_numel(&out->type); i++)
        out->data[i] = (float)buf[cur][i];
    ir_free(buf[0]), ir_free(buf[1]);
    return 0;
}

int eval_resample(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    Resampling r;
    if (resample_plan(n, &in[0]->type, &out[0]->type, &r))
        return diag_error(d, n->loc, "out of memory");
    int rc = run_passes(&r, &in[0]->type, in[0], false, out[0], n, d);
    resample_free(&r);
    return rc;
}

int eval_resample_grad(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    Resampling r;
    if (resample_plan(n, &in[1]->type, &in[0]->type, &r))
        return diag_error(d, n->loc, "out of memory");
    int rc = run_passes(&r, &in[1]->type, in[0], true, out[0], n, d);
    resample_free(&r);
    return rc;
}
