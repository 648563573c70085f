/* attention: softmax(q k^T scale + mask) v in one kernel that never holds the scores
 * of more than a block of keys (online softmax, as FlashAttention computes it).
 *
 * An iteration takes `rows` query rows of one batch item and walks the keys in blocks
 * of at most KEY_BLOCK: the block's scores (q k^T, scaled, masked), each row's
 * running maximum m and sum l, and its output so far acc [rows, Ev]; when a block
 * raises a row's maximum from m to m', l and acc are first scaled by exp(m - m'), so
 * that at the end acc / l is the softmax-weighted sum over every key. A row whose keys
 * are all masked so far keeps m = -inf; its exps are then taken against 0 instead,
 * giving 0, so a row masked everywhere ends as 0 / 0 = NaN, as torch's softmax over
 * nothing does.
 *
 * C: up to 64 rows at a time (fewer where that leaves too few iterations for the
 * threads; the last of a batch item's may be shorter) share each block of keys, first
 * transposed into a local [E, keys] array, so that a row's scores are vector loops
 * over the keys (four steps of E each) and the output's updates vector loops over Ev
 * (four keys each), the exps a vector loop of their own. A block's maximum and sum
 * keep LANES partial results, element j in lane j % LANES, so that they vectorize
 * too. CUDA: a thread per query row, reading k where it lies. */
#include "codegen.h"

#include <math.h>

enum {
    C_ROWS = 64,
    MIN_ITERATIONS = 8, /* for the threads to share: fewer rows to reach it, */
    MIN_ROWS = 16,      /* but no fewer than this */
    LANES = 16,
    KEY_BLOCK = 64,
    PACK_MAX = 16384, /* floats of the transposed block of keys (on the stack) */
    ACC_MAX = 16384,  /* floats of the outputs a step accumulates (on the stack) */
    ATTENTION_WORK = 16384,
    UNROLL = 4, /* steps of E (scores) and keys (output) per vector loop, where they divide */
};

static KExpr *loop(KBuilder *b, const char *name, KExpr *count, unsigned flags) {
    return k_var(b, kb_for(b, name, KT_I64, k_int(b, 0), count, NULL, flags));
}

static KExpr *exp_nonpositive(KBuilder *b, KExpr *x) {
    return k_call(b, KT_F32, "kiln_expf_nonpositive", 1, &x);
}

int lower_attention(Program *p, const Node *n, Diag *d) {
    const Graph *g = p->g;
    const Type *q = &g->values[n->in[0]].type, *k = &g->values[n->in[1]].type, *v = &g->values[n->in[2]].type;
    const Type *mask = n->n_in > 3 ? &g->values[n->in[3]].type : NULL;
    int r = q->rank;
    int64_t len = q->dims[r - 2], e = q->dims[r - 1], s = k->dims[r - 2], ev = v->dims[r - 1];
    int64_t items = type_numel(q) / (len * e);
    bool cuda = p->target == TARGET_CUDA;
    int64_t rows = 1, keys = s < KEY_BLOCK ? s : KEY_BLOCK;
    if (ev > ACC_MAX)
        return diag_error(d, n->loc,
                          "attention: v's last dim is %lld; the kernel accumulates at most %d values a query",
                          (long long)ev, ACC_MAX);
    /* a block of keys transposed serves every row of the iteration */
    if (!cuda) {
        rows = len < C_ROWS ? len : C_ROWS;
        while (rows > 1 && (rows * ev > ACC_MAX ||
                            (rows > MIN_ROWS && items * ((len + rows - 1) / rows) < MIN_ITERATIONS)))
            rows /= 2;
    }
    bool pack = !cuda && e * keys <= PACK_MAX;
    int64_t blocks = (len + rows - 1) / rows, work = rows * s * (e + ev);
    Kernel *kn =
        kernel_loop(p, n, NULL, items * blocks, work >= ATTENTION_WORK ? 1 : ATTENTION_WORK / work, d);
    if (!kn)
        return -1;
    char note[96];
    snprintf(note, sizeof note, "online softmax, %lld rows x %lld keys a step", (long long)rows,
             (long long)keys);
    kernel_annotate(kn, note);
    KBuilder *b = &kn->b;
    int qs = kb_value(b, n->in[0], false), ks = kb_value(b, n->in[1], false),
        vs = kb_value(b, n->in[2], false);
    int ms = mask ? kb_value(b, n->in[3], false) : -1, ys = kb_value(b, n->out[0], true);
    KExpr *it = k_var(b, kn->iter);
    KExpr *item = let_index(b, "item", k_div(b, it, k_int(b, blocks)));
    KExpr *block_row = k_mul(b, k_mod(b, it, k_int(b, blocks)), k_int(b, rows));
    KExpr *first = let_index(b, "first", k_add(b, k_mul(b, item, k_int(b, len)), block_row));
    KExpr *rn = k_int(b, rows); /* rows this iteration */
    if (len % rows != 0) {
        KExpr *left = k_sub(b, k_int(b, len), block_row);
        rn = let_index(b, "rn", k_select(b, k_lt(b, left, k_int(b, rows)), left, k_int(b, rows)));
    }
    KExpr *k_at = let_index(b, "k_at", k_mul(b, item, k_int(b, s * e)));
    KExpr *v_at = let_index(b, "v_at", k_mul(b, item, k_int(b, s * ev)));
    KExpr *idx[KILN_MAX_RANK] = {0};
    KView mask_view = {0};
    if (mask) {
        Type batch = type_make(r - 2, q->dims), scores = *q;
        scores.dims[r - 1] = s;
        kb_unravel(b, item, &batch, "b", idx);
        mask_view = kview_broadcast(mask, &scores);
    }
    KExpr *scale = k_f32(b, attention_scale(n, q)), *minus_inf = k_f32(b, -INFINITY);
    int m = kb_array(b, "m", KT_F32, rows, 0, false, false),
        l = kb_array(b, "l", KT_F32, rows, 0, false, true);
    int acc = kb_array(b, "acc", KT_F32, rows, ev, false, true),
        sc = kb_array(b, "sc", KT_F32, keys, 0, false, false);
    int kt = pack ? kb_array(b, "kt", KT_F32, e, keys, false, false) : -1;
    KExpr *row = loop(b, "r", rn, 0);
    kb_store(b, m, row, minus_inf);
    kb_end(b);

    KExpr *j0 = k_var(b, kb_for(b, "j0", KT_I64, k_int(b, 0), k_int(b, s), k_int(b, keys), 0));
    KExpr *left = k_sub(b, k_int(b, s), j0);
    KExpr *jn = s % keys == 0
                    ? k_int(b, keys)
                    : let_index(b, "jn", k_select(b, k_lt(b, left, k_int(b, keys)), left, k_int(b, keys)));
    if (pack) {
        KExpr *jj = loop(b, "jj", jn, 0), *c = loop(b, "c", k_int(b, e), 0);
        kb_store2(b, kt, c, jj, k_load(b, ks, k_add(b, k_at, k_madd(b, k_add(b, j0, jj), e, c))), false);
        kb_end(b);
        kb_end(b);
    }
    row = loop(b, "r", rn, 0);
    KExpr *qi = let_index(b, "qi", k_add(b, first, row)),
          *i = let_index(b, "pos", k_mod(b, qi, k_int(b, len)));
    /* the block's dot products, `unroll_e` steps of E at a time */
    KExpr *jj = loop(b, "jj", jn, K_VECTOR);
    kb_store(b, sc, jj, k_f32(b, 0));
    kb_end(b);
    int64_t unroll_e = e % UNROLL == 0 ? UNROLL : 1;
    KExpr *c = k_var(b, kb_for(b, "c", KT_I64, k_int(b, 0), k_int(b, e), k_int(b, unroll_e), 0));
    KExpr *qc[UNROLL];
    for (int u = 0; u < unroll_e; u++)
        qc[u] = k_var(b, kb_let(b, kb_name(b, "q", u), KT_F32,
                                k_load(b, qs, k_add(b, k_madd(b, qi, e, c), k_int(b, u)))));
    jj = loop(b, "jj", jn, K_VECTOR);
    KExpr *dot = NULL;
    for (int u = 0; u < unroll_e; u++) {
        KExpr *cu = k_add(b, c, k_int(b, u));
        KExpr *key =
            pack ? k_load2(b, kt, cu, jj) : k_load(b, ks, k_add(b, k_at, k_madd(b, k_add(b, j0, jj), e, cu)));
        KExpr *term = k_mul(b, qc[u], key);
        dot = dot ? k_add(b, dot, term) : term;
    }
    kb_store_add(b, sc, jj, dot);
    kb_end(b);
    kb_end(b);
    /* scaled and masked, and the block's maximum: in LANES partial maxima where the
       blocks of keys are whole groups of lanes */
    bool lanes = s % keys == 0 && keys % LANES == 0;
    int top = kb_decl(b, "top", KT_F32, k_load(b, m, row)), tops = -1;
    KExpr *lane = NULL;
    if (lanes) {
        tops = kb_array(b, "tops", KT_F32, LANES, 0, false, false);
        lane = loop(b, "u", k_int(b, LANES), 0);
        kb_store(b, tops, lane, k_var(b, top));
        kb_end(b);
        KExpr *group = k_var(b, kb_for(b, "jl", KT_I64, k_int(b, 0), jn, k_int(b, LANES), 0));
        lane = loop(b, "u", k_int(b, LANES), 0);
        kb_unroll(b, LANES);
        jj = let_index(b, "jj", k_add(b, group, lane));
    } else {
        jj = loop(b, "jj", jn, 0);
    }
    KExpr *j = let_index(b, "j", k_add(b, j0, jj));
    KExpr *x = k_mul(b, k_load(b, sc, jj), scale);
    if (mask) {
        idx[r - 2] = i, idx[r - 1] = j;
        KExpr *mv = k_load(b, ms, kview_index(b, &mask_view, idx));
        x = mask->dtype == DT_BOOL ? k_select(b, mv, x, minus_inf) : k_add(b, x, mv);
    }
    if (node_bool(n, ATTR_IS_CAUSAL))
        x = k_select(b, k_bin(b, KE_GT, j, i), minus_inf, x);
    KExpr *xv = k_var(b, kb_let(b, "x", KT_F32, x));
    kb_store(b, sc, jj, xv);
    if (lanes) {
        KExpr *was = k_load(b, tops, lane);
        kb_store(b, tops, lane, k_select(b, k_bin(b, KE_GT, xv, was), xv, was));
        kb_end(b);
        kb_end(b);
        lane = loop(b, "u", k_int(b, LANES), 0);
        KExpr *t = k_load(b, tops, lane);
        kb_assign(b, top, k_select(b, k_bin(b, KE_GT, t, k_var(b, top)), t, k_var(b, top)));
    } else {
        kb_assign(b, top, k_select(b, k_bin(b, KE_GT, xv, k_var(b, top)), xv, k_var(b, top)));
    }
    kb_end(b);
    /* rescale what came before, then add the block */
    KExpr *shift =
        k_var(b, kb_let(b, "shift", KT_F32,
                        k_select(b, k_bin(b, KE_EQ, k_var(b, top), minus_inf), k_f32(b, 0), k_var(b, top))));
    KExpr *rescale =
        k_var(b, kb_let(b, "rescale", KT_F32, exp_nonpositive(b, k_sub(b, k_load(b, m, row), shift))));
    kb_store(b, m, row, k_var(b, top));
    int sum = kb_decl(b, "sum", KT_F32, k_mul(b, k_load(b, l, row), rescale));
    c = loop(b, "c", k_int(b, ev), K_VECTOR);
    kb_store2(b, acc, row, c, k_mul(b, k_load2(b, acc, row, c), rescale), false);
    kb_end(b);
    jj = loop(b, "jj", jn, K_VECTOR);
    kb_store(b, sc, jj, exp_nonpositive(b, k_sub(b, k_load(b, sc, jj), shift)));
    kb_end(b);
    if (lanes) {
        int sums = kb_array(b, "sums", KT_F32, LANES, 0, false, true);
        KExpr *group = k_var(b, kb_for(b, "jl", KT_I64, k_int(b, 0), jn, k_int(b, LANES), 0));
        lane = loop(b, "u", k_int(b, LANES), 0);
        kb_unroll(b, LANES);
        kb_store_add(b, sums, lane, k_load(b, sc, k_add(b, group, lane)));
        kb_end(b);
        kb_end(b);
        lane = loop(b, "u", k_int(b, LANES), 0);
        kb_accum(b, sum, k_load(b, sums, lane));
    } else {
        jj = loop(b, "jj", jn, 0);
        kb_accum(b, sum, k_load(b, sc, jj));
    }
    kb_end(b);
    /* acc += p v over the block, `unroll_keys` keys at a time */
    int64_t unroll_keys = s % keys == 0 && keys % UNROLL == 0 ? UNROLL : 1;
    jj = k_var(b, kb_for(b, "jj", KT_I64, k_int(b, 0), jn, k_int(b, unroll_keys), 0));
    KExpr *v_row = let_index(b, "v_row", k_add(b, v_at, k_mul(b, k_add(b, j0, jj), k_int(b, ev))));
    c = loop(b, "c", k_int(b, ev), K_VECTOR);
    KExpr *weighted = NULL;
    for (int u = 0; u < unroll_keys; u++) {
        KExpr *term = k_mul(b, k_load(b, sc, k_add(b, jj, k_int(b, u))),
                            k_load(b, vs, k_add(b, k_add(b, v_row, c), k_int(b, u * ev))));
        weighted = weighted ? k_add(b, weighted, term) : term;
    }
    kb_store2(b, acc, row, c, weighted, true);
    kb_end(b);
    kb_end(b);
    kb_store(b, l, row, k_var(b, sum));
    kb_end(b); /* rows */
    kb_end(b); /* blocks of keys */

    row = loop(b, "r", rn, 0);
    KExpr *y_row = let_index(b, "y_row", k_mul(b, k_add(b, first, row), k_int(b, ev)));
    c = loop(b, "c", k_int(b, ev), K_VECTOR);
    kb_store(b, ys, k_add(b, y_row, c), k_div(b, k_load2(b, acc, row, c), k_load(b, l, row)));
    kb_end(b);
    kb_end(b);
    return 0;
}
