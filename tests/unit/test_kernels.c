/* kiln's precompiled kernels (runtime/kernels.c), the object of one vector width
 * (KILN_VF, linked by CMake) against sums in double:
 *   - kiln_gemm_tiles on every tile shape (1 to 12 rows of one vector, 1 to 6 of
 *     two, 1 to 8 with AVX-512), with a narrower last panel, rows evenly spaced
 *     (any distance apart, and 3 and 6 floats, which have tiles of their own) and
 *     rows across a digit's end (a conv's next output row), a depth in several
 *     segments, batch items with B of their own, stored straight or at an offset;
 *   - kiln_winograd_in and kiln_winograd_out for F(2x2, 3x3) and F(4x4, 3x3),
 *     padded and not, with tiles across the output's last row and column: every
 *     value against B^T d B and A^T m A + bias, no store outside y, and an infinity
 *     in x that reaches no tile it does not lie in (zeros outside x are zeros, not
 *     0 times a clamped read);
 *   - kiln_depthwise_row on 3x3 and 5x5 taps and others, strided, dilated and
 *     padded unevenly, on channels of whole vectors, a vector and some (the last
 *     vector overlapping the one before) and fewer than one, with and without a
 *     bias: every row against a sum in double, nothing read from around x (NaN
 *     there) and nothing stored past the row; and each row again from a ring of
 *     the rows it reads (KilnWindow's ring, the other rows NaN), bit for bit; with
 *     relu and clip, each output that activation of the one without, bit for bit;
 *   - kiln_max_pool_row on 2x2, 3x3 and 4x4 windows, strided, dilated and padded,
 *     on the same channel counts: bit for bit, the last NaN of a window kept, nothing
 *     read from around x (+inf there) nor stored past the row;
 *   - kiln_bias_act, every activation with a bias and without, with a residual and
 *     without, bit for bit; GELU against erfc in double, within kiln_geluf's bounds
 *     (runtime/kernel_math.h), over the floats from -20 to 20 and the special values;
 *   - kiln_attention_softmax over blocks of 16 to 128 scores, in turn, against the
 *     same steps in double: -inf (masked) and NaN scores, rows masked so far, Ev of
 *     whole vectors and not.
 * Skipped where this CPU lacks the width's instructions. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "../../runtime/kernels.h"

#ifndef KILN_VF
#error "KILN_VF: the width of the kernels' object this test is linked with"
#endif

enum { NR = 2 * KILN_VF, BLOCK = (sizeof(KilnGemm) + 63) / 64 * 16 };

static bool supported(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                  __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
    return KILN_VF == 4 || (KILN_VF == 8 && avx2) || (KILN_VF == 16 && avx2 && avx512);
#else
    return KILN_VF == 4;
#endif
}

static unsigned seed = 12345;
static float uniform(void) {
    seed = seed * 1103515245u + 12345u;
    return (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* ---- GEMM ---- */

/* One GEMM's case: A's rows are a grid of `width` columns `step` floats apart, its
 * grid rows `pitch` apart (width == rows: one digit); the depth `segments` runs of
 * `run`, each `seg_stride` apart. */
typedef struct {
    int64_t batch, rows, cols, run, segments, seg_stride, width, step, pitch, tile_rows;
    bool own_b; /* each batch item its own B */
} GemmCase;

static int64_t padded(int64_t cols) {
    return (cols + KILN_VF - 1) / KILN_VF * KILN_VF;
}

static int64_t a_offset(const GemmCase *c, int64_t r, int64_t kk) {
    return r / c->width * c->pitch + r % c->width * c->step + kk / c->run * c->seg_stride + kk % c->run;
}

static void check_gemm(const GemmCase *c) {
    int64_t depth = c->run * c->segments, items = c->own_b ? c->batch : 1, per_item = depth * padded(c->cols);
    int64_t a_item =
        (c->rows - 1) / c->width * c->pitch + c->width * c->step + c->segments * c->seg_stride + 64;
    float *a = calloc((size_t)(c->batch * a_item), sizeof *a);
    float *b = calloc((size_t)(items * depth * c->cols), sizeof *b);
    size_t table_bytes = ((size_t)(BLOCK + items * per_item) * sizeof(float) + 127) / 64 * 64;
    float *table = aligned_alloc(64, table_bytes); /* a size of whole alignments, as C11 asks */
    int64_t out_ld = padded(c->cols) + 8;
    float *out = calloc((size_t)(c->batch * c->rows * out_ld + 64), sizeof *out);
    assert_true(a && b && table && out);
    for (int64_t i = 0; i < c->batch * a_item; i++)
        a[i] = uniform();
    for (int64_t i = 0; i < items * depth * c->cols; i++)
        b[i] = uniform();
    KilnGemm g = {.rows = c->rows,
                  .cols = c->cols,
                  .depth = depth,
                  .tile_rows = c->tile_rows,
                  .a_at = 3,
                  .a_batch = a_item,
                  .segments = c->segments,
                  .run = c->run,
                  .panels_at = BLOCK,
                  .item_floats = c->own_b ? per_item : 0};
    if (c->width == c->rows) {
        g.row_digits = 1;
        g.row_size[0] = c->rows;
        g.row_stride[0] = c->step;
    } else {
        g.row_digits = 2;
        g.row_size[0] = (c->rows + c->width - 1) / c->width;
        g.row_stride[0] = c->pitch;
        g.row_size[1] = c->width;
        g.row_stride[1] = c->step;
    }
    for (int64_t s = 0; s < c->segments; s++)
        g.segment[s] = s * c->seg_stride;
    memset(table, 0, (size_t)(BLOCK + items * per_item) * sizeof(float));
    memcpy(table, &g, sizeof g);
    for (int64_t bi = 0; bi < items; bi++) /* panels of NR columns, [depth][width padded] */
        for (int64_t q0 = 0; q0 < c->cols; q0 += NR) {
            int64_t width = c->cols - q0 < NR ? c->cols - q0 : NR;
            for (int64_t kk = 0; kk < depth; kk++)
                for (int64_t j = 0; j < width; j++)
                    table[BLOCK + bi * per_item + q0 * depth + kk * padded(width) + j] =
                        b[(bi * depth + kk) * c->cols + q0 + j];
        }
    /* two row tiles and two panels a call, a block the lowering asks for */
    for (int64_t bi = 0; bi < c->batch; bi++)
        for (int64_t r0 = 0; r0 < c->rows; r0 += 2 * c->tile_rows)
            for (int64_t q0 = 0; q0 < c->cols; q0 += 2 * NR) {
                int64_t rows = c->rows - r0 < 2 * c->tile_rows ? c->rows - r0 : 2 * c->tile_rows;
                int64_t panels = (c->cols - q0 + NR - 1) / NR < 2 ? (c->cols - q0 + NR - 1) / NR : 2;
                kiln_gemm_tiles(table, a, bi, r0, rows, q0, panels, out + (bi * c->rows + r0) * out_ld + q0,
                                out_ld);
            }
    for (int64_t bi = 0; bi < c->batch; bi++)
        for (int64_t r = 0; r < c->rows; r++)
            for (int64_t q = 0; q < c->cols; q++) {
                double sum = 0, size = 0;
                for (int64_t kk = 0; kk < depth; kk++) {
                    double t = (double)a[bi * a_item + 3 + a_offset(c, r, kk)] *
                               b[((c->own_b ? bi : 0) * depth + kk) * c->cols + q];
                    sum += t;
                    size += fabs(t);
                }
                double got = out[(bi * c->rows + r) * out_ld + q];
                if (fabs(got - sum) > 1e-5 * size + 1e-6)
                    fail_msg("rows %lld cols %lld run %lld x %lld: item %lld (%lld, %lld) is %g, not %g",
                             (long long)c->rows, (long long)c->cols, (long long)c->run,
                             (long long)c->segments, (long long)bi, (long long)r, (long long)q, got, sum);
            }
    free(a), free(b), free(table), free(out);
}

static void test_gemm_tile_shapes(void **state) {
    (void)state;
    if (!supported())
        skip();
    /* one vector's width of columns: tiles of 12 rows, and every shape below */
    for (int64_t rows = 1; rows <= 25; rows++)
        check_gemm(&(GemmCase){1, rows, KILN_VF - 3 > 0 ? KILN_VF - 3 : 1, 37, 1, 0, rows, 40, 0, 12, false});
    /* two vectors' and more: tiles of 6 rows, a last panel of one vector or two */
    for (int64_t rows = 1; rows <= 13; rows++)
        for (int64_t cols = KILN_VF + 1; cols <= 3 * NR; cols += NR / 2 + 3)
            check_gemm(&(GemmCase){1, rows, cols, 19, 1, 0, rows, 24, 0, 6, false});
#if KILN_VF == 16
    /* AVX-512's deep GEMMs: tiles of 8 rows, and the 7 and 8 below them */
    for (int64_t rows = 1; rows <= 17; rows++)
        check_gemm(&(GemmCase){1, rows, 2 * NR + KILN_VF, 259, 1, 0, rows, 260, 0, 8, false});
#endif
    /* rows 3 and 6 floats apart (a first conv's on 3 channels), which tiles of their
       own address: every shape again */
    for (int64_t step = 3; step <= 6; step += 3)
        for (int64_t rows = 1; rows <= 25; rows++) {
            check_gemm(&(GemmCase){1, rows, KILN_VF, 37, 1, 0, rows, step, 0, 12, false});
            check_gemm(&(GemmCase){1, rows, NR + KILN_VF, 37, 1, 0, rows, step, 0, 6, false});
#if KILN_VF == 16
            check_gemm(&(GemmCase){1, rows, NR, 37, 1, 0, rows, step, 0, 8, false});
#endif
        }
}

static void test_gemm_digits_and_segments(void **state) {
    (void)state;
    if (!supported())
        skip();
    /* an implicit conv's rows: output rows of 7 (tiles across them), taps in 3 segments */
    check_gemm(&(GemmCase){1, 45, 2 * NR + 5, 12, 3, 100, 7, 6, 300, 6, false});
#if KILN_VF == 16
    check_gemm(&(GemmCase){1, 45, 2 * NR + 5, 12, 3, 100, 7, 6, 300, 8, false});
#endif
    check_gemm(&(GemmCase){2, 30, KILN_VF, 8, 2, 64, 5, 8, 90, 12, false});
    /* batch items with a B of their own (Winograd's n^2 GEMMs) */
    check_gemm(&(GemmCase){3, 20, NR + 4, 16, 1, 0, 20, 16, 0, 6, true});
    /* a single row and a long depth: the sums in several sets */
    check_gemm(&(GemmCase){1, 1, 3 * NR, 517, 1, 0, 1, 600, 0, 6, false});
}

/* ---- Winograd ---- */

static const double bt[2][6][6] = {{{1, 0, -1, 0}, {0, 1, 1, 0}, {0, -1, 1, 0}, {0, 1, 0, -1}},
                                   {{4, 0, -5, 0, 1, 0},
                                    {0, -4, -4, 1, 1, 0},
                                    {0, 4, -4, -1, 1, 0},
                                    {0, -2, -1, 2, 1, 0},
                                    {0, 2, -1, -2, 1, 0},
                                    {0, 4, 0, -5, 0, 1}}};
static const double at[2][4][6] = {
    {{1, 1, 1, 0}, {0, 1, -1, -1}},
    {{1, 1, 1, 1, 1, 0}, {0, 1, -1, 2, -2, 0}, {0, 1, 1, 4, 4, 0}, {0, 1, -1, 8, -8, 1}}};

static KilnWinograd winograd(int64_t m, int64_t n_img, int64_t c, int64_t h, int64_t w, int64_t pad,
                             int64_t o) {
    int64_t ho = h + 2 * pad - 2, wo = w + 2 * pad - 2;
    KilnWinograd k = {m, c, h, w, pad, pad, (ho + m - 1) / m, (wo + m - 1) / m, 0, o, ho, wo, 0, 0};
    k.tiles = n_img * k.th * k.tw;
    k.v_stride = k.tiles * c + 7; /* any gaps between the matrices */
    k.m_stride = k.tiles * o + 16;
    return k;
}

static void check_winograd(int64_t m, int64_t c, int64_t h, int64_t w, int64_t pad) {
    int s = m == 4, n = (int)m + 2, images = 2;
    int64_t o = c + 3;
    KilnWinograd k = winograd(m, images, c, h, w, pad, o);
    int64_t xn = images * h * w * c, vn = n * n * k.v_stride, mn = n * n * k.m_stride,
            yn = images * k.ho * k.wo * o;
    float *x = malloc((size_t)xn * sizeof *x), *v = malloc((size_t)vn * sizeof *v);
    float *mv = malloc((size_t)mn * sizeof *mv), *y = malloc((size_t)(yn + 16) * sizeof *y);
    float *bias = malloc((size_t)o * sizeof *bias);
    assert_true(x && v && mv && y && bias);
    for (int64_t i = 0; i < xn; i++)
        x[i] = uniform();
    x[0] = INFINITY; /* image 0, row 0, column 0, channel 0 */
    for (int64_t i = 0; i < mn; i++)
        mv[i] = uniform();
    for (int64_t i = 0; i < o; i++)
        bias[i] = uniform();
    for (int64_t i = 0; i < yn + 16; i++)
        y[i] = 1234.5f;
    for (int64_t row = 0; row < images * k.th; row++) {
        kiln_winograd_in(&k, x, v, row);
        kiln_winograd_out(&k, mv, bias, y, row);
    }
    for (int64_t t = 0; t < k.tiles; t++) {
        int64_t img = t / (k.th * k.tw), h0 = t / k.tw % k.th * m - pad, w0 = t % k.tw * m - pad;
        for (int64_t ch = 0; ch < c; ch++) {
            double d[6][6], tmp[6][6];
            bool has_inf = false;
            for (int r = 0; r < n; r++)
                for (int q = 0; q < n; q++) {
                    int64_t hr = h0 + r, wq = w0 + q;
                    bool in = hr >= 0 && hr < h && wq >= 0 && wq < w;
                    d[r][q] = in ? x[((img * h + hr) * w + wq) * c + ch] : 0;
                    has_inf = has_inf || isinf(d[r][q]);
                }
            for (int a = 0; a < n; a++)
                for (int q = 0; q < n; q++) {
                    tmp[a][q] = 0;
                    for (int r = 0; r < n; r++)
                        tmp[a][q] += bt[s][a][r] * d[r][q];
                }
            for (int a = 0; a < n; a++)
                for (int j = 0; j < n; j++) {
                    double want = 0;
                    for (int q = 0; q < n; q++)
                        want += tmp[a][q] * bt[s][j][q];
                    float got = v[(a * n + j) * k.v_stride + t * c + ch];
                    if (has_inf)
                        continue;
                    if (!(fabs(got - want) <= 1e-4 * (1 + fabs(want))))
                        fail_msg("F(%lld) in: tile %lld channel %lld V[%d][%d] is %g, not %g", (long long)m,
                                 (long long)t, (long long)ch, a, j, got, want);
                }
        }
        for (int64_t oc = 0; oc < o; oc++) {
            double tmp[4][6];
            for (int a = 0; a < m; a++)
                for (int q = 0; q < n; q++) {
                    tmp[a][q] = 0;
                    for (int r = 0; r < n; r++)
                        tmp[a][q] += at[s][a][r] * mv[(r * n + q) * k.m_stride + t * o + oc];
                }
            for (int a = 0; a < m; a++)
                for (int j = 0; j < m; j++) {
                    int64_t yr = h0 + pad + a, yc = w0 + pad + j;
                    if (yr >= k.ho || yc >= k.wo)
                        continue;
                    double want = bias[oc];
                    for (int q = 0; q < n; q++)
                        want += tmp[a][q] * at[s][j][q];
                    float got = y[((img * k.ho + yr) * k.wo + yc) * o + oc];
                    if (!(fabs(got - want) <= 1e-4 * (1 + fabs(want))))
                        fail_msg("F(%lld) out: tile %lld channel %lld y(%d, %d) is %g, not %g", (long long)m,
                                 (long long)t, (long long)oc, a, j, got, want);
                }
        }
    }
    for (int64_t i = yn; i < yn + 16; i++)
        assert_true(y[i] == 1234.5f);
    free(x), free(v), free(mv), free(y), free(bias);
}

static void test_winograd_transforms(void **state) {
    (void)state;
    if (!supported())
        skip();
    for (int64_t m = 2; m <= 4; m += 2) {
        check_winograd(m, 16, 9, 7, 1);   /* partial tiles */
        check_winograd(m, 70, 12, 12, 1); /* whole vectors and a part of one, whole tiles */
        check_winograd(m, 530, 6, 5, 1);  /* more channels than a chunk holds */
        check_winograd(m, 5, 10, 11, 0);  /* no padding */
    }
}

/* ---- Sliding windows: depthwise conv and max pool ---- */

/* The window of a case: x [h, w, c] with x_col - c floats after each position, its
 * output positions in *ho and *wo. */
static KilnWindow window_of(int64_t c, int64_t h, int64_t w, int64_t kh, int64_t kw, int64_t stride,
                            const int64_t *pads, int64_t dilation, int64_t *ho, int64_t *wo) {
    *ho = (h + pads[0] + pads[2] - (kh - 1) * dilation - 1) / stride + 1;
    *wo = (w + pads[1] + pads[3] - (kw - 1) * dilation - 1) / stride + 1;
    return (KilnWindow){.c = c,
                        .h = h,
                        .w = w,
                        .x_row = w * (c + 3),
                        .x_col = c + 3,
                        .kh = kh,
                        .kw = kw,
                        .stride = {stride, stride},
                        .pad = {pads[0], pads[1]},
                        .dilation = {dilation, dilation},
                        .wo = *wo};
}

/* The channel counts each window kernel is tried on: whole vectors, a vector and
 * some (the last vector overlapping the one before), fewer than one. */
static const int64_t window_channels[] = {2 * KILN_VF, KILN_VF + 3, KILN_VF - 1, 2};

/* An output row of wo x c floats and a vector more, all ROW_CANARY. */
#define ROW_CANARY 1234.5f
static void fill_row(float *y, int64_t wo, int64_t c) {
    for (int64_t i = 0; i < wo * c + KILN_VF; i++)
        y[i] = ROW_CANARY;
}

/* Fails where a store went past the row's wo x c floats. */
static void check_row_end(const float *y, int64_t wo, int64_t c, const char *what) {
    for (int64_t i = wo * c; i < wo * c + KILN_VF; i++)
        if (y[i] != ROW_CANARY)
            fail_msg("%s %lld channels: a store past the row", what, (long long)c);
}

/* One depthwise case, pads top, left, bottom, right: x with NaN between its positions
 * and in rows above and below it. */
static void check_depthwise(int64_t c, int64_t h, int64_t w, int64_t kh, int64_t kw, int64_t stride,
                            int64_t pad_top, int64_t pad_left, int64_t pad_bottom, int64_t pad_right,
                            int64_t dilation, bool biased) {
    int64_t ho, wo;
    KilnWindow d = window_of(c, h, w, kh, kw, stride, (int64_t[]){pad_top, pad_left, pad_bottom, pad_right},
                             dilation, &ho, &wo);
    int64_t x_row = d.x_row, x_col = d.x_col;
    float *mem = malloc(sizeof(float) * (size_t)((h + 2) * x_row)), *x = mem + x_row;
    float *wt = malloc(sizeof(float) * (size_t)(kh * kw * c)), *bias = malloc(sizeof(float) * (size_t)c);
    float *y = malloc(sizeof(float) * (size_t)(wo * c + KILN_VF));
    /* the same rows through a ring of the rows a tap column spans, the others NaN */
    int64_t span = (kh - 1) * dilation + 1;
    KilnWindow in_ring = d;
    in_ring.ring = span;
    float *ring = malloc(sizeof(float) * (size_t)(span * x_row)),
          *y_ring = malloc(sizeof(float) * (size_t)(wo * c));
    for (int64_t i = 0; i < (h + 2) * x_row; i++)
        mem[i] = NAN;
    for (int64_t r = 0; r < h; r++)
        for (int64_t q = 0; q < w; q++)
            for (int64_t ch = 0; ch < c; ch++)
                x[r * x_row + q * x_col + ch] = uniform();
    for (int64_t i = 0; i < kh * kw * c; i++)
        wt[i] = uniform();
    for (int64_t i = 0; i < c; i++)
        bias[i] = uniform();
    for (int64_t p0 = 0; p0 < ho; p0++) {
        fill_row(y, wo, c);
        kiln_depthwise_row(&d, x, wt, biased ? bias : NULL, y, p0);
        for (int64_t p1 = 0; p1 < wo; p1++)
            for (int64_t ch = 0; ch < c; ch++) {
                double want = biased ? bias[ch] : 0, scale = fabs(want);
                for (int64_t k0 = 0; k0 < kh; k0++)
                    for (int64_t k1 = 0; k1 < kw; k1++) {
                        int64_t r = p0 * stride - pad_top + k0 * dilation,
                                q = p1 * stride - pad_left + k1 * dilation;
                        if (r < 0 || r >= h || q < 0 || q >= w)
                            continue;
                        double term = (double)x[r * x_row + q * x_col + ch] * wt[(k0 * kw + k1) * c + ch];
                        want += term;
                        scale += fabs(term);
                    }
                float got = y[p1 * c + ch];
                if (!(fabs(got - want) <= 1e-6 * (scale + 1)))
                    fail_msg(
                        "depthwise %lldx%lld, %lld channels, stride %lld: (%lld, %lld, %lld) is %g, not %g",
                        (long long)kh, (long long)kw, (long long)c, (long long)stride, (long long)p0,
                        (long long)p1, (long long)ch, got, want);
            }
        check_row_end(y, wo, c, "depthwise");
        for (int64_t i = 0; i < span * x_row; i++)
            ring[i] = NAN;
        for (int64_t r = p0 * stride - pad_top; r < p0 * stride - pad_top + span; r++)
            if (r >= 0 && r < h)
                memcpy(ring + r % span * x_row, x + r * x_row, sizeof(float) * (size_t)x_row);
        kiln_depthwise_row(&in_ring, ring, wt, biased ? bias : NULL, y_ring, p0);
        if (memcmp(y, y_ring, sizeof(float) * (size_t)(wo * c)) != 0)
            fail_msg("depthwise %lldx%lld, %lld channels, stride %lld: row %lld differs through a ring",
                     (long long)kh, (long long)kw, (long long)c, (long long)stride, (long long)p0);
    }
    free(mem);
    free(wt);
    free(bias);
    free(y);
    free(ring);
    free(y_ring);
}

/* What kiln_bias_act and kiln_depthwise_row compute for relu and clip (ir/unary.def):
 * relu turns -0 into +0 and keeps NaN; clip keeps -0 and NaN. */
static float act_of(float x, int64_t act, float lo, float hi) {
    if (act == KILN_ACT_RELU)
        return x > 0.0f ? x : (x == x ? 0.0f : x);
    if (act == KILN_ACT_CLIP)
        return x < lo ? lo : (x > hi ? hi : x);
    return x;
}

/* kiln_depthwise_row with the window's activation: each output the activation of
 * the output without it, bit for bit (NaN, and outputs on both sides of the limits,
 * among them), with rows checked at the edges and not, and nothing stored past the
 * row. */
static void check_depthwise_activations(int64_t c, int64_t kh, int64_t stride) {
    int64_t h = 6, w = 7, ho, wo;
    KilnWindow d = window_of(c, h, w, kh, kh, stride, (int64_t[]){1, 1, 1, 1}, 1, &ho, &wo);
    float *x = malloc(sizeof(float) * (size_t)(h * d.x_row)),
          *wt = malloc(sizeof(float) * (size_t)(kh * kh * c));
    float *plain = malloc(sizeof(float) * (size_t)(wo * c)),
          *y = malloc(sizeof(float) * (size_t)(wo * c + KILN_VF));
    for (int64_t i = 0; i < h * d.x_row; i++)
        x[i] = uniform() * 4.0f;
    x[2 * d.x_row + 3 * d.x_col + c / 2] = NAN;
    for (int64_t i = 0; i < kh * kh * c; i++)
        wt[i] = uniform();
    const float limits[][2] = {{0, 0}, {0, 6}, {-0.5f, 0.25f}};
    for (int64_t act = KILN_ACT_RELU; act <= KILN_ACT_CLIP; act++)
        for (int l = 0; l < 3; l++)
            for (int64_t p0 = 0; p0 < ho; p0++) {
                KilnWindow a = d;
                a.act = act, a.lo = limits[l][0], a.hi = limits[l][1];
                kiln_depthwise_row(&d, x, wt, NULL, plain, p0);
                fill_row(y, wo, c);
                kiln_depthwise_row(&a, x, wt, NULL, y, p0);
                for (int64_t i = 0; i < wo * c; i++) {
                    float want = act_of(plain[i], act, a.lo, a.hi);
                    if (memcmp(&want, &y[i], sizeof want) != 0)
                        fail_msg(
                            "depthwise %lldx%lld, %lld channels, act %lld [%g, %g]: row %lld's %lld is %g, "
                            "not %g",
                            (long long)kh, (long long)kh, (long long)c, (long long)act, a.lo, a.hi,
                            (long long)p0, (long long)i, y[i], want);
                }
                check_row_end(y, wo, c, "depthwise with an activation");
            }
    free(x);
    free(wt);
    free(plain);
    free(y);
}

static void test_depthwise_row(void **state) {
    (void)state;
    if (!supported())
        skip();
    for (int i = 0; i < 4; i++) {
        check_depthwise_activations(window_channels[i], 3, 1);
        check_depthwise_activations(window_channels[i], 5, 2);
    }
    for (int i = 0; i < 4; i++) {
        int64_t c = window_channels[i];
        for (int biased = 0; biased < 2; biased++) {
            check_depthwise(c, 9, 8, 3, 3, 1, 1, 1, 1, 1, 1, biased);
            check_depthwise(c, 7, 9, 3, 3, 2, 0, 1, 1, 0, 1, biased);
            check_depthwise(c, 7, 7, 5, 5, 1, 2, 2, 2, 2, 1, biased);
            check_depthwise(c, 11, 10, 5, 5, 2, 2, 1, 1, 2, 2, biased);
            check_depthwise(c, 6, 5, 3, 2, 1, 1, 0, 1, 1, 1, biased); /* none of 2x2, 3x3 and 5x5 */
            check_depthwise(c, 4, 3, 7, 7, 1, 3, 3, 3, 3, 1, biased); /* taps wider than x */
        }
    }
}

/* What max_pool computes (ir/ops): the last NaN of the window, else its largest value. */
static float max_of(float v, float acc) {
    return v != v || v > acc ? v : acc;
}

/* One max pool case: x with +inf between its positions and in rows above and below
 * it, and NaNs of distinct payloads among its values; every output bit for bit. */
static void check_max_pool(int64_t c, int64_t h, int64_t w, int64_t k, int64_t stride, int64_t pad,
                           int64_t dilation) {
    int64_t ho, wo;
    KilnWindow d = window_of(c, h, w, k, k, stride, (int64_t[]){pad, pad, pad, pad}, dilation, &ho, &wo);
    float *mem = malloc(sizeof(float) * (size_t)((h + 2) * d.x_row)), *x = mem + d.x_row;
    float *y = malloc(sizeof(float) * (size_t)(wo * c + KILN_VF));
    for (int64_t i = 0; i < (h + 2) * d.x_row; i++)
        mem[i] = INFINITY;
    uint32_t payload = 0;
    for (int64_t r = 0; r < h; r++)
        for (int64_t q = 0; q < w; q++)
            for (int64_t ch = 0; ch < c; ch++) {
                float v = uniform();
                if (v > 0.8f) { /* a NaN of its own */
                    uint32_t bits = 0x7fc00000u | ++payload;
                    memcpy(&v, &bits, sizeof v);
                }
                x[r * d.x_row + q * d.x_col + ch] = v;
            }
    for (int64_t p0 = 0; p0 < ho; p0++) {
        fill_row(y, wo, c);
        kiln_max_pool_row(&d, x, y, p0);
        for (int64_t p1 = 0; p1 < wo; p1++)
            for (int64_t ch = 0; ch < c; ch++) {
                float want = -INFINITY;
                for (int64_t k0 = 0; k0 < k; k0++)
                    for (int64_t k1 = 0; k1 < k; k1++) {
                        int64_t r = p0 * stride - pad + k0 * dilation, q = p1 * stride - pad + k1 * dilation;
                        if (r >= 0 && r < h && q >= 0 && q < w)
                            want = max_of(x[r * d.x_row + q * d.x_col + ch], want);
                    }
                if (memcmp(&want, &y[p1 * c + ch], sizeof want) != 0)
                    fail_msg(
                        "max pool %lldx%lld, %lld channels, stride %lld: (%lld, %lld, %lld) is %g, not %g",
                        (long long)k, (long long)k, (long long)c, (long long)stride, (long long)p0,
                        (long long)p1, (long long)ch, y[p1 * c + ch], want);
            }
        check_row_end(y, wo, c, "max pool");
    }
    free(mem);
    free(y);
}

static void test_max_pool_row(void **state) {
    (void)state;
    if (!supported())
        skip();
    for (int i = 0; i < 4; i++) {
        int64_t c = window_channels[i];
        check_max_pool(c, 8, 8, 2, 2, 0, 1);
        check_max_pool(c, 9, 7, 3, 2, 1, 1);
        check_max_pool(c, 7, 9, 3, 1, 1, 2);
        check_max_pool(c, 6, 6, 4, 1, 2, 1); /* none of 2x2, 3x3 and 5x5 */
    }
}

/* kiln_bias_act for no activation, relu and clip, with a bias and without, with a residual and
 * without (apart from y, and y itself), on rows of whole vectors and of a vector and
 * some: every value bit for bit as the op's own formula, the special values (-0,
 * NaN, infinities) among them, and nothing stored past cols. */
static void test_bias_act(void **state) {
    (void)state;
    if (!supported())
        skip();
    enum { ROWS = 5, TILE_LD = 3 * KILN_VF, Y_LD = 3 * KILN_VF + 3 };
    static const float special[] = {-0.0f, 0.0f, NAN, INFINITY, -INFINITY, 6.0f, -1e-30f};
    float tile[ROWS * TILE_LD], bias[TILE_LD], res[ROWS * Y_LD], y[ROWS * Y_LD];
    for (int i = 0; i < ROWS * TILE_LD; i++)
        tile[i] = i % 11 == 0 ? special[i / 11 % 7] : (float)((i * 37) % 29) - 14.5f;
    for (int i = 0; i < TILE_LD; i++)
        bias[i] = i % 5 == 0 ? -0.0f : (float)(i % 7) - 3.0f;
    const int64_t widths[] = {2 * KILN_VF, KILN_VF + KILN_VF / 2 + 1, 3};
    const float limits[][2] = {{-INFINITY, INFINITY}, {0, 0}, {0, 6}, {-2.5f, 2.5f}};
    for (int64_t act = KILN_ACT_NONE; act <= KILN_ACT_CLIP; act++)
        for (int w = 0; w < 3; w++)
            for (int l = 0; l < 4; l++)
                for (int biased = 0; biased < 2; biased++)
                    for (int added = 0; added < 3; added++) { /* none, res, y in place */
                        float lo = limits[l][0], hi = limits[l][1];
                        for (int i = 0; i < ROWS * Y_LD; i++) {
                            res[i] = i % 13 == 0 ? special[i / 13 % 7] : (float)((i * 41) % 23) - 11.25f;
                            y[i] = added == 2 ? res[i] : 1234.5f;
                        }
                        const float *from = added == 0 ? NULL : added == 1 ? res : y;
                        kiln_bias_act(tile, TILE_LD, ROWS, widths[w], biased ? bias : NULL, from, act, lo, hi,
                                      y, Y_LD);
                        for (int r = 0; r < ROWS; r++)
                            for (int c = 0; c < Y_LD; c++) {
                                int e = r * Y_LD + c;
                                float want = added == 2 ? res[e] : 1234.5f;
                                if (c < widths[w]) {
                                    float x =
                                        biased ? tile[r * TILE_LD + c] + bias[c] : tile[r * TILE_LD + c];
                                    want = act_of(added ? res[e] + x : x, act, lo, hi);
                                }
                                if (memcmp(&want, &y[e], sizeof want) != 0)
                                    fail_msg(
                                        "act %lld, %lld columns, [%g, %g], bias %d, residual %d: (%d, %d) is "
                                        "%g, not %g",
                                        (long long)act, (long long)widths[w], lo, hi, biased, added, r, c,
                                        y[e], want);
                            }
                    }
}

/* The distance in floats between a and b (of one sign, or across zero). */
static int64_t ulps(float a, float b) {
    int32_t i, j;
    memcpy(&i, &a, sizeof i);
    memcpy(&j, &b, sizeof j);
    int64_t oi = i < 0 ? (int64_t)INT32_MIN - i : i, oj = j < 0 ? (int64_t)INT32_MIN - j : j;
    return oi > oj ? oi - oj : oj - oi;
}

/* Whether y is GELU(x) as kiln_geluf's bounds allow: within 8 floats of x Phi(x)
 * rounded from -1 up, relatively within 4e-5 from -13 to -1, and at most 1e-30
 * from 0 below; NaN for NaN and -inf, x itself for +inf and both zeros. */
static bool gelu_close(float x, float y) {
    if (x != x || x == -INFINITY)
        return y != y;
    if (x == INFINITY || x == 0)
        return memcmp(&x, &y, sizeof x) == 0;
    double exact = 0.5 * (double)x * erfc(-(double)x / sqrt(2));
    if (x >= -1)
        return ulps(y, (float)exact) <= 8;
    if (x >= -13)
        return fabs(y - exact) <= 4e-5 * fabs(exact);
    return fabsf(y) <= 1e-30f;
}

/* kiln_bias_act's GELU: the floats from -20 to 20 (every 4099th), the special
 * values, in rows of whole vectors and a tail, alone and after a bias and a
 * residual. */
static void test_bias_act_gelu(void **state) {
    (void)state;
    if (!supported())
        skip();
    enum { COLS = 2 * KILN_VF + 5, ROWS = 64 };
    static const float special[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-30f, -1e-30f, 20.0f, -20.0f};
    static float tile[ROWS * COLS], bias[COLS], res[ROWS * COLS], y[ROWS * COLS];
    for (int i = 0; i < COLS; i++)
        bias[i] = (float)(i % 7) * 0.25f - 0.75f;
    uint32_t next = 0x41a00000u; /* 20.0f, then down to 0 and from -0 to -20 */
    bool negative = false;
    for (int pass = 0; pass < 2000; pass++) {
        for (int i = 0; i < ROWS * COLS; i++) {
            float x;
            memcpy(&x, &next, sizeof x);
            tile[i] = i < (int)(sizeof special / sizeof *special) ? special[i] : x;
            res[i] = (float)((i * 41) % 23) * 0.125f - 1.5f;
            if (!negative && next < 4099)
                next = 0x80000000u, negative = true;
            else
                next += negative ? 4099 : -4099;
            if (negative && next > 0xc1a00000u)
                next = 0x41a00000u, negative = false;
        }
        bool combined = pass % 4 == 3;
        kiln_bias_act(tile, COLS, ROWS, COLS, combined ? bias : NULL, combined ? res : NULL, KILN_ACT_GELU, 0,
                      0, y, COLS);
        for (int i = 0; i < ROWS * COLS; i++) {
            float x = combined ? res[i] + (tile[i] + bias[i % COLS]) : tile[i];
            if (!gelu_close(x, y[i]))
                fail_msg("GELU(%.9g) is %.9g%s", x, y[i], combined ? " (after a bias and a residual)" : "");
        }
    }
}

/* The steps of kiln_attention_softmax in double. */
static void softmax_in_double(const float *sc, int64_t n, double *m, double *l, double *acc, int64_t ev,
                              double *e) {
    double top = *m;
    for (int64_t j = 0; j < n; j++)
        if (sc[j] > top)
            top = sc[j];
    double shift = top == -INFINITY ? 0 : top, rescale = exp(*m - shift), sum = 0;
    *m = top;
    for (int64_t c = 0; c < ev; c++)
        acc[c] *= rescale;
    for (int64_t j = 0; j < n; j++)
        sum += e[j] = exp(sc[j] - shift);
    *l = *l * rescale + sum;
}

static bool near(double got, double want) {
    return (got != got && want != want) || fabs(got - want) <= 1e-6 * fabs(want) + 1e-37;
}

/* kiln_attention_softmax over four blocks of a row in turn, the row's outputs
 * between them as attention's would be (acc += p v of a made-up v): the largest
 * score exactly, and l, acc and the exps relatively within 1e-6 of the steps in
 * double; with masked scores (-inf), a block masked whole at the start (the row's
 * maximum -inf after it), a NaN score, and Ev of whole vectors and not. */
static void test_attention_softmax(void **state) {
    (void)state;
    if (!supported())
        skip();
    enum { MAX_N = 128, MAX_EV = 2 * KILN_VF + 3 };
    const int64_t sizes[] = {16, 64, 128}, evs[] = {KILN_VF, MAX_EV};
    for (int s = 0; s < 3; s++)
        for (int v = 0; v < 2; v++)
            for (int kind = 0; kind < 3; kind++) { /* plain, masked, with a NaN */
                int64_t n = sizes[s], ev = evs[v];
                float m = -INFINITY, l = 0, acc[MAX_EV] = {0}, sc[MAX_N];
                double dm = -INFINITY, dl = 0, dacc[MAX_EV] = {0}, de[MAX_N];
                for (int block = 0; block < 4; block++) {
                    for (int64_t j = 0; j < n; j++) {
                        sc[j] = uniform() * 8.0f + (float)block;
                        if (kind >= 1 && (block == 0 || j % 5 == 1))
                            sc[j] = -INFINITY;
                        if (kind == 2 && block == 2 && j == n / 2)
                            sc[j] = NAN;
                    }
                    softmax_in_double(sc, n, &dm, &dl, dacc, ev, de);
                    kiln_attention_softmax(sc, n, &m, &l, acc, ev);
                    if (!(m == dm || (m == -INFINITY && dm == -INFINITY)))
                        fail_msg("n %lld, block %d: the largest score is %g, not %g", (long long)n, block, m,
                                 dm);
                    if (!near(l, dl))
                        fail_msg("n %lld, ev %lld, kind %d, block %d: l is %.9g, not %.9g", (long long)n,
                                 (long long)ev, kind, block, l, dl);
                    for (int64_t j = 0; j < n; j++)
                        if (!near(sc[j], de[j]))
                            fail_msg("n %lld, block %d: exp %lld is %.9g, not %.9g", (long long)n, block,
                                     (long long)j, sc[j], de[j]);
                    for (int64_t c = 0; c < ev; c++) {
                        if (!near(acc[c], dacc[c]))
                            fail_msg("n %lld, ev %lld, kind %d, block %d: acc %lld is %.9g, not %.9g",
                                     (long long)n, (long long)ev, kind, block, (long long)c, acc[c], dacc[c]);
                        for (int64_t j = 0; j < n; j++) {
                            float p = (float)((j + c) % 9) * 0.125f;
                            acc[c] += sc[j] * p;
                            dacc[c] += (double)sc[j] * p;
                        }
                    }
                }
            }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_tile_shapes),    cmocka_unit_test(test_gemm_digits_and_segments),
        cmocka_unit_test(test_winograd_transforms), cmocka_unit_test(test_depthwise_row),
        cmocka_unit_test(test_max_pool_row),        cmocka_unit_test(test_bias_act),
        cmocka_unit_test(test_bias_act_gelu),       cmocka_unit_test(test_attention_softmax),
    };
    return cmocka_run_group_tests_name("kernels", tests, NULL, NULL);
}
