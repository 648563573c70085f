/* The reference interpreter: the oracle every target and pass is tested against.
 *
 * It walks the nodes in order, materializes each declaration (inputs as given,
 * params from the weights or their initializer, consts from their literal), calls
 * the op table's reference kernel with freshly allocated results, and frees every
 * value after its last use. A model with a symbolic dim runs at the size its
 * inputs give: each result is allocated at that size, and the kernels work from
 * their tensors' own types. Kernels are in the op_*.c files. */
#include "ir.h"

#include <string.h>

int tensors_add(TensorList *l, const char *name, Tensor *t) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        NamedTensor *items = ir_realloc(l->items, sizeof *items * (size_t)cap);
        if (!items) {
            tensor_free(t);
            return -1;
        }
        l->items = items;
        l->cap = cap;
    }
    char *copy = ir_strdup(name);
    if (!copy) {
        tensor_free(t);
        return -1;
    }
    l->items[l->n++] = (NamedTensor){copy, t};
    return 0;
}

Tensor *tensors_find(const TensorList *l, const char *name) {
    for (int i = 0; l && i < l->n; i++)
        if (strcmp(l->items[i].name, name) == 0)
            return l->items[i].tensor;
    return NULL;
}

void tensors_free(TensorList *l) {
    for (int i = 0; i < l->n; i++) {
        ir_free(l->items[i].name);
        tensor_free(l->items[i].tensor);
    }
    ir_free(l->items);
    *l = (TensorList){0};
}

int param_value(const Graph *g, const Node *param, const TensorList *weights, Tensor **out, Diag *d) {
    const Value *v = &g->values[param->out[0]];
    const Tensor *w = tensors_find(weights, v->name);
    if (w && !type_equal(&w->type, &v->type)) {
        char a[160], b[160];
        return diag_error(d, param->loc, "weight '%s' has type %s, but the param is declared %s", v->name,
                          type_str(&w->type, a, sizeof a), type_str(&v->type, b, sizeof b));
    }
    if (!w && param->init.kind == INIT_NONE)
        return diag_error(d, param->loc, "missing weight '%s' (give it with --weights, or an initializer)",
                          v->name);
    *out = w ? tensor_clone(w) : tensor_new(&v->type);
    if (!*out)
        return diag_error(d, param->loc, "out of memory for '%s'", v->name);
    if (!w)
        param_init_fill(&param->init, *out);
    return 0;
}

/* The size of the graph's symbolic dim the inputs give (1 when it has none): every
 * input's type must admit them, all at one size. */
static int inputs_sym_size(const Graph *g, const Tensor *const *inputs, int64_t *size, Diag *d) {
    int next = 0;
    *size = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const Node *n = g->nodes[i];
        if (n->op != OP_INPUT)
            continue;
        const Type *want = &g->values[n->out[0]].type;
        const Tensor *in = inputs[next++];
        int64_t size_here = 0;
        char a[160], b[160];
        if (!type_admits(want, &in->type, &size_here))
            return diag_error(d, n->loc, "input '%s' is %s, which is not %s", g->values[n->out[0]].name,
                              type_str(&in->type, a, sizeof a), type_str(want, b, sizeof b));
        if (size_here && *size && size_here != *size)
            return diag_error(d, n->loc,
                              "input '%s' is %s: %s = %lld, but the inputs before it give %s = %lld",
                              g->values[n->out[0]].name, type_str(&in->type, a, sizeof a), want->sym,
                              (long long)size_here, want->sym, (long long)*size);
        if (size_here)
            *size = size_here;
    }
    if (!*size)
        *size = 1;
    return 0;
}

static int eval_node(const Graph *g, const Node *n, int64_t sym_size, Tensor **vals, Diag *d) {
    const OpInfo *o = &op_table[n->op];
    if (!o->eval) {
        if (n->op == OP_GRAD)
            return diag_internal(d, n->loc,
                                 "grad must be expanded by the autodiff pass before it runs (a bug in kiln)");
        return diag_error(d, n->loc, "%s has no reference kernel yet", o->name);
    }
    int lo, hi;
    op_arity(n->op, &lo, &hi);
    /* absent optional inputs, trailing ones included, are NULL */
    int n_args = hi > n->n_in ? hi : n->n_in;
    const Tensor **in = ir_calloc((size_t)n_args, sizeof *in);
    Tensor **out = ir_calloc((size_t)n->n_out, sizeof *out);
    int rc = in && out ? 0 : diag_error(d, n->loc, "out of memory");
    for (int i = 0; !rc && i < n->n_in; i++)
        in[i] = n->in[i] >= 0 ? vals[n->in[i]] : NULL;
    for (int i = 0; !rc && i < n->n_out; i++) {
        Type t = type_at(&g->values[n->out[i]].type, sym_size);
        out[i] = vals[n->out[i]] = tensor_new(&t);
        if (!out[i])
            rc = diag_error(d, n->loc, "out of memory for '%s'", g->values[n->out[i]].name);
    }
    if (!rc)
        rc = o->eval(n, in, out, d);
    ir_free(in);
    ir_free(out);
    return rc;
}

int interp_run_updates(const Graph *g, const TensorList *weights, const Tensor *const *inputs,
                       Tensor **outputs, Tensor **state, Diag *d) {
    Tensor **vals = ir_calloc((size_t)g->n_values + 1, sizeof *vals);
    int *last_use = ir_malloc(sizeof(int) * ((size_t)g->n_values + 1));
    int rc = 0, next_input = 0;
    if (!vals || !last_use) {
        ir_free(vals), ir_free(last_use);
        return diag_error(d, (Loc){0}, "out of memory");
    }
    for (int v = 0; v < g->n_values; v++)
        last_use[v] = g->values[v].node;
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i]->n_in; k++)
            if (g->nodes[i]->in[k] >= 0)
                last_use[g->nodes[i]->in[k]] = i;
    for (int k = 0; k < g->n_outputs; k++)
        last_use[g->outputs[k]] = g->n_nodes;
    for (int k = 0; k < g->n_updates; k++)
        last_use[g->updates[k].value] = g->n_nodes;
    int64_t sym_size = 1;
    if (g->sym.name)
        rc = inputs_sym_size(g, inputs, &sym_size, d);

    for (int i = 0; i < g->n_nodes && !rc; i++) {
        const Node *n = g->nodes[i];
        Tensor **slot = &vals[n->out[0]];
        switch (n->op) {
        case OP_INPUT:
            *slot = tensor_clone(inputs[next_input++]);
            if (!*slot)
                rc = diag_error(d, n->loc, "out of memory");
            break;
        case OP_PARAM: rc = param_value(g, n, weights, slot, d); break;
        case OP_CONST:
            *slot = tensor_clone(n->data);
            if (!*slot)
                rc = diag_error(d, n->loc, "out of memory");
            break;
        default: rc = eval_node(g, n, sym_size, vals, d); break;
        }
        for (int k = 0; k < n->n_in; k++) {
            int v = n->in[k];
            if (v >= 0 && last_use[v] == i) {
                tensor_free(vals[v]);
                vals[v] = NULL;
            }
        }
    }
    for (int k = 0; k < g->n_outputs; k++) {
        int v = g->outputs[k];
        /* an output named twice gets its own copy each time */
        outputs[k] = rc ? NULL : tensor_clone(vals[v]);
        if (!rc && !outputs[k])
            rc = diag_error(d, (Loc){0}, "out of memory");
    }
    for (int k = 0; state && k < g->n_updates; k++) {
        state[k] = rc ? NULL : tensor_clone(vals[g->updates[k].value]);
        if (!rc && !state[k])
            rc = diag_error(d, (Loc){0}, "out of memory");
    }
    if (rc) {
        for (int k = 0; k < g->n_outputs; k++) {
            tensor_free(outputs[k]);
            outputs[k] = NULL;
        }
        for (int k = 0; state && k < g->n_updates; k++) {
            tensor_free(state[k]);
            state[k] = NULL;
        }
    }
    for (int v = 0; v < g->n_values; v++)
        tensor_free(vals[v]);
    ir_free(vals);
    ir_free(last_use);
    return rc;
}

int interp_run(const Graph *g, const TensorList *weights, const Tensor *const *inputs, Tensor **outputs,
               Diag *d) {
    return interp_run_updates(g, weights, inputs, outputs, NULL, d);
}

int interp_step(const Graph *g, TensorList *weights, const Tensor *const *inputs, Tensor **outputs, Diag *d) {
    Tensor **state = ir_calloc((size_t)g->n_updates + 1, sizeof *state);
    if (!state)
        return diag_error(d, (Loc){0}, "out of memory");
    int rc = interp_run_updates(g, weights, inputs, outputs, state, d);
    for (int k = 0; k < g->n_updates; k++) {
        const char *name = g->values[g->updates[k].param].name;
        NamedTensor *w = NULL;
        for (int i = 0; i < weights->n && !w; i++)
            if (strcmp(weights->items[i].name, name) == 0)
                w = &weights->items[i];
        if (rc)
            tensor_free(state[k]);
        else if (w) {
            tensor_free(w->tensor);
            w->tensor = state[k];
        } else if (tensors_add(weights, name, state[k]))
            rc = diag_error(d, (Loc){0}, "out of memory");
    }
    ir_free(state);
    return rc;
}
