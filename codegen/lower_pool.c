/* Lowering of the pools: max_pool, avg_pool, global_avg_pool and adaptive_avg_pool,
 * in either layout, built as kernel IR.
 *
 * Each is one LOOP kernel. A max_pool over 2 spatial dims with channels last on the
 * C target is a row of outputs an iteration, run by the precompiled
 * kiln_max_pool_row. Otherwise max_pool, avg_pool and adaptive_avg_pool take one
 * iteration per output element (max_pool and avg_pool with channels last: per
 * output position, each tap's channels a contiguous vector accumulated in place in
 * the result): the body unravels it into (b, c, p...), and loops over its window
 * with the kernel sizes, strides, dilations and pads as constants, skipping the
 * positions outside the input. Windows start at p * stride - pad_begin; max keeps
 * the last NaN it meets (as the interpreter does) and -inf for a window of padding
 * only; avg divides by the real elements, or with count_include_pad by the window
 * clipped to the padded input. Adaptive windows are torch's
 * [floor(p * in / out), ceil((p + 1) * in / out)), computed in the body.
 * global_avg_pool takes one iteration per (b, c) and sums its spatial extent in
 * double; with channels last, per (b, block of channels), and over a large image
 * in two kernels, the first summing it row by row. */
#include "codegen.h"
#include "../ir/ops_impl.h"

#include <math.h>
#include <string.h>

enum { MAX_SPATIAL = 3, WORK_PER_THREAD = 16384 };

static int64_t grain_for(int64_t work) {
    return work >= WORK_PER_THREAD ? 1 : WORK_PER_THREAD / work;
}

/* The coordinates of an output element, or of an output position (channels last). */
typedef struct {
    KExpr *b, *c, *p[KILN_MAX_RANK - 2];
} Coords;

/* Lets b, c and p0... be the coordinates of element i of the view y, in the
 * layout's order; a dim of size 1 is the constant 0. */
static Coords output_index(KBuilder *b, KExpr *i, const View *y, bool nhwc) {
    Coords at;
    const char *names[KILN_MAX_RANK];
    KExpr **dst[KILN_MAX_RANK];
    int64_t sizes[KILN_MAX_RANK];
    int n = 0;
    names[n] = "b", dst[n] = &at.b, sizes[n++] = y->n;
    if (!nhwc)
        names[n] = "c", dst[n] = &at.c, sizes[n++] = y->c;
    for (int k = 0; k < y->ns; k++)
        names[n] = kb_name(b, "p", k), dst[n] = &at.p[k], sizes[n++] = y->sp[k];
    if (nhwc)
        names[n] = "c", dst[n] = &at.c, sizes[n++] = y->c;
    int64_t strides[KILN_MAX_RANK], stride = 1;
    for (int k = n - 1; k >= 0; k--) {
        strides[k] = stride;
        stride *= sizes[k];
    }
    bool outermost = true; /* every dim before k has size 1 */
    for (int k = 0; k < n; k++) {
        if (sizes[k] == 1) {
            *dst[k] = k_int(b, 0);
            continue;
        }
        KExpr *e = k_div(b, i, k_int(b, strides[k]));
        if (!outermost)
            e = k_mod(b, e, k_int(b, sizes[k]));
        *dst[k] = k_var(b, kb_let(b, names[k], KT_I64, e));
        outermost = false;
    }
    return at;
}

/* The offset of x[b, c, in0...]. */
static KExpr *x_offset(KBuilder *b, const View *x, const Coords *at, KExpr *const *in) {
    KExpr *e = k_add(b, k_mul(b, at->b, k_int(b, x->sn)), k_mul(b, at->c, k_int(b, x->sc)));
    for (int s = 0; s < x->ns; s++)
        e = k_add(b, e, k_mul(b, in[s], k_int(b, x->ss[s])));
    return e;
}

/* max's step: v when it is NaN or above acc, else acc; two selects rather than one
 * of an ||, which compilers turn into branches and do not vectorize. */
static KExpr *max_step(KBuilder *b, KExpr *v, KExpr *acc) {
    return k_select(b, k_bin(b, KE_NE, v, v), v, k_select(b, k_bin(b, KE_GT, v, acc), v, acc));
}

/* A loop over the channels of a position, channels last. Kept a loop: GCC's
 * vectorizer takes it whole, where it would first unroll a short one fully and then
 * leave its selects scalar. */
static KExpr *channel_loop(KBuilder *b, int64_t channels) {
    KExpr *q = k_var(b, kb_for(b, "q", KT_I64, k_int(b, 0), k_int(b, channels), NULL, 0));
    kb_unroll(b, 1);
    return q;
}

/* One iteration per output element, each doing `work`. */
static Kernel *loop_over_output(Program *p, const Node *n, int64_t work, Diag *d) {
    const Type *t = &p->g->values[n->out[0]].type;
    Kernel *k = kernel_loop(p, n, NULL, type_numel(t), grain_for(work), d);
    if (k)
        kernel_follows(p, k, t, k->count, 1, 1);
    return k;
}

/* ---- max_pool and avg_pool ---- */

/* A max_pool over 2 spatial dims with channels last, on the C target: one iteration
 * per row of outputs, each a call of kiln_max_pool_row (runtime/kernels.c, compiled
 * once), the window's shapes in the kernel's table. */
static int max_pool_rows(Program *p, const Node *n, const View *x, const View *y, const int64_t *kernel,
                         const int64_t *strides, const int64_t *pads, const int64_t *dil, Diag *d) {
    int64_t ho = y->sp[0], wo = y->sp[1];
    Kernel *k = kernel_loop(p, n, NULL, y->n * ho,
                            grain_for(lower_flops(3, (int64_t[]){kernel[0] * kernel[1], wo, y->c})), d);
    KilnWindow window = window_block(x, kernel, strides, pads, dil, wo);
    if (!k || program_table(p, k, &window, sizeof window, d))
        return -1;
    kernel_follows(p, k, &p->g->values[n->out[0]].type, k->count, 1, 1); /* image by image */
    KBuilder *b = &k->b;
    KExpr *i = k_var(b, k->iter), *zero = k_int(b, 0);
    KExpr *image = y->n > 1 ? k_mul(b, k_div(b, i, k_int(b, ho)), k_int(b, x->sn)) : zero;
    KExpr *p0 = y->n > 1 ? k_mod(b, i, k_int(b, ho)) : i;
    kb_call(b, "kiln_max_pool_row", 4,
            (KExpr *[]){k_addr(b, kb_table(b), zero), k_addr(b, kb_value(b, n->in[0], false), image),
                        k_addr(b, kb_value(b, n->out[0], true), k_mul(b, i, k_int(b, wo * y->c))), p0});
    return 0;
}

int lower_pool(Program *p, const Node *n, Diag *d) {
    bool nhwc = layout_is_nhwc(n), is_max = n->op == OP_MAX_POOL;
    View x = view_of(&p->g->values[n->in[0]].type, nhwc), y = view_of(&p->g->values[n->out[0]].type, nhwc);
    int ns = x.ns;
    int64_t kernel[MAX_SPATIAL], strides[MAX_SPATIAL], pads[2 * MAX_SPATIAL], dil[MAX_SPATIAL] = {1, 1, 1};
    node_ints(n, ATTR_KERNEL, kernel, MAX_SPATIAL, ns);
    node_ints(n, ATTR_STRIDES, strides, MAX_SPATIAL, ns);
    node_ints(n, ATTR_PADS, pads, 2 * MAX_SPATIAL, 2 * ns);
    if (is_max)
        node_ints(n, ATTR_DILATIONS, dil, MAX_SPATIAL, ns);
    if (is_max && nhwc && ns == 2 && x.c > 1 && p->vector_floats > 0)
        return max_pool_rows(p, n, &x, &y, kernel, strides, pads, dil, d);
    bool count_pad = !is_max && node_bool(n, ATTR_COUNT_INCLUDE_PAD);
    int64_t window = lower_flops(ns, kernel); /* at most KILN_MAX_NUMEL (infer_pool) */
    /* channels last: an iteration per output position, over all its channels */
    bool vec = nhwc && x.c > 1;
    View pos = y;
    if (vec)
        pos.c = 1;
    int64_t numel = type_numel(&p->g->values[n->out[0]].type);
    Kernel *k =
        vec ? kernel_loop(p, n, NULL, numel / y.c, grain_for(lower_flops(2, (int64_t[]){window, y.c})), d)
            : loop_over_output(p, n, window, d);
    if (!k)
        return -1;
    kernel_follows(p, k, &p->g->values[n->out[0]].type, k->count, 1, 1); /* position by position */
    KBuilder *b = &k->b;
    int xb = kb_value(b, n->in[0], false), yb = kb_value(b, n->out[0], true);
    KExpr *i = k_var(b, k->iter), *start[MAX_SPATIAL], *in[MAX_SPATIAL];
    Coords at = output_index(b, i, &pos, nhwc);
    for (int s = 0; s < ns; s++)
        start[s] = k_var(b, kb_let(b, kb_name(b, "start", s), KT_I64,
                                   k_sub(b, k_mul(b, at.p[s], k_int(b, strides[s])), k_int(b, pads[s]))));
    KExpr *init = k_f32(b, is_max ? -INFINITY : 0), *acc = NULL, *row_at = NULL;
    int acc_var = -1;
    if (vec) { /* the accumulators are the result's channels, at + q */
        row_at = k_var(b, kb_let(b, "at", KT_I64, k_mul(b, i, k_int(b, y.c))));
        KExpr *q = channel_loop(b, y.c);
        kb_store(b, yb, k_add(b, row_at, q), init);
        kb_end(b);
    } else {
        acc_var = kb_decl(b, "acc", KT_F32, init);
        acc = k_var(b, acc_var);
    }
    KExpr *count = NULL;
    if (!is_max) {
        /* the divisor: the window clipped to the input, or to the padded input */
        count = k_int(b, 1);
        for (int s = 0; s < ns; s++) {
            KExpr *end = k_int(b, count_pad ? x.sp[s] + pads[ns + s] : x.sp[s]);
            KExpr *stop = k_add(b, start[s], k_int(b, kernel[s]));
            KExpr *first = count_pad
                               ? start[s]
                               : k_select(b, k_bin(b, KE_GT, start[s], k_int(b, 0)), start[s], k_int(b, 0));
            count = k_mul(b, count, k_sub(b, k_select(b, k_lt(b, stop, end), stop, end), first));
        }
        count = k_cast(b, KT_F32, k_var(b, kb_let(b, "count", KT_I64, count)));
    }
    for (int s = 0; s < ns; s++) {
        KExpr *tap =
            k_var(b, kb_for(b, kb_name(b, "k", s), KT_I64, k_int(b, 0), k_int(b, kernel[s]), NULL, 0));
        in[s] = k_var(
            b, kb_let(b, kb_name(b, "in", s), KT_I64, k_add(b, start[s], k_mul(b, tap, k_int(b, dil[s])))));
        kb_if(b, k_and(b, k_bin(b, KE_GE, in[s], k_int(b, 0)), k_lt(b, in[s], k_int(b, x.sp[s]))));
    }
    KExpr *from = x_offset(b, &x, &at, in);
    if (vec) {
        KExpr *row = k_var(b, kb_let(b, "row", KT_I64, from));
        KExpr *q = channel_loop(b, y.c);
        KExpr *to = k_add(b, row_at, q), *top = k_load(b, xb, k_add(b, row, q));
        if (is_max) {
            /* both loaded first: a load inside the condition would keep the loop scalar */
            KExpr *v = k_var(b, kb_let(b, "v", KT_F32, top));
            KExpr *m = k_var(b, kb_let(b, "m", KT_F32, k_load(b, yb, to)));
            kb_store(b, yb, to, max_step(b, v, m));
        } else
            kb_store_add(b, yb, to, top);
        kb_end(b);
    } else if (is_max) {
        KExpr *v = k_var(b, kb_let(b, "v", KT_F32, k_load(b, xb, from)));
        kb_assign(b, acc_var, max_step(b, v, acc));
    } else
        kb_accum(b, acc_var, k_load(b, xb, from));
    for (int s = 0; s < 2 * ns; s++)
        kb_end(b);
    if (vec && !is_max) {
        KExpr *q = channel_loop(b, y.c);
        KExpr *to = k_add(b, row_at, q);
        kb_store(b, yb, to, k_div(b, k_load(b, yb, to), count));
        kb_end(b);
    } else if (!vec)
        kb_store(b, yb, i, is_max ? acc : k_div(b, acc, count));
    return 0;
}

/* ---- global_avg_pool ---- */

/* Channels last: the channels in blocks of CHANNEL_BLOCK, each summed position by
 * position into a local array of doubles (so the channel loop is contiguous and
 * vectorizes), in the same order per channel as above. An image of at least
 * SPLIT_WORK elements is summed row by row (its first spatial dim) by a kernel of an
 * iteration per (image, row, block), into the scratch as the double each sum is
 * rounded to a float and the float of the rest; a second kernel adds each channel's
 * rows up in order. Rows split across the threads as the kernel before (a depthwise
 * conv's rows, say) split them, so each thread sums what its own cache holds. */
enum { CHANNEL_BLOCK = 64, SPLIT_WORK = 2 * WORK_PER_THREAD };

/* The local doubles `sum` of channels [c0, c0 + width) of `image` over positions
 * [from, from + positions). */
static int position_sums(KBuilder *b, const Node *n, const View *x, KExpr *image, KExpr *c0, KExpr *width,
                         KExpr *from, int64_t positions) {
    KExpr *zero = k_int(b, 0);
    int sum = kb_array(b, "sum", KT_F64, CHANNEL_BLOCK, 0, false, true);
    KExpr *q = k_var(b, kb_for(b, "q", KT_I64, from, k_add(b, from, k_int(b, positions)), NULL, 0));
    KExpr *row = k_var(
        b, kb_let(b, "row", KT_I64, k_add(b, k_madd(b, image, x->sn, k_mul(b, q, k_int(b, x->c))), c0)));
    KExpr *c = k_var(b, kb_for(b, "c", KT_I64, zero, width, NULL, 0));
    kb_store_add(b, sum, c, k_cast(b, KT_F64, k_load(b, kb_value(b, n->in[0], false), k_add(b, row, c))));
    kb_end(b);
    kb_end(b);
    return sum;
}

/* Iteration i's block of channels: its first channel c0 and its width. */
static void channel_block(KBuilder *b, const View *x, KExpr *block, KExpr **c0, KExpr **width) {
    *c0 = k_var(b, kb_let(b, "c0", KT_I64, k_mul(b, block, k_int(b, CHANNEL_BLOCK))));
    KExpr *left = k_sub(b, k_int(b, x->c), *c0);
    *width =
        k_var(b, kb_let(b, "width", KT_I64,
                        k_select(b, k_lt(b, left, k_int(b, CHANNEL_BLOCK)), left, k_int(b, CHANNEL_BLOCK))));
}

static int global_avg_pool_nhwc(Program *p, const Node *n, const View *x, int64_t count, Diag *d) {
    int64_t blocks = (x->c + CHANNEL_BLOCK - 1) / CHANNEL_BLOCK;
    Kernel *k = kernel_loop(p, n, NULL, x->n * blocks, grain_for(count * CHANNEL_BLOCK), d);
    if (!k)
        return -1;
    kernel_follows(p, k, &p->g->values[n->out[0]].type, k->count, 1, 1); /* image by image */
    KBuilder *b = &k->b;
    KExpr *i = k_var(b, k->iter), *zero = k_int(b, 0), *c0, *width;
    KExpr *image = k_var(b, kb_let(b, "image", KT_I64, k_div(b, i, k_int(b, blocks))));
    channel_block(b, x, k_mod(b, i, k_int(b, blocks)), &c0, &width);
    int sum = position_sums(b, n, x, image, c0, width, zero, count);
    KExpr *c = k_var(b, kb_for(b, "c", KT_I64, zero, width, NULL, 0));
    kb_store(b, kb_value(b, n->out[0], true), k_add(b, k_madd(b, image, x->c, c0), c),
             k_cast(b, KT_F32, k_div(b, k_load(b, sum, c), k_f64(b, (double)count))));
    kb_end(b);
    return 0;
}

static int global_avg_pool_rows(Program *p, const Node *n, const View *x, int64_t count, Diag *d) {
    int64_t blocks = (x->c + CHANNEL_BLOCK - 1) / CHANNEL_BLOCK, rows = x->sp[0], per_row = count / rows;
    int64_t scratch_bytes = (int64_t)sizeof(float) * 2 * x->n * rows * x->c;
    const Type *y = &p->g->values[n->out[0]].type;
    Kernel *k = kernel_loop(p, n, "row_sums", x->n * rows * blocks, grain_for(per_row * CHANNEL_BLOCK), d);
    if (!k)
        return -1;
    kernel_follows(p, k, y, k->count, 1, 1);
    k->scratch_bytes = scratch_bytes;
    KBuilder *b = &k->b;
    KExpr *i = k_var(b, k->iter), *zero = k_int(b, 0), *c0, *width;
    KExpr *item_row = k_var(b, kb_let(b, "item_row", KT_I64, k_div(b, i, k_int(b, blocks))));
    KExpr *image = k_var(b, kb_let(b, "image", KT_I64, k_div(b, item_row, k_int(b, rows))));
    channel_block(b, x, k_mod(b, i, k_int(b, blocks)), &c0, &width);
    KExpr *from = k_mul(b, k_mod(b, item_row, k_int(b, rows)), k_int(b, per_row));
    int sum = position_sums(b, n, x, image, c0, width, from, per_row);
    KExpr *c = k_var(b, kb_for(b, "c", KT_I64, zero, width, NULL, 0));
    KExpr *at =
        k_var(b, kb_let(b, "at", KT_I64, k_mul(b, k_add(b, k_madd(b, item_row, x->c, c0), c), k_int(b, 2))));
    int hi = kb_decl(b, "hi", KT_F32, k_cast(b, KT_F32, k_load(b, sum, c)));
    int scratch = kb_scratch(b);
    kb_store(b, scratch, at, k_var(b, hi));
    kb_store(b, scratch, k_add(b, at, k_int(b, 1)),
             k_cast(b, KT_F32, k_sub(b, k_load(b, sum, c), k_cast(b, KT_F64, k_var(b, hi)))));
    kb_end(b);

    k = kernel_loop(p, n, NULL, x->n * x->c, grain_for(2 * rows), d);
    if (!k)
        return -1;
    kernel_follows(p, k, y, k->count, 1, 1);
    k->scratch_bytes = scratch_bytes;
    b = &k->b;
    i = k_var(b, k->iter);
    scratch = kb_scratch(b);
    /* row r of output i at scratch 2 ((i / c rows + r) c + i % c) */
    KExpr *first = k_var(b, kb_let(b, "first", KT_I64,
                                   k_mul(b,
                                         k_madd(b, k_mul(b, k_div(b, i, k_int(b, x->c)), k_int(b, rows)),
                                                x->c, k_mod(b, i, k_int(b, x->c))),
                                         k_int(b, 2))));
    int total = kb_decl(b, "total", KT_F64, k_f64(b, 0.0));
    KExpr *r = k_var(b, kb_for(b, "r", KT_I64, zero, k_int(b, rows), NULL, 0));
    KExpr *pair = k_var(b, kb_let(b, "pair", KT_I64, k_madd(b, r, 2 * x->c, first)));
    kb_accum(b, total,
             k_add(b, k_cast(b, KT_F64, k_load(b, scratch, pair)),
                   k_cast(b, KT_F64, k_load(b, scratch, k_add(b, pair, k_int(b, 1))))));
    kb_end(b);
    kb_store(b, kb_value(b, n->out[0], true), i,
             k_cast(b, KT_F32, k_div(b, k_var(b, total), k_f64(b, (double)count))));
    return 0;
}

int lower_global_avg_pool(Program *p, const Node *n, Diag *d) {
    bool nhwc = layout_is_nhwc(n);
    View x = view_of(&p->g->values[n->in[0]].type, nhwc);
    int64_t count = 1;
    for (int s = 0; s < x.ns; s++)
        count *= x.sp[s];
    if (nhwc && x.c > 1)
        return x.ns >= 2 && x.sp[0] > 1 && count * x.c >= SPLIT_WORK
                   ? global_avg_pool_rows(p, n, &x, count, d)
                   : global_avg_pool_nhwc(p, n, &x, count, d);
    Kernel *k = loop_over_output(p, n, count, d);
    if (!k)
        return -1;
    KBuilder *b = &k->b;
    KExpr *i = k_var(b, k->iter);
    /* y is [N, C]: iteration i is (b, c) = (i / C, i % C), whose spatial elements are
     * adjacent (or, for one channel, channels last) */
    KExpr *first = k_var(b, kb_let(b, "at", KT_I64, k_mul(b, i, k_int(b, count))));
    int sum = kb_decl(b, "sum", KT_F64, k_f64(b, 0.0));
    KExpr *q = k_var(b, kb_for(b, "q", KT_I64, k_int(b, 0), k_int(b, count), NULL, 0));
    kb_accum(b, sum, k_cast(b, KT_F64, k_load(b, kb_value(b, n->in[0], false), k_add(b, first, q))));
    kb_end(b);
    kb_store(b, kb_value(b, n->out[0], true), i,
             k_cast(b, KT_F32, k_div(b, k_var(b, sum), k_f64(b, (double)count))));
    return 0;
}

/* ---- adaptive_avg_pool ---- */

int lower_adaptive_avg_pool(Program *p, const Node *n, Diag *d) {
    bool nhwc = layout_is_nhwc(n);
    View x = view_of(&p->g->values[n->in[0]].type, nhwc), y = view_of(&p->g->values[n->out[0]].type, nhwc);
    int ns = x.ns;
    int64_t window = 1;
    for (int s = 0; s < ns; s++)
        window *= (x.sp[s] + y.sp[s] - 1) / y.sp[s] + 1;
    Kernel *k = loop_over_output(p, n, window, d);
    if (!k)
        return -1;
    KBuilder *b = &k->b;
    KExpr *i = k_var(b, k->iter), *start[KILN_MAX_RANK], *end[KILN_MAX_RANK], *in[KILN_MAX_RANK] = {0};
    Coords at = output_index(b, i, &y, nhwc);
    int acc = kb_decl(b, "acc", KT_F32, k_f32(b, 0));
    KExpr *count = k_int(b, 1);
    for (int s = 0; s < ns; s++) {
        int64_t from = x.sp[s], to = y.sp[s];
        start[s] = k_var(b, kb_let(b, kb_name(b, "start", s), KT_I64,
                                   k_div(b, k_mul(b, at.p[s], k_int(b, from)), k_int(b, to))));
        KExpr *stop = k_add(b, k_mul(b, k_add(b, at.p[s], k_int(b, 1)), k_int(b, from)), k_int(b, to - 1));
        end[s] = k_var(b, kb_let(b, kb_name(b, "end", s), KT_I64, k_div(b, stop, k_int(b, to))));
        count = k_mul(b, count, k_sub(b, end[s], start[s]));
    }
    count = k_var(b, kb_let(b, "count", KT_I64, count));
    for (int s = 0; s < ns; s++)
        in[s] = k_var(b, kb_for(b, kb_name(b, "in", s), KT_I64, start[s], end[s], NULL, 0));
    kb_accum(b, acc, k_load(b, kb_value(b, n->in[0], false), x_offset(b, &x, &at, in)));
    for (int s = 0; s < ns; s++)
        kb_end(b);
    kb_store(b, kb_value(b, n->out[0], true), i, k_div(b, k_var(b, acc), k_cast(b, KT_F32, count)));
    return 0;
}
