/* Convolution: conv (ONNX Conv) and conv_transpose (ONNX ConvTranspose), with 1 to 3
 * spatial dims, groups, strides, dilations and asymmetric pads [x1_begin, x2_begin, ...,
 * x1_end, x2_end, ...].
 *
 * Both layouts are handled by one view of a tensor as [outer, channel, spatial...]:
 * the sizes and element strides of those dims wherever the layout puts them. An
 * activation is [N, C, spatial...] under that view, a conv weight [O, C/groups, k...]
 * and a conv_transpose weight [C, O/groups, k...], in either layout. The kernels are
 * direct loops that gather, for each output element, every input element that meets it,
 * and sum in double. conv_transpose is written as that gather too: input position i
 * and kernel tap k reach output position i*stride - pad_begin + k*dilation. */
#include "ops_impl.h"

enum { MAX_SPATIAL = 3 };

/* x's type with channel count c and spatial sizes sp, in the layout. */
static Type layout_type(const Type *x, bool nhwc, int64_t c, const int64_t *sp) {
    Type t = *x;
    int ns = x->rank - 2, first = nhwc ? 1 : 2;
    t.dims[nhwc ? x->rank - 1 : 1] = c;
    for (int i = 0; i < ns; i++)
        t.dims[first + i] = sp[i];
    return t;
}

/* The attributes both ops share. */
typedef struct {
    int64_t strides[MAX_SPATIAL], pads[2 * MAX_SPATIAL], dilations[MAX_SPATIAL], groups;
} ConvAttrs;

static ConvAttrs conv_attrs(const Node *n, int ns) {
    ConvAttrs a;
    node_ints(n, ATTR_STRIDES, a.strides, MAX_SPATIAL, ns);
    node_ints(n, ATTR_PADS, a.pads, 2 * MAX_SPATIAL, 2 * ns);
    node_ints(n, ATTR_DILATIONS, a.dilations, MAX_SPATIAL, ns);
    a.groups = node_int(n, ATTR_GROUPS);
    return a;
}

static int check_conv_attrs(const Node *n, int ns, const ConvAttrs *a, Diag *d) {
    if (check_size_attr(n, ATTR_STRIDES, a->strides, ns, 1, d) ||
        check_size_attr(n, ATTR_PADS, a->pads, 2 * ns, 0, d) ||
        check_size_attr(n, ATTR_DILATIONS, a->dilations, ns, 1, d))
        return -1;
    if (a->groups < 1)
        return diag_error(d, attr_loc(n, ATTR_GROUPS), "%s: groups must be at least 1, got %lld",
                          op_table[n->op].name, (long long)a->groups);
    return 0;
}

/* The dilated kernel's extent (k - 1) * dilation + 1 along spatial dim i. */
static int kernel_extent(const Node *n, int i, int64_t k, int64_t dilation, int64_t *extent, Diag *d) {
    if (!ck_mul(k - 1, dilation, extent) || !ck_add(*extent, 1, extent))
        return attr_too_large(n, ATTR_DILATIONS, i, dilation, "makes the kernel extent overflow", d);
    return 0;
}

/* x's size along spatial dim i with both its pads. */
static int padded_size(const Node *n, int i, int ns, int64_t x, const int64_t *pads, int64_t *r, Diag *d) {
    if (!ck_add(x, pads[i], r))
        return attr_too_large(n, ATTR_PADS, i, pads[i], NULL, d);
    if (!ck_add(*r, pads[ns + i], r))
        return attr_too_large(n, ATTR_PADS, ns + i, pads[ns + i], NULL, d);
    return 0;
}

/* The checks on x and w, then on the attributes, common to both ops; fills the
 * views of x and w and the attributes. */
static int check_common(Graph *g, Node *n, bool nhwc, View *xv, View *wv, ConvAttrs *a, Diag *d) {
    const char *op = op_table[n->op].name;
    const Type *x = in_type(g, n, 0), *w = in_type(g, n, 1);
    if (x->rank < 3 || x->rank > 2 + MAX_SPATIAL)
        return diag_error(d, n->loc, "%s: x must have 1 to 3 spatial dims (rank 3 to 5), got %s", op,
                          tstr(x));
    if (w->rank != x->rank)
        return diag_error(d, n->loc, "%s: w must have the rank of x (%d), got w %s for x %s", op, x->rank,
                          tstr(w), tstr(x));
    *xv = view_of(x, nhwc);
    *wv = view_of(w, nhwc);
    *a = conv_attrs(n, xv->ns);
    return check_conv_attrs(n, xv->ns, a, d);
}

static int check_bias(Graph *g, Node *n, int64_t out_channels, Diag *d) {
    const Type *b = in_type(g, n, 2);
    if (b && (b->rank != 1 || b->dims[0] != out_channels))
        return diag_error(d, n->loc, "%s: b must be [%lld], one per output channel, got %s",
                          op_table[n->op].name, (long long)out_channels, tstr(b));
    return 0;
}

/* ---- conv ---- */

int infer_conv(Graph *g, Node *n, Diag *d) {
    bool nhwc = layout_is_nhwc(n);
    View xv, wv;
    ConvAttrs a;
    if (check_common(g, n, nhwc, &xv, &wv, &a, d))
        return -1;
    const Type *x = in_type(g, n, 0), *w = in_type(g, n, 1);
    if (xv.c % a.groups != 0 || wv.n % a.groups != 0)
        return diag_error(d, n->loc,
                          "conv: groups (%lld) must divide the input channels (%lld) and the output "
                          "channels (%lld) (x %s, w %s)",
                          (long long)a.groups, (long long)xv.c, (long long)wv.n, tstr(x), tstr(w));
    if (wv.c != xv.c / a.groups)
        return diag_error(d, n->loc,
                          "conv: w must have %lld input channels (x's %lld in %lld groups), got w %s for "
                          "x %s",
                          (long long)(xv.c / a.groups), (long long)xv.c, (long long)a.groups, tstr(w),
                          tstr(x));
    if (check_bias(g, n, wv.n, d))
        return -1;
    int64_t sp[MAX_SPATIAL];
    for (int i = 0; i < xv.ns; i++) {
        int64_t extent, padded;
        if (kernel_extent(n, i, wv.sp[i], a.dilations[i], &extent, d) ||
            padded_size(n, i, xv.ns, xv.sp[i], a.pads, &padded, d))
            return -1;
        if (padded < extent)
            return diag_error(d, n->loc,
                              "conv: spatial dim %d of x is %lld with pads %lld + %lld, smaller than the "
                              "dilated kernel (%lld)",
                              i, (long long)xv.sp[i], (long long)a.pads[i], (long long)a.pads[xv.ns + i],
                              (long long)extent);
        sp[i] = (padded - extent) / a.strides[i] + 1;
    }
    set_out_type(g, n, 0, layout_type(x, nhwc, wv.n, sp));
    return 0;
}

int eval_conv(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    (void)d;
    bool nhwc = layout_is_nhwc(n);
    View xv = view_of(&in[0]->type, nhwc), wv = view_of(&in[1]->type, nhwc);
    View yv = view_of(&out[0]->type, nhwc);
    int ns = xv.ns;
    ConvAttrs a = conv_attrs(n, ns);
    const float *x = in[0]->data, *w = in[1]->data;
    int64_t out_per_group = yv.c / a.groups;
    for (int64_t b = 0; b < yv.n; b++)
        for (int64_t o = 0; o < yv.c; o++) {
            int64_t c0 = o / out_per_group * wv.c, pos[MAX_SPATIAL] = {0};
            do {
                double acc = in[2] ? in[2]->data[o] : 0;
                for (int64_t ci = 0; ci < wv.c; ci++) {
                    int64_t k[MAX_SPATIAL] = {0};
                    do {
                        int64_t xi = b * xv.sn + (c0 + ci) * xv.sc, wi = o * wv.sn + ci * wv.sc;
                        bool inside = true;
                        for (int s = 0; s < ns; s++) {
                            int64_t p = pos[s] * a.strides[s] - a.pads[s] + k[s] * a.dilations[s];
                            inside = inside && p >= 0 && p < xv.sp[s];
                            xi += p * xv.ss[s];
                            wi += k[s] * wv.ss[s];
                        }
                        if (inside)
                            acc += (double)x[xi] * w[wi];
                    } while (next_index(k, wv.sp, ns));
                }
                int64_t yi = b * yv.sn + o * yv.sc;
                for (int s = 0; s < ns; s++)
                    yi += pos[s] * yv.ss[s];
                out[0]->data[yi] = (float)acc;
            } while (next_index(pos, yv.sp, ns));
        }
    return 0;
}

/* ---- fused_conv: conv, then an elementwise epilogue ---- */

int infer_fused_conv(Graph *g, Node *n, Diag *d) {
    return infer_conv(g, n, d) ? -1 : infer_epilogue(g, n, d);
}

int eval_fused_conv(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    const Tensor *conv_in[3] = {in[0], in[1], n->n_in > 2 ? in[2] : NULL}; /* in[] has n_in entries */
    return eval_conv(n, conv_in, out, d) ? -1 : eval_epilogue(n, in, out[0], d);
}

/* ---- conv_transpose ---- */

int infer_conv_transpose(Graph *g, Node *n, Diag *d) {
    bool nhwc = layout_is_nhwc(n);
    View xv, wv;
    ConvAttrs a;
    if (check_common(g, n, nhwc, &xv, &wv, &a, d))
        return -1;
    const Type *x = in_type(g, n, 0), *w = in_type(g, n, 1);
    if (wv.n != xv.c)
        return diag_error(d, n->loc, "conv_transpose: w must have x's %lld input channels first, got w %s",
                          (long long)xv.c, tstr(w));
    if (xv.c % a.groups != 0)
        return diag_error(d, n->loc,
                          "conv_transpose: groups (%lld) must divide the input channels (%lld) (x %s)",
                          (long long)a.groups, (long long)xv.c, tstr(x));
    int64_t out_channels = wv.c * a.groups, opad[MAX_SPATIAL], sp[MAX_SPATIAL];
    if (check_bias(g, n, out_channels, d))
        return -1;
    node_ints(n, ATTR_OUTPUT_PADDING, opad, MAX_SPATIAL, xv.ns);
    if (check_size_attr(n, ATTR_OUTPUT_PADDING, opad, xv.ns, 0, d))
        return -1;
    for (int i = 0; i < xv.ns; i++) {
        /* torch's rule: past both, the extra outputs would see no input at all */
        if (opad[i] >= a.strides[i] && opad[i] >= a.dilations[i])
            return diag_error(d, attr_loc(n, ATTR_OUTPUT_PADDING),
                              "conv_transpose: output_padding[%d] (%lld) must be smaller than the stride "
                              "(%lld) or the dilation (%lld)",
                              i, (long long)opad[i], (long long)a.strides[i], (long long)a.dilations[i]);
        /* stride * (in - 1) + output_padding + extent - pads */
        int64_t extent, span;
        if (kernel_extent(n, i, wv.sp[i], a.dilations[i], &extent, d))
            return -1;
        if (!ck_mul(a.strides[i], xv.sp[i] - 1, &span) || !ck_add(span, opad[i], &span) ||
            !ck_add(span, extent, &span))
            return attr_too_large(n, ATTR_STRIDES, i, a.strides[i], "makes the output overflow", d);
        if (!ck_sub(span, a.pads[i], &sp[i]) || !ck_sub(sp[i], a.pads[xv.ns + i], &sp[i]))
            return attr_too_large(n, ATTR_PADS, i, a.pads[i], NULL, d);
        if (sp[i] < 1)
            return diag_error(d, n->loc,
                              "conv_transpose: spatial dim %d of the output would be %lld (x %s, w %s, pads "
                              "%lld + %lld)",
                              i, (long long)sp[i], tstr(x), tstr(w), (long long)a.pads[i],
                              (long long)a.pads[xv.ns + i]);
    }
    set_out_type(g, n, 0, layout_type(x, nhwc, out_channels, sp));
    return 0;
}

int eval_conv_transpose(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    (void)d;
    bool nhwc = layout_is_nhwc(n);
    View xv = view_of(&in[0]->type, nhwc), wv = view_of(&in[1]->type, nhwc);
    View yv = view_of(&out[0]->type, nhwc);
    int ns = xv.ns;
    ConvAttrs a = conv_attrs(n, ns);
    const float *x = in[0]->data, *w = in[1]->data;
    int64_t in_per_group = xv.c / a.groups;
    for (int64_t b = 0; b < yv.n; b++)
        for (int64_t o = 0; o < yv.c; o++) {
            int64_t c0 = o / wv.c * in_per_group, oc = o % wv.c, pos[MAX_SPATIAL] = {0};
            do {
                double acc = in[2] ? in[2]->data[o] : 0;
                for (int64_t ci = 0; ci < in_per_group; ci++) {
                    int64_t k[MAX_SPATIAL] = {0};
                    do {
                        int64_t xi = b * xv.sn + (c0 + ci) * xv.sc, wi = (c0 + ci) * wv.sn + oc * wv.sc;
                        bool inside = true;
                        for (int s = 0; s < ns; s++) {
                            /* the input position i with i*stride - pad + k*dilation == pos */
                            int64_t t = pos[s] + a.pads[s] - k[s] * a.dilations[s];
                            inside = inside && t >= 0 && t % a.strides[s] == 0 && t / a.strides[s] < xv.sp[s];
                            xi += t / a.strides[s] * xv.ss[s];
                            wi += k[s] * wv.ss[s];
                        }
                        if (inside)
                            acc += (double)x[xi] * w[wi];
                    } while (next_index(k, wv.sp, ns));
                }
                int64_t yi = b * yv.sn + o * yv.sc;
                for (int s = 0; s < ns; s++)
                    yi += pos[s] * yv.ss[s];
                out[0]->data[yi] = (float)acc;
            } while (next_index(pos, yv.sp, ns));
        }
    return 0;
}

/* ---- conv_weight_grad: the gradient of conv with respect to its weight ---- */

/* conv_weight_grad(x, dy, kernel, ...) is d loss / d w of y = conv(x, w, ...) with
 * dy = d loss / d y: w[o, ci, k] gathers x[b, group(o) + ci, p * stride - pad + k *
 * dilation] * dy[b, o, p] over every b and output position p. */
int infer_conv_weight_grad(Graph *g, Node *n, Diag *d) {
    bool nhwc = layout_is_nhwc(n);
    View xv, dv;
    ConvAttrs a;
    if (check_common(g, n, nhwc, &xv, &dv, &a, d))
        return -1;
    const Type *x = in_type(g, n, 0), *dy = in_type(g, n, 1);
    int64_t k[MAX_SPATIAL];
    node_ints(n, ATTR_KERNEL, k, MAX_SPATIAL, xv.ns);
    if (check_size_attr(n, ATTR_KERNEL, k, xv.ns, 1, d))
        return -1;
    if (xv.c % a.groups != 0 || dv.c % a.groups != 0 || dv.n != xv.n)
        return diag_error(d, n->loc,
                          "conv_weight_grad: x %s and dy %s must have one batch size, and groups (%lld) must "
                          "divide both channel counts",
                          tstr(x), tstr(dy), (long long)a.groups);
    for (int i = 0; i < xv.ns; i++) {
        int64_t extent, padded;
        if (kernel_extent(n, i, k[i], a.dilations[i], &extent, d) ||
            padded_size(n, i, xv.ns, xv.sp[i], a.pads, &padded, d))
            return -1;
        if (padded < extent || (padded - extent) / a.strides[i] + 1 != dv.sp[i])
            return diag_error(d, n->loc, "conv_weight_grad: dy %s is not the shape conv gives for x %s",
                              tstr(dy), tstr(x));
    }
    Type w = layout_type(x, nhwc, xv.c / a.groups, k);
    w.dims[0] = dv.c;
    set_out_type(g, n, 0, w);
    return 0;
}

int eval_conv_weight_grad(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    (void)d;
    bool nhwc = layout_is_nhwc(n);
    View xv = view_of(&in[0]->type, nhwc), dv = view_of(&in[1]->type, nhwc),
         wv = view_of(&out[0]->type, nhwc);
    int ns = xv.ns;
    ConvAttrs a = conv_attrs(n, ns);
    const float *x = in[0]->data, *dy = in[1]->data;
    int64_t out_per_group = dv.c / a.groups;
    for (int64_t o = 0; o < wv.n; o++)
        for (int64_t ci = 0; ci < wv.c; ci++) {
            int64_t c = o / out_per_group * wv.c + ci, k[MAX_SPATIAL] = {0};
            do {
                double acc = 0;
                for (int64_t b = 0; b < dv.n; b++) {
                    int64_t pos[MAX_SPATIAL] = {0};
                    do {
                        int64_t xi = b * xv.sn + c * xv.sc, di = b * dv.sn + o * dv.sc;
                        bool inside = true;
                        for (int s = 0; s < ns; s++) {
                            int64_t p = pos[s] * a.strides[s] - a.pads[s] + k[s] * a.dilations[s];
                            inside = inside && p >= 0 && p < xv.sp[s];
                            xi += p * xv.ss[s];
                            di += pos[s] * dv.ss[s];
                        }
                        if (inside)
                            acc += (double)x[xi] * dy[di];
                    } while (next_index(pos, dv.sp, ns));
                }
                int64_t wi = o * wv.sn + ci * wv.sc;
                for (int s = 0; s < ns; s++)
                    wi += k[s] * wv.ss[s];
                out[0]->data[wi] = (float)acc;
            } while (next_index(k, wv.sp, ns));
        }
    return 0;
}
