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
 * transposed into a local [E, keys] array. Where the block and Ev are whole vectors,
 * the scores and the output's updates are register tiles of explicit vectors, `group`
 * rows at a time: each element of q (or probability) is broadcast against vectors of
 * keys (or of v) already in registers, so that a row of the block is read once for
 * the group, not once a row; a group past the last row repeats the last row, whose
 * copies are never stored. Elsewhere a row's scores are vector loops over the keys
 * (four steps of E each) and the output's updates vector loops over Ev (four keys
 * each). Either way, where the block is whole groups of LANES keys, a row's scores are
 * scaled and masked by a vector loop and the rest of its softmax step is
 * kiln_attention_softmax's (runtime/kernels.c), in explicit vectors: the scalar code
 * of that step, a maximum and exps in one loop, stayed scalar and took more time
 * than the two register tiles together. Elsewhere the exps are a vector loop of their
 * own. A block's maximum and sum keep LANES partial results, element j in lane
 * j % LANES, where the block is whole groups of lanes. CUDA: a thread per query row,
 * reading k where it lies. */
#include "codegen.h"

#include <math.h>
#include <string.h>

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
    MAX_GROUP = 4,
};

static KExpr *loop(KBuilder *b, const char *name, KExpr *count, unsigned flags) {
    return k_var(b, kb_for(b, name, KT_I64, k_int(b, 0), count, NULL, flags));
}

static KExpr *exp_nonpositive(KBuilder *b, KExpr *x) {
    return k_call(b, KT_F32, "kiln_expf_nonpositive", 1, &x);
}

/* What the parts of the kernel share. */
typedef struct {
    KBuilder *b;
    const Node *n;
    const Type *mask;
    int rank;
    int64_t len, e, ev, keys;
    bool lanes, causal;
    bool library; /* the softmax step is kiln_attention_softmax's */
    double scale;
    int qs, ks, vs, ms;
    int m, l, acc, sc, kt; /* local arrays: acc [rows * ev], sc [group * keys], kt [e * keys] */
    KView mask_view;
    KExpr *idx[KILN_MAX_RANK]; /* the batch item's multi-index, for the mask */
    KExpr *j0, *jn;            /* the block of keys: its first, and how many */
    KExpr *first, *rn;         /* the iteration's first row of q, and its count of rows */
    bool past_last;            /* a tile may reach past the iteration's last row */
    KExpr *k_at, *v_at;        /* the batch item's first element of k and of v */
} Att;

/* The row of q that row `row` of the iteration reads: past the last row, the last
 * (computed again, never stored). */
static KExpr *q_row(Att *a, KExpr *row) {
    KBuilder *b = a->b;
    if (!a->past_last)
        return k_add(b, a->first, row);
    KExpr *last = k_sub(b, a->rn, k_int(b, 1));
    return k_add(b, a->first, k_select(b, k_lt(b, row, a->rn), row, last));
}

/* max(x, was) as the scores take it: a NaN score is not a maximum */
static KExpr *larger(KBuilder *b, KExpr *x, KExpr *was) {
    return k_select(b, k_bin(b, KE_GT, x, was), x, was);
}

/* The score sc[at + jj] of key j0 + jj for the row at position pos, scaled and
 * masked. */
static KExpr *masked_score(Att *a, KExpr *at, KExpr *jj, KExpr *pos) {
    KBuilder *b = a->b;
    KExpr *minus_inf = k_f32(b, -INFINITY);
    KExpr *j = let_index(b, "j", k_add(b, a->j0, jj));
    KExpr *x = k_mul(b, k_load(b, a->sc, k_add(b, at, jj)), k_f32(b, a->scale));
    if (a->mask) {
        a->idx[a->rank - 2] = pos, a->idx[a->rank - 1] = j;
        KExpr *mv = k_load(b, a->ms, kview_index(b, &a->mask_view, a->idx));
        x = a->mask->dtype == DT_BOOL ? k_select(b, mv, x, minus_inf) : k_add(b, x, mv);
    }
    if (a->causal)
        x = k_select(b, k_bin(b, KE_GT, j, pos), minus_inf, x);
    return x;
}

/* For the row `row` at position pos of its sequence, whose block of raw scores is
 * sc[at..at + jn): the scores scaled and masked, the row's new maximum, its sum and
 * output so far rescaled to it, and the scores' exps against it, added to the sum.
 * On C, where the block is whole groups of lanes, the scores are masked by a vector
 * loop and the rest is kiln_attention_softmax's (runtime/kernels.c), in vectors. */
static void block_softmax(Att *a, KExpr *row, KExpr *at, KExpr *pos) {
    KBuilder *b = a->b;
    if (a->library) {
        KExpr *jj = loop(b, "jj", a->jn, K_VECTOR);
        kb_store(b, a->sc, k_add(b, at, jj), masked_score(a, at, jj, pos));
        kb_end(b);
        kb_call(b, "kiln_attention_softmax", 6,
                (KExpr *[]){k_addr(b, a->sc, at), a->jn, k_addr(b, a->m, row), k_addr(b, a->l, row),
                            k_addr(b, a->acc, k_mul(b, row, k_int(b, a->ev))), k_int(b, a->ev)});
        return;
    }
    KExpr *minus_inf = k_f32(b, -INFINITY), *jj, *lane = NULL;
    int top = kb_decl(b, "top", KT_F32, k_load(b, a->m, row)), tops = -1;
    if (a->lanes) {
        tops = kb_array(b, "tops", KT_F32, LANES, 0, false, false);
        lane = loop(b, "u", k_int(b, LANES), 0);
        kb_store(b, tops, lane, k_var(b, top));
        kb_end(b);
        KExpr *group = k_var(b, kb_for(b, "jl", KT_I64, k_int(b, 0), a->jn, k_int(b, LANES), 0));
        lane = loop(b, "u", k_int(b, LANES), 0);
        kb_unroll(b, LANES);
        jj = let_index(b, "jj", k_add(b, group, lane));
    } else {
        jj = loop(b, "jj", a->jn, 0);
    }
    KExpr *xv = k_var(b, kb_let(b, "x", KT_F32, masked_score(a, at, jj, pos)));
    kb_store(b, a->sc, k_add(b, at, jj), xv);
    if (a->lanes) {
        kb_store(b, tops, lane, larger(b, xv, k_load(b, tops, lane)));
        kb_end(b);
        kb_end(b);
        lane = loop(b, "u", k_int(b, LANES), 0);
        kb_assign(b, top, larger(b, k_load(b, tops, lane), k_var(b, top)));
    } else {
        kb_assign(b, top, larger(b, xv, k_var(b, top)));
    }
    kb_end(b);
    KExpr *shift =
        k_var(b, kb_let(b, "shift", KT_F32,
                        k_select(b, k_bin(b, KE_EQ, k_var(b, top), minus_inf), k_f32(b, 0), k_var(b, top))));
    KExpr *rescale =
        k_var(b, kb_let(b, "rescale", KT_F32, exp_nonpositive(b, k_sub(b, k_load(b, a->m, row), shift))));
    kb_store(b, a->m, row, k_var(b, top));
    int sum = kb_decl(b, "sum", KT_F32, k_mul(b, k_load(b, a->l, row), rescale));
    KExpr *c = loop(b, "c", k_int(b, a->ev), K_VECTOR), *out = k_madd(b, row, a->ev, c);
    kb_store(b, a->acc, out, k_mul(b, k_load(b, a->acc, out), rescale));
    kb_end(b);
    jj = loop(b, "jj", a->jn, K_VECTOR);
    kb_store(b, a->sc, k_add(b, at, jj),
             exp_nonpositive(b, k_sub(b, k_load(b, a->sc, k_add(b, at, jj)), shift)));
    kb_end(b);
    if (a->lanes) {
        int sums = kb_array(b, "sums", KT_F32, LANES, 0, false, true);
        KExpr *group = k_var(b, kb_for(b, "jl", KT_I64, k_int(b, 0), a->jn, k_int(b, LANES), 0));
        lane = loop(b, "u", k_int(b, LANES), 0);
        kb_unroll(b, LANES);
        kb_store_add(b, sums, lane, k_load(b, a->sc, k_add(b, at, k_add(b, group, lane))));
        kb_end(b);
        kb_end(b);
        lane = loop(b, "u", k_int(b, LANES), 0);
        kb_accum(b, sum, k_load(b, sums, lane));
    } else {
        jj = loop(b, "jj", a->jn, 0);
        kb_accum(b, sum, k_load(b, a->sc, k_add(b, at, jj)));
    }
    kb_end(b);
    kb_store(b, a->l, row, k_var(b, sum));
}

/* The block's scores of the row at qi of q, into sc[0..jn): vector loops over the
 * keys, `unroll_e` steps of E each. */
static void row_scores(Att *a, KExpr *qi) {
    KBuilder *b = a->b;
    KExpr *jj = loop(b, "jj", a->jn, K_VECTOR);
    kb_store(b, a->sc, jj, k_f32(b, 0));
    kb_end(b);
    int64_t unroll_e = a->e % UNROLL == 0 ? UNROLL : 1;
    KExpr *c = k_var(b, kb_for(b, "c", KT_I64, k_int(b, 0), k_int(b, a->e), k_int(b, unroll_e), 0));
    KExpr *qc[UNROLL];
    for (int u = 0; u < unroll_e; u++)
        qc[u] = k_var(b, kb_let(b, kb_name(b, "q", u), KT_F32,
                                k_load(b, a->qs, k_add(b, k_madd(b, qi, a->e, c), k_int(b, u)))));
    jj = loop(b, "jj", a->jn, K_VECTOR);
    KExpr *dot = NULL;
    for (int u = 0; u < unroll_e; u++) {
        KExpr *cu = k_add(b, c, k_int(b, u));
        KExpr *key = a->kt >= 0
                         ? k_load(b, a->kt, k_madd(b, cu, a->keys, jj))
                         : k_load(b, a->ks, k_add(b, a->k_at, k_madd(b, k_add(b, a->j0, jj), a->e, cu)));
        KExpr *term = k_mul(b, qc[u], key);
        dot = dot ? k_add(b, dot, term) : term;
    }
    kb_store_add(b, a->sc, jj, dot);
    kb_end(b);
    kb_end(b);
}

/* acc[row] += p v over the block, p in sc[0..jn): vector loops over Ev,
 * `unroll_keys` keys each. */
static void row_update(Att *a, KExpr *row, int64_t unroll_keys) {
    KBuilder *b = a->b;
    KExpr *jj = k_var(b, kb_for(b, "jj", KT_I64, k_int(b, 0), a->jn, k_int(b, unroll_keys), 0));
    KExpr *v_row = let_index(b, "v_row", k_add(b, a->v_at, k_mul(b, k_add(b, a->j0, jj), k_int(b, a->ev))));
    KExpr *c = loop(b, "c", k_int(b, a->ev), K_VECTOR);
    KExpr *weighted = NULL;
    for (int u = 0; u < unroll_keys; u++) {
        KExpr *term = k_mul(b, k_load(b, a->sc, k_add(b, jj, k_int(b, u))),
                            k_load(b, a->vs, k_add(b, k_add(b, v_row, c), k_int(b, u * a->ev))));
        weighted = weighted ? k_add(b, weighted, term) : term;
    }
    kb_store_add(b, a->acc, k_madd(b, row, a->ev, c), weighted);
    kb_end(b);
    kb_end(b);
}

/* Rows r0..r0 + group of the block as register tiles of vf-float vectors: their
 * scores, each row's softmax step, then their outputs' updates. */
static void group_step(Att *a, KExpr *r0, int group, int64_t vf) {
    KBuilder *b = a->b;
    int64_t nk = a->keys / vf, nv = a->ev / vf;
    int tile[MAX_GROUP * MAX_GROUP * LANES], in[MAX_GROUP * LANES];
    KExpr *qi[MAX_GROUP];
    for (int u = 0; u < group; u++)
        qi[u] = let_index(b, kb_name(b, "qi", u), q_row(a, k_add(b, r0, k_int(b, u))));
    /* scores: a vector of keys from each of the block's rows of kt, times each row's
       element of q */
    for (int t = 0; t < group * nk; t++)
        tile[t] = kb_decl(b, kb_name(b, "s", t), KT_VF32, k_vsplat(b, 0));
    KExpr *c = loop(b, "c", k_int(b, a->e), 0);
    for (int t = 0; t < nk; t++)
        in[t] = kb_let(b, kb_name(b, "kv", t), KT_VF32,
                       k_vload(b, a->kt, k_madd(b, c, a->keys, k_int(b, t * vf))));
    for (int u = 0; u < group; u++) {
        KExpr *x =
            k_var(b, kb_let(b, kb_name(b, "qv", u), KT_F32, k_load(b, a->qs, k_madd(b, qi[u], a->e, c))));
        for (int t = 0; t < nk; t++) {
            int acc = tile[u * nk + t];
            kb_assign(b, acc, k_add(b, k_var(b, acc), k_mul(b, x, k_var(b, in[t]))));
        }
    }
    kb_end(b);
    for (int u = 0; u < group; u++)
        for (int t = 0; t < nk; t++)
            kb_vstore(b, a->sc, k_int(b, u * a->keys + t * vf), k_var(b, tile[u * nk + t]));
    KExpr *member = loop(b, "g", k_int(b, group), 0);
    KExpr *row = let_index(b, "row", k_add(b, r0, member));
    KExpr *pos = let_index(b, "pos", k_mod(b, q_row(a, row), k_int(b, a->len)));
    block_softmax(a, row, k_mul(b, member, k_int(b, a->keys)), pos);
    kb_end(b);
    /* outputs: a vector of v from each of the block's rows, times each row's
       probability */
    for (int u = 0; u < group; u++)
        for (int t = 0; t < nv; t++)
            tile[u * nv + t] =
                kb_decl(b, kb_name(b, "o", u * (int)nv + t), KT_VF32,
                        k_vload(b, a->acc, k_madd(b, k_add(b, r0, k_int(b, u)), a->ev, k_int(b, t * vf))));
    KExpr *jj = loop(b, "jj", a->jn, 0);
    KExpr *v_row = let_index(b, "v_row", k_madd(b, k_add(b, a->j0, jj), a->ev, a->v_at));
    for (int t = 0; t < nv; t++)
        in[t] = kb_let(b, kb_name(b, "vv", t), KT_VF32, k_vload(b, a->vs, k_add(b, v_row, k_int(b, t * vf))));
    for (int u = 0; u < group; u++) {
        KExpr *w = k_var(
            b, kb_let(b, kb_name(b, "pv", u), KT_F32, k_load(b, a->sc, k_madd(b, k_int(b, u), a->keys, jj))));
        for (int t = 0; t < nv; t++) {
            int acc = tile[u * nv + t];
            kb_assign(b, acc, k_add(b, k_var(b, acc), k_mul(b, w, k_var(b, in[t]))));
        }
    }
    kb_end(b);
    for (int u = 0; u < group; u++)
        for (int t = 0; t < nv; t++)
            kb_vstore(b, a->acc, k_madd(b, k_add(b, r0, k_int(b, u)), a->ev, k_int(b, t * vf)),
                      k_var(b, tile[u * nv + t]));
}

/* Rows in register tiles of how many at a time: 0 where the block of keys or Ev is
 * not whole vectors, or a tile would not fit the registers. */
static int tile_rows(const Program *p, int64_t rows, int64_t s, int64_t keys, int64_t ev, bool pack) {
    int64_t vf = p->vector_floats;
    if (!pack || vf < 4 || s % keys != 0 || keys % vf != 0 || ev % vf != 0)
        return 0;
    int64_t registers = vf >= 16 ? 16 : 8; /* accumulators a tile may take */
    int64_t widest = keys > ev ? keys / vf : ev / vf, group = registers / widest;
    if (group > MAX_GROUP)
        group = MAX_GROUP;
    if (group > rows)
        group = rows;
    return (int)group;
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
    int group = tile_rows(p, rows, s, keys, ev, pack);
    int64_t tiled_rows = group ? (rows + group - 1) / group * group : rows; /* rows of m, l and acc */
    int64_t blocks = (len + rows - 1) / rows, work = rows * s * (e + ev);
    Kernel *kn =
        kernel_loop(p, n, NULL, items * blocks, work >= ATTENTION_WORK ? 1 : ATTENTION_WORK / work, d);
    if (!kn)
        return -1;
    kernel_follows(p, kn, &g->values[n->out[0]].type, kn->count, 1, 1); /* item by item */
    char note[128];
    snprintf(note, sizeof note, "online softmax, %lld rows x %lld keys a step", (long long)rows,
             (long long)keys);
    if (group)
        snprintf(note + strlen(note), sizeof note - strlen(note), ", tiles of %d rows", group);
    kernel_annotate(kn, note);
    KBuilder *b = &kn->b;
    bool lanes = s % keys == 0 && keys % LANES == 0;
    Att a = {.b = b,
             .n = n,
             .mask = mask,
             .rank = r,
             .len = len,
             .e = e,
             .ev = ev,
             .keys = keys,
             .lanes = lanes,
             .library = lanes && !cuda,
             .causal = node_bool(n, ATTR_IS_CAUSAL),
             .scale = attention_scale(n, q),
             .qs = kb_value(b, n->in[0], false),
             .ks = kb_value(b, n->in[1], false),
             .vs = kb_value(b, n->in[2], false),
             .ms = mask ? kb_value(b, n->in[3], false) : -1,
             .past_last = len % rows != 0 || tiled_rows != rows};
    int ys = kb_value(b, n->out[0], true);
    KExpr *it = k_var(b, kn->iter);
    KExpr *item = let_index(b, "item", k_div(b, it, k_int(b, blocks)));
    KExpr *block_row = k_mul(b, k_mod(b, it, k_int(b, blocks)), k_int(b, rows));
    a.first = let_index(b, "first", k_add(b, k_mul(b, item, k_int(b, len)), block_row));
    a.rn = k_int(b, rows);
    if (len % rows != 0) {
        KExpr *left = k_sub(b, k_int(b, len), block_row);
        a.rn = let_index(b, "rn", k_select(b, k_lt(b, left, k_int(b, rows)), left, k_int(b, rows)));
    }
    a.k_at = let_index(b, "k_at", k_mul(b, item, k_int(b, s * e)));
    a.v_at = let_index(b, "v_at", k_mul(b, item, k_int(b, s * ev)));
    if (mask) {
        Type batch = type_make(r - 2, q->dims), scores = *q;
        scores.dims[r - 1] = s;
        kb_unravel(b, item, &batch, "b", a.idx);
        a.mask_view = kview_broadcast(mask, &scores);
    }
    a.m = kb_array(b, "m", KT_F32, tiled_rows, 0, false, false);
    a.l = kb_array(b, "l", KT_F32, tiled_rows, 0, false, true);
    a.acc = kb_array(b, "acc", KT_F32, tiled_rows * ev, 0, false, true);
    a.sc = kb_array(b, "sc", KT_F32, (group ? group : 1) * keys, 0, false, false);
    a.kt = pack ? kb_array(b, "kt", KT_F32, e * keys, 0, false, false) : -1;
    KExpr *row = loop(b, "r", k_int(b, tiled_rows), 0);
    kb_store(b, a.m, row, k_f32(b, -INFINITY));
    kb_end(b);

    a.j0 = k_var(b, kb_for(b, "j0", KT_I64, k_int(b, 0), k_int(b, s), k_int(b, keys), 0));
    KExpr *left = k_sub(b, k_int(b, s), a.j0);
    a.jn = s % keys == 0
               ? k_int(b, keys)
               : let_index(b, "jn", k_select(b, k_lt(b, left, k_int(b, keys)), left, k_int(b, keys)));
    if (pack) {
        KExpr *jj = loop(b, "jj", a.jn, 0), *c = loop(b, "c", k_int(b, e), 0);
        kb_store(b, a.kt, k_madd(b, c, keys, jj),
                 k_load(b, a.ks, k_add(b, a.k_at, k_madd(b, k_add(b, a.j0, jj), e, c))));
        kb_end(b);
        kb_end(b);
    }
    if (group) {
        KExpr *r0 = k_var(b, kb_for(b, "r0", KT_I64, k_int(b, 0), a.rn, k_int(b, group), 0));
        group_step(&a, r0, group, p->vector_floats);
    } else {
        row = loop(b, "r", a.rn, 0);
        KExpr *qi = let_index(b, "qi", k_add(b, a.first, row));
        row_scores(&a, qi);
        block_softmax(&a, row, k_int(b, 0), let_index(b, "pos", k_mod(b, qi, k_int(b, len))));
        row_update(&a, row, s % keys == 0 && keys % UNROLL == 0 ? UNROLL : 1);
    }
    kb_end(b); /* rows */
    kb_end(b); /* blocks of keys */

    row = loop(b, "r", a.rn, 0);
    KExpr *y_row = let_index(b, "y_row", k_mul(b, k_add(b, a.first, row), k_int(b, ev)));
    KExpr *c = loop(b, "c", k_int(b, ev), K_VECTOR);
    kb_store(b, ys, k_add(b, y_row, c),
             k_div(b, k_load(b, a.acc, k_madd(b, row, ev, c)), k_load(b, a.l, row)));
    kb_end(b);
    kb_end(b);
    return 0;
}
