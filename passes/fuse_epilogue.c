/* Epilogue fusion: a conv or linear (the head) whose only reader is an elementwise
 * op (relu, clip, a residual add, or an `elementwise` node that fuse_elementwise
 * made of several) becomes one `fused_conv` or `fused_linear` node, whose kernel
 * applies the elementwise op to each tile of the head's result while it is still in
 * cache instead of in a second pass over memory.
 *
 * The reader U qualifies when the head's result c has no other use and is not an
 * output, U's result has c's type (U does not broadcast c into something larger),
 * and each of U's other inputs has c's type or one element (a residual, a scalar),
 * which is what the fused ops accept. The new node takes the head's inputs and
 * attributes, U's other inputs as e1, e2, ... (a value read twice is one input),
 * and U's expression with $0 for c; it takes over U's value, so names and outputs
 * stay, and the head and U go.
 *
 * Why it is correct: a fused op is defined as its head followed by its expression
 * at every element, each input read at that element; U computed that expression
 * from c and its other inputs at every element of the same shape, so the values are
 * those U had, rounded the same way. The head's inputs are defined before the head,
 * hence before U's place, where the new node is put. */
#include "passes.h"

#include <string.h>

/* The fused op a head op becomes, or 0 when it is no head. */
static OpId fused_op(OpId head) {
    return head == OP_CONV ? OP_FUSED_CONV : head == OP_LINEAR ? OP_FUSED_LINEAR : 0;
}

/* Whether value v may be an epilogue input of a head with result type y. */
static bool epilogue_operand(const Graph *g, int v, const Type *y) {
    const Type *t = &g->values[v].type;
    return type_equal(t, y) || type_numel(t) == 1;
}

/* The input of U that a head fuses with, or -1. */
static int fusable_head_input(const Graph *g, const Node *u, const int *uses, const bool *is_output) {
    const Type *y = &g->values[u->out[0]].type;
    for (int k = 0; k < u->n_in; k++) {
        int v = u->in[k];
        const Node *def = pass_definer(g, v);
        if (!def || !fused_op(def->op) || uses[v] != 1 || is_output[v] || !type_equal(&g->values[v].type, y))
            continue;
        bool others = true;
        for (int j = 0; j < u->n_in; j++)
            others = others && (u->in[j] == v || epilogue_operand(g, u->in[j], y));
        if (others)
            return k;
    }
    return -1;
}

/* U's expression over its inputs: its `expr`, or the call of its op on $0, $1. */
static Expr *reader_expr(Arena *a, const Node *u, Diag *d) {
    if (u->op == OP_ELEMENTWISE)
        return node_expr(a, u, d);
    Expr *e = arena_alloc(a, sizeof *e);
    for (int k = 0; e && k < u->n_in; k++)
        if ((e->arg[k] = arena_alloc(a, sizeof *e->arg[k])))
            *e->arg[k] = (Expr){.kind = EXPR_INPUT, .input = k};
        else
            e = NULL;
    if (!e) {
        diag_error(d, u->loc, "out of memory");
        return NULL;
    }
    e->kind = EXPR_CALL;
    e->call = *u;
    return e;
}

static void renumber(Expr *e, const int *map) {
    if (e->kind == EXPR_INPUT)
        e->input = map[e->input];
    for (int k = 0; e->kind == EXPR_CALL && k < e->call.n_in; k++)
        renumber(e->arg[k], map);
}

/* Replaces head and its reader u (input k of u is the head's result) by one fused
 * op taking u's value; marks both dead. */
static int fuse(PassContext *c, Node *head, Node *u, int k, bool *dead) {
    Graph *g = c->g;
    Arena arena = {0};
    Expr *e = reader_expr(&arena, u, c->d);
    int *map = arena_alloc(&arena, sizeof *map * (size_t)u->n_in);
    int *in = arena_alloc(&arena, sizeof *in * (size_t)(u->n_in + 3));
    if (!e || !map || !in) {
        arena_free(&arena);
        return e ? diag_error(c->d, u->loc, "out of memory") : -1;
    }
    in[0] = head->in[0];
    in[1] = head->in[1];
    in[2] = head->n_in > 2 ? head->in[2] : -1;
    int n_in = 3;
    for (int j = 0; j < u->n_in; j++) {
        if (u->in[j] == u->in[k]) {
            map[j] = 0;
            continue;
        }
        int at = 3;
        while (at < n_in && in[at] != u->in[j])
            at++;
        if (at == n_in)
            in[n_in++] = u->in[j];
        map[j] = at - 2;
    }
    if (n_in == 3 && in[2] < 0)
        n_in = 2;
    renumber(e, map);
    char *text = expr_format(e);
    OpId op = fused_op(head->op);
    Node *n = text ? graph_add_node(g, op, n_in, 1, u->loc) : NULL;
    char *copy = n ? arena_strdup(&g->arena, text) : NULL;
    ir_free(text);
    if (copy)
        memcpy(n->in, in, sizeof *in * (size_t)n_in);
    arena_free(&arena);
    if (!copy)
        return diag_error(c->d, u->loc, "out of memory");
    for (int a = 0; a < op_table[head->op].n_attrs; a++)
        n->attrs[op_attr_index(op, op_table[head->op].attrs[a].id)] = head->attrs[a];
    n->attrs[op_attr_index(op, ATTR_EXPR)] = (Attr){.set = true, .s = copy, .loc = u->loc};
    Type before = g->values[u->out[0]].type;
    dead[g->values[u->out[0]].node] = dead[g->values[head->out[0]].node] = true;
    graph_redefine(g, u->out[0], n, 0);
    if (infer_node(g, n, c->d))
        return diag_internal(c->d, u->loc, "a pass built an invalid '%s' (a bug in kiln)", op_table[op].name);
    KILN_ASSERT(type_equal(&before, &g->values[u->out[0]].type));
    return 0;
}

int pass_fuse_epilogue(PassContext *c) {
    Graph *g = c->g;
    int n_nodes = g->n_nodes;
    int *uses = ir_calloc((size_t)g->n_values + 1, sizeof *uses);
    bool *is_output = ir_calloc((size_t)g->n_values + 1, sizeof *is_output);
    bool *dead =
        ir_calloc(2 * (size_t)n_nodes + 1, sizeof *dead); /* and the nodes fusion adds, one per head */
    int rc = uses && is_output && dead ? 0 : diag_error(c->d, (Loc){0}, "out of memory");
    if (rc == 0) {
        graph_count_uses(g, uses);
        graph_mark_results(g, is_output);
    }
    for (int i = 0; rc == 0 && i < n_nodes; i++) {
        Node *u = g->nodes[i];
        if (!op_has(u->op, F_ELEMENTWISE))
            continue;
        int k = fusable_head_input(g, u, uses, is_output);
        if (k >= 0)
            rc = fuse(c, pass_definer(g, u->in[k]), u, k, dead);
    }
    if (rc == 0) {
        graph_remove_nodes(g, dead);
        if (graph_sort(g))
            rc = diag_error(c->d, (Loc){0}, "out of memory");
    }
    ir_free(uses), ir_free(is_output), ir_free(dead);
    return rc;
}
