/* What passes share: compile-time values and new params. */
#include "passes.h"

#include <string.h>

Node *pass_definer(const Graph *g, int v) {
    int node = v >= 0 ? g->values[v].node : -1;
    return node >= 0 ? g->nodes[node] : NULL;
}

Node *pass_single_use(const Graph *g, const int *uses, int v, OpId op) {
    Node *n = pass_definer(g, v);
    return n && n->op == op && uses[v] == 1 ? n : NULL;
}

Node *pass_only_reader(const Graph *g, const int *uses, int v, OpId op, int *at) {
    if (uses[v] != 1)
        return NULL;
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i]->n_in; k++)
            if (g->nodes[i]->in[k] == v) {
                *at = i;
                return g->nodes[i]->op == op ? g->nodes[i] : NULL;
            }
    return NULL;
}

int pass_fuse_each(PassContext *c, OpId op, PassFuseAt fuse_at) {
    Graph *g = c->g;
    int n_nodes = g->n_nodes;
    int *uses = ir_calloc((size_t)g->n_values + 1, sizeof *uses);
    bool *dead = ir_calloc((size_t)n_nodes + 1, 1);
    int rc = uses && dead ? 0 : diag_error(c->d, (Loc){0}, "out of memory");
    if (rc == 0)
        graph_count_uses(g, uses);
    for (int i = 0; rc == 0 && i < n_nodes; i++)
        if (g->nodes[i]->op == op && !dead[i])
            rc = fuse_at(c, i, uses, dead);
    if (rc == 0)
        rc = pass_remove_dead(c, dead, n_nodes);
    ir_free(uses), ir_free(dead);
    return rc;
}

int pass_remove_dead(PassContext *c, const bool *dead, int n_nodes) {
    bool *all = ir_calloc((size_t)c->g->n_nodes + 1, 1);
    if (!all)
        return diag_error(c->d, (Loc){0}, "out of memory");
    memcpy(all, dead, (size_t)n_nodes);
    graph_remove_nodes(c->g, all);
    ir_free(all);
    return graph_sort(c->g) ? diag_error(c->d, (Loc){0}, "out of memory") : 0;
}

int pass_known_value(PassContext *c, int v, Tensor **out) {
    Node *n = pass_definer(c->g, v);
    *out = NULL;
    if (!n)
        return 0;
    if (n->op == OP_CONST) {
        *out = tensor_clone(n->data);
        return *out ? 1 : diag_error(c->d, n->loc, "out of memory");
    }
    if (n->op != OP_PARAM || graph_update_of(c->g, v) ||
        (n->init.kind == INIT_NONE && !tensors_find(c->weights, c->g->values[v].name)))
        return 0;
    return param_value(c->g, n, c->weights, out, c->d) ? -1 : 1;
}

bool pass_known_scalar(PassContext *c, int v, double *out, int *rc) {
    if (type_numel(&c->g->values[v].type) != 1 || c->g->values[v].type.dtype != DT_F32)
        return false;
    Tensor *t = NULL;
    int known = pass_known_value(c, v, &t);
    if (known < 0)
        *rc = -1;
    if (known == 1)
        *out = t->data[0];
    tensor_free(t);
    return known == 1;
}

static bool weight_named(const char *name, void *weights) {
    return tensors_find(weights, name) != NULL;
}

int pass_add_param(PassContext *c, const char *base, Tensor *t, Loc loc) {
    const char *name = graph_fresh_name(c->g, base, weight_named, c->weights);
    Node *n = name ? graph_add_node(c->g, OP_PARAM, 0, 1, loc) : NULL;
    int id = n ? graph_define(c->g, name, n, 0) : -1;
    if (id < 0) {
        tensor_free(t);
        return diag_error(c->d, loc, "out of memory");
    }
    c->g->values[id].type = t->type;
    return tensors_add(c->weights, name, t) ? diag_error(c->d, loc, "out of memory") : id;
}

Node *pass_new_node(PassContext *c, OpId op, int n_in, const int *in, const char *base, Loc loc) {
    const char *name = graph_fresh_name(c->g, base, weight_named, c->weights);
    Node *n = name ? graph_add_node(c->g, op, n_in, 1, loc) : NULL;
    if (!n || graph_define(c->g, name, n, 0) < 0) {
        diag_error(c->d, loc, "out of memory");
        return NULL;
    }
    for (int k = 0; k < n_in; k++)
        n->in[k] = in[k];
    return n;
}

static Attr *attr_slot(Node *n, AttrId id) {
    int i = op_attr_index(n->op, id);
    KILN_ASSERT(i >= 0);
    n->attrs[i].set = true;
    return &n->attrs[i];
}

void pass_set_int(Node *n, AttrId attr, int64_t v) {
    attr_slot(n, attr)->i = v;
}

void pass_set_float(Node *n, AttrId attr, double v) {
    attr_slot(n, attr)->f = v;
}

void pass_set_enum(Node *n, AttrId attr, int choice) {
    attr_slot(n, attr)->i = choice;
}

int pass_set_ints(PassContext *c, Node *n, AttrId attr, const int64_t *v, int count) {
    Attr *a = attr_slot(n, attr);
    a->ints = arena_alloc(&c->g->arena, sizeof *v * (size_t)(count + 1));
    if (!a->ints)
        return diag_error(c->d, n->loc, "out of memory");
    memcpy(a->ints, v, sizeof *v * (size_t)count);
    a->n = count;
    return 0;
}

int pass_set_shape(PassContext *c, Node *n, const int64_t *dims, int rank, bool sym) {
    int64_t shape[KILN_MAX_RANK];
    memcpy(shape, dims, sizeof *dims * (size_t)rank);
    if (sym)
        shape[0] = -1;
    return pass_set_ints(c, n, ATTR_SHAPE, shape, rank);
}

int pass_finish(PassContext *c, Node *n) {
    if (attrs_normalize(c->g, n, c->d) || infer_node(c->g, n, c->d))
        return diag_internal(c->d, n->loc, "a pass built an invalid '%s' (a bug in kiln)",
                             op_table[n->op].name);
    return n->out[0];
}
