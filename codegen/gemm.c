/* The schedules of a K_GEMM kernel: its loads and store (kernel_gemm) placed in
 * loops for the target, as kernel IR.
 *
 * C, where there is no BLAS: one iteration per row of a batch item's result, each
 * element a dot product of A's row and B's column as the lowering loads them.
 *
 * CUDA: a tiled GEMM. Each block of GEMM_BLOCK threads computes a 64 x 64 tile of
 * one batch item's product, staging 16-deep slices of A and B in shared memory
 * (A(r, kk) for 64 rows, B(kk, q) for 64 columns, loaded along whichever index is
 * contiguous in memory, so that neighbouring threads read neighbouring floats),
 * each thread accumulating a 4 x 4 grid of elements 16 apart in registers (a
 * register-blocked micro-kernel), then storing each element through the lowering's
 * store (bias, epilogue). Grid: x the row tiles, y the column tiles, z the batch;
 * a shared row of 65 floats keeps staging along kk free of bank conflicts. */
#include "codegen.h"

enum { TILE = GEMM_TILE, TILE_DEPTH = 16, MICRO = 4, SPREAD = TILE / MICRO };

static void c_schedule(Kernel *k) {
    KBuilder *b = &k->b;
    int i = kb_for(b, "i", KT_I64, k_int(b, 0), k_int(b, k->batch * k->m), NULL, K_PARALLEL);
    kb_let_var(b, k->gemm.bi, k_div(b, k_var(b, i), k_int(b, k->m)));
    kb_let_var(b, k->gemm.r, k_mod(b, k_var(b, i), k_int(b, k->m)));
    kb_for_var(b, k->gemm.q, k_int(b, 0), k_int(b, k->n), NULL, 0);
    kb_decl_var(b, k->gemm.acc, k_f32(b, 0));
    kb_for_var(b, k->gemm.kk, k_int(b, 0), k_int(b, k->depth), NULL, 0);
    kb_decl_var(b, k->gemm.v, k_f32(b, 0));
    kb_scope(b); /* each load's variables in a scope of their own */
    kb_splice(b, k->load_a);
    kb_end(b);
    int a = kb_let(b, "a", KT_F32, k_var(b, k->gemm.v));
    kb_scope(b);
    kb_splice(b, k->load_b);
    kb_end(b);
    kb_accum(b, k->gemm.acc, k_mul(b, k_var(b, a), k_var(b, k->gemm.v)));
    kb_end(b);
    kb_splice(b, k->store);
    kb_end(b);
    kb_end(b);
}

/* The loop staging a 16-deep slice of an operand in shared memory: `tile` gets
 * element (index, kk) at [kk - tile_k][index - base], zero outside the matrix. */
static void stage(Kernel *k, int tile, int index, int base, int tile_k, int64_t extent, bool depth_inner,
                  const KStmt *load) {
    KBuilder *b = &k->b;
    int l = kb_for(b, "l", KT_I32, k_special(b, K_THREAD_X), k_i32(b, TILE * TILE_DEPTH),
                   k_i32(b, GEMM_BLOCK), 0);
    KExpr *lv = k_var(b, l);
    /* consecutive threads read consecutive kk where A(.., kk) is contiguous */
    int kl = kb_let(b, "kl", KT_I32,
                    depth_inner ? k_mod(b, lv, k_i32(b, TILE_DEPTH)) : k_div(b, lv, k_i32(b, TILE)));
    int il = kb_let(b, "il", KT_I32,
                    depth_inner ? k_div(b, lv, k_i32(b, TILE_DEPTH)) : k_mod(b, lv, k_i32(b, TILE)));
    kb_let_var(b, index, k_add(b, k_var(b, base), k_cast(b, KT_I64, k_var(b, il))));
    kb_let_var(b, k->gemm.kk, k_add(b, k_var(b, tile_k), k_cast(b, KT_I64, k_var(b, kl))));
    kb_decl_var(b, k->gemm.v, k_f32(b, 0));
    kb_if(b, k_and(b, k_lt(b, k_var(b, index), k_int(b, extent)),
                   k_lt(b, k_var(b, k->gemm.kk), k_int(b, k->depth))));
    kb_splice(b, load);
    kb_end(b);
    kb_store2(b, tile, k_var(b, kl), k_var(b, il), k_var(b, k->gemm.v), false);
    kb_end(b);
}

static void cuda_schedule(Kernel *k) {
    KBuilder *b = &k->b;
    int tile_a = kb_array(b, "tile_a", KT_F32, TILE_DEPTH, TILE + 1, true, false);
    int tile_b = kb_array(b, "tile_b", KT_F32, TILE_DEPTH, TILE + 1, true, false);
    kb_let_var(b, k->gemm.bi, k_cast(b, KT_I64, k_special(b, K_BLOCK_Z)));
    int tile_r =
        kb_let(b, "tile_r", KT_I64, k_mul(b, k_cast(b, KT_I64, k_special(b, K_BLOCK_X)), k_int(b, TILE)));
    int tile_q =
        kb_let(b, "tile_q", KT_I64, k_mul(b, k_cast(b, KT_I64, k_special(b, K_BLOCK_Y)), k_int(b, TILE)));
    int tx = kb_let(b, "tx", KT_I32, k_mod(b, k_special(b, K_THREAD_X), k_i32(b, SPREAD)));
    int ty = kb_let(b, "ty", KT_I32, k_div(b, k_special(b, K_THREAD_X), k_i32(b, SPREAD)));
    int sums = kb_array(b, "sums", KT_F32, MICRO, MICRO, false, true);
    int tile_k = kb_for(b, "tile_k", KT_I64, k_int(b, 0), k_int(b, k->depth), k_int(b, TILE_DEPTH), 0);
    stage(k, tile_a, k->gemm.r, tile_r, tile_k, k->m, k->a_depth_inner, k->load_a);
    stage(k, tile_b, k->gemm.q, tile_q, tile_k, k->n, k->b_depth_inner, k->load_b);
    kb_barrier(b);
    int kl = kb_for(b, "kl", KT_I32, k_i32(b, 0), k_i32(b, TILE_DEPTH), NULL, 0);
    int a = kb_array(b, "a", KT_F32, MICRO, 0, false, false);
    int bb = kb_array(b, "b", KT_F32, MICRO, 0, false, false);
    int u = kb_for(b, "u", KT_I32, k_i32(b, 0), k_i32(b, MICRO), NULL, 0);
    KExpr *spread_u = k_mul(b, k_i32(b, SPREAD), k_var(b, u));
    kb_store(b, a, k_var(b, u), k_load2(b, tile_a, k_var(b, kl), k_add(b, k_var(b, ty), spread_u)));
    kb_store(b, bb, k_var(b, u), k_load2(b, tile_b, k_var(b, kl), k_add(b, k_var(b, tx), spread_u)));
    kb_end(b);
    u = kb_for(b, "u", KT_I32, k_i32(b, 0), k_i32(b, MICRO), NULL, 0);
    int w = kb_for(b, "w", KT_I32, k_i32(b, 0), k_i32(b, MICRO), NULL, 0);
    kb_store2(b, sums, k_var(b, u), k_var(b, w),
              k_mul(b, k_load(b, a, k_var(b, u)), k_load(b, bb, k_var(b, w))), true);
    kb_end(b);
    kb_end(b);
    kb_end(b); /* kl */
    kb_barrier(b);
    kb_end(b); /* tile_k */
    u = kb_for(b, "u", KT_I32, k_i32(b, 0), k_i32(b, MICRO), NULL, 0);
    w = kb_for(b, "w", KT_I32, k_i32(b, 0), k_i32(b, MICRO), NULL, 0);
    KExpr *row = k_add(b, k_var(b, ty), k_mul(b, k_i32(b, SPREAD), k_var(b, u)));
    KExpr *col = k_add(b, k_var(b, tx), k_mul(b, k_i32(b, SPREAD), k_var(b, w)));
    kb_let_var(b, k->gemm.r, k_add(b, k_var(b, tile_r), k_cast(b, KT_I64, row)));
    kb_let_var(b, k->gemm.q, k_add(b, k_var(b, tile_q), k_cast(b, KT_I64, col)));
    kb_if(b, k_and(b, k_lt(b, k_var(b, k->gemm.r), k_int(b, k->m)),
                   k_lt(b, k_var(b, k->gemm.q), k_int(b, k->n))));
    kb_let_var(b, k->gemm.acc, k_load2(b, sums, k_var(b, u), k_var(b, w)));
    kb_splice(b, k->store);
    kb_end(b);
    kb_end(b);
    kb_end(b);
}

void gemm_schedule(const Program *p, Kernel *k) {
    if (p->target == TARGET_CUDA)
        cuda_schedule(k);
    else
        c_schedule(k);
}
