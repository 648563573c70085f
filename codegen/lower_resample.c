/* Lowering of resize and interpolate, and of their gradients.
 *
 * A resampling is a short list of 1-D passes, one per axis it changes (see
 * ir/op_resize.c, whose resample_plan also drives the interpreter, so both use the
 * same indices and weights). Each pass is one LOOP kernel whose index and weight
 * tables are computed now and stored in the weights blob (int32 indices, then float
 * weights, `taps` per output position); the data is seen as [outer, len, inner]:
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

/* Where a pass reads or writes: a value, or a scratch region. */
typedef struct {
    char name[96];
} Place;

static Place place_value(const Program *p, int v) {
    Place s;
    snprintf(s.name, sizeof s.name, "%s", value_name(p, v));
    return s;
}

static Place place_scratch(int region, int64_t region_floats) {
    Place s;
    snprintf(s.name, sizeof s.name, "(scratch + %lld)", (long long)(region * region_floats));
    return s;
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

/* Emits `lhs = sum_j WEIGHT_j * TAP_j;`, TAP_j and WEIGHT_j being the texts `tap`
 * and `weight` with j for %1$d and j * out_len for %2$lld; a selection copies TAP_0. */
static void emit_sum(Str *s, const ResampleAxis *a, const char *lhs, const char *tap, const char *weight) {
    bool copy = is_selection(a);
    str_printf(s, "%s = ", lhs);
    for (int j = 0; j < (copy ? 1 : a->taps); j++) {
        char t[96], w[96];
        long long at = (long long)j * a->out_len;
        snprintf(t, sizeof t, tap, j, at);
        snprintf(w, sizeof w, weight, j, at);
        if (copy)
            str_printf(s, "%s", t);
        else
            str_printf(s, "%s%s * %s", j ? " + " : "", w, t);
    }
    str_printf(s, ";\n");
}

/* A pass's kernel (forward or adjoint) with its tables. */
static Kernel *pass_kernel(Program *p, const Node *n, const ResampleAxis *a, bool first, bool last,
                           int64_t scratch_bytes, Diag *d) {
    char what[32];
    snprintf(what, sizeof what, "axis%d", a->axis);
    Kernel *k = kernel_new(p, n, K_LOOP, what);
    if (!k) {
        diag_error(d, n->loc, "out of memory");
        return NULL;
    }
    if (first)
        kernel_reads(k, n->in[0]);
    if (last)
        kernel_writes(k, n->out[0]);
    k->scratch_bytes = scratch_bytes;
    if (store_tables(p, k, a, d))
        return NULL;
    str_printf(&k->body, "const int32_t *index = (const int32_t *)table;\nconst float *weight = table + %lld;\n",
               (long long)(a->out_len * a->taps));
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

/* Emits the statements computing dst[o] for o in [from, to) from the tables. */
static void emit_gather(Str *s, const ResampleAxis *a, const char *from, const char *to, const char *e) {
    long long out_len = a->out_len;
    if (a->taps > 4) {
        str_printf(s,
                   "for (int64_t o = %s; o < %s; o++) {\n"
                   "    float sum = 0.0f;\n"
                   "    for (int64_t j = 0; j < %d; j++)\n"
                   "        sum += weight[j * %lld + o] * src[index[j * %lld + o]];\n"
                   "    dst[o] = sum;\n}\n",
                   from, to, a->taps, out_len, out_len);
        return;
    }
    str_printf(s, "for (int64_t o = %s; o < %s; o++)\n    ", from, to);
    if (has_outside(a))
        str_printf(s, "if (index[o] < 0)\n        dst[o] = %s;\n    else\n        ", e);
    emit_sum(s, a, "dst[o]", "src[index[%2$lld + o]]", "weight[%2$lld + o]");
}

/* Emits the repeating part: per statements per period, constants baked in. */
static void emit_period(Str *s, const ResampleAxis *a, const Period *q) {
    str_printf(s,
               "for (int64_t p = %lld; p < %lld; p++) {\n"
               "    const float *in = src + p * %lld;\n    float *out = dst + p * %d;\n",
               (long long)q->p0, (long long)q->p1, (long long)q->step, q->per);
    bool copy = is_selection(a);
    for (int r = 0; r < q->per; r++) {
        str_printf(s, "    out[%d] = ", r);
        for (int j = 0; j < (copy ? 1 : a->taps); j++) {
            char w[40];
            float_literal(q->weight[r][j], w, sizeof w);
            if (copy)
                str_printf(s, "in[%lld]", (long long)q->offset[r][j]);
            else
                str_printf(s, "%s%s * in[%lld]", j ? " + " : "", w, (long long)q->offset[r][j]);
        }
        str_printf(s, ";\n");
    }
    str_printf(s, "}\n");
}

/* y[b, o, q] = sum_j w[j, o] x[b, index[j, o], q], or the extrapolation value where
 * o lies outside. */
static int forward_pass(Program *p, const Node *n, const ResampleAxis *a, int64_t outer, int64_t inner,
                        double extrapolation, const Place *from, const Place *to, bool first, bool last,
                        int64_t scratch_bytes, Diag *d) {
    Kernel *k = pass_kernel(p, n, a, first, last, scratch_bytes, d);
    if (!k)
        return -1;
    long long in_len = a->in_len, out_len = a->out_len, taps = a->taps, in = inner;
    char e[40];
    float_literal(extrapolation, e, sizeof e);
    bool outside = has_outside(a);
    Str *s = &k->body;
    if (inner == 1) {
        k->count = outer;
        k->grain = grain_for(a->out_len * a->taps);
        str_printf(s, "const float *src = %s + i * %lld;\nfloat *dst = %s + i * %lld;\n", from->name, in_len,
                   to->name, out_len);
        Period q;
        if (!find_period(a, &q)) {
            char end[24];
            snprintf(end, sizeof end, "%lld", out_len);
            emit_gather(s, a, "0", end, e);
            return 0;
        }
        char lo[24], hi[24], end[24];
        snprintf(lo, sizeof lo, "%lld", (long long)(q.p0 * q.per));
        snprintf(hi, sizeof hi, "%lld", (long long)(q.p1 * q.per));
        snprintf(end, sizeof end, "%lld", out_len);
        emit_gather(s, a, "0", lo, e);
        emit_period(s, a, &q);
        emit_gather(s, a, hi, end, e);
        return 0;
    }
    k->count = outer * a->out_len;
    k->grain = grain_for(inner * a->taps);
    str_printf(s, "int64_t b = i / %lld, o = i %% %lld;\nconst float *src = %s + b * %lld;\nfloat *dst = %s + i * %lld;\n",
               out_len, out_len, from->name, in_len * in, to->name, in);
    if (outside)
        str_printf(s, "if (index[o] < 0) {\n    for (int64_t q = 0; q < %lld; q++)\n        dst[q] = %s;\n} else {\n",
                   in, e);
    if (taps > 4) {
        str_printf(s,
                   "for (int64_t q = 0; q < %lld; q++)\n    dst[q] = 0.0f;\n"
                   "for (int64_t j = 0; j < %lld; j++) {\n"
                   "    const float *row = src + index[j * %lld + o] * %lld;\n"
                   "    float w = weight[j * %lld + o];\n"
                   "    for (int64_t q = 0; q < %lld; q++)\n        dst[q] += w * row[q];\n}\n",
                   in, taps, out_len, in, out_len, in);
    } else {
        int used = is_selection(a) ? 1 : a->taps;
        for (int j = 0; j < used; j++)
            str_printf(s, "const float *row%d = src + index[%lld + o] * %lld;\nfloat w%d = weight[%lld + o];\n", j,
                       j * out_len, in, j, j * out_len);
        str_printf(s, "for (int64_t q = 0; q < %lld; q++)\n    ", in);
        emit_sum(s, a, "dst[q]", "row%1$d[q]", "w%1$d");
    }
    if (outside)
        str_printf(s, "}\n");
    return 0;
}

/* The adjoint: dx[b, index[j, o], q] += w[j, o] dy[b, o, q], one outer slab per
 * iteration. */
static int adjoint_pass(Program *p, const Node *n, const ResampleAxis *a, int64_t outer, int64_t inner,
                        const Place *from, const Place *to, bool first, bool last, int64_t scratch_bytes, Diag *d) {
    Kernel *k = pass_kernel(p, n, a, first, last, scratch_bytes, d);
    if (!k)
        return -1;
    long long in_len = a->in_len, out_len = a->out_len, taps = a->taps, in = inner;
    k->count = outer;
    k->grain = grain_for(a->out_len * a->taps * inner);
    Str *s = &k->body;
    str_printf(s,
               "const float *src = %s + i * %lld;\nfloat *dst = %s + i * %lld;\n"
               "for (int64_t e = 0; e < %lld; e++)\n    dst[e] = 0.0f;\n"
               "for (int64_t o = 0; o < %lld; o++)\n"
               "    for (int64_t j = 0; j < %lld; j++) {\n"
               "        int32_t at = index[j * %lld + o];\n"
               "        float w = weight[j * %lld + o];\n",
               from->name, out_len * in, to->name, in_len * in, in_len * in, out_len, taps, out_len, out_len);
    if (has_outside(a))
        str_printf(s, "        if (at < 0)\n            continue;\n");
    if (inner == 1)
        str_printf(s, "        dst[at] += w * src[o];\n    }\n");
    else
        str_printf(s,
                   "        float *row = dst + at * %lld;\n"
                   "        const float *g = src + o * %lld;\n"
                   "        for (int64_t q = 0; q < %lld; q++)\n            row[q] += w * g[q];\n    }\n",
                   in, in, in);
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
    str_printf(&k->body, "%s[i] = ", value_name(p, n->out[0]));
    str_printf(&k->body, "%s[i];\n", value_name(p, n->in[0]));
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
        Place from = first ? place_value(p, n->in[0]) : place_scratch((step - 1) % 2, region);
        Place to = last ? place_value(p, n->out[0]) : place_scratch(step % 2, region);
        int64_t outer, inner;
        resample_pass_shape(&r, x, pass, &outer, &inner);
        rc = adjoint ? adjoint_pass(p, n, &r.axes[pass], outer, inner, &from, &to, first, last, scratch_bytes, d)
                     : forward_pass(p, n, &r.axes[pass], outer, inner, r.extrapolation, &from, &to, first, last,
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
