/* Dead-code elimination: removes every node whose results reach no output.
 *
 * Walking the nodes backwards, a node is live when one of its results is an output
 * or an input of a live node; its own inputs then become live. Because nodes are
 * in dependency order, one backward walk sees every use before the definition.
 * Inputs are always kept: they are part of the model's calling convention. Removing
 * a node that no output depends on cannot change any output. */
#include "passes.h"

int pass_dce(PassContext *c) {
    Graph *g = c->g;
    Diag *d = c->d;
    bool *live = ir_calloc((size_t)g->n_values + 1, sizeof *live);
    bool *dead = ir_calloc((size_t)g->n_nodes + 1, sizeof *dead);
    if (!live || !dead) {
        ir_free(live), ir_free(dead);
        return diag_error(d, (Loc){0}, "out of memory");
    }
    graph_mark_results(g, live);
    for (int k = 0; k < g->n_updates; k++)
        live[g->updates[k].param] = true;
    for (int i = g->n_nodes - 1; i >= 0; i--) {
        Node *n = g->nodes[i];
        bool used = n->op == OP_INPUT;
        for (int k = 0; k < n->n_out; k++)
            used |= live[n->out[k]];
        dead[i] = !used;
        for (int k = 0; used && k < n->n_in; k++)
            if (n->in[k] >= 0)
                live[n->in[k]] = true;
    }
    graph_remove_nodes(g, dead);
    ir_free(live);
    ir_free(dead);
    return 0;
}
