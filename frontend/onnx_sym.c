/* An ONNX model's symbolic batch: the graph imported at the dim's bound, made one
 * graph for every size of it.
 *
 * An export with dynamic axes computes its shapes at run time (Shape, Gather,
 * Concat feeding Reshape), which the importer folds into attributes, so a graph
 * imported with the dim at one size holds that size in its attributes. The model is
 * therefore imported twice, at the bound and at the bound - 1 (a position table
 * of the bound's size still holds it), and the two graphs
 * compared node by node: what is the same in both does not depend on the dim; what
 * differs does, and must be something kiln can say without the size:
 *   - a graph input whose first dim is k times the dim: f32[N*k, ...] (the dim in
 *     another place of an input is an error);
 *   - a reshape's shape: the result's own dims at the bound, its first -1, so that
 *     the rows follow the input's;
 *   - an expand's entry equal to its input's dim there: 1, which broadcasting keeps;
 *   - anything else (another attribute, a constant computed from a shape) is an error
 *     naming the node.
 * Then every node is inferred again with the dim symbolic (ir/symbolic.c), which
 * also checks that no op mixes the items. */
#include "onnx_internal.h"

#include <string.h>

/* Whether attribute a is the same in both graphs. */
static bool same_attr(const Attr *a, const Attr *b) {
    if (a->set != b->set || a->n != b->n || a->i != b->i || a->f != b->f)
        return false;
    if (a->n && a->ints && b->ints && memcmp(a->ints, b->ints, sizeof *a->ints * (size_t)a->n))
        return false;
    return !(a->n && a->floats && b->floats &&
             memcmp(a->floats, b->floats, sizeof *a->floats * (size_t)a->n));
}

static const char *node_name(const Graph *g, const Node *n) {
    return g->values[n->out[0]].name;
}

/* Rewrites node n's differing attribute (index k) as the dim allows; -1 after an
 * error. */
static int generalize_attr(Graph *g, Node *n, int k, const char *file, const char *dim, Diag *d) {
    const OpInfo *o = &op_table[n->op];
    Attr *a = &n->attrs[k];
    if (n->op == OP_RESHAPE && o->attrs[k].id == ATTR_SHAPE) {
        const Type *y = &g->values[n->out[0]].type;
        int64_t *shape = arena_alloc(&g->arena, sizeof *shape * (size_t)(y->rank + 1));
        if (!shape)
            return diag_error(d, (Loc){0}, "out of memory");
        memcpy(shape, y->dims, sizeof *shape * (size_t)y->rank);
        shape[0] = -1;
        a->ints = shape;
        a->n = y->rank;
        return 0;
    }
    if (n->op == OP_EXPAND && o->attrs[k].id == ATTR_SHAPE) {
        const Type *x = &g->values[n->in[0]].type;
        for (int j = 0; j < a->n; j++) {
            int xj = j - (a->n - x->rank);
            if (xj >= 0 && x->dims[xj] == a->ints[j])
                a->ints[j] = 1; /* broadcasting keeps the input's dim, whatever its size */
        }
        return 0;
    }
    return diag_error(d, (Loc){0},
                      "%s: %s '%s': its %s depends on the symbolic dim '%s', which kiln cannot say without "
                      "its size (fix the dim instead: --dim %s=SIZE)",
                      file, o->name, node_name(g, n), attr_name(o->attrs[k].id), dim, dim);
}

int onnx_generalize(Graph *g, const Graph *probe, const char *dim, int64_t bound, const char *file, Diag *d) {
    if (g->n_nodes != probe->n_nodes)
        return diag_error(d, (Loc){0},
                          "%s: the graph's nodes depend on the symbolic dim '%s' (fix it: --dim %s=SIZE)",
                          file, dim, dim);
    const char *name = arena_strdup(&g->arena, dim);
    if (!name)
        return diag_error(d, (Loc){0}, "out of memory");
    bool any = false;
    for (int i = 0; i < g->n_nodes; i++) {
        Node *n = g->nodes[i];
        const Node *m = probe->nodes[i];
        if (n->op != m->op || n->n_in != m->n_in || n->n_out != m->n_out)
            return diag_error(d, (Loc){0},
                              "%s: the graph's nodes depend on the symbolic dim '%s' (fix it: --dim %s=SIZE)",
                              file, dim, dim);
        Type *t = &g->values[n->out[0]].type;
        const Type *u = &probe->values[m->out[0]].type;
        if (n->op == OP_INPUT && !type_equal(t, u)) {
            int64_t mult = t->dims[0] - u->dims[0];
            bool rest = t->rank == u->rank && t->rank > 0;
            for (int k = 1; rest && k < t->rank; k++)
                rest = t->dims[k] == u->dims[k];
            if (!rest || mult < 1 || t->dims[0] != mult * bound)
                return diag_error(
                    d, (Loc){0},
                    "%s: graph input '%s' has the symbolic dim '%s' other than in its first dim; "
                    "kiln's symbolic dim is a batch (fix it: --dim %s=SIZE)",
                    file, node_name(g, n), dim, dim);
            t->sym = name;
            t->sym_mult = mult;
            any = true;
        }
        if (n->op == OP_CONST && n->data && m->data &&
            (!type_equal(&n->data->type, &m->data->type) ||
             memcmp(n->data->bytes, m->data->bytes,
                    (size_t)(type_numel(&n->data->type) * dtype_size(n->data->type.dtype)))))
            return diag_error(
                d, (Loc){0},
                "%s: the constant '%s' is computed from the symbolic dim '%s' (fix it: --dim %s=SIZE)", file,
                node_name(g, n), dim, dim);
        for (int k = 0; k < op_table[n->op].n_attrs; k++)
            if (!same_attr(&n->attrs[k], &m->attrs[k]) && generalize_attr(g, n, k, file, dim, d))
                return -1;
    }
    if (!any)
        return diag_error(d, (Loc){0}, "%s: no graph input has the symbolic dim '%s'", file, dim);
    g->sym = (SymDim){name, bound, (Loc){0}};
    for (int i = 0; i < g->n_nodes; i++)
        if (!op_is_decl(g->nodes[i]->op) && infer_node(g, g->nodes[i], d))
            return -1;
    return verify_graph(g, d);
}
