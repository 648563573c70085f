/* to_linear: GEMMs written as gemm, or as matmul plus a bias, become linear, the one
 * form that fuse_epilogue turns into a fused_linear with its activation and that
 * lowers to a matrix-vector product at batch 1.
 *
 *   gemm(a, b, c?) with alpha 1, trans_a false, and no c, or beta 1 and c of type
 *       [N] or [1, N]                 ->  linear(a, b' , c as [N])
 *   add(matmul(x, W), c), c [N] or [1, N], x of rank 2 or more, W [K, N], the
 *       matmul read by the add alone   ->  linear(x, transpose(W), c as [N])
 * where b' is b with trans_b, else transpose(b). A transpose of a known weight is
 * computed by fold, which runs next. The new node takes over the value of the node
 * it replaces (the gemm, or the add), so names and outputs stay.
 *
 * Why it is correct: linear(x, w, b) is x w^T + b with b broadcast over the rows,
 * which is what gemm computes with alpha 1 and beta 1 (beta c added to every row
 * when c is a row), and what matmul followed by the broadcast add computes; numpy
 * matmul of x [..., K] and a 2-D W is x W over the last dim, as linear is. */
#include "passes.h"

/* A bias of type [n] as it is, or [1, n] reshaped to [n]; -1 when v is neither, -2
 * after a diagnostic. */
static int as_bias(PassContext *c, int v, int64_t n, Loc loc) {
    const Type *t = &c->g->values[v].type;
    if (t->rank == 1 && t->dims[0] == n)
        return v;
    if (t->rank != 2 || t->dims[0] != 1 || t->dims[1] != n)
        return -1;
    char base[256];
    snprintf(base, sizeof base, "%s.row", c->g->values[v].name);
    Node *r = pass_new_node(c, OP_RESHAPE, 1, &v, base, loc);
    if (!r || pass_set_ints(c, r, ATTR_SHAPE, &n, 1))
        return -2;
    int b = pass_finish(c, r);
    return b < 0 ? -2 : b;
}

/* transpose(v), made once per v (t caches it per value id). */
static int transposed(PassContext *c, int *t, int v, Loc loc) {
    if (t[v] >= 0)
        return t[v];
    char base[256];
    snprintf(base, sizeof base, "%s.T", c->g->values[v].name);
    Node *n = pass_new_node(c, OP_TRANSPOSE, 1, &v, base, loc);
    int64_t perm[2] = {1, 0};
    if (!n || pass_set_ints(c, n, ATTR_PERM, perm, 2))
        return -1;
    return t[v] = pass_finish(c, n);
}

/* linear(x, w, b) taking over value y, in place of node i. */
static int replace(PassContext *c, int i, int x, int w, int b, bool *dead) {
    Graph *g = c->g;
    Node *old = g->nodes[i];
    int y = old->out[0];
    Node *m = graph_add_node(g, OP_LINEAR, b >= 0 ? 3 : 2, 1, old->loc);
    if (!m)
        return diag_error(c->d, old->loc, "out of memory");
    m->in[0] = x, m->in[1] = w;
    if (b >= 0)
        m->in[2] = b;
    Type before = g->values[y].type;
    graph_redefine(g, y, m, 0);
    if (pass_finish(c, m) < 0)
        return -1;
    KILN_ASSERT(type_equal(&before, &g->values[y].type));
    dead[i] = true;
    return 0;
}

static int from_gemm(PassContext *c, int i, int *t, bool *dead) {
    Node *n = c->g->nodes[i];
    const Type *a = &c->g->values[n->in[0]].type;
    bool has_c = n->n_in > 2 && n->in[2] >= 0;
    if (node_float(n, ATTR_ALPHA) != 1 || node_bool(n, ATTR_TRANS_A) ||
        (has_c && node_float(n, ATTR_BETA) != 1) || a->rank != 2)
        return 0;
    int64_t cols = c->g->values[n->out[0]].type.dims[1];
    int b = has_c ? as_bias(c, n->in[2], cols, n->loc) : -1;
    if (b == -2 || (has_c && b < 0))
        return b == -2 ? -1 : 0;
    int w = node_bool(n, ATTR_TRANS_B) ? n->in[1] : transposed(c, t, n->in[1], n->loc);
    return w < 0 ? -1 : replace(c, i, n->in[0], w, b, dead);
}

static int from_matmul_add(PassContext *c, int i, const int *uses, int *t, bool *dead) {
    Graph *g = c->g;
    Node *add = g->nodes[i];
    for (int k = 0; k < 2; k++) {
        Node *mm = pass_definer(g, add->in[k]);
        if (!mm || mm->op != OP_MATMUL || uses[add->in[k]] != 1 || add->in[0] == add->in[1])
            continue;
        const Type *x = &g->values[mm->in[0]].type, *w = &g->values[mm->in[1]].type;
        if (x->rank < 2 || w->rank != 2 ||
            !type_equal(&g->values[add->in[k]].type, &g->values[add->out[0]].type))
            continue;
        int b = as_bias(c, add->in[1 - k], w->dims[1], add->loc);
        if (b == -2)
            return -1;
        if (b < 0)
            continue;
        int wt = transposed(c, t, mm->in[1], mm->loc);
        if (wt < 0 || replace(c, i, mm->in[0], wt, b, dead))
            return -1;
        dead[g->values[add->in[k]].node] = true;
        return 0;
    }
    return 0;
}

int pass_to_linear(PassContext *c) {
    Graph *g = c->g;
    int n_nodes = g->n_nodes;
    int n_values = g->n_values;
    int *uses = ir_calloc((size_t)n_values + 1, sizeof *uses),
        *t = ir_malloc(sizeof *t * (size_t)(n_values + 1));
    bool *dead = ir_calloc((size_t)n_nodes + 1, 1);
    int rc = uses && t && dead ? 0 : diag_error(c->d, (Loc){0}, "out of memory");
    if (rc == 0)
        graph_count_uses(g, uses);
    for (int v = 0; rc == 0 && v < n_values; v++)
        t[v] = -1;
    for (int i = 0; rc == 0 && i < n_nodes; i++) {
        OpId op = g->nodes[i]->op;
        if (op == OP_GEMM)
            rc = from_gemm(c, i, t, dead);
        else if (op == OP_ADD)
            rc = from_matmul_add(c, i, uses, t, dead);
    }
    if (rc == 0)
        rc = pass_remove_dead(c, dead, n_nodes);
    ir_free(uses), ir_free(t), ir_free(dead);
    return rc;
}
