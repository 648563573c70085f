/* The graph as Graphviz text (kiln dot).
 *
 * Every node of the graph becomes a dot node named n<INDEX>: declarations in their
 * own shapes and colours (inputs blue, params yellow, consts grey), ops as boxes
 * with the op, the value's name and its type; every output gets a green node of
 * its own. Edges follow the values; an edge is labelled only where the label
 * tells something the nodes do not: which result of a node with several, or the
 * type of a fused op's result.
 *
 * A fused op is drawn as a cluster of the ops it stands for, so that a reader sees
 * what a fusion pass did: the tree of its `expr` attribute, read by the language's
 * expression parser, and for a fused op with a head (fused_conv) the head op, whose
 * result is the expression's $0. Ops are found by their `expr` attribute, so the
 * drawing needs no change when such an op joins the op table. */
#include "ir.h"

#include <stdlib.h>
#include <string.h>

/* A label: quotes and backslashes escaped, line breaks as dot's \n; n bytes of s
 * or up to its end. */
static void put_escaped_n(const char *s, size_t n, FILE *f) {
    for (; n-- && *s; s++) {
        if (*s == '"' || *s == '\\')
            fputc('\\', f);
        if (*s == '\n')
            fputs("\\n", f);
        else
            fputc(*s, f);
    }
}

static void put_escaped(const char *s, FILE *f) {
    put_escaped_n(s, (size_t)-1, f);
}

/* The printable value of attribute `id` of n, its default when unset; NULL when
 * the op has no such attribute or it is unset without a default. */
static const char *attr_text(const Node *n, AttrId id, char *buf, size_t cap) {
    int i = op_attr_index(n->op, id);
    if (i < 0)
        return NULL;
    const AttrSpec *s = &op_table[n->op].attrs[i];
    const Attr *a = &n->attrs[i];
    if (!a->set && s->def != DEF_VALUE)
        return NULL;
    switch (s->kind) {
    case A_INT: snprintf(buf, cap, "%lld", (long long)(a->set ? a->i : (int64_t)s->dflt)); break;
    case A_BOOL: snprintf(buf, cap, "%s", (a->set ? a->i : s->dflt != 0) ? "true" : "false"); break;
    case A_FLOAT: format_double(a->set ? a->f : s->dflt, buf, cap); break;
    case A_ENUM: snprintf(buf, cap, "%s", node_enum_word(n, id)); break;
    case A_STRING: snprintf(buf, cap, "%s", a->s); break;
    case A_INTS:
    case A_FLOATS: {
        size_t len = (size_t)snprintf(buf, cap, "[");
        for (int k = 0; a->set && k < a->n && len < cap; k++) {
            char num[64];
            if (s->kind == A_INTS)
                snprintf(num, sizeof num, "%lld", (long long)a->ints[k]);
            else
                format_double(a->floats[k], num, sizeof num);
            len += (size_t)snprintf(buf + len, cap - len, "%s%s", k ? ", " : "", num);
        }
        if (len < cap)
            snprintf(buf + len, cap - len, "]");
        break;
    }
    }
    return buf;
}

/* ---- Expressions: `relu(add($0, mul($1, 0.5)))` ----
 *
 * Read with the language's own expression parser (ir/op_elementwise_expr.c); the
 * tree's nodes are numbered in preorder, inputs included. */

/* Writes the dot nodes and inner edges of e (number *next) to f, the edges from the
 * inputs to `outside` (an edge written inside a cluster would pull its tail into
 * the cluster), and returns through `root` the dot name of the node computing it. */
static void emit_expr(const Expr *e, int *next, const char *prefix, const char *const *inputs, FILE *f,
                      FILE *outside, char *root, size_t cap) {
    int id = (*next)++;
    char num[64];
    if (e->kind == EXPR_INPUT) {
        snprintf(root, cap, "%s", inputs[e->input]);
        return;
    }
    snprintf(root, cap, "%s_%d", prefix, id);
    if (e->kind == EXPR_NUMBER) {
        format_float((float)e->number, num, sizeof num);
        fprintf(f, "    %s [label=\"%s\", shape=plaintext];\n", root, num);
        return;
    }
    const OpInfo *o = &op_table[e->call.op];
    fprintf(f, "    %s [label=\"%s", root, o->name);
    const char *sep = "\\n";
    for (int k = 0; k < o->n_attrs; k++) {
        const Attr *a = &e->call.attrs[k];
        if (!a->set)
            continue;
        if (o->attrs[k].kind == A_FLOAT)
            format_double(a->f, num, sizeof num);
        else
            snprintf(num, sizeof num, "%s", node_enum_word(&e->call, o->attrs[k].id));
        fprintf(f, "%s%s=%s", sep, attr_name(o->attrs[k].id), num);
        sep = ", ";
    }
    fputs("\"];\n", f);
    for (int k = 0; k < e->call.n_in; k++) {
        char from[128];
        emit_expr(e->arg[k], next, prefix, inputs, f, outside, from, sizeof from);
        fprintf(e->arg[k]->kind == EXPR_INPUT ? outside : f, "%s%s -> %s;\n",
                e->arg[k]->kind == EXPR_INPUT ? "  " : "    ", from, root);
    }
}

int dot_expr(FILE *f, FILE *outside, const char *expr, const char *prefix, const char *const *inputs,
             int n_inputs, char *root, size_t root_cap) {
    Arena arena = {0};
    char *msg = NULL;
    size_t len = 0;
    FILE *quiet = open_memstream(&msg, &len); /* a malformed expression is drawn as a plain node */
    Diag d;
    diag_init(&d, quiet);
    const Expr *e = quiet ? expr_parse(&arena, OP_ELEMENTWISE, expr, n_inputs, (Loc){0}, &d) : NULL;
    if (quiet)
        fclose(quiet);
    free(msg);
    int next = 0;
    if (e)
        emit_expr(e, &next, prefix, inputs, f, outside, root, root_cap);
    arena_free(&arena);
    return e ? 0 : -1;
}

/* What every node's results are drawn from: the dot node, per graph node. */
typedef char DotName[64];

/* An edge carrying value v into dst; labelled only with what no node shows: which
 * result of a node with several, or the type of a fused op's result, whose cluster
 * ends in an op that shows no type. */
static void edge(FILE *f, const Graph *g, DotName *src, int v, const char *dst) {
    const Value *val = &g->values[v];
    const Node *from = g->nodes[val->node];
    char ty[160];
    fprintf(f, "  %s -> %s", src[val->node], dst);
    type_str(&val->type, ty, sizeof ty);
    if (from->n_out > 1) {
        fputs(" [label=\"", f);
        put_escaped(val->name, f);
        fprintf(f, " : %s\"]", ty);
    } else if (strchr(src[val->node], '_')) {
        fprintf(f, " [label=\"%s\"]", ty);
    }
    fputs(";\n", f);
}

static void node_results(FILE *f, const Graph *g, const Node *n) {
    char ty[160];
    for (int k = 0; k < n->n_out; k++) {
        fputs("\\n", f);
        put_escaped(g->values[n->out[k]].name, f);
        fprintf(f, " : %s", type_str(&g->values[n->out[k]].type, ty, sizeof ty));
    }
}

/* The cluster of an op with an `expr` attribute; false when it has none or the
 * expression cannot be read. */
static bool draw_expr(FILE *f, const Graph *g, int i, DotName *src) {
    const Node *n = g->nodes[i];
    int a = op_attr_index(n->op, ATTR_EXPR);
    const char *expr = a >= 0 && n->attrs[a].set ? n->attrs[a].s : NULL;
    if (!expr || n->n_out != 1)
        return false;
    /* the expression's inputs are the dot nodes of the op's inputs */
    const char **inputs = ir_calloc((size_t)n->n_in + 1, sizeof *inputs);
    DotName *names = ir_calloc((size_t)n->n_in + 1, sizeof *names);
    char *inner = NULL, *outer = NULL;
    size_t inner_len = 0, outer_len = 0;
    FILE *body = inputs && names ? open_memstream(&inner, &inner_len) : NULL;
    FILE *edges = body ? open_memstream(&outer, &outer_len) : NULL;
    bool ok = body && edges;
    /* $0 is the head's result (fused_conv's conv), or input 0 */
    int first = expr_first_input(n), n_expr = first ? 1 + (n->n_in > first ? n->n_in - first : 0) : n->n_in;
    char prefix[32], root[64] = "";
    snprintf(prefix, sizeof prefix, "n%d", i);
    if (first)
        snprintf(names[0], sizeof names[0], "%s_head", prefix);
    for (int k = 0; ok && k < n_expr; k++) {
        int in = first ? (k ? first + k - 1 : -1) : k;
        ok = in < 0 || n->in[in] >= 0;
        if (ok && in >= 0)
            snprintf(names[k], sizeof names[k], "%s", src[g->values[n->in[in]].node]);
        inputs[k] = names[k];
    }
    ok = ok && dot_expr(body, edges, expr, prefix, inputs, n_expr, root, sizeof root) == 0;
    if (body)
        fclose(body);
    if (edges)
        fclose(edges);
    /* an expression that is only `$k` computes nothing to draw */
    ok = ok && strncmp(root, prefix, strlen(prefix)) == 0 && root[strlen(prefix)] == '_';
    if (ok) {
        fprintf(f,
                "  subgraph cluster_%d {\n    style=\"rounded,dashed\"; color=\"#6c757d\"; fontsize=10; "
                "label=\"%s",
                i, op_table[n->op].name);
        node_results(f, g, n);
        fputs("\";\n", f);
        if (first) { /* "fused_conv" stands for "conv", with the attributes given */
            fprintf(f, "    %s [label=\"%s", names[0], op_table[n->op].name + strlen("fused_"));
            for (int j = 0; j < op_table[n->op].n_attrs; j++) {
                char val[256];
                AttrId id = op_table[n->op].attrs[j].id;
                if (n->attrs[j].set && id != ATTR_EXPR && attr_text(n, id, val, sizeof val)) {
                    fputs("\\n", f);
                    put_escaped(attr_name(id), f);
                    fputc('=', f);
                    put_escaped(val, f);
                }
            }
            fputs("\"];\n", f);
        }
        fprintf(f, "%s  }\n%s", inner, outer);
        for (int k = 0; k < first && k < n->n_in; k++)
            if (n->in[k] >= 0)
                edge(f, g, src, n->in[k], names[0]);
        snprintf(src[i], sizeof src[i], "%s", root);
    }
    free(inner);
    free(outer);
    ir_free(inputs);
    ir_free(names);
    return ok;
}

void print_dot(const Graph *g, FILE *f) {
    DotName *src = ir_calloc((size_t)g->n_nodes + 1, sizeof *src);
    if (!src)
        return;
    fputs("digraph \"", f);
    put_escaped(g->name ? g->name : "model", f);
    fputs("\" {\n  graph [fontname=\"Helvetica\", labelloc=t, label=\"model ", f);
    put_escaped(g->name ? g->name : "model", f);
    fputs("\"];\n  node [fontname=\"Helvetica\", fontsize=10, shape=box];\n"
          "  edge [fontname=\"Helvetica\", fontsize=9];\n",
          f);
    char ty[160];
    for (int i = 0; i < g->n_nodes; i++) {
        const Node *n = g->nodes[i];
        snprintf(src[i], sizeof src[i], "n%d", i);
        if (op_is_decl(n->op)) {
            static const char *const style[] = {
                [OP_INPUT] = "shape=invhouse, style=filled, fillcolor=\"#cfe2ff\"",
                [OP_PARAM] = "shape=box, style=\"rounded,filled\", fillcolor=\"#fff3cd\"",
                [OP_CONST] = "shape=note, style=filled, fillcolor=\"#e9ecef\"",
            };
            const Value *v = &g->values[n->out[0]];
            fprintf(f, "  n%d [%s, label=\"%s ", i, style[n->op], op_table[n->op].name);
            put_escaped(v->name, f);
            fprintf(f, "\\n%s\"];\n", type_str(&v->type, ty, sizeof ty));
            continue;
        }
        if (draw_expr(f, g, i, src))
            continue;
        fprintf(f, "  n%d [label=\"%s", i, op_table[n->op].name);
        node_results(f, g, n);
        fputs("\"];\n", f);
        char dst[64];
        snprintf(dst, sizeof dst, "n%d", i);
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k] >= 0)
                edge(f, g, src, n->in[k], dst);
    }
    for (int k = 0; k < g->n_outputs; k++) {
        fprintf(f, "  out%d [shape=house, style=filled, fillcolor=\"#d1e7dd\", label=\"output ", k);
        put_escaped(g->values[g->outputs[k]].name, f);
        fputs("\"];\n", f);
        char dst[64];
        snprintf(dst, sizeof dst, "out%d", k);
        edge(f, g, src, g->outputs[k], dst);
    }
    /* an update goes back to its param: drawn dashed, and left out of the ranking */
    for (int k = 0; k < g->n_updates; k++)
        fprintf(f, "  %s -> %s [style=dashed, constraint=false, label=\"update\"];\n",
                src[g->values[g->updates[k].value].node], src[g->values[g->updates[k].param].node]);
    fputs("}\n", f);
    ir_free(src);
}
