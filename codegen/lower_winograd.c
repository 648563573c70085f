/* A 3x3 convolution with stride 1 as Winograd's F(2x2, 3x3): each 2x2 tile of the
 * output costs 16 multiplies per input and output channel instead of 36.
 *
 * With channels last and groups 1:
 *   U = G g G^T per (input channel, output channel), as 16 matrices [C, O]: for
 *       weights known at compile time computed now into the GEMM kernel's table,
 *       else (a param a training step updates) by a kernel of its own into the
 *       scratch;
 *   V = B^T d B per 4x4 input patch d (the tile's inputs, zeros outside) and channel,
 *       into the scratch as 16 matrices [tiles, C] (LOOP over tile rows);
 *   M = V U, 16 GEMMs [tiles, C] x [C, O]: on U packed now (lower_packed.c) when
 *       the weights are known now and the target has them, else a LOOP of 16
 *       cblas_sgemm calls;
 *   y = A^T m A per tile and output channel, plus the bias, into y; each tile row is
 *       then finished with the epilogue while in cache (fused_conv).
 * Both transforms are written out as one loop over the channels per element of the
 * result, a signed sum of the inputs (the matrices hold 0 and +-1 only), so that
 * each loop has one store stream and vectorizes.
 * A conv_transpose with stride 1 is the conv of its input with the weights flipped
 * in space and their channel dims swapped, padded by 2 - pad: the backward pass of
 * a 3x3 conv takes the same path through its weight transform.
 * The transforms are exact in real arithmetic (Lavin and Gray, 2015); in float F(2x2,
 * 3x3) loses about as much as the direct sum does, far inside the tolerance. */
#include "codegen.h"

#include <limits.h>
#include <stdio.h>

/* B^T, G and A^T of F(2x2, 3x3). */
static const double bt[4][4] = {{1, 0, -1, 0}, {0, 1, 1, 0}, {0, -1, 1, 0}, {0, 1, 0, -1}};
static const double gm[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};
static const double at[2][4] = {{1, 1, 1, 0}, {0, 1, -1, -1}};

typedef struct {
    View x, y;
    int64_t pad_top, pad_left;
    int64_t th, tw, tiles; /* tile rows and columns per image, tiles in all */
    bool transposed;       /* a conv_transpose: w is [C, 3, 3, O], read flipped */
    int64_t u_at;          /* U in the scratch (weights not known at compile time), else -1 */
    int xv, yv, wv, bv;    /* value ids; bv -1 without bias */
} Wino;

/* The 16 GEMMs have a row per tile; with fewer rows they run slower than the direct
 * GEMM runs 2.25 times the work (ResNet-18's 7x7 layer4, 16 tiles). */
enum { MIN_TILES = 32 };

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
    int64_t tiles = y->dims[0] * ((y->dims[1] + 1) / 2) * ((y->dims[2] + 1) / 2);
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

/* U[k][c][o], k = 4 i + j, from w, known now. */
static float *weight_transform(const Program *p, const Node *n, bool transposed, int64_t c, int64_t o) {
    const float *w = (const float *)(p->weights + p->buf[n->in[1]].offset);
    float *u = ir_malloc(sizeof(float) * (size_t)(16 * c * o) + 1);
    for (int64_t oc = 0; u && oc < o; oc++)
        for (int64_t ic = 0; ic < c; ic++) {
            double gg[4][3] = {{0}};
            for (int i = 0; i < 4; i++)
                for (int s = 0; s < 3; s++)
                    for (int r = 0; r < 3; r++)
                        gg[i][s] += gm[i][r] * w[tap_index(transposed, c, o, oc, ic, r, s)];
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++) {
                    double v = 0;
                    for (int s = 0; s < 3; s++)
                        v += gg[i][s] * gm[j][s];
                    u[((i * 4 + j) * c + ic) * o + oc] = (float)v;
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
 * weight_transform in float, one iteration per input channel, whose 16 rows of U
 * it writes along the output channels (16 store streams). The rows of G are
 * written out, one statement each, with G's elements as literals. */
static int runtime_weight_transform(Program *p, const Node *n, const Wino *w, int64_t scratch_bytes,
                                    Diag *d) {
    int64_t c = w->x.c, o = w->y.c;
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
    int g = kb_array(b, "g", KT_F32, 3, 3, false, false), gg = kb_array(b, "gg", KT_F32, 4, 3, false, false);
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
    for (int a = 0; a < 4; a++) {
        KExpr *sum = NULL;
        for (int j = 0; j < 3; j++) {
            KExpr *term = k_mul(b, k_f32(b, gm[a][j]), k_load2(b, g, k_int(b, j), t));
            sum = sum ? k_add(b, sum, term) : term;
        }
        kb_store2(b, gg, k_int(b, a), t, sum, false);
    }
    kb_end(b);
    KExpr *row = k_var(b, kb_for(b, "a", KT_I64, k_int(b, 0), k_int(b, 4), NULL, 0));
    for (int col = 0; col < 4; col++) {
        KExpr *sum = NULL;
        for (int j = 0; j < 3; j++) {
            KExpr *term = k_mul(b, k_load2(b, gg, row, k_int(b, j)), k_f32(b, gm[col][j]));
            sum = sum ? k_add(b, sum, term) : term;
        }
        KExpr *index = k_add(b, u, k_madd(b, k_madd(b, row, 4, k_int(b, col)), c * o, oc));
        kb_store(b, scratch, index, sum);
    }
    kb_end(b);
    kb_end(b);
    return 0;
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
    KBuilder *b = &k->b;
    KExpr *i = k_var(b, k->iter), *zero = k_int(b, 0);
    int x = kb_value(b, w->xv, false), scratch = kb_scratch(b);
    KExpr *image = k_var(b, kb_let(b, "b", KT_I64, k_div(b, i, k_int(b, w->th))));
    KExpr *th = k_var(b, kb_let(b, "th", KT_I64, k_mod(b, i, k_int(b, w->th))));
    KExpr *tw = k_var(b, kb_for(b, "tw", KT_I64, zero, k_int(b, w->tw), NULL, 0));
    KExpr *t = k_var(b, kb_let(b, "t", KT_I64, k_madd(b, i, w->tw, tw)));
    /* each of the 16 inputs: a row offset (clamped inside) and a 0/1 mask */
    KExpr *mask[4][4], *row[4][4];
    for (int r = 0; r < 4; r++)
        for (int q = 0; q < 4; q++) {
            KExpr *hr = k_var(
                b, kb_let(b, name_rq(b, "h", r, q), KT_I64,
                          k_add(b, k_sub(b, k_mul(b, th, k_int(b, 2)), k_int(b, w->pad_top)), k_int(b, r))));
            KExpr *wq = k_var(
                b, kb_let(b, name_rq(b, "w", r, q), KT_I64,
                          k_add(b, k_sub(b, k_mul(b, tw, k_int(b, 2)), k_int(b, w->pad_left)), k_int(b, q))));
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
    /* each of the 16 results its own loop over the channels, a sum of 4 masked inputs
       (B^T has two nonzeros a row): one store stream a loop, which vectorizes */
    for (int a = 0; a < 4; a++)
        for (int j = 0; j < 4; j++) {
            KExpr *ch = k_var(b, kb_for(b, "c", KT_I64, zero, k_int(b, c), NULL, 0));
            KExpr *sum = NULL;
            for (int r = 0; r < 4; r++)
                for (int q = 0; q < 4; q++) {
                    double f = bt[a][r] * bt[j][q];
                    if (f == 0)
                        continue;
                    KExpr *m = sum || f > 0 ? mask[r][q] : k_neg(b, mask[r][q]);
                    KExpr *term = k_mul(b, m, k_load(b, x, k_add(b, row[r][q], ch)));
                    sum = !sum ? term : f < 0 ? k_sub(b, sum, term) : k_add(b, sum, term);
                }
            kb_store(b, scratch, k_add(b, k_madd(b, t, c, ch), k_int(b, (a * 4 + j) * tiles * c)), sum);
            kb_end(b);
        }
    kb_end(b);
    return 0;
}

/* The 16 GEMMs M[k] = V[k] U[k]. */
/* M = V U on U packed, with k made a LOOP over the GEMMs' register tiles. */
static int packed_products(Program *p, const Node *n, Kernel *k, const Wino *w, const float *u, Diag *d) {
    int64_t c = w->x.c, o = w->y.c, tiles = w->tiles;
    PackedGemm g = {.batch = 16,
                    .rows = tiles,
                    .cols = o,
                    .depth = c,
                    .bias = -1,
                    .a_rows = {1, {tiles}, {c}},
                    .a_depth = {1, {c}, {1}},
                    .a_batch = tiles * c,
                    .y_at = 16 * tiles * c,
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
    int64_t c = w->x.c, o = w->y.c, tiles = w->tiles;
    Kernel *k = kernel_new(p, n, K_LOOP, "winograd_gemm");
    if (!k)
        return diag_error(d, n->loc, "out of memory");
    k->scratch_bytes = scratch_bytes;
    k->count = 16;
    k->grain = 1;
    k->flops = lower_flops(4, (int64_t[]){2 * 16, tiles, c, o});
    if (w->u_at >= 0) {
        kernel_reads(k, n->in[1]); /* through U, which the scratch holds */
    } else {
        float *u = weight_transform(p, n, w->transposed, c, o);
        if (!u)
            return diag_error(d, n->loc, "out of memory");
        int rc = p->vector_floats > 0 ? packed_products(p, n, k, w, u, d)
                                      : program_table(p, k, u, (int64_t)sizeof(float) * 16 * c * o, d);
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
             k_addr(b, scratch, k_madd(b, i, tiles * o, k_int(b, 16 * tiles * c))), o);
    return 0;
}

/* The output transform, bias and epilogue: one iteration per tile row of an image. */
static int output_transform(Program *p, const Node *n, const Wino *w, const Expr *epilogue,
                            int64_t scratch_bytes, Diag *d) {
    Kernel *k = kernel_loop(p, n, "winograd_out", w->y.n * w->th, 1, d);
    if (!k)
        return -1;
    k->scratch_bytes = scratch_bytes;
    int64_t o = w->y.c, ho = w->y.sp[0], wo = w->y.sp[1], tiles = w->tiles, base = 16 * w->tiles * w->x.c;
    KBuilder *b = &k->b;
    KExpr *i = k_var(b, k->iter), *zero = k_int(b, 0);
    int y = kb_value(b, w->yv, true), scratch = kb_scratch(b);
    KExpr *image = k_var(b, kb_let(b, "b", KT_I64, k_div(b, i, k_int(b, w->th))));
    KExpr *th = k_var(b, kb_let(b, "th", KT_I64, k_mod(b, i, k_int(b, w->th))));
    KExpr *rows =
        k_var(b, kb_let(b, "rows", KT_I64,
                        k_select(b, k_lt(b, k_add(b, k_mul(b, th, k_int(b, 2)), k_int(b, 1)), k_int(b, ho)),
                                 k_int(b, 2), k_int(b, 1))));
    KExpr *tile =
        k_var(b, kb_let(b, "tile", KT_I64,
                        k_mul(b, k_madd(b, image, ho, k_mul(b, th, k_int(b, 2))), k_int(b, wo * o))));
    KExpr *tw = k_var(b, kb_for(b, "tw", KT_I64, zero, k_int(b, w->tw), NULL, 0));
    KExpr *t = k_var(b, kb_let(b, "t", KT_I64, k_madd(b, i, w->tw, tw)));
    KExpr *cols =
        k_var(b, kb_let(b, "cols", KT_I64,
                        k_select(b, k_lt(b, k_add(b, k_mul(b, tw, k_int(b, 2)), k_int(b, 1)), k_int(b, wo)),
                                 k_int(b, 2), k_int(b, 1))));
    /* each of the 4 outputs of the tile its own loop over the channels, a sum of 9
       products (A^T has three nonzeros a row), which vectorizes; the first is
       always inside the output */
    for (int r = 0; r < 2; r++)
        for (int q = 0; q < 2; q++) {
            KExpr *inside = NULL;
            if (r > 0)
                inside = k_lt(b, k_int(b, r), rows);
            if (q > 0)
                inside = inside ? k_and(b, inside, k_lt(b, k_int(b, q), cols)) : k_lt(b, k_int(b, q), cols);
            if (inside)
                kb_if(b, inside);
            else
                kb_scope(b);
            KExpr *out = k_var(b, kb_let(b, "out", KT_I64,
                                         k_add(b, tile, k_madd(b, tw, 2 * o, k_int(b, r * wo * o + q * o)))));
            KExpr *oc = k_var(b, kb_for(b, "o", KT_I64, zero, k_int(b, o), NULL, 0));
            KExpr *sum = NULL;
            for (int a = 0; a < 4; a++)
                for (int j = 0; j < 4; j++) {
                    double f = at[r][a] * at[q][j];
                    if (f == 0)
                        continue;
                    KExpr *term = k_load(
                        b, scratch, k_add(b, k_madd(b, t, o, oc), k_int(b, base + (a * 4 + j) * tiles * o)));
                    sum = !sum    ? (f < 0 ? k_neg(b, term) : term)
                          : f < 0 ? k_sub(b, sum, term)
                                  : k_add(b, sum, term);
                }
            if (w->bv >= 0)
                sum = k_add(b, sum, k_load(b, kb_value(b, w->bv, false), oc));
            kb_store(b, y, k_add(b, out, oc), sum);
            kb_end(b);
            kb_end(b);
        }
    kb_end(b);
    kb_tile_epilogue(b, p, n, epilogue, -1, NULL, NULL, y, tile, rows, k_int(b, wo * o), wo * o, 1);
    return 0;
}

int lower_winograd(Program *p, const Node *n, const Expr *epilogue, Diag *d) {
    const Graph *g = p->g;
    Wino w = {.x = view_of(&g->values[n->in[0]].type, true),
              .y = view_of(&g->values[n->out[0]].type, true),
              .transposed = n->op == OP_CONV_TRANSPOSE,
              .xv = n->in[0],
              .yv = n->out[0],
              .wv = n->in[1],
              .bv = n->n_in > 2 && n->in[2] >= 0 ? n->in[2] : -1};
    int64_t pads[4];
    node_ints(n, ATTR_PADS, pads, 4, 4);
    w.pad_top = w.transposed ? 2 - pads[0] : pads[0], w.pad_left = w.transposed ? 2 - pads[1] : pads[1];
    w.th = (w.y.sp[0] + 1) / 2, w.tw = (w.y.sp[1] + 1) / 2;
    w.tiles = w.x.n * w.th * w.tw;
    if (w.tiles * 16 > INT_MAX || w.tiles * w.x.c > INT_MAX / 16)
        return diag_error(d, n->loc, "conv: too many Winograd tiles for BLAS");
    int64_t scratch_bytes = (int64_t)sizeof(float) * 16 * w.tiles * (w.x.c + w.y.c);
    w.u_at = -1;
    if (p->buf[n->in[1]].kind != BUF_WEIGHT) {
        w.u_at = scratch_bytes / (int64_t)sizeof(float);
        scratch_bytes += (int64_t)sizeof(float) * 16 * w.x.c * w.y.c;
        if (runtime_weight_transform(p, n, &w, scratch_bytes, d))
            return -1;
    }
    if (input_transform(p, n, &w, scratch_bytes, d) || products(p, n, &w, scratch_bytes, d) ||
        output_transform(p, n, &w, epilogue, scratch_bytes, d))
        return -1;
    return 0;
}
