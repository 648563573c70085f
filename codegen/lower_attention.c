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
 * reading k where it lies. On either target, q, k and v are read, and the result
 * stored, through strides where the slices and transposes that split heads out of
 * a qkv projection and merge them back would only copy them (below). */
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

/* An operand of the kernel where it lies: in buffer `buf`, a batch item's elements
 * from `at` on, its rows `row` apart (its last dim contiguous). */
typedef struct {
    int buf;
    KExpr *at;
    int64_t row;
} Operand;

/* What the parts of the kernel share. */
typedef struct {
    KBuilder *b;
    const Node *n;
    const Type *mask;
    int rank;
    int64_t e, ev, keys;
    bool lanes, causal;
    bool library; /* the softmax step is kiln_attention_softmax's */
    double scale;
    Operand q, k, v;
    int ms;
    int m, l, acc, sc, kt; /* local arrays: acc [rows * ev], sc [group * keys], kt [e * keys] */
    KView mask_view;
    KExpr *idx[KILN_MAX_RANK]; /* the batch item's multi-index, for the mask */
    KExpr *j0, *jn;            /* the block of keys: its first, and how many */
    KExpr *first, *rn;         /* the iteration's first row of q in its item, and its count of rows */
    bool past_last;            /* a tile may reach past the iteration's last row */
} Att;

/* Element c of row `row` of a batch item's operand o. */
static KExpr *element(KBuilder *b, const Operand *o, KExpr *row, KExpr *c) {
    return k_add(b, o->at, k_add(b, k_mul(b, row, k_int(b, o->row)), c));
}

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
                                k_load(b, a->q.buf, element(b, &a->q, qi, k_add(b, c, k_int(b, u))))));
    jj = loop(b, "jj", a->jn, K_VECTOR);
    KExpr *dot = NULL;
    for (int u = 0; u < unroll_e; u++) {
        KExpr *cu = k_add(b, c, k_int(b, u));
        KExpr *key = a->kt >= 0 ? k_load(b, a->kt, k_madd(b, cu, a->keys, jj))
                                : k_load(b, a->k.buf, element(b, &a->k, k_add(b, a->j0, jj), cu));
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
    KExpr *v_row = let_index(b, "v_row", element(b, &a->v, k_add(b, a->j0, jj), k_int(b, 0)));
    KExpr *c = loop(b, "c", k_int(b, a->ev), K_VECTOR);
    KExpr *weighted = NULL;
    for (int u = 0; u < unroll_keys; u++) {
        KExpr *term = k_mul(b, k_load(b, a->sc, k_add(b, jj, k_int(b, u))),
                            k_load(b, a->v.buf, k_add(b, k_add(b, v_row, c), k_int(b, u * a->v.row))));
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
        KExpr *x = k_var(
            b, kb_let(b, kb_name(b, "qv", u), KT_F32, k_load(b, a->q.buf, element(b, &a->q, qi[u], c))));
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
    block_softmax(a, row, k_mul(b, member, k_int(b, a->keys)), let_index(b, "pos", q_row(a, row)));
    kb_end(b);
    /* outputs: a vector of v from each of the block's rows, times each row's
       probability */
    for (int u = 0; u < group; u++)
        for (int t = 0; t < nv; t++)
            tile[u * nv + t] =
                kb_decl(b, kb_name(b, "o", u * (int)nv + t), KT_VF32,
                        k_vload(b, a->acc, k_madd(b, k_add(b, r0, k_int(b, u)), a->ev, k_int(b, t * vf))));
    KExpr *jj = loop(b, "jj", a->jn, 0);
    KExpr *v_row = let_index(b, "v_row", element(b, &a->v, k_add(b, a->j0, jj), k_int(b, 0)));
    for (int t = 0; t < nv; t++)
        in[t] =
            kb_let(b, kb_name(b, "vv", t), KT_VF32, k_vload(b, a->v.buf, k_add(b, v_row, k_int(b, t * vf))));
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

/* ---- Reading and writing in place ----
 *
 * Transformers split the qkv projection's result into heads by slices, reshapes and
 * transposes, and merge attention's result back by a transpose and a reshape: each
 * slice and transpose a copy, 7 a layer of BERT. Where only the attention reads what
 * such a chain computes, it reads the chain's first input through strides instead
 * (kview_through), and the chain's transposes and slices compute nothing; where
 * only a transpose that keeps the last dim reads its result, it stores into that
 * transpose's result, which then computes nothing. Either needs the operand's rows
 * contiguous, for the vector loads along them. */

enum { MAX_CHAIN = 8 };

typedef struct {
    int value;                    /* the value whose buffer holds the operand */
    KView view;                   /* the operand's dims and strides in it */
    const Node *nodes[MAX_CHAIN]; /* the transposes, slices and views read through */
    int n;
} InPlace;

static bool rows_contiguous(const KView *v) {
    return v->dims[v->rank - 1] == 1 || v->strides[v->rank - 1] == 1;
}

/* Where attention node a's operand x lies: at the start of the longest chain of
 * transposes, slices and views ending at x, whose every result only the next node
 * reads, that leaves x a strided view with contiguous rows; else x itself. */
static InPlace read_in_place(const Program *p, const Node *a, int x) {
    const Graph *g = p->g;
    InPlace in = {.value = x, .view = kview_of(&g->values[x].type)};
    const Node *chain[MAX_CHAIN];
    int n = 0;
    for (int v = x; p->view_of && !g->values[a->out[0]].type.sym && n < MAX_CHAIN && p->uses[v] == 1 &&
                    p->buf[v].kind == BUF_NONE && g->values[v].node >= 0;) {
        const Node *d = g->nodes[g->values[v].node];
        bool view = op_has(d->op, F_VIEW) && p->view_of[v] >= 0;
        if (!view && d->op != OP_TRANSPOSE && d->op != OP_SLICE)
            break;
        chain[n++] = d;
        v = d->in[0];
    }
    for (int m = n; m > 0; m--) {
        int from = chain[m - 1]->in[0], k = m - 1;
        KView view = kview_of(&g->values[from].type);
        while (k >= 0 && kview_through(p, chain[k], &view))
            k--;
        if (k < 0 && rows_contiguous(&view)) {
            in.value = from, in.view = view, in.n = m;
            memcpy(in.nodes, chain, sizeof *chain * (size_t)m);
            return in;
        }
    }
    return in;
}

/* The transpose whose result attention node a stores in place of its own, or NULL. */
static const Node *write_in_place(const Program *p, const Node *a) {
    const Graph *g = p->g;
    int y = a->out[0];
    if (!p->view_of || g->values[y].type.sym || p->uses[y] != 1 || p->buf[y].kind != BUF_NONE)
        return NULL;
    for (int i = 0; i < g->n_nodes; i++) {
        const Node *t = g->nodes[i];
        if (t->op != OP_TRANSPOSE || t->in[0] != y)
            continue;
        const Attr *perm = node_attr(t, ATTR_PERM);
        int r = g->values[y].type.rank;
        return perm->set && perm->ints[r - 1] == r - 1 ? t : NULL;
    }
    return NULL;
}

/* Attention's result as a view of the transpose t's result. */
static KView written_view(const Program *p, const Node *t) {
    const Type *y = &p->g->values[t->in[0]].type;
    KView to = kview_of(&p->g->values[t->out[0]].type), v = kview_of(y);
    const Attr *perm = node_attr(t, ATTR_PERM);
    for (int j = 0; j < y->rank; j++) /* t's dim j is y's dim perm[j] */
        v.strides[perm->ints[j]] = to.strides[j];
    return v;
}

bool attention_absorbs(const Program *p, const Node *t) {
    const Graph *g = p->g;
    if (!p->view_of)
        return false;
    for (int i = 0; i < g->n_nodes; i++) {
        const Node *a = g->nodes[i];
        if (a->op != OP_ATTENTION)
            continue;
        if (write_in_place(p, a) == t)
            return true;
        for (int k = 0; k < 3; k++) {
            InPlace in = read_in_place(p, a, a->in[k]);
            for (int j = 0; j < in.n; j++)
                if (in.nodes[j] == t)
                    return true;
        }
    }
    return false;
}

/* Operand k of the kernel: where it lies, its batch item's first element at the
 * multi-index idx of the batch dims. */
static Operand operand(KBuilder *b, int value, const KView *view, bool writable, KExpr *const *idx,
                       const char *name) {
    KView batch = *view;
    batch.rank -= 2;
    return (Operand){.buf = kb_value(b, value, writable),
                     .at = let_index(b, name, kview_index(b, &batch, idx)),
                     .row = view->strides[view->rank - 2]};
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
    InPlace in[3];
    const char *names[4] = {"q", "k", "v", "the result"}, *at_names[3] = {"q_at", "k_at", "v_at"};
    for (int j = 0; j < 3; j++)
        in[j] = read_in_place(p, n, n->in[j]);
    const Node *t = write_in_place(p, n);
    char note[160];
    snprintf(note, sizeof note, "online softmax, %lld rows x %lld keys a step", (long long)rows,
             (long long)keys);
    if (group)
        snprintf(note + strlen(note), sizeof note - strlen(note), ", tiles of %d rows", group);
    const char *sep = "; in place: ";
    for (int j = 0; j < 4; j++)
        if (j < 3 ? in[j].n > 0 : t != NULL) {
            snprintf(note + strlen(note), sizeof note - strlen(note), "%s%s", sep, names[j]);
            sep = ", ";
        }
    kernel_annotate(kn, note);
    KBuilder *b = &kn->b;
    bool lanes = s % keys == 0 && keys % LANES == 0;
    Att a = {.b = b,
             .n = n,
             .mask = mask,
             .rank = r,
             .e = e,
             .ev = ev,
             .keys = keys,
             .lanes = lanes,
             .library = lanes && !cuda,
             .causal = node_bool(n, ATTR_IS_CAUSAL),
             .scale = attention_scale(n, q),
             .ms = mask ? kb_value(b, n->in[3], false) : -1,
             .past_last = len % rows != 0 || tiled_rows != rows};
    KExpr *it = k_var(b, kn->iter);
    KExpr *item = let_index(b, "item", k_div(b, it, k_int(b, blocks)));
    Type batch = type_make(r - 2, q->dims);
    kb_unravel(b, item, &batch, "b", a.idx);
    Operand *operands[3] = {&a.q, &a.k, &a.v};
    for (int j = 0; j < 3; j++) {
        if (in[j].value != n->in[j]) {
            kernel_unread(kn, n->in[j]);
            kernel_reads(kn, in[j].value);
        }
        *operands[j] = operand(b, in[j].value, &in[j].view, false, a.idx, at_names[j]);
    }
    if (t)
        kn->writes[0] = t->out[0];
    KView y_view = t ? written_view(p, t) : kview_of(&g->values[n->out[0]].type);
    Operand y = operand(b, t ? t->out[0] : n->out[0], &y_view, true, a.idx, "y_at");
    a.first = let_index(b, "first", k_mul(b, k_mod(b, it, k_int(b, blocks)), k_int(b, rows)));
    a.rn = k_int(b, rows);
    if (len % rows != 0) {
        KExpr *left = k_sub(b, k_int(b, len), a.first);
        a.rn = let_index(b, "rn", k_select(b, k_lt(b, left, k_int(b, rows)), left, k_int(b, rows)));
    }
    if (mask) {
        Type scores = *q;
        scores.dims[r - 1] = s;
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
                 k_load(b, a.k.buf, element(b, &a.k, k_add(b, a.j0, jj), c)));
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
        block_softmax(&a, row, k_int(b, 0), qi);
        row_update(&a, row, s % keys == 0 && keys % UNROLL == 0 ? UNROLL : 1);
    }
    kb_end(b); /* rows */
    kb_end(b); /* blocks of keys */

    row = loop(b, "r", a.rn, 0);
    KExpr *y_row = let_index(b, "y_row", element(b, &y, k_add(b, a.first, row), k_int(b, 0)));
    KExpr *c = loop(b, "c", k_int(b, ev), K_VECTOR);
    kb_store(b, y.buf, k_add(b, y_row, c),
             k_div(b, k_load(b, a.acc, k_madd(b, row, ev, c)), k_load(b, a.l, row)));
    kb_end(b);
    kb_end(b);
    return 0;
}
