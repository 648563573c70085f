/* What passes share: compile-time values and new params. */
#include "passes.h"

#include <string.h>

Node *pass_definer(const Graph *g, int v) {
    int node = v >= 0 ? g->values[v].node : -1;
    return node >= 0 ? g->nodes[node] : NULL;
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
    if (n->op != OP_PARAM || (n->init.kind == INIT_NONE && !tensors_find(c->weights, c->g->values[v].name)))
        return 0;
    return param_value(c->g, n, c->weights, out, c->d) ? -1 : 1;
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
