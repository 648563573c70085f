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
    g->values[id] = (Value){copy, {DT_F32, 0, {0}, NULL, 0}, -1, index};
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
    static const Value no_value = {"<no value>", {DT_F32, 0, {0}, NULL, 0}, -1, 0};
    return KILN_CHECK(id >= 0 && id < g->n_values) ? &g->values[id] : &no_value;
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
        for (int k = 0; k < n->n_out; k++)
            if (g->values[n->out[k]].node == i) /* not taken over by graph_redefine */
                g->values[n->out[k]].node = dead[i] ? -1 : kept;
        if (dead[i]) {
            tensor_free(n->data);
            n->data = NULL;
            continue;
        }
        g->nodes[kept++] = n;
    }
    g->n_nodes = kept;
}

void graph_replace_uses(Graph *g, int from, int to) {
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i]->n_in; k++)
            if (g->nodes[i]->in[k] == from)
                g->nodes[i]->in[k] = to;
    for (int k = 0; k < g->n_outputs; k++)
        if (g->outputs[k] == from)
            g->outputs[k] = to;
    for (int k = 0; k < g->n_updates; k++)
        if (g->updates[k].value == from)
            g->updates[k].value = to;
}

void graph_redefine(Graph *g, int id, Node *n, int index) {
    int at = g->n_nodes - 1;
    while (at >= 0 && g->nodes[at] != n)
        at--;
    if (!KILN_CHECK(at >= 0 && index < n->n_out))
        return;
    n->out[index] = id;
    g->values[id].node = at;
    g->values[id].index = index;
}

/* Iterative depth-first order: each node is placed after the definers of its
 * inputs, and otherwise as early as its old position says, so a graph already in
 * order is left unchanged and an appended node moves up to just before its first use. */
int graph_sort(Graph *g) {
    int n = g->n_nodes;
    Node **order = ir_malloc(sizeof *order * (size_t)(n + 1));
    int *state = ir_calloc((size_t)n + 1, sizeof *state); /* 0 new, 1 on the stack, 2 placed */
    int *stack = ir_malloc(sizeof *stack * (size_t)(n + 1));
    if (!order || !state || !stack) {
        ir_free(order), ir_free(state), ir_free(stack);
        return -1;
    }
    int placed = 0;
    for (int root = 0; root < n; root++) {
        if (state[root])
            continue;
        int top = 0;
        stack[top++] = root;
        state[root] = 1;
        while (top > 0) {
            Node *node = g->nodes[stack[top - 1]];
            int next = -1;
            for (int k = 0; k < node->n_in && next < 0; k++) {
                int v = node->in[k];
                int def = v >= 0 ? g->values[v].node : -1;
                if (def >= 0 && state[def] == 0)
                    next = def;
                KILN_ASSERT(def < 0 || state[def] != 1); /* a cycle */
            }
            if (next >= 0) {
                state[next] = 1;
                stack[top++] = next;
            } else {
                state[stack[top - 1]] = 2;
                order[placed++] = node;
                top--;
            }
        }
    }
    for (int i = 0; i < n; i++) {
        g->nodes[i] = order[i];
        for (int k = 0; k < order[i]->n_out; k++)
            g->values[order[i]->out[k]].node = i;
    }
    ir_free(order), ir_free(state), ir_free(stack);
    return 0;
}

const char *graph_fresh_name(Graph *g, const char *base, bool (*taken)(const char *name, void *ctx),
                             void *ctx) {
    size_t cap = strlen(base) + 24;
    char *name = arena_alloc(&g->arena, cap);
    if (!name)
        return NULL;
    snprintf(name, cap, "%s", base);
    for (int k = 1; graph_find(g, name) >= 0 || (taken && taken(name, ctx)); k++)
        snprintf(name, cap, "%s.%d", base, k);
    return name;
}

void graph_count_uses(const Graph *g, int *uses) {
    memset(uses, 0, sizeof *uses * (size_t)g->n_values);
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i]->n_in; k++)
            if (g->nodes[i]->in[k] >= 0)
                uses[g->nodes[i]->in[k]]++;
    for (int k = 0; k < g->n_outputs; k++)
        uses[g->outputs[k]]++;
    for (int k = 0; k < g->n_updates; k++)
        uses[g->updates[k].value]++;
}

void graph_mark_results(const Graph *g, bool *result) {
    for (int k = 0; k < g->n_outputs; k++)
        result[g->outputs[k]] = true;
    for (int k = 0; k < g->n_updates; k++)
        result[g->updates[k].value] = true;
}

const Update *graph_update_of(const Graph *g, int v) {
    for (int k = 0; k < g->n_updates; k++)
        if (g->updates[k].param == v)
            return &g->updates[k];
    return NULL;
}

/* An op given inputs of a dtype it does not take (f32, or for F_ANY_DTYPE the first
 * input's, or for an op that takes integers too an integer first input's): every
 * input and its type named. */
static int check_dtypes(const Graph *g, const Node *n, Diag *d) {
    DType first = n->n_in > 0 ? g->values[n->in[0]].type.dtype : DT_F32;
    bool any = op_has(n->op, F_ANY_DTYPE) || (op_takes_ints(n->op) && dtype_is_int(first)), same = true;
    DType want = any ? first : DT_F32;
    for (int k = 0; k < n->n_in; k++)
        same &= n->in[k] < 0 || g->values[n->in[k]].type.dtype == want;
    if (same)
        return 0;
    char list[1024], t[160];
    size_t len = 0;
    for (int k = 0; k < n->n_in && len < sizeof list; k++)
        if (n->in[k] >= 0)
            len +=
                (size_t)snprintf(list + len, sizeof list - len, "%s'%.100s' is %s", len ? ", " : "",
                                 g->values[n->in[k]].name, type_str(&g->values[n->in[k]].type, t, sizeof t));
    return diag_error(d, n->loc, any ? "%s takes inputs of one dtype: %s" : "%s takes f32 inputs: %s",
                      op_table[n->op].name, list);
}

/* Every op's inference ends in the same check of its results, so that no type with a
 * negative dim or more than KILN_MAX_NUMEL elements ever reaches the passes, the
 * interpreter's allocations, the memory planner or lowering, whatever an op's own
 * checks forgot. */
int infer_node(Graph *g, Node *n, Diag *d) {
    if (!op_has(n->op, F_TYPED) && check_dtypes(g, n, d))
        return -1;
    if (op_table[n->op].infer(g, n, d))
        return -1;
    if (op_has(n->op, F_ANY_DTYPE))
        g->values[n->out[0]].type.dtype = g->values[n->in[0]].type.dtype;
    if (g->sym.name && infer_symbolic(g, n, d))
        return -1;
    for (int k = 0; k < n->n_out; k++)
        if (n->out[k] >= 0 && check_size(n, &g->values[n->out[k]].type, d))
            return -1;
    return 0;
}

int infer_decl(Graph *g, Node *n, Diag *d) {
    (void)g, (void)n, (void)d;
    return 0; /* a declaration's type is the one it declares */
}
