/* kiln's precompiled kernels: the code that is the same for every layer of every
 * model (a GEMM's register tile, its common epilogues, a depthwise conv's or a
 * max pool's row, Winograd's transforms),
 * compiled once when kiln is built, for each vector width (runtime/kernels.c), and
 * linked into every compiled model. A model's kernels call them with a parameter
 * block that the lowering writes into the kernel's table in the weights blob (so
 * the calling code is the same whatever the shapes), and keep what is truly theirs
 * (index arithmetic of the tile, a fused epilogue other than a bias, a residual and
 * relu or clip) as generated code. kiln pastes this file into every generated C model;
 * codegen/lower_packed.c and lower_winograd.c fill the blocks. */
#ifndef KILN_KERNELS_H
#define KILN_KERNELS_H

#include <stdint.h>

/* The GEMM of a LOOP kernel whose B is packed (codegen/lower_packed.c): per batch
 * item bi, Y = A B with A [rows, depth] read at run time and B [depth, cols]
 * packed in the table panels_at floats after this block, in panels of two vectors'
 * width ([depth][panel width rounded up to whole vectors]), item_floats apart (0:
 * one B for every item). A's element (r, kk) lies at
 * a_at + bi a_batch + row(r) + depth(kk) floats from a: row(r) the sum of r's
 * mixed-radix digits (row_size, outermost first) times row_stride; the depth is
 * `segments` runs of `run` contiguous steps (a conv's tap rows, say): kk = s run + j
 * at segment[s] + j. */
enum { KILN_GEMM_ROW_DIGITS = 6, KILN_GEMM_SEGMENTS = 128, KILN_GEMM_CALL_ROWS = 96 };
typedef struct {
    int64_t rows, cols, depth, tile_rows;
    int64_t a_at, a_batch;
    int64_t row_digits, row_size[KILN_GEMM_ROW_DIGITS], row_stride[KILN_GEMM_ROW_DIGITS];
    int64_t segments, segment[KILN_GEMM_SEGMENTS], run;
    int64_t panels_at, item_floats;
} KilnGemm;

/* Winograd's F(m x m, 3x3), m = 2 or 4, of a conv channels last (codegen/lower_winograd.c):
 * x [N, h, w, c] padded by pad_top and pad_left, y [N, ho, wo, o]; th x tw tiles of
 * m x m per image, `tiles` in all. V's (m + 2)^2 matrices [tiles, c] lie v_stride floats
 * apart, M's [tiles, o] m_stride apart. */
typedef struct {
    int64_t m, c, h, w, pad_top, pad_left, th, tw, tiles, o, ho, wo, v_stride, m_stride;
} KilnWinograd;

/* A window of kh x kw taps sliding over 2 spatial dims, channels last: a depthwise
 * conv's (codegen/lower_conv.c) or a max pool's (codegen/lower_pool.c). One image's
 * x [h, w, c], its rows x_row and positions x_col floats apart; output position p
 * along dim i reaches input p stride[i] - pad[i] + k dilation[i] through tap k; wo
 * positions a row. A ring of n rows (ring n > 0) holds input row r at r % n instead,
 * and only the rows the current output row reads. A depthwise conv's outputs take
 * the activation act (KILN_ACT_*, below; clip to [lo, hi]) as they are stored. */
typedef struct {
    int64_t c, h, w, x_row, x_col, kh, kw, stride[2], pad[2], dilation[2], wo, ring, act;
    float lo, hi;
} KilnWindow;

/* The sums of A B's register tiles of the `rows` rows from r0 (tile_rows at a time,
 * at most KILN_GEMM_CALL_ROWS) by `panels` panels from column q0, of batch item bi,
 * stored as whole vectors: row r0 + i of panel p at out + i out_ld + p (panel
 * width), the last panel's padding columns included. */
void kiln_gemm_tiles(const void *gemm, const float *a, int64_t bi, int64_t r0, int64_t rows, int64_t q0,
                     int64_t panels, float *out, int64_t out_ld);

/* The epilogues of a GEMM's tile that are most of a CNN's and a transformer's, where
 * the generated code would otherwise spend its compile time (or, for GELU, compute
 * at most 8 lanes at a time): y = act(res + (tile + bias)) of a tile of rows x cols
 * (bias NULL: none; res NULL: none, else read where y is written; tile and y rows
 * tile_ld and y_ld apart), act none, relu, clip to [lo, hi] (lo <= hi) or GELU
 * (erf's, as kiln_geluf computes it), each computed as its op's own kernel
 * computes it. */
enum { KILN_ACT_NONE, KILN_ACT_RELU, KILN_ACT_CLIP, KILN_ACT_GELU };
void kiln_bias_act(const float *tile, int64_t tile_ld, int64_t rows, int64_t cols, const float *bias,
                   const float *res, int64_t act, float lo, float hi, float *y, int64_t y_ld);

/* One block of keys of attention's online softmax, for one query row
 * (codegen/lower_attention.c): sc the block's n scores, scaled and masked (n a
 * multiple of 16), *m the row's largest score so far, *l its sum of exps and acc its
 * ev outputs so far. The block's largest score m' (a NaN score is none) becomes
 * *m; *l and acc are scaled by exp(m - m') (taken against 0 while every score is
 * -inf), each score is replaced by its exp against m', and their sum is added to *l. */
void kiln_attention_softmax(float *sc, int64_t n, float *m, float *l, float *acc, int64_t ev);

/* Output row p0 of a depthwise conv into y [wo, c], its weights w tap-major [kh,
 * kw, c]: at each position, the window's activation of the bias (NULL: zero) plus,
 * tap by tap in order, each tap's weight times its input, for the taps whose input
 * lies inside x (the others read the padding's zeros). */
void kiln_depthwise_row(const void *window, const float *x, const float *w, const float *bias, float *y,
                        int64_t p0);

/* Output row p0 of a max pool into y [wo, c]: at each position the largest input of
 * the taps inside x, or the last NaN among them; -inf where none lies inside. */
void kiln_max_pool_row(const void *window, const float *x, float *y, int64_t p0);

/* V = B^T d B of every tile of tile row `row` (image row / th, row % th) and every
 * channel, into v as (m + 2)^2 matrices [tiles, c]; zeros outside x. */
void kiln_winograd_in(const void *winograd, const float *x, float *v, int64_t row);

/* y = A^T M A (+ bias when it is not NULL) of every tile of tile row `row`, M the
 * (m + 2)^2 matrices [tiles, o] at mv; the tiles across y's last row or column
 * store only what lies inside. */
void kiln_winograd_out(const void *winograd, const float *mv, const float *bias, float *y, int64_t row);

#endif
