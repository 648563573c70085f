/* Common-subexpression elimination: computes each distinct expression once.
 *
 * Ops are pure, so two op nodes with the same op, the same inputs and equal
 * attributes compute the same results (their types follow from those too), and two
 * consts with the same type and the same bits are the same value. Walking the nodes
 * in dependency order, each node's inputs are first rewritten to the values that
 * replaced them, then the node is looked up in a hash table of the nodes kept so
 * far: a match takes over its uses and the node is removed, otherwise it is kept and
 * entered. Because inputs are rewritten before the lookup, a duplicate of a
 * duplicate is found in the same walk, in time linear in the graph (plus the bytes
 * of the consts, which are hashed).
 *
 * Some nodes are never removed: inputs and params (declarations that are part of the
 * model's interface, even with equal initializers), a node whose result is a model
 * output (the output keeps its name), and a node whose result a grad differentiates
 * with respect to (d y / d h counts only the paths through h itself, so merging
 * another copy into h would change the gradient). */
#include "passes.h"

#include <string.h>

static uint64_t mix(uint64_t h, uint64_t v) {
    return (h ^ v) * 1099511628211ull; /* FNV-1a, a word at a time */
}

static uint64_t node_hash(const Node *n) {
    uint64_t h = mix(1469598103934665603ull, (uint64_t)n->op);
    if (n->op == OP_CONST) {
        const Tensor *t = n->data;
        h = mix(h, (uint64_t)t->type.dtype);
        for (int k = 0; k < t->type.rank; k++)
            h = mix(h, (uint64_t)t->type.dims[k]);
        int64_t count = type_numel(&t->type), size = dtype_size(t->type.dtype);
        for (int64_t i = 0; i < count; i++) {
            uint64_t bits = 0;
            memcpy(&bits, (const char *)t->bytes + i * size, (size_t)size);
            h = mix(h, bits);
        }
        return h;
    }
    for (int k = 0; k < n->n_in; k++)
        h = mix(h, (uint64_t)(int64_t)n->in[k]);
    return h;
}

/* Bitwise, so that NaN equals itself and 0 and -0 stay apart. */
static bool same_bits(const void *a, const void *b, size_t size) {
    return memcmp(a, b, size) == 0;
}

static bool same_attr(AttrKind kind, const Attr *a, const Attr *b) {
    if (a->set != b->set)
        return false;
    if (!a->set)
        return true;
    switch (kind) {
    case A_INT:
    case A_BOOL:
    case A_ENUM: return a->i == b->i;
    case A_FLOAT: return same_bits(&a->f, &b->f, sizeof a->f);
    case A_STRING: return strcmp(a->s, b->s) == 0;
    case A_INTS:
        return a->n == b->n && (a->n == 0 || same_bits(a->ints, b->ints, sizeof *a->ints * (size_t)a->n));
    case A_FLOATS:
        return a->n == b->n &&
               (a->n == 0 || same_bits(a->floats, b->floats, sizeof *a->floats * (size_t)a->n));
    }
    return false;
}

static bool same_node(const Node *a, const Node *b) {
    if (a->op != b->op || a->n_in != b->n_in || a->n_out != b->n_out)
        return false;
    if (a->op == OP_CONST)
        return type_equal(&a->data->type, &b->data->type) &&
               same_bits(a->data->bytes, b->data->bytes,
                         (size_t)(dtype_size(a->data->type.dtype) * type_numel(&a->data->type)));
    for (int k = 0; k < a->n_in; k++)
        if (a->in[k] != b->in[k])
            return false;
    const OpInfo *o = &op_table[a->op];
    for (int i = 0; i < o->n_attrs; i++)
        if (!same_attr(o->attrs[i].kind, &a->attrs[i], &b->attrs[i]))
            return false;
    return true;
}

/* Whether the node may be merged away, or kept as the one others merge into. */
static bool mergeable(const Node *n, const bool *pinned) {
    if (n->op == OP_INPUT || n->op == OP_PARAM || (n->op == OP_CONST && !n->data))
        return false;
    for (int k = 0; k < n->n_out; k++)
        if (pinned[n->out[k]])
            return false;
    return true;
}

int pass_cse(PassContext *c) {
    Graph *g = c->g;
    int cap = 16;
    while (cap < 2 * g->n_nodes)
        cap *= 2;
    int *rep = ir_malloc(sizeof *rep * ((size_t)g->n_values + 1));
    bool *output = ir_calloc((size_t)g->n_values + 1, sizeof *output);
    bool *wrt = ir_calloc((size_t)g->n_values + 1, sizeof *wrt);
    bool *dead = ir_calloc((size_t)g->n_nodes + 1, sizeof *dead);
    int *table = ir_calloc((size_t)cap, sizeof *table); /* node index + 1; 0 is empty */
    if (!rep || !output || !wrt || !dead || !table) {
        ir_free(rep), ir_free(output), ir_free(wrt), ir_free(dead), ir_free(table);
        return diag_error(c->d, (Loc){0}, "out of memory");
    }
    for (int v = 0; v < g->n_values; v++)
        rep[v] = v;
    for (int k = 0; k < g->n_outputs; k++)
        output[g->outputs[k]] = true;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i]->op == OP_GRAD)
            for (int k = 1; k < g->nodes[i]->n_in; k++)
                wrt[g->nodes[i]->in[k]] = true;

    for (int i = 0; i < g->n_nodes; i++) {
        Node *n = g->nodes[i];
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k] >= 0)
                n->in[k] = rep[n->in[k]];
        if (!mergeable(n, wrt))
            continue;
        uint32_t slot = (uint32_t)node_hash(n) & (uint32_t)(cap - 1);
        while (table[slot] && !same_node(g->nodes[table[slot] - 1], n))
            slot = (slot + 1) & (uint32_t)(cap - 1);
        if (!table[slot]) {
            table[slot] = i + 1;
            continue;
        }
        if (!mergeable(n, output))
            continue; /* an output keeps its own node, and so its name */
        const Node *kept = g->nodes[table[slot] - 1];
        for (int k = 0; k < n->n_out; k++)
            rep[n->out[k]] = kept->out[k];
        dead[i] = true;
    }
    /* Out of dependency order, a node may precede the definer of an input that
     * was replaced; point it at the replacement too. */
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i]->n_in; k++)
            if (g->nodes[i]->in[k] >= 0)
                g->nodes[i]->in[k] = rep[g->nodes[i]->in[k]];
    graph_remove_nodes(g, dead);
    ir_free(rep), ir_free(output), ir_free(wrt), ir_free(dead), ir_free(table);
    return 0;
}
