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
 * F(4x4, 3x3) or F(2x2, 3x3) instead (lower_winograd.c). With channels last and weights known at
 * compile time (the C target), a conv gathers no column matrix at all: kiln's
 * micro-kernel (lower_packed.c) reads each row of A, an output position's taps, as
 * offsets into x, or into a copy of x with its padding as zeros (an implicit GEMM),
 * which saves writing and reading taps times the input (9x for a 3x3 conv).
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
 * bench. Every kernel is built as kernel IR (kir.h): its index arithmetic int64
 * expressions of the views' strides and the attributes, a tap whose input lies
 * outside x skipped by an if around the work it would do, and the BLAS calls
 * cblas_sgemm statements (kb_sgemm) on addresses into the values and the scratch. */
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
    int64_t taps;       /* kernel elements per channel */
    int64_t positions;  /* output elements per channel and batch item */
    int xv, wv, yv, bv; /* value ids; bv -1 without bias */
    const Node *node;
    const Expr *epilogue; /* fused_conv's expr, else NULL */
} Conv;

/* The conv of node n with input x, weight w and result y (for conv_weight_grad: x,
 * its result, and dy in the place of the conv's result). */
static Conv conv_views(const Program *p, const Node *n, int x, int w, int y) {
    const Graph *g = p->g;
    Conv c = {.nhwc = layout_is_nhwc(n), .node = n, .xv = x, .wv = w, .yv = y, .bv = -1};
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
    if (n->n_in > 2 && n->in[2] >= 0)
        c.bv = n->in[2];
    return c;
}

static Conv conv_of(const Program *p, const Node *n) {
    return conv_views(p, n, n->in[0], n->in[1], n->out[0]);
}

static int64_t grain_for(int64_t work) {
    return work >= WORK_PER_THREAD ? 1 : WORK_PER_THREAD / work;
}

/* ---- Index arithmetic ---- */

/* The names of the per-spatial-dim variables: output position, tap, input
 * position, and conv_transpose's input position times the stride. */
static const char *const p_name[MAX_SPATIAL] = {"p0", "p1", "p2"};
static const char *const k_name[MAX_SPATIAL] = {"k0", "k1", "k2"};
static const char *const in_name[MAX_SPATIAL] = {"in0", "in1", "in2"};
static const char *const t_name[MAX_SPATIAL] = {"t0", "t1", "t2"};

/* The coordinates a kernel names: batch item, output and input channel, group,
 * and per spatial dim the output position, tap and input position; 0 until a
 * kernel sets them. */
typedef struct {
    KExpr *b, *o, *c, *g, *p[MAX_SPATIAL], *k[MAX_SPATIAL], *in[MAX_SPATIAL];
} Coords;

static Coords coords_zero(KBuilder *b) {
    KExpr *zero = k_int(b, 0);
    Coords at = {zero, zero, zero, zero, {zero, zero, zero}, {zero, zero, zero}, {zero, zero, zero}};
    return at;
}

/* e + v * stride. */
static KExpr *plus(KBuilder *b, KExpr *e, KExpr *v, int64_t stride) {
    return k_add(b, e, k_mul(b, v, k_int(b, stride)));
}

/* 0 <= v < size. */
static KExpr *within(KBuilder *b, KExpr *v, int64_t size) {
    return k_and(b, k_bin(b, KE_GE, v, k_int(b, 0)), k_lt(b, v, k_int(b, size)));
}

/* cond && more, or more alone where cond is NULL. */
static KExpr *and_also(KBuilder *b, KExpr *cond, KExpr *more) {
    return cond ? k_and(b, cond, more) : more;
}

typedef struct {
    const char *name;
    int64_t size;
    KExpr **at; /* where the dim's coordinate goes */
} Dim;

static Dim dim(const char *name, int64_t size, KExpr **at) {
    return (Dim){name, size, at};
}

/* Lets NAME = i / stride % size for each dim, outermost first, of a row-major
 * index space over flat index i; a dim of size 1 is 0. */
static void let_dims(KBuilder *b, KExpr *i, const Dim *dims, int n) {
    int64_t stride = 1, strides[2 * KILN_MAX_RANK];
    for (int k = n - 1; k >= 0; k--) {
        strides[k] = stride;
        stride *= dims[k].size;
    }
    for (int k = 0; k < n; k++) {
        KExpr *e = k_div(b, i, k_int(b, strides[k]));
        if (k > 0)
            e = k_mod(b, e, k_int(b, dims[k].size));
        *dims[k].at = dims[k].size == 1 ? k_int(b, 0) : k_var(b, kb_let(b, dims[k].name, KT_I64, e));
    }
}

/* Makes LOOP kernel k one iteration per point of dims, each doing `work`, and lets
 * the dims' coordinates of its iteration; returns the iteration. */
static KExpr *iterate_dims(Kernel *k, const Dim *dims, int n, int64_t work) {
    k->count = 1;
    for (int i = 0; i < n; i++)
        k->count *= dims[i].size;
    k->grain = grain_for(work);
    KExpr *i = k_var(&k->b, k->iter);
    let_dims(&k->b, i, dims, n);
    return i;
}

/* Lets NAMEs = the coordinates of flat index `flat` over the spatial sizes sp,
 * for the dims above 1 (the others are 0), into at. */
static void let_spatial(KBuilder *b, const char *const *names, KExpr *flat, const int64_t *sp, int ns,
                        KExpr **at) {
    int64_t stride = 1;
    for (int i = ns - 1; i >= 0; i--) {
        at[i] = sp[i] > 1 ? k_var(b, kb_let(b, names[i], KT_I64,
                                            k_mod(b, k_div(b, flat, k_int(b, stride)), k_int(b, sp[i]))))
                          : k_int(b, 0);
        stride *= sp[i];
    }
}

/* The input position along spatial dim s of output position p and tap k:
 * p * stride - pad + k * dilation. */
static KExpr *input_pos(KBuilder *b, const Conv *c, int s, KExpr *p, KExpr *k) {
    KExpr *e = k_sub(b, k_mul(b, p, k_int(b, c->strides[s])), k_int(b, c->pads[s]));
    return c->w.sp[s] > 1 ? plus(b, e, k, c->dilations[s]) : e;
}

/* The offset of x[batch, channel * scale, pos...]; no channel term for a NULL
 * channel. */
static KExpr *x_offset(KBuilder *b, const Conv *c, KExpr *batch, KExpr *channel, int64_t scale,
                       KExpr *const *pos) {
    KExpr *e = c->x.n > 1 ? k_mul(b, batch, k_int(b, c->x.sn)) : k_int(b, 0);
    if (channel)
        e = plus(b, e, channel, c->x.sc * scale);
    for (int s = 0; s < c->ns; s++)
        e = plus(b, e, pos[s], c->x.ss[s]);
    return e;
}

/* For the last spatial dim (the one a row of outputs runs along): `off`, the input
 * position that output position 0 meets through tap k (the dim's only tap where it
 * has one), and the mutable [lo, hi): the output positions p whose input position
 * off + p * stride lies inside x, hi clipped to the row (lo may pass hi). */
typedef struct {
    KExpr *off;
    int lo, hi;
} RowRange;

static RowRange row_range(KBuilder *b, const Conv *c, KExpr *k) {
    int l = c->ns - 1;
    int64_t st = c->strides[l], w = c->x.sp[l];
    RowRange rr;
    KExpr *tap = c->w.sp[l] > 1 ? k_mul(b, k, k_int(b, c->dilations[l])) : k_int(b, 0);
    rr.off = k_var(b, kb_let(b, "off", KT_I64, k_sub(b, tap, k_int(b, c->pads[l]))));
    KExpr *lo = st == 1 ? k_neg(b, rr.off) : k_div(b, k_sub(b, k_int(b, st - 1), rr.off), k_int(b, st));
    KExpr *hi = st == 1 ? k_sub(b, k_int(b, w), rr.off)
                        : k_add(b, k_div(b, k_sub(b, k_int(b, w - 1), rr.off), k_int(b, st)), k_int(b, 1));
    rr.lo = kb_decl(b, "lo", KT_I64, k_select(b, k_lt(b, rr.off, k_int(b, 0)), lo, k_int(b, 0)));
    rr.hi = kb_decl(b, "hi", KT_I64, k_select(b, k_lt(b, rr.off, k_int(b, w)), hi, k_int(b, 0)));
    kb_if(b, k_bin(b, KE_GT, k_var(b, rr.hi), k_int(b, c->y.sp[l])));
    kb_assign(b, rr.hi, k_int(b, c->y.sp[l]));
    kb_end(b);
    return rr;
}

/* The output's dims as the LOOP over its elements sees them. */
static int output_dims(const Conv *c, Dim *dims, Coords *at) {
    int n = 0;
    if (c->y.n > 1)
        dims[n++] = dim("b", c->y.n, &at->b);
    if (!c->nhwc)
        dims[n++] = dim("o", c->y.c, &at->o);
    for (int s = 0; s < c->ns; s++)
        dims[n++] = dim(p_name[s], c->y.sp[s], &at->p[s]);
    if (c->nhwc)
        dims[n++] = dim("o", c->y.c, &at->o);
    return n;
}

/* The bias of output channel `o`, or 0 without one. */
static KExpr *bias_or_zero(KBuilder *b, const Conv *c, KExpr *o) {
    return c->bv >= 0 ? k_load(b, kb_value(b, c->bv, false), o) : k_f32(b, 0);
}

/* Closes `count` blocks. */
static void end_blocks(KBuilder *b, int count) {
    while (count-- > 0)
        kb_end(b);
}

/* ---- conv as im2col and GEMM ---- */

/* A LOOP kernel of node n that reads its input x into `bytes` of the node's scratch
 * (a column matrix, a padded copy); NULL after a diagnostic. */
static Kernel *scratch_of_x(Program *p, const Node *n, const Conv *c, const char *what, int64_t bytes,
                            Diag *d) {
    Kernel *k = kernel_new(p, n, K_LOOP, what);
    if (!k) {
        diag_error(d, n->loc, "out of memory");
        return NULL;
    }
    kernel_reads(k, c->xv);
    k->scratch_bytes = bytes;
    return k;
}

/* The LOOP filling the column matrix; nchw: one iteration per row of it (a run along
 * the last spatial dim); nhwc: one per (position, group, taps but the last dim's),
 * copying C/g channels for each tap along the last dim. */
static int im2col(Program *p, const Node *n, const Conv *c, int64_t bytes, Diag *d) {
    Kernel *k = scratch_of_x(p, n, c, "im2col", bytes, d);
    if (!k)
        return -1;
    KBuilder *b = &k->b;
    Coords at = coords_zero(b);
    Dim dims[2 * KILN_MAX_RANK];
    int nd = 0, last = c->ns - 1;
    int64_t cg = c->x.c / c->groups, run = c->nhwc ? cg : c->y.sp[last];
    if (c->x.n > 1)
        dims[nd++] = dim("b", c->x.n, &at.b);
    if (c->nhwc) {
        for (int s = 0; s < c->ns; s++)
            dims[nd++] = dim(p_name[s], c->y.sp[s], &at.p[s]);
        if (c->groups > 1)
            dims[nd++] = dim("g", c->groups, &at.g);
    } else {
        dims[nd++] = dim("c", c->x.c, &at.c);
    }
    /* nhwc: the taps along the last dim are a loop of the iteration, which copies
       the run of taps x C/g columns they fill */
    for (int s = 0; s < (c->nhwc ? last : c->ns); s++)
        if (c->w.sp[s] > 1)
            dims[nd++] = dim(k_name[s], c->w.sp[s], &at.k[s]);
    for (int s = 0; !c->nhwc && s < last; s++)
        dims[nd++] = dim(p_name[s], c->y.sp[s], &at.p[s]);
    if (c->nhwc)
        run *= c->w.sp[last];
    KExpr *i = iterate_dims(k, dims, nd, run);
    kernel_follows(p, k, &p->g->values[n->out[0]].type, k->count, 1, 1); /* image by image */
    /* the dims the iteration fixes: all but the last */
    KExpr *inside = NULL;
    for (int s = 0; s < last; s++) {
        at.in[s] = k_var(b, kb_let(b, in_name[s], KT_I64, input_pos(b, c, s, at.p[s], at.k[s])));
        inside = and_also(b, inside, within(b, at.in[s], c->x.sp[s]));
    }
    if (inside)
        inside = k_var(b, kb_let(b, "inside", KT_BOOL, inside));
    int x = kb_value(b, c->xv, false), scratch = kb_scratch(b);
    KExpr *row = k_var(b, kb_let(b, "row", KT_I64, k_mul(b, i, k_int(b, run))));
    if (c->nhwc) {
        /* for each tap k{last}, the channels of group g at input position in0...: contiguous */
        at.k[last] = k_var(b, kb_for(b, k_name[last], KT_I64, k_int(b, 0), k_int(b, c->w.sp[last]), NULL, 0));
        at.in[last] =
            k_var(b, kb_let(b, in_name[last], KT_I64, input_pos(b, c, last, at.p[last], at.k[last])));
        KExpr *in_row = k_var(
            b, kb_let(b, "in_row", KT_BOOL, and_also(b, inside, within(b, at.in[last], c->x.sp[last]))));
        KExpr *src =
            k_var(b, kb_let(b, "src", KT_I64, x_offset(b, c, at.b, c->groups > 1 ? at.g : NULL, cg, at.in)));
        KExpr *ch = k_var(b, kb_for(b, "c", KT_I64, k_int(b, 0), k_int(b, cg), NULL, 0));
        kb_store(b, scratch, k_add(b, row, k_madd(b, at.k[last], cg, ch)),
                 k_select(b, in_row, k_load(b, x, k_add(b, src, ch)), k_f32(b, 0)));
        end_blocks(b, 2);
        return 0;
    }
    /* a row of cols: zeros, the input positions inside x, zeros */
    RowRange rr = row_range(b, c, at.k[last]);
    if (inside) {
        kb_if(b, k_not(b, inside));
        kb_assign(b, rr.hi, k_int(b, 0));
        kb_end(b);
    }
    KExpr *lo = k_var(b, rr.lo), *hi = k_var(b, rr.hi);
    kb_if(b, k_bin(b, KE_GT, lo, hi));
    kb_assign(b, rr.lo, hi);
    kb_end(b);
    at.in[last] = rr.off;
    KExpr *base = k_var(b, kb_let(b, "base", KT_I64, x_offset(b, c, at.b, at.c, 1, at.in)));
    KExpr *bounds[4] = {k_int(b, 0), lo, hi, k_int(b, run)};
    for (int part = 0; part < 3; part++) {
        KExpr *pl = k_var(b, kb_for(b, p_name[last], KT_I64, bounds[part], bounds[part + 1], NULL, 0));
        kb_store(b, scratch, k_add(b, row, pl),
                 part == 1 ? k_load(b, x, plus(b, base, pl, c->strides[last])) : k_f32(b, 0));
        kb_end(b);
    }
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
enum { TILE_COLS = 256, TILE_ROWS = 256, MIN_TILE_COLS = 32 };

/* A LOOP of GEMM tiles: its kernel, and each iteration's tile: first column c0 and
 * row r0, group g, batch item b, and its int rows m and columns n. */
typedef struct {
    Kernel *k;
    KExpr *c0, *r0, *g, *b, *m, *n;
} Tiles;

/* The int length of the tile from `start` of a dimension of `total`, at most `len`. */
static KExpr *tile_len(KBuilder *b, int64_t total, KExpr *start, int64_t len) {
    if (start->kind == KE_INT)
        return k_i32(b, total - start->i < len ? total - start->i : len);
    KExpr *left = k_sub(b, k_int(b, total), start);
    return k_select(b, k_lt(b, left, k_int(b, len)), k_cast(b, KT_I32, left), k_i32(b, len));
}

/* A LOOP of GEMM tiles for node n: one iteration per (batch, group, row tile, column
 * tile) of a rows x cols result. Tiles run along the columns when there are many,
 * else along the rows, and a short result (the last layers' 7x7 positions) still
 * gets a few column tiles to share among the threads. images: the batch items, or
 * with one batch the rows, are n's images in order (kernel_follows). */
static int gemm_tiles(Program *p, const Node *n, int64_t batches, int64_t groups, int64_t rows, int64_t cols,
                      bool images, Tiles *t, Diag *d) {
    int64_t tc = cols, tr = rows;
    if (cols >= 2 * TILE_COLS) { /* an even count of equal tiles, so that two threads share them evenly */
        int64_t count = (cols + TILE_COLS - 1) / TILE_COLS;
        count += count % 2;
        tc = (cols / count + 15) / 16 * 16;
    } else if (rows >= 2 * TILE_ROWS) {
        tr = TILE_ROWS;
    }
    if (tr == rows && tc == cols && rows < 2 * TILE_ROWS && cols >= 4 * MIN_TILE_COLS)
        tc = (cols / 4 + MIN_TILE_COLS - 1) / MIN_TILE_COLS * MIN_TILE_COLS;
    int64_t n_tc = (cols + tc - 1) / tc, n_tr = (rows + tr - 1) / tr;
    Kernel *k = kernel_loop(p, n, "gemm", batches * groups * n_tr * n_tc, 1, d);
    if (!k)
        return -1;
    const Type *y = &p->g->values[n->out[0]].type;
    if (images && batches > 1)
        kernel_follows(p, k, y, k->count, 1, 1);
    else if (images && groups == 1)
        kernel_follows(p, k, y, rows, tr, n_tc);
    KBuilder *b = &k->b;
    KExpr *i = k_var(b, k->iter);
    t->k = k;
    t->c0 = let_index(b, "c0", k_mul(b, k_mod(b, i, k_int(b, n_tc)), k_int(b, tc)));
    t->r0 = let_index(b, "r0", k_mul(b, k_mod(b, k_div(b, i, k_int(b, n_tc)), k_int(b, n_tr)), k_int(b, tr)));
    t->g = let_index(b, "g", k_mod(b, k_div(b, i, k_int(b, n_tc * n_tr)), k_int(b, groups)));
    t->b = batches > 1 ? let_index(b, "b", k_div(b, i, k_int(b, n_tc * n_tr * groups))) : k_int(b, 0);
    t->m = tile_len(b, rows, t->r0, tr);
    t->n = tile_len(b, cols, t->c0, tc);
    if (t->m->kind != KE_INT)
        t->m = k_var(b, kb_let(b, "m", KT_I32, t->m));
    if (t->n->kind != KE_INT)
        t->n = k_var(b, kb_let(b, "n", KT_I32, t->n));
    return 0;
}

/* A tile's length as the int64 epilogue loops take it. */
static KExpr *as_index(KBuilder *b, KExpr *e) {
    return e->kind == KE_INT ? k_int(b, e->i) : k_cast(b, KT_I64, e);
}

static int gemm_too_large(const Node *n, int64_t rows, int64_t cols, int64_t depth, Diag *d) {
    return diag_error(d, n->loc, "%s: a GEMM of %lld x %lld x %lld is too large for BLAS",
                      op_table[n->op].name, (long long)rows, (long long)cols, (long long)depth);
}

/* The bias of a tile's element: base + q (a row of channels) or base + r. */
static KExpr *bias_along_q(KBuilder *b, KExpr *r, KExpr *q, const void *base) {
    (void)r;
    return k_add(b, *(KExpr *const *)base, q);
}

static KExpr *bias_along_r(KBuilder *b, KExpr *r, KExpr *q, const void *base) {
    (void)q;
    return k_add(b, *(KExpr *const *)base, r);
}

/* The GEMM as a LOOP over (batch item (nchw), group, row tile, column tile): each
 * iteration runs cblas_sgemm on its tile and adds the bias while the tile is in
 * cache. The column matrix is the scratch, or x itself. */
static int gemm(Program *p, const Node *n, const Conv *c, bool pointwise, int64_t scratch_bytes, Diag *d) {
    int64_t cg = c->x.c / c->groups, og = c->y.c / c->groups, depth = cg * c->taps;
    int64_t rows = c->nhwc ? c->y.n * c->positions : og, cols = c->nhwc ? og : c->positions;
    if (!fits_int(rows) || !fits_int(cols) || !fits_int(depth * c->groups) || !fits_int(c->y.c))
        return gemm_too_large(n, rows, cols, depth, d);
    int64_t batches = c->nhwc ? 1 : c->y.n;
    Tiles t;
    if (gemm_tiles(p, n, batches, c->groups, rows, cols, true, &t, d))
        return -1;
    Kernel *k = t.k;
    k->scratch_bytes = scratch_bytes;
    k->flops = lower_flops(6, (int64_t[]){2, rows, cols, depth, c->groups, batches});
    KBuilder *b = &k->b;
    int src = pointwise ? kb_value(b, c->xv, false) : kb_scratch(b), w = kb_value(b, c->wv, false),
        y = kb_value(b, c->yv, true);
    KExpr *one = k_f32(b, 1), *zero = k_f32(b, 0);
    if (c->nhwc) {
        /* y[rows, og] = cols[rows, depth] x w[og, depth]^T, rows of y y.c apart */
        KExpr *tile = k_var(b, kb_let(b, "tile", KT_I64, plus(b, plus(b, t.c0, t.g, og), t.r0, c->y.c)));
        KExpr *at_src = plus(b, k_mul(b, t.g, k_int(b, depth)), t.r0, c->groups * depth);
        kb_sgemm(b, false, true, t.m, t.n, depth, one, k_addr(b, src, at_src), c->groups * depth,
                 k_addr(b, w, k_mul(b, plus(b, t.c0, t.g, og), k_int(b, depth))), depth, zero,
                 k_addr(b, y, tile), c->y.c);
        KExpr *bias_base = plus(b, t.c0, t.g, og);
        kb_tile_epilogue(b, p, c->node, c->epilogue, c->bv, bias_along_q, &bias_base, y, tile,
                         as_index(b, t.m), as_index(b, t.n), c->y.c, 1);
    } else {
        /* y[og, positions] = w[og, depth] x cols[depth, positions], per batch item and group */
        int64_t src_batch = pointwise ? c->x.sn : c->groups * depth * c->positions;
        KExpr *rows_at = plus(b, t.r0, t.g, og);
        KExpr *tile =
            k_var(b, kb_let(b, "tile", KT_I64, plus(b, plus(b, t.c0, rows_at, cols), t.b, c->y.sn)));
        KExpr *at_src = plus(b, plus(b, t.c0, t.g, depth * c->positions), t.b, src_batch);
        kb_sgemm(b, false, false, t.m, t.n, depth, one, k_addr(b, w, k_mul(b, rows_at, k_int(b, depth))),
                 depth, k_addr(b, src, at_src), cols, zero, k_addr(b, y, tile), cols);
        kb_tile_epilogue(b, p, c->node, c->epilogue, c->bv, bias_along_r, &rows_at, y, tile, as_index(b, t.m),
                         as_index(b, t.n), cols, 1);
    }
    return 0;
}

/* ---- conv as an implicit GEMM on packed weights ---- */

/* Whether conv c is a GEMM on packed weights (lower_packed.c): the C target, channels
 * last, weights known now, and taps that the micro-kernel's segments of the depth
 * hold. */
static bool packed_applies(const Program *p, const Conv *c) {
    return p->vector_floats > 0 && c->nhwc && p->buf[c->wv].kind == BUF_WEIGHT &&
           c->taps <= KILN_GEMM_SEGMENTS;
}

static bool is_conv(const Node *n) {
    return n && (n->op == OP_CONV || n->op == OP_FUSED_CONV);
}

/* How lower_conv computes a conv. */
typedef enum {
    CONV_DEPTHWISE_ELEMENTS, /* depthwise_elements */
    CONV_DEPTHWISE_NHWC,     /* depthwise_nhwc */
    CONV_DEPTHWISE,          /* depthwise */
    CONV_IMPLICIT_GEMM,      /* conv_gemm */
    CONV_WINOGRAD,           /* lower_winograd */
    CONV_PACKED,             /* packed_conv */
    CONV_BLAS,               /* im2col (but for a 1x1 conv) and a BLAS GEMM */
} ConvPlan;

static ConvPlan conv_plan(const Program *p, const Node *n, const Conv *c) {
    bool depthwise = c->x.c == c->groups && c->groups > 1;
    if (depthwise && p->target == TARGET_CUDA)
        return CONV_DEPTHWISE_ELEMENTS;
    if (depthwise && c->nhwc && c->y.c == c->groups)
        return CONV_DEPTHWISE_NHWC;
    if (depthwise)
        return CONV_DEPTHWISE;
    if (!p->blas && !packed_applies(p, c))
        return CONV_IMPLICIT_GEMM;
    if (winograd_applies(p, n))
        return CONV_WINOGRAD;
    return packed_applies(p, c) ? CONV_PACKED : CONV_BLAS;
}

/* The layout pass's transpose of conv n's input to channels last, where n reads
 * it through a padded copy (packed_conv) and nothing else reads it: the copy then
 * reads the transpose's channels-first input, and the transpose computes nothing
 * (a model's first conv: one pass over the image instead of two). NULL otherwise. */
static const Node *padded_from_transpose(const Program *p, const Node *n, const Conv *c) {
    const Value *x = &p->g->values[c->xv];
    const Node *t = x->node >= 0 ? p->g->nodes[x->node] : NULL;
    if (!t || t->op != OP_TRANSPOSE || p->uses[c->xv] != 1 || n->in[0] != c->xv ||
        conv_plan(p, n, c) != CONV_PACKED)
        return NULL;
    bool pads = false;
    for (int s = 0; s < 2 * c->ns; s++)
        pads = pads || c->pads[s] != 0;
    const Attr *perm = node_attr(t, ATTR_PERM);
    int rank = x->type.rank;
    bool to_last = perm->set && perm->n == rank && perm->ints[0] == 0 && perm->ints[rank - 1] == 1;
    for (int j = 1; to_last && j < rank - 1; j++)
        to_last = perm->ints[j] == j + 1;
    return pads && to_last ? t : NULL;
}

bool transpose_feeds_padded_conv(const Program *p, const Node *t) {
    for (int i = 0; i < p->g->n_nodes; i++) {
        const Node *n = p->g->nodes[i];
        if (is_conv(n) && n->in[0] == t->out[0]) {
            Conv c = conv_of(p, n);
            return padded_from_transpose(p, n, &c) == t;
        }
    }
    return false;
}

/* Zeros into the scratch at row + [from, to). */
static void zeros(KBuilder *b, int scratch, KExpr *row, int64_t from, int64_t to) {
    if (from >= to)
        return;
    KExpr *j = k_var(b, kb_for(b, "j", KT_I64, k_int(b, from), k_int(b, to), NULL, 0));
    kb_store(b, scratch, k_add(b, row, j), k_f32(b, 0));
    kb_end(b);
}

/* The LOOP copying x, channels last, into the scratch with its padding as zeros,
 * spatial sizes sp: one iteration per row along the last spatial dim (a batch item
 * and a position in the others), all zeros where that position is padding. */
static int pad_input(Program *p, const Node *n, const Conv *c, const int64_t *sp, int64_t bytes, Diag *d) {
    Kernel *k = scratch_of_x(p, n, c, "pad", bytes, d);
    if (!k)
        return -1;
    KBuilder *b = &k->b;
    Coords at = coords_zero(b);
    Dim dims[MAX_SPATIAL];
    int nd = 0, last = c->ns - 1;
    int64_t ch = c->x.c, row_len = sp[last] * ch, left = c->pads[last] * ch, width = c->x.sp[last] * ch;
    dims[nd++] = dim("b", c->x.n, &at.b);
    for (int s = 0; s < last; s++)
        dims[nd++] = dim(p_name[s], sp[s], &at.p[s]);
    KExpr *i = iterate_dims(k, dims, nd, row_len);
    kernel_follows(p, k, &p->g->values[n->out[0]].type, k->count, 1, 1); /* image by image */
    KExpr *inside = NULL;
    for (int s = 0; s < last; s++) {
        at.in[s] = k_var(b, kb_let(b, in_name[s], KT_I64, k_sub(b, at.p[s], k_int(b, c->pads[s]))));
        inside = and_also(b, inside, within(b, at.in[s], c->x.sp[s]));
    }
    int x = kb_value(b, c->xv, false), scratch = kb_scratch(b);
    KExpr *row = k_var(b, kb_let(b, "row", KT_I64, k_mul(b, i, k_int(b, row_len))));
    if (inside)
        kb_if(b, inside);
    KExpr *src = k_var(b, kb_let(b, "src", KT_I64, x_offset(b, c, at.b, NULL, 1, at.in)));
    zeros(b, scratch, row, 0, left);
    KExpr *to = k_add(b, row, k_int(b, left));
    if (c->x.sc == 1 && c->x.ss[last] == ch) { /* a row of x is a run of memory */
        KExpr *j = k_var(b, kb_for(b, "j", KT_I64, k_int(b, 0), k_int(b, width), NULL, 0));
        kb_store(b, scratch, k_add(b, to, j), k_load(b, x, k_add(b, src, j)));
        kb_end(b);
    } else { /* channels first (padded_from_transpose): the copy is the transpose */
        KExpr *q = k_var(b, kb_for(b, "q", KT_I64, k_int(b, 0), k_int(b, c->x.sp[last]), NULL, 0));
        KExpr *o = k_var(b, kb_for(b, "o", KT_I64, k_int(b, 0), k_int(b, ch), NULL, 0));
        kb_store(b, scratch, k_add(b, to, k_madd(b, q, ch, o)),
                 k_load(b, x, plus(b, plus(b, src, q, c->x.ss[last]), o, c->x.sc)));
        end_blocks(b, 2);
    }
    zeros(b, scratch, row, left + width, row_len);
    if (inside) {
        kb_else(b);
        zeros(b, scratch, row, 0, row_len);
        kb_end(b);
    }
    return 0;
}

/* The digit of `size` steps of `step` positions along a spatial dim of `pitch`
 * elements. None for a size of 1, whose step may lie far outside x (a stride past
 * the input, for its one output position) and times the pitch overflow; a longer
 * run of steps fits inside x, or its padded copy, whose size is checked. */
static void conv_digit(OffsetMap *m, int64_t size, int64_t step, int64_t pitch) {
    if (size > 1)
        offset_digit(m, size, step * pitch);
}

/* conv c as a GEMM per group, y[:, g] = A x w[g]^T, on w packed now: A's row r (a
 * batch item and output position) and step kk of its depth (a tap and channel of
 * the group) are offsets into x, or into its padded copy in the scratch, so no
 * column matrix is gathered (an implicit GEMM). In the copy every tap of every
 * output position lies inside, so the micro-kernel tests nothing. */
static int packed_conv(Program *p, const Node *n, const Conv *c, Diag *d) {
    int64_t cg = c->x.c / c->groups, og = c->y.c / c->groups, depth = cg * c->taps;
    int64_t sp[MAX_SPATIAL], sizes[MAX_SPATIAL + 3], bytes = 0;
    bool pads = false;
    sizes[0] = c->x.n;
    for (int s = 0; s < c->ns; s++) {
        sp[s] = sizes[s + 1] = c->x.sp[s] + c->pads[s] + c->pads[c->ns + s];
        pads = pads || sp[s] != c->x.sp[s];
    }
    sizes[c->ns + 1] = c->x.c;
    sizes[c->ns + 2] = sizeof(float);
    const Node *t = padded_from_transpose(p, n, c);
    Conv from = *c;
    if (t) {
        from.xv = t->in[0];
        from.x = view_of(&p->g->values[from.xv].type, false);
    }
    if (pads && ((bytes = lower_size(n, "padded input", c->ns + 3, sizes, d)) < 0 ||
                 pad_input(p, n, &from, sp, bytes, d)))
        return -1;
    PackedGemm g = {.batch = c->groups,
                    .rows = c->y.n * c->positions,
                    .cols = og,
                    .depth = depth,
                    .bias = c->bv,
                    .a_batch = cg,
                    .y_ld = c->y.c,
                    .y_batch = og,
                    .bias_batch = og,
                    .b = (const float *)(p->weights + p->buf[c->wv].offset),
                    .b_depth = {1, {depth}, {1}},
                    .b_q = depth,
                    .b_batch = og * depth,
                    .node = n,
                    .epilogue = c->epilogue};
    int64_t pitch[MAX_SPATIAL], image = c->x.c; /* the strides of the spatial dims, and of an image */
    for (int s = c->ns - 1; s >= 0; s--) {
        pitch[s] = image;
        image *= sp[s];
    }
    offset_digit(&g.a_rows, c->y.n, image);
    for (int s = 0; s < c->ns; s++)
        conv_digit(&g.a_rows, c->y.sp[s], c->strides[s], pitch[s]);
    for (int s = 0; s < c->ns; s++)
        conv_digit(&g.a_depth, c->w.sp[s], c->dilations[s], pitch[s]);
    offset_digit(&g.a_depth, cg, 1);
    Kernel *k = kernel_loop(p, n, "packed_gemm", packed_gemm_tiles(p, &g), 1, d);
    if (!k)
        return -1;
    k->scratch_bytes = bytes;
    k->flops = lower_flops(5, (int64_t[]){2, g.rows, og, depth, c->groups});
    if (pads)
        kernel_unread(k, c->xv); /* the GEMM reads the padded copy */
    g.a = pads ? kb_scratch(&k->b) : kb_value(&k->b, c->xv, false);
    g.y = kb_value(&k->b, c->yv, true);
    return kb_packed_gemm(p, k, &g, d);
}

/* ---- Direct loops: depthwise conv and conv_transpose ---- */

/* A depthwise conv's FLOPs: a multiply-add per tap of every output element. */
static int64_t depthwise_flops(const Conv *c) {
    return lower_flops(5, (int64_t[]){2, c->y.n, c->y.c, c->positions, c->taps});
}

/* Opens the loops over a depthwise conv's taps: for each spatial dim but the last,
 * k{i} and, where the input position in{i} lies inside x, a block; then the loop
 * over the last dim's taps with the row range (row_range) inside it. Returns the
 * blocks opened, for the caller to close. */
static int open_tap_loops(KBuilder *b, const Conv *c, Coords *at, RowRange *rr) {
    int last = c->ns - 1, opened = 0;
    for (int i = 0; i < c->ns; i++) {
        at->k[i] = k_var(b, kb_for(b, k_name[i], KT_I64, k_int(b, 0), k_int(b, c->w.sp[i]), NULL, 0));
        opened++;
        if (i == last)
            break;
        at->in[i] = k_var(b, kb_let(b, in_name[i], KT_I64, input_pos(b, c, i, at->p[i], at->k[i])));
        kb_if(b, within(b, at->in[i], c->x.sp[i]));
        opened++;
    }
    *rr = row_range(b, c, at->k[last]);
    return opened;
}

/* One iteration per row of outputs along the last spatial dim, input channel o / m:
 * the row starts at the bias, and each tap adds its weight times the input row
 * over the outputs whose input lies inside x. */
static int depthwise(Program *p, const Node *n, const Conv *c, Diag *d) {
    int last = c->ns - 1;
    int64_t run = c->y.sp[last], ys = c->y.ss[last];
    Kernel *k =
        kernel_loop(p, n, "depthwise", c->y.n * c->y.c * c->positions / run, grain_for(c->taps * run), d);
    if (!k)
        return -1;
    kernel_follows(p, k, &p->g->values[n->out[0]].type, k->count, 1, 1); /* image by image */
    k->flops = depthwise_flops(c);
    KBuilder *b = &k->b;
    Coords at = coords_zero(b);
    Dim dims[KILN_MAX_RANK];
    int nd = output_dims(c, dims, &at);
    /* the iteration leaves out the last spatial dim: the row */
    if (c->nhwc)
        dims[nd - 2] = dims[nd - 1];
    nd--;
    let_dims(b, k_var(b, k->iter), dims, nd);
    int64_t m = c->y.c / c->groups;
    KExpr *ch = m > 1 ? k_var(b, kb_let(b, "c", KT_I64, k_div(b, at.o, k_int(b, m)))) : at.o;
    int x = kb_value(b, c->xv, false), w = kb_value(b, c->wv, false), y = kb_value(b, c->yv, true);
    KExpr *row_at = plus(b, c->y.n > 1 ? k_mul(b, at.b, k_int(b, c->y.sn)) : k_int(b, 0), at.o, c->y.sc);
    for (int i = 0; i < last; i++)
        row_at = plus(b, row_at, at.p[i], c->y.ss[i]);
    KExpr *row = k_var(b, kb_let(b, "row", KT_I64, row_at));
    KExpr *pl = k_var(b, kb_for(b, p_name[last], KT_I64, k_int(b, 0), k_int(b, run), NULL, 0));
    kb_store(b, y, plus(b, row, pl, ys), bias_or_zero(b, c, at.o));
    kb_end(b);
    RowRange rr;
    int opened = open_tap_loops(b, c, &at, &rr);
    KExpr *wi = k_mul(b, at.o, k_int(b, c->w.sn));
    for (int i = 0; i < c->ns; i++)
        wi = plus(b, wi, at.k[i], c->w.ss[i]);
    KExpr *wk = k_var(b, kb_let(b, "wk", KT_F32, k_load(b, w, wi)));
    at.in[last] = rr.off;
    KExpr *base = k_var(b, kb_let(b, "base", KT_I64, x_offset(b, c, at.b, ch, 1, at.in)));
    pl = k_var(b, kb_for(b, p_name[last], KT_I64, k_var(b, rr.lo), k_var(b, rr.hi), NULL, 0));
    kb_store_add(b, y, plus(b, row, pl, ys),
                 k_mul(b, k_load(b, x, plus(b, base, pl, c->strides[last] * c->x.ss[last])), wk));
    kb_end(b);
    end_blocks(b, opened);
    kb_tile_epilogue(b, p, c->node, c->epilogue, -1, NULL, NULL, y, row, k_int(b, 1), k_int(b, run), 0, ys);
    return 0;
}

/* Depthwise with channels last (one channel per group): one iteration per output
 * row along the last spatial dim, all channels of a position contiguous, so each
 * tap adds weight x input over whole channel vectors. The weights, [C, k..., 1],
 * are read tap-major: relaid at compile time into the kernel's table when they
 * are known then (a param or const), else read with a stride. */
/* The depthwise weights known now, [C, k..., 1], relaid tap-major into t [tap][channel]. */
static void relay_depthwise(const Program *p, const Conv *c, float *t) {
    int64_t ch = c->y.c, taps = c->taps;
    const float *w = (const float *)(p->weights + p->buf[c->wv].offset);
    for (int64_t o = 0; o < ch; o++)
        for (int64_t tap = 0; tap < taps; tap++)
            t[tap * ch + o] = w[o * taps + tap];
}

/* Those weights as k's table. */
static int relay_depthwise_weights(Program *p, const Node *n, const Conv *c, Kernel *k, Diag *d) {
    float *t = ir_malloc(sizeof(float) * (size_t)(c->taps * c->y.c) + 1);
    if (!t)
        return diag_error(d, n->loc, "out of memory");
    relay_depthwise(p, c, t);
    int rc = program_table(p, k, t, (int64_t)sizeof(float) * c->taps * c->y.c, d);
    ir_free(t);
    return rc;
}

/* Whether depthwise conv c runs in vector registers: 2 spatial dims and weights
 * known now, on the C target. */
static bool depthwise_in_vectors(const Program *p, const Conv *c) {
    return p->vector_floats > 0 && c->ns == 2 && p->buf[c->wv].kind == BUF_WEIGHT;
}

/* A depthwise conv in vectors runs a row of outputs at a time through
 * kiln_depthwise_row (runtime/kernels.c), compiled once, rather than a copy of its
 * loops per layer: those were two thirds of MobileNetV2's generated code. Its
 * kernel's table holds the weights tap-major (relay_depthwise), then at
 * depthwise_block_at the KilnWindow that the call reads; the table's floats from
 * depthwise_table_floats on are the caller's. */
enum { DEPTHWISE_BLOCK_FLOATS = (sizeof(KilnWindow) + 63) / 64 * 16 };

static int64_t depthwise_block_at(const Conv *c) {
    return (c->taps * c->y.c + 15) / 16 * 16;
}

static int64_t depthwise_table_floats(const Conv *c) {
    return depthwise_block_at(c) + DEPTHWISE_BLOCK_FLOATS;
}

/* Whether the epilogue of depthwise conv c is relu or clip of the conv's result
 * alone, which kiln_depthwise_row applies as it stores (its kind and limits then
 * in *w): the epilogue's loop over the row cost a quarter of a MobileNet's
 * depthwise kernel. */
static bool window_activation(const Conv *c, KilnWindow *w) {
    const Expr *e = c->epilogue;
    int64_t act;
    double lo, hi;
    if (!e || !library_act(e, &act, &lo, &hi) || act == KILN_ACT_GELU || e->arg[0]->kind != EXPR_INPUT ||
        e->arg[0]->input != 0)
        return false;
    w->act = act;
    w->lo = (float)lo;
    w->hi = (float)hi;
    return true;
}

/* The epilogue that the code after kiln_depthwise_row computes for c. */
static const Expr *row_epilogue(const Conv *c) {
    KilnWindow w;
    return window_activation(c, &w) ? NULL : c->epilogue;
}

/* ring: the rows of the window's ring (KilnWindow), 0 for none. */
static void fill_depthwise_table(const Program *p, const Conv *c, float *t, int64_t ring) {
    relay_depthwise(p, c, t);
    KilnWindow block = window_block(&c->x, c->w.sp, c->strides, c->pads, c->dilations, c->y.sp[1]);
    block.ring = ring;
    window_activation(c, &block);
    memcpy(t + depthwise_block_at(c), &block, sizeof block);
}

/* Row p0 of image `image` (an offset into x) of that depthwise conv into y at
 * `row`, with the activation of window_activation but not the rest of the epilogue;
 * `table` the kernel's. */
static void depthwise_row(KBuilder *b, const Conv *c, int x, int table, int bias, int y, KExpr *image,
                          KExpr *p0, KExpr *row) {
    KExpr *zero = k_int(b, 0);
    kb_call(b, "kiln_depthwise_row", 6,
            (KExpr *[]){k_addr(b, table, k_int(b, depthwise_block_at(c))), k_addr(b, x, image),
                        k_addr(b, table, zero), bias >= 0 ? k_addr(b, bias, zero) : zero, k_addr(b, y, row),
                        p0});
}

/* The image and the row p0 of LOOP iteration i over (batch item, row). */
static void depthwise_iteration(KBuilder *b, const Conv *c, KExpr *i, KExpr **image, KExpr **p0) {
    int64_t ho = c->y.sp[0];
    *image = c->y.n > 1 ? let_index(b, "image", k_mul(b, k_div(b, i, k_int(b, ho)), k_int(b, c->x.sn)))
                        : k_int(b, 0);
    *p0 = c->y.n > 1 ? let_index(b, "p0", k_mod(b, i, k_int(b, ho))) : i;
}

/* That depthwise conv, one iteration per row of outputs (depthwise_row), each row
 * then taking the epilogue. */
static int depthwise_vectors(Program *p, const Node *n, const Conv *c, Diag *d) {
    int64_t ch = c->y.c, ho = c->y.sp[0], wo = c->y.sp[1];
    Kernel *k = kernel_loop(p, n, "depthwise", c->y.n * ho, grain_for(c->taps * wo * ch), d);
    if (!k)
        return -1;
    kernel_follows(p, k, &p->g->values[n->out[0]].type, k->count, 1, 1); /* image by image */
    float *table = ir_calloc((size_t)depthwise_table_floats(c), sizeof(float));
    if (!table)
        return diag_error(d, n->loc, "out of memory");
    fill_depthwise_table(p, c, table, 0);
    int rc = program_table(p, k, table, (int64_t)sizeof(float) * depthwise_table_floats(c), d);
    ir_free(table);
    if (rc)
        return -1;
    k->flops = lower_flops(5, (int64_t[]){2, c->y.n, ch, c->positions, c->taps});
    KBuilder *b = &k->b;
    int x = kb_value(b, c->xv, false), w = kb_table(b), y = kb_value(b, c->yv, true),
        bias = c->bv >= 0 ? kb_value(b, c->bv, false) : -1;
    KExpr *i = k_var(b, k->iter), *image, *p0;
    depthwise_iteration(b, c, i, &image, &p0);
    KExpr *row = let_index(b, "row", k_mul(b, i, k_int(b, wo * ch)));
    depthwise_row(b, c, x, w, bias, y, image, p0, row);
    kb_tile_epilogue(b, p, c->node, row_epilogue(c), -1, NULL, NULL, y, row, k_int(b, 1), k_int(b, wo * ch),
                     0, 1);
    return 0;
}

static int depthwise_nhwc(Program *p, const Node *n, const Conv *c, Diag *d) {
    if (depthwise_in_vectors(p, c))
        return depthwise_vectors(p, n, c, d);
    int last = c->ns - 1;
    int64_t run = c->y.sp[last], ch = c->y.c, taps = c->taps;
    Kernel *k = kernel_loop(p, n, "depthwise", c->y.n * c->positions / run, grain_for(c->taps * run * ch), d);
    if (!k)
        return -1;
    kernel_follows(p, k, &p->g->values[n->out[0]].type, k->count, 1, 1); /* image by image */
    k->flops = depthwise_flops(c);
    bool relaid = p->buf[n->in[1]].kind == BUF_WEIGHT;
    if (relaid && relay_depthwise_weights(p, n, c, k, d))
        return -1;
    KBuilder *b = &k->b;
    Coords at = coords_zero(b);
    Dim dims[KILN_MAX_RANK];
    int nd = output_dims(c, dims, &at) - 2; /* without the last spatial dim and the channels */
    let_dims(b, k_var(b, k->iter), dims, nd);
    int x = kb_value(b, c->xv, false), w = relaid ? kb_table(b) : kb_value(b, c->wv, false),
        y = kb_value(b, c->yv, true);
    KExpr *row_at = c->y.n > 1 ? k_mul(b, at.b, k_int(b, c->y.sn)) : k_int(b, 0);
    for (int i = 0; i < last; i++)
        row_at = plus(b, row_at, at.p[i], c->y.ss[i]);
    KExpr *row = let_index(b, "row", row_at);
    if (c->bv >= 0) {
        KExpr *q = k_var(b, kb_for(b, "q", KT_I64, k_int(b, 0), k_int(b, run), NULL, 0));
        KExpr *o = k_var(b, kb_for(b, "o", KT_I64, k_int(b, 0), k_int(b, ch), NULL, 0));
        kb_store(b, y, k_add(b, row, k_madd(b, q, ch, o)), bias_or_zero(b, c, o));
        end_blocks(b, 2);
    } else {
        KExpr *q = k_var(b, kb_for(b, "q", KT_I64, k_int(b, 0), k_int(b, run * ch), NULL, 0));
        kb_store(b, y, k_add(b, row, q), k_f32(b, 0));
        kb_end(b);
    }
    RowRange rr;
    int opened = open_tap_loops(b, c, &at, &rr);
    KExpr *tap = k_int(b, 0);
    int64_t tap_stride = 1;
    for (int i = c->ns - 1; i >= 0; i--) {
        tap = plus(b, tap, at.k[i], tap_stride);
        tap_stride *= c->w.sp[i];
    }
    KExpr *wk = k_var(b, kb_let(b, "wk", KT_I64, relaid ? k_mul(b, tap, k_int(b, ch)) : tap));
    at.in[last] = rr.off;
    KExpr *xrow = x_offset(b, c, at.b, NULL, 1, at.in);
    KExpr *pl = k_var(b, kb_for(b, p_name[last], KT_I64, k_var(b, rr.lo), k_var(b, rr.hi), NULL, 0));
    KExpr *xr = k_var(b, kb_let(b, "xr", KT_I64, plus(b, xrow, pl, c->strides[last] * c->x.ss[last])));
    KExpr *yr = k_var(b, kb_let(b, "yr", KT_I64, plus(b, row, pl, ch)));
    KExpr *o = k_var(b, kb_for(b, "o", KT_I64, k_int(b, 0), k_int(b, ch), NULL, 0));
    KExpr *wo = relaid ? o : k_mul(b, o, k_int(b, taps));
    kb_store_add(b, y, k_add(b, yr, o),
                 k_mul(b, k_load(b, x, k_add(b, xr, o)), k_load(b, w, k_add(b, wk, wo))));
    end_blocks(b, 2);
    end_blocks(b, opened);
    kb_tile_epilogue(b, p, c->node, c->epilogue, -1, NULL, NULL, y, row, k_int(b, 1), k_int(b, run * ch), 0,
                     1);
    return 0;
}

/* A depthwise conv (nchw or nhwc, any channel multiplier), one iteration per
 * output element, its taps summed in a register: the CUDA target's, where the row
 * loops above would give a layer a few hundred threads and leave the GPU idle. */
static int depthwise_elements(Program *p, const Node *n, const Conv *c, Diag *d) {
    Kernel *k = kernel_loop(p, n, "depthwise", 0, 1, d);
    if (!k)
        return -1;
    k->flops = depthwise_flops(c);
    KBuilder *b = &k->b;
    Coords at = coords_zero(b);
    Dim dims[KILN_MAX_RANK];
    iterate_dims(k, dims, output_dims(c, dims, &at), c->taps);
    kernel_follows(p, k, &p->g->values[n->out[0]].type, k->count, 1, 1); /* image by image */
    int64_t m = c->y.c / c->groups;
    KExpr *ch = m > 1 ? let_index(b, "c", k_div(b, at.o, k_int(b, m))) : at.o;
    int x = kb_value(b, c->xv, false), w = kb_value(b, c->wv, false);
    int acc = kb_decl(b, "acc", KT_F32, bias_or_zero(b, c, at.o));
    KExpr *wi = k_mul(b, at.o, k_int(b, c->w.sn)),
          *yi = plus(b, k_mul(b, at.b, k_int(b, c->y.sn)), at.o, c->y.sc);
    for (int s = 0; s < c->ns; s++) {
        at.k[s] = k_var(b, kb_for(b, k_name[s], KT_I64, k_int(b, 0), k_int(b, c->w.sp[s]), NULL, 0));
        at.in[s] = let_index(b, in_name[s], input_pos(b, c, s, at.p[s], at.k[s]));
        kb_if(b, within(b, at.in[s], c->x.sp[s]));
        wi = plus(b, wi, at.k[s], c->w.ss[s]);
        yi = plus(b, yi, at.p[s], c->y.ss[s]);
    }
    kb_accum(b, acc, k_mul(b, k_load(b, x, x_offset(b, c, at.b, ch, 1, at.in)), k_load(b, w, wi)));
    end_blocks(b, 2 * c->ns);
    kb_store_epilogue(b, p, n, c->epilogue, kb_value(b, c->yv, true), let_index(b, "at", yi), k_var(b, acc));
    return 0;
}

/* ---- A MobileNet block as one kernel: [1x1 expand,] depthwise conv, 1x1 project ----
 *
 * MobileNet's blocks end in a depthwise conv whose result only a 1x1 conv reads.
 * Apart, the depthwise kernel writes that result out to memory and the GEMM reads
 * it back; where it is large (the first blocks', megabytes), both cores running
 * wait on that traffic (MobileNetV2 on two: 2.69 -> 2.54 ms in a slow period of the
 * machine, 1% otherwise). Together, one iteration per row of the depthwise conv's
 * output computes that row, every channel, into a local array (depthwise_row),
 * finishes it with the depthwise conv's epilogue, and runs the 1x1 conv's GEMM
 * (kb_packed_gemm_item) on it, from the L1 cache, into the same row of the result.
 * The row lives on the stack of whichever thread runs it, so its floats are
 * bounded (FUSED_ROW_FLOATS); the depthwise result has no buffer at all.
 *
 * The block's first conv, a 1x1 expand whose result only the depthwise conv reads,
 * joins them where that result is large too (MobileNetV2's features.2: 4.8 MB an
 * image, written by one kernel and read back by the next at memory's pace). Its
 * rows are then computed where the depthwise conv reads them: an iteration runs a
 * band of consecutive output rows, and before each computes the expanded rows it
 * reads that the band has not yet (the expand's GEMM, a row at a time) into a ring
 * of as many rows as a tap column spans (KilnWindow's ring), also on the stack
 * (RING_FLOATS). A band's first rows overlap the band before it, computed by both:
 * bands are as tall as leaves FUSED_BANDS of them in the batch, so that the
 * threads share the work, and at a batch of 8 no row is computed twice. */
enum { FUSED_ROW_FLOATS = 16384, FUSED_MIN_BYTES = 512 << 10, FUSED_BANDS = 8 };

/* The ring's most floats (160 KiB, docs/abi.md's stack): EfficientNet-B0's 5x5 block
 * of 56 x 144 (40320) joined ran 20% faster than apart at batch 8. */
enum { RING_FLOATS = 40960 };

/* The narrowest expanded row computed alone: a GEMM of fewer rows wastes much of its
 * register tiles (7 rows are a tile of 6 and a tile of 1), and EfficientNet-B0's and
 * MobileNetV2's blocks of rows of 14 and 7 ran no faster joined, or slower. */
enum { EXPAND_MIN_WIDTH = 24 };

/* The first node reading value v as its input 0, or NULL. */
static const Node *first_reader(const Program *p, int v) {
    for (int i = 0; i < p->g->n_nodes; i++)
        if (p->g->nodes[i]->n_in > 0 && p->g->nodes[i]->in[0] == v)
            return p->g->nodes[i];
    return NULL;
}

/* Whether conv node `to` reads conv node `from`'s result, and nothing else does. */
static bool only_reader(const Program *p, const Node *from, const Node *to) {
    return from && to && is_conv(from) && is_conv(to) && to->in[0] == from->out[0] &&
           p->uses[from->out[0]] == 1;
}

/* Whether the inputs of conv node n's epilogue are scalars: it then reads nothing at
 * an element's offset, and may finish a result that has no buffer to read beside. */
static bool epilogue_reads_scalars(const Program *p, const Node *n) {
    for (int k = expr_first_input(n); n->op == OP_FUSED_CONV && k < n->n_in; k++)
        if (type_numel(&p->g->values[n->in[k]].type) != 1)
            return false;
    return true;
}

static bool large(const Program *p, int v) {
    return type_numel(&p->g->values[v].type) >= FUSED_MIN_BYTES / (int64_t)sizeof(float);
}

/* The input rows a column of c's taps spans. */
static int64_t tap_span(const Conv *c) {
    return (c->w.sp[0] - 1) * c->dilations[0] + 1;
}

/* Whether conv c is a depthwise conv, channels last, in vectors. */
static bool vector_depthwise(const Program *p, const Conv *c) {
    return c->nhwc && c->groups > 1 && c->x.c == c->groups && c->y.c == c->groups &&
           depthwise_in_vectors(p, c);
}

/* Whether conv node dn is a depthwise conv in vectors whose large result only conv
 * node pn reads, a 1x1 conv on packed weights, and the two run as one kernel. */
static bool depthwise_feeds_pointwise(const Program *p, const Node *dn, const Node *pn) {
    if (!only_reader(p, dn, pn))
        return false;
    Conv dw = conv_of(p, dn), pw = conv_of(p, pn);
    return vector_depthwise(p, &dw) && packed_applies(p, &pw) && is_pointwise(&pw) && pw.groups == 1 &&
           dw.y.sp[1] * dw.y.c <= FUSED_ROW_FLOATS && large(p, dw.yv) && epilogue_reads_scalars(p, dn);
}

/* The rows of a band of depthwise conv dw's output rows, and in *bands how many
 * bands an image has: FUSED_BANDS in the batch, or more. */
static int64_t band_rows(const Conv *dw, int64_t *bands) {
    int64_t ho = dw->y.sp[0], per_image = (FUSED_BANDS + dw->y.n - 1) / dw->y.n;
    int64_t band = (ho + per_image - 1) / (per_image < ho ? per_image : ho);
    *bands = (ho + band - 1) / band;
    return band;
}

/* The expanded rows that the bands of an image of depthwise conv dw compute, those
 * that two bands read twice. */
static int64_t band_input_rows(const Conv *dw) {
    int64_t bands, band = band_rows(dw, &bands), h = dw->x.sp[0], ho = dw->y.sp[0], rows = 0;
    for (int64_t first = 0; first < ho; first += band) {
        int64_t last = first + band < ho ? first + band - 1 : ho - 1;
        int64_t lo = first * dw->strides[0] - dw->pads[0],
                hi = last * dw->strides[0] - dw->pads[0] + tap_span(dw);
        rows += (hi < h ? hi : h) - (lo > 0 ? lo : 0);
    }
    return rows;
}

/* Whether conv node en is a 1x1 conv on packed weights whose large result only
 * depthwise conv node dn (in vectors) reads, with rows of EXPAND_MIN_WIDTH or more,
 * the ring of dn's input rows fits, and the bands compute at most an eighth of the
 * expanded rows twice (MobileNetV2's 56-row stride-1 blocks at batch 1, 2 rows in 7
 * twice, ran slower than apart). */
static bool pointwise_feeds_depthwise(const Program *p, const Node *en, const Node *dn) {
    if (!only_reader(p, en, dn))
        return false;
    Conv ex = conv_of(p, en), dw = conv_of(p, dn);
    return ex.nhwc && packed_applies(p, &ex) && is_pointwise(&ex) && ex.groups == 1 &&
           vector_depthwise(p, &dw) && dw.x.sp[1] >= EXPAND_MIN_WIDTH &&
           dw.x.sp[1] * dw.x.c <= RING_FLOATS / tap_span(&dw) && 8 * band_input_rows(&dw) <= 9 * dw.x.sp[0] &&
           large(p, ex.yv) && epilogue_reads_scalars(p, en);
}

/* The expand conv that the kernel of conv node dn computes too, or NULL. */
static const Node *expand_of(const Program *p, const Node *dn) {
    const Node *en = p->g->nodes[p->g->values[dn->in[0]].node];
    return pointwise_feeds_depthwise(p, en, dn) ? en : NULL;
}

/* A 1x1 conv's GEMM, c's weights packed from the table's float `at`. */
static PackedGemm pointwise_gemm(const Program *p, const Conv *c, int64_t batch, int64_t rows, int64_t at) {
    int64_t depth = c->x.c, cols = c->y.c;
    PackedGemm g = {.batch = batch,
                    .rows = rows,
                    .cols = cols,
                    .depth = depth,
                    .bias = c->bv,
                    .y_ld = cols,
                    .y_batch = rows * cols,
                    .b = (const float *)(p->weights + p->buf[c->wv].offset),
                    .b_depth = {1, {depth}, {1}},
                    .b_q = depth,
                    .table_at = at,
                    .node = c->node,
                    .epilogue = c->epilogue};
    offset_digit(&g.a_rows, rows, depth);
    offset_digit(&g.a_depth, depth, 1);
    return g;
}

/* The table of that kernel: dw's (fill_depthwise_table, its window reading a ring
 * of tap_span rows where there is an expand), then the expand's GEMM e, then the
 * project's g (each NULL: none, not both); NULL when memory runs out. */
static float *block_table(const Program *p, const Conv *dw, const PackedGemm *e, const PackedGemm *g,
                          int64_t *bytes) {
    const PackedGemm *last = g ? g : e;
    float *table = packed_gemm_table(p, last, last->table_at, bytes);
    int64_t e_bytes;
    float *e_table = e && g && table ? packed_gemm_table(p, e, e->table_at, &e_bytes) : NULL;
    if (e && g && !e_table) {
        ir_free(table);
        return NULL;
    }
    if (e_table) {
        memcpy(table + e->table_at, e_table + e->table_at,
               (size_t)e_bytes - sizeof(float) * (size_t)e->table_at);
        ir_free(e_table);
    }
    if (table)
        fill_depthwise_table(p, dw, table, e ? tap_span(dw) : 0);
    return table;
}

/* max(x, y) and min(x, y) of index expressions. */
static KExpr *k_max(KBuilder *b, KExpr *x, KExpr *y) {
    return k_select(b, k_lt(b, x, y), y, x);
}

static KExpr *k_min(KBuilder *b, KExpr *x, KExpr *y) {
    return k_select(b, k_lt(b, x, y), x, y);
}

/* Opens the loop over iteration i's band of output rows p0 of dw (`band` rows,
 * `bands` an image), and computes the expanded rows that row p0 reads and the ring
 * does not hold yet: the expand's GEMM e, from image `image` of its input into the
 * ring. The caller then computes row p0 from the ring, and closes the loop. */
static void open_band(const Program *p, KBuilder *b, const Conv *dw, const PackedGemm *e, int table, KExpr *i,
                      int64_t band, int64_t bands, KExpr **image, KExpr **p0) {
    int64_t h = dw->x.sp[0], ho = dw->y.sp[0], span = tap_span(dw);
    *image = let_index(b, "image", k_div(b, i, k_int(b, bands)));
    KExpr *first = let_index(b, "band_lo", k_mul(b, k_mod(b, i, k_int(b, bands)), k_int(b, band)));
    KExpr *last = k_add(b, first, k_int(b, band));
    if (ho % band)
        last = let_index(b, "band_hi", k_min(b, last, k_int(b, ho)));
    int next = kb_decl(b, "next", KT_I64, k_int(b, 0)); /* the first row not in the ring */
    *p0 = k_var(b, kb_for(b, "p0", KT_I64, first, last, NULL, 0));
    KExpr *in0 =
        let_index(b, "in0", k_sub(b, k_mul(b, *p0, k_int(b, dw->strides[0])), k_int(b, dw->pads[0])));
    KExpr *hi = let_index(b, "hi", k_min(b, k_add(b, in0, k_int(b, span)), k_int(b, h)));
    KExpr *from = k_max(b, k_var(b, next), k_max(b, in0, k_int(b, 0)));
    KExpr *r = k_var(b, kb_for(b, "r", KT_I64, from, hi, NULL, 0));
    kb_packed_gemm_item(p, b, e, table, k_madd(b, *image, h, r), k_mod(b, r, k_int(b, span)));
    kb_end(b);
    kb_assign(b, next, hi);
}

/* Conv nodes en and pn (each NULL: none, not both) and dn between them, as one
 * kernel (see above). */
static int mobilenet_block(Program *p, const Node *en, const Node *dn, const Node *pn, Diag *d) {
    const Node *nodes[3] = {en, dn, pn}, *result = pn ? pn : dn;
    Conv c[3] = {{0}};
    Arena arena = {0};
    for (int f = 0; f < 3; f++)
        if (nodes[f]) {
            c[f] = conv_of(p, nodes[f]);
            if (nodes[f]->op == OP_FUSED_CONV && !(c[f].epilogue = node_expr(&arena, nodes[f], d))) {
                arena_free(&arena);
                return -1;
            }
        }
    const Conv *ex = &c[0], *dw = &c[1], *pw = &c[2];
    int64_t ch = dw->y.c, ho = dw->y.sp[0], wo = dw->y.sp[1], images = dw->y.n;
    int64_t bands = ho, band = en ? band_rows(dw, &bands) : 1; /* without an expand, a band is a row */
    int64_t at = depthwise_table_floats(dw);
    PackedGemm e = en ? pointwise_gemm(p, ex, ex->x.n * ex->x.sp[0], ex->x.sp[1], at) : (PackedGemm){0};
    e.a_batch = e.rows * e.depth;
    PackedGemm g = pn ? pointwise_gemm(p, pw, images * ho, wo, at + (en ? packed_gemm_floats(p, &e) : 0))
                      : (PackedGemm){0};
    Kernel *k = kernel_new(p, result, K_LOOP,
                           !en  ? "depthwise_pointwise"
                           : pn ? "pointwise_depthwise_pointwise"
                                : "pointwise_depthwise");
    int reads = (en ? en->n_in : 0) + dn->n_in + (pn ? pn->n_in : 0);
    int64_t bytes;
    float *table =
        k && !kernel_room(k, reads, 1) ? block_table(p, dw, en ? &e : NULL, pn ? &g : NULL, &bytes) : NULL;
    if (!table) {
        arena_free(&arena);
        return diag_error(d, result->loc, "out of memory");
    }
    int rc = program_table(p, k, table, bytes, d);
    ir_free(table);
    if (rc) {
        arena_free(&arena);
        return -1;
    }
    k->count = images * bands;
    kernel_follows(p, k, &p->g->values[result->out[0]].type, k->count, 1, 1); /* image by image */
    k->grain = grain_for(band * wo * ch * (dw->taps + (pn ? pw->y.c : 0) + (en ? ex->x.c : 0)));
    int64_t flops[3] = {en ? lower_flops(4, (int64_t[]){2, ex->x.n * ex->positions, ex->y.c, ex->x.c}) : 0,
                        depthwise_flops(dw),
                        pn ? lower_flops(4, (int64_t[]){2, images * ho * wo, pw->y.c, ch}) : 0};
    k->flops = 0;
    for (int f = 0; f < 3; f++) {
        /* the values between the three convs have no buffer: every input but those */
        for (int in = f > 0 && nodes[f - 1] ? 1 : 0; nodes[f] && in < nodes[f]->n_in; in++)
            if (nodes[f]->in[in] >= 0)
                kernel_reads(k, nodes[f]->in[in]);
        k->flops = k->flops > INT64_MAX - flops[f] ? INT64_MAX : k->flops + flops[f];
    }
    kernel_writes(k, result->out[0]);
    KBuilder *b = &k->b;
    int t = kb_table(b), bias = dw->bv >= 0 ? kb_value(b, dw->bv, false) : -1,
        y = kb_value(b, result->out[0], true);
    /* the depthwise row: into a local array the project reads, else into y */
    int row_buf = pn ? kb_array(b, "mid", KT_F32, wo * ch, 0, false, false) : y;
    KExpr *i = k_var(b, k->iter), *image, *p0, *row = i; /* row: of the result, over the batch */
    int x;
    if (en) {
        x = kb_array(b, "ring", KT_F32, tap_span(dw) * dw->x.sp[1] * dw->x.c, 0, false, false);
        e.a = kb_value(b, ex->xv, false);
        e.y = x;
        open_band(p, b, dw, &e, t, i, band, bands, &image, &p0);
        row = k_madd(b, image, ho, p0);
    } else {
        x = kb_value(b, dw->xv, false);
        depthwise_iteration(b, dw, i, &image, &p0);
    }
    KExpr *row_at = pn ? k_int(b, 0) : let_index(b, "row_at", k_mul(b, row, k_int(b, wo * ch)));
    depthwise_row(b, dw, x, t, bias, row_buf, en ? k_int(b, 0) : image, p0, row_at);
    kb_tile_epilogue(b, p, dn, row_epilogue(dw), -1, NULL, NULL, row_buf, row_at, k_int(b, 1),
                     k_int(b, wo * ch), 0, 1);
    if (pn) {
        g.a = row_buf;
        g.y = y;
        kb_packed_gemm_item(p, b, &g, t, row, row);
    }
    if (en)
        kb_end(b);
    for (int f = 0; f < 3; f++)
        if (c[f].epilogue)
            kernel_annotate(k, node_attr(nodes[f], ATTR_EXPR)->s);
    arena_free(&arena);
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

/* Sets the K_GEMM kernel's `v` to the element of x, batch item `batch`, channel
 * ch, that output position pos (flat over y's spatial dims) meets through tap
 * `tap` (flat over w's), zero in the padding; for conv_transpose, the element
 * whose output reaches pos through tap, zero where none does. */
static void load_x_element(Kernel *k, const Conv *c, KExpr *batch, KExpr *ch, KExpr *tap, KExpr *pos) {
    KBuilder *b = &k->b;
    bool transposed = c->node->op == OP_CONV_TRANSPOSE;
    KExpr *taps[MAX_SPATIAL], *out[MAX_SPATIAL], *in[MAX_SPATIAL], *inside = NULL;
    let_spatial(b, k_name, tap, c->w.sp, c->ns, taps);
    let_spatial(b, p_name, pos, c->y.sp, c->ns, out);
    for (int i = 0; i < c->ns; i++) {
        if (transposed) {
            /* in * stride - pad + k * dilation == p */
            KExpr *t = k_add(b, out[i], k_int(b, c->pads[i]));
            if (c->w.sp[i] > 1)
                t = k_sub(b, t, k_mul(b, taps[i], k_int(b, c->dilations[i])));
            t = let_index(b, t_name[i], t);
            in[i] = let_index(b, in_name[i], k_div(b, t, k_int(b, c->strides[i])));
            KExpr *hit = k_bin(b, KE_GE, t, k_int(b, 0));
            if (c->strides[i] > 1)
                hit = k_and(b, hit, k_bin(b, KE_EQ, k_mod(b, t, k_int(b, c->strides[i])), k_int(b, 0)));
            inside = and_also(b, inside, k_and(b, hit, k_lt(b, in[i], k_int(b, c->x.sp[i]))));
        } else {
            in[i] = let_index(b, in_name[i], input_pos(b, c, i, out[i], taps[i]));
            inside = and_also(b, inside, within(b, in[i], c->x.sp[i]));
        }
    }
    KExpr *x = k_load(b, kb_value(b, c->xv, false), x_offset(b, c, batch, ch, 1, in));
    kb_assign(b, k->gemm.v, k_select(b, inside, x, k_f32(b, 0)));
}

/* conv, fused_conv and conv_transpose as one implicit GEMM (see above). */
static int conv_gemm(Program *p, const Node *n, const Conv *c, Diag *d) {
    bool transposed = n->op == OP_CONV_TRANSPOSE;
    int64_t cg = c->x.c / c->groups, og = c->y.c / c->groups, depth = cg * c->taps;
    int64_t G = c->groups, taps = c->taps, positions = c->positions;
    Kernel *k = c->nhwc ? kernel_gemm(p, n, NULL, G, c->y.n * positions, og, depth, d)
                        : kernel_gemm(p, n, NULL, c->y.n * G, og, positions, depth, d);
    if (!k)
        return -1;
    gemm_follows(p, k, &p->g->values[n->out[0]].type, !c->nhwc); /* rows image by image, or items */
    KBuilder *b = &k->b;
    KExpr *bi = k_var(b, k->gemm.bi), *r = k_var(b, k->gemm.r), *q = k_var(b, k->gemm.q),
          *kk = k_var(b, k->gemm.kk);
    /* the output channel within its group, and the group */
    KExpr *o = c->nhwc ? q : r, *group = c->nhwc ? bi : k_mod(b, bi, k_int(b, G));
    for (int side = 0; side < 2; side++) {
        bool x_side = (side == 0) == c->nhwc; /* A is x's side with channels last, else B */
        kb_begin_block(b);
        KExpr *tap = NULL, *ch = NULL;
        if (x_side || transposed) { /* the element's tap and input channel */
            tap = let_index(b, "tap", c->nhwc ? k_div(b, kk, k_int(b, cg)) : k_mod(b, kk, k_int(b, taps)));
            ch = let_index(b, "ch",
                           c->nhwc ? k_madd(b, group, cg, k_mod(b, kk, k_int(b, cg)))
                                   : k_madd(b, group, cg, k_div(b, kk, k_int(b, taps))));
        }
        if (x_side) {
            /* its batch item (only where x has a batch, as x_offset reads it only then) and position */
            KExpr *batch = k_int(b, 0), *pos = q;
            if (c->x.n > 1)
                batch =
                    let_index(b, "b", c->nhwc ? k_div(b, r, k_int(b, positions)) : k_div(b, bi, k_int(b, G)));
            if (c->nhwc)
                pos = let_index(b, "pos", k_mod(b, r, k_int(b, positions)));
            load_x_element(k, c, batch, ch, tap, pos);
        } else if (transposed) {
            KExpr *kt[MAX_SPATIAL];
            let_spatial(b, k_name, tap, c->w.sp, c->ns, kt);
            KExpr *wi = plus(b, k_mul(b, ch, k_int(b, c->w.sn)), o, c->w.sc);
            for (int i = 0; i < c->ns; i++)
                wi = plus(b, wi, kt[i], c->w.ss[i]);
            kb_assign(b, k->gemm.v, k_load(b, kb_value(b, c->wv, false), wi));
        } else {
            KExpr *wi = k_madd(b, k_madd(b, group, og, o), depth, kk);
            kb_assign(b, k->gemm.v, k_load(b, kb_value(b, c->wv, false), wi));
        }
        if (side == 0)
            k->load_a = kb_take(b);
        else
            k->load_b = kb_take(b);
    }
    k->a_depth_inner = true; /* nhwc: x's channels; nchw: w's rows */
    k->b_depth_inner = c->nhwc && !transposed;
    /* the store: y[r, g * og + q] (nhwc), y[b, g * og + r, q] (nchw) */
    kb_begin_block(b);
    KExpr *channel = k_madd(b, group, og, o), *at;
    if (c->nhwc)
        at = k_madd(b, r, c->y.c, channel);
    else
        at = k_add(b, k_mul(b, k_div(b, bi, k_int(b, G)), k_int(b, c->y.sn)),
                   k_madd(b, channel, positions, q));
    KExpr *bias = c->bv >= 0 ? k_load(b, kb_value(b, c->bv, false), channel) : NULL;
    kb_gemm_store(k, p, n, c->epilogue, bias, at);
    k->store = kb_take(b);
    return 0;
}

/* conv_weight_grad as one implicit GEMM per group (see above). */
static int weight_grad_gemm(Program *p, const Node *n, const Conv *c, Diag *d) {
    int64_t cg = c->x.c / c->groups, og = c->y.c / c->groups, depth = cg * c->taps;
    int64_t positions = c->positions, taps = c->taps;
    Kernel *k = kernel_gemm(p, n, NULL, c->groups, og, depth, c->y.n * positions, d);
    if (!k)
        return -1;
    KBuilder *b = &k->b;
    KExpr *bi = k_var(b, k->gemm.bi), *r = k_var(b, k->gemm.r), *q = k_var(b, k->gemm.q),
          *kk = k_var(b, k->gemm.kk);
    KExpr *channel = k_madd(b, bi, og, r); /* dy's channel */
    kb_begin_block(b);
    KExpr *dy_at = c->nhwc ? k_madd(b, kk, c->y.c, channel)
                           : k_add(b, k_mul(b, k_div(b, kk, k_int(b, positions)), k_int(b, c->y.sn)),
                                   k_madd(b, channel, positions, k_mod(b, kk, k_int(b, positions))));
    kb_assign(b, k->gemm.v, k_load(b, kb_value(b, c->yv, false), dy_at));
    k->load_a = kb_take(b);
    kb_begin_block(b);
    KExpr *batch = c->x.n > 1 ? let_index(b, "b", k_div(b, kk, k_int(b, positions))) : k_int(b, 0);
    KExpr *pos = let_index(b, "pos", k_mod(b, kk, k_int(b, positions)));
    KExpr *tap = let_index(b, "tap", c->nhwc ? k_div(b, q, k_int(b, cg)) : k_mod(b, q, k_int(b, taps)));
    KExpr *ch = let_index(b, "ch",
                          c->nhwc ? k_madd(b, bi, cg, k_mod(b, q, k_int(b, cg)))
                                  : k_madd(b, bi, cg, k_div(b, q, k_int(b, taps))));
    load_x_element(k, c, batch, ch, tap, pos);
    k->load_b = kb_take(b);
    k->a_depth_inner = k->b_depth_inner = !c->nhwc;
    kb_begin_block(b);
    kb_gemm_store(k, p, n, NULL, NULL, k_madd(b, channel, depth, q));
    k->store = kb_take(b);
    return 0;
}

int lower_conv(Program *p, const Node *n, Diag *d) {
    const Node *reader = first_reader(p, n->out[0]);
    if (depthwise_feeds_pointwise(p, n, reader) || pointwise_feeds_depthwise(p, n, reader))
        return 0; /* the kernel of the conv reading it computes it */
    const Node *dn = p->g->nodes[p->g->values[n->in[0]].node];
    if (depthwise_feeds_pointwise(p, dn, n))
        return mobilenet_block(p, expand_of(p, dn), dn, n, d);
    const Node *en = expand_of(p, n);
    if (en)
        return mobilenet_block(p, en, n, NULL, d);
    Conv c = conv_of(p, n);
    Arena arena = {0};
    if (n->op == OP_FUSED_CONV && !(c.epilogue = node_expr(&arena, n, d)))
        return -1;
    int rc;
    switch (conv_plan(p, n, &c)) {
    case CONV_DEPTHWISE_ELEMENTS: rc = depthwise_elements(p, n, &c, d); break;
    case CONV_DEPTHWISE_NHWC: rc = depthwise_nhwc(p, n, &c, d); break;
    case CONV_DEPTHWISE: rc = depthwise(p, n, &c, d); break;
    case CONV_IMPLICIT_GEMM: rc = conv_gemm(p, n, &c, d); break;
    case CONV_WINOGRAD: rc = lower_winograd(p, n, c.epilogue, d); break;
    case CONV_PACKED: rc = packed_conv(p, n, &c, d); break;
    default: {
        bool pointwise = is_pointwise(&c);
        int64_t bytes = pointwise ? 0
                                  : lower_size(n, "im2col scratch", 5,
                                               (int64_t[]){c.y.n, c.positions, c.x.c, c.taps, 4}, d);
        rc = bytes < 0 || (!pointwise && im2col(p, n, &c, bytes, d)) ? -1
                                                                     : gemm(p, n, &c, pointwise, bytes, d);
    }
    }
    if (!rc && c.epilogue) {
        /* the kernel that finishes the result names what it fused */
        kernel_annotate(&p->kernels[p->n_kernels - 1], node_attr(n, ATTR_EXPR)->s);
    }
    arena_free(&arena);
    return rc;
}

/* The weight gradient's GEMM split along its sum: `splits` iterations each sum an
 * equal slice of the (batch item, position) rows into a partial dw in the scratch
 * after the column matrix, and a second LOOP adds the partials, in order, into dw.
 * For a small dw over many rows (ResNet's first layers: 64 x 147 over 100352 rows),
 * whose tiles would each read all of dy and of the columns again, and be too few
 * to share among the threads. 0: no split (a larger dw, or rows that no split
 * count divides). */
enum { MAX_SPLITS = 4 };

static int weight_grad_splits(const Conv *c, int64_t og, int64_t depth, int64_t inner) {
    if (!c->nhwc || c->groups != 1 || inner < 16 * (og > depth ? og : depth))
        return 0;
    for (int splits = MAX_SPLITS; splits >= 2; splits--)
        if (inner % splits == 0)
            return splits;
    return 0;
}

static int weight_grad_split(Program *p, const Node *n, const Conv *c, bool pointwise, int64_t cols_bytes,
                             int splits, Diag *d) {
    int64_t og = c->y.c, depth = c->x.c * c->taps, inner = c->y.n * c->positions, slice = inner / splits;
    int64_t at = cols_bytes / (int64_t)sizeof(float); /* the partials, after the columns */
    int64_t partial_bytes = lower_size(n, "partial sums", 4, (int64_t[]){splits, og, depth, 4}, d);
    if (partial_bytes < 0)
        return -1;
    Kernel *k = kernel_loop(p, n, "gemm", splits, 1, d);
    if (!k)
        return -1;
    /* cannot overflow: a split needs inner >= 16 og, so the partials (4 og depth
       floats) are at most a quarter of the columns (inner depth floats, which
       lower_size checked), and a pointwise conv has no columns */
    k->scratch_bytes = cols_bytes + partial_bytes;
    k->flops = lower_flops(4, (int64_t[]){2, og, depth, inner});
    KBuilder *b = &k->b;
    int src = pointwise ? kb_value(b, c->xv, false) : kb_scratch(b), dy = kb_value(b, c->yv, false),
        scratch = kb_scratch(b);
    KExpr *first = let_index(b, "first", k_mul(b, k_var(b, k->iter), k_int(b, slice)));
    kb_sgemm(b, true, false, k_i32(b, og), k_i32(b, depth), slice, k_f32(b, 1),
             k_addr(b, dy, k_mul(b, first, k_int(b, og))), og,
             k_addr(b, src, k_mul(b, first, k_int(b, depth))), depth, k_f32(b, 0),
             k_addr(b, scratch, plus(b, k_int(b, at), k_var(b, k->iter), og * depth)), depth);
    Kernel *sum = kernel_loop(p, n, "sum", og * depth, 4096, d);
    if (!sum)
        return -1;
    kernel_unread(sum, c->xv);
    kernel_unread(sum, c->yv);
    sum->scratch_bytes = k->scratch_bytes;
    b = &sum->b;
    scratch = kb_scratch(b);
    KExpr *e = k_var(b, sum->iter), *total = NULL;
    for (int j = 0; j < splits; j++) {
        KExpr *part = k_load(b, scratch, k_add(b, e, k_int(b, at + j * og * depth)));
        total = total ? k_add(b, total, part) : part;
    }
    kb_store(b, kb_value(b, c->wv, true), e, total);
    return 0;
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
    int splits = weight_grad_splits(&c, og, depth, inner);
    if (splits)
        return weight_grad_split(p, n, &c, pointwise, bytes, splits, d);
    Tiles t;
    if (gemm_tiles(p, n, 1, c.groups, og, depth, false, &t, d))
        return -1;
    Kernel *k = t.k;
    k->scratch_bytes = bytes;
    k->flops = lower_flops(6, (int64_t[]){2, og, depth, c.groups, c.y.n, c.positions});
    KBuilder *b = &k->b;
    int src = pointwise ? kb_value(b, c.xv, false) : kb_scratch(b), dy = kb_value(b, c.yv, false),
        dw = kb_value(b, c.wv, true);
    KExpr *rows_at = plus(b, t.r0, t.g, og);
    KExpr *tile = k_var(b, kb_let(b, "tile", KT_I64, plus(b, t.c0, rows_at, depth)));
    if (c.nhwc) {
        kb_sgemm(b, true, false, t.m, t.n, inner, k_f32(b, 1), k_addr(b, dy, rows_at), c.y.c,
                 k_addr(b, src, plus(b, t.c0, t.g, depth)), c.groups * depth, k_f32(b, 0),
                 k_addr(b, dw, tile), depth);
    } else {
        int64_t src_batch = pointwise ? c.x.sn : c.groups * depth * c.positions;
        KExpr *item = k_var(b, kb_for(b, "b", KT_I64, k_int(b, 0), k_int(b, c.y.n), NULL, 0));
        KExpr *beta = k_select(b, k_bin(b, KE_NE, item, k_int(b, 0)), k_f32(b, 1), k_f32(b, 0));
        kb_sgemm(
            b, false, true, t.m, t.n, inner, k_f32(b, 1),
            k_addr(b, dy, plus(b, k_mul(b, rows_at, k_int(b, inner)), item, c.y.sn)), inner,
            k_addr(b, src, plus(b, k_mul(b, plus(b, t.c0, t.g, depth), k_int(b, inner)), item, src_batch)),
            inner, beta, k_addr(b, dw, tile), depth);
        kb_end(b);
    }
    return 0;
}

/* Opens, for conv_transpose, the loop over each tap k{i} and inside it a block
 * where output position p{i} meets input position in{i} through it:
 * in * stride - pad + k * dilation == p. Returns the blocks opened. */
static int open_transposed_taps(KBuilder *b, const Conv *c, Coords *at) {
    for (int i = 0; i < c->ns; i++) {
        at->k[i] = k_var(b, kb_for(b, k_name[i], KT_I64, k_int(b, 0), k_int(b, c->w.sp[i]), NULL, 0));
        KExpr *t = let_index(b, t_name[i],
                             k_sub(b, k_add(b, at->p[i], k_int(b, c->pads[i])),
                                   k_mul(b, at->k[i], k_int(b, c->dilations[i]))));
        at->in[i] = let_index(b, in_name[i], k_div(b, t, k_int(b, c->strides[i])));
        KExpr *hit = k_bin(b, KE_GE, t, k_int(b, 0));
        if (c->strides[i] > 1)
            hit = k_and(b, hit, k_bin(b, KE_EQ, k_mod(b, t, k_int(b, c->strides[i])), k_int(b, 0)));
        kb_if(b, k_and(b, hit, k_lt(b, at->in[i], k_int(b, c->x.sp[i]))));
    }
    return 2 * c->ns;
}

/* The flat index of the coordinates idx over sizes sp, row-major. */
static KExpr *flat_index(KBuilder *b, KExpr *const *idx, const int64_t *sp, int ns) {
    KExpr *e = k_int(b, 0);
    int64_t stride = 1;
    for (int i = ns - 1; i >= 0; i--) {
        e = plus(b, e, idx[i], stride);
        stride *= sp[i];
    }
    return e;
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
    Tiles t;
    if (gemm_tiles(p, n, c->nhwc ? 1 : c->x.n, c->groups, rows, cols, true, &t, d))
        return -1;
    t.k->scratch_bytes = bytes;
    t.k->flops = lower_flops(6, (int64_t[]){2, rows, cols, cg, c->groups, c->nhwc ? 1 : c->x.n});
    KBuilder *b = &t.k->b;
    int x = kb_value(b, c->xv, false), w = kb_value(b, c->wv, false), scratch = kb_scratch(b);
    if (c->nhwc)
        kb_sgemm(b, false, false, t.m, t.n, cg, k_f32(b, 1),
                 k_addr(b, x, plus(b, k_mul(b, t.g, k_int(b, cg)), t.r0, c->x.c)), c->x.c,
                 k_addr(b, w, plus(b, t.c0, t.g, cg * ktaps)), ktaps, k_f32(b, 0),
                 k_addr(b, scratch, plus(b, plus(b, t.c0, t.g, ktaps), t.r0, c->groups * ktaps)),
                 c->groups * ktaps);
    else
        kb_sgemm(b, true, false, t.m, t.n, cg, k_f32(b, 1), k_addr(b, w, plus(b, t.r0, t.g, cg * ktaps)),
                 ktaps, k_addr(b, x, plus(b, plus(b, t.c0, t.g, cg * in_positions), t.b, c->x.sn)),
                 in_positions, k_f32(b, 0),
                 k_addr(b, scratch,
                        k_add(b,
                              k_mul(b, k_madd(b, k_madd(b, t.b, c->groups, t.g), ktaps, t.r0),
                                    k_int(b, in_positions)),
                              t.c0)),
                 in_positions);

    /* nhwc: one iteration per output position, adding each tap's whole row of
       output channels (contiguous in the scratch); nchw: one per output element */
    int64_t per_iteration = c->nhwc ? c->y.c : 1;
    Kernel *gk = kernel_loop(p, n, "gather", c->y.n * c->y.c * c->positions / per_iteration,
                             grain_for(c->taps * per_iteration), d);
    if (!gk)
        return -1;
    kernel_follows(p, gk, &p->g->values[n->out[0]].type, gk->count, 1, 1); /* image by image */
    gk->scratch_bytes = bytes;
    b = &gk->b;
    Coords at = coords_zero(b);
    Dim dims[KILN_MAX_RANK];
    int nd = output_dims(c, dims, &at) - (c->nhwc ? 1 : 0); /* nhwc: o is the row's */
    KExpr *i = k_var(b, gk->iter);
    let_dims(b, i, dims, nd);
    int y = kb_value(b, c->yv, true);
    scratch = kb_scratch(b);
    KExpr *row = NULL, *g = NULL, *oc = NULL;
    int acc = -1;
    if (c->nhwc) {
        row = k_var(b, kb_let(b, "row", KT_I64, k_mul(b, i, k_int(b, c->y.c))));
        KExpr *o = k_var(b, kb_for(b, "o", KT_I64, k_int(b, 0), k_int(b, c->y.c), NULL, 0));
        kb_store(b, y, k_add(b, row, o), bias_or_zero(b, c, o));
        kb_end(b);
    } else {
        g = let_index(b, "g", k_div(b, at.o, k_int(b, og)));
        oc = let_index(b, "oc", k_mod(b, at.o, k_int(b, og)));
        acc = kb_decl(b, "acc", KT_F32, bias_or_zero(b, c, at.o));
    }
    int opened = open_transposed_taps(b, c, &at);
    KExpr *q = flat_index(b, at.in, c->x.sp, c->ns), *kf = flat_index(b, at.k, c->w.sp, c->ns);
    if (c->nhwc) {
        KExpr *src =
            k_var(b, kb_let(b, "src", KT_I64,
                            k_add(b, k_mul(b, k_madd(b, at.b, in_positions, q), k_int(b, c->groups * ktaps)),
                                  k_mul(b, kf, k_int(b, og)))));
        g = k_var(b, kb_for(b, "g", KT_I64, k_int(b, 0), k_int(b, c->groups), NULL, 0));
        oc = k_var(b, kb_for(b, "oc", KT_I64, k_int(b, 0), k_int(b, og), NULL, 0));
        kb_store_add(b, y, k_add(b, row, k_madd(b, g, og, oc)),
                     k_load(b, scratch, k_add(b, src, k_madd(b, g, ktaps, oc))));
        end_blocks(b, 2);
    } else {
        KExpr *element = k_madd(b, k_madd(b, k_madd(b, k_madd(b, at.b, c->groups, g), og, oc), c->taps, kf),
                                in_positions, q);
        kb_accum(b, acc, k_load(b, scratch, element));
    }
    end_blocks(b, opened);
    if (!c->nhwc)
        kb_store(b, y, i, k_var(b, acc));
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
    kernel_follows(p, k, &p->g->values[n->out[0]].type, k->count, 1, 1); /* image by image */
    KBuilder *b = &k->b;
    Coords at = coords_zero(b);
    Dim dims[KILN_MAX_RANK];
    int nd = output_dims(&c, dims, &at);
    KExpr *i = k_var(b, k->iter);
    let_dims(b, i, dims, nd);
    KExpr *g = NULL, *oc = at.o;
    if (c.groups > 1) {
        g = let_index(b, "g", k_div(b, at.o, k_int(b, og)));
        oc = let_index(b, "oc", k_mod(b, at.o, k_int(b, og)));
    }
    int acc = kb_decl(b, "acc", KT_F32, bias_or_zero(b, &c, at.o));
    if (c.groups > 1) {
        KExpr *ci = k_var(b, kb_for(b, "ci", KT_I64, k_int(b, 0), k_int(b, cg), NULL, 0));
        at.c = let_index(b, "c", k_madd(b, g, cg, ci));
    } else {
        at.c = k_var(b, kb_for(b, "c", KT_I64, k_int(b, 0), k_int(b, cg), NULL, 0));
    }
    int opened = open_transposed_taps(b, &c, &at);
    KExpr *wi = plus(b, k_mul(b, at.c, k_int(b, c.w.sn)), oc, c.w.sc);
    for (int s = 0; s < c.ns; s++)
        wi = plus(b, wi, at.k[s], c.w.ss[s]);
    kb_accum(b, acc,
             k_mul(b, k_load(b, kb_value(b, c.xv, false), x_offset(b, &c, at.b, at.c, 1, at.in)),
                   k_load(b, kb_value(b, c.wv, false), wi)));
    end_blocks(b, opened);
    kb_end(b);
    kb_store(b, kb_value(b, c.yv, true), i, k_var(b, acc));
    return 0;
}
