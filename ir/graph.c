/* The graph: nodes in dependency order, values in SSA form, and the name table.
 *
 * Nodes, their input/output arrays and attributes come from the graph's arena.
 * The value array and the name table grow with ir_realloc. Const literals are
 * the only tensors a graph owns. */
#include "ops_impl.h"

#include <string.h>

Graph *graph_new(void) {
    Graph *g = ir_calloc(1, sizeof *g);
    return g;
}

void graph_free(Graph *g) {
    if (!g)
        return;
    for (int i = 0; i < g->n_nodes; i++)
        tensor_free(g->nodes[i]->data);
    ir_free(g->nodes);
    ir_free(g->values);
    ir_free(g->table);
    arena_free(&g->arena);
    ir_free(g);
}

Node *graph_add_node(Graph *g, OpId op, int n_in, int n_out, Loc loc) {
    if (g->n_nodes == g->cap_nodes) {
        int cap = g->cap_nodes ? 2 * g->cap_nodes : 64;
        Node **nodes = ir_realloc(g->nodes, sizeof *nodes * (size_t)cap);
        if (!nodes)
            return NULL;
        g->nodes = nodes;
        g->cap_nodes = cap;
    }
    Node *n = arena_alloc(&g->arena, sizeof *n);
    int n_attrs = op_table[op].n_attrs;
    if (!n)
        return NULL;
    n->in = arena_alloc(&g->arena, sizeof(int) * (size_t)(n_in + 1));
    n->out = arena_alloc(&g->arena, sizeof(int) * (size_t)(n_out + 1));
    n->attrs = arena_alloc(&g->arena, sizeof(Attr) * (size_t)(n_attrs + 1));
    if (!n->in || !n->out || !n->attrs)
        return NULL;
    n->op = op;
    n->n_in = n_in;
    n->n_out = n_out;
    n->loc = loc;
    for (int i = 0; i < n_out; i++)
        n->out[i] = -1;
    g->nodes[g->n_nodes++] = n;
    return n;
}

static uint32_t hash(const char *s) {
    uint32_t h = 2166136261u;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

static bool table_grow(Graph *g) {
    int cap = g->table_cap ? 2 * g->table_cap : 256;
    int *t = ir_calloc((size_t)cap, sizeof *t);
    if (!t)
        return false;
    for (int v = 0; v < g->n_values; v++) {
        uint32_t h = hash(g->values[v].name) & (uint32_t)(cap - 1);
        while (t[h])
            h = (h + 1) & (uint32_t)(cap - 1);
        t[h] = v + 1;
    }
    ir_free(g->table);
    g->table = t;
    g->table_cap = cap;
    return true;
}

int graph_find(const Graph *g, const char *name) {
    if (!g->table_cap)
        return -1;
    for (uint32_t h = hash(name) & (uint32_t)(g->table_cap - 1); g->table[h];
         h = (h + 1) & (uint32_t)(g->table_cap - 1))
        if (strcmp(g->values[g->table[h] - 1].name, name) == 0)
            return g->table[h] - 1;
    return -1;
}

int graph_define(Graph *g, const char *name, Node *n, int index) {
    KILN_ASSERT(graph_find(g, name) < 0);
    if (g->n_values == g->cap_values) {
        int cap = g->cap_values ? 2 * g->cap_values : 64;
        Value *v = ir_realloc(g->values, sizeof *v * (size_t)cap);
        if (!v)
            return -1;
        g->values = v;
        g->cap_values = cap;
    }
    if (2 * (g->n_values + 1) > g->table_cap && !table_grow(g))
        return -1;
    char *copy = arena_strdup(&g->arena, name);
    if (!copy)
        return -1;
    int id = g->n_values++;
    g->values[id] = (Value){copy, {DT_F32, 0, {0}}, -1, index};
    for (int i = g->n_nodes - 1; i >= 0; i--) /* usually the node just added */
        if (g->nodes[i] == n) {
            g->values[id].node = i;
            break;
        }
    n->out[index] = id;
    uint32_t h = hash(copy) & (uint32_t)(g->table_cap - 1);
    while (g->table[h])
        h = (h + 1) & (uint32_t)(g->table_cap - 1);
    g->table[h] = id + 1;
    return id;
}

const Value *graph_value(const Graph *g, int id) {
    KILN_ASSERT(id >= 0 && id < g->n_values);
    return &g->values[id];
}

int graph_inputs(const Graph *g, int *ids, int cap) {
    int k = 0;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i]->op == OP_INPUT) {
            if (k < cap)
                ids[k] = g->nodes[i]->out[0];
            k++;
        }
    return k;
}

void graph_remove_nodes(Graph *g, const bool *dead) {
    int kept = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        Node *n = g->nodes[i];
        if (dead[i]) {
            for (int k = 0; k < n->n_out; k++)
                g->values[n->out[k]].node = -1; /* an orphan: no longer in the graph */
            tensor_free(n->data);
            n->data = NULL;
            continue;
        }
        for (int k = 0; k < n->n_out; k++)
            g->values[n->out[k]].node = kept;
        g->nodes[kept++] = n;
    }
    g->n_nodes = kept;
}

int infer_node(Graph *g, Node *n, Diag *d) {
    return op_table[n->op].infer(g, n, d);
}

int infer_decl(Graph *g, Node *n, Diag *d) {
    (void)g, (void)n, (void)d;
    return 0; /* a declaration's type is the one it declares */
}
