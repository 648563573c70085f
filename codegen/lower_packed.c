/* GEMMs whose right operand is known at compile time: the weights packed into
 * panels, run by a register-blocked micro-kernel that kiln generates for the
 * machine's vector width.
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
 * the depth. The last panel is as wide as what is left.
 *
 * The kernel is a LOOP over register tiles: MR rows by one panel. A tile keeps its
 * MR x NR sums in 12 vector variables (MR 6 with two-vector panels, 12 when B has at
 * most one vector's width of columns), leaving registers for the panel's loads and
 * the broadcasts of A; each step of the depth broadcasts one element of each of the
 * MR rows of A and adds its product with the panel's row to every sum of that row,
 * and the depth loop is unrolled by 4 so the loads run ahead of the multiply-adds. A
 * tile of fewer rows (the last, or all of a linear layer's one row) has variables to
 * spare: up to 4 sets of sums, consecutive steps adding into different sets, so that
 * each multiply-add does not wait for the one before it (a 2048-deep single row ran
 * 3x faster). When the depth is done the sums pass through a small local tile (which
 * leaves the last panel's padding behind) to the bias and the fused epilogue (relu,
 * a residual add, ...) on their way to Y, while still in L1. Each tile size is a
 * compile-time constant: the tiles of the last rows and of the last panel are their
 * own copies of the micro-kernel, chosen by an if on the tile's position.
 *
 * The tiles run panels innermost, so consecutive tiles (those a thread's chunk
 * holds) reuse the same MR rows of A from the L1 cache, while all of B, read once
 * per row tile, stays in the L2 cache; a B too large for that (ResNet's last layers:
 * 4608 x 512) runs row tiles innermost instead, each panel read from memory once and
 * then from L2 for every row tile. Measured on a 2-core Zen 5 (AVX-512), one thread:
 * 220 to 260 GFLOP/s on ResNet's conv GEMMs, where OpenBLAS 0.3.21 (AVX2 kernels
 * there) runs at 105 to 137. */
#include "codegen.h"

/* B_IN_CACHE: the most bytes of B that stay in a core's L2 cache (1 MiB on Zen 4 and
 * 5, 1.25 to 2 on recent Intel) beside the rows of A. */
enum { ACCUMULATORS = 12, DEPTH_UNROLL = 4, B_IN_CACHE = 512 << 10 };

/* The fewest multiply-adds worth a chunk of the pool's (about a microsecond): a GEMM
 * of less than twice that (a squeeze-and-excite block's one-row convs) runs on the
 * caller alone, where a fork and join would cost more than the work and, on a busy
 * machine, wait for a thread the scheduler has not run. */
enum { CHUNK_WORK = 1 << 16 };

/* Rows per register tile: 12 vector accumulators, so 6 rows of two-vector panels,
 * 12 of a one-vector panel (a GEMM with at most vector-width columns). */
static int64_t tile_rows(const Program *p, const PackedGemm *g) {
    return g->cols <= p->vector_floats ? ACCUMULATORS : ACCUMULATORS / 2;
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

int64_t packed_gemm_tiles(const Program *p, const PackedGemm *g) {
    int64_t nr = panel_width(p);
    int64_t mr = tile_rows(p, g);
    return g->batch * ((g->rows + mr - 1) / mr) * ((g->cols + nr - 1) / nr);
}

/* The kernel's table: `at` floats for the caller (zeros here), then B as panels,
 * for each batch item (one item when every item has the same B) panel after panel,
 * [depth][width padded]; NULL when memory runs out. */
float *packed_gemm_table(const Program *p, const PackedGemm *g, int64_t at, int64_t *bytes) {
    int64_t nr = panel_width(p), per_item = g->depth * padded(p, g->cols), items = g->b_batch ? g->batch : 1;
    *bytes = (int64_t)sizeof(float) * (at + items * per_item);
    float *table = ir_calloc((size_t)(at + items * per_item) + 1, sizeof(float));
    for (int64_t bi = 0; table && bi < items; bi++)
        for (int64_t q0 = 0; q0 < g->cols; q0 += nr) {
            int64_t width = g->cols - q0 < nr ? g->cols - q0 : nr, stride = padded(p, width);
            float *panel = table + at + bi * per_item + q0 * g->depth;
            for (int64_t kk = 0; kk < g->depth; kk++)
                for (int64_t j = 0; j < width; j++)
                    panel[kk * stride + j] = g->b[bi * g->b_batch + kk * g->b_k + (q0 + j) * g->b_q];
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

/* m's offset of index i. */
static KExpr *offset_of(KBuilder *b, const OffsetMap *m, KExpr *i) {
    KExpr *e = k_int(b, 0);
    int64_t inner = 1;
    for (int d = m->n - 1; d >= 0; d--) {
        KExpr *digit = inner > 1 ? k_div(b, i, k_int(b, inner)) : i;
        if (d > 0)
            digit = k_mod(b, digit, k_int(b, m->size[d]));
        e = k_madd(b, digit, m->stride[d], e);
        inner *= m->size[d];
    }
    return e;
}

/* Lets a_row[i] be the offset in A of row r0 + i of batch item bi, for the mr rows
 * of a tile: rows a constant stride apart from the first when they are one run,
 * else each its own digits. */
static void row_offsets(KBuilder *b, const PackedGemm *g, KExpr *bi, KExpr *r0, int64_t mr, KExpr **a_row) {
    KExpr *base = k_madd(b, bi, g->a_batch, k_int(b, g->a_at));
    const OffsetMap *m = &g->a_rows;
    if (m->n <= 1) {
        int64_t ld = m->n ? m->stride[0] : 0;
        KExpr *first = k_var(b, kb_let(b, "a_row", KT_I64, k_add(b, base, k_mul(b, r0, k_int(b, ld)))));
        for (int64_t i = 0; i < mr; i++)
            a_row[i] = k_add(b, first, k_int(b, i * ld));
        return;
    }
    for (int64_t i = 0; i < mr; i++)
        a_row[i] = k_var(b, kb_let(b, kb_name(b, "a_row", (int)i), KT_I64,
                                   k_add(b, base, offset_of(b, m, k_add(b, r0, k_int(b, i))))));
}

/* A register tile's sums while its depth runs: `sets` sets of mr x nv vector
 * variables, step kk adding into set kk % sets (more than one set when the tile's
 * rows leave accumulators free: independent chains of multiply-adds, where one
 * would wait on each add's latency), and what a step reads. */
typedef struct {
    int acc[ACCUMULATORS];
    int64_t mr, nv, sets, stride;
    KExpr *a_row[ACCUMULATORS], *panel;
    int table;
} Tile;

/* One step of the depth into set `set`: B's row kk of the panel and A's element
 * a_off of each row. */
static void depth_step(const Program *p, KBuilder *b, const PackedGemm *g, const Tile *t, KExpr *kk,
                       KExpr *a_off, int64_t set) {
    int64_t vw = p->vector_floats;
    int bv[2];
    if (t->sets > 1) /* a scope per step, whose variables have the same names */
        kb_scope(b);
    if (a_off->kind != KE_VAR && a_off->kind != KE_INT && a_off != kk)
        a_off = k_var(b, kb_let(b, "a_off", KT_I64, a_off));
    KExpr *row = k_var(b, kb_let(b, "row", KT_I64, k_madd(b, kk, t->stride, t->panel)));
    for (int64_t v = 0; v < t->nv; v++)
        bv[v] = kb_let(b, kb_name(b, "b", (int)v), KT_VF32,
                       k_vload(b, t->table, k_add(b, row, k_int(b, v * vw))));
    for (int64_t i = 0; i < t->mr; i++) {
        KExpr *a = k_var(
            b, kb_let(b, kb_name(b, "a", (int)i), KT_F32, k_load(b, g->a, k_add(b, t->a_row[i], a_off))));
        for (int64_t v = 0; v < t->nv; v++)
            kb_accum(b, t->acc[(set * t->mr + i) * t->nv + v], k_mul(b, a, k_var(b, bv[v])));
    }
    if (t->sets > 1)
        kb_end(b);
}

/* One register tile of mr rows from r0 and `width` columns from q0, of batch item
 * bi: the sums in vector variables, then through a local tile (the last panel's
 * padding left behind) to the bias and epilogue and Y; straight to Y when there is
 * neither and the tile is whole vectors wide. The depth runs as a loop per digit of
 * a_depth, the innermost (a contiguous run) unrolled, by the number of sets when
 * there are several. */
static void micro_kernel(const Program *p, KBuilder *b, const PackedGemm *g, int table, KExpr *bi, KExpr *r0,
                         KExpr *q0, int64_t mr, int64_t width) {
    int64_t vw = p->vector_floats, stride = padded(p, width), nv = stride / vw;
    KILN_ASSERT(mr * nv <= ACCUMULATORS && nv <= 2);
    OffsetMap depth = g->a_depth.n ? g->a_depth : (OffsetMap){1, {1}, {1}};
    int64_t inner = g->depth, last = depth.n - 1, run = depth.size[last];
    Tile t = {.mr = mr, .nv = nv, .stride = stride, .table = table};
    t.sets = ACCUMULATORS / (mr * nv);
    t.sets = t.sets < DEPTH_UNROLL ? t.sets : DEPTH_UNROLL;
    t.sets = t.sets < run ? t.sets : run;
    for (int64_t v = 0; v < t.sets * mr * nv; v++)
        t.acc[v] = kb_decl(b, kb_name(b, "acc", (int)v), KT_VF32, k_vsplat(b, 0));
    row_offsets(b, g, bi, r0, mr, t.a_row);
    KExpr *item = g->b_batch ? bi : k_int(b, 0);
    t.panel = k_var(b, kb_let(b, "panel", KT_I64,
                              k_madd(b, item, g->depth * padded(p, g->cols),
                                     k_add(b, k_mul(b, q0, k_int(b, g->depth)), k_int(b, g->table_at)))));
    KExpr *off = k_int(b, 0), *first_kk = k_int(b, 0);
    for (int d = 0; d < last; d++) {
        inner /= depth.size[d];
        KExpr *td =
            k_var(b, kb_for(b, kb_name(b, "t", d), KT_I64, k_int(b, 0), k_int(b, depth.size[d]), NULL, 0));
        off = k_madd(b, td, depth.stride[d], off);
        first_kk = k_madd(b, td, inner, first_kk);
    }
    /* the run in steps of `sets`, then what is left of it into the first set */
    int64_t whole = run / t.sets * t.sets;
    for (int rest = 0; rest < 2; rest++) {
        int64_t from = rest ? whole : 0, to = rest ? run : whole, by = rest ? 1 : t.sets;
        if (from == to)
            continue;
        KExpr *step = k_var(b, kb_for(b, "kk", KT_I64, k_int(b, from), k_int(b, to), k_int(b, by), 0));
        int64_t steps = (to - from) / by;
        if (by == 1)
            kb_unroll(b, steps <= 4 * DEPTH_UNROLL ? (int)steps : DEPTH_UNROLL);
        for (int64_t set = 0; set < (rest ? 1 : t.sets); set++) {
            KExpr *at = k_add(b, step, k_int(b, set));
            KExpr *a_off = k_madd(b, at, depth.stride[last], off);
            depth_step(p, b, g, &t, last ? k_add(b, first_kk, at) : at, a_off, set);
        }
        kb_end(b);
    }
    for (int d = 0; d < last; d++)
        kb_end(b);
    int acc[ACCUMULATORS];
    for (int64_t v = 0; v < mr * nv; v++) {
        acc[v] = t.acc[v];
        for (int64_t set = 1; set < t.sets; set++)
            kb_accum(b, acc[v], k_var(b, t.acc[set * mr * nv + v]));
    }
    if (stride == width && g->bias < 0 && !g->epilogue) { /* whole vectors, stored as they are */
        KExpr *y_row = k_var(b, kb_let(b, "y_row", KT_I64,
                                       k_add(b, k_madd(b, bi, g->y_batch, k_mul(b, r0, k_int(b, g->y_ld))),
                                             k_add(b, k_int(b, g->y_at), q0))));
        for (int64_t v = 0; v < mr * nv; v++)
            kb_vstore(b, g->y, k_add(b, y_row, k_int(b, v / nv * g->y_ld + v % nv * vw)), k_var(b, acc[v]));
        return;
    }
    int tile = kb_array(b, "tile", KT_F32, mr * stride, 0, false, false);
    for (int64_t v = 0; v < mr * nv; v++)
        kb_vstore(b, tile, k_int(b, v * vw), k_var(b, acc[v]));
    KExpr *i = k_var(b, kb_for(b, "ri", KT_I64, k_int(b, 0), k_int(b, mr), NULL, 0));
    KExpr *j = k_var(b, kb_for(b, "cj", KT_I64, k_int(b, 0), k_int(b, width), NULL, 0));
    kb_unroll(b, 1); /* a loop GCC vectorizes; unrolled whole first, it would stay scalar */
    KExpr *q = k_add(b, q0, j);
    KExpr *at =
        k_var(b, kb_let(b, "at", KT_I64,
                        k_add(b, k_madd(b, bi, g->y_batch, k_mul(b, k_add(b, r0, i), k_int(b, g->y_ld))),
                              k_add(b, k_int(b, g->y_at), q))));
    KExpr *x0 = k_load(b, tile, k_madd(b, i, stride, j));
    if (g->bias >= 0)
        x0 = k_add(b, x0, k_load(b, kb_value(b, g->bias, false), k_madd(b, bi, g->bias_batch, q)));
    kb_store_epilogue(b, p, g->node, g->epilogue, g->y, at, x0);
    kb_end(b);
    kb_end(b);
}

/* The tiles of the last panel (narrower) and otherwise: an if on the panel. */
static void tiles_of_row(const Program *p, KBuilder *b, const PackedGemm *g, int table, KExpr *bi, KExpr *r0,
                         KExpr *pn, int64_t mr) {
    int64_t nr = panel_width(p), panels = (g->cols + nr - 1) / nr, last = g->cols - (panels - 1) * nr;
    KExpr *q0 = k_var(b, kb_let(b, "q0", KT_I64, k_mul(b, pn, k_int(b, nr))));
    if (last == nr || panels == 1) {
        micro_kernel(p, b, g, table, bi, r0, q0, mr, last);
        return;
    }
    kb_if(b, k_lt(b, pn, k_int(b, panels - 1)));
    micro_kernel(p, b, g, table, bi, r0, q0, mr, nr);
    kb_else(b);
    micro_kernel(p, b, g, table, bi, r0, q0, mr, last);
    kb_end(b);
}

/* The tile of row tile rt and panel pn: an if on the row tile, the last one's rows
 * being what is left. */
static void tile(const Program *p, KBuilder *b, const PackedGemm *g, int table, KExpr *bi, KExpr *rt,
                 KExpr *pn) {
    int64_t mr = tile_rows(p, g), row_tiles = (g->rows + mr - 1) / mr,
            last_rows = g->rows - (row_tiles - 1) * mr;
    KExpr *r0 = k_var(b, kb_let(b, "r0", KT_I64, k_mul(b, rt, k_int(b, mr))));
    if (last_rows == mr || row_tiles == 1) {
        tiles_of_row(p, b, g, table, bi, r0, pn, last_rows);
        return;
    }
    kb_if(b, k_lt(b, rt, k_int(b, row_tiles - 1)));
    tiles_of_row(p, b, g, table, bi, r0, pn, mr);
    kb_else(b);
    tiles_of_row(p, b, g, table, bi, r0, pn, last_rows);
    kb_end(b);
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
    KBuilder *b = &k->b;
    int64_t nr = panel_width(p), panels = (g->cols + nr - 1) / nr, mr = tile_rows(p, g),
            row_tiles = (g->rows + mr - 1) / mr;
    int64_t tile_work = (g->rows < mr ? g->rows : mr) * (g->cols < nr ? g->cols : nr) * g->depth;
    k->grain = tile_work >= CHUNK_WORK ? 1 : (CHUNK_WORK + tile_work - 1) / tile_work;
    int table = kb_table(b);
    KExpr *i = k_var(b, k->iter);
    /* consecutive iterations share a panel when B is too large to stay in cache */
    bool rows_inner = (int64_t)sizeof(float) * g->depth * padded(p, g->cols) > B_IN_CACHE;
    int64_t pn_step = rows_inner ? row_tiles : 1, rt_step = rows_inner ? 1 : panels;
    KExpr *pn = k_var(b, kb_let(b, "pn", KT_I64, k_mod(b, k_div(b, i, k_int(b, pn_step)), k_int(b, panels))));
    KExpr *rt =
        k_var(b, kb_let(b, "rt", KT_I64, k_mod(b, k_div(b, i, k_int(b, rt_step)), k_int(b, row_tiles))));
    KExpr *bi = g->batch > 1 ? k_var(b, kb_let(b, "bi", KT_I64, k_div(b, i, k_int(b, panels * row_tiles))))
                             : k_int(b, 0);
    tile(p, b, g, table, bi, rt, pn);
    return 0;
}

void kb_packed_gemm_item(const Program *p, KBuilder *b, const PackedGemm *g, int table, KExpr *bi) {
    int64_t nr = panel_width(p), mr = tile_rows(p, g);
    KExpr *rt = k_var(b, kb_for(b, "rt", KT_I64, k_int(b, 0), k_int(b, (g->rows + mr - 1) / mr), NULL, 0));
    KExpr *pn = k_var(b, kb_for(b, "pn", KT_I64, k_int(b, 0), k_int(b, (g->cols + nr - 1) / nr), NULL, 0));
    tile(p, b, g, table, bi, rt, pn);
    kb_end(b);
    kb_end(b);
}
