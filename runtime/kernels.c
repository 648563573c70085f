/* kiln's precompiled kernels (kernels.h), compiled by kiln's build once per vector
 * width: KILN_VF floats in a vector register (16 with AVX-512, 8 with AVX2, 4 with
 * SSE), with the instructions that width needs. Every model built for that width
 * links the same object, so a model's compile no longer spends its time optimizing
 * a copy of these for each layer: they were most of what ResNet-18 ran through
 * Clang (2.1 of its 2.7 seconds).
 *
 * A GEMM's register tile keeps mr x nv vector sums (12 in all: 6 rows of two vectors,
 * or 12 of one; with AVX-512, 16 as 8 rows of two where the GEMM asks), as the
 * lowering's table lays B out (codegen/lower_packed.c says why); each shape of tile
 * is a function of its own, an instance of one inlined function, found in a table,
 * so the sums stay in registers. Tiles of few rows spread consecutive steps of the
 * depth over up to 4 sets of sums, which a step's multiply-adds do not wait on. As
 * it goes, each tile prefetches a slice of the next panel into L2 (prefetch_from), which
 * kept ResNet-50's and BERT's largest weights from waiting on memory.
 *
 * A depthwise conv's row (codegen/lower_conv.c) and a max pool's
 * (codegen/lower_pool.c) are loops over channel vectors, their common windows'
 * instances unrolled (below), a depthwise conv's activation applied as each vector
 * is stored. The GEMM's GELU epilogue and attention's online softmax step
 * (codegen/lower_attention.c) compute runtime/kernel_math.h's exp and GELU a vector
 * at a time.
 *
 * Winograd's transforms (codegen/lower_winograd.c says what they compute) take
 * B^T d B and A^T m A by the rows and then by the columns of the transform, whose
 * elements are constants here: the loops over them unroll, the products by 0 drop
 * out and those by +-1 become additions, and what is left is one loop over the
 * channels per tile, a vector of channels at a time. A tile that reaches outside
 * the input (the padding) reads zeros there, from a row of zeros, rather than 0
 * times a clamped read (which would make an infinite input NaN); a tile across the
 * output's last row or column writes its elements outside y to a patch that is
 * thrown away. V's and M's matrices lie an odd number of cache lines apart
 * (matrix_stride in codegen/lower_winograd.c says why). */
#include "kernels.h"

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#ifndef KILN_VF
#error "KILN_VF (the floats in a vector register) must be defined by the build"
#endif

#define INLINE static inline __attribute__((always_inline))

/* Before a loop whose iterations touch disjoint elements: GCC vectorizes it without
   testing its pointers for overlap. (Clang, which builds these only for the
   sanitizers' runs, cannot vectorize the transforms' loops and would say so.) */
#ifdef __clang__
#define INDEPENDENT
#else
#define INDEPENDENT _Pragma("GCC ivdep")
#endif

typedef float kiln_vf __attribute__((vector_size(4 * KILN_VF), aligned(4)));

/* ---- GEMM register tiles ---- */

/* ACCUMULATORS sums a tile, or WIDE_SUMS in an AVX-512 GEMM that asks for 8 x 2
 * tiles (codegen/lower_packed.c says which): its 32 registers hold them beside the
 * panel's two vectors and the broadcasts. */
enum { ACCUMULATORS = 12, WIDE_SUMS = 16, MAX_SETS = 4, PREFETCH_STEPS = 4, LINE = 64 };

/* The offsets in a batch item's A of rows r0 .. r0 + mr - 1: r0's mixed-radix
 * digits by division, then each next row's by counting up (a division per row cost
 * as much as a sixth of a small tile's multiply-adds). */
INLINE void row_offsets(const KilnGemm *g, int64_t r0, int64_t mr, int64_t *offsets) {
    int64_t digit[KILN_GEMM_ROW_DIGITS], at = 0, n = g->row_digits;
    for (int64_t d = n - 1, r = r0; d >= 0; d--) {
        digit[d] = d > 0 ? r % g->row_size[d] : r;
        at += digit[d] * g->row_stride[d];
        r /= d > 0 ? g->row_size[d] : 1;
    }
    for (int64_t i = 0; i < mr; i++) {
        offsets[i] = at;
        for (int64_t d = n - 1; d >= 0; d--) {
            digit[d]++;
            at += g->row_stride[d];
            if (d == 0 || digit[d] < g->row_size[d])
                break;
            at -= g->row_size[d] * g->row_stride[d];
            digit[d] = 0;
        }
    }
}

/* A's rows of a tile: `lda` apart from a when evenly spaced, else each at its own
 * pointer. */
typedef struct {
    const float *a;
    int64_t lda;
    const float *const *rows;
} Rows;

/* One step of the depth into the sums acc: B's row at b, A's element `at` of each row. */
INLINE void depth_step(kiln_vf *acc, Rows r, int64_t at, const float *b, const int mr, const int nv,
                       const bool even) {
    kiln_vf b0 = *(const kiln_vf *)b, b1 = nv > 1 ? *(const kiln_vf *)(b + KILN_VF) : b0;
#pragma GCC unroll 12
    for (int i = 0; i < mr; i++) {
        float ai = even ? r.a[i * r.lda + at] : r.rows[i][at];
        acc[i * nv] += ai * b0;
        if (nv > 1)
            acc[i * nv + 1] += ai * b1;
    }
}

/* The tile of mr rows of A by nv vectors of the panel at b; every PREFETCH_STEPS steps
 * of the depth, a cache line from `ahead` on is fetched into L2. */
INLINE void tile_sums(const KilnGemm *g, Rows r, const float *b, const char *ahead, float *out,
                      int64_t out_ld, const int mr, const int nv, const bool even) {
    const int per_set = mr * nv, fit = per_set > ACCUMULATORS ? 1 : ACCUMULATORS / per_set;
    const int sets = fit < MAX_SETS ? fit : MAX_SETS;
    const int block = PREFETCH_STEPS * sets;
    const int64_t step = nv * KILN_VF, run = g->run, whole = run / sets * sets;
    kiln_vf acc[MAX_SETS][WIDE_SUMS];
#pragma GCC unroll 48
    for (int u = 0; u < sets * per_set; u++)
        acc[u / per_set][u % per_set] = (kiln_vf){0};
    for (int64_t s = 0; s < g->segments; s++) {
        int64_t at = g->segment[s], kk = 0;
        for (; kk + block <= run; kk += block, b += block * step) {
#pragma GCC unroll 4
            for (int set = 0; set < sets; set++, ahead += LINE)
                __builtin_prefetch(ahead, 0, 2);
#pragma GCC unroll 16
            for (int u = 0; u < block; u++)
                depth_step(acc[u % sets], r, at + kk + u, b + u * step, mr, nv, even);
        }
        for (; kk < whole; kk += sets, b += sets * step)
#pragma GCC unroll 4
            for (int set = 0; set < sets; set++)
                depth_step(acc[set], r, at + kk + set, b + set * step, mr, nv, even);
        for (; kk < run; kk++, b += step)
            depth_step(acc[0], r, at + kk, b, mr, nv, even);
    }
#pragma GCC unroll 16
    for (int u = 0; u < per_set; u++) {
#pragma GCC unroll 4
        for (int set = 1; set < sets; set++)
            acc[0][u] += acc[set][u];
        *(kiln_vf *)(out + u / nv * out_ld + u % nv * KILN_VF) = acc[0][u];
    }
}

/* Each tile shape a function of its own (inlined into one, they left the loop over
 * the depth short of registers), for evenly spaced rows and for rows at pointers of
 * their own, found in a table by rows and vectors. What they take is as plain as it
 * can be: their rows as scalars rather than a struct passed by value, and one
 * panel, not a loop over several: each of those made the loop over the depth run
 * 5 to 12% slower. Rows 3 and 6 floats apart (a first conv on an image's 3
 * channels, at stride 1 and 2) have functions of their own too, which address every
 * row from one register: with the distance unknown, each row took a register of its
 * own, more than there are, and a depth of short segments (27 deep, 3 runs of 9)
 * spent a quarter of its time reloading them; the small CNN's first conv alone ran
 * 15% faster so. */
typedef void TileFn(const KilnGemm *g, const float *a, int64_t lda, const float *const *rows, const float *b,
                    const char *ahead, float *out, int64_t out_ld);

#define TILE_FN(name, m, v, even, step)                                                                      \
    static __attribute__((noinline)) void name(const KilnGemm *g, const float *a, int64_t lda,               \
                                               const float *const *rows, const float *b, const char *ahead,  \
                                               float *out, int64_t out_ld) {                                 \
        tile_sums(g, (Rows){a, step ? step : lda, rows}, b, ahead, out, out_ld, m, v, even);                 \
    }
#define TILE(m, v)                                                                                           \
    TILE_FN(rows_##m##x##v, m, v, false, 0)                                                                  \
    TILE_FN(even_##m##x##v, m, v, true, 0)                                                                   \
    TILE_FN(step3_##m##x##v, m, v, true, 3) TILE_FN(step6_##m##x##v, m, v, true, 6)
/* clang-format off */
TILE(1, 1) TILE(2, 1) TILE(3, 1) TILE(4, 1) TILE(5, 1) TILE(6, 1) TILE(7, 1) TILE(8, 1) TILE(9, 1) TILE(10, 1)
TILE(11, 1) TILE(12, 1) TILE(1, 2) TILE(2, 2) TILE(3, 2) TILE(4, 2) TILE(5, 2) TILE(6, 2)
#if KILN_VF == 16
TILE(7, 2) TILE(8, 2)
#define WIDE(f) , f##_7x2, f##_8x2
#else
#define WIDE(f)
#endif

#define ONE_VECTOR(f) {0, f##_1x1, f##_2x1, f##_3x1, f##_4x1, f##_5x1, f##_6x1, f##_7x1, f##_8x1, f##_9x1, \
                       f##_10x1, f##_11x1, f##_12x1}
#define TWO_VECTORS(f) {0, f##_1x2, f##_2x2, f##_3x2, f##_4x2, f##_5x2, f##_6x2 WIDE(f)}
enum { ROWS, EVEN, STEP3, STEP6 };
static TileFn *const tiles[4][2][ACCUMULATORS + 1] = {{ONE_VECTOR(rows), TWO_VECTORS(rows)},
                                                      {ONE_VECTOR(even), TWO_VECTORS(even)},
                                                      {ONE_VECTOR(step3), TWO_VECTORS(step3)},
                                                      {ONE_VECTOR(step6), TWO_VECTORS(step6)}};
/* clang-format on */

/* Where the tiles of rows prefetch: what follows their panel in the weights blob
 * (the next panel; after the last, the next batch item's B or, as the tables are
 * laid out in the kernels' order, usually the next kernel's table), each row tile a
 * slice of it in turn, so that while a B too large for the cache is read (from
 * memory, by the panel's first row tile), what comes next arrives in L2 alongside.
 * A depth shorter than PREFETCH_STEPS prefetches nothing. The slice is found once a
 * call and stepped from tile to tile (two divisions a tile were 4-7% of MobileNetV2).
 * Prefetch's fields are bytes from a panel's start: to the next panel (0: none to
 * prefetch), to this tile's slice of it, from one tile's slice to the next's; and a
 * panel's size. */
typedef struct {
    int64_t next, at, step, panel;
} Prefetch;

static Prefetch prefetch_from(const KilnGemm *g, int64_t r0) {
    int64_t lines = g->depth / PREFETCH_STEPS, panel = (int64_t)sizeof(float) * 2 * KILN_VF * g->depth;
    if (lines == 0)
        return (Prefetch){0, 0, 0, panel};
    int64_t step = lines * LINE % panel;
    return (Prefetch){panel, r0 / g->tile_rows * step % panel, step, panel};
}

static void prefetch_next(Prefetch *f) {
    f->at += f->step;
    if (f->at >= f->panel)
        f->at -= f->panel;
}

/* The row tiles from r0, each by the panels from q0. A tile whose rows are evenly
 * spaced (one digit, or within a conv's output row) addresses them from one pointer
 * (with a pointer per row, the loop over the depth ran 5% slower); one across a
 * digit's end (the next output row), from a pointer per row. */
void kiln_gemm_tiles(const void *gemm, const float *a, int64_t bi, int64_t r0, int64_t rows, int64_t q0,
                     int64_t panels, float *out, int64_t out_ld) {
    const KilnGemm *g = gemm;
    const float *item = a + g->a_at + bi * g->a_batch,
                *b = (const float *)gemm + g->panels_at + bi * g->item_floats + q0 * g->depth;
    int64_t offsets[KILN_GEMM_CALL_ROWS];
    rows = rows < KILN_GEMM_CALL_ROWS ? rows : KILN_GEMM_CALL_ROWS;
    bool even = g->row_digits <= 1;
    int64_t lda = g->row_digits ? g->row_stride[g->row_digits - 1] : 0;
    if (!even)
        row_offsets(g, r0, rows, offsets);
    /* the last panel may be one vector wide; the others are two */
    int64_t last = panels - 1, wide = g->cols - q0 - last * 2 * KILN_VF > KILN_VF;
    int even_tiles = lda == 3 ? STEP3 : lda == 6 ? STEP6 : EVEN;
    Prefetch ahead = prefetch_from(g, r0);
    for (int64_t t = 0; t < rows; t += g->tile_rows, prefetch_next(&ahead)) {
        int64_t mr = rows - t < g->tile_rows ? rows - t : g->tile_rows;
        const float *first = item + (r0 + t) * lda, *pointers[WIDE_SUMS];
        bool spaced = even;
        if (!even) {
            spaced = true;
            first = item + offsets[t];
            for (int64_t i = 0; i < mr; i++) {
                pointers[i] = item + offsets[t + i];
                spaced = spaced && (i == 0 || offsets[t + i] - offsets[t + i - 1] == lda);
            }
        }
        int spacing = spaced ? even_tiles : ROWS;
        for (int64_t p = 0; p < panels; p++) {
            const float *panel = b + p * 2 * KILN_VF * g->depth;
            tiles[spacing][p < last || wide][mr](
                g, first, lda, pointers, panel,
                (const char *)((uintptr_t)panel + (uintptr_t)(ahead.next + ahead.at)),
                out + t * out_ld + p * 2 * KILN_VF, out_ld);
        }
    }
}

typedef int32_t kiln_vi __attribute__((vector_size(4 * KILN_VF), aligned(4)));

/* mask ? a : b, lane by lane */
INLINE kiln_vf choose(kiln_vi mask, kiln_vf a, kiln_vf b) {
    return (kiln_vf)(((kiln_vi)a & mask) | ((kiln_vi)b & ~mask));
}

/* ---- Vector math: runtime/kernel_math.h's formulas, lane by lane ----
 *
 * The same operations in the same order as kiln_expf_nonpositive and kiln_geluf,
 * which the generated code applies a float at a time: written with vectors, every
 * lane of a register at once (compilers vectorize the scalar forms 8 lanes wide at
 * most, and not inside a loop that also takes a maximum). */

typedef uint32_t kiln_vu __attribute__((vector_size(4 * KILN_VF), aligned(4)));

INLINE kiln_vf splat(float x) {
    return x - (kiln_vf){0};
}

INLINE kiln_vf exp_nonpositive(kiln_vf x) {
    kiln_vi low = x < splat(-87.3f);
    kiln_vf c = choose(low, splat(-87.3f), x);
    kiln_vf n = c * 1.44269504088896341f + 12582912.0f;
    kiln_vu k = (kiln_vu)n;
    n -= 12582912.0f;
    kiln_vf r = c - n * 0.693359375f + n * 2.12194440e-4f;
    kiln_vf q = splat(1.9875691500e-4f);
    q = q * r + 1.3981999507e-3f;
    q = q * r + 8.3334519073e-3f;
    q = q * r + 4.1665795894e-2f;
    q = q * r + 1.6666665459e-1f;
    q = q * r + 5.0000001201e-1f;
    kiln_vf e = q * r * r + r + 1.0f;
    kiln_vf scale = (kiln_vf)((k + (127u - 0x400000u)) << 23);
    return choose(low, splat(0), e * scale);
}

INLINE kiln_vf gelu(kiln_vf x) {
    kiln_vf z = (kiln_vf)((kiln_vi)x & 0x7fffffff) * 0.707106781f;
    kiln_vf t = 1.0f / (1.0f + 0.5f * z);
    kiln_vf q = splat(0.17087277f);
    q = q * t - 0.82215223f;
    q = q * t + 1.48851587f;
    q = q * t - 1.13520398f;
    q = q * t + 0.27886807f;
    q = q * t - 0.18628806f;
    q = q * t + 0.09678418f;
    q = q * t + 0.37409196f;
    q = q * t + 1.00002368f;
    q = q * t - 1.26551223f;
    kiln_vf half_erfc = 0.5f * (t * exp_nonpositive(q - z * z));
    return x * choose(x < splat(0), half_erfc, 1.0f - half_erfc);
}

INLINE float act_scalar(float x, const int64_t act, float lo, float hi) {
    return act == KILN_ACT_RELU   ? (x > 0.0f ? x : (x == x ? 0.0f : x))
           : act == KILN_ACT_CLIP ? (x < lo ? lo : (x > hi ? hi : x))
           : act == KILN_ACT_GELU ? gelu(splat(x))[0]
                                  : x;
}

/* act_scalar's lanes: relu keeps x where x > 0 or NaN, else +0 */
INLINE kiln_vf act_vector(kiln_vf x, const int64_t act, kiln_vf lo, kiln_vf hi) {
    if (act == KILN_ACT_RELU)
        return (kiln_vf)((kiln_vi)x & ((x > (kiln_vf){0}) | (x != x)));
    if (act == KILN_ACT_CLIP)
        return choose(x < lo, lo, choose(x > hi, hi, x));
    if (act == KILN_ACT_GELU)
        return gelu(x);
    return x;
}

/* Whole vectors, then the columns left: a generated tile's loop, of a width known
 * when it was compiled, cost nothing to set up; a loop over any width alone was 2%
 * slower on ResNet-18. y may be res: each element is read before it is written. */
INLINE void bias_act_rows(const float *restrict tile, int64_t tile_ld, int64_t rows, int64_t cols,
                          const float *restrict bias, const bool biased, const float *res, const bool added,
                          const int64_t act, float lo, float hi, float *y, int64_t y_ld) {
    kiln_vf vlo = lo - (kiln_vf){0}, vhi = hi - (kiln_vf){0};
    for (int64_t r = 0; r < rows; r++) {
        const float *in = tile + r * tile_ld, *add = added ? res + r * y_ld : NULL;
        float *out = y + r * y_ld;
        int64_t c = 0;
        for (; c + KILN_VF <= cols; c += KILN_VF) {
            kiln_vf x = *(const kiln_vf *)(in + c);
            if (biased)
                x += *(const kiln_vf *)(bias + c);
            if (added)
                x = *(const kiln_vf *)(add + c) + x;
            *(kiln_vf *)(out + c) = act_vector(x, act, vlo, vhi);
        }
        for (; c < cols; c++) {
            float x = biased ? in[c] + bias[c] : in[c];
            out[c] = act_scalar(added ? add[c] + x : x, act, lo, hi);
        }
    }
}

/* bias_act_rows with the activation a constant */
INLINE void bias_act_of(const float *tile, int64_t tile_ld, int64_t rows, int64_t cols, const float *bias,
                        const bool biased, const float *res, const bool added, int64_t act, float lo,
                        float hi, float *y, int64_t y_ld) {
    if (act == KILN_ACT_RELU)
        bias_act_rows(tile, tile_ld, rows, cols, bias, biased, res, added, KILN_ACT_RELU, lo, hi, y, y_ld);
    else if (act == KILN_ACT_CLIP)
        bias_act_rows(tile, tile_ld, rows, cols, bias, biased, res, added, KILN_ACT_CLIP, lo, hi, y, y_ld);
    else if (act == KILN_ACT_GELU)
        bias_act_rows(tile, tile_ld, rows, cols, bias, biased, res, added, KILN_ACT_GELU, lo, hi, y, y_ld);
    else
        bias_act_rows(tile, tile_ld, rows, cols, bias, biased, res, added, KILN_ACT_NONE, lo, hi, y, y_ld);
}

void kiln_bias_act(const float *tile, int64_t tile_ld, int64_t rows, int64_t cols, const float *bias,
                   const float *res, int64_t act, float lo, float hi, float *y, int64_t y_ld) {
    if (bias && res)
        bias_act_of(tile, tile_ld, rows, cols, bias, true, res, true, act, lo, hi, y, y_ld);
    else if (bias)
        bias_act_of(tile, tile_ld, rows, cols, bias, true, res, false, act, lo, hi, y, y_ld);
    else if (res)
        bias_act_of(tile, tile_ld, rows, cols, bias, false, res, true, act, lo, hi, y, y_ld);
    else
        bias_act_of(tile, tile_ld, rows, cols, bias, false, res, false, act, lo, hi, y, y_ld);
}

/* ---- Attention's online softmax ----
 *
 * The largest score is the tree of the lanes' (a maximum in any order is the same),
 * the sum is 16 partial sums in order, element j in sum j % 16, as the generated
 * code's (codegen/lower_attention.c). */

enum { SUM_LANES = 16, SUM_PARTS = SUM_LANES / KILN_VF };

void kiln_attention_softmax(float *sc, int64_t n, float *m, float *l, float *acc, int64_t ev) {
    kiln_vf tops = splat(*m);
    for (int64_t j = 0; j < n; j += KILN_VF) {
        kiln_vf x = *(const kiln_vf *)(sc + j);
        tops = choose(x > tops, x, tops);
    }
    float lanes[KILN_VF];
    memcpy(lanes, &tops, sizeof lanes);
#pragma GCC unroll 4
    for (int w = KILN_VF / 2; w > 0; w /= 2)
#pragma GCC unroll 8
        for (int i = 0; i < w; i++)
            lanes[i] = lanes[i + w] > lanes[i] ? lanes[i + w] : lanes[i];
    float top = lanes[0], shift = top == -__builtin_inff() ? 0.0f : top;
    float rescale = exp_nonpositive(splat(*m - shift))[0];
    *m = top;
    int64_t c = 0;
    for (; c + KILN_VF <= ev; c += KILN_VF)
        *(kiln_vf *)(acc + c) *= rescale;
    for (; c < ev; c++)
        acc[c] *= rescale;
    kiln_vf parts[SUM_PARTS];
#pragma GCC unroll 4
    for (int p = 0; p < SUM_PARTS; p++)
        parts[p] = (kiln_vf){0};
    for (int64_t j = 0; j < n; j += SUM_LANES)
#pragma GCC unroll 4
        for (int p = 0; p < SUM_PARTS; p++) {
            kiln_vf e = exp_nonpositive(*(const kiln_vf *)(sc + j + p * KILN_VF) - shift);
            *(kiln_vf *)(sc + j + p * KILN_VF) = e;
            parts[p] += e;
        }
    float sum = *l * rescale;
#pragma GCC unroll 4
    for (int p = 0; p < SUM_PARTS; p++)
#pragma GCC unroll 16
        for (int i = 0; i < KILN_VF; i++)
            sum += parts[p][i];
    *l = sum;
}

/* ---- Sliding windows: depthwise conv and max pool ----
 *
 * A row of outputs a vector of channels at a time: each output position sums its
 * taps times their weights (a depthwise conv) or takes their max (a max pool) in a
 * register and stores the result once; the positions whose taps all lie inside x
 * along the row test none against its ends. 2x2, 3x3 and 5x5 windows, nearly every
 * one there is, have instances of their own: in a row whose
 * every tap row lies inside x, their tap loops unroll and a depthwise conv's
 * weights stay in registers along the row. A max keeps v where v is NaN or above
 * what it holds, so the last NaN of a window, as the op's kernel does. */

INLINE bool inside(int64_t at, int64_t size) {
    return at >= 0 && at < size;
}

INLINE kiln_vf max_step(kiln_vf v, kiln_vf acc) {
    return choose((v != v) | (v > acc), v, acc);
}

/* Input row r of window d's x (its slot, in a ring: the functions below take `ring`
 * as a constant, so that the common windows' rows take no division). */
INLINE const float *input_row(const KilnWindow *d, const float *x, int64_t r, const bool ring) {
    return x + (ring ? r % d->ring : r) * d->x_row;
}

/* Positions [from, to) of row p0 into y, the vector of channels from ch on: the
 * taps of rows [k0_lo, k0_hi) of kh x kw (all of them where all_rows), each
 * checked against the row's ends where check_row. */
INLINE void vector_span(const KilnWindow *d, const float *restrict x, const float *restrict w,
                        const float *restrict bias, float *restrict y, int64_t p0, int64_t from, int64_t to,
                        int64_t ch, int64_t k0_lo, int64_t k0_hi, const int64_t kh, const int64_t kw,
                        const bool max, const bool all_rows, const bool check_row, const bool ring,
                        const int64_t act) {
    const kiln_vf lo = splat(d->lo), hi = splat(d->hi);
    const int64_t c = d->c, x_col = d->x_col, width = d->w, s1 = d->stride[1], d1 = d->dilation[1],
                  in0 = p0 * d->stride[0] - d->pad[0], d0 = d->dilation[0];
    const kiln_vf first = max    ? -__builtin_inff() - (kiln_vf){0}
                          : bias ? *(const kiln_vf *)(bias + ch)
                                 : (kiln_vf){0};
    for (int64_t p1 = from; p1 < to; p1++) {
        const int64_t in1 = p1 * s1 - d->pad[1];
        kiln_vf acc = first;
#pragma GCC unroll 5
        for (int64_t k0 = 0; k0 < kh; k0++) {
            if (!all_rows && (k0 < k0_lo || k0 >= k0_hi))
                continue;
            const float *xr = input_row(d, x, in0 + k0 * d0, ring) + ch, *wr = max ? 0 : w + k0 * kw * c + ch;
#pragma GCC unroll 5
            for (int64_t k1 = 0; k1 < kw; k1++) {
                const int64_t col = in1 + k1 * d1;
                if (check_row && !inside(col, width))
                    continue;
                kiln_vf v = *(const kiln_vf *)(xr + col * x_col);
                acc = max ? max_step(v, acc) : acc + v * *(const kiln_vf *)(wr + k1 * c);
            }
        }
        *(kiln_vf *)(y + p1 * c + ch) = act_vector(acc, act, lo, hi);
    }
}

/* The row's positions, the vector of channels from ch on: [lo, hi) those whose
 * every tap lies inside x along the row. */
INLINE void vector_row(const KilnWindow *d, const float *x, const float *w, const float *bias, float *y,
                       int64_t p0, int64_t ch, int64_t lo, int64_t hi, int64_t k0_lo, int64_t k0_hi,
                       const int64_t kh, const int64_t kw, const bool max, const bool all_rows,
                       const bool ring, const int64_t act) {
    vector_span(d, x, w, bias, y, p0, 0, lo, ch, k0_lo, k0_hi, kh, kw, max, all_rows, true, ring, act);
    vector_span(d, x, w, bias, y, p0, lo, hi, ch, k0_lo, k0_hi, kh, kw, max, all_rows, false, ring, act);
    vector_span(d, x, w, bias, y, p0, hi, d->wo, ch, k0_lo, k0_hi, kh, kw, max, all_rows, true, ring, act);
}

/* The channels fewer than a vector, one at a time. */
INLINE void scalar_row(const KilnWindow *d, const float *restrict x, const float *restrict w,
                       const float *restrict bias, float *restrict y, int64_t p0, int64_t k0_lo,
                       int64_t k0_hi, const bool max, const bool ring, const int64_t act) {
    const int64_t c = d->c, kw = d->kw, in0 = p0 * d->stride[0] - d->pad[0];
    for (int64_t ch = 0; ch < c; ch++)
        for (int64_t p1 = 0; p1 < d->wo; p1++) {
            const int64_t in1 = p1 * d->stride[1] - d->pad[1];
            float acc = max ? -__builtin_inff() : bias ? bias[ch] : 0;
            for (int64_t k0 = k0_lo; k0 < k0_hi; k0++)
                for (int64_t k1 = 0; k1 < kw; k1++) {
                    const int64_t col = in1 + k1 * d->dilation[1];
                    if (!inside(col, d->w))
                        continue;
                    float v = input_row(d, x, in0 + k0 * d->dilation[0], ring)[col * d->x_col + ch];
                    acc = !max ? acc + v * w[(k0 * kw + k1) * c + ch] : v != v || v > acc ? v : acc;
                }
            y[p1 * c + ch] = act_scalar(acc, act, d->lo, d->hi);
        }
}

/* The channels a vector at a time, the last vector ending at the last channel: where
 * it overlaps the one before, it computes the same results again, in the same order. */
INLINE void window_row(const KilnWindow *d, const float *x, const float *w, const float *bias, float *y,
                       int64_t p0, const int64_t kh, const int64_t kw, const bool max, const bool ring,
                       const int64_t act) {
    /* the tap rows whose input row lies inside x */
    const int64_t in0 = p0 * d->stride[0] - d->pad[0], d0 = d->dilation[0];
    int64_t k0_lo = 0, k0_hi = kh;
    while (k0_lo < kh && in0 + k0_lo * d0 < 0)
        k0_lo++;
    while (k0_hi > k0_lo && in0 + (k0_hi - 1) * d0 >= d->h)
        k0_hi--;
    if (d->c < KILN_VF) {
        scalar_row(d, x, w, bias, y, p0, k0_lo, k0_hi, max, ring, act);
        return;
    }
    /* the positions from lo to hi: p stride - pad >= 0 and
       p stride - pad + (kw - 1) dilation <= w - 1 */
    const int64_t st = d->stride[1], pad = d->pad[1], wo = d->wo,
                  last = d->w - 1 - (kw - 1) * d->dilation[1] + pad; /* the largest p st */
    int64_t lo = (pad + st - 1) / st, hi = last < 0 ? 0 : last / st + 1;
    lo = lo < wo ? lo : wo;
    hi = hi < lo ? lo : hi < wo ? hi : wo;
    for (int64_t ch = 0; ch < d->c; ch += KILN_VF) {
        int64_t at = ch + KILN_VF <= d->c ? ch : d->c - KILN_VF;
        if (k0_lo == 0 && k0_hi == kh)
            vector_row(d, x, w, bias, y, p0, at, lo, hi, 0, kh, kh, kw, max, true, ring, act);
        else
            vector_row(d, x, w, bias, y, p0, at, lo, hi, k0_lo, k0_hi, kh, kw, max, false, ring, act);
    }
}

/* window_row with the window's taps constants where they are the common ones. */
INLINE void any_window_row(const KilnWindow *d, const float *x, const float *w, const float *bias, float *y,
                           int64_t p0, const bool max, const bool ring, const int64_t act) {
    if (d->kh == 2 && d->kw == 2)
        window_row(d, x, w, bias, y, p0, 2, 2, max, ring, act);
    else if (d->kh == 3 && d->kw == 3)
        window_row(d, x, w, bias, y, p0, 3, 3, max, ring, act);
    else if (d->kh == 5 && d->kw == 5)
        window_row(d, x, w, bias, y, p0, 5, 5, max, ring, act);
    else
        window_row(d, x, w, bias, y, p0, d->kh, d->kw, max, ring, act);
}

/* any_window_row with the activation a constant */
INLINE void activated_row(const KilnWindow *d, const float *x, const float *w, const float *bias, float *y,
                          int64_t p0, const bool ring) {
    if (d->act == KILN_ACT_RELU)
        any_window_row(d, x, w, bias, y, p0, false, ring, KILN_ACT_RELU);
    else if (d->act == KILN_ACT_CLIP)
        any_window_row(d, x, w, bias, y, p0, false, ring, KILN_ACT_CLIP);
    else
        any_window_row(d, x, w, bias, y, p0, false, ring, KILN_ACT_NONE);
}

void kiln_depthwise_row(const void *window, const float *x, const float *w, const float *bias, float *y,
                        int64_t p0) {
    if (((const KilnWindow *)window)->ring)
        activated_row(window, x, w, bias, y, p0, true);
    else
        activated_row(window, x, w, bias, y, p0, false);
}

void kiln_max_pool_row(const void *window, const float *x, float *y, int64_t p0) {
    any_window_row(window, x, NULL, NULL, y, p0, true, false, KILN_ACT_NONE);
}

/* ---- Winograd's transforms ---- */

/* A tile's channels go CHUNK_CHANNELS at a time, each chunk's inputs and outputs
 * found through a pointer per element of the tile: one into x or y, or where the
 * element lies outside, into `zeros` (an input) or a discarded patch (an output). */
enum { MAX_N = 6, CHUNK_CHANNELS = 512 };

static const float bt2[4][MAX_N] = {{1, 0, -1, 0}, {0, 1, 1, 0}, {0, -1, 1, 0}, {0, 1, 0, -1}};
static const float at2[2][MAX_N] = {{1, 1, 1, 0}, {0, 1, -1, -1}};
static const float bt4[6][6] = {{4, 0, -5, 0, 1, 0},  {0, -4, -4, 1, 1, 0}, {0, 4, -4, -1, 1, 0},
                                {0, -2, -1, 2, 1, 0}, {0, 2, -1, -2, 1, 0}, {0, 4, 0, -5, 0, 1}};
static const float at4[4][6] = {
    {1, 1, 1, 1, 1, 0}, {0, 1, -1, 2, -2, 0}, {0, 1, 1, 4, 4, 0}, {0, 1, -1, 8, -8, 1}};

static const float zeros[CHUNK_CHANNELS];

/* sum over k of coef[k] terms[k * apart]: zero coefficients left out, +-1 an
 * addition or subtraction, in order of k (as codegen's combine, so results match
 * its code's). */
INLINE kiln_vf combine(const float *coef, const kiln_vf *terms, const int apart, const int n) {
    kiln_vf sum = {0};
    bool first = true;
#pragma GCC unroll 6
    for (int k = 0; k < n; k++) {
        float f = coef[k];
        if (f == 0)
            continue;
        kiln_vf term = f == 1 || f == -1 ? terms[k * apart] : f * terms[k * apart];
        sum = first ? (f == -1 ? -term : term) : f == -1 ? sum - term : sum + term;
        first = false;
    }
    return sum;
}

/* out = mt x mt^T, rows x rows, for the n x n x and the rows x n matrix mt, each
 * element a vector of channels, row-major. */
INLINE void sandwich(const float (*mt)[MAX_N], const int rows, const int n, const kiln_vf *x, kiln_vf *out) {
    kiln_vf t[MAX_N * MAX_N];
#pragma GCC unroll 6
    for (int a = 0; a < rows; a++)
#pragma GCC unroll 6
        for (int q = 0; q < n; q++)
            t[a * n + q] = combine(mt[a], x + q, n, n);
#pragma GCC unroll 6
    for (int a = 0; a < rows; a++)
#pragma GCC unroll 6
        for (int j = 0; j < rows; j++)
            out[a * rows + j] = combine(mt[j], t + a * n, 1, n);
}

/* The `lanes` floats at p, a whole vector or the first lanes of one (zeros after). */
INLINE kiln_vf load_lanes(const float *p, const bool whole, int64_t lanes) {
    kiln_vf v = {0};
    if (whole)
        return *(const kiln_vf *)p;
    memcpy(&v, p, (size_t)lanes * sizeof(float));
    return v;
}

INLINE void store_lanes(float *p, kiln_vf v, const bool whole, int64_t lanes) {
    if (whole)
        *(kiln_vf *)p = v;
    else
        memcpy(p, &v, (size_t)lanes * sizeof(float));
}

/* Where a tile's n x n inputs or m x m outputs are: element (r, q) at
 * at + r pitch + q step, or, for a tile across an edge, at[r n + q]. */
typedef struct {
    float *at;
    int64_t pitch, step;
    float *const *each;
} Elements;

INLINE float *element(Elements e, const bool edge, int n, int r, int q) {
    return edge ? e.each[r * n + q] : e.at + r * e.pitch + q * e.step;
}

/* The input transform of `lanes` channels from ch of one tile: its inputs d, V's
 * matrix k at v[k stride + ch]. */
INLINE void transform_in(const float (*bt)[MAX_N], const int n, Elements d, const bool edge, int64_t ch,
                         const bool whole, int64_t lanes, float *v, int64_t stride) {
    kiln_vf x[MAX_N * MAX_N], out[MAX_N * MAX_N];
#pragma GCC unroll 6
    for (int r = 0; r < n; r++)
#pragma GCC unroll 6
        for (int q = 0; q < n; q++)
            x[r * n + q] = load_lanes(element(d, edge, n, r, q) + ch, whole, lanes);
    sandwich(bt, n, n, x, out);
#pragma GCC unroll 36
    for (int k = 0; k < n * n; k++)
        store_lanes(v + k * stride + ch, out[k], whole, lanes);
}

/* transform_in of `count` channels, whole vectors and then what is left */
INLINE void transform_in_all(const float (*bt)[MAX_N], const int n, Elements d, const bool edge,
                             int64_t count, float *v, int64_t stride) {
    int64_t ch = 0;
    for (; ch + KILN_VF <= count; ch += KILN_VF)
        transform_in(bt, n, d, edge, ch, true, KILN_VF, v, stride);
    if (ch < count)
        transform_in(bt, n, d, edge, ch, false, count - ch, v, stride);
}

INLINE void winograd_in(const KilnWinograd *w, const float *x, float *v, int64_t row, const int m,
                        const float (*bt)[MAX_N]) {
    const int n = m + 2;
    int64_t c = w->c, image = row / w->th, h0 = row % w->th * m - w->pad_top, stride = w->v_stride;
    for (int64_t tw = 0; tw < w->tw; tw++) {
        int64_t w0 = tw * m - w->pad_left;
        float *out = v + (row * w->tw + tw) * c;
        if (h0 >= 0 && h0 + n <= w->h && w0 >= 0 && w0 + n <= w->w) {
            float *at = (float *)x + ((image * w->h + h0) * w->w + w0) * c;
            transform_in_all(bt, n, (Elements){at, w->w * c, c, NULL}, false, c, out, stride);
            continue;
        }
        for (int64_t c0 = 0; c0 < c; c0 += CHUNK_CHANNELS) {
            float *each[MAX_N * MAX_N];
            for (int r = 0; r < n; r++)
                for (int q = 0; q < n; q++) {
                    int64_t hr = h0 + r, wq = w0 + q;
                    bool inside = hr >= 0 && hr < w->h && wq >= 0 && wq < w->w;
                    each[r * n + q] =
                        (float *)(inside ? x + ((image * w->h + hr) * w->w + wq) * c + c0 : zeros);
                }
            int64_t count = c - c0 < CHUNK_CHANNELS ? c - c0 : CHUNK_CHANNELS;
            transform_in_all(bt, n, (Elements){NULL, 0, 0, each}, true, count, out + c0, stride);
        }
    }
}

void kiln_winograd_in(const void *winograd, const float *x, float *v, int64_t row) {
    const KilnWinograd *w = winograd;
    if (w->m == 4)
        winograd_in(w, x, v, row, 4, bt4);
    else
        winograd_in(w, x, v, row, 2, bt2);
}

/* The output transform of `lanes` channels from ch of one tile: M's matrix k at
 * mv[k stride + ch], the tile's outputs y. */
INLINE void transform_out(const float (*at)[MAX_N], const int m, const float *mv, int64_t stride,
                          const float *bias, const bool biased, int64_t ch, const bool whole, int64_t lanes,
                          Elements y, const bool edge) {
    const int n = m + 2;
    kiln_vf x[MAX_N * MAX_N], out[MAX_N * MAX_N];
#pragma GCC unroll 36
    for (int k = 0; k < n * n; k++)
        x[k] = load_lanes(mv + k * stride + ch, whole, lanes);
    sandwich(at, m, n, x, out);
    kiln_vf b = biased ? load_lanes(bias + ch, whole, lanes) : (kiln_vf){0};
#pragma GCC unroll 4
    for (int r = 0; r < m; r++)
#pragma GCC unroll 4
        for (int q = 0; q < m; q++)
            store_lanes(element(y, edge, m, r, q) + ch, biased ? out[r * m + q] + b : out[r * m + q], whole,
                        lanes);
}

INLINE void transform_out_all(const float (*at)[MAX_N], const int m, const float *mv, int64_t stride,
                              const float *bias, const bool biased, int64_t count, Elements y,
                              const bool edge) {
    int64_t ch = 0;
    for (; ch + KILN_VF <= count; ch += KILN_VF)
        transform_out(at, m, mv, stride, bias, biased, ch, true, KILN_VF, y, edge);
    if (ch < count)
        transform_out(at, m, mv, stride, bias, biased, ch, false, count - ch, y, edge);
}

INLINE void winograd_out(const KilnWinograd *w, const float *mv, const float *bias, float *y, int64_t row,
                         const int m, const float (*at)[MAX_N], const bool biased) {
    int64_t o = w->o, image = row / w->th, h0 = row % w->th * m, stride = w->m_stride, pitch = w->wo * o;
    float discard[CHUNK_CHANNELS];
    for (int64_t tw = 0; tw < w->tw; tw++) {
        int64_t w0 = tw * m;
        const float *in = mv + (row * w->tw + tw) * o;
        float *out = y + ((image * w->ho + h0) * w->wo + w0) * o;
        if (h0 + m <= w->ho && w0 + m <= w->wo) {
            transform_out_all(at, m, in, stride, bias, biased, o, (Elements){out, pitch, o, NULL}, false);
            continue;
        }
        for (int64_t c0 = 0; c0 < o; c0 += CHUNK_CHANNELS) {
            float *each[4 * 4];
            for (int r = 0; r < m; r++)
                for (int q = 0; q < m; q++)
                    each[r * m + q] =
                        h0 + r < w->ho && w0 + q < w->wo ? out + r * pitch + q * o + c0 : discard;
            int64_t count = o - c0 < CHUNK_CHANNELS ? o - c0 : CHUNK_CHANNELS;
            transform_out_all(at, m, in + c0, stride, biased ? bias + c0 : bias, biased, count,
                              (Elements){NULL, 0, 0, each}, true);
        }
    }
}

void kiln_winograd_out(const void *winograd, const float *mv, const float *bias, float *y, int64_t row) {
    const KilnWinograd *w = winograd;
    bool biased = bias != 0;
    if (w->m == 4 && biased)
        winograd_out(w, mv, bias, y, row, 4, at4, true);
    else if (w->m == 4)
        winograd_out(w, mv, bias, y, row, 4, at4, false);
    else if (biased)
        winograd_out(w, mv, bias, y, row, 2, at2, true);
    else
        winograd_out(w, mv, bias, y, row, 2, at2, false);
}
