/* The verifier: the IR's invariants, checked after parsing and after every pass.
 *
 * - every value is defined by exactly one node, which lists it among its results;
 * - every input is defined by an earlier node (SSA in dependency order);
 * - every node's result types equal what shape inference gives now;
 * - const nodes carry a literal of their type; `output` names defined values.
 * A violation is a bug in a pass, so the message names the node and the rule. */
#include "ir.h"

#include <string.h>

static int fail(Diag *d, const Graph *g, int node, const char *rule) {
    const Node *n = g->nodes[node];
    const char *name = n->n_out > 0 && n->out[0] >= 0 ? g->values[n->out[0]].name : "?";
    return diag_error(d, (Loc){0}, "verifier: node %d (%s defining '%s'): %s", node, op_table[n->op].name,
                      name, rule);
}

int verify_graph(Graph *g, Diag *d) {
    int *def = ir_malloc(sizeof(int) * (size_t)(g->n_values + 1));
    if (!def)
        return diag_error(d, (Loc){0}, "out of memory");
    for (int v = 0; v < g->n_values; v++)
        def[v] = -1;
    int rc = 0;
    for (int i = 0; i < g->n_nodes && !rc; i++) {
        Node *n = g->nodes[i];
        for (int k = 0; k < n->n_in && !rc; k++) {
            int v = n->in[k];
            if (v >= g->n_values || (v >= 0 && def[v] < 0))
                rc = fail(d, g, i, "an input is used before its definition");
        }
        for (int k = 0; k < n->n_out && !rc; k++) {
            int v = n->out[k];
            if (v < 0 || v >= g->n_values || def[v] >= 0)
                rc = fail(d, g, i, "a result is not a fresh value");
            else if (g->values[v].node != i || g->values[v].index != k)
                rc = fail(d, g, i, "a result's value does not point back at its node");
            else
                def[v] = i;
        }
        if (rc)
            break;
        if (n->op == OP_CONST && (!n->data || !type_equal(&n->data->type, &g->values[n->out[0]].type))) {
            rc = fail(d, g, i, "a const has no literal of its type");
            break;
        }
        Type saved[KILN_MAX_RANK * 4];
        int n_saved = n->n_out < (int)(sizeof saved / sizeof *saved) ? n->n_out : 0;
        for (int k = 0; k < n_saved; k++)
            saved[k] = g->values[n->out[k]].type;
        if (infer_node(g, n, d)) {
            rc = fail(d, g, i, "shape inference fails");
            break;
        }
        for (int k = 0; k < n_saved && !rc; k++)
            if (!type_equal(&saved[k], &g->values[n->out[k]].type))
                rc = fail(d, g, i, "a result type differs from what shape inference gives");
    }
    for (int k = 0; k < g->n_outputs && !rc; k++)
        if (g->outputs[k] < 0 || g->outputs[k] >= g->n_values || def[g->outputs[k]] < 0)
            rc = diag_error(d, (Loc){0}, "verifier: output %d is not a defined value", k);
    for (int k = 0; k < g->n_updates && !rc; k++) {
        const Update *u = &g->updates[k];
        bool defined = u->param >= 0 && u->param < g->n_values && def[u->param] >= 0 && u->value >= 0 &&
                       u->value < g->n_values && def[u->value] >= 0;
        if (!defined || g->nodes[def[u->param]]->op != OP_PARAM ||
            !type_equal(&g->values[u->param].type, &g->values[u->value].type) ||
            graph_update_of(g, u->param) != u)
            rc = diag_error(d, u->loc,
                            "verifier: update %d is not a param's only update by a value of its type", k);
    }
    ir_free(def);
    return rc;
}
