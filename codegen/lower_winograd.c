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
 * The input and output transforms are kiln's precompiled kernels (kiln_winograd_in
 * and kiln_winograd_out, runtime/kernels.c), the same code for every layer, given
 * the shapes in a KilnWinograd in the kernel's table; the epilogue is generated.
 * A conv_transpose with stride 1 is the conv of its input with the weights flipped
 * in space and their channel dims swapped, padded by 2 - pad: the backward pass of
 * a 3x3 conv takes the same path through its weight transform.
 * The transforms are exact in real arithmetic (Lavin and Gray, 2015); in float,
 * F(2x2, 3x3) loses about as much as the direct sum does, F(4x4, 3x3) (whose points
 * are 0, +-1, +-2) several times that (5e-6 of the largest output in
 * codegen_winograd4.kiln), both far inside the tolerance. F(4x4, 3x3) runs where
 * the output has MIN_TILES tiles of 4 x 4, F(2x2, 3x3) where it has MIN_TILES of 2 x 2
 * (transform_for). */
#include "codegen.h"

#include <limits.h>

enum { MAX_N = 6 };

/* G of F(m x m, 3x3), n = m + 2 (B^T and A^T are runtime/kernels.c's). */
typedef struct {
    int m, n;
    double g[MAX_N][3];
} Transform;

static const Transform f2 = {2, 4, {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}}};

static const Transform f4 = {4,
                             6,
                             {{1.0 / 4, 0, 0},
                              {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                              {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                              {1.0 / 24, 1.0 / 12, 1.0 / 6},
                              {1.0 / 24, -1.0 / 12, 1.0 / 6},
                              {0, 0, 1}}};

typedef struct {
    const Transform *t;
    View x, y;
    int64_t pad_top, pad_left;
    int64_t th, tw, tiles;      /* tile rows and columns per image, tiles in all */
    int64_t v_stride, m_stride; /* floats from one of V's or M's matrices to the next */
    bool transposed;            /* a conv_transpose: w is [C, 3, 3, O], read flipped */
    int64_t u_at;               /* U in the scratch (weights not known at compile time), else -1 */
    int xv, yv, wv, bv;         /* value ids; bv -1 without bias */
} Wino;

/* The GEMMs have a row per tile; with fewer rows they run slower than the direct
 * GEMM runs 2.25 times the work (ResNet-18's 7x7 layer4, 16 tiles of 2 x 2). */
enum { MIN_TILES = 32 };

/* The transformed elements a chunk of a transform's iterations (tile rows) should
 * hold at least, as other kernels' chunks do: a small image's tile rows go together,
 * on one thread when there are few (the small CNN's 16 x 16 inputs). */
enum { TRANSFORM_WORK = 16384 };

/* The floats from one of V's or M's matrices of `floats` floats to the next: whole
 * cache lines, an odd number of them. The transforms read or write all (m + 2)^2
 * matrices at once, and at a multiple of 4 KiB apart they would fall into one set of
 * the cache (the small CNN's input transform ran 2.2x slower). */
static int64_t matrix_stride(int64_t floats) {
    int64_t lines = (floats + 15) / 16;
    return (lines | 1) * 16;
}

/* The tiles of m x m of a conv's output y [N, H, W, O]. */
static int64_t tiles_of(const Type *y, int m) {
    return y->dims[0] * ((y->dims[1] + m - 1) / m) * ((y->dims[2] + m - 1) / m);
}

/* The transform for output y: F(4x4, 3x3) where it has enough tiles of 4 x 4, else
 * F(2x2, 3x3). ResNet's 14 x 14 layers have 16 tiles of 4 x 4, and each of F(4x4,
 * 3x3)'s 36 GEMMs would read its [C, O] of the weights for 16 rows: 9.4 MB at 256
 * channels, read from memory at every run, against F(2x2, 3x3)'s 4.2 MB, read for
 * 49 rows. On a Zen 5 (AVX-512, 2 threads) F(2x2, 3x3) ran ResNet-18 and ResNet-50
 * 2.5% faster there (an Intel Xeon's AVX-512 had run F(4x4, 3x3) 2.5% faster; with
 * AVX2 the two ran as fast). */
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

/* The weight transform at run time, into the scratch at u_at: the arithmetic of
 * weight_transform in float, with U laid out along w's contiguous dim (a conv's
 * input channels, a conv_transpose's output channels): U[k][O][C] for a conv, which
 * the GEMMs read transposed, U[k][C][O] for a conv_transpose. One iteration per
 * channel of w's other dim; the inner loop runs along the contiguous one, straight
 * code that vectorizes: 9 loads, G's rows written out with its elements as literals,
 * n^2 stores. */
static int runtime_weight_transform(Program *p, const Node *n, const Wino *w, int64_t scratch_bytes,
                                    Diag *d) {
    int64_t c = w->x.c, o = w->y.c, inner = w->transposed ? o : c;
    int an = w->t->n;
    Kernel *k = kernel_new(p, n, K_LOOP, "winograd_weights");
    if (!k)
        return diag_error(d, n->loc, "out of memory");
    kernel_reads(k, n->in[1]);
    k->scratch_bytes = scratch_bytes;
    k->count = w->transposed ? c : o;
    k->grain = 1;
    KBuilder *b = &k->b;
    int wt = kb_value(b, w->wv, false), scratch = kb_scratch(b);
    KExpr *at = k_var(b, kb_let(b, "at", KT_I64, k_mul(b, k_var(b, k->iter), k_int(b, inner))));
    KExpr *e = k_var(b, kb_for(b, "e", KT_I64, k_int(b, 0), k_int(b, inner), NULL, K_VECTOR));
    static const char *const g_names[3][3] = {
        {"g00", "g01", "g02"}, {"g10", "g11", "g12"}, {"g20", "g21", "g22"}};
    static const char *const gg_names[MAX_N][3] = {{"gg00", "gg01", "gg02"}, {"gg10", "gg11", "gg12"},
                                                   {"gg20", "gg21", "gg22"}, {"gg30", "gg31", "gg32"},
                                                   {"gg40", "gg41", "gg42"}, {"gg50", "gg51", "gg52"}};
    KExpr *g[3][3], *gg[MAX_N][3];
    for (int r = 0; r < 3; r++)
        for (int t = 0; t < 3; t++) {
            int tap = w->transposed ? (2 - r) * 3 + 2 - t : r * 3 + t; /* a conv_transpose's, flipped */
            KExpr *index = k_madd(b, at, 9, k_add(b, e, k_int(b, tap * inner)));
            g[r][t] = k_var(b, kb_let(b, g_names[r][t], KT_F32, k_load(b, wt, index)));
        }
    for (int a = 0; a < an; a++)
        for (int t = 0; t < 3; t++) {
            KExpr *sum = NULL;
            for (int j = 0; j < 3; j++) {
                KExpr *term = k_mul(b, k_f32(b, w->t->g[a][j]), g[j][t]);
                sum = sum ? k_add(b, sum, term) : term;
            }
            gg[a][t] = k_var(b, kb_let(b, gg_names[a][t], KT_F32, sum));
        }
    for (int row = 0; row < an; row++)
        for (int col = 0; col < an; col++) {
            KExpr *sum = NULL;
            for (int j = 0; j < 3; j++) {
                KExpr *term = k_mul(b, gg[row][j], k_f32(b, w->t->g[col][j]));
                sum = sum ? k_add(b, sum, term) : term;
            }
            KExpr *index = k_add(b, k_int(b, w->u_at + (row * an + col) * c * o), k_add(b, at, e));
            kb_store(b, scratch, index, sum);
        }
    kb_end(b);
    return 0;
}

/* A LOOP kernel of one iteration per tile row of an image, its table kiln_winograd_in's
 * and kiln_winograd_out's parameters. */
static Kernel *transform_kernel(Program *p, const Node *n, const Wino *w, const char *what,
                                int64_t scratch_bytes, Diag *d) {
    Kernel *k = kernel_new(p, n, K_LOOP, what);
    if (!k) {
        diag_error(d, n->loc, "out of memory");
        return NULL;
    }
    int64_t row = w->tw * w->t->n * w->t->n * w->x.c; /* a tile row's transformed input */
    k->count = w->x.n * w->th;
    k->grain = (TRANSFORM_WORK + row - 1) / row;
    kernel_follows(p, k, &p->g->values[n->out[0]].type, k->count, 1, 1); /* image by image */
    KilnWinograd params = {.m = w->t->m,
                           .c = w->x.c,
                           .h = w->x.sp[0],
                           .w = w->x.sp[1],
                           .pad_top = w->pad_top,
                           .pad_left = w->pad_left,
                           .th = w->th,
                           .tw = w->tw,
                           .tiles = w->tiles,
                           .o = w->y.c,
                           .ho = w->y.sp[0],
                           .wo = w->y.sp[1],
                           .v_stride = w->v_stride,
                           .m_stride = w->m_stride};
    if (!k || program_table(p, k, &params, sizeof params, d))
        return NULL;
    k->scratch_bytes = scratch_bytes;
    return k;
}

/* The input transform, into the scratch (kiln_winograd_in). */
static int input_transform(Program *p, const Node *n, const Wino *w, int64_t scratch_bytes, Diag *d) {
    Kernel *k = transform_kernel(p, n, w, "winograd_in", scratch_bytes, d);
    if (!k)
        return -1;
    kernel_reads(k, n->in[0]);
    KBuilder *b = &k->b;
    KExpr *zero = k_int(b, 0);
    kb_call(b, "kiln_winograd_in", 4,
            (KExpr *[]){k_addr(b, kb_table(b), zero), k_addr(b, kb_value(b, w->xv, false), zero),
                        k_addr(b, kb_scratch(b), zero), k_var(b, k->iter)});
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
                    .a_batch = w->v_stride,
                    .y_at = nn * w->v_stride,
                    .y_ld = o,
                    .y_batch = w->m_stride,
                    .b = u,
                    .b_depth = {1, {c}, {o}},
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
    bool u_transposed = w->u_at >= 0 && !w->transposed; /* U[k][O][C] (runtime_weight_transform) */
    kb_sgemm(b, false, u_transposed, k_i32(b, tiles), k_i32(b, o), c, k_f32(b, 1),
             k_addr(b, scratch, k_mul(b, i, k_int(b, w->v_stride))), c, k_addr(b, table, u_at),
             u_transposed ? c : o, k_f32(b, 0),
             k_addr(b, scratch, k_madd(b, i, w->m_stride, k_int(b, nn * w->v_stride))), o);
    return 0;
}

/* The output transform and bias (kiln_winograd_out), then the epilogue over the
 * tile row while it is in cache. */
static int output_transform(Program *p, const Node *n, const Wino *w, const Expr *epilogue,
                            int64_t scratch_bytes, Diag *d) {
    Kernel *k = transform_kernel(p, n, w, "winograd_out", scratch_bytes, d);
    if (!k)
        return -1;
    for (int j = 0; j < n->n_in; j++)
        if (n->in[j] >= 0)
            kernel_reads(k, n->in[j]);
    kernel_writes(k, n->out[0]);
    int64_t m = w->t->m, o = w->y.c, ho = w->y.sp[0], wo = w->y.sp[1], an = w->t->n,
            mv = an * an * w->v_stride;
    KBuilder *b = &k->b;
    KExpr *i = k_var(b, k->iter), *zero = k_int(b, 0);
    int y = kb_value(b, w->yv, true), scratch = kb_scratch(b);
    KExpr *bias = w->bv >= 0 ? k_addr(b, kb_value(b, w->bv, false), zero) : k_int(b, 0);
    kb_call(b, "kiln_winograd_out", 5,
            (KExpr *[]){k_addr(b, kb_table(b), zero), k_addr(b, scratch, k_int(b, mv)), bias,
                        k_addr(b, y, zero), i});
    KExpr *image = k_var(b, kb_let(b, "b", KT_I64, k_div(b, i, k_int(b, w->th))));
    KExpr *th = k_var(b, kb_let(b, "th", KT_I64, k_mod(b, i, k_int(b, w->th))));
    KExpr *left = k_sub(b, k_int(b, ho), k_mul(b, th, k_int(b, m)));
    KExpr *rows =
        k_var(b, kb_let(b, "rows", KT_I64, k_select(b, k_lt(b, left, k_int(b, m)), left, k_int(b, m))));
    KExpr *tile =
        k_var(b, kb_let(b, "tile", KT_I64,
                        k_mul(b, k_madd(b, image, ho, k_mul(b, th, k_int(b, m))), k_int(b, wo * o))));
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
    w.v_stride = matrix_stride(w.tiles * w.x.c), w.m_stride = matrix_stride(w.tiles * w.y.c);
    int64_t scratch_bytes =
        lower_size(n, "Winograd scratch", 3, (int64_t[]){sizeof(float), nn, w.v_stride + w.m_stride}, d);
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
