/* GEMMs whose right operand is known at compile time: the weights packed into
 * panels, run by kiln's precompiled register-blocked micro-kernel (kiln_gemm_tiles,
 * runtime/kernels.c) for the machine's vector width.
 *
 * Y = A B for each of `batch` items, A [rows, depth] read from a buffer at run time,
 * B [depth, cols] a constant (a conv's or Winograd's weights). A's element (r, kk)
 * lies at offset a_rows(r) + a_depth(kk), each a mixed-radix index (OffsetMap): a
 * plain matrix has one digit in each, a conv's implicit GEMM reads x through several
 * (batch item, output row and column; tap row, and tap column with channel), the
 * tile's rows each at their own offset and the depth a loop per digit. B is cut into
 * panels of NR columns (two vector registers' worth, so NR is 32 floats with AVX-512
 * and 16 with AVX2) and each panel is stored now, in the kernel's table, as
 * [depth][NR]: the micro-kernel reads one contiguous row of NR floats per step of
 * the depth. The last panel is as wide as what is left. The table starts with the
 * shapes and digits, a KilnGemm, which is all the micro-kernel knows of the GEMM.
 *
 * The kernel is a LOOP over register tiles: MR rows by one panel. A tile keeps its
 * MR x NR sums in 12 vector registers (MR 6 with two-vector panels, 12 when B has at
 * most one vector's width of columns; 16, MR 8, for a deep GEMM on AVX-512),
 * leaving registers for the panel's loads and the broadcasts of A; each step of the
 * depth broadcasts one element of each of the MR rows of A and adds its product with
 * the panel's row to every sum of that row. A tile of fewer rows (the last, or all
 * of a linear layer's one row) has registers to spare: up to 4 sets of sums,
 * consecutive steps adding into different sets, so that each multiply-add does not
 * wait for the one before it (a 2048-deep single row ran 3x faster). When the depth
 * is done the sums pass through a small local tile (which leaves the last panel's
 * padding behind) to the bias and the fused epilogue (relu, a residual add, ...) on
 * their way to Y, while still in L1: that part is the model's own, generated here.
 *
 * The tiles run panels innermost, so consecutive tiles (those a thread's chunk
 * holds) reuse the same MR rows of A from the L1 cache, while all of B, read once
 * per row tile, stays in the L2 cache; a B too large for that (ResNet's last layers:
 * 4608 x 512) runs row tiles innermost instead, each panel read from memory once and
 * then from L2 for every row tile; the micro-kernel prefetches the next panel into
 * L2 while it computes the current one (prefetch_from in runtime/kernels.c). Measured on
 * a 2-core Zen 5 (AVX-512), one thread: 220 to 260 GFLOP/s on ResNet's conv GEMMs,
 * where OpenBLAS 0.3.21 (AVX2 kernels there) runs at 105 to 137. */
#include "codegen.h"

#include <math.h>
#include <string.h>

/* B_IN_CACHE: the most bytes of B that stay in a core's L2 cache (1 MiB on Zen 4 and
 * 5, 1.25 to 2 on recent Intel) beside the rows of A. */
enum { ACCUMULATORS = 12, B_IN_CACHE = 512 << 10 };

/* The fewest multiply-adds worth a chunk of the pool's (about a microsecond): a GEMM
 * of less than twice that (a squeeze-and-excite block's one-row convs) runs on the
 * caller alone, where a fork and join would cost more than the work and, on a busy
 * machine, wait for a thread the scheduler has not run. A GEMM of more is split
 * however small: the small CNN's 0.9-MFLOP first conv, split, made the model 20%
 * faster at 2 threads on a 2-core Zen 4 (its median 0.034 against 0.042 ms). */
enum { CHUNK_WORK = 1 << 16 };

/* Rows per register tile: 12 vector accumulators, so 6 rows of two-vector panels,
 * 12 of a one-vector panel (a GEMM with at most vector-width columns). AVX-512's 32
 * registers hold 16 (8 rows of two vectors) where the depth is at least WIDE_DEPTH:
 * there, a third more multiply-adds per load of the panel made ResNet-50 3.4% faster
 * and BERT 3.7% (2 threads, a 2-core Xeon with AVX-512), and a linear layer alone
 * 20% on a Zen 5; below it, ResNet's 64-deep 1x1 convs ran 12 to 17% slower on that
 * Zen 5, their shorter loop paying for its larger tile's stores. */
enum { WIDE_SUMS = 16, WIDE_DEPTH = 256 };

static int64_t tile_rows(const Program *p, const PackedGemm *g) {
    if (g->cols <= p->vector_floats)
        return ACCUMULATORS;
    return p->vector_floats == 16 && g->depth >= WIDE_DEPTH ? WIDE_SUMS / 2 : ACCUMULATORS / 2;
}

static int64_t panel_width(const Program *p) {
    return 2 * (int64_t)p->vector_floats;
}

/* cols rounded up to whole vectors: each panel is padded with zeros to a multiple
 * of the vector width, so that every load of a panel's row is a whole vector. */
static int64_t padded(const Program *p, int64_t cols) {
    int64_t vw = p->vector_floats;
    return (cols + vw - 1) / vw * vw;
}

/* Whether B is too large to stay in cache: then consecutive iterations run the row
 * tiles of one panel. */
static bool rows_inner(const Program *p, const PackedGemm *g) {
    return (int64_t)sizeof(float) * g->depth * padded(p, g->cols) > B_IN_CACHE;
}

/* What one call of kiln_gemm_tiles computes, an iteration of the kernel: up to
 * MAX_PANELS panels by as many row tiles as make CALL_TILES tiles in all, so that a
 * call's setup (a tenth of a 64-deep tile's time) is spread over a few tiles; fewer
 * while that leaves the GEMM fewer than MIN_ITERATIONS iterations for the threads.
 * When B is too large for the cache, one panel a call, its row tiles in turn. (Calls
 * of more panels ran slower: their local tile, 6 x 256 floats, left L1 before the
 * epilogue read it back. A GEMM of one panel, the small CNN's 27-deep first conv,
 * ran the model 7% faster in calls of 4 row tiles than of 2.) */
enum { MAX_PANELS = 2, CALL_TILES = 4, MIN_ITERATIONS = 16 };

typedef struct {
    int64_t mr, nr;               /* rows of a register tile, columns of a panel */
    int64_t row_tiles, panels;    /* in a batch item */
    int64_t rows, cols;           /* row tiles and panels a call */
    int64_t row_calls, col_calls; /* calls across a batch item's rows and columns */
} Blocking;

static Blocking blocking_of(const Program *p, const PackedGemm *g) {
    Blocking k = {.mr = tile_rows(p, g), .nr = panel_width(p)};
    k.row_tiles = (g->rows + k.mr - 1) / k.mr;
    k.panels = (g->cols + k.nr - 1) / k.nr;
    k.cols = rows_inner(p, g) ? 1 : k.panels < MAX_PANELS ? k.panels : MAX_PANELS;
    k.rows = k.row_tiles < CALL_TILES / k.cols ? k.row_tiles : CALL_TILES / k.cols;
    for (;;) {
        k.row_calls = (k.row_tiles + k.rows - 1) / k.rows;
        k.col_calls = (k.panels + k.cols - 1) / k.cols;
        if (g->batch * k.row_calls * k.col_calls >= MIN_ITERATIONS || (k.rows == 1 && k.cols == 1))
            return k;
        if (k.rows > 1)
            k.rows = (k.rows + 1) / 2;
        else
            k.cols = (k.cols + 1) / 2;
    }
}

int64_t packed_gemm_tiles(const Program *p, const PackedGemm *g) {
    Blocking k = blocking_of(p, g);
    return g->batch * k.row_calls * k.col_calls;
}

/* The floats of kiln_gemm_tiles's parameter block in a table: whole cache lines, so
 * that the panels after it start on one. */
enum { BLOCK_FLOATS = (sizeof(KilnGemm) + 63) / 64 * 16 };

/* The parameter block of g, for B packed right after it. */
static KilnGemm gemm_block(const Program *p, const PackedGemm *g) {
    KilnGemm kg = {.rows = g->rows,
                   .cols = g->cols,
                   .depth = g->depth,
                   .tile_rows = tile_rows(p, g),
                   .a_at = g->a_at,
                   .a_batch = g->a_batch,
                   .row_digits = g->a_rows.n,
                   .panels_at = BLOCK_FLOATS,
                   .item_floats = g->b_batch ? g->depth * padded(p, g->cols) : 0};
    KILN_ASSERT(g->a_rows.n <= KILN_GEMM_ROW_DIGITS);
    for (int d = 0; d < g->a_rows.n && d < KILN_GEMM_ROW_DIGITS; d++) {
        kg.row_size[d] = g->a_rows.size[d];
        kg.row_stride[d] = g->a_rows.stride[d];
    }
    /* the depth's last digit is the run, when its steps are contiguous; the other
       digits' every combination a segment */
    OffsetMap depth = g->a_depth.n ? g->a_depth : (OffsetMap){1, {1}, {1}};
    if (depth.stride[depth.n - 1] != 1) {
        KILN_ASSERT(depth.n < KILN_MAX_RANK);
        depth.size[depth.n] = 1;
        depth.stride[depth.n++] = 1;
    }
    int outer = depth.n - 1;
    kg.run = depth.size[outer];
    kg.segments = 1;
    for (int d = 0; d < outer; d++)
        kg.segments *= depth.size[d];
    KILN_ASSERT(kg.segments <= KILN_GEMM_SEGMENTS);
    for (int64_t seg = 0; seg < kg.segments && seg < KILN_GEMM_SEGMENTS; seg++)
        for (int64_t d = outer - 1, i = seg; d >= 0; i /= depth.size[d], d--)
            kg.segment[seg] += i % depth.size[d] * depth.stride[d];
    return kg;
}

/* The kernel's table: `at` floats for the caller (zeros here), then the parameter
 * block, then B as panels, for each batch item (one item when every item has the
 * same B) panel after panel, [depth][width padded]; NULL when memory runs out. */
int64_t packed_gemm_floats(const Program *p, const PackedGemm *g) {
    int64_t items = g->b_batch ? g->batch : 1;
    return (BLOCK_FLOATS + items * g->depth * padded(p, g->cols) + 15) / 16 * 16;
}

float *packed_gemm_table(const Program *p, const PackedGemm *g, int64_t at, int64_t *bytes) {
    int64_t nr = panel_width(p), per_item = g->depth * padded(p, g->cols), items = g->b_batch ? g->batch : 1;
    int64_t floats = at + BLOCK_FLOATS + items * per_item;
    *bytes = (int64_t)sizeof(float) * floats;
    float *table = ir_calloc((size_t)floats + 1, sizeof(float));
    if (!table)
        return NULL;
    KilnGemm block = gemm_block(p, g);
    memcpy(table + at, &block, sizeof block);
    for (int64_t bi = 0; bi < items; bi++)
        for (int64_t q0 = 0; q0 < g->cols; q0 += nr) {
            int64_t width = g->cols - q0 < nr ? g->cols - q0 : nr, stride = padded(p, width);
            float *panel = table + at + BLOCK_FLOATS + bi * per_item + q0 * g->depth;
            for (int64_t kk = 0; kk < g->depth; kk++)
                for (int64_t j = 0; j < width; j++)
                    panel[kk * stride + j] =
                        g->b[bi * g->b_batch + offset_at(&g->b_depth, kk) + (q0 + j) * g->b_q];
        }
    return table;
}

void offset_digit(OffsetMap *m, int64_t size, int64_t stride) {
    if (size == 1)
        return;
    if (m->n > 0 && m->stride[m->n - 1] == size * stride) {
        m->size[m->n - 1] *= size;
        m->stride[m->n - 1] = stride;
        return;
    }
    KILN_ASSERT(m->n < KILN_MAX_RANK);
    m->size[m->n] = size;
    m->stride[m->n++] = stride;
}

int64_t offset_at(const OffsetMap *m, int64_t i) {
    int64_t at = 0;
    for (int d = m->n - 1; d >= 0; d--) {
        at += i % m->size[d] * m->stride[d];
        i /= m->size[d];
    }
    return at;
}

/* min(step, size - from): a tile's rows or columns, a constant where every tile has
 * as many. */
static KExpr *tile_extent(KBuilder *b, const char *name, int64_t size, int64_t step, KExpr *from) {
    if (size <= step || size % step == 0)
        return k_int(b, size < step ? size : step);
    KExpr *left = k_sub(b, k_int(b, size), from), *whole = k_int(b, step);
    return k_var(b, kb_let(b, name, KT_I64, k_select(b, k_lt(b, left, whole), left, whole)));
}

bool library_act(const Expr *e, int64_t *act, double *lo, double *hi) {
    if (e->kind != EXPR_CALL || e->call.n_in != 1)
        return false;
    double p[UNARY_MAX_PARAMS];
    switch (e->call.op) {
    case OP_RELU: *act = KILN_ACT_RELU; return true;
    case OP_CLIP:
        unary_params(OP_CLIP, &e->call, p);
        *act = KILN_ACT_CLIP;
        *lo = p[0];
        *hi = p[1];
        return p[0] <= p[1];
    case OP_GELU:
        unary_params(OP_GELU, &e->call, p);
        *act = KILN_ACT_GELU;
        return p[0] == 0;
    default: return false;
    }
}

static bool is_input(const Expr *e, int k) {
    return e->kind == EXPR_INPUT && e->input == k;
}

/* Whether g's epilogue is one that kiln_bias_act computes: act(x) of x = $0, or of
 * x = $0 + $1 (either way round) with $1 an input of the result's shape (its value
 * in *res, else -1), act none, relu, clip (its limits in *lo and *hi) or GELU. */
static bool library_epilogue(const Program *p, const PackedGemm *g, int *res, int64_t *act, double *lo,
                             double *hi) {
    const Expr *e = g->epilogue;
    *res = -1;
    *act = KILN_ACT_NONE;
    *lo = -INFINITY;
    *hi = INFINITY;
    if (e && library_act(e, act, lo, hi))
        e = e->arg[0];
    if (!e || is_input(e, 0))
        return true;
    if (e->kind != EXPR_CALL || e->call.op != OP_ADD ||
        !((is_input(e->arg[0], 0) && is_input(e->arg[1], 1)) ||
          (is_input(e->arg[0], 1) && is_input(e->arg[1], 0))))
        return false;
    int first = expr_first_input(g->node);
    if (first >= g->node->n_in || type_numel(&p->g->values[g->node->in[first]].type) == 1)
        return false; /* a scalar $1 the generated code reads at 0 */
    *res = g->node->in[first];
    return true;
}

/* The sums of one call's row tiles (from row tile rt) and panels (from panel pn)
 * by kiln_gemm_tiles (runtime/kernels.c), which reads g's parameter block at
 * table_at in the table: into y when they are what Y holds (no bias nor epilogue,
 * every panel whole vectors), else into a local tile, whose rows (fewer in the last
 * call) and columns (fewer in the last) then pass through the bias and the epilogue
 * to Y while in L1: kiln_bias_act's when it has it (so that most of a CNN's kernels
 * are calls alone, which Clang compiles in no time), else generated. */
static void tiles(const Program *p, KBuilder *b, const PackedGemm *g, const Blocking *k, int table, KExpr *bi,
                  KExpr *y_item, KExpr *rt, KExpr *pn) {
    int64_t height = k->rows * k->mr, width = k->cols * k->nr;
    KExpr *r0 = k_var(b, kb_let(b, "r0", KT_I64, k_mul(b, rt, k_int(b, k->mr))));
    KExpr *q0 = k_var(b, kb_let(b, "q0", KT_I64, k_mul(b, pn, k_int(b, k->nr))));
    KExpr *rows = tile_extent(b, "rows", g->rows, height, r0),
          *panels = tile_extent(b, "panels", k->panels, k->cols, pn);
    KExpr *params = k_addr(b, table, k_int(b, g->table_at)), *a = k_addr(b, g->a, k_int(b, 0));
    if (g->cols % p->vector_floats == 0 && g->bias < 0 && !g->epilogue) {
        KExpr *y_row = k_add(b, k_madd(b, y_item, g->y_batch, k_mul(b, r0, k_int(b, g->y_ld))),
                             k_add(b, k_int(b, g->y_at), q0));
        kb_call(b, "kiln_gemm_tiles", 9,
                (KExpr *[]){params, a, bi, r0, rows, q0, panels, k_addr(b, g->y, y_row), k_int(b, g->y_ld)});
        return;
    }
    int sums = kb_array(b, "tile", KT_F32, height * width, 0, false, false);
    kb_call(b, "kiln_gemm_tiles", 9,
            (KExpr *[]){params, a, bi, r0, rows, q0, panels, k_addr(b, sums, k_int(b, 0)), k_int(b, width)});
    KExpr *cols = tile_extent(b, "cols", g->cols, width, q0);
    int64_t act;
    double lo, hi;
    int res;
    if (library_epilogue(p, g, &res, &act, &lo, &hi)) {
        KExpr *y_at = k_add(b, k_madd(b, y_item, g->y_batch, k_mul(b, r0, k_int(b, g->y_ld))),
                            k_add(b, k_int(b, g->y_at), q0));
        if (res >= 0) /* the residual is read where y is written */
            y_at = k_var(b, kb_let(b, "y_at", KT_I64, y_at));
        KExpr *bias = g->bias >= 0 ? k_addr(b, kb_value(b, g->bias, false), k_madd(b, bi, g->bias_batch, q0))
                                   : k_int(b, 0);
        KExpr *added = res >= 0 ? k_addr(b, kb_value(b, res, false), y_at) : k_int(b, 0);
        kb_call(b, "kiln_bias_act", 11,
                (KExpr *[]){k_addr(b, sums, k_int(b, 0)), k_int(b, width), rows, cols, bias, added,
                            k_int(b, act), k_f32(b, lo), k_f32(b, hi), k_addr(b, g->y, y_at),
                            k_int(b, g->y_ld)});
        return;
    }
    KExpr *i = k_var(b, kb_for(b, "ri", KT_I64, k_int(b, 0), rows, NULL, 0));
    KExpr *j = k_var(b, kb_for(b, "cj", KT_I64, k_int(b, 0), cols, NULL, 0));
    kb_unroll(b, 1); /* a loop GCC vectorizes; unrolled whole first, it would stay scalar */
    KExpr *q = k_add(b, q0, j);
    KExpr *at =
        k_var(b, kb_let(b, "at", KT_I64,
                        k_add(b, k_madd(b, y_item, g->y_batch, k_mul(b, k_add(b, r0, i), k_int(b, g->y_ld))),
                              k_add(b, k_int(b, g->y_at), q))));
    KExpr *x0 = k_load(b, sums, k_madd(b, i, width, j));
    if (g->bias >= 0)
        x0 = k_add(b, x0, k_load(b, kb_value(b, g->bias, false), k_madd(b, bi, g->bias_batch, q)));
    kb_store_epilogue(b, p, g->node, g->epilogue, g->y, at, x0);
    kb_end(b);
    kb_end(b);
}

void packed_gemm_repoint(unsigned char *blob, int64_t at, int64_t panels_from, int64_t panels) {
    unsigned char *block = blob + at + panels_from - (int64_t)sizeof(float) * BLOCK_FLOATS;
    KilnGemm g;
    memcpy(&g, block, sizeof g);
    g.panels_at = (panels - at - panels_from) / (int64_t)sizeof(float) + BLOCK_FLOATS;
    memcpy(block, &g, sizeof g);
}

int kb_packed_gemm(Program *p, Kernel *k, const PackedGemm *g, Diag *d) {
    int64_t bytes;
    float *packed = packed_gemm_table(p, g, 0, &bytes);
    if (!packed)
        return diag_error(d, k->node->loc, "out of memory");
    int rc = program_table(p, k, packed, bytes, d);
    ir_free(packed);
    if (rc)
        return -1;
    k->panels_from = (int64_t)sizeof(float) * BLOCK_FLOATS;
    KBuilder *b = &k->b;
    Blocking bk = blocking_of(p, g);
    int64_t height = bk.rows * bk.mr, width = bk.cols * bk.nr;
    int64_t work = (g->rows < height ? g->rows : height) * (g->cols < width ? g->cols : width) * g->depth;
    k->grain = work >= CHUNK_WORK ? 1 : (CHUNK_WORK + work - 1) / work;
    int table = kb_table(b);
    KExpr *i = k_var(b, k->iter);
    /* With the symbolic dim in Y's rows, a run computes the row calls of its rows
       only: as many as its size needs, in each panel and batch item. */
    const Type *y = &p->g->values[g->node->out[0]].type;
    int64_t bound = p->g->sym.bound;
    bool follows = y->sym && g->rows % bound == 0;
    KExpr *row_calls = k_int(b, bk.row_calls);
    if (follows) {
        kernel_follows(p, k, y, g->rows, height, bk.col_calls * (g->batch > 1 ? g->batch : 1));
        KExpr *rows = k_mul(b, k_sym_size(b), k_int(b, g->rows / bound));
        row_calls = k_var(b, kb_let(b, "row_calls", KT_I64,
                                    k_div(b, k_add(b, rows, k_int(b, height - 1)), k_int(b, height))));
    }
    /* consecutive iterations share their panels when B is too large to stay in cache */
    bool inner = rows_inner(p, g);
    KExpr *col_step = inner ? row_calls : k_int(b, 1), *row_step = k_int(b, inner ? 1 : bk.col_calls);
    KExpr *col = k_mod(b, k_div(b, i, col_step), k_int(b, bk.col_calls));
    KExpr *row = k_mod(b, k_div(b, i, row_step), row_calls);
    KExpr *pn = k_var(b, kb_let(b, "pn", KT_I64, k_mul(b, col, k_int(b, bk.cols))));
    KExpr *rt = k_var(b, kb_let(b, "rt", KT_I64, k_mul(b, row, k_int(b, bk.rows))));
    KExpr *bi =
        g->batch > 1
            ? k_var(b, kb_let(b, "bi", KT_I64, k_div(b, i, k_mul(b, row_calls, k_int(b, bk.col_calls)))))
            : k_int(b, 0);
    tiles(p, b, g, &bk, table, bi, bi, rt, pn);
    return 0;
}

void kb_packed_gemm_item(const Program *p, KBuilder *b, const PackedGemm *g, int table, KExpr *bi,
                         KExpr *y_item) {
    Blocking k = blocking_of(p, g);
    k.rows = 1; /* its own loop: the rows of one item are few */
    k.cols = k.panels < MAX_PANELS ? k.panels : MAX_PANELS;
    KExpr *rt = k_var(b, kb_for(b, "rt", KT_I64, k_int(b, 0), k_int(b, k.row_tiles), NULL, 0));
    KExpr *pn = k_var(b, kb_for(b, "pn", KT_I64, k_int(b, 0), k_int(b, k.panels), k_int(b, k.cols), 0));
    tiles(p, b, g, &k, table, bi, y_item, rt, pn);
    kb_end(b);
    kb_end(b);
}
