/* Pooling: max_pool and avg_pool (ONNX MaxPool and AveragePool, with PyTorch's rules
 * where the two differ), global_avg_pool (ONNX GlobalAveragePool) and adaptive_avg_pool
 * (torch adaptive_avg_pool1d/2d/3d), in either layout, and the gradients of the three
 * that have an op of their own (max_pool_grad, avg_pool_grad, adaptive_avg_pool_grad).
 *
 * A tensor is seen as [N, C, spatial...] whatever its layout: the sizes and element
 * strides of those dims wherever the layout puts them. Each kernel visits every output
 * element, works out its window along each spatial dim, and reduces the input elements
 * inside it, summing in double. Windows of max_pool and avg_pool start at
 * out_index * stride - pad_begin; padding is never read, only counted (avg_pool with
 * count_include_pad) or skipped. */
#include "ops_impl.h"

#include <math.h>

enum { MAX_SPATIAL = 3 };

/* x's type with spatial sizes sp, in the layout. */
static Type with_spatial(const Type *x, bool nhwc, const int64_t *sp) {
    Type t = *x;
    for (int i = 0; i < x->rank - 2; i++)
        t.dims[(nhwc ? 1 : 2) + i] = sp[i];
    return t;
}

/* x of max_pool, avg_pool and adaptive_avg_pool: 1 to 3 spatial dims. */
static int check_x(const Node *n, const Type *x, Diag *d) {
    if (x->rank < 3 || x->rank > 2 + MAX_SPATIAL)
        return diag_error(d, n->loc, "%s: x must have 1 to 3 spatial dims (rank 3 to 5), got %s",
                          op_table[n->op].name, tstr(x));
    return 0;
}

/* ---- max_pool and avg_pool ---- */

typedef struct {
    int64_t kernel[MAX_SPATIAL], strides[MAX_SPATIAL], pads[2 * MAX_SPATIAL], dilations[MAX_SPATIAL];
} PoolAttrs;

static PoolAttrs pool_attrs(const Node *n, int ns) {
    PoolAttrs a;
    node_ints(n, ATTR_KERNEL, a.kernel, MAX_SPATIAL, ns);
    node_ints(n, ATTR_STRIDES, a.strides, MAX_SPATIAL, ns);
    node_ints(n, ATTR_PADS, a.pads, 2 * MAX_SPATIAL, 2 * ns);
    for (int i = 0; i < ns; i++)
        a.dilations[i] = 1;
    if (op_attr_index(n->op, ATTR_DILATIONS) >= 0)
        node_ints(n, ATTR_DILATIONS, a.dilations, MAX_SPATIAL, ns);
    return a;
}

/* PyTorch's output size: with ceil_mode, a last window that would start inside the
 * right padding is dropped. */
static int64_t pool_out_size(int64_t in, int64_t extent, int64_t stride, int64_t pb, int64_t pe, bool ceil) {
    int64_t span = in + pb + pe - extent;
    int64_t out = (ceil ? (span + stride - 1) / stride : span / stride) + 1;
    if (ceil && (out - 1) * stride >= in + pb)
        out--;
    return out;
}

/* The checks of max_pool and avg_pool on x and the attributes; y's type into *y. */
static int pool_type(const Node *n, const Type *x, Type *y, Diag *d) {
    if (check_x(n, x, d))
        return -1;
    const char *op = op_table[n->op].name;
    bool nhwc = layout_is_nhwc(n);
    View v = view_of(x, nhwc);
    PoolAttrs a = pool_attrs(n, v.ns);
    if (check_size_attr(n, ATTR_KERNEL, a.kernel, v.ns, 1, d) ||
        check_size_attr(n, ATTR_STRIDES, a.strides, v.ns, 1, d) ||
        check_size_attr(n, ATTR_PADS, a.pads, 2 * v.ns, 0, d) ||
        check_size_attr(n, ATTR_DILATIONS, a.dilations, v.ns, 1, d))
        return -1;
    /* a window of more taps than any tensor has elements: its tap count (the divisor
       of avg_pool with count_include_pad) would overflow */
    int64_t taps = 1;
    for (int i = 0; i < v.ns; i++)
        if (!ck_mul(taps, a.kernel[i], &taps) || taps > KILN_MAX_NUMEL)
            return attr_too_large(n, ATTR_KERNEL, i, a.kernel[i], "makes the window too large", d);
    int64_t sp[MAX_SPATIAL];
    for (int i = 0; i < v.ns; i++) {
        /* the other sums stay within a few KILN_MAX_NUMEL, which check_size_attr bounds them by */
        int64_t extent;
        if (!ck_mul(a.kernel[i] - 1, a.dilations[i], &extent) || !ck_add(extent, 1, &extent))
            return attr_too_large(n, ATTR_DILATIONS, i, a.dilations[i], "makes the kernel extent overflow",
                                  d);
        int64_t pb = a.pads[i], pe = a.pads[v.ns + i];
        /* pads within one window extent keep an undilated window off wholly padding */
        if (pb >= extent || pe >= extent)
            return diag_error(d, attr_loc(n, ATTR_PADS),
                              "%s: the pads of spatial dim %d (%lld, %lld) must be smaller than the "
                              "kernel extent (%lld)",
                              op, i, (long long)pb, (long long)pe, (long long)extent);
        if (v.sp[i] + pb + pe < extent)
            return diag_error(d, n->loc,
                              "%s: spatial dim %d of x is %lld with pads %lld + %lld, smaller than the "
                              "kernel extent (%lld)",
                              op, i, (long long)v.sp[i], (long long)pb, (long long)pe, (long long)extent);
        sp[i] = pool_out_size(v.sp[i], extent, a.strides[i], pb, pe, node_bool(n, ATTR_CEIL_MODE));
    }
    *y = with_spatial(x, nhwc, sp);
    return 0;
}

int infer_pool(Graph *g, Node *n, Diag *d) {
    Type y = {0};
    if (pool_type(n, in_type(g, n, 0), &y, d))
        return -1;
    set_out_type(g, n, 0, y);
    return 0;
}

/* max_pool_grad(dy, x) and avg_pool_grad(dy, x): dy has the pool's result type, and
 * the gradient x's. */
int infer_pool_grad(Graph *g, Node *n, Diag *d) {
    const Type *dy = in_type(g, n, 0), *x = in_type(g, n, 1);
    Type y = {0};
    if (check_grad_ranks(n, dy, x, d) || pool_type(n, x, &y, d))
        return -1;
    if (!type_equal(dy, &y))
        return diag_error(d, n->loc, "%s: dy must be %s, the pool's result for x %s, got %s",
                          op_table[n->op].name, tstr(&y), tstr(x), tstr(dy));
    set_out_type(g, n, 0, *x);
    return 0;
}

/* The offset of one window's max, or -1 for a window wholly in the padding (its max
 * is -inf). NaN wins (the last NaN), and otherwise the first of equal maxima, as in
 * PyTorch, whose gradient goes to that element. */
static int64_t window_argmax(const float *x, const View *xv, int64_t b, int64_t c, const int64_t *start,
                             const PoolAttrs *a) {
    int64_t best = -1, k[MAX_SPATIAL] = {0}, p[MAX_SPATIAL];
    float m = -INFINITY;
    do {
        bool inside = true;
        for (int s = 0; s < xv->ns; s++) {
            p[s] = start[s] + k[s] * a->dilations[s];
            inside = inside && p[s] >= 0 && p[s] < xv->sp[s];
        }
        if (!inside)
            continue;
        int64_t at = view_offset(xv, b, c, p);
        if (best < 0 || isnan(x[at]) || x[at] > m) {
            best = at;
            m = x[at];
        }
    } while (next_index(k, a->kernel, xv->ns));
    return best;
}

/* The divisor of one avg_pool window: the real elements, or with count_include_pad
 * the window clipped to the padded input [-pad_begin, in + pad_end), as PyTorch does. */
static int64_t window_count(const View *xv, const int64_t *start, const PoolAttrs *a, bool count_pad) {
    int64_t count = 1;
    for (int s = 0; s < xv->ns; s++) {
        int64_t end = start[s] + a->kernel[s], padded_end = xv->sp[s] + a->pads[xv->ns + s];
        if (count_pad)
            count *= (end < padded_end ? end : padded_end) - start[s];
        else
            count *= (end < xv->sp[s] ? end : xv->sp[s]) - (start[s] > 0 ? start[s] : 0);
    }
    return count;
}

/* Calls fn on the offset of every element of an avg_pool window inside x. */
static void each_in_window(const View *xv, int64_t b, int64_t c, const int64_t *start, const PoolAttrs *a,
                           void (*fn)(int64_t at, void *ctx), void *ctx) {
    int64_t k[MAX_SPATIAL] = {0}, p[MAX_SPATIAL];
    do {
        bool inside = true;
        for (int s = 0; s < xv->ns; s++) {
            p[s] = start[s] + k[s];
            inside = inside && p[s] >= 0 && p[s] < xv->sp[s];
        }
        if (inside)
            fn(view_offset(xv, b, c, p), ctx);
    } while (next_index(k, a->kernel, xv->ns));
}

typedef struct {
    const float *x;
    float *dx;
    double sum, share;
} WindowAcc;

static void add_element(int64_t at, void *ctx) {
    WindowAcc *w = ctx;
    w->sum += w->x[at];
}

static void add_share(int64_t at, void *ctx) {
    WindowAcc *w = ctx;
    w->dx[at] = (float)(w->dx[at] + w->share);
}

int eval_pool(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    (void)d;
    bool nhwc = layout_is_nhwc(n);
    View xv = view_of(&in[0]->type, nhwc), yv = view_of(&out[0]->type, nhwc);
    PoolAttrs a = pool_attrs(n, xv.ns);
    bool count_pad = n->op == OP_AVG_POOL && node_bool(n, ATTR_COUNT_INCLUDE_PAD);
    const float *x = in[0]->data;
    for (int64_t b = 0; b < yv.n; b++)
        for (int64_t c = 0; c < yv.c; c++) {
            int64_t pos[MAX_SPATIAL] = {0}, start[MAX_SPATIAL];
            do {
                for (int s = 0; s < xv.ns; s++)
                    start[s] = pos[s] * a.strides[s] - a.pads[s];
                double v;
                if (n->op == OP_MAX_POOL) {
                    int64_t at = window_argmax(x, &xv, b, c, start, &a);
                    v = at < 0 ? -INFINITY : x[at];
                } else {
                    WindowAcc w = {x, NULL, 0, 0};
                    each_in_window(&xv, b, c, start, &a, add_element, &w);
                    v = w.sum / (double)window_count(&xv, start, &a, count_pad);
                }
                out[0]->data[view_offset(&yv, b, c, pos)] = (float)v;
            } while (next_index(pos, yv.sp, yv.ns));
        }
    return 0;
}

/* The adjoint of eval_pool: each window's dy goes to its max (max_pool_grad) or is
 * shared evenly by its elements (avg_pool_grad). */
int eval_pool_grad(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    (void)d;
    bool nhwc = layout_is_nhwc(n), is_max = n->op == OP_MAX_POOL_GRAD;
    View yv = view_of(&in[0]->type, nhwc), xv = view_of(&in[1]->type, nhwc);
    PoolAttrs a = pool_attrs(n, xv.ns);
    bool count_pad = !is_max && node_bool(n, ATTR_COUNT_INCLUDE_PAD);
    float *dx = out[0]->data;
    for (int64_t i = 0; i < type_numel(&out[0]->type); i++)
        dx[i] = 0;
    for (int64_t b = 0; b < yv.n; b++)
        for (int64_t c = 0; c < yv.c; c++) {
            int64_t pos[MAX_SPATIAL] = {0}, start[MAX_SPATIAL];
            do {
                for (int s = 0; s < xv.ns; s++)
                    start[s] = pos[s] * a.strides[s] - a.pads[s];
                float g = in[0]->data[view_offset(&yv, b, c, pos)];
                if (is_max) {
                    int64_t at = window_argmax(in[1]->data, &xv, b, c, start, &a);
                    if (at >= 0)
                        dx[at] += g;
                } else {
                    WindowAcc w = {NULL, dx, 0, g / (double)window_count(&xv, start, &a, count_pad)};
                    each_in_window(&xv, b, c, start, &a, add_share, &w);
                }
            } while (next_index(pos, yv.sp, yv.ns));
        }
    return 0;
}

/* ---- global_avg_pool ---- */

int infer_global_avg_pool(Graph *g, Node *n, Diag *d) {
    const Type *x = in_type(g, n, 0);
    if (x->rank < 3)
        return diag_error(d, n->loc,
                          "global_avg_pool: x must have at least one spatial dim (rank 3 or more), got %s",
                          tstr(x));
    int64_t ones[KILN_MAX_RANK];
    for (int i = 0; i < x->rank - 2; i++)
        ones[i] = 1;
    set_out_type(g, n, 0, with_spatial(x, layout_is_nhwc(n), ones));
    return 0;
}

int eval_global_avg_pool(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    (void)d;
    bool nhwc = layout_is_nhwc(n);
    View xv = view_of(&in[0]->type, nhwc), yv = view_of(&out[0]->type, nhwc);
    int64_t count = 1, zero[KILN_MAX_RANK] = {0};
    for (int s = 0; s < xv.ns; s++)
        count *= xv.sp[s];
    for (int64_t b = 0; b < xv.n; b++)
        for (int64_t c = 0; c < xv.c; c++) {
            double sum = 0;
            int64_t pos[KILN_MAX_RANK] = {0};
            do
                sum += in[0]->data[view_offset(&xv, b, c, pos)];
            while (next_index(pos, xv.sp, xv.ns));
            out[0]->data[view_offset(&yv, b, c, zero)] = (float)(sum / (double)count);
        }
    return 0;
}

/* ---- adaptive_avg_pool ---- */

/* The checks of adaptive_avg_pool on x and output_size; y's type into *y. */
static int adaptive_type(const Node *n, const Type *x, Type *y, Diag *d) {
    if (check_x(n, x, d))
        return -1;
    int64_t sp[MAX_SPATIAL];
    node_ints(n, ATTR_OUTPUT_SIZE, sp, MAX_SPATIAL, x->rank - 2);
    if (check_size_attr(n, ATTR_OUTPUT_SIZE, sp, x->rank - 2, 1, d))
        return -1;
    /* the windows' bounds take (i + 1) * in + out - 1 for every output index i < out */
    View v = view_of(x, layout_is_nhwc(n));
    for (int i = 0; i < v.ns; i++) {
        int64_t bound;
        if (!ck_mul(sp[i], v.sp[i], &bound) || !ck_add(bound, sp[i], &bound))
            return attr_too_large(n, ATTR_OUTPUT_SIZE, i, sp[i], "is too large for x", d);
    }
    *y = with_spatial(x, layout_is_nhwc(n), sp);
    return 0;
}

int infer_adaptive_avg_pool(Graph *g, Node *n, Diag *d) {
    Type y = {0};
    if (adaptive_type(n, in_type(g, n, 0), &y, d))
        return -1;
    set_out_type(g, n, 0, y);
    return 0;
}

/* adaptive_avg_pool_grad(dy, x): dy has the pool's result type, and the gradient x's. */
int infer_adaptive_avg_pool_grad(Graph *g, Node *n, Diag *d) {
    const Type *dy = in_type(g, n, 0), *x = in_type(g, n, 1);
    Type y = {0};
    if (check_grad_ranks(n, dy, x, d) || adaptive_type(n, x, &y, d))
        return -1;
    if (!type_equal(dy, &y))
        return diag_error(d, n->loc,
                          "adaptive_avg_pool_grad: dy must be %s, the pool's result for x %s, got %s",
                          tstr(&y), tstr(x), tstr(dy));
    set_out_type(g, n, 0, *x);
    return 0;
}

/* The window of output position pos, torch's [floor(i * in / out), ceil((i + 1) * in / out))
 * along each dim: its first input position and its size; returns its element count. */
static int64_t adaptive_window(const View *xv, const View *yv, const int64_t *pos, int64_t *start,
                               int64_t *size) {
    int64_t count = 1;
    for (int s = 0; s < xv->ns; s++) {
        start[s] = pos[s] * xv->sp[s] / yv->sp[s];
        size[s] = ((pos[s] + 1) * xv->sp[s] + yv->sp[s] - 1) / yv->sp[s] - start[s];
        count *= size[s];
    }
    return count;
}

int eval_adaptive_avg_pool(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    (void)d;
    bool nhwc = layout_is_nhwc(n);
    View xv = view_of(&in[0]->type, nhwc), yv = view_of(&out[0]->type, nhwc);
    for (int64_t b = 0; b < yv.n; b++)
        for (int64_t c = 0; c < yv.c; c++) {
            int64_t pos[MAX_SPATIAL] = {0};
            do {
                int64_t start[MAX_SPATIAL], size[MAX_SPATIAL], k[MAX_SPATIAL] = {0}, p[MAX_SPATIAL];
                int64_t count = adaptive_window(&xv, &yv, pos, start, size);
                double sum = 0;
                do {
                    for (int s = 0; s < xv.ns; s++)
                        p[s] = start[s] + k[s];
                    sum += in[0]->data[view_offset(&xv, b, c, p)];
                } while (next_index(k, size, xv.ns));
                out[0]->data[view_offset(&yv, b, c, pos)] = (float)(sum / (double)count);
            } while (next_index(pos, yv.sp, yv.ns));
        }
    return 0;
}

/* The adjoint of eval_adaptive_avg_pool: each window's dy is shared evenly by its
 * elements; where windows overlap, an element adds the shares of each. */
int eval_adaptive_avg_pool_grad(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    (void)d;
    bool nhwc = layout_is_nhwc(n);
    View yv = view_of(&in[0]->type, nhwc), xv = view_of(&in[1]->type, nhwc);
    float *dx = out[0]->data;
    for (int64_t i = 0; i < type_numel(&out[0]->type); i++)
        dx[i] = 0;
    for (int64_t b = 0; b < yv.n; b++)
        for (int64_t c = 0; c < yv.c; c++) {
            int64_t pos[MAX_SPATIAL] = {0};
            do {
                int64_t start[MAX_SPATIAL], size[MAX_SPATIAL], k[MAX_SPATIAL] = {0}, p[MAX_SPATIAL];
                int64_t count = adaptive_window(&xv, &yv, pos, start, size);
                double share = in[0]->data[view_offset(&yv, b, c, pos)] / (double)count;
                do {
                    for (int s = 0; s < xv.ns; s++)
                        p[s] = start[s] + k[s];
                    int64_t at = view_offset(&xv, b, c, p);
                    dx[at] = (float)(dx[at] + share);
                } while (next_index(k, size, xv.ns));
            } while (next_index(pos, yv.sp, yv.ns));
        }
    return 0;
}
