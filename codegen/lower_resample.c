/* Lowering of resize and interpolate, and of their gradients.
 *
 * A resampling is a short list of 1-D passes, one per axis it changes (see
 * ir/op_resize.c, whose resample_plan also drives the interpreter, so both use the
 * same indices and weights). Each pass is one LOOP kernel, built as kernel IR, whose
 * index and weight tables are computed now and stored in the weights blob (int32
 * indices, then float weights, `taps` per output position, read through the
 * kernel's table as ints and as floats); the data is seen as [outer, len, inner]:
 *   - inner > 1: one iteration per output row of `inner` contiguous elements, a
 *     weighted sum of `taps` input rows that vectorizes;
 *   - inner = 1 (the last axis): one iteration per outer row, each output element
 *     gathering its taps.
 * Passes between the first and the last go through the node's scratch, two regions
 * used in turn. The gradient runs the adjoint passes in the opposite order: each
 * iteration (an outer slab) clears its part of dx and adds every output's share to
 * the inputs it read, so iterations never write the same element. */
#include "codegen.h"

#include <string.h>

enum { WORK_PER_THREAD = 16384 };

/* Where a pass reads or writes: a value, or a region of the node's scratch. */
typedef struct {
    int value;      /* the value, or -1: scratch */
    int64_t offset; /* scratch: the region's first float */
} Place;

static Place place_value(int v) {
    return (Place){v, 0};
}

static Place place_scratch(int region, int64_t region_floats) {
    return (Place){-1, region * region_floats};
}

static int place_buf(KBuilder *b, const Place *s, bool writable) {
    return s->value >= 0 ? kb_value(b, s->value, writable) : kb_scratch(b);
}

/* Lets NAME = where row `at` of s starts, its rows `stride` elements apart. */
static KExpr *let_start(KBuilder *b, const char *name, const Place *s, KExpr *at, int64_t stride) {
    return k_var(b, kb_let(b, name, KT_I64, k_add(b, k_int(b, s->offset), k_mul(b, at, k_int(b, stride)))));
}

/* Opens for (NAME = lo; NAME < hi; NAME++); returns NAME. */
static KExpr *open_loop(KBuilder *b, const char *name, int64_t lo, int64_t hi) {
    return k_var(b, kb_for(b, name, KT_I64, k_int(b, lo), k_int(b, hi), NULL, 0));
}

/* Stores axis a's tables as the kernel's table: int32 indices, then float weights,
 * tap-major (tap j of position o at j * out_len + o), so that a loop over positions
 * reads each table contiguously. */
static int store_tables(Program *p, Kernel *k, const ResampleAxis *a, Diag *d) {
    int64_t count = a->out_len * a->taps;
    if (a->in_len > INT32_MAX)
        return diag_error(d, k->node->loc, "%s: an axis of %lld elements is too long to compile",
                          op_table[k->node->op].name, (long long)a->in_len);
    unsigned char *t = ir_malloc((size_t)count * 8 + 1);
    if (!t)
        return diag_error(d, k->node->loc, "out of memory");
    for (int64_t o = 0; o < a->out_len; o++)
        for (int j = 0; j < a->taps; j++) {
            int64_t i = j * a->out_len + o;
            int32_t at = (int32_t)a->index[o * a->taps + j];
            float w = (float)a->weight[o * a->taps + j];
            memcpy(t + 4 * i, &at, 4);
            memcpy(t + 4 * (count + i), &w, 4);
        }
    int rc = program_table(p, k, t, count * 8, d);
    ir_free(t);
    return rc;
}

static bool has_outside(const ResampleAxis *a) {
    for (int64_t o = 0; o < a->out_len; o++)
        if (a->index[o * a->taps] < 0)
            return true;
    return false;
}

/* Whether each position takes one input whole (nearest, windows of one): a copy. */
static bool is_selection(const ResampleAxis *a) {
    for (int64_t i = 0; i < a->out_len * a->taps; i++)
        if (a->weight[i] != (i % a->taps == 0) && a->index[i - i % a->taps] >= 0)
            return false;
    return true;
}

/* A pass's kernel as it is built: the axis, the table as indices and as weights,
 * and the buffers it reads and writes. */
typedef struct {
    KBuilder *b;
    const ResampleAxis *a;
    int index, weight, src, dst;
} Pass;

/* Tap j's input index (an int32) for output position o, and its weight. */
static KExpr *tap_index(const Pass *s, KExpr *j, KExpr *o) {
    KBuilder *b = s->b;
    return k_load(b, s->index, k_add(b, k_mul(b, j, k_int(b, s->a->out_len)), o));
}

static KExpr *tap_weight(const Pass *s, KExpr *j, KExpr *o) {
    KBuilder *b = s->b;
    int64_t weights = s->a->out_len * s->a->taps; /* after the indices */
    return k_load(b, s->weight,
                  k_add(b, k_add(b, k_int(b, weights), k_mul(b, j, k_int(b, s->a->out_len))), o));
}

/* An int32 index as a term of int64_t index arithmetic. */
static KExpr *wide(KBuilder *b, KExpr *index) {
    return k_cast(b, KT_I64, index);
}

/* sum_j w[j] * tap[j] over the axis's taps, left to right; a selection copies tap[0]. */
static KExpr *weighted_sum(KBuilder *b, const ResampleAxis *a, KExpr *const *w, KExpr *const *tap) {
    if (is_selection(a))
        return tap[0];
    KExpr *sum = NULL;
    for (int j = 0; j < a->taps; j++) {
        KExpr *term = k_mul(b, w[j], tap[j]);
        sum = sum ? k_add(b, sum, term) : term;
    }
    return sum;
}

/* A pass's kernel (forward or adjoint) with its tables, reading `from` and writing `to`. */
static Kernel *pass_kernel(Program *p, const Node *n, const ResampleAxis *a, int64_t scratch_bytes,
                           const Place *from, const Place *to, Pass *s, Diag *d) {
    char what[32];
    snprintf(what, sizeof what, "axis%d", a->axis);
    Kernel *k = kernel_new(p, n, K_LOOP, what);
    if (!k) {
        diag_error(d, n->loc, "out of memory");
        return NULL;
    }
    if (from->value >= 0)
        kernel_reads(k, from->value);
    if (to->value >= 0)
        kernel_writes(k, to->value);
    k->scratch_bytes = scratch_bytes;
    if (store_tables(p, k, a, d))
        return NULL;
    KBuilder *b = &k->b;
    *s = (Pass){b, a, kb_table_of(b, KT_I32), kb_table(b), place_buf(b, from, false), place_buf(b, to, true)};
    return k;
}

static int64_t grain_for(int64_t work) {
    return work >= WORK_PER_THREAD ? 1 : WORK_PER_THREAD / work;
}

/* Where an axis's taps repeat: from period p0 to p1 (exclusive), the `per` positions
 * p * per + r read the inputs p * step + offset[r][j] with weights weight[r][j]. A
 * ratio of small integers (2x up, 2x down, 3/2) repeats over all but the edges,
 * where clamping breaks the pattern; the last-axis pass then computes the repeating
 * part with constant weights and offsets, which vectorizes, and the edges from the
 * tables. */
enum { MAX_PERIOD = 8 };
typedef struct {
    int per;
    int64_t step, p0, p1;
    int64_t offset[MAX_PERIOD][4];
    double weight[MAX_PERIOD][4];
} Period;

static bool period_matches(const ResampleAxis *a, const Period *q, int64_t p) {
    for (int r = 0; r < q->per; r++)
        for (int j = 0; j < a->taps; j++) {
            int64_t o = p * q->per + r;
            if (a->index[o * a->taps + j] != p * q->step + q->offset[r][j] ||
                a->weight[o * a->taps + j] != q->weight[r][j] || a->index[o * a->taps] < 0)
                return false;
        }
    return true;
}

/* The repeating pattern covering most of the axis, if any. */
static bool find_period(const ResampleAxis *a, Period *q) {
    if (a->taps > 4)
        return false;
    for (int per = 1; per <= MAX_PERIOD; per++) {
        int64_t periods = a->out_len / per, mid = periods / 2;
        if (periods < 8)
            return false;
        q->per = per;
        q->step = a->index[(mid + 1) * per * a->taps] - a->index[mid * per * a->taps];
        for (int r = 0; r < per; r++)
            for (int j = 0; j < a->taps; j++) {
                int64_t o = mid * per + r;
                q->offset[r][j] = a->index[o * a->taps + j] - mid * q->step;
                q->weight[r][j] = a->weight[o * a->taps + j];
            }
        for (q->p0 = mid; q->p0 > 0 && period_matches(a, q, q->p0 - 1); q->p0--)
            ;
        for (q->p1 = mid; q->p1 < periods && period_matches(a, q, q->p1); q->p1++)
            ;
        if (q->p1 - q->p0 >= periods / 2)
            return true;
    }
    return false;
}

/* e + c, written e - |c| for a negative c. */
static KExpr *plus(KBuilder *b, KExpr *e, int64_t c) {
    return c < 0 ? k_sub(b, e, k_int(b, -c)) : k_add(b, e, k_int(b, c));
}

/* The statements computing dst[o] for o in [from, to) from the tables, the row of
 * src starting at src_at and that of dst at dst_at; e: the extrapolation value. */
static void gather(const Pass *s, int64_t from, int64_t to, KExpr *src_at, KExpr *dst_at, KExpr *e) {
    KBuilder *b = s->b;
    const ResampleAxis *a = s->a;
    if (from >= to)
        return;
    KExpr *o = open_loop(b, "o", from, to);
    if (a->taps > 4) {
        int sum = kb_decl(b, "sum", KT_F32, k_f32(b, 0));
        KExpr *j = open_loop(b, "j", 0, a->taps);
        KExpr *tap = k_load(b, s->src, k_add(b, src_at, wide(b, tap_index(s, j, o))));
        kb_accum(b, sum, k_mul(b, tap_weight(s, j, o), tap));
        kb_end(b);
        kb_store(b, s->dst, k_add(b, dst_at, o), k_var(b, sum));
        kb_end(b);
        return;
    }
    if (has_outside(a)) {
        kb_if(b, k_lt(b, tap_index(s, k_int(b, 0), o), k_i32(b, 0)));
        kb_store(b, s->dst, k_add(b, dst_at, o), e);
        kb_else(b);
    }
    KExpr *w[4], *tap[4];
    for (int j = 0; j < a->taps; j++) {
        w[j] = tap_weight(s, k_int(b, j), o);
        tap[j] = k_load(b, s->src, k_add(b, src_at, wide(b, tap_index(s, k_int(b, j), o))));
    }
    kb_store(b, s->dst, k_add(b, dst_at, o), weighted_sum(b, a, w, tap));
    if (has_outside(a))
        kb_end(b);
    kb_end(b);
}

/* The repeating part: per statements per period, constants baked in. */
static void periodic(const Pass *s, const Period *q, KExpr *src_at, KExpr *dst_at) {
    KBuilder *b = s->b;
    const ResampleAxis *a = s->a;
    KExpr *p = open_loop(b, "p", q->p0, q->p1);
    KExpr *in = k_var(b, kb_let(b, "in", KT_I64, k_add(b, src_at, k_mul(b, p, k_int(b, q->step)))));
    KExpr *out = k_var(b, kb_let(b, "out", KT_I64, k_add(b, dst_at, k_mul(b, p, k_int(b, q->per)))));
    for (int r = 0; r < q->per; r++) {
        KExpr *w[4], *tap[4];
        for (int j = 0; j < a->taps; j++) {
            w[j] = k_f32(b, q->weight[r][j]);
            tap[j] = k_load(b, s->src, plus(b, in, q->offset[r][j]));
        }
        kb_store(b, s->dst, plus(b, out, r), weighted_sum(b, a, w, tap));
    }
    kb_end(b);
}

/* Names of the taps' rows and weights in a pass over rows. */
static const char *const row_names[4] = {"row0", "row1", "row2", "row3"};
static const char *const weight_names[4] = {"w0", "w1", "w2", "w3"};

/* y[b, o, q] = sum_j w[j, o] x[b, index[j, o], q], or the extrapolation value where
 * o lies outside. */
static int forward_pass(Program *p, const Node *n, const ResampleAxis *a, int64_t outer, int64_t inner,
                        double extrapolation, const Place *from, const Place *to, int64_t scratch_bytes,
                        Diag *d) {
    Pass s;
    Kernel *k = pass_kernel(p, n, a, scratch_bytes, from, to, &s, d);
    if (!k)
        return -1;
    KBuilder *b = s.b;
    KExpr *i = k_var(b, k->iter), *e = k_f32(b, extrapolation);
    int64_t in_len = a->in_len, out_len = a->out_len;
    if (inner == 1) {
        k->count = outer;
        k->grain = grain_for(a->out_len * a->taps);
        KExpr *src = let_start(b, "src", from, i, in_len);
        KExpr *dst = let_start(b, "dst", to, i, out_len);
        Period q;
        if (!find_period(a, &q)) {
            gather(&s, 0, out_len, src, dst, e);
            return 0;
        }
        gather(&s, 0, q.p0 * q.per, src, dst, e);
        periodic(&s, &q, src, dst);
        gather(&s, q.p1 * q.per, out_len, src, dst, e);
        return 0;
    }
    k->count = outer * a->out_len;
    k->grain = grain_for(inner * a->taps);
    KExpr *bo = k_var(b, kb_let(b, "b", KT_I64, k_div(b, i, k_int(b, out_len))));
    KExpr *o = k_var(b, kb_let(b, "o", KT_I64, k_mod(b, i, k_int(b, out_len))));
    KExpr *src = let_start(b, "src", from, bo, in_len * inner);
    KExpr *dst = let_start(b, "dst", to, i, inner);
    bool outside = has_outside(a);
    if (outside) {
        kb_if(b, k_lt(b, tap_index(&s, k_int(b, 0), o), k_i32(b, 0)));
        KExpr *q = open_loop(b, "q", 0, inner);
        kb_store(b, s.dst, k_add(b, dst, q), e);
        kb_end(b);
        kb_else(b);
    }
    if (a->taps > 4) {
        KExpr *q = open_loop(b, "q", 0, inner);
        kb_store(b, s.dst, k_add(b, dst, q), k_f32(b, 0));
        kb_end(b);
        KExpr *j = open_loop(b, "j", 0, a->taps);
        KExpr *row = k_var(b, kb_let(b, "row", KT_I64,
                                     k_add(b, src, k_mul(b, wide(b, tap_index(&s, j, o)), k_int(b, inner)))));
        KExpr *w = k_var(b, kb_let(b, "w", KT_F32, tap_weight(&s, j, o)));
        q = open_loop(b, "q", 0, inner);
        kb_store_add(b, s.dst, k_add(b, dst, q), k_mul(b, w, k_load(b, s.src, k_add(b, row, q))));
        kb_end(b);
        kb_end(b);
    } else {
        int used = is_selection(a) ? 1 : a->taps;
        KExpr *row[4], *w[4], *tap[4];
        for (int j = 0; j < used; j++) {
            KExpr *first_row =
                k_add(b, src, k_mul(b, wide(b, tap_index(&s, k_int(b, j), o)), k_int(b, inner)));
            row[j] = k_var(b, kb_let(b, row_names[j], KT_I64, first_row));
            w[j] = k_var(b, kb_let(b, weight_names[j], KT_F32, tap_weight(&s, k_int(b, j), o)));
        }
        KExpr *q = open_loop(b, "q", 0, inner);
        for (int j = 0; j < used; j++)
            tap[j] = k_load(b, s.src, k_add(b, row[j], q));
        kb_store(b, s.dst, k_add(b, dst, q), weighted_sum(b, a, w, tap));
        kb_end(b);
    }
    if (outside)
        kb_end(b);
    return 0;
}

/* The adjoint: dx[b, index[j, o], q] += w[j, o] dy[b, o, q], one outer slab per
 * iteration. */
static int adjoint_pass(Program *p, const Node *n, const ResampleAxis *a, int64_t outer, int64_t inner,
                        const Place *from, const Place *to, int64_t scratch_bytes, Diag *d) {
    Pass s;
    Kernel *k = pass_kernel(p, n, a, scratch_bytes, from, to, &s, d);
    if (!k)
        return -1;
    int64_t in_len = a->in_len, out_len = a->out_len;
    k->count = outer;
    k->grain = grain_for(a->out_len * a->taps * inner);
    KBuilder *b = s.b;
    KExpr *i = k_var(b, k->iter);
    KExpr *src = let_start(b, "src", from, i, out_len * inner);
    KExpr *dst = let_start(b, "dst", to, i, in_len * inner);
    KExpr *e = open_loop(b, "e", 0, in_len * inner);
    kb_store(b, s.dst, k_add(b, dst, e), k_f32(b, 0));
    kb_end(b);
    KExpr *o = open_loop(b, "o", 0, out_len);
    KExpr *j = open_loop(b, "j", 0, a->taps);
    KExpr *at = k_var(b, kb_let(b, "at", KT_I32, tap_index(&s, j, o)));
    KExpr *w = k_var(b, kb_let(b, "w", KT_F32, tap_weight(&s, j, o)));
    bool outside = has_outside(a);
    if (outside) /* a position outside the input took no input */
        kb_if(b, k_bin(b, KE_GE, at, k_i32(b, 0)));
    if (inner == 1)
        kb_store_add(b, s.dst, k_add(b, dst, wide(b, at)), k_mul(b, w, k_load(b, s.src, k_add(b, src, o))));
    else {
        KExpr *row =
            k_var(b, kb_let(b, "row", KT_I64, k_add(b, dst, k_mul(b, wide(b, at), k_int(b, inner)))));
        KExpr *g = k_var(b, kb_let(b, "g", KT_I64, k_add(b, src, k_mul(b, o, k_int(b, inner)))));
        KExpr *q = open_loop(b, "q", 0, inner);
        kb_store_add(b, s.dst, k_add(b, row, q), k_mul(b, w, k_load(b, s.src, k_add(b, g, q))));
        kb_end(b);
    }
    if (outside)
        kb_end(b);
    kb_end(b);
    kb_end(b);
    return 0;
}

/* No axis changes: a copy. */
static int copy_kernel(Program *p, const Node *n, Diag *d) {
    Kernel *k = kernel_new(p, n, K_LOOP, "copy");
    if (!k)
        return diag_error(d, n->loc, "out of memory");
    kernel_reads(k, n->in[0]);
    kernel_writes(k, n->out[0]);
    k->count = type_numel(&p->g->values[n->out[0]].type);
    k->grain = WORK_PER_THREAD;
    KBuilder *b = &k->b;
    KExpr *i = k_var(b, k->iter);
    kb_store(b, kb_value(b, n->out[0], true), i, k_load(b, kb_value(b, n->in[0], false), i));
    return 0;
}

/* The passes of node n (adjoint: its gradient's), from n->in[0] to n->out[0]. */
static int lower_passes(Program *p, const Node *n, const Type *x, const Type *y, bool adjoint, Diag *d) {
    Resampling r;
    if (resample_plan(n, x, y, &r))
        return diag_error(d, n->loc, "out of memory");
    if (r.n_axes == 0)
        return copy_kernel(p, n, d);
    int64_t region = 0; /* floats of the largest value between two passes */
    for (int i = 0; i + 1 < r.n_axes; i++) {
        int64_t outer, inner;
        resample_pass_shape(&r, x, i, &outer, &inner);
        int64_t size = outer * r.axes[i].out_len * inner;
        region = size > region ? size : region;
    }
    int64_t scratch_bytes = (r.n_axes > 2 ? 2 : 1) * region * (int64_t)sizeof(float);
    int rc = 0;
    for (int step = 0; step < r.n_axes && rc == 0; step++) {
        int pass = adjoint ? r.n_axes - 1 - step : step;
        bool first = step == 0, last = step == r.n_axes - 1;
        Place from = first ? place_value(n->in[0]) : place_scratch((step - 1) % 2, region);
        Place to = last ? place_value(n->out[0]) : place_scratch(step % 2, region);
        int64_t outer, inner;
        resample_pass_shape(&r, x, pass, &outer, &inner);
        rc = adjoint ? adjoint_pass(p, n, &r.axes[pass], outer, inner, &from, &to, scratch_bytes, d)
                     : forward_pass(p, n, &r.axes[pass], outer, inner, r.extrapolation, &from, &to,
                                    scratch_bytes, d);
    }
    resample_free(&r);
    return rc;
}

int lower_resample(Program *p, const Node *n, Diag *d) {
    const Graph *g = p->g;
    return lower_passes(p, n, &g->values[n->in[0]].type, &g->values[n->out[0]].type, false, d);
}

int lower_resample_grad(Program *p, const Node *n, Diag *d) {
    const Graph *g = p->g;
    return lower_passes(p, n, &g->values[n->in[1]].type, &g->values[n->in[0]].type, true, d);
}
