/* fuse_layer_norm: layer normalization written out, as models built from ReduceMean
 * and their ONNX exports (before opset 17) write it, becomes one `layer_norm`,
 * whose kernel makes its passes over each row while the row is in cache.
 *
 *   mu  = mean(x, axes=A, keepdims)        A: the dims from some axis to the last
 *   d   = sub(x, mu)
 *   var = mean(pow(d, 2) or mul(d, d), axes=A, keepdims)
 *   y   = div(d, sqrt(add(var, eps)))      eps a known scalar (either order)
 *         [then mul(y, scale) [then add(., bias)]] (either order)
 *   ->  layer_norm(x, scale?, bias?, axis, epsilon=eps)
 * where scale and bias vary along the normalized dims alone (rank at most A's
 * count), and every value between x and y is read by the next op of the pattern
 * alone (d by the square and the division). layer_norm takes over the last value,
 * so names and outputs stay.
 *
 * Why it is correct: layer_norm(x, s, b) is defined as (x - mean) / sqrt(var + eps)
 * * s + b with the mean and the biased variance over the dims from axis on, which
 * is what the pattern computes, within the roundings of its intermediate values. */
#include "passes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int x, scale, bias, last; /* last: the value layer_norm takes over */
    int axis;
    double eps;
    int dead[9], n_dead; /* the seven nodes of the core, the mul and the add */
} Match;

/* The first of the dims that mean n reduces when they run from there to the last
 * and it keeps them; -1 otherwise. */
static int suffix_axis(const Graph *g, const Node *n) {
    int rank = g->values[n->in[0]].type.rank;
    if (!node_bool(n, ATTR_KEEPDIMS) || rank == 0)
        return -1;
    if (!node_has(n, ATTR_AXES))
        return 0;
    int64_t axes[KILN_MAX_RANK];
    int count = node_ints(n, ATTR_AXES, axes, KILN_MAX_RANK, 0);
    bool reduced[KILN_MAX_RANK] = {false};
    for (int k = 0; k < count; k++) {
        int64_t a = axes[k] < 0 ? axes[k] + rank : axes[k];
        if (a < 0 || a >= rank)
            return -1;
        reduced[a] = true;
    }
    int axis = rank - count;
    for (int k = axis; k < rank; k++)
        if (!reduced[k])
            return -1;
    return count > 0 ? axis : -1;
}

/* The operand of binary node n that is not v, when it can be layer_norm's scale or
 * bias: f32, of no higher rank than the normalized dims, leaving n's type that of v. */
static int affine_operand(const Graph *g, const Node *n, int v, int norm_rank) {
    int other = n->in[0] == v ? n->in[1] : n->in[0];
    const Type *t = &g->values[other].type;
    if (other == v || t->dtype != DT_F32 || t->rank > norm_rank ||
        !type_equal(&g->values[n->out[0]].type, &g->values[v].type))
        return -1;
    return other;
}

/* The core, from the division back to x. */
static bool match_core(PassContext *c, int div_index, const int *uses, Match *m, int *rc) {
    Graph *g = c->g;
    Node *div = g->nodes[div_index];
    int d = div->in[0];
    Node *sub = pass_definer(g, d), *sqrt = pass_single_use(g, uses, div->in[1], OP_SQRT);
    Node *add = sqrt ? pass_single_use(g, uses, sqrt->in[0], OP_ADD) : NULL;
    if (!sub || sub->op != OP_SUB || !add)
        return false;
    Node *mu = pass_single_use(g, uses, sub->in[1], OP_MEAN);
    if (!mu || mu->in[0] != sub->in[0] || (m->axis = suffix_axis(g, mu)) < 0)
        return false;
    int var = -1;
    for (int k = 0; k < 2 && var < 0 && !*rc; k++)
        if (pass_known_scalar(c, add->in[1 - k], &m->eps, rc))
            var = add->in[k];
    Node *mean2 = var >= 0 ? pass_single_use(g, uses, var, OP_MEAN) : NULL;
    if (!mean2 || suffix_axis(g, mean2) != m->axis ||
        !type_equal(&g->values[add->out[0]].type, &g->values[var].type))
        return false;
    Node *square = pass_definer(g, mean2->in[0]);
    double two = 0;
    bool squares = square && uses[mean2->in[0]] == 1 &&
                   ((square->op == OP_MUL && square->in[0] == d && square->in[1] == d && uses[d] == 3) ||
                    (square->op == OP_POW && square->in[0] == d && uses[d] == 2 &&
                     pass_known_scalar(c, square->in[1], &two, rc) && two == 2));
    const Type *x = &g->values[sub->in[0]].type;
    if (!squares || *rc || x->dtype != DT_F32 || !type_equal(&g->values[d].type, x) ||
        !type_equal(&g->values[div->out[0]].type, x))
        return false;
    m->x = sub->in[0];
    const Node *dead[] = {mu, sub, square, mean2, add, sqrt, div};
    for (int k = 0; k < 7; k++)
        m->dead[m->n_dead++] = g->values[dead[k]->out[0]].node;
    return true;
}

static bool match(PassContext *c, int div_index, const int *uses, Match *m, int *rc) {
    Graph *g = c->g;
    *m = (Match){.scale = -1, .bias = -1};
    if (!match_core(c, div_index, uses, m, rc))
        return false;
    int norm_rank = g->values[m->x].type.rank - m->axis, at;
    m->last = g->nodes[div_index]->out[0];
    Node *mul = pass_only_reader(g, uses, m->last, OP_MUL, &at);
    if (!mul || (m->scale = affine_operand(g, mul, m->last, norm_rank)) < 0)
        return true;
    m->last = mul->out[0];
    m->dead[m->n_dead++] = at;
    Node *add = pass_only_reader(g, uses, m->last, OP_ADD, &at);
    if (!add || (m->bias = affine_operand(g, add, m->last, norm_rank)) < 0)
        return true;
    m->last = add->out[0];
    m->dead[m->n_dead++] = at;
    return true;
}

/* The double with the fewest digits that is the float f: eps = 1e-5 given as an f32
 * reads 1e-5, not 9.999999747378752e-6; they differ by far less than a rounding. */
static double shortest_float(double f) {
    char text[32];
    for (int digits = 1; digits < 9; digits++) {
        snprintf(text, sizeof text, "%.*g", digits, f);
        if ((float)strtod(text, NULL) == (float)f)
            return strtod(text, NULL);
    }
    return f;
}

static int fuse(PassContext *c, const Match *m, bool *dead) {
    Graph *g = c->g;
    int in[3] = {m->x, m->scale, m->bias}, n_in = m->bias >= 0 ? 3 : m->scale >= 0 ? 2 : 1;
    Node *last = g->nodes[g->values[m->last].node];
    Node *ln = graph_add_node(g, OP_LAYER_NORM, n_in, 1, last->loc);
    if (!ln)
        return diag_error(c->d, last->loc, "out of memory");
    memcpy(ln->in, in, sizeof(int) * (size_t)n_in);
    pass_set_int(ln, ATTR_AXIS, m->axis - g->values[m->x].type.rank);
    pass_set_float(ln, ATTR_EPSILON, shortest_float(m->eps));
    Type before = g->values[m->last].type;
    graph_redefine(g, m->last, ln, 0);
    if (pass_finish(c, ln) < 0)
        return -1;
    KILN_ASSERT(type_equal(&before, &g->values[m->last].type));
    for (int i = 0; i < m->n_dead; i++)
        dead[m->dead[i]] = true;
    return 0;
}

static int fuse_at(PassContext *c, int node, const int *uses, bool *dead) {
    Match m;
    int rc = 0;
    if (match(c, node, uses, &m, &rc) && rc == 0)
        rc = fuse(c, &m, dead);
    return rc;
}

int pass_fuse_layer_norm(PassContext *c) {
    return pass_fuse_each(c, OP_DIV, fuse_at);
}
