/* fuse_gelu: GELU written out with erf, as PyTorch's ONNX exports before opset 20
 * and models that spell it out write it, becomes one `gelu`, whose kernel computes
 * x Phi(x) in one branch (kiln_geluf) where the written-out form takes erf's two and
 * two divisions.
 *
 *   s = div(x, sqrt(2)) or mul(x, 1 / sqrt(2))   (the constant within float rounding)
 *   a = add(erf(s), 1)                           (either order)
 *   y = mul(mul(x, a), 0.5) or mul(mul(x, 0.5), a)   (each either order)
 *   ->  gelu(x)
 * where every value between x and y is read by the next op of the pattern alone.
 * gelu takes over y, so names and outputs stay.
 *
 * Why it is correct: gelu(x) with approximate=none is defined as
 * 0.5 x (1 + erf(x / sqrt(2))), which is what the pattern computes, within the
 * roundings of its intermediate values and of the constants. */
#include "passes.h"

#include <math.h>

enum { PATTERN_NODES = 5 };

/* v (-1 for none) is a known f32 scalar within float rounding of `want`. */
static bool is_constant(PassContext *c, int v, double want, int *rc) {
    double got = 0;
    return v >= 0 && pass_known_scalar(c, v, &got, rc) && fabs(got - want) <= 1e-7 * want;
}

/* The operand of binary node n that is not v, or -1 when both are v or neither. */
static int other_operand(const Node *n, int v) {
    if (n->in[0] == v && n->in[1] != v)
        return n->in[1];
    if (n->in[1] == v && n->in[0] != v)
        return n->in[0];
    return -1;
}

/* x of s = x / sqrt(2) or x * (1 / sqrt(2)); -1 when s is neither. */
static int scaled_input(PassContext *c, const Node *s, int *rc) {
    if (s->op == OP_DIV && is_constant(c, s->in[1], M_SQRT2, rc))
        return s->in[0];
    for (int k = 0; k < 2 && s->op == OP_MUL && !*rc; k++)
        if (is_constant(c, s->in[1 - k], M_SQRT1_2, rc))
            return s->in[k];
    return -1;
}

/* From the erf node at erf_index: x, the value gelu takes over in *last and the
 * pattern's nodes in dead_nodes. */
static int match(PassContext *c, int erf_index, const int *uses, int *last, int *dead_nodes, int *rc) {
    Graph *g = c->g;
    Node *erf = g->nodes[erf_index];
    Node *s = pass_single_use(g, uses, erf->in[0], OP_DIV);
    if (!s)
        s = pass_single_use(g, uses, erf->in[0], OP_MUL);
    int x = s ? scaled_input(c, s, rc) : -1, at[3];
    if (x < 0 || g->values[x].type.dtype != DT_F32)
        return -1;
    Node *add = pass_only_reader(g, uses, erf->out[0], OP_ADD, &at[0]);
    if (!add || !is_constant(c, other_operand(add, erf->out[0]), 1, rc))
        return -1;
    Node *inner = pass_only_reader(g, uses, add->out[0], OP_MUL, &at[1]);
    if (!inner)
        return -1;
    Node *outer = NULL;
    int partner = other_operand(inner, add->out[0]);
    if (partner == x) { /* mul(mul(x, a), 0.5) */
        outer = pass_only_reader(g, uses, inner->out[0], OP_MUL, &at[2]);
        if (!outer || !is_constant(c, other_operand(outer, inner->out[0]), 0.5, rc))
            return -1;
    } else { /* mul(mul(x, 0.5), a): inner is the outer mul */
        Node *half = partner >= 0 ? pass_single_use(g, uses, partner, OP_MUL) : NULL;
        if (!half || other_operand(half, x) < 0 || !is_constant(c, other_operand(half, x), 0.5, rc))
            return -1;
        outer = inner;
        at[2] = g->values[half->out[0]].node;
    }
    if (*rc || !type_equal(&g->values[outer->out[0]].type, &g->values[x].type))
        return -1;
    *last = outer->out[0];
    dead_nodes[0] = g->values[s->out[0]].node;
    dead_nodes[1] = erf_index;
    dead_nodes[2] = at[0], dead_nodes[3] = at[1], dead_nodes[4] = at[2];
    return x;
}

static int fuse_at(PassContext *c, int node, const int *uses, bool *dead) {
    Graph *g = c->g;
    int last, dead_nodes[PATTERN_NODES], rc = 0;
    int x = match(c, node, uses, &last, dead_nodes, &rc);
    if (x < 0 || rc)
        return rc;
    Node *old = g->nodes[g->values[last].node];
    Node *gelu = graph_add_node(g, OP_GELU, 1, 1, old->loc);
    if (!gelu)
        return diag_error(c->d, old->loc, "out of memory");
    gelu->in[0] = x;
    pass_set_enum(gelu, ATTR_APPROXIMATE, GELU_NONE);
    graph_redefine(g, last, gelu, 0);
    if (pass_finish(c, gelu) < 0)
        return -1;
    for (int i = 0; i < PATTERN_NODES; i++)
        dead[dead_nodes[i]] = true;
    return 0;
}

int pass_fuse_gelu(PassContext *c) {
    return pass_fuse_each(c, OP_ERF, fuse_at);
}
