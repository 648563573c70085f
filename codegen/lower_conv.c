/* Lowering of conv and conv_transpose, in either layout, with 1 to 3 spatial dims.
 *
 * A conv is a GEMM over a column matrix ("im2col"). A LOOP kernel gathers, into the
 * kernel scratch, every input element each output position sees (zeros for padding,
 * dilations in the index arithmetic); a CALL kernel then runs cblas_sgemm per batch
 * item and group, and adds the bias to each output tile right after its GEMM.
 *   - nchw: per batch item, cols is [C * taps, positions], each group's rows
 *     (c, k...) in the weight's order [O, C/g, k...]; y[b][g] = w[g] x cols[b][g].
 *   - nhwc: cols is [N * positions, groups, taps, C/g], each group's columns in the
 *     weight's order [O, k..., C/g]; y[:, g] = cols[:, g] x w[g]^T, already nhwc.
 * A 1x1 conv with stride 1 and no pads needs no column matrix: the input is one. A
 * 3x3 conv with stride 1 and enough channels, channels last, is Winograd's
 * F(2x2, 3x3) instead (lower_winograd.c).
 * A depthwise conv (one input channel per group) would be thousands of tiny GEMMs,
 * so it is a direct LOOP, one iteration per row of outputs along the last spatial
 * dim, adding each tap's weight times the input over the part of the row whose
 * input lies inside x (im2col fills its rows with the same bounds, so neither tests
 * padding per element). conv_transpose is a GEMM giving each input position's
 * contribution through every tap, and a gather summing them per output element
 * (a direct LOOP when groups have one input channel); conv_weight_grad is GEMMs of
 * the gradient against the same column matrix of x that its conv uses.
 * fused_conv is a conv whose kernels finish each tile of the result, while it is
 * still in cache, with its epilogue expression (relu, clip, a residual add, ...),
 * where a conv adds only its bias; its other inputs have the result's type or one
 * element, so each is read at the offset of the element being finished.
 * The GEMM and depthwise kernels count their FLOPs (2 per multiply-add) for kiln
 * bench. */
#include "codegen.h"
#include "../ir/ops_impl.h"

#include <limits.h>
#include <string.h>

enum { MAX_SPATIAL = 3, WORK_PER_THREAD = 16384 };

/* A conv node's views and attributes. */
typedef struct {
    bool nhwc;
    int ns;
    View x, w, y;
    int64_t strides[MAX_SPATIAL], pads[2 * MAX_SPATIAL], dilations[MAX_SPATIAL], groups;
    int64_t taps;                        /* kernel elements per channel */
    int64_t positions;                   /* output elements per channel and batch item */
    char xn[80], wn[80], bn[80], yn[80]; /* value names; bn empty without bias */
    const Node *node;
    const Expr *epilogue; /* fused_conv's expr, else NULL */
} Conv;

/* The conv of node n with input x, weight w and result y (for conv_weight_grad: x,
 * its result, and dy in the place of the conv's result). */
static Conv conv_views(const Program *p, const Node *n, int x, int w, int y) {
    const Graph *g = p->g;
    Conv c = {.nhwc = layout_is_nhwc(n), .node = n};
    c.x = view_of(&g->values[x].type, c.nhwc);
    c.w = view_of(&g->values[w].type, c.nhwc);
    c.y = view_of(&g->values[y].type, c.nhwc);
    c.ns = c.x.ns;
    node_ints(n, ATTR_STRIDES, c.strides, MAX_SPATIAL, c.ns);
    node_ints(n, ATTR_PADS, c.pads, 2 * MAX_SPATIAL, 2 * c.ns);
    node_ints(n, ATTR_DILATIONS, c.dilations, MAX_SPATIAL, c.ns);
    c.groups = node_int(n, ATTR_GROUPS);
    c.taps = c.positions = 1;
    for (int s = 0; s < c.ns; s++) {
        c.taps *= c.w.sp[s];
        c.positions *= c.y.sp[s];
    }
    snprintf(c.xn, sizeof c.xn, "%s", value_name(p, x));
    snprintf(c.wn, sizeof c.wn, "%s", value_name(p, w));
    snprintf(c.yn, sizeof c.yn, "%s", value_name(p, y));
    if (n->n_in > 2 && n->in[2] >= 0)
        snprintf(c.bn, sizeof c.bn, "%s", value_name(p, n->in[2]));
    return c;
}

static Conv conv_of(const Program *p, const Node *n) {
    return conv_views(p, n, n->in[0], n->in[1], n->out[0]);
}

static int64_t grain_for(int64_t work) {
    return work >= WORK_PER_THREAD ? 1 : WORK_PER_THREAD / work;
}

/* ---- Index arithmetic ---- */

typedef struct {
    char name[8];
    int64_t size;
} Dim;

/* Emits `int64_t NAME = i / stride % size;` for each dim, outermost first, of a
 * row-major index space; a dim of size 1 is 0 (callers leave out those they never
 * name). */
static void emit_dims(Str *s, const Dim *dims, int n) {
    int64_t stride = 1, strides[2 * KILN_MAX_RANK];
    for (int k = n - 1; k >= 0; k--) {
        strides[k] = stride;
        stride *= dims[k].size;
    }
    for (int k = 0; k < n; k++) {
        if (dims[k].size == 1)
            str_printf(s, "int64_t %s = 0;\n", dims[k].name);
        else if (k == 0 && strides[k] == 1)
            str_printf(s, "int64_t %s = i;\n", dims[k].name);
        else if (k == 0)
            str_printf(s, "int64_t %s = i / %lld;\n", dims[k].name, (long long)strides[k]);
        else if (strides[k] == 1)
            str_printf(s, "int64_t %s = i %% %lld;\n", dims[k].name, (long long)dims[k].size);
        else
            str_printf(s, "int64_t %s = i / %lld %% %lld;\n", dims[k].name, (long long)strides[k],
                       (long long)dims[k].size);
    }
}

static Dim dim(const char *prefix, int index, int64_t size) {
    Dim d = {.size = size};
    snprintf(d.name, sizeof d.name, index < 0 ? "%s" : "%s%d", prefix, index);
    return d;
}

/* Into e: the input position along spatial dim s of output position p{s} and tap
 * k{s}: p * stride - pad + k * dilation. */
static void input_pos(const Conv *c, int s, char *e, size_t cap) {
    char p[16], k[16];
    snprintf(p, sizeof p, "p%d", s);
    snprintf(k, sizeof k, "k%d", s);
    e[0] = 0;
    append_term(e, cap, p, c->strides[s]);
    size_t len = strlen(e);
    if (c->pads[s])
        snprintf(e + len, cap - len, " - %lld", (long long)c->pads[s]);
    if (c->w.sp[s] > 1)
        append_term(e, cap, k, c->dilations[s]);
}

/* The offset expression of x[b, channel * scale, in0...] into e; no channel term
 * for a NULL channel; `last`, when not NULL, names the last spatial position. */
static void x_offset(const Conv *c, const char *channel, int64_t scale, const char *last, char *e,
                     size_t cap) {
    e[0] = 0;
    if (c->x.n > 1)
        append_term(e, cap, "b", c->x.sn);
    if (channel)
        append_term(e, cap, channel, c->x.sc * scale);
    for (int s = 0; s < c->ns; s++) {
        char v[16];
        snprintf(v, sizeof v, "in%d", s);
        append_term(e, cap, last && s == c->ns - 1 ? last : v, c->x.ss[s]);
    }
}

/* Emits, for the last spatial dim (the one a row of outputs runs along), `off`: the
 * input position that output position 0 meets through tap k{last}; and [lo, hi):
 * the output positions p whose input position off + p * stride lies inside x, hi
 * clipped to the row (lo may pass hi). */
static void emit_row_range(Str *s, const Conv *c, int ind) {
    int l = c->ns - 1;
    long long st = c->strides[l], w = c->x.sp[l], pad = c->pads[l];
    char off[64] = "";
    if (c->w.sp[l] > 1) {
        char k[16];
        snprintf(k, sizeof k, "k%d", l);
        append_term(off, sizeof off, k, c->dilations[l]);
    }
    if (!off[0])
        snprintf(off, sizeof off, "%lld", -pad);
    else if (pad)
        snprintf(off + strlen(off), sizeof off - strlen(off), " - %lld", pad);
    str_printf(s, "%*sint64_t off = %s;\n", ind, "", off);
    if (st == 1)
        str_printf(s, "%*sint64_t lo = off < 0 ? -off : 0, hi = off < %lld ? %lld - off : 0;\n", ind, "", w,
                   w);
    else
        str_printf(s,
                   "%*sint64_t lo = off < 0 ? (%lld - off) / %lld : 0, hi = off < %lld ? (%lld - off) / %lld "
                   "+ 1 : 0;\n",
                   ind, "", st - 1, st, w, w - 1, st);
    str_printf(s, "%*sif (hi > %lld)\n%*s    hi = %lld;\n", ind, "", (long long)c->y.sp[l], ind, "",
               (long long)c->y.sp[l]);
}

/* The output's dims as the LOOP over its elements sees them. */
static int output_dims(const Conv *c, Dim *dims) {
    int n = 0;
    if (c->y.n > 1)
        dims[n++] = dim("b", -1, c->y.n);
    if (!c->nhwc)
        dims[n++] = dim("o", -1, c->y.c);
    for (int s = 0; s < c->ns; s++)
        dims[n++] = dim("p", s, c->y.sp[s]);
    if (c->nhwc)
        dims[n++] = dim("o", -1, c->y.c);
    return n;
}

/* ---- conv as im2col and GEMM ---- */

/* The LOOP filling the column matrix; nchw: one iteration per row of it (a run along
 * the last spatial dim); nhwc: one per (position, group, taps but the last dim's),
 * copying C/g channels for each tap along the last dim. */
static int im2col(Program *p, const Node *n, const Conv *c, int64_t bytes, Diag *d) {
    Kernel *k = kernel_new(p, n, K_LOOP, "im2col");
    if (!k)
        return diag_error(d, n->loc, "out of memory");
    kernel_reads(k, n->in[0]);
    k->scratch_bytes = bytes;
    Dim dims[2 * KILN_MAX_RANK];
    int nd = 0, last = c->ns - 1;
    int64_t cg = c->x.c / c->groups, run = c->nhwc ? cg : c->y.sp[last];
    if (c->x.n > 1)
        dims[nd++] = dim("b", -1, c->x.n);
    if (c->nhwc) {
        for (int s = 0; s < c->ns; s++)
            dims[nd++] = dim("p", s, c->y.sp[s]);
        if (c->groups > 1)
            dims[nd++] = dim("g", -1, c->groups);
    } else {
        dims[nd++] = dim("c", -1, c->x.c);
    }
    /* nhwc: the taps along the last dim are a loop of the iteration, which copies
       the run of taps x C/g columns they fill */
    for (int s = 0; s < (c->nhwc ? last : c->ns); s++)
        if (c->w.sp[s] > 1)
            dims[nd++] = dim("k", s, c->w.sp[s]);
    for (int s = 0; !c->nhwc && s < last; s++)
        dims[nd++] = dim("p", s, c->y.sp[s]);
    if (c->nhwc)
        run *= c->w.sp[last];
    k->count = 1;
    for (int i = 0; i < nd; i++)
        k->count *= dims[i].size;
    k->grain = grain_for(run);
    Str *s = &k->body;
    emit_dims(s, dims, nd);
    /* the dims the iteration fixes: all but the last */
    int fixed = last;
    char e[256], inside[512] = "", stride_suffix[32] = "";
    if (c->strides[last] > 1)
        snprintf(stride_suffix, sizeof stride_suffix, " * %lld", (long long)c->strides[last]);
    for (int i = 0; i < fixed; i++) {
        input_pos(c, i, e, sizeof e);
        str_printf(s, "int64_t in%d = %s;\n", i, e);
        size_t len = strlen(inside);
        snprintf(inside + len, sizeof inside - len, "%sin%d >= 0 && in%d < %lld", len ? " && " : "", i, i,
                 (long long)c->x.sp[i]);
    }
    if (fixed)
        str_printf(s, "int inside = %s;\n", inside);
    if (c->nhwc) {
        /* for each tap k{last}, the channels of group g at input position in0...: contiguous */
        char kl[16];
        snprintf(kl, sizeof kl, "k%d", last);
        input_pos(c, last, e, sizeof e);
        str_printf(s, "float *row = scratch + i * %lld;\n", (long long)run);
        str_printf(s, "for (int64_t %s = 0; %s < %lld; %s++) {\n", kl, kl, (long long)c->w.sp[last], kl);
        str_printf(s, "    int64_t in%d = %s;\n", last, e);
        str_printf(s, "    int in_row = %sin%d >= 0 && in%d < %lld;\n", fixed ? "inside && " : "", last, last,
                   (long long)c->x.sp[last]);
        x_offset(c, c->groups > 1 ? "g" : NULL, cg, NULL, e, sizeof e);
        str_printf(s, "    const float *src = %s + %s;\n", c->xn, e);
        str_printf(s, "    for (int64_t c = 0; c < %lld; c++)\n", (long long)cg);
        str_printf(s, "        row[%s * %lld + c] = in_row ? src[c] : 0.0f;\n}\n", kl, (long long)cg);
        return 0;
    }
    /* a row of cols: zeros, the input positions inside x, zeros */
    emit_row_range(s, c, 0);
    if (fixed)
        str_printf(s, "if (!inside)\n    hi = 0;\n");
    str_printf(s, "if (lo > hi)\n    lo = hi;\n");
    x_offset(c, "c", 1, "off", e, sizeof e);
    str_printf(s, "float *row = scratch + i * %lld;\nint64_t base = %s;\n", (long long)run, e);
    str_printf(s,
               "for (int64_t p%d = 0; p%d < lo; p%d++)\n"
               "    row[p%d] = 0.0f;\n"
               "for (int64_t p%d = lo; p%d < hi; p%d++)\n"
               "    row[p%d] = %s[base + p%d%s];\n"
               "for (int64_t p%d = hi; p%d < %lld; p%d++)\n"
               "    row[p%d] = 0.0f;\n",
               last, last, last, last, last, last, last, last, c->xn, last, stride_suffix, last, last,
               (long long)run, last, last);
    return 0;
}

/* Whether a conv's column matrix is x itself: a 1x1 kernel, stride 1, no pads. */
static bool is_pointwise(const Conv *c) {
    bool pointwise = c->taps == 1;
    for (int s = 0; s < c->ns; s++)
        pointwise = pointwise && c->strides[s] == 1 && c->pads[s] == 0 && c->pads[c->ns + s] == 0;
    return pointwise;
}

static bool fits_int(int64_t v) {
    return v <= INT_MAX;
}

/* Tiles of the output the pool runs in parallel, each one single-threaded cblas_sgemm:
 * along the columns when there are many, else along the rows. */
enum { TILE_COLS = 256, TILE_ROWS = 64, MIN_TILE_COLS = 32 };

/* The GEMM as a LOOP over (batch item (nchw), group, row tile, column tile): each
 * iteration runs cblas_sgemm on its tile and adds the bias while the tile is in
 * cache. `src` is the column matrix: the scratch, or x itself. */
/* A LOOP of GEMM tiles for node n: one iteration per (batch, group, row tile, column
 * tile) of a rows x cols result, its body starting with the tile's c0, r0, g, b, m
 * and n. Tiles run along the columns when there are many, else along the rows, and
 * a short result (the last layers' 7x7 positions) still gets a few column tiles to
 * share among the threads. */
static Kernel *gemm_tiles(Program *p, const Node *n, int64_t batches, int64_t groups, int64_t rows, int64_t cols,
                          Diag *d) {
    int64_t tc = cols >= 2 * TILE_COLS ? TILE_COLS : cols,
            tr = tc == cols && rows >= 2 * TILE_ROWS ? TILE_ROWS : rows;
    if (tr == rows && tc == cols && rows < 2 * TILE_ROWS && cols >= 4 * MIN_TILE_COLS)
        tc = (cols / 4 + MIN_TILE_COLS - 1) / MIN_TILE_COLS * MIN_TILE_COLS;
    int64_t n_tc = (cols + tc - 1) / tc, n_tr = (rows + tr - 1) / tr;
    Kernel *k = kernel_loop(p, n, "gemm", batches * groups * n_tr * n_tc, 1, d);
    if (!k)
        return NULL;
    Str *s = &k->body;
    str_printf(s, "int64_t c0 = i %% %lld * %lld, r0 = i / %lld %% %lld * %lld;\n", (long long)n_tc,
               (long long)tc, (long long)n_tc, (long long)n_tr, (long long)tr);
    str_printf(s, "int64_t g = i / %lld %% %lld, b = i / %lld;\n", (long long)(n_tc * n_tr), (long long)groups,
               (long long)(n_tc * n_tr * groups));
    str_printf(s, "int m = %lld - r0 < %lld ? (int)(%lld - r0) : %lld;\n", (long long)rows, (long long)tr,
               (long long)rows, (long long)tr);
    str_printf(s, "int n = %lld - c0 < %lld ? (int)(%lld - c0) : %lld;\n", (long long)cols, (long long)tc,
               (long long)cols, (long long)tc);
    str_printf(s, "(void)g, (void)b;\n");
    return k;
}

static int gemm_too_large(const Node *n, int64_t rows, int64_t cols, int64_t depth, Diag *d) {
    return diag_error(d, n->loc, "%s: a GEMM of %lld x %lld x %lld is too large for BLAS", op_table[n->op].name,
                      (long long)rows, (long long)cols, (long long)depth);
}

static int gemm(Program *p, const Node *n, const Conv *c, bool pointwise, int64_t scratch_bytes, Diag *d) {
    int64_t cg = c->x.c / c->groups, og = c->y.c / c->groups, depth = cg * c->taps;
    int64_t rows = c->nhwc ? c->y.n * c->positions : og, cols = c->nhwc ? og : c->positions;
    if (!fits_int(rows) || !fits_int(cols) || !fits_int(depth * c->groups) || !fits_int(c->y.c))
        return gemm_too_large(n, rows, cols, depth, d);
    int64_t batches = c->nhwc ? 1 : c->y.n;
    Kernel *k = gemm_tiles(p, n, batches, c->groups, rows, cols, d);
    if (!k)
        return -1;
    k->scratch_bytes = scratch_bytes;
    k->flops = lower_flops(6, (int64_t[]){2, rows, cols, depth, c->groups, batches});
    const char *src = pointwise ? c->xn : "scratch";
    Str *s = &k->body;
    if (c->nhwc) {
        /* y[rows, og] = cols[rows, depth] x w[og, depth]^T, rows of y y.c apart */
        str_printf(s, "float *tile = %s + r0 * %lld + g * %lld + c0;\n", c->yn, (long long)c->y.c,
                   (long long)og);
        str_printf(s,
                   "cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, %lld, 1.0f,\n"
                   "            %s + r0 * %lld + g * %lld, %lld, %s + (g * %lld + c0) * %lld, %lld, 0.0f, "
                   "tile, %lld);\n",
                   (long long)depth, src, (long long)(c->groups * depth), (long long)depth,
                   (long long)(c->groups * depth), c->wn, (long long)og, (long long)depth, (long long)depth,
                   (long long)c->y.c);
        char bias_at[64];
        snprintf(bias_at, sizeof bias_at, "g * %lld + c0 + q", (long long)og);
        emit_tile_epilogue(s, p, c->node, c->epilogue, c->bn, bias_at, "m", "n", c->y.c, 1);
    } else {
        /* y[og, positions] = w[og, depth] x cols[depth, positions], per batch item and group */
        int64_t src_batch = pointwise ? c->x.sn : c->groups * depth * c->positions;
        str_printf(s, "float *tile = %s + b * %lld + (g * %lld + r0) * %lld + c0;\n", c->yn,
                   (long long)c->y.sn, (long long)og, (long long)cols);
        str_printf(s,
                   "cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, %lld, 1.0f,\n"
                   "            %s + (g * %lld + r0) * %lld, %lld,\n"
                   "            %s + b * %lld + g * %lld + c0, %lld, 0.0f, tile, %lld);\n",
                   (long long)depth, c->wn, (long long)og, (long long)depth, (long long)depth, src,
                   (long long)src_batch, (long long)(depth * c->positions), (long long)cols, (long long)cols);
        char bias_at[64];
        snprintf(bias_at, sizeof bias_at, "g * %lld + r0 + r", (long long)og);
        emit_tile_epilogue(s, p, c->node, c->epilogue, c->bn, bias_at, "m", "n", cols, 1);
    }
    return 0;
}

/* ---- Direct loops: depthwise conv and conv_transpose ---- */

/* Emits the loops over a depthwise conv's taps: for each spatial dim but the last,
 * k{i} and the input position in{i}, skipping taps outside x; then the loop over
 * the last dim's taps with the row range (emit_row_range) inside it. Returns the
 * indent of the body; the caller closes the ns braces. */
static int emit_tap_loops(Str *s, const Conv *c) {
    int last = c->ns - 1;
    char e[256];
    for (int i = 0; i < c->ns; i++) {
        int ind = 4 * i;
        str_printf(s, "%*sfor (int64_t k%d = 0; k%d < %lld; k%d++) {\n", ind, "", i, i, (long long)c->w.sp[i],
                   i);
        if (i == last)
            break;
        input_pos(c, i, e, sizeof e);
        str_printf(s, "%*s    int64_t in%d = %s;\n", ind, "", i, e);
        str_printf(s, "%*s    if (in%d < 0 || in%d >= %lld)\n%*s        continue;\n", ind, "", i, i,
                   (long long)c->x.sp[i], ind, "");
    }
    emit_row_range(s, c, 4 * c->ns);
    return 4 * c->ns;
}

/* One iteration per row of outputs along the last spatial dim, input channel o / m:
 * the row starts at the bias, and each tap adds its weight times the input row
 * over the outputs whose input lies inside x. */
static int depthwise(Program *p, const Node *n, const Conv *c, Diag *d) {
    int last = c->ns - 1;
    long long run = c->y.sp[last], ys = c->y.ss[last];
    Kernel *k =
        kernel_loop(p, n, "depthwise", c->y.n * c->y.c * c->positions / run, grain_for(c->taps * run), d);
    if (!k)
        return -1;
    k->flops = lower_flops(5, (int64_t[]){2, c->y.n, c->y.c, c->positions, c->taps});
    Dim dims[KILN_MAX_RANK];
    int nd = output_dims(c, dims);
    /* the iteration leaves out the last spatial dim: the row */
    if (c->nhwc)
        dims[nd - 2] = dims[nd - 1];
    nd--;
    Str *s = &k->body;
    emit_dims(s, dims, nd);
    int64_t m = c->y.c / c->groups;
    if (m > 1)
        str_printf(s, "int64_t c = o / %lld;\n", (long long)m);
    char e[256] = "", wi[256] = "", ps[32] = "", xs[32] = "";
    if (c->y.n > 1)
        append_term(e, sizeof e, "b", c->y.sn);
    append_term(e, sizeof e, "o", c->y.sc);
    for (int i = 0; i < last; i++) {
        char v[16];
        snprintf(v, sizeof v, "p%d", i);
        append_term(e, sizeof e, v, c->y.ss[i]);
    }
    if (ys > 1)
        snprintf(ps, sizeof ps, " * %lld", ys);
    if (c->strides[last] * c->x.ss[last] > 1)
        snprintf(xs, sizeof xs, " * %lld", (long long)(c->strides[last] * c->x.ss[last]));
    str_printf(s, "float *row = %s + %s;\n", c->yn, e);
    str_printf(s, "for (int64_t p%d = 0; p%d < %lld; p%d++)\n    row[p%d%s] = %s%s;\n", last, last, run, last,
               last, ps, c->bn[0] ? c->bn : "0.0f", c->bn[0] ? "[o]" : "");
    append_term(wi, sizeof wi, "o", c->w.sn);
    for (int i = 0; i < c->ns; i++) {
        char kv[16];
        snprintf(kv, sizeof kv, "k%d", i);
        append_term(wi, sizeof wi, kv, c->w.ss[i]);
    }
    int ind = emit_tap_loops(s, c);
    x_offset(c, m > 1 ? "c" : "o", 1, "off", e, sizeof e);
    str_printf(s, "%*sfloat wk = %s[%s];\n%*sint64_t base = %s;\n", ind, "", c->wn, wi, ind, "", e);
    str_printf(s, "%*sfor (int64_t p%d = lo; p%d < hi; p%d++)\n%*s    row[p%d%s] += %s[base + p%d%s] * wk;\n",
               ind, "", last, last, last, ind, "", last, ps, c->xn, last, xs);
    for (int i = c->ns - 1; i >= 0; i--)
        str_printf(s, "%*s}\n", 4 * i, "");
    if (c->epilogue) {
        char cols[32];
        snprintf(cols, sizeof cols, "%lld", run);
        str_printf(s, "float *tile = row;\n");
        emit_tile_epilogue(s, p, c->node, c->epilogue, "", NULL, "1", cols, 0, ys);
    }
    return 0;
}

/* Depthwise with channels last (one channel per group): one iteration per output
 * row along the last spatial dim, all channels of a position contiguous, so each
 * tap adds weight x input over whole channel vectors. The weights, [C, k..., 1],
 * are read tap-major: relaid at compile time into the kernel's table when they
 * are known then (a param or const), else read with a stride. */
static int depthwise_nhwc(Program *p, const Node *n, const Conv *c, Diag *d) {
    int last = c->ns - 1;
    long long run = c->y.sp[last], ch = c->y.c, taps = c->taps;
    Kernel *k = kernel_loop(p, n, "depthwise", c->y.n * c->positions / run, grain_for(c->taps * run * ch), d);
    if (!k)
        return -1;
    k->flops = lower_flops(5, (int64_t[]){2, c->y.n, c->y.c, c->positions, c->taps});
    Buffer wb = p->buf[n->in[1]];
    const char *wt = "table";
    if (wb.kind == BUF_WEIGHT) {
        float *t = ir_malloc(sizeof(float) * (size_t)(taps * ch) + 1);
        if (!t)
            return diag_error(d, n->loc, "out of memory");
        const float *w = (const float *)(p->weights + wb.offset);
        for (long long o = 0; o < ch; o++)
            for (long long tap = 0; tap < taps; tap++)
                t[tap * ch + o] = w[o * taps + tap];
        int rc = program_table(p, k, t, (int64_t)sizeof(float) * taps * ch, d);
        ir_free(t);
        if (rc)
            return -1;
    } else {
        wt = c->wn;
    }
    Dim dims[KILN_MAX_RANK];
    int nd = output_dims(c, dims) - 2; /* without the last spatial dim and the channels */
    Str *s = &k->body;
    emit_dims(s, dims, nd);
    char e[256] = "", tap[256] = "";
    if (c->y.n > 1)
        append_term(e, sizeof e, "b", c->y.sn);
    for (int i = 0; i < last; i++) {
        char v[16];
        snprintf(v, sizeof v, "p%d", i);
        append_term(e, sizeof e, v, c->y.ss[i]);
    }
    str_printf(s, "float *row = %s + %s;\n", c->yn, e[0] ? e : "0");
    if (c->bn[0])
        str_printf(s, "for (int64_t q = 0; q < %lld; q++)\n    for (int64_t o = 0; o < %lld; o++)\n"
                      "        row[q * %lld + o] = %s[o];\n", run, ch, ch, c->bn);
    else
        str_printf(s, "for (int64_t q = 0; q < %lld; q++)\n    row[q] = 0.0f;\n", run * ch);
    int64_t tap_stride = 1;
    for (int i = c->ns - 1; i >= 0; i--) {
        char kv[16];
        snprintf(kv, sizeof kv, "k%d", i);
        append_term(tap, sizeof tap, kv, tap_stride);
        tap_stride *= c->w.sp[i];
    }
    int ind = emit_tap_loops(s, c);
    x_offset(c, NULL, 1, "off", e, sizeof e);
    bool relaid = wb.kind == BUF_WEIGHT;
    char wo[32] = "o";
    if (!relaid && taps > 1)
        snprintf(wo, sizeof wo, "o * %lld", taps);
    if (relaid)
        str_printf(s, "%*sconst float *wk = %s + (%s) * %lld;\n", ind, "", wt, tap, ch);
    else
        str_printf(s, "%*sconst float *wk = %s + %s;\n", ind, "", wt, tap);
    str_printf(s,
               "%*sfor (int64_t p%d = lo; p%d < hi; p%d++) {\n"
               "%*s    const float *xr = %s + %s + p%d * %lld;\n"
               "%*s    float *yr = row + p%d * %lld;\n"
               "%*s    for (int64_t o = 0; o < %lld; o++)\n"
               "%*s        yr[o] += xr[o] * wk[%s];\n"
               "%*s}\n",
               ind, "", last, last, last, ind, "", c->xn, e[0] ? e : "0", last,
               (long long)(c->strides[last] * c->x.ss[last]), ind, "", last, ch, ind, "", ch, ind, "", wo, ind, "");
    for (int i = c->ns - 1; i >= 0; i--)
        str_printf(s, "%*s}\n", 4 * i, "");
    if (c->epilogue) {
        char cols[32];
        snprintf(cols, sizeof cols, "%lld", run * ch);
        str_printf(s, "float *tile = row;\n");
        emit_tile_epilogue(s, p, c->node, c->epilogue, "", NULL, "1", cols, 0, 1);
    }
    return 0;
}

/* ---- Without BLAS: implicit GEMMs (the CUDA target) ----
 *
 * Each GEMM above is one K_GEMM kernel that reads the column matrix's elements
 * straight from x (an implicit GEMM), so no im2col pass and no scratch:
 *   conv nchw: per (batch item, group), y = w[g] x cols, cols' rows (c, tap);
 *   conv nhwc: per group, y[:, g] = cols[:, g] x w[g]^T, cols' columns (tap, c);
 *   conv_weight_grad: per group, dw[g] = dy[:, g]^T x cols over (b, position);
 *   conv_transpose: per (batch item, group) or group, the same GEMMs over output
 *   positions, each input element fetched through the tap that reaches it (zero
 *   where none does). */

/* Emits `int64_t PREFIX0 = ..., ...;`: the multi-index of flat index `flat` over
 * the spatial sizes `sp`, declaring only the dims whose size is above 1 (the others
 * are never named). */
static void emit_spatial(Str *s, const char *prefix, const char *flat, const int64_t *sp, int ns) {
    int64_t stride = 1;
    for (int i = ns - 1; i >= 0; i--) {
        if (sp[i] > 1)
            str_printf(s, "int64_t %s%d = %s / %lld %% %lld;\n", prefix, i, flat, (long long)stride,
                       (long long)sp[i]);
        stride *= sp[i];
    }
}

/* Emits `v = `: the element of x, batch item b, channel ch, that output position
 * `pos` (flat over y's spatial dims) meets through tap `tap` (flat over w's), zero
 * in the padding; for conv_transpose, the element whose output reaches `pos`
 * through `tap`, zero where none does. */
static void emit_x_element(Str *s, const Conv *c, const char *tap, const char *pos) {
    bool transposed = c->node->op == OP_CONV_TRANSPOSE;
    emit_spatial(s, "k", tap, c->w.sp, c->ns);
    emit_spatial(s, "p", pos, c->y.sp, c->ns);
    char inside[512] = "", e[256];
    for (int i = 0; i < c->ns; i++) {
        size_t len = strlen(inside);
        if (transposed) {
            /* in * stride - pad + k * dilation == p */
            if (c->y.sp[i] == 1)
                str_printf(s, "int64_t p%d = 0;\n", i);
            snprintf(e, sizeof e, "p%d + %lld", i, (long long)c->pads[i]);
            if (c->w.sp[i] > 1)
                snprintf(e + strlen(e), sizeof e - strlen(e), " - k%d * %lld", i, (long long)c->dilations[i]);
            str_printf(s, "int64_t t%d = %s, in%d = t%d / %lld;\n", i, e, i, i, (long long)c->strides[i]);
            snprintf(inside + len, sizeof inside - len, "%st%d >= 0 && t%d %% %lld == 0 && in%d < %lld",
                     len ? " && " : "", i, i, (long long)c->strides[i], i, (long long)c->x.sp[i]);
        } else {
            if (c->y.sp[i] == 1)
                str_printf(s, "int64_t p%d = 0;\n", i);
            input_pos(c, i, e, sizeof e);
            str_printf(s, "int64_t in%d = %s;\n", i, e);
            snprintf(inside + len, sizeof inside - len, "%sin%d >= 0 && in%d < %lld", len ? " && " : "", i, i,
                     (long long)c->x.sp[i]);
        }
    }
    x_offset(c, "ch", 1, NULL, e, sizeof e);
    str_printf(s, "v = %s ? %s[%s] : 0.0f;\n", inside[0] ? inside : "1", c->xn, e[0] ? e : "0");
}

/* conv, fused_conv and conv_transpose as one implicit GEMM (see above). */
static int conv_gemm(Program *p, const Node *n, const Conv *c, Diag *d) {
    bool transposed = n->op == OP_CONV_TRANSPOSE;
    int64_t cg = c->x.c / c->groups, og = c->y.c / c->groups, depth = cg * c->taps;
    long long G = c->groups, taps = c->taps, positions = c->positions;
    Kernel *k = c->nhwc ? kernel_gemm(p, n, NULL, G, c->y.n * positions, og, depth, d)
                        : kernel_gemm(p, n, NULL, c->y.n * G, og, positions, depth, d);
    if (!k)
        return -1;
    /* the weight element of output channel `o` (within its group), input channel c, tap */
    char wi[256] = "";
    if (transposed) {
        append_term(wi, sizeof wi, "ch", c->w.sn);
        append_term(wi, sizeof wi, "o", c->w.sc);
        for (int i = 0; i < c->ns; i++) {
            char kv[16];
            snprintf(kv, sizeof kv, "k%d", i);
            if (c->w.sp[i] > 1)
                append_term(wi, sizeof wi, kv, c->w.ss[i]);
        }
    }
    char bias[128] = "", at[256];
    Str la = {0}, lb = {0}, store = {0};
    Str *a = &la, *b = &lb, *x_side = c->nhwc ? a : b, *w_side = c->nhwc ? b : a;
    const char *o = c->nhwc ? "q" : "r", *flat_pos = c->nhwc ? "pos" : "q";
    /* the x side: its element's batch item (only where x has a batch, as x_offset
       names b only then), tap and channel */
    if (c->nhwc) {
        if (c->x.n > 1)
            str_printf(x_side, "int64_t b = r / %lld;\n", positions);
        str_printf(x_side, "int64_t pos = r %% %lld, tap = kk / %lld, ch = bi * %lld + kk %% %lld;\n", positions,
                   (long long)cg, (long long)cg, (long long)cg);
    } else {
        if (c->x.n > 1)
            str_printf(x_side, "int64_t b = bi / %lld;\n", G);
        str_printf(x_side, "int64_t tap = kk %% %lld, ch = bi %% %lld * %lld + kk / %lld;\n", taps, G,
                   (long long)cg, taps);
    }
    emit_x_element(x_side, c, "tap", flat_pos);
    /* the w side */
    if (transposed) {
        if (c->nhwc)
            str_printf(w_side, "int64_t tap = kk / %lld, ch = bi * %lld + kk %% %lld;\n", (long long)cg,
                       (long long)cg, (long long)cg);
        else
            str_printf(w_side, "int64_t tap = kk %% %lld, ch = bi %% %lld * %lld + kk / %lld;\n", taps, G,
                       (long long)cg, taps);
        str_printf(w_side, "int64_t o = %s;\n", o);
        emit_spatial(w_side, "k", "tap", c->w.sp, c->ns);
        str_printf(w_side, "v = %s[%s];\n", c->wn, wi);
    } else {
        char group[32] = "bi";
        if (!c->nhwc)
            snprintf(group, sizeof group, "bi %% %lld", G);
        str_printf(w_side, "v = %s[(%s * %lld + %s) * %lld + kk];\n", c->wn, group, (long long)og, o,
                   (long long)depth);
    }
    k->a_depth_inner = true; /* nhwc: x's channels; nchw: w's rows */
    k->b_depth_inner = c->nhwc && !transposed;
    /* the store: y[r, g * og + q] (nhwc), y[b, g * og + r, q] (nchw) */
    if (c->nhwc) {
        snprintf(at, sizeof at, "r * %lld + bi * %lld + q", (long long)c->y.c, (long long)og);
        if (c->bn[0])
            snprintf(bias, sizeof bias, "%s[bi * %lld + q]", c->bn, (long long)og);
    } else {
        snprintf(at, sizeof at, "bi / %lld * %lld + (bi %% %lld * %lld + r) * %lld + q", G, (long long)c->y.sn, G,
                 (long long)og, positions);
        if (c->bn[0])
            snprintf(bias, sizeof bias, "%s[bi %% %lld * %lld + r]", c->bn, G, (long long)og);
    }
    emit_gemm_store(&store, p, n, c->epilogue, bias[0] ? bias : NULL, at);
    kernel_gemm_text(k, &la, &lb, &store);
    return 0;
}

/* conv_weight_grad as one implicit GEMM per group (see above). */
static int weight_grad_gemm(Program *p, const Node *n, const Conv *c, Diag *d) {
    int64_t cg = c->x.c / c->groups, og = c->y.c / c->groups, depth = cg * c->taps;
    long long positions = c->positions, taps = c->taps;
    Kernel *k = kernel_gemm(p, n, NULL, c->groups, og, depth, c->y.n * positions, d);
    if (!k)
        return -1;
    Str la = {0}, lb = {0}, store = {0};
    if (c->nhwc)
        str_printf(&la, "v = %s[kk * %lld + bi * %lld + r];\n", c->yn, (long long)c->y.c, (long long)og);
    else
        str_printf(&la, "v = %s[kk / %lld * %lld + (bi * %lld + r) * %lld + kk %% %lld];\n", c->yn, positions,
                   (long long)c->y.sn, (long long)og, positions, positions);
    Str *s = &lb;
    if (c->x.n > 1)
        str_printf(s, "int64_t b = kk / %lld;\n", positions);
    str_printf(s, "int64_t pos = kk %% %lld;\n", positions);
    if (c->nhwc)
        str_printf(s, "int64_t tap = q / %lld, ch = bi * %lld + q %% %lld;\n", (long long)cg, (long long)cg,
                   (long long)cg);
    else
        str_printf(s, "int64_t tap = q %% %lld, ch = bi * %lld + q / %lld;\n", taps, (long long)cg, taps);
    emit_x_element(s, c, "tap", "pos");
    k->a_depth_inner = k->b_depth_inner = !c->nhwc;
    char at[128];
    snprintf(at, sizeof at, "(bi * %lld + r) * %lld + q", (long long)og, (long long)depth);
    emit_gemm_store(&store, p, n, NULL, NULL, at);
    kernel_gemm_text(k, &la, &lb, &store);
    return 0;
}

int lower_conv(Program *p, const Node *n, Diag *d) {
    Conv c = conv_of(p, n);
    Arena arena = {0};
    if (n->op == OP_FUSED_CONV && !(c.epilogue = node_expr(&arena, n, d)))
        return -1;
    int64_t cg = c.x.c / c.groups;
    int rc;
    if (cg == 1 && c.groups > 1 && c.nhwc && c.y.c == c.groups) {
        rc = depthwise_nhwc(p, n, &c, d);
    } else if (cg == 1 && c.groups > 1) {
        rc = depthwise(p, n, &c, d);
    } else if (!p->blas) {
        rc = conv_gemm(p, n, &c, d);
    } else if (winograd_applies(p, n)) {
        rc = lower_winograd(p, n, c.epilogue, d);
    } else {
        bool pointwise = is_pointwise(&c);
        int64_t bytes = pointwise ? 0
                                  : lower_size(n, "im2col scratch", 5,
                                               (int64_t[]){c.y.n, c.positions, c.x.c, c.taps, 4}, d);
        rc = bytes < 0 || (!pointwise && im2col(p, n, &c, bytes, d)) ? -1
                                                                     : gemm(p, n, &c, pointwise, bytes, d);
    }
    if (!rc && c.epilogue) {
        /* the kernel that finishes the result names what it fused */
        kernel_annotate(&p->kernels[p->n_kernels - 1], node_attr(n, ATTR_EXPR)->s);
    }
    arena_free(&arena);
    return rc;
}

/* conv_weight_grad(x, dy) as GEMMs against the column matrix of x that its conv's
 * im2col fills (the same kernel, into the scratch): per group,
 *   nhwc: dw[g] = dy[:, g]^T cols[:, g], the sum running over every batch item and
 *         position at once;
 *   nchw: dw[g] = the sum over batch items b of dy[b, g] cols[b, g]^T, a GEMM per
 *         item accumulating into the tile.
 * One iteration per (group, tile of dw): each sums its whole tile, so the threads
 * never add into the same element. */
int lower_conv_weight_grad(Program *p, const Node *n, Diag *d) {
    Conv c = conv_views(p, n, n->in[0], n->out[0], n->in[1]);
    if (!p->blas)
        return weight_grad_gemm(p, n, &c, d);
    int64_t cg = c.x.c / c.groups, og = c.y.c / c.groups, depth = cg * c.taps;
    int64_t inner = c.nhwc ? c.y.n * c.positions : c.positions;
    if (!fits_int(og) || !fits_int(depth * c.groups) || !fits_int(inner) || !fits_int(c.y.c))
        return gemm_too_large(n, og, depth, inner, d);
    bool pointwise = is_pointwise(&c);
    int64_t bytes =
        pointwise ? 0
                  : lower_size(n, "im2col scratch", 5, (int64_t[]){c.y.n, c.positions, c.x.c, c.taps, 4}, d);
    if (bytes < 0 || (!pointwise && im2col(p, n, &c, bytes, d)))
        return -1;
    Kernel *k = gemm_tiles(p, n, 1, c.groups, og, depth, d);
    if (!k)
        return -1;
    k->scratch_bytes = bytes;
    k->flops = lower_flops(6, (int64_t[]){2, og, depth, c.groups, c.y.n, c.positions});
    const char *src = pointwise ? c.xn : "scratch";
    Str *s = &k->body;
    str_printf(s, "float *tile = %s + (g * %lld + r0) * %lld + c0;\n", c.wn, (long long)og, (long long)depth);
    if (c.nhwc) {
        str_printf(s,
                   "cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, n, %lld, 1.0f,\n"
                   "            %s + g * %lld + r0, %lld, %s + g * %lld + c0, %lld, 0.0f, tile, %lld);\n",
                   (long long)inner, c.yn, (long long)og, (long long)c.y.c, src, (long long)depth,
                   (long long)(c.groups * depth), (long long)depth);
    } else {
        int64_t src_batch = pointwise ? c.x.sn : c.groups * depth * c.positions;
        str_printf(s,
                   "for (int64_t b = 0; b < %lld; b++)\n"
                   "    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, %lld, 1.0f,\n"
                   "                %s + b * %lld + (g * %lld + r0) * %lld, %lld,\n"
                   "                %s + b * %lld + (g * %lld + c0) * %lld, %lld, b ? 1.0f : 0.0f, tile, %lld);\n",
                   (long long)c.y.n, (long long)inner, c.yn, (long long)c.y.sn, (long long)og, (long long)inner,
                   (long long)inner, src, (long long)src_batch, (long long)depth, (long long)inner, (long long)inner,
                   (long long)depth);
    }
    return 0;
}

/* conv_transpose as a GEMM and a gather. The GEMM multiplies each input position's
 * channels by the weights of its group, giving what it contributes through every tap
 * to every output channel (the scratch): nhwc: cols[(b, q), g, (k, oc)] = x[(b, q),
 * g] w[g]; nchw: cols[b, g, (oc, k), q] = w[g]^T x[b, g]. The gather then sums, for
 * each output element, the contributions of the taps that reach it: output position
 * p meets, through tap k, input position q = (p + pad - k * dilation) / stride when
 * that divides exactly. */
static int conv_transpose_gemm(Program *p, const Node *n, const Conv *c, Diag *d) {
    int64_t cg = c->x.c / c->groups, og = c->w.c, ktaps = og * c->taps, in_positions = 1;
    for (int s = 0; s < c->ns; s++)
        in_positions *= c->x.sp[s];
    int64_t rows = c->nhwc ? c->x.n * in_positions : ktaps, cols = c->nhwc ? ktaps : in_positions;
    if (!fits_int(rows) || !fits_int(cols * c->groups) || !fits_int(c->x.c))
        return gemm_too_large(n, rows, cols, cg, d);
    int64_t bytes = lower_size(n, "scratch", 5, (int64_t[]){c->x.n, in_positions, c->groups, ktaps, 4}, d);
    if (bytes < 0)
        return -1;
    Kernel *k = gemm_tiles(p, n, c->nhwc ? 1 : c->x.n, c->groups, rows, cols, d);
    if (!k)
        return -1;
    k->scratch_bytes = bytes;
    k->flops = lower_flops(6, (int64_t[]){2, rows, cols, cg, c->groups, c->nhwc ? 1 : c->x.n});
    Str *s = &k->body;
    if (c->nhwc)
        str_printf(s,
                   "cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, %lld, 1.0f,\n"
                   "            %s + r0 * %lld + g * %lld, %lld, %s + g * %lld + c0, %lld, 0.0f,\n"
                   "            scratch + r0 * %lld + g * %lld + c0, %lld);\n",
                   (long long)cg, c->xn, (long long)c->x.c, (long long)cg, (long long)c->x.c, c->wn,
                   (long long)(cg * ktaps), (long long)ktaps, (long long)(c->groups * ktaps), (long long)ktaps,
                   (long long)(c->groups * ktaps));
    else
        str_printf(s,
                   "cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, n, %lld, 1.0f,\n"
                   "            %s + g * %lld + r0, %lld, %s + b * %lld + g * %lld + c0, %lld, 0.0f,\n"
                   "            scratch + ((b * %lld + g) * %lld + r0) * %lld + c0, %lld);\n",
                   (long long)cg, c->wn, (long long)(cg * ktaps), (long long)ktaps, c->xn, (long long)c->x.sn,
                   (long long)(cg * in_positions), (long long)in_positions, (long long)c->groups, (long long)ktaps,
                   (long long)in_positions, (long long)in_positions);

    /* nhwc: one iteration per output position, adding each tap's whole row of
       output channels (contiguous in the scratch); nchw: one per output element */
    int64_t per_iteration = c->nhwc ? c->y.c : 1;
    Kernel *gk = kernel_loop(p, n, "gather", c->y.n * c->y.c * c->positions / per_iteration,
                             grain_for(c->taps * per_iteration), d);
    if (!gk)
        return -1;
    gk->scratch_bytes = bytes;
    Dim dims[KILN_MAX_RANK];
    int nd = output_dims(c, dims) - (c->nhwc ? 1 : 0); /* nhwc: o is the row's */
    s = &gk->body;
    emit_dims(s, dims, nd);
    if (c->y.n == 1)
        str_printf(s, "int64_t b = 0;\n");
    if (c->nhwc) {
        str_printf(s, "float *row = %s + i * %lld;\n", c->yn, (long long)c->y.c);
        str_printf(s, "for (int64_t o = 0; o < %lld; o++)\n    row[o] = %s%s;\n", (long long)c->y.c,
                   c->bn[0] ? c->bn : "0.0f", c->bn[0] ? "[o]" : "");
    } else {
        str_printf(s, "int64_t g = o / %lld, oc = o %% %lld;\n(void)g, (void)oc;\n", (long long)og, (long long)og);
        str_printf(s, "float acc = %s%s;\n", c->bn[0] ? c->bn : "0.0f", c->bn[0] ? "[o]" : "");
    }
    char q[256] = "", kf[256] = "";
    int64_t qstride = 1, kstride = 1;
    for (int i = c->ns - 1; i >= 0; i--) {
        char v[16];
        snprintf(v, sizeof v, "in%d", i);
        append_term(q, sizeof q, v, qstride);
        snprintf(v, sizeof v, "k%d", i);
        append_term(kf, sizeof kf, v, kstride);
        qstride *= c->x.sp[i];
        kstride *= c->w.sp[i];
    }
    for (int i = 0; i < c->ns; i++) {
        int ind = 4 * i;
        char t[128];
        snprintf(t, sizeof t, "p%d", i);
        if (c->pads[i])
            snprintf(t + strlen(t), sizeof t - strlen(t), " + %lld", (long long)c->pads[i]);
        snprintf(t + strlen(t), sizeof t - strlen(t), " - k%d * %lld", i, (long long)c->dilations[i]);
        str_printf(s, "%*sfor (int64_t k%d = 0; k%d < %lld; k%d++) {\n", ind, "", i, i, (long long)c->w.sp[i], i);
        str_printf(s, "%*s    int64_t t%d = %s, in%d = t%d / %lld;\n", ind, "", i, t, i, i, (long long)c->strides[i]);
        str_printf(s, "%*s    if (t%d < 0 || t%d %% %lld != 0 || in%d >= %lld)\n%*s        continue;\n", ind, "", i,
                   i, (long long)c->strides[i], i, (long long)c->x.sp[i], ind, "");
    }
    if (c->nhwc) {
        int ind = 4 * c->ns;
        str_printf(s, "%*sconst float *src = scratch + (b * %lld + %s) * %lld + (%s) * %lld;\n", ind, "",
                   (long long)in_positions, q, (long long)(c->groups * ktaps), kf, (long long)og);
        str_printf(s, "%*sfor (int64_t g = 0; g < %lld; g++)\n", ind, "", (long long)c->groups);
        str_printf(s, "%*s    for (int64_t oc = 0; oc < %lld; oc++)\n", ind, "", (long long)og);
        str_printf(s, "%*s        row[g * %lld + oc] += src[g * %lld + oc];\n", ind, "", (long long)og,
                   (long long)ktaps);
    } else
        str_printf(s, "%*sacc += scratch[(((b * %lld + g) * %lld + oc) * %lld + %s) * %lld + %s];\n", 4 * c->ns, "",
                   (long long)c->groups, (long long)og, (long long)c->taps, kf, (long long)in_positions, q);
    for (int i = c->ns - 1; i >= 0; i--)
        str_printf(s, "%*s}\n", 4 * i, "");
    if (!c->nhwc)
        str_printf(s, "%s[i] = acc;\n", c->yn);
    return 0;
}

/* One iteration per output element, gathering over the input channels of its group
 * and the kernel taps: for one input channel per group, where a GEMM would be a
 * copy with extra steps. */
int lower_conv_transpose(Program *p, const Node *n, Diag *d) {
    Conv c = conv_of(p, n);
    if (winograd_applies(p, n))
        return lower_winograd(p, n, NULL, d);
    if (c.x.c / c.groups > 1)
        return p->blas ? conv_transpose_gemm(p, n, &c, d) : conv_gemm(p, n, &c, d);
    int64_t cg = c.x.c / c.groups, og = c.w.c;
    Kernel *k = kernel_loop(p, n, NULL, c.y.n * c.y.c * c.positions, grain_for(cg * c.taps), d);
    if (!k)
        return -1;
    Dim dims[KILN_MAX_RANK];
    int nd = output_dims(&c, dims);
    Str *s = &k->body;
    emit_dims(s, dims, nd);
    if (c.groups > 1)
        str_printf(s, "int64_t g = o / %lld, oc = o %% %lld;\n", (long long)og, (long long)og);
    str_printf(s, "float acc = %s%s;\n", c.bn[0] ? c.bn : "0.0f", c.bn[0] ? "[o]" : "");
    if (c.groups > 1) {
        str_printf(s, "for (int64_t ci = 0; ci < %lld; ci++) {\n", (long long)cg);
        str_printf(s, "    int64_t c = g * %lld + ci;\n", (long long)cg);
    } else {
        str_printf(s, "for (int64_t c = 0; c < %lld; c++) {\n", (long long)cg);
    }
    char wi[256] = "";
    append_term(wi, sizeof wi, "c", c.w.sn);
    append_term(wi, sizeof wi, c.groups > 1 ? "oc" : "o", c.w.sc);
    for (int i = 0; i < c.ns; i++) {
        int ind = 4 * (i + 1);
        char kv[16], t[128];
        snprintf(kv, sizeof kv, "k%d", i);
        append_term(wi, sizeof wi, kv, c.w.ss[i]);
        /* the input position in with in * stride - pad + k * dilation == p */
        snprintf(t, sizeof t, "p%d", i);
        if (c.pads[i])
            snprintf(t + strlen(t), sizeof t - strlen(t), " + %lld", (long long)c.pads[i]);
        if (c.dilations[i] == 1)
            snprintf(t + strlen(t), sizeof t - strlen(t), " - k%d", i);
        else
            snprintf(t + strlen(t), sizeof t - strlen(t), " - k%d * %lld", i, (long long)c.dilations[i]);
        str_printf(s, "%*sfor (int64_t k%d = 0; k%d < %lld; k%d++) {\n", ind, "", i, i, (long long)c.w.sp[i],
                   i);
        if (c.strides[i] == 1) {
            str_printf(s, "%*s    int64_t in%d = %s;\n", ind, "", i, t);
            str_printf(s, "%*s    if (in%d < 0 || in%d >= %lld)\n", ind, "", i, i, (long long)c.x.sp[i]);
        } else {
            str_printf(s, "%*s    int64_t t%d = %s, in%d = t%d / %lld;\n", ind, "", i, t, i, i,
                       (long long)c.strides[i]);
            str_printf(s, "%*s    if (t%d < 0 || t%d %% %lld != 0 || in%d >= %lld)\n", ind, "", i, i,
                       (long long)c.strides[i], i, (long long)c.x.sp[i]);
        }
        str_printf(s, "%*s        continue;\n", ind, "");
    }
    char xi[256];
    x_offset(&c, "c", 1, NULL, xi, sizeof xi);
    str_printf(s, "%*sacc += %s[%s] * %s[%s];\n", 4 * (c.ns + 1), "", c.xn, xi, c.wn, wi);
    for (int i = c.ns; i >= 0; i--)
        str_printf(s, "%*s}\n", 4 * i, "");
    str_printf(s, "%s[i] = acc;\n", c.yn);
    return 0;
}
