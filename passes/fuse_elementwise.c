/* Elementwise fusion: each maximal tree of elementwise ops becomes one `elementwise`
 * node, computed by one kernel that reads every input once per output element.
 *
 * The fusable ops are the unary ops (relu ... hardswish, with their attributes), the
 * broadcasting binary ops (add ... min) and `elementwise` nodes themselves. Walking
 * the graph from the last node back, each fusable node not yet taken becomes the root
 * of a tree: an input of a tree node joins the tree when its definer is fusable, it
 * has exactly one use and it is not a graph output, so no value that anything else
 * reads disappears. Every other input is a leaf, one `$k` per distinct value (an input
 * that appears twice is one `$k`); an f32[] const is written as a literal. The root's
 * new node takes over the root's value id (graph_redefine), so names and outputs
 * stay, and the tree's nodes go. A tree of one node is left alone: fusing saves
 * nothing there.
 *
 * Why it is correct: every op in a tree is elementwise with numpy broadcasting, so
 * the root's element at index i is a function of the leaves' elements at i, each
 * leaf read by broadcasting into the root's shape, and the root's shape is the
 * broadcast of the leaves' shapes. A value smaller than the root (say f32[3] under
 * an f32[2, 3] root) stays a leaf: inside the tree it would be recomputed for every
 * root element (a squeeze-and-excite gate's sigmoid, once per channel, ran once per
 * pixel and channel). The interpreter rounds each call of an expression to f32 as the
 * ops do one by one, so the fused graph gives the same values there bit for bit.
 * An `elementwise` input used more than once by its own expression stays a leaf, and
 * one expression holds at most FUSE_MAX_CALLS calls, so expressions stay small.
 *
 * A leaf that is an `expand` to the root's shape (the gradient of a mean or a sum)
 * is read through it, broadcast by the fused node itself, when another leaf has the
 * root's shape: the root's shape stays the broadcast of the leaves', and the
 * expanded tensor is never written (then a tree of one node is worth fusing too). */
#include "passes.h"

#include <string.h>

enum { FUSE_MAX_CALLS = 64 };

typedef struct {
    PassContext *c;
    int *uses;         /* per value: node inputs and graph outputs naming it */
    bool *is_output;   /* per value */
    bool *inlined;     /* per value: an f32[] const written as a literal */
    bool *taken;       /* per node: inside some tree (as root or interior) */
    bool *bypassed;    /* per value: an expand some fused node reads through */
    int *tree, n_tree; /* the interior nodes of the tree being built */
    int *leaves;       /* the tree's leaf values, $0, $1, ... */
    int n_leaves;
    int calls, nodes;   /* in the tree being built */
    int64_t root_numel; /* the elements of its root's result */
    Arena arena;        /* its expressions */
} Fuser;

/* An expression computes in f32: integer arithmetic keeps kernels of its own. */
static bool fusable(const Graph *g, const Node *n) {
    return op_has(n->op, F_ELEMENTWISE) && g->values[n->out[0]].type.dtype == DT_F32;
}

/* An `elementwise` node's expression, parsed (it was checked by inference). */
static Expr *parse_node_expr(Fuser *f, const Node *n) {
    return node_expr(&f->arena, n, f->c->d);
}

static Expr *new_expr(Fuser *f, ExprKind kind) {
    Expr *e = arena_alloc(&f->arena, sizeof *e);
    if (!e)
        diag_error(f->c->d, (Loc){0}, "out of memory");
    else
        e->kind = kind;
    return e;
}

static Expr *leaf(Fuser *f, int v) {
    const Node *def = pass_definer(f->c->g, v);
    if (def && def->op == OP_CONST && def->data->type.rank == 0) {
        Expr *e = new_expr(f, EXPR_NUMBER);
        if (e)
            e->number = def->data->data[0];
        f->inlined[v] = true;
        return e;
    }
    int k = 0;
    while (k < f->n_leaves && f->leaves[k] != v)
        k++;
    if (k == f->n_leaves)
        f->leaves[f->n_leaves++] = v;
    Expr *e = new_expr(f, EXPR_INPUT);
    if (e)
        e->input = k;
    return e;
}

static Expr *build(Fuser *f, Node *n);

/* Input value v of a tree node: its definer's tree when it may join, else a leaf.
 * `once`: the consumer computes v once per element (false for an `elementwise`
 * input its expression names twice or never, whose tree would be copied or lost). */
static Expr *operand(Fuser *f, int v, bool once) {
    Graph *g = f->c->g;
    Node *def = pass_definer(g, v);
    if (!once || !def || !fusable(g, def) || f->uses[v] != 1 || f->is_output[v] ||
        type_numel(&g->values[v].type) < f->root_numel)
        return leaf(f, v);
    int cost = 1;
    if (def->op == OP_ELEMENTWISE) {
        Expr *e = parse_node_expr(f, def);
        if (!e)
            return NULL;
        cost = expr_calls(e);
    }
    if (f->calls + cost > FUSE_MAX_CALLS)
        return leaf(f, v);
    f->taken[g->values[v].node] = true;
    f->tree[f->n_tree++] = g->values[v].node;
    return build(f, def);
}

/* Replaces each $j of e by args[j]. */
static Expr *substitute(Expr *e, Expr **args) {
    if (e->kind == EXPR_INPUT)
        return args[e->input];
    for (int k = 0; e->kind == EXPR_CALL && k < e->call.n_in; k++)
        e->arg[k] = substitute(e->arg[k], args);
    return e;
}

static void count_inputs(const Expr *e, int *count) {
    if (e->kind == EXPR_INPUT)
        count[e->input]++;
    for (int k = 0; e->kind == EXPR_CALL && k < e->call.n_in; k++)
        count_inputs(e->arg[k], count);
}

/* The expression computing node n's result over the tree's leaves. */
static Expr *build(Fuser *f, Node *n) {
    f->nodes++;
    if (n->op != OP_ELEMENTWISE) {
        f->calls++;
        Expr *e = new_expr(f, EXPR_CALL);
        if (!e)
            return NULL;
        e->call = *n; /* its op, operand count and attributes */
        for (int k = 0; k < n->n_in; k++)
            if (!(e->arg[k] = operand(f, n->in[k], true)))
                return NULL;
        return e;
    }
    Expr *e = parse_node_expr(f, n);
    Expr **args = e ? arena_alloc(&f->arena, sizeof *args * (size_t)n->n_in) : NULL;
    int *count = args ? arena_alloc(&f->arena, sizeof *count * (size_t)n->n_in) : NULL;
    if (!count)
        return e ? (diag_error(f->c->d, n->loc, "out of memory"), NULL) : NULL;
    f->calls += expr_calls(e);
    count_inputs(e, count);
    for (int k = 0; k < n->n_in; k++)
        if (!(args[k] = operand(f, n->in[k], count[k] == 1)))
            return NULL;
    return substitute(e, args);
}

/* Reads the leaves that expand to the root's type through their expands, when a
 * leaf of that type remains; returns how many. */
static int bypass_expands(Fuser *f, const Type *root) {
    Graph *g = f->c->g;
    int full = 0, expands = 0;
    for (int k = 0; k < f->n_leaves; k++) {
        const Node *def = pass_definer(g, f->leaves[k]);
        bool same = type_equal(&g->values[f->leaves[k]].type, root);
        full += same && !(def && def->op == OP_EXPAND);
        expands += same && def && def->op == OP_EXPAND;
    }
    if (full == 0 || expands == 0)
        return 0;
    for (int k = 0; k < f->n_leaves; k++) {
        const Node *def = pass_definer(g, f->leaves[k]);
        if (def && def->op == OP_EXPAND && type_equal(&g->values[f->leaves[k]].type, root)) {
            f->bypassed[f->leaves[k]] = true;
            f->leaves[k] = def->in[0];
        }
    }
    return expands;
}

/* Replaces the tree rooted at `root` (node `at`) by one `elementwise` node in its
 * place; 0 when the tree was too small to fuse, 1 when fused, -1 after a diagnostic. */
static int fuse_tree(Fuser *f, Node *root, int at) {
    Graph *g = f->c->g;
    f->n_leaves = f->calls = f->nodes = 0;
    f->root_numel = type_numel(&g->values[root->out[0]].type);
    Expr *e = build(f, root);
    if (!e)
        return -1;
    int bypassed = bypass_expands(f, &g->values[root->out[0]].type);
    if ((f->nodes < 2 && !bypassed) || f->n_leaves == 0) /* nothing saved, or a constant: folding's job */
        return 0;
    char *text = expr_format(e);
    Node *n = text ? graph_add_node(g, OP_ELEMENTWISE, f->n_leaves, 1, root->loc) : NULL;
    char *copy = n ? arena_strdup(&g->arena, text) : NULL;
    ir_free(text);
    if (!copy)
        return diag_error(f->c->d, root->loc, "out of memory");
    memcpy(n->in, f->leaves, sizeof *n->in * (size_t)f->n_leaves);
    n->attrs[op_attr_index(OP_ELEMENTWISE, ATTR_EXPR)] = (Attr){.set = true, .s = copy, .loc = root->loc};
    Type before = g->values[root->out[0]].type;
    graph_redefine(g, root->out[0], n, 0);
    /* the new node, appended last, takes the root's place: the order stays as written */
    KILN_ASSERT(g->nodes[g->n_nodes - 1] == n);
    g->nodes[at] = n;
    g->n_nodes--;
    g->values[root->out[0]].node = at;
    if (infer_node(g, n, f->c->d))
        return -1;
    KILN_ASSERT(type_equal(&before, &g->values[root->out[0]].type));
    return 1;
}

int pass_fuse_elementwise(PassContext *c) {
    Graph *g = c->g;
    int n_nodes = g->n_nodes;
    Fuser f = {.c = c};
    f.uses = ir_calloc((size_t)g->n_values + 1, sizeof *f.uses);
    f.is_output = ir_calloc((size_t)g->n_values + 1, sizeof *f.is_output);
    f.inlined = ir_calloc((size_t)g->n_values + 1, sizeof *f.inlined);
    f.leaves = ir_calloc((size_t)g->n_values + 1, sizeof *f.leaves);
    f.taken = ir_calloc((size_t)n_nodes + 1, sizeof *f.taken);
    f.bypassed = ir_calloc((size_t)g->n_values + 1, sizeof *f.bypassed);
    f.tree = ir_calloc((size_t)n_nodes + 1, sizeof *f.tree);
    bool *dead = ir_calloc((size_t)n_nodes + 1, sizeof *dead);
    int rc = 0;
    if (!f.uses || !f.is_output || !f.inlined || !f.leaves || !f.taken || !f.bypassed || !f.tree || !dead)
        rc = diag_error(c->d, (Loc){0}, "out of memory");
    else {
        graph_count_uses(g, f.uses);
        graph_mark_results(g, f.is_output);
    }
    /* consumers before producers: a node's tree is final when the walk reaches it */
    for (int i = n_nodes - 1; rc == 0 && i >= 0; i--) {
        Node *n = g->nodes[i];
        if (f.taken[i] || !fusable(g, n))
            continue;
        f.taken[i] = true;
        f.n_tree = 0;
        int r = fuse_tree(&f, n, i);
        arena_free(&f.arena);
        f.arena = (Arena){0};
        rc = r < 0 ? -1 : 0;
        for (int k = 0; k < f.n_tree; k++) /* not fused: its operands may root trees of their own */
            f.taken[f.tree[k]] = dead[f.tree[k]] = r > 0;
    }
    if (rc == 0) {
        graph_remove_nodes(g, dead);
        /* the consts that became literals and the expands read through, when nothing
           else reads them, go too, so that the pass leaves no dead code behind and its
           output is a fixed point */
        graph_count_uses(g, f.uses);
        for (int i = 0; i < g->n_nodes; i++) {
            const Node *n = g->nodes[i];
            int y = n->out[0];
            dead[i] = ((n->op == OP_CONST && f.inlined[y]) || (n->op == OP_EXPAND && f.bypassed[y])) &&
                      f.uses[y] == 0 && !f.is_output[y];
        }
        graph_remove_nodes(g, dead);
    }
    arena_free(&f.arena);
    ir_free(f.uses), ir_free(f.is_output), ir_free(f.inlined), ir_free(f.leaves), ir_free(f.taken),
        ir_free(f.bypassed), ir_free(f.tree), ir_free(dead);
    return rc;
}
