/* fuse_attention: scaled dot-product attention written with matmul and softmax, as
 * models and their ONNX exports write it, becomes one `attention`, whose kernel never
 * materializes the score matrix.
 *
 *   matmul(softmax(s, axis=-1), v), where s is
 *       matmul(q, kt)                   scale 1
 *       mul(matmul(q, kt), c)           scale c   (either operand order)
 *       div(matmul(q, kt), c)           scale 1 / c
 *     each optionally followed by add(., mask) (either order), mask f32, or by
 *     where(mask, ., fill), mask bool, broadcasting to the scores without widening
 *     them, and fill -inf or, where mask is a known constant with a true in every
 *     row, a known scalar at most -1e30 (PyTorch's masked_fill with finfo.min)
 *   ->  attention(q, k, v, mask?, scale)
 * where c is a known scalar and k is kt with its last two dims swapped back (one
 * transpose, composed with kt's own when kt is a transpose, or none). Every value
 * from the first matmul to the softmax must be read by the next op alone, and q, k
 * and v must have the shapes attention takes ([..., L, E], [..., S, E], [..., S,
 * Ev], one batch). The attention takes over the last matmul's value, so names and
 * outputs stay.
 *
 * Why it is correct: attention(q, k, v, mask, scale) is defined as softmax(q k^T
 * scale + mask) v along the last axis, a bool mask standing for 0 where true and
 * -inf where false; the pattern computes exactly that, except that a division by c
 * becomes a product by 1 / c (within a rounding of the scores). A finite fill gives
 * the masked scores exp(fill - max) = 0 (as -inf does) unless every kept score of a
 * row is below -1e30 + 88, and no row is masked everywhere (where a fill would give
 * uniform weights and -inf NaN). */
#include "passes.h"

#include <math.h>
#include <string.h>

/* What the pattern found, from the last matmul back. */
typedef struct {
    int q, kt, v, mask;
    double scale;
    int dead[5], n_dead; /* the nodes it replaces, besides the last matmul */
} Match;

/* s = [mul or div by a known scalar of] matmul(q, kt), each value read once. */
static bool match_scores(PassContext *c, int s, const int *uses, Match *m, int *rc) {
    Graph *g = c->g;
    Node *scale = pass_definer(g, s);
    if (scale && uses[s] == 1 && (scale->op == OP_MUL || scale->op == OP_DIV)) {
        int k = 0;
        double value;
        if (scale->op == OP_MUL && pass_known_scalar(c, scale->in[0], &value, rc))
            k = 1;
        else if (*rc || !pass_known_scalar(c, scale->in[1], &value, rc))
            return false;
        m->scale = scale->op == OP_DIV ? 1 / value : value;
        m->dead[m->n_dead++] = g->values[s].node;
        s = scale->in[k];
    }
    Node *mm = pass_single_use(g, uses, s, OP_MATMUL);
    if (!mm)
        return false;
    m->dead[m->n_dead++] = g->values[s].node;
    m->q = mm->in[0], m->kt = mm->in[1];
    return true;
}

/* Whether where(mask, s, fill) masks the scores s as attention's bool mask does:
 * fill -inf, or at most -1e30 with mask a known constant that keeps a score in every
 * row. */
static bool masks_as_attention(PassContext *c, int mask, int fill_value, int *rc) {
    double fill;
    if (!pass_known_scalar(c, fill_value, &fill, rc) || fill > -1e30)
        return false;
    if (fill == -INFINITY)
        return true;
    Tensor *t = NULL;
    int known = pass_known_value(c, mask, &t);
    if (known < 0)
        *rc = -1;
    bool kept_everywhere = known == 1 && t->type.rank > 0;
    int64_t len = kept_everywhere ? t->type.dims[t->type.rank - 1] : 1;
    int64_t numel = kept_everywhere ? type_numel(&t->type) : 0;
    for (int64_t row = 0; kept_everywhere && row < numel; row += len) {
        bool kept = false;
        for (int64_t j = 0; j < len && !kept; j++)
            kept = t->b[row + j] != 0;
        kept_everywhere = kept;
    }
    tensor_free(t);
    return kept_everywhere;
}

/* s = where(mask, scores, fill) as a bool mask of attention's: the scores' match. */
static bool match_where(PassContext *c, int s, const int *uses, Match *m, int *rc) {
    Graph *g = c->g;
    Node *where = pass_single_use(g, uses, s, OP_WHERE);
    if (!where || g->values[where->in[0]].type.dtype != DT_BOOL ||
        !type_equal(&g->values[where->in[1]].type, &g->values[s].type) ||
        !masks_as_attention(c, where->in[0], where->in[2], rc))
        return false;
    Match with_mask = *m;
    with_mask.dead[with_mask.n_dead++] = g->values[s].node;
    with_mask.mask = where->in[0];
    if (!match_scores(c, where->in[1], uses, &with_mask, rc))
        return false;
    *m = with_mask;
    return true;
}

static bool match(PassContext *c, const Node *last, const int *uses, Match *m, int *rc) {
    Graph *g = c->g;
    Node *sm = pass_single_use(g, uses, last->in[0], OP_SOFTMAX);
    int rank = g->values[last->in[0]].type.rank;
    if (!sm || (node_int(sm, ATTR_AXIS) != -1 && node_int(sm, ATTR_AXIS) != rank - 1))
        return false;
    *m = (Match){.v = last->in[1], .mask = -1, .scale = 1};
    m->dead[m->n_dead++] = g->values[sm->out[0]].node;
    int s = sm->in[0];
    Node *add = pass_single_use(g, uses, s, OP_ADD);
    bool found = false;
    for (int k = 0; add && k < 2 && !found && !*rc; k++) {
        const Type *mask = &g->values[add->in[1 - k]].type;
        Match with_mask = *m;
        with_mask.dead[with_mask.n_dead++] = g->values[s].node;
        with_mask.mask = add->in[1 - k];
        if (mask->dtype == DT_F32 && type_equal(&g->values[add->in[k]].type, &g->values[s].type) &&
            match_scores(c, add->in[k], uses, &with_mask, rc))
            *m = with_mask, found = true;
    }
    if (!add && !(found = match_where(c, s, uses, m, rc)) && !*rc &&
        !(found = match_scores(c, s, uses, m, rc)))
        return false;
    if (!found || *rc)
        return false;
    /* the shapes attention takes: one rank, one batch, f32 */
    const Type *q = &g->values[m->q].type, *kt = &g->values[m->kt].type, *v = &g->values[m->v].type;
    int r = q->rank;
    if (r < 2 || kt->rank != r || v->rank != r || v->dims[r - 2] != kt->dims[r - 1])
        return false;
    for (int i = 0; i < r - 2; i++)
        if (kt->dims[i] != q->dims[i] || v->dims[i] != q->dims[i])
            return false;
    return true;
}

static int fuse(PassContext *c, int last_index, const Match *m, const int *uses, bool *dead) {
    Graph *g = c->g;
    Node *last = g->nodes[last_index];
    /* k is kt with its last two dims swapped back: through kt's own transpose, when
       it is one, composed into one transpose (or none) */
    int k = m->kt, rank = g->values[k].type.rank;
    int64_t perm[KILN_MAX_RANK];
    for (int i = 0; i < rank; i++)
        perm[i] = i;
    Node *t = pass_definer(g, k);
    if (t && t->op == OP_TRANSPOSE) {
        if (node_has(t, ATTR_PERM))
            node_ints(t, ATTR_PERM, perm, KILN_MAX_RANK, rank);
        else
            for (int i = 0; i < rank; i++)
                perm[i] = rank - 1 - i; /* an unset perm reverses the dims */
        k = t->in[0];
        if (uses[m->kt] == 1)
            dead[g->values[m->kt].node] = true;
    }
    int64_t swap = perm[rank - 2];
    perm[rank - 2] = perm[rank - 1], perm[rank - 1] = swap;
    bool identity = true;
    for (int i = 0; i < rank; i++)
        identity = identity && perm[i] == i;
    if (!identity) {
        char base[256];
        snprintf(base, sizeof base, "%s.k", g->values[m->kt].name);
        Node *tn = pass_new_node(c, OP_TRANSPOSE, 1, &k, base, last->loc);
        if (!tn || pass_set_ints(c, tn, ATTR_PERM, perm, rank) || (k = pass_finish(c, tn)) < 0)
            return -1;
    }
    int in[4] = {m->q, k, m->v, m->mask};
    Node *a = graph_add_node(g, OP_ATTENTION, m->mask >= 0 ? 4 : 3, 1, last->loc);
    if (!a)
        return diag_error(c->d, last->loc, "out of memory");
    memcpy(a->in, in, sizeof(int) * (size_t)a->n_in);
    pass_set_float(a, ATTR_SCALE, m->scale);
    int y = last->out[0];
    Type before = g->values[y].type;
    graph_redefine(g, y, a, 0);
    if (pass_finish(c, a) < 0)
        return -1;
    KILN_ASSERT(type_equal(&before, &g->values[y].type));
    dead[last_index] = true;
    for (int i = 0; i < m->n_dead; i++)
        dead[m->dead[i]] = true;
    return 0;
}

static int fuse_at(PassContext *c, int node, const int *uses, bool *dead) {
    Match m;
    int rc = 0;
    if (match(c, c->g->nodes[node], uses, &m, &rc) && rc == 0)
        rc = fuse(c, node, &m, uses, dead);
    return rc;
}

int pass_fuse_attention(PassContext *c) {
    return pass_fuse_each(c, OP_MATMUL, fuse_at);
}
