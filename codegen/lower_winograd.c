/* A 3x3 convolution with stride 1 as Winograd's F(m x m, 3x3), m = 4 or 2: each m x
 * m tile of the output costs (m + 2)^2 multiplies per input and output channel
 * instead of 9 m^2, 4x fewer for F(4x4, 3x3), 2.25x for F(2x2, 3x3).
 *
 * With channels last and groups 1, n = m + 2:
 *   U = G g G^T per (input channel, output channel), as n^2 matrices [C, O]: for
 *       weights known at compile time computed now into the GEMM kernel's table,
 *       else (a param a training step updates) by a kernel of its own into the
 *       scratch;
 *   V = B^T d B per n x n input patch d (the tile's inputs, zeros outside) and
 *       channel, into the scratch as n^2 matrices [tiles, C] (LOOP over tile rows);
 *   M = V U, n^2 GEMMs [tiles, C] x [C, O]: on U packed now (lower_packed.c) when
 *       the weights are known now and the target has them, else a LOOP of cblas_sgemm
 *       calls;
 *   y = A^T M A per tile and output channel, plus the bias, into y; each tile row is
 *       then finished with the epilogue while in cache (fused_conv).
 * Each transform is one loop over the channels per tile, its products with B^T (or
 * A^T) taken in two steps, by the rows and then by the columns, each a few terms
 * (the matrices are sparse), with the matrices' elements as literals; the loop
 * vectorizes along the channels.
 * A conv_transpose with stride 1 is the conv of its input with the weights flipped
 * in space and their channel dims swapped, padded by 2 - pad: the backward pass of
 * a 3x3 conv takes the same path through its weight transform.
 * The transforms are exact in real arithmetic (Lavin and Gray, 2015); in float,
 * F(2x2, 3x3) loses about as much as the direct sum does, F(4x4, 3x3) (whose points
 * are 0, +-1, +-2) several times that (5e-6 of the largest output in
 * codegen_winograd4.kiln), both far inside the tolerance. F(4x4, 3x3) runs where
 * the output has MIN_TILES tiles of 4 x 4 (ResNet-18's 14 x 14 layers, 16 tiles,
 * ran slower with it than with F(2x2, 3x3)), F(2x2, 3x3) where it has as many of
 * 2 x 2. */
#include "codegen.h"

#include <limits.h>
#include <stdio.h>

enum { MAX_N = 6 };

/* B^T, G and A^T of F(m x m, 3x3), n = m + 2. */
typedef struct {
    int m, n;
    double bt[MAX_N][MAX_N], g[MAX_N][3], at[MAX_N - 2][MAX_N];
} Transform;

static const Transform f2 = {2,
                             4,
                             {{1, 0, -1, 0}, {0, 1, 1, 0}, {0, -1, 1, 0}, {0, 1, 0, -1}},
                             {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}},
                             {{1, 1, 1, 0}, {0, 1, -1, -1}}};

static const Transform f4 = {
    4,
    6,
    {{4, 0, -5, 0, 1, 0},
     {0, -4, -4, 1, 1, 0},
     {0, 4, -4, -1, 1, 0},
     {0, -2, -1, 2, 1, 0},
     {0, 2, -1, -2, 1, 0},
     {0, 4, 0, -5, 0, 1}},
    {{1.0 / 4, 0, 0},
     {-1.0 / 6, -1.0 / 6, -1.0 / 6},
     {-1.0 / 6, 1.0 / 6, -1.0 / 6},
     {1.0 / 24, 1.0 / 12, 1.0 / 6},
     {1.0 / 24, -1.0 / 12, 1.0 / 6},
     {0, 0, 1}},
    {{1, 1, 1, 1, 1, 0}, {0, 1, -1, 2, -2, 0}, {0, 1, 1, 4, 4, 0}, {0, 1, -1, 8, -8, 1}}};

typedef struct {
    const Transform *t;
    View x, y;
    int64_t pad_top, pad_left;
    int64_t th, tw, tiles; /* tile rows and columns per image, tiles in all */
    bool transposed;       /* a conv_transpose: w is [C, 3, 3, O], read flipped */
    int64_t u_at;          /* U in the scratch (weights not known at compile time), else -1 */
    int xv, yv, wv, bv;    /* value ids; bv -1 without bias */
} Wino;

/* The GEMMs have a row per tile; with fewer rows they run slower than the direct
 * GEMM runs 2.25 times the work (ResNet-18's 7x7 layer4, 16 tiles of 2 x 2). */
enum { MIN_TILES = 32 };

/* The tiles of m x m of a conv's output y [N, H, W, O]. */
static int64_t tiles_of(const Type *y, int m) {
    return y->dims[0] * ((y->dims[1] + m - 1) / m) * ((y->dims[2] + m - 1) / m);
}

/* The transform for output y: F(4x4, 3x3) where it has enough tiles of 4 x 4, else
 * F(2x2, 3x3). */
static const Transform *transform_for(const Type *y) {
    return tiles_of(y, 4) >= MIN_TILES ? &f4 : &f2;
}

/* Whether conv or conv_transpose n takes this path: 2-D, nhwc, groups 1, 3x3,
 * stride and dilation 1 (for conv_transpose also no output_padding and pads of at
 * most 2), and enough channels and tiles for the GEMMs to be worth it. */
bool winograd_applies(const Program *p, const Node *n) {
    const Graph *g = p->g;
    bool packed = p->vector_floats > 0 && p->buf[n->in[1]].kind == BUF_WEIGHT;
    if ((!p->blas && !packed) || !layout_is_nhwc(n) || g->values[n->in[0]].type.rank != 4 ||
        node_int(n, ATTR_GROUPS) != 1)
        return false;
    bool transposed = n->op == OP_CONV_TRANSPOSE;
    const Type *w = &g->values[n->in[1]].type;
    int64_t strides[2], dil[2], pads[4], extra[2] = {0, 0};
    node_ints(n, ATTR_STRIDES, strides, 2, 2);
    node_ints(n, ATTR_DILATIONS, dil, 2, 2);
    node_ints(n, ATTR_PADS, pads, 4, 4);
    if (transposed)
        node_ints(n, ATTR_OUTPUT_PADDING, extra, 2, 2);
    const Type *y = &g->values[n->out[0]].type;
    int64_t c = transposed ? w->dims[0] : w->dims[3], o = transposed ? w->dims[3] : w->dims[0];
    int64_t tiles = tiles_of(y, 2);
    for (int k = 0; transposed && k < 4; k++)
        if (pads[k] > 2)
            return false;
    return w->dims[1] == 3 && w->dims[2] == 3 && strides[0] == 1 && strides[1] == 1 && dil[0] == 1 &&
           dil[1] == 1 && extra[0] == 0 && extra[1] == 0 && c >= 16 && o >= 16 && tiles >= MIN_TILES &&
           o <= INT_MAX && c <= INT_MAX;
}

/* The index into w of tap (r, s) from input channel ic to output channel oc: w is
 * [O, 3, 3, C], or for a conv_transpose [C, 3, 3, O] with the taps flipped. */
static int64_t tap_index(bool transposed, int64_t c, int64_t o, int64_t oc, int64_t ic, int r, int s) {
    return transposed ? ((ic * 3 + 2 - r) * 3 + 2 - s) * o + oc : ((oc * 3 + r) * 3 + s) * c + ic;
}

/* U[k][c][o], k = n i + j, from w, known now. */
static float *weight_transform(const Program *p, const Node *n, const Transform *tf, bool transposed,
                               int64_t c, int64_t o) {
    const float *w = (const float *)(p->weights + p->buf[n->in[1]].offset);
    int an = tf->n;
    float *u = ir_malloc(sizeof(float) * (size_t)(an * an * c * o) + 1);
    for (int64_t oc = 0; u && oc < o; oc++)
        for (int64_t ic = 0; ic < c; ic++) {
            double gg[MAX_N][3] = {{0}};
            for (int i = 0; i < an; i++)
                for (int s = 0; s < 3; s++)
                    for (int r = 0; r < 3; r++)
                        gg[i][s] += tf->g[i][r] * w[tap_index(transposed, c, o, oc, ic, r, s)];
            for (int i = 0; i < an; i++)
                for (int j = 0; j < an; j++) {
                    double v = 0;
                    for (int s = 0; s < 3; s++)
                        v += gg[i][s] * tf->g[j][s];
                    u[((i * an + j) * c + ic) * o + oc] = (float)v;
                }
        }
    return u;
}

/* A variable's name: prefix and the digits r and q, in the IR's arena. */
static const char *name_rq(KBuilder *b, const char *prefix, int r, int q) {
    char name[16];
    snprintf(name, sizeof name, "%s%d%d", prefix, r, q);
    const char *kept = arena_strdup(b->arena, name);
    if (!kept)
        b->oom = true;
    return kept ? kept : prefix;
}

/* The weight transform at run time, into the scratch at u_at: the arithmetic of
 * weight_transform in float, one iteration per input channel, whose n^2 rows of U
 * it writes along the output channels (n^2 store streams). The rows of G are
 * written out, one statement each, with G's elements as literals. */
static int runtime_weight_transform(Program *p, const Node *n, const Wino *w, int64_t scratch_bytes,
                                    Diag *d) {
    int64_t c = w->x.c, o = w->y.c;
    int an = w->t->n;
    Kernel *k = kernel_new(p, n, K_LOOP, "winograd_weights");
    if (!k)
        return diag_error(d, n->loc, "out of memory");
    kernel_reads(k, n->in[1]);
    k->scratch_bytes = scratch_bytes;
    k->count = c;
    k->grain = 1;
    KBuilder *b = &k->b;
    KExpr *i = k_var(b, k->iter);
    int wt = kb_value(b, w->wv, false), scratch = kb_scratch(b);
    KExpr *u = k_var(b, kb_let(b, "u", KT_I64, k_add(b, k_int(b, w->u_at), k_mul(b, i, k_int(b, o)))));
    KExpr *oc = k_var(b, kb_for(b, "oc", KT_I64, k_int(b, 0), k_int(b, o), NULL, 0));
    int g = kb_array(b, "g", KT_F32, 3, 3, false, false), gg = kb_array(b, "gg", KT_F32, an, 3, false, false);
    KExpr *r = k_var(b, kb_for(b, "r", KT_I64, k_int(b, 0), k_int(b, 3), NULL, 0));
    KExpr *t = k_var(b, kb_for(b, "t", KT_I64, k_int(b, 0), k_int(b, 3), NULL, 0));
    KExpr *tap =
        w->transposed
            ? k_madd(b, k_madd(b, k_sub(b, k_int(b, 2), r), 3, k_madd(b, i, 9, k_sub(b, k_int(b, 2), t))), o,
                     oc)
            : k_madd(b, k_madd(b, oc, 9, k_madd(b, r, 3, t)), c, i);
    kb_store2(b, g, r, t, k_load(b, wt, tap), false);
    kb_end(b);
    kb_end(b);
    t = k_var(b, kb_for(b, "t", KT_I64, k_int(b, 0), k_int(b, 3), NULL, 0));
    for (int a = 0; a < an; a++) {
        KExpr *sum = NULL;
        for (int j = 0; j < 3; j++) {
            KExpr *term = k_mul(b, k_f32(b, w->t->g[a][j]), k_load2(b, g, k_int(b, j), t));
            sum = sum ? k_add(b, sum, term) : term;
        }
        kb_store2(b, gg, k_int(b, a), t, sum, false);
    }
    kb_end(b);
    KExpr *row = k_var(b, kb_for(b, "a", KT_I64, k_int(b, 0), k_int(b, an), NULL, 0));
    for (int col = 0; col < an; col++) {
        KExpr *sum = NULL;
        for (int j = 0; j < 3; j++) {
            KExpr *term = k_mul(b, k_load2(b, gg, row, k_int(b, j)), k_f32(b, w->t->g[col][j]));
            sum = sum ? k_add(b, sum, term) : term;
        }
        KExpr *index = k_add(b, u, k_madd(b, k_madd(b, row, an, k_int(b, col)), c * o, oc));
        kb_store(b, scratch, index, sum);
    }
    kb_end(b);
    kb_end(b);
    return 0;
}

/* The sum of coef[k] terms[k] over k < count, the zero coefficients left out, the
 * ones of +-1 as an addition or subtraction. */
static KExpr *combine(KBuilder *b, const double *coef, KExpr *const *terms, int count) {
    KExpr *sum = NULL;
    for (int k = 0; k < count; k++) {
        double f = coef[k];
        if (f == 0)
            continue;
        KExpr *term = f == 1 || f == -1 ? terms[k] : k_mul(b, k_f32(b, f), terms[k]);
        sum = !sum ? (f == -1 ? k_neg(b, term) : term) : f == -1 ? k_sub(b, sum, term) : k_add(b, sum, term);
    }
    return sum;
}

/* mt x mt^T for the an x an values x and the rows x an matrix mt (B^T or A^T): mt
 * times each column of x first, into the lets t{a}{q}, then each row of that times
 * mt^T, into out[a][j], rows x rows. */
static void sandwich(KBuilder *b, const double (*mt)[MAX_N], int rows, int an, KExpr *x[MAX_N][MAX_N],
                     KExpr *out[MAX_N][MAX_N]) {
    KExpr *t[MAX_N][MAX_N], *col[MAX_N];
    for (int a = 0; a < rows; a++)
        for (int q = 0; q < an; q++) {
            for (int r = 0; r < an; r++)
                col[r] = x[r][q];
            t[a][q] = k_var(b, kb_let(b, name_rq(b, "t", a, q), KT_F32, combine(b, mt[a], col, an)));
        }
    for (int a = 0; a < rows; a++)
        for (int j = 0; j < rows; j++)
            out[a][j] = combine(b, mt[j], t[a], an);
}

/* The input transform: one iteration per tile row of an image. */
static int input_transform(Program *p, const Node *n, const Wino *w, int64_t scratch_bytes, Diag *d) {
    Kernel *k = kernel_new(p, n, K_LOOP, "winograd_in");
    if (!k)
        return diag_error(d, n->loc, "out of memory");
    kernel_reads(k, n->in[0]);
    k->scratch_bytes = scratch_bytes;
    k->count = w->x.n * w->th;
    k->grain = 1;
    int64_t c = w->x.c, h = w->x.sp[0], wd = w->x.sp[1], tiles = w->tiles;
    int m = w->t->m, an = w->t->n;
    KBuilder *b = &k->b;
    KExpr *i = k_var(b, k->iter), *zero = k_int(b, 0);
    int x = kb_value(b, w->xv, false), scratch = kb_scratch(b);
    KExpr *image = k_var(b, kb_let(b, "b", KT_I64, k_div(b, i, k_int(b, w->th))));
    KExpr *th = k_var(b, kb_let(b, "th", KT_I64, k_mod(b, i, k_int(b, w->th))));
    KExpr *tw = k_var(b, kb_for(b, "tw", KT_I64, zero, k_int(b, w->tw), NULL, 0));
    KExpr *t = k_var(b, kb_let(b, "t", KT_I64, k_madd(b, i, w->tw, tw)));
    /* each of the n^2 inputs: a row offset (clamped inside) and a 0/1 mask */
    KExpr *mask[MAX_N][MAX_N], *row[MAX_N][MAX_N];
    for (int r = 0; r < an; r++)
        for (int q = 0; q < an; q++) {
            KExpr *hr = k_var(
                b, kb_let(b, name_rq(b, "h", r, q), KT_I64,
                          k_add(b, k_sub(b, k_mul(b, th, k_int(b, m)), k_int(b, w->pad_top)), k_int(b, r))));
            KExpr *wq = k_var(
                b, kb_let(b, name_rq(b, "w", r, q), KT_I64,
                          k_add(b, k_sub(b, k_mul(b, tw, k_int(b, m)), k_int(b, w->pad_left)), k_int(b, q))));
            KExpr *in = k_and(b,
                              k_and(b, k_and(b, k_bin(b, KE_GE, hr, zero), k_lt(b, hr, k_int(b, h))),
                                    k_bin(b, KE_GE, wq, zero)),
                              k_lt(b, wq, k_int(b, wd)));
            mask[r][q] =
                k_var(b, kb_let(b, name_rq(b, "m", r, q), KT_F32, k_select(b, in, k_f32(b, 1), k_f32(b, 0))));
            KExpr *on = k_bin(b, KE_NE, mask[r][q], k_f32(b, 0));
            KExpr *offset =
                k_mul(b,
                      k_add(b,
                            k_mul(b, k_add(b, k_mul(b, image, k_int(b, h)), k_select(b, on, hr, zero)),
                                  k_int(b, wd)),
                            k_select(b, on, wq, zero)),
                      k_int(b, c));
            row[r][q] = k_var(b, kb_let(b, name_rq(b, "x", r, q), KT_I64, offset));
        }
    KExpr *ch = k_var(b, kb_for(b, "c", KT_I64, zero, k_int(b, c), NULL, K_VECTOR));
    KExpr *dv[MAX_N][MAX_N], *v[MAX_N][MAX_N];
    for (int r = 0; r < an; r++)
        for (int q = 0; q < an; q++)
            dv[r][q] = k_var(b, kb_let(b, name_rq(b, "d", r, q), KT_F32,
                                       k_mul(b, mask[r][q], k_load(b, x, k_add(b, row[r][q], ch)))));
    sandwich(b, w->t->bt, an, an, dv, v);
    for (int a = 0; a < an; a++)
        for (int j = 0; j < an; j++)
            kb_store(b, scratch, k_add(b, k_madd(b, t, c, ch), k_int(b, (a * an + j) * tiles * c)), v[a][j]);
    kb_end(b);
    kb_end(b);
    return 0;
}

/* The n^2 GEMMs M[k] = V[k] U[k]. */
/* M = V U on U packed, with k made a LOOP over the GEMMs' register tiles. */
static int packed_products(Program *p, const Node *n, Kernel *k, const Wino *w, const float *u, Diag *d) {
    int64_t c = w->x.c, o = w->y.c, tiles = w->tiles, nn = w->t->n * w->t->n;
    PackedGemm g = {.batch = nn,
                    .rows = tiles,
                    .cols = o,
                    .depth = c,
                    .bias = -1,
                    .a_rows = {1, {tiles}, {c}},
                    .a_depth = {1, {c}, {1}},
                    .a_batch = tiles * c,
                    .y_at = nn * tiles * c,
                    .y_ld = o,
                    .y_batch = tiles * o,
                    .b = u,
                    .b_k = o,
                    .b_q = 1,
                    .b_batch = c * o,
                    .node = n};
    k->count = packed_gemm_tiles(p, &g);
    g.a = g.y = kb_scratch(&k->b);
    return kb_packed_gemm(p, k, &g, d);
}

static int products(Program *p, const Node *n, const Wino *w, int64_t scratch_bytes, Diag *d) {
    int64_t c = w->x.c, o = w->y.c, tiles = w->tiles, nn = w->t->n * w->t->n;
    Kernel *k = kernel_new(p, n, K_LOOP, "winograd_gemm");
    if (!k)
        return diag_error(d, n->loc, "out of memory");
    k->scratch_bytes = scratch_bytes;
    k->count = nn;
    k->grain = 1;
    k->flops = lower_flops(4, (int64_t[]){2 * nn, tiles, c, o});
    if (w->u_at >= 0) {
        kernel_reads(k, n->in[1]); /* through U, which the scratch holds */
    } else {
        float *u = weight_transform(p, n, w->t, w->transposed, c, o);
        if (!u)
            return diag_error(d, n->loc, "out of memory");
        int rc = p->vector_floats > 0 ? packed_products(p, n, k, w, u, d)
                                      : program_table(p, k, u, (int64_t)sizeof(float) * nn * c * o, d);
        ir_free(u);
        if (rc || p->vector_floats > 0)
            return rc ? -1 : 0;
    }
    KBuilder *b = &k->b;
    KExpr *i = k_var(b, k->iter);
    int scratch = kb_scratch(b), table = w->u_at >= 0 ? scratch : kb_table(b);
    KExpr *u_at = k_madd(b, i, c * o, k_int(b, w->u_at >= 0 ? w->u_at : 0));
    kb_sgemm(b, false, false, k_i32(b, tiles), k_i32(b, o), c, k_f32(b, 1),
             k_addr(b, scratch, k_mul(b, i, k_int(b, tiles * c))), c, k_addr(b, table, u_at), o, k_f32(b, 0),
             k_addr(b, scratch, k_madd(b, i, tiles * o, k_int(b, nn * tiles * c))), o);
    return 0;
}

/* The output transform, bias and epilogue: one iteration per tile row of an image.
 * A tile wholly inside the output stores its m x m results in one loop over the
 * channels; one across the output's last row or column (rows or cols less than m)
 * tests each store, in a loop of its own. */
static int output_transform(Program *p, const Node *n, const Wino *w, const Expr *epilogue,
                            int64_t scratch_bytes, Diag *d) {
    Kernel *k = kernel_loop(p, n, "winograd_out", w->y.n * w->th, 1, d);
    if (!k)
        return -1;
    k->scratch_bytes = scratch_bytes;
    int m = w->t->m, an = w->t->n;
    int64_t o = w->y.c, ho = w->y.sp[0], wo = w->y.sp[1], tiles = w->tiles,
            base = an * an * w->tiles * w->x.c;
    KBuilder *b = &k->b;
    KExpr *i = k_var(b, k->iter), *zero = k_int(b, 0);
    int y = kb_value(b, w->yv, true), scratch = kb_scratch(b);
    KExpr *image = k_var(b, kb_let(b, "b", KT_I64, k_div(b, i, k_int(b, w->th))));
    KExpr *th = k_var(b, kb_let(b, "th", KT_I64, k_mod(b, i, k_int(b, w->th))));
    KExpr *left = k_sub(b, k_int(b, ho), k_mul(b, th, k_int(b, m)));
    KExpr *rows =
        k_var(b, kb_let(b, "rows", KT_I64, k_select(b, k_lt(b, left, k_int(b, m)), left, k_int(b, m))));
    KExpr *tile =
        k_var(b, kb_let(b, "tile", KT_I64,
                        k_mul(b, k_madd(b, image, ho, k_mul(b, th, k_int(b, m))), k_int(b, wo * o))));
    KExpr *tw = k_var(b, kb_for(b, "tw", KT_I64, zero, k_int(b, w->tw), NULL, 0));
    KExpr *t = k_var(b, kb_let(b, "t", KT_I64, k_madd(b, i, w->tw, tw)));
    KExpr *across = k_sub(b, k_int(b, wo), k_mul(b, tw, k_int(b, m)));
    KExpr *cols =
        k_var(b, kb_let(b, "cols", KT_I64, k_select(b, k_lt(b, across, k_int(b, m)), across, k_int(b, m))));
    KExpr *out = k_var(b, kb_let(b, "out", KT_I64, k_madd(b, tw, m * o, tile)));
    kb_if(b, k_and(b, k_bin(b, KE_EQ, rows, k_int(b, m)), k_bin(b, KE_EQ, cols, k_int(b, m))));
    for (int edge = 0; edge < 2; edge++) {
        if (edge)
            kb_else(b);
        KExpr *oc = k_var(b, kb_for(b, "o", KT_I64, zero, k_int(b, o), NULL, K_VECTOR));
        KExpr *mv[MAX_N][MAX_N], *yv[MAX_N][MAX_N];
        for (int a = 0; a < an; a++)
            for (int j = 0; j < an; j++)
                mv[a][j] = k_var(b, kb_let(b, name_rq(b, "m", a, j), KT_F32,
                                           k_load(b, scratch,
                                                  k_add(b, k_madd(b, t, o, oc),
                                                        k_int(b, base + (a * an + j) * tiles * o)))));
        sandwich(b, w->t->at, m, an, mv, yv);
        for (int r = 0; r < m; r++)
            for (int q = 0; q < m; q++) {
                KExpr *sum = yv[r][q];
                if (w->bv >= 0)
                    sum = k_add(b, sum, k_load(b, kb_value(b, w->bv, false), oc));
                if (edge && (r > 0 || q > 0))
                    kb_if(b, k_and(b, k_lt(b, k_int(b, r), rows), k_lt(b, k_int(b, q), cols)));
                kb_store(b, y, k_add(b, out, k_add(b, oc, k_int(b, r * wo * o + q * o))), sum);
                if (edge && (r > 0 || q > 0))
                    kb_end(b);
            }
        kb_end(b);
    }
    kb_end(b);
    kb_end(b);
    kb_tile_epilogue(b, p, n, epilogue, -1, NULL, NULL, y, tile, rows, k_int(b, wo * o), wo * o, 1);
    return 0;
}

int lower_winograd(Program *p, const Node *n, const Expr *epilogue, Diag *d) {
    const Graph *g = p->g;
    Wino w = {.t = transform_for(&g->values[n->out[0]].type),
              .x = view_of(&g->values[n->in[0]].type, true),
              .y = view_of(&g->values[n->out[0]].type, true),
              .transposed = n->op == OP_CONV_TRANSPOSE,
              .xv = n->in[0],
              .yv = n->out[0],
              .wv = n->in[1],
              .bv = n->n_in > 2 && n->in[2] >= 0 ? n->in[2] : -1};
    int64_t pads[4];
    node_ints(n, ATTR_PADS, pads, 4, 4);
    w.pad_top = w.transposed ? 2 - pads[0] : pads[0], w.pad_left = w.transposed ? 2 - pads[1] : pads[1];
    int64_t m = w.t->m, nn = w.t->n * w.t->n;
    w.th = (w.y.sp[0] + m - 1) / m, w.tw = (w.y.sp[1] + m - 1) / m;
    w.tiles = w.x.n * w.th * w.tw;
    if (w.tiles > INT_MAX / nn || w.x.c > INT_MAX / nn / w.tiles)
        return diag_error(d, n->loc, "conv: too many Winograd tiles for BLAS");
    int64_t scratch_bytes =
        lower_size(n, "Winograd scratch", 4, (int64_t[]){sizeof(float), nn, w.tiles, w.x.c + w.y.c}, d);
    if (scratch_bytes < 0)
        return -1;
    w.u_at = -1;
    if (p->buf[n->in[1]].kind != BUF_WEIGHT) {
        w.u_at = scratch_bytes / (int64_t)sizeof(float);
        int64_t u_bytes =
            lower_size(n, "Winograd weights", 4, (int64_t[]){sizeof(float), nn, w.x.c, w.y.c}, d);
        if (u_bytes < 0 || !ck_add(scratch_bytes, u_bytes, &scratch_bytes))
            return u_bytes < 0 ? -1
                               : diag_error(d, n->loc, "conv: the Winograd scratch is too large to address");
        if (runtime_weight_transform(p, n, &w, scratch_bytes, d))
            return -1;
    }
    if (input_transform(p, n, &w, scratch_bytes, d) || products(p, n, &w, scratch_bytes, d) ||
        output_transform(p, n, &w, epilogue, scratch_bytes, d))
        return -1;
    return 0;
}
