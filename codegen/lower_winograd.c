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
 *   M = V U, 16 GEMMs [tiles, C] x [C, O] (a LOOP of 16 cblas_sgemm calls);
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
#include <string.h>

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
    char xn[80], yn[80], bn[80], wn[80];
} Wino;

/* The 16 GEMMs have a row per tile; with fewer rows BLAS runs them slower than the
 * im2col GEMM runs 2.25 times the work (ResNet-18's 7x7 layer4, 16 tiles). */
enum { MIN_TILES = 32 };

/* Whether conv or conv_transpose n takes this path: 2-D, nhwc, groups 1, 3x3,
 * stride and dilation 1 (for conv_transpose also no output_padding and pads of at
 * most 2), and enough channels and tiles for the GEMMs to be worth it. */
bool winograd_applies(const Program *p, const Node *n) {
    const Graph *g = p->g;
    if (!p->blas || !layout_is_nhwc(n) || g->values[n->in[0]].type.rank != 4 || node_int(n, ATTR_GROUPS) != 1)
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

/* The weight transform at run time, into the scratch at u_at: the arithmetic of
 * weight_transform in float, one iteration per input channel, whose 16 rows of U
 * it writes along the output channels (16 store streams). */
static int runtime_weight_transform(Program *p, const Node *n, const Wino *w, int64_t scratch_bytes, Diag *d) {
    long long c = w->x.c, o = w->y.c;
    Kernel *k = kernel_new(p, n, K_LOOP, "winograd_weights");
    if (!k)
        return diag_error(d, n->loc, "out of memory");
    kernel_reads(k, n->in[1]);
    k->scratch_bytes = scratch_bytes;
    k->count = c;
    k->grain = 1;
    Str *s = &k->body;
    str_printf(s, "const float G[4][3] = {{1, 0, 0}, {0.5f, 0.5f, 0.5f}, {0.5f, -0.5f, 0.5f}, {0, 0, 1}};\n");
    str_printf(s, "float *u = scratch + %lld + i * %lld;\n", (long long)w->u_at, o);
    str_printf(s, "for (int64_t oc = 0; oc < %lld; oc++) {\n    float g[3][3], gg[4][3];\n", o);
    str_printf(s, "    for (int r = 0; r < 3; r++)\n        for (int t = 0; t < 3; t++)\n");
    if (w->transposed)
        str_printf(s, "            g[r][t] = %s[((i * 3 + 2 - r) * 3 + 2 - t) * %lld + oc];\n", w->wn, o);
    else
        str_printf(s, "            g[r][t] = %s[(oc * 9 + r * 3 + t) * %lld + i];\n", w->wn, c);
    str_printf(s, "    for (int a = 0; a < 4; a++)\n        for (int t = 0; t < 3; t++)\n"
                  "            gg[a][t] = G[a][0] * g[0][t] + G[a][1] * g[1][t] + G[a][2] * g[2][t];\n");
    str_printf(s, "    for (int a = 0; a < 4; a++)\n        for (int b = 0; b < 4; b++)\n"
                  "            u[(a * 4 + b) * %lld + oc] = gg[a][0] * G[b][0] + gg[a][1] * G[b][1] + gg[a][2] * G[b][2];\n}\n",
               c * o);
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
    long long c = w->x.c, h = w->x.sp[0], wd = w->x.sp[1], tiles = w->tiles;
    Str *s = &k->body;
    str_printf(s, "int64_t b = i / %lld, th = i %% %lld;\n", (long long)w->th, (long long)w->th);
    str_printf(s, "for (int64_t tw = 0; tw < %lld; tw++) {\n", (long long)w->tw);
    str_printf(s, "    int64_t t = i * %lld + tw;\n", (long long)w->tw);
    /* each of the 16 inputs: a row pointer (clamped inside) and a 0/1 mask */
    for (int r = 0; r < 4; r++)
        for (int q = 0; q < 4; q++) {
            str_printf(s, "    int64_t h%d%d = th * 2 - %lld + %d, w%d%d = tw * 2 - %lld + %d;\n", r, q,
                       (long long)w->pad_top, r, r, q, (long long)w->pad_left, q);
            str_printf(s, "    float m%d%d = h%d%d >= 0 && h%d%d < %lld && w%d%d >= 0 && w%d%d < %lld ? 1.0f : 0.0f;\n",
                       r, q, r, q, r, q, h, r, q, r, q, wd);
            str_printf(s,
                       "    const float *x%d%d = %s + ((b * %lld + (m%d%d != 0.0f ? h%d%d : 0)) * %lld + "
                       "(m%d%d != 0.0f ? w%d%d : 0)) * %lld;\n",
                       r, q, w->xn, h, r, q, r, q, wd, r, q, r, q, c);
        }
    /* each of the 16 results its own loop over the channels, a sum of 4 masked inputs
       (B^T has two nonzeros a row): one store stream a loop, which vectorizes */
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            str_printf(s, "    for (int64_t c = 0; c < %lld; c++)\n        scratch[(%lld + t) * %lld + c] =", c,
                       (long long)((i * 4 + j) * tiles), c);
            bool first = true;
            for (int r = 0; r < 4; r++)
                for (int q = 0; q < 4; q++) {
                    double f = bt[i][r] * bt[j][q];
                    if (f == 0)
                        continue;
                    str_printf(s, " %sm%d%d * x%d%d[c]", f < 0 ? "- " : first ? "" : "+ ", r, q, r, q);
                    first = false;
                }
            str_printf(s, ";\n");
        }
    str_printf(s, "}\n");
    return 0;
}

/* The 16 GEMMs M[k] = V[k] U[k]. */
static int products(Program *p, const Node *n, const Wino *w, int64_t scratch_bytes, Diag *d) {
    long long c = w->x.c, o = w->y.c, tiles = w->tiles;
    Kernel *k = kernel_new(p, n, K_LOOP, "winograd_gemm");
    if (!k)
        return diag_error(d, n->loc, "out of memory");
    k->scratch_bytes = scratch_bytes;
    k->count = 16;
    k->grain = 1;
    k->flops = lower_flops(4, (int64_t[]){2 * 16, tiles, c, o});
    char u_expr[64] = "table";
    if (w->u_at >= 0) {
        kernel_reads(k, n->in[1]); /* through U, which the scratch holds */
        snprintf(u_expr, sizeof u_expr, "scratch + %lld", (long long)w->u_at);
    } else {
        float *u = weight_transform(p, n, w->transposed, c, o);
        if (!u)
            return diag_error(d, n->loc, "out of memory");
        int rc = program_table(p, k, u, (int64_t)sizeof(float) * 16 * c * o, d);
        ir_free(u);
        if (rc)
            return -1;
    }
    str_printf(&k->body,
               "cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, %lld, %lld, %lld, 1.0f,\n"
               "            scratch + i * %lld, %lld, %s + i * %lld, %lld, 0.0f,\n"
               "            scratch + %lld + i * %lld, %lld);\n",
               tiles, o, c, tiles * c, c, u_expr, c * o, o, 16 * tiles * c, tiles * o, o);
    return 0;
}

/* The output transform, bias and epilogue: one iteration per tile row of an image. */
static int output_transform(Program *p, const Node *n, const Wino *w, const Expr *epilogue, int64_t scratch_bytes,
                            Diag *d) {
    Kernel *k = kernel_loop(p, n, "winograd_out", w->y.n * w->th, 1, d);
    if (!k)
        return -1;
    k->scratch_bytes = scratch_bytes;
    long long o = w->y.c, ho = w->y.sp[0], wo = w->y.sp[1], tiles = w->tiles, base = 16 * w->tiles * w->x.c;
    Str *s = &k->body;
    str_printf(s, "int64_t b = i / %lld, th = i %% %lld;\n", (long long)w->th, (long long)w->th);
    str_printf(s, "int rows = th * 2 + 1 < %lld ? 2 : 1;\n", ho);
    str_printf(s, "float *tile = %s + (b * %lld + th * 2) * %lld;\n", w->yn, ho, wo * o);
    str_printf(s, "for (int64_t tw = 0; tw < %lld; tw++) {\n", (long long)w->tw);
    str_printf(s, "    int64_t t = i * %lld + tw;\n    int cols = tw * 2 + 1 < %lld ? 2 : 1;\n", (long long)w->tw,
               wo);
    /* each of the 4 outputs of the tile its own loop over the channels, a sum of 9
       products (A^T has three nonzeros a row), which vectorizes */
    const char *bias = w->bn[0] ? w->bn : NULL;
    for (int r = 0; r < 2; r++)
        for (int q = 0; q < 2; q++) {
            str_printf(s, "    if (%d < rows && %d < cols) {\n", r, q);
            str_printf(s, "        float *out = tile + %lld + tw * %lld;\n", (long long)(r * wo * o + q * o), 2 * o);
            str_printf(s, "        for (int64_t o = 0; o < %lld; o++)\n            out[o] =", o);
            bool first = true;
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++) {
                    double f = at[r][i] * at[q][j];
                    if (f == 0)
                        continue;
                    str_printf(s, " %sscratch[%lld + (%lld + t) * %lld + o]", f < 0 ? "- " : first ? "" : "+ ", base,
                               (long long)((i * 4 + j) * tiles), o);
                    first = false;
                }
            str_printf(s, "%s%s%s;\n    }\n", bias ? " + " : "", bias ? bias : "", bias ? "[o]" : "");
        }
    str_printf(s, "}\n");
    char cols[32];
    snprintf(cols, sizeof cols, "%lld", wo * o);
    emit_tile_epilogue(s, p, n, epilogue, "", NULL, "rows", cols, wo * o, 1);
    return 0;
}

int lower_winograd(Program *p, const Node *n, const Expr *epilogue, Diag *d) {
    const Graph *g = p->g;
    Wino w = {.x = view_of(&g->values[n->in[0]].type, true),
              .y = view_of(&g->values[n->out[0]].type, true),
              .transposed = n->op == OP_CONV_TRANSPOSE};
    int64_t pads[4];
    node_ints(n, ATTR_PADS, pads, 4, 4);
    w.pad_top = w.transposed ? 2 - pads[0] : pads[0], w.pad_left = w.transposed ? 2 - pads[1] : pads[1];
    w.th = (w.y.sp[0] + 1) / 2, w.tw = (w.y.sp[1] + 1) / 2;
    w.tiles = w.x.n * w.th * w.tw;
    if (w.tiles * 16 > INT_MAX || w.tiles * w.x.c > INT_MAX / 16)
        return diag_error(d, n->loc, "conv: too many Winograd tiles for BLAS");
    snprintf(w.xn, sizeof w.xn, "%s", value_name(p, n->in[0]));
    snprintf(w.yn, sizeof w.yn, "%s", value_name(p, n->out[0]));
    snprintf(w.wn, sizeof w.wn, "%s", value_name(p, n->in[1]));
    if (n->n_in > 2 && n->in[2] >= 0)
        snprintf(w.bn, sizeof w.bn, "%s", value_name(p, n->in[2]));
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
