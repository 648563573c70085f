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
 * what a fusion pass did. What a fused op stands for is read from its attributes,
 * by its name, from the table `fused_forms` (a conv or matmul with an optional
 * bias, residual add and activation), or, for any op with an `expr` attribute,
 * from its expression, which a small parser reads into a tree. Ops are found by
 * name, so the drawing needs no change when such an op joins the op table. */
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

/* The printable value of attribute `name` of n, its default when unset; NULL when
 * the op has no such attribute or it is unset without a default. */
static const char *attr_text(const Node *n, const char *name, char *buf, size_t cap) {
    int i = op_attr_index(n->op, name);
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
    case A_ENUM:
    case A_STRING: snprintf(buf, cap, "%s", a->set ? a->s : (s->dflt_word ? s->dflt_word : "")); break;
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
            snprintf(num, sizeof num, "%s", a->s ? a->s : "");
        fprintf(f, "%s%s=%s", sep, o->attrs[k].name, num);
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
    const Expr *e = quiet ? expr_parse(&arena, expr, n_inputs, (Loc){0}, &d) : NULL;
    if (quiet)
        fclose(quiet);
    free(msg);
    int next = 0;
    if (e)
        emit_expr(e, &next, prefix, inputs, f, outside, root, root_cap);
    arena_free(&arena);
    return e ? 0 : -1;
}

/* ---- Fused ops ---- */

/* One op a fused op stands for: its label (a word starting with '@' names the
 * attribute holding it), the fused op's inputs it takes (by the names of the op
 * table's input list), and the input or attribute without which it is absent. */
typedef struct {
    const char *label;
    const char *inputs; /* "x, w, b" */
    const char *if_input;
    const char *if_attr;   /* present unless this attribute is "none" */
    const char *flag_attr; /* a bool attribute shown under the label when true */
} Stage;

typedef struct {
    const char *op;
    Stage stages[4];
} FusedForm;

static const FusedForm fused_forms[] = {
    {"fused_conv",
     {{"conv", "x, w, b", NULL, NULL, NULL},
      {"add", "residual", "residual", NULL, NULL},
      {"@activation", "", NULL, "activation", NULL}}},
    {"fused_matmul",
     {{"matmul", "a, b", NULL, NULL, "trans_b"},
      {"add", "bias", "bias", NULL, NULL},
      {"add", "residual", "residual", NULL, NULL},
      {"@activation", "", NULL, "activation", NULL}}},
};

/* The activations' parameters, shown under their name. */
static const struct {
    const char *activation;
    const char *attrs[3];
} activation_attrs[] = {
    {"leaky_relu", {"alpha"}},
    {"clip", {"min", "max"}},
};

/* Whether `name` is in the comma-separated list. */
static bool in_list(const char *list, const char *name) {
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        while (*p == ' ' || *p == ',')
            p++;
        size_t len = strcspn(p, ", ");
        if (len == n && strncmp(p, name, n) == 0)
            return true;
        p += len;
    }
    return false;
}

/* The name of the op's input k, from the op table's "x, w, b?" (no '?'). */
static void input_name(OpId op, int k, char *buf, size_t cap) {
    const char *p = op_table[op].inputs;
    for (int i = 0; i < k && p; i++)
        if ((p = strchr(p, ',')))
            p++;
    while (p && *p == ' ')
        p++;
    size_t len = p ? strcspn(p, ",?") : 0;
    snprintf(buf, cap, "%.*s", (int)len, p ? p : "");
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

/* The cluster of a fused op from its table row; false when it is not one. */
static bool draw_fused(FILE *f, const Graph *g, int i, DotName *src) {
    const Node *n = g->nodes[i];
    const FusedForm *form = NULL;
    for (size_t k = 0; k < sizeof fused_forms / sizeof *fused_forms; k++)
        if (strcmp(fused_forms[k].op, op_table[n->op].name) == 0)
            form = &fused_forms[k];
    if (!form)
        return false;
    /* which stages are there, and where each input goes (unclaimed: the first) */
    bool present[4] = {0};
    int last = 0;
    char buf[256], name[64];
    for (int s = 0; s < 4 && form->stages[s].label; s++) {
        const Stage *st = &form->stages[s];
        present[s] = !st->if_input;
        for (int k = 0; st->if_input && k < n->n_in; k++) {
            input_name(n->op, k, name, sizeof name);
            if (strcmp(name, st->if_input) == 0)
                present[s] = n->in[k] >= 0;
        }
        if (st->if_attr) {
            const char *a = attr_text(n, st->if_attr, buf, sizeof buf);
            present[s] = a && *a && strcmp(a, "none") != 0;
        }
        if (present[s])
            last = s;
    }
    fprintf(
        f,
        "  subgraph cluster_%d {\n    style=\"rounded,dashed\"; color=\"#6c757d\"; fontsize=10; label=\"%s",
        i, op_table[n->op].name);
    node_results(f, g, n);
    fputs("\";\n", f);
    for (int s = 0, prev = -1; s < 4 && form->stages[s].label; s++) {
        if (!present[s])
            continue;
        const Stage *st = &form->stages[s];
        const char *label = st->label[0] == '@' ? attr_text(n, st->label + 1, buf, sizeof buf) : st->label;
        fprintf(f, "    n%d_%d [label=\"", i, s);
        put_escaped(label ? label : "?", f);
        for (size_t k = 0; label && k < sizeof activation_attrs / sizeof *activation_attrs; k++) {
            if (strcmp(label, activation_attrs[k].activation) != 0)
                continue;
            for (int j = 0; j < 3 && activation_attrs[k].attrs[j]; j++) {
                char val[64];
                if (attr_text(n, activation_attrs[k].attrs[j], val, sizeof val))
                    fprintf(f, "%s%s=%s", j ? ", " : "\\n", activation_attrs[k].attrs[j], val);
            }
        }
        char flag[16];
        if (st->flag_attr && attr_text(n, st->flag_attr, flag, sizeof flag) && strcmp(flag, "true") == 0)
            fprintf(f, "\\n%s", st->flag_attr);
        fputs("\"];\n", f);
        if (prev >= 0)
            fprintf(f, "    n%d_%d -> n%d_%d;\n", i, prev, i, s);
        prev = s;
    }
    fputs("  }\n", f);
    for (int k = 0; k < n->n_in; k++) {
        if (n->in[k] < 0)
            continue;
        input_name(n->op, k, name, sizeof name);
        int to = 0;
        for (int s = 0; s < 4 && form->stages[s].label; s++)
            if (present[s] && in_list(form->stages[s].inputs, name))
                to = s;
        char dst[64];
        snprintf(dst, sizeof dst, "n%d_%d", i, to);
        edge(f, g, src, n->in[k], dst);
    }
    snprintf(src[i], sizeof src[i], "n%d_%d", i, last);
    return true;
}

/* The cluster of an op with an `expr` attribute; false when it has none or the
 * expression cannot be read. */
static bool draw_expr(FILE *f, const Graph *g, int i, DotName *src) {
    const Node *n = g->nodes[i];
    int a = op_attr_index(n->op, "expr");
    AttrKind kind = a >= 0 ? op_table[n->op].attrs[a].kind : A_INT;
    const char *expr = (kind == A_STRING || kind == A_ENUM) && n->attrs[a].set ? n->attrs[a].s : NULL;
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
    for (int k = 0; ok && k < n->n_in; k++) {
        ok = n->in[k] >= 0;
        if (ok)
            snprintf(names[k], sizeof names[k], "%s", src[g->values[n->in[k]].node]);
        inputs[k] = names[k];
    }
    char prefix[32], root[64] = "";
    snprintf(prefix, sizeof prefix, "n%d", i);
    ok = ok && dot_expr(body, edges, expr, prefix, inputs, n->n_in, root, sizeof root) == 0;
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
        fprintf(f, "\";\n%s  }\n%s", inner, outer);
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
        if (draw_fused(f, g, i, src) || draw_expr(f, g, i, src))
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
    fputs("}\n", f);
    ir_free(src);
}
