/* The printer: a graph as canonical text that parses back into the same graph.
 *
 * `model NAME`, the symbolic dim if there is one, then every node in order, then
 * `output`. One space around `=` and after every `,` and `:`. Attributes in the op
 * table's order, only those set (the parser has dropped those equal to their
 * default). Floats in the shortest form that reads back to the same value; names
 * quoted when they are not identifiers or are keywords, strings always, with the
 * lexer's escapes where needed. Printing a parsed printed graph gives the identical
 * bytes. */
#include "ir.h"

#include <string.h>

static bool needs_quotes(const char *s) {
    static const char *const keywords[] = {"model", "input", "param", "const", "output",
                                           "_",     "true",  "false", "inf",   "nan"};
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == '_'))
        return true;
    for (const char *p = s; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_' ||
              *p == '.'))
            return true;
    for (size_t i = 0; i < sizeof keywords / sizeof *keywords; i++)
        if (strcmp(s, keywords[i]) == 0)
            return true;
    return false;
}

/* `"` and `\` escaped, and control bytes as \n, \t or \xHH, so that every name
 * prints on one line and reads back (the lexer's escapes); other bytes, UTF-8
 * included, as they are. */
static void print_quoted(const char *s, FILE *f) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c < 32 || c == 127)
            fprintf(f, "\\x%02x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static void print_name(const char *s, FILE *f) {
    if (needs_quotes(s))
        print_quoted(s, f);
    else
        fputs(s, f);
}

static void print_type(const Type *t, FILE *f) {
    char buf[256];
    fputs(type_str(t, buf, sizeof buf), f);
}

static void print_double(double v, FILE *f) {
    char buf[64];
    format_double(v, buf, sizeof buf);
    fputs(buf, f);
}

static void print_attr(const AttrSpec *s, const Attr *a, FILE *f) {
    fprintf(f, ", %s=", attr_name(s->id));
    switch (s->kind) {
    case A_INT: fprintf(f, "%lld", (long long)a->i); break;
    case A_FLOAT: print_double(a->f, f); break;
    case A_BOOL: fputs(a->i ? "true" : "false", f); break;
    case A_ENUM: print_name(enum_choices[s->set].words[a->i], f); break;
    case A_STRING: print_quoted(a->s, f); break; /* a string is always quoted, as its op expects */
    case A_INTS:
        fputc('[', f);
        for (int k = 0; k < a->n; k++)
            fprintf(f, "%s%lld", k ? ", " : "", (long long)a->ints[k]);
        fputc(']', f);
        break;
    case A_FLOATS:
        fputc('[', f);
        for (int k = 0; k < a->n; k++) {
            if (k)
                fputs(", ", f);
            print_double(a->floats[k], f);
        }
        fputc(']', f);
        break;
    }
}

static void print_init(const ParamInit *init, FILE *f) {
    switch (init->kind) {
    case INIT_NONE: return;
    case INIT_ZEROS: fputs(" = zeros", f); return;
    case INIT_ONES: fputs(" = ones", f); return;
    case INIT_FILL:
        fputs(" = fill(", f);
        print_double(init->a, f);
        fputc(')', f);
        return;
    case INIT_UNIFORM:
    case INIT_NORMAL:
        fputs(init->kind == INIT_UNIFORM ? " = uniform(" : " = normal(", f);
        print_double(init->a, f);
        fputs(", ", f);
        print_double(init->b, f);
        fprintf(f, ", seed=%llu)", (unsigned long long)init->seed);
        return;
    }
}

/* Element i of a literal: the shortest float that reads back, or the integer
 * (bools as 0 and 1, which the parser reads back as bools). */
static void print_element(const Tensor *t, int64_t i, FILE *f) {
    char buf[64];
    if (t->type.dtype == DT_F32)
        format_float(t->data[i], buf, sizeof buf);
    else
        snprintf(buf, sizeof buf, "%lld", (long long)tensor_int(t, i));
    fputs(buf, f);
}

static void print_literal_dim(const Tensor *t, int dim, int64_t *pos, FILE *f) {
    if (dim == t->type.rank) {
        print_element(t, (*pos)++, f);
        return;
    }
    fputc('[', f);
    for (int64_t i = 0; i < t->type.dims[dim]; i++) {
        if (i)
            fputs(", ", f);
        print_literal_dim(t, dim + 1, pos, f);
    }
    fputc(']', f);
}

/* A literal whose elements are all equal prints as one number. */
static void print_literal(const Tensor *t, FILE *f) {
    int64_t n = type_numel(&t->type), pos = 0, size = dtype_size(t->type.dtype);
    const char *bytes = t->bytes;
    bool uniform = true;
    for (int64_t i = 1; i < n && uniform; i++)
        uniform = memcmp(bytes + i * size, bytes, (size_t)size) == 0;
    if (uniform)
        print_element(t, 0, f);
    else
        print_literal_dim(t, 0, &pos, f);
}

static void print_node(const Graph *g, const Node *n, FILE *f) {
    const OpInfo *o = &op_table[n->op];
    if (op_is_decl(n->op)) {
        const Value *v = &g->values[n->out[0]];
        fprintf(f, "%s ", o->name);
        print_name(v->name, f);
        fputs(" : ", f);
        print_type(&v->type, f);
        if (n->op == OP_PARAM)
            print_init(&n->init, f);
        if (n->op == OP_CONST) {
            fputs(" = ", f);
            print_literal(n->data, f);
        }
        fputc('\n', f);
        return;
    }
    for (int i = 0; i < n->n_out; i++) {
        if (i)
            fputs(", ", f);
        print_name(g->values[n->out[i]].name, f);
    }
    fprintf(f, " = %s(", o->name);
    for (int i = 0; i < n->n_in; i++) {
        if (i)
            fputs(", ", f);
        if (n->in[i] < 0)
            fputc('_', f);
        else
            print_name(g->values[n->in[i]].name, f);
    }
    for (int i = 0; i < o->n_attrs; i++)
        if (n->attrs[i].set)
            print_attr(&o->attrs[i], &n->attrs[i], f);
    fputs(") : ", f);
    for (int i = 0; i < n->n_out; i++) {
        if (i)
            fputs(", ", f);
        print_type(&g->values[n->out[i]].type, f);
    }
    fputc('\n', f);
}

void print_graph(const Graph *g, FILE *f) {
    fputs("model ", f);
    print_name(g->name, f);
    fputc('\n', f);
    if (g->sym.name)
        fprintf(f, "dim %s <= %lld\n", g->sym.name, (long long)g->sym.bound);
    for (int i = 0; i < g->n_nodes; i++)
        print_node(g, g->nodes[i], f);
    for (int k = 0; k < g->n_updates; k++) {
        fputs("update ", f);
        print_name(g->values[g->updates[k].param].name, f);
        fputs(" = ", f);
        print_name(g->values[g->updates[k].value].name, f);
        fputc('\n', f);
    }
    fputs("output ", f);
    for (int i = 0; i < g->n_outputs; i++) {
        if (i)
            fputs(", ", f);
        print_name(g->values[g->outputs[i]].name, f);
    }
    fputc('\n', f);
}
