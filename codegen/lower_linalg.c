/* Lowering of matmul, gemm and linear: for the C target, each is one CALL kernel
 * around cblas_sgemm; for CUDA, one K_GEMM kernel (each *_gemm function). A linear
 * whose weights are known now is a GEMM on them packed (lower_packed.c).
 *
 * matmul follows numpy as ir/op_linalg.c does: a 1-D a is the row [1, K] and a 1-D
 * b the column [K, 1], and the dims before the last two broadcast. One sgemm runs
 * per item of the broadcast batch, in a loop whose item i finds its matrices of a
 * and b through constant strides (0 along a broadcast dim); when b is one matrix
 * shared by the whole batch and a is a dense stack, the batch folds into the rows of
 * a single sgemm. gemm's trans_a and trans_b are sgemm's own flags; its c, broadcast
 * to the result, is written first as beta * c and sgemm adds alpha op(a) op(b) to
 * it. linear is x, as [prod(leading dims), in], times w transposed, then the bias
 * added row by row; fused_linear computes its epilogue in that same loop, each
 * element finished as the bias reaches it. Each kernel counts its FLOPs, 2 M N K per
 * GEMM, for kiln bench. */
#include "codegen.h"
#include "../ir/ops_impl.h"

#include <limits.h>
#include <string.h>

enum { GEMV_ROWS = 128, TILE_ROWS = 64 };

static Kernel *new_call(Program *p, const Node *n, Diag *d) {
    Kernel *k = kernel_new(p, n, K_CALL, "sgemm");
    if (!k) {
        diag_error(d, n->loc, "out of memory");
        return NULL;
    }
    for (int i = 0; i < n->n_in; i++)
        if (n->in[i] >= 0)
            kernel_reads(k, n->in[i]);
    kernel_writes(k, n->out[0]);
    return k;
}

/* ---- matmul ---- */

/* An operand of matmul as a stack of matrices: a 1-D a is a row, a 1-D b a column. */
static Type as_matrices(const Type *t, bool is_b) {
    if (t->rank != 1)
        return *t;
    int64_t dims[2] = {is_b ? t->dims[0] : 1, is_b ? 1 : t->dims[0]};
    return type_make(2, dims);
}

/* Where batch item (b0, ...) of the stack t, broadcast to batch, starts; `matrix`
 * elements per item. */
static KExpr *batch_offset(KBuilder *b, const Type *t, const Type *batch, int64_t matrix, KExpr *const *idx) {
    KView v = kview_broadcast(t, batch);
    for (int j = 0; j < v.rank; j++)
        v.strides[j] *= matrix;
    return kview_index(b, &v, idx);
}

static KExpr *ints(KBuilder *b, int64_t v) {
    return k_i32(b, v);
}

/* `count` things of value type t, which go through its symbolic dim in order: at
 * run time, as many as the dim's size needs; of type `type` (KT_I64, or KT_I32
 * for BLAS's sizes). */
static KExpr *at_size(const Program *p, KBuilder *b, const Type *t, int64_t count, KType type) {
    int64_t bound = p->g->sym.bound;
    if (!t->sym || count % bound)
        return type == KT_I32 ? ints(b, count) : k_int(b, count);
    return k_cast(b, type, k_mul(b, k_sym_size(b), k_int(b, count / bound)));
}

void kb_sgemm(KBuilder *b, bool ta, bool tb, KExpr *m, KExpr *n, int64_t depth, KExpr *alpha, KExpr *a,
              int64_t lda, KExpr *bm, int64_t ldb, KExpr *beta, KExpr *c, int64_t ldc) {
    KExpr *args[] = {k_symbol(b, "CblasRowMajor"),
                     k_symbol(b, ta ? "CblasTrans" : "CblasNoTrans"),
                     k_symbol(b, tb ? "CblasTrans" : "CblasNoTrans"),
                     m,
                     n,
                     k_i32(b, depth),
                     alpha,
                     a,
                     k_i32(b, lda),
                     bm,
                     k_i32(b, ldb),
                     beta,
                     c,
                     k_i32(b, ldc)};
    kb_call(b, "cblas_sgemm", 14, args);
}

/* cblas_sgemm and cblas_sgemv take int sizes and leading dimensions: a larger one
 * would be converted to a wrong int in the generated call. */
static int blas_too_large(const Node *n, long long m, long long cols, long long depth, Diag *d) {
    if (m <= INT_MAX && cols <= INT_MAX && depth <= INT_MAX)
        return 0;
    return diag_error(d, n->loc, "%s: a GEMM of %lld x %lld x %lld is too large for BLAS",
                      op_table[n->op].name, m, cols, depth);
}

/* matmul as one K_GEMM kernel, batch item bi at its offsets in a, b and y. */
static int matmul_gemm(Program *p, const Node *n, const Type *ba, const Type *bb, const Type *batch,
                       long long count, long long m_len, long long n_len, long long k_len, Diag *d) {
    Kernel *k = kernel_gemm(p, n, NULL, count, m_len, n_len, k_len, d);
    if (!k)
        return -1;
    gemm_follows(p, k, &p->g->values[n->out[0]].type, count > 1); /* y is [batch, M, N] */
    KBuilder *b = &k->b;
    KExpr *bi = k_var(b, k->gemm.bi), *r = k_var(b, k->gemm.r), *q = k_var(b, k->gemm.q),
          *kk = k_var(b, k->gemm.kk);
    KExpr *idx[KILN_MAX_RANK];
    for (int side = 0; side < 2; side++) {
        kb_begin_block(b);
        KExpr *at = k_int(b, 0);
        if (count > 1) {
            kb_unravel(b, bi, batch, "b", idx);
            at = side == 0 ? batch_offset(b, ba, batch, m_len * k_len, idx)
                           : batch_offset(b, bb, batch, k_len * n_len, idx);
        }
        KExpr *in_matrix = side == 0 ? k_madd(b, r, k_len, kk) : k_madd(b, kk, n_len, q);
        kb_assign(b, k->gemm.v, k_load(b, kb_value(b, n->in[side], false), k_add(b, in_matrix, at)));
        if (side == 0)
            k->load_a = kb_take(b);
        else
            k->load_b = kb_take(b);
    }
    k->a_depth_inner = true;
    kb_begin_block(b);
    kb_gemm_store(k, p, n, NULL, NULL, k_madd(b, k_madd(b, bi, m_len, r), n_len, q));
    k->store = kb_take(b);
    return 0;
}

int lower_matmul(Program *p, const Node *n, Diag *d) {
    Type ma = as_matrices(&p->g->values[n->in[0]].type, false);
    Type mb = as_matrices(&p->g->values[n->in[1]].type, true);
    Type ba = type_make(ma.rank - 2, ma.dims), bb = type_make(mb.rank - 2, mb.dims), batch;
    broadcast_types(&ba, &bb, &batch);
    long long m_len = ma.dims[ma.rank - 2], k_len = ma.dims[ma.rank - 1], n_len = mb.dims[mb.rank - 1];
    long long count = type_numel(&batch);
    /* b shared by a dense stack of a: the stack is one tall matrix */
    if (type_numel(&bb) == 1 && type_equal(&ba, &batch)) {
        m_len *= count;
        count = 1;
    }
    if (!p->blas)
        return matmul_gemm(p, n, &ba, &bb, &batch, count, m_len, n_len, k_len, d);
    if (blas_too_large(n, m_len, n_len, k_len, d))
        return -1;
    Kernel *k = new_call(p, n, d);
    if (!k)
        return -1;
    k->flops = lower_flops(5, (int64_t[]){2, count, m_len, n_len, k_len});
    KBuilder *b = &k->b;
    int a = kb_value(b, n->in[0], false), bm = kb_value(b, n->in[1], false), y = kb_value(b, n->out[0], true);
    const Type *yt = &p->g->values[n->out[0]].type;
    KExpr *at_a = k_int(b, 0), *at_b = k_int(b, 0), *at_y = k_int(b, 0);
    KExpr *rows = count > 1 ? ints(b, m_len) : at_size(p, b, yt, m_len, KT_I32);
    if (count > 1) {
        /* the result's dropped dims have size 1, so it is laid out as [batch, M, N] */
        KExpr *i = k_var(b, kb_for(b, "i", KT_I64, k_int(b, 0), at_size(p, b, yt, count, KT_I64), NULL, 0)),
              *idx[KILN_MAX_RANK];
        kb_unravel(b, i, &batch, "b", idx);
        at_a = batch_offset(b, &ba, &batch, m_len * k_len, idx);
        at_b = batch_offset(b, &bb, &batch, k_len * n_len, idx);
        at_y = k_mul(b, i, k_int(b, m_len * n_len));
    }
    kb_sgemm(b, false, false, rows, ints(b, n_len), k_len, k_f32(b, 1), k_addr(b, a, at_a), k_len,
             k_addr(b, bm, at_b), n_len, k_f32(b, 0), k_addr(b, y, at_y), n_len);
    if (count > 1)
        kb_end(b);
    return 0;
}

/* ---- gemm ---- */

/* Where gemm's c, broadcast to y, has y's element i. */
static KExpr *c_offset(KBuilder *b, const Type *ct, const Type *yt, KExpr *i) {
    if (type_numel(ct) == 1)
        return k_int(b, 0);
    if (type_equal(ct, yt))
        return i;
    KExpr *o[KILN_MAX_RANK];
    kb_unravel(b, i, yt, "o", o);
    KView v = kview_broadcast(ct, yt);
    return kview_index(b, &v, o);
}

/* gemm as a K_GEMM kernel: y = alpha op(a) op(b) + beta c, c broadcast. */
static int gemm_gemm(Program *p, const Node *n, double alpha, double beta, Diag *d) {
    const Type *at = &p->g->values[n->in[0]].type, *bt = &p->g->values[n->in[1]].type;
    const Type *yt = &p->g->values[n->out[0]].type;
    bool ta = node_bool(n, ATTR_TRANS_A), tb = node_bool(n, ATTR_TRANS_B);
    int c = n->n_in > 2 ? n->in[2] : -1;
    Kernel *k = kernel_gemm(p, n, NULL, 1, yt->dims[0], yt->dims[1], at->dims[!ta], d);
    if (!k)
        return -1;
    gemm_follows(p, k, yt, false);
    KBuilder *b = &k->b;
    KExpr *r = k_var(b, k->gemm.r), *q = k_var(b, k->gemm.q), *kk = k_var(b, k->gemm.kk);
    kb_begin_block(b);
    kb_assign(b, k->gemm.v,
              k_load(b, kb_value(b, n->in[0], false),
                     ta ? k_madd(b, kk, at->dims[1], r) : k_madd(b, r, at->dims[1], kk)));
    k->load_a = kb_take(b);
    kb_begin_block(b);
    kb_assign(b, k->gemm.v,
              k_load(b, kb_value(b, n->in[1], false),
                     tb ? k_madd(b, q, bt->dims[1], kk) : k_madd(b, kk, bt->dims[1], q)));
    k->load_b = kb_take(b);
    k->a_depth_inner = !ta;
    k->b_depth_inner = tb;
    kb_begin_block(b);
    KExpr *i = k_var(b, kb_let(b, "at", KT_I64, k_madd(b, r, yt->dims[1], q)));
    KExpr *y = k_mul(b, k_f32(b, alpha), k_var(b, k->gemm.acc));
    if (c >= 0) {
        KExpr *off = c_offset(b, &p->g->values[c].type, yt, i);
        y = k_add(b, y, k_mul(b, k_f32(b, beta), k_load(b, kb_value(b, c, false), off)));
    }
    kb_store(b, kb_value(b, n->out[0], true), i, y);
    k->store = kb_take(b);
    return 0;
}

int lower_gemm(Program *p, const Node *n, Diag *d) {
    const Type *at = &p->g->values[n->in[0]].type, *bt = &p->g->values[n->in[1]].type;
    const Type *yt = &p->g->values[n->out[0]].type;
    bool ta = node_bool(n, ATTR_TRANS_A), tb = node_bool(n, ATTR_TRANS_B);
    int c = n->n_in > 2 ? n->in[2] : -1;
    double alpha = node_float(n, ATTR_ALPHA), beta = node_float(n, ATTR_BETA);
    if (!p->blas)
        return gemm_gemm(p, n, alpha, beta, d);
    if (blas_too_large(n, yt->dims[0], yt->dims[1], at->dims[!ta], d))
        return -1;
    Kernel *k = new_call(p, n, d);
    if (!k)
        return -1;
    KBuilder *b = &k->b;
    int y = kb_value(b, n->out[0], true);
    if (c >= 0) {
        /* y = beta * c broadcast, which sgemm then adds to */
        KExpr *i =
            k_var(b, kb_for(b, "i", KT_I64, k_int(b, 0), at_size(p, b, yt, type_numel(yt), KT_I64), NULL, 0));
        KExpr *cv = k_load(b, kb_value(b, c, false), c_offset(b, &p->g->values[c].type, yt, i));
        kb_store(b, y, i, beta != 1 ? k_mul(b, k_f32(b, beta), cv) : cv);
        kb_end(b);
    }
    k->flops = lower_flops(4, (int64_t[]){2, yt->dims[0], yt->dims[1], at->dims[!ta]});
    kb_sgemm(b, ta, tb, at_size(p, b, yt, yt->dims[0], KT_I32), ints(b, yt->dims[1]), at->dims[!ta],
             k_f32(b, alpha), k_addr(b, kb_value(b, n->in[0], false), k_int(b, 0)), at->dims[1],
             k_addr(b, kb_value(b, n->in[1], false), k_int(b, 0)), bt->dims[1], k_f32(b, c >= 0 ? 1 : 0),
             k_addr(b, y, k_int(b, 0)), yt->dims[1]);
    return 0;
}

/* ---- linear ---- */

/* linear (and fused_linear) as a K_GEMM kernel: x [rows, in] times w [out, in]
 * transposed, each element finished with the bias and the epilogue. */
static int linear_gemm(Program *p, const Node *n, long long rows, long long in_len, long long out_len,
                       Diag *d) {
    Arena arena = {0};
    const Expr *epilogue = NULL;
    if (n->op == OP_FUSED_LINEAR && !(epilogue = node_expr(&arena, n, d)))
        return -1;
    Kernel *k = kernel_gemm(p, n, NULL, 1, rows, out_len, in_len, d);
    if (k) {
        gemm_follows(p, k, &p->g->values[n->out[0]].type, false);
        KBuilder *b = &k->b;
        KExpr *r = k_var(b, k->gemm.r), *q = k_var(b, k->gemm.q), *kk = k_var(b, k->gemm.kk);
        for (int side = 0; side < 2; side++) {
            kb_begin_block(b);
            kb_assign(b, k->gemm.v,
                      k_load(b, kb_value(b, n->in[side], false), k_madd(b, side ? q : r, in_len, kk)));
            if (side == 0)
                k->load_a = kb_take(b);
            else
                k->load_b = kb_take(b);
        }
        k->a_depth_inner = k->b_depth_inner = true;
        kb_begin_block(b);
        bool biased = n->n_in > 2 && n->in[2] >= 0;
        kb_gemm_store(k, p, n, epilogue, biased ? k_load(b, kb_value(b, n->in[2], false), q) : NULL,
                      k_madd(b, r, out_len, q));
        k->store = kb_take(b);
        if (epilogue)
            kernel_annotate(k, node_attr(n, ATTR_EXPR)->s);
    }
    arena_free(&arena);
    return k ? 0 : -1;
}

static KExpr *gemv_bias_at(KBuilder *b, KExpr *r, KExpr *q, const void *ctx) {
    (void)r;
    return k_add(b, k_var(b, *(const int *)ctx), q);
}

static KExpr *gemm_bias_at(KBuilder *b, KExpr *r, KExpr *q, const void *ctx) {
    (void)b, (void)r, (void)ctx;
    return q;
}

/* The layout pass's transpose back to channels first, [N, C, spatial...] of
 * [N, spatial..., C], that linear node n reads flattened to [N, C x spatial] and
 * nothing else reads: n then reads the channels-last input, its weights' columns
 * packed in that order, and the transpose computes nothing (a CNN's classifier
 * after its last pool). NULL otherwise. */
static const Node *flattened_transpose(const Program *p, const Node *n) {
    int x = n->in[0], src = p->view_of ? p->view_of[x] : -1;
    const Graph *g = p->g;
    if (src < 0 || g->values[src].node < 0 || g->values[x].node < 0 || p->uses[x] != 1 || p->uses[src] != 1 ||
        p->buf[n->in[1]].kind != BUF_WEIGHT || p->vector_floats <= 0)
        return NULL;
    const Node *t = g->nodes[g->values[src].node], *view = g->nodes[g->values[x].node];
    if (view->in[0] != src) /* a view of a view: the one between may have readers */
        return NULL;
    const Type *xt = &g->values[x].type, *st = &g->values[src].type;
    if (t->op != OP_TRANSPOSE || xt->rank != 2 || st->rank < 3 || xt->dims[0] != st->dims[0])
        return NULL;
    const Attr *perm = node_attr(t, ATTR_PERM);
    int rank = st->rank;
    bool to_first = perm->set && perm->n == rank && perm->ints[0] == 0 && perm->ints[1] == rank - 1;
    for (int j = 2; to_first && j < rank; j++)
        to_first = perm->ints[j] == j - 1;
    return to_first ? t : NULL;
}

bool transpose_feeds_linear(const Program *p, const Node *t) {
    for (int i = 0; i < p->g->n_nodes; i++) {
        const Node *n = p->g->nodes[i];
        if ((n->op == OP_LINEAR || n->op == OP_FUSED_LINEAR) && flattened_transpose(p, n) == t)
            return true;
    }
    return false;
}

/* linear on weights known now: x [rows, in] times w^T packed (lower_packed.c), the
 * bias and epilogue applied to each register tile. */
static int packed_linear(Program *p, const Node *n, int64_t rows, int64_t in_len, int64_t out_len, Diag *d) {
    Arena arena = {0};
    PackedGemm g = {.batch = 1,
                    .rows = rows,
                    .cols = out_len,
                    .depth = in_len,
                    .bias = n->n_in > 2 ? n->in[2] : -1,
                    .a_rows = {1, {rows}, {in_len}},
                    .a_depth = {1, {in_len}, {1}},
                    .y_ld = out_len,
                    .b = (const float *)(p->weights + p->buf[n->in[1]].offset),
                    .b_depth = {1, {in_len}, {1}},
                    .b_q = in_len,
                    .node = n};
    const Node *t = flattened_transpose(p, n);
    if (t) { /* depth step (position, channel) of the channels-last input is w's column (channel, position) */
        const Type *st = &p->g->values[t->out[0]].type;
        int64_t channels = st->dims[1], positions = in_len / channels;
        g.b_depth = (OffsetMap){0};
        offset_digit(&g.b_depth, positions, 1);
        offset_digit(&g.b_depth, channels, positions);
    }
    if (n->op == OP_FUSED_LINEAR && !(g.epilogue = node_expr(&arena, n, d)))
        return -1;
    Kernel *k = kernel_loop(p, n, "packed_gemm", packed_gemm_tiles(p, &g), 1, d);
    int rc = -1;
    if (k && t) {
        kernel_unread(k, n->in[0]);
        kernel_reads(k, t->in[0]);
    }
    if (k) {
        k->flops = lower_flops(4, (int64_t[]){2, rows, out_len, in_len});
        g.a = kb_value(&k->b, t ? t->in[0] : n->in[0], false);
        g.y = kb_value(&k->b, n->out[0], true);
        rc = kb_packed_gemm(p, k, &g, d);
        if (!rc && g.epilogue)
            kernel_annotate(k, node_attr(n, ATTR_EXPR)->s);
    }
    arena_free(&arena);
    return rc;
}

int lower_linear(Program *p, const Node *n, Diag *d) {
    const Type *x = &p->g->values[n->in[0]].type, *w = &p->g->values[n->in[1]].type;
    long long rows = 1, in_len = w->dims[1], out_len = w->dims[0];
    for (int i = 0; i < x->rank - 1; i++)
        rows *= x->dims[i];
    int bias = n->n_in > 2 ? n->in[2] : -1;
    if (p->vector_floats > 0 && p->buf[n->in[1]].kind == BUF_WEIGHT)
        return packed_linear(p, n, rows, in_len, out_len, d);
    if (!p->blas)
        return linear_gemm(p, n, rows, in_len, out_len, d);
    if (blas_too_large(n, 1, out_len, in_len, d))
        return -1;
    /* one row (batch 1): a matrix-vector product, in chunks of outputs the pool runs
       in parallel, each at the speed of reading its part of w; more rows: a GEMM per
       tile of rows, also in parallel, each tile finished (bias, epilogue) while it
       is in cache */
    bool gemv = rows == 1;
    long long chunk =
        gemv ? (out_len < GEMV_ROWS ? out_len : GEMV_ROWS) : (rows < TILE_ROWS ? rows : TILE_ROWS);
    long long count = ((gemv ? out_len : rows) + chunk - 1) / chunk;
    Arena arena = {0};
    const Expr *epilogue = NULL;
    if (n->op == OP_FUSED_LINEAR && !(epilogue = node_expr(&arena, n, d)))
        return -1;
    Kernel *k = kernel_loop(p, n, gemv ? "sgemv" : "sgemm", count, 1, d);
    if (!k) {
        arena_free(&arena);
        return -1;
    }
    if (!gemv)
        kernel_follows(p, k, &p->g->values[n->out[0]].type, rows, chunk, 1); /* tile by tile */
    KBuilder *b = &k->b;
    int xb = kb_value(b, n->in[0], false), wb = kb_value(b, n->in[1], false),
        y = kb_value(b, n->out[0], true);
    k->flops = lower_flops(4, (int64_t[]){2, rows, out_len, in_len});
    long long total = gemv ? out_len : rows;
    int r0 = kb_let(b, "r0", KT_I64, k_mul(b, k_var(b, k->iter), k_int(b, chunk)));
    KExpr *left = k_sub(b, k_int(b, total), k_var(b, r0));
    int m = kb_let(b, "m", KT_I32,
                   k_select(b, k_lt(b, left, k_int(b, chunk)), k_cast(b, KT_I32, left), k_i32(b, chunk)));
    if (gemv) {
        KExpr *args[] = {k_symbol(b, "CblasRowMajor"),
                         k_symbol(b, "CblasNoTrans"),
                         k_var(b, m),
                         ints(b, in_len),
                         k_f32(b, 1),
                         k_addr(b, wb, k_mul(b, k_var(b, r0), k_int(b, in_len))),
                         ints(b, in_len),
                         k_addr(b, xb, k_int(b, 0)),
                         ints(b, 1),
                         k_f32(b, 0),
                         k_addr(b, y, k_var(b, r0)),
                         ints(b, 1)};
        kb_call(b, "cblas_sgemv", 12, args);
    } else
        kb_sgemm(b, false, true, k_var(b, m), ints(b, out_len), in_len, k_f32(b, 1),
                 k_addr(b, xb, k_mul(b, k_var(b, r0), k_int(b, in_len))), in_len, k_addr(b, wb, k_int(b, 0)),
                 in_len, k_f32(b, 0), k_addr(b, y, k_mul(b, k_var(b, r0), k_int(b, out_len))), out_len);
    /* the bias and the epilogue on the chunk of outputs, or the tile of rows */
    KExpr *tile_at = gemv ? k_var(b, r0) : k_mul(b, k_var(b, r0), k_int(b, out_len));
    KExpr *mm = k_cast(b, KT_I64, k_var(b, m));
    kb_tile_epilogue(b, p, n, epilogue, bias, gemv ? gemv_bias_at : gemm_bias_at, &r0, y, tile_at,
                     gemv ? k_int(b, 1) : mm, gemv ? mm : k_int(b, out_len), out_len, 1);
    if (epilogue)
        kernel_annotate(k, node_attr(n, ATTR_EXPR)->s);
    arena_free(&arena);
    return 0;
}
