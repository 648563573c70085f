/* The expressions of the `elementwise` op: a recursive-descent parser and the
 * printer of their canonical text.
 *
 * An expression names its inputs $0, $1, ..., and calls the elementwise ops of the
 * language by name, with their attributes after the operands exactly as a statement
 * writes them. Each call becomes an Expr holding a Node (its op and attributes only),
 * so the scalar functions of op_elementwise.c and lower_elementwise.c read the
 * attributes of a call with node_float and node_enum as they do for a statement.
 * Attributes are checked against the op's schema and those equal to their default
 * are dropped, as the parser of statements does. Errors name what is wrong and point
 * at the offending character inside the string when the string is in a source file,
 * else at the attribute. */
#include "ops_impl.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* Deeper nesting is refused, so that recursion stays bounded on any input. */
enum { EXPR_MAX_DEPTH = 200 };

bool expr_callable(OpId op) {
    return op_has(op, F_UNARY) || op_has(op, F_BINARY);
}

typedef struct {
    Arena *a;
    OpId op; /* whose expr it is, for messages */
    const char *text, *p;
    int n_inputs;
    Loc loc;    /* the attribute */
    bool exact; /* loc is the opening quote: text[k] is at column loc.col + 1 + k */
    Diag *d;
    int depth;
} ExprParser;

/* Whether loc points at a '"' in its source file. */
static bool at_quote(Loc loc) {
    if (!loc.file || !loc.file->text || loc.line < 1 || loc.col < 1)
        return false;
    const char *s = loc.file->text, *end = s + loc.file->len;
    for (int line = 1; line < loc.line; s++) {
        if (s >= end)
            return false;
        if (*s == '\n')
            line++;
    }
    for (int col = 1; col < loc.col; col++, s++)
        if (s >= end || *s == '\n')
            return false;
    return s < end && *s == '"';
}

static int error_at(ExprParser *ps, const char *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int error_at(ExprParser *ps, const char *at, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    Loc loc = ps->loc;
    if (ps->exact)
        loc.col += 1 + (int)(at - ps->text);
    diag_error(ps->d, loc, "%s's expr: %s", op_table[ps->op].name, msg);
    diag_note(ps->d, "expr calls relu, clip, add, ... (the elementwise ops) on $0, $1, ... and numbers, "
                     "with attributes as name=value after the operands");
    return -1;
}

static bool is_digit(char c) {
    return c >= '0' && c <= '9';
}
static bool is_ident_start(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
static bool is_ident_char(char c) {
    return is_ident_start(c) || is_digit(c);
}

static void skip_space(ExprParser *ps) {
    while (*ps->p == ' ' || *ps->p == '\t')
        ps->p++;
}

/* What the parser met, for messages: "'x'" or "the end of the expression". */
static const char *met(const char *p, char *buf, size_t n) {
    if (!*p)
        return "the end of the expression";
    snprintf(buf, n, "'%c'", *p);
    return buf;
}

/* The length of the identifier at p (0: none). */
static int ident_len(const char *p) {
    int n = 0;
    if (is_ident_start(p[0]))
        while (is_ident_char(p[n]))
            n++;
    return n;
}

static bool word_is(const char *p, int len, const char *word) {
    return (int)strlen(word) == len && memcmp(p, word, (size_t)len) == 0;
}

/* number := '-'? (digits ('.' digits?)? exponent? | '.' digits exponent? | 'inf') | 'nan' */
static bool number_start(const char *p) {
    if (ident_len(p) == 3 && strncmp(p, "nan", 3) == 0)
        return true;
    if (*p == '-')
        p++;
    return is_digit(*p) || (*p == '.' && is_digit(p[1])) || (ident_len(p) == 3 && strncmp(p, "inf", 3) == 0);
}

static int parse_number(ExprParser *ps, double *v) {
    const char *s = ps->p, *p = s;
    bool neg = *p == '-';
    if (neg)
        p++;
    if (ident_len(p) == 3 && (strncmp(p, "inf", 3) == 0 || strncmp(p, "nan", 3) == 0)) {
        *v = p[0] == 'n' ? NAN : neg ? -INFINITY : INFINITY;
        ps->p = p + 3;
        return 0;
    }
    while (is_digit(*p))
        p++;
    if (*p == '.')
        for (p++; is_digit(*p);)
            p++;
    if ((*p == 'e' || *p == 'E') && (is_digit(p[1]) || ((p[1] == '+' || p[1] == '-') && is_digit(p[2]))))
        for (p += 2; is_digit(*p);)
            p++;
    if (is_ident_char(*p) || *p == '.')
        return error_at(ps, s, "malformed number '%.*s'", (int)(p - s + 1), s);
    char buf[64];
    if (p - s >= (int)sizeof buf)
        return error_at(ps, s, "number too long");
    memcpy(buf, s, (size_t)(p - s));
    buf[p - s] = 0;
    *v = strtod(buf, NULL);
    ps->p = p;
    return 0;
}

static Expr *new_expr(ExprParser *ps, ExprKind kind) {
    Expr *e = arena_alloc(ps->a, sizeof *e);
    if (!e)
        diag_error(ps->d, ps->loc, "out of memory");
    else
        e->kind = kind;
    return e;
}

/* value := number | word; converted to the attribute's kind. */
static int parse_attr_value(ExprParser *ps, OpId op, const AttrSpec *s, Attr *a) {
    const char *at = ps->p, *name = op_table[op].name;
    char buf[8];
    a->set = true;
    a->loc = ps->loc;
    if (ps->exact)
        a->loc.col += 1 + (int)(at - ps->text);
    if (number_start(at)) {
        double v;
        if (parse_number(ps, &v))
            return -1;
        if (s->kind == A_FLOAT)
            a->f = v;
        else if (s->kind == A_INT && v == floor(v) && fabs(v) < 9e15)
            a->i = (int64_t)v;
        else if (s->kind == A_ENUM)
            return error_at(ps, at, "%s's '%s' must be one of %s, got '%.*s'", name, attr_name(s->id),
                            enum_choices[s->set].text, (int)(ps->p - at), at);
        else
            return error_at(ps, at, "%s's '%s' must be %s, got '%.*s'", name, attr_name(s->id),
                            s->kind == A_INT ? "an integer" : "true or false", (int)(ps->p - at), at);
        a->set = s->def != DEF_VALUE || (s->kind == A_FLOAT ? a->f != s->dflt : (double)a->i != s->dflt);
        return 0;
    }
    int len = ident_len(at);
    if (!len)
        return error_at(ps, at, "%s's '%s' needs a value, got %s", name, attr_name(s->id),
                        met(at, buf, sizeof buf));
    ps->p += len;
    if (s->kind == A_BOOL && (word_is(at, len, "true") || word_is(at, len, "false"))) {
        a->i = at[0] == 't';
        a->set = s->def != DEF_VALUE || (double)a->i != s->dflt;
        return 0;
    }
    if (s->kind == A_ENUM) {
        int choice = enum_lookup(s->set, at, (size_t)len);
        if (choice >= 0) {
            a->i = choice;
            a->set = s->def != DEF_VALUE || choice != (int)s->dflt;
            return 0;
        }
        return error_at(ps, at, "%s's '%s' must be one of %s, got '%.*s'", name, attr_name(s->id),
                        enum_choices[s->set].text, len, at);
    }
    const char *want = s->kind == A_FLOAT ? "a number" : s->kind == A_INT ? "an integer" : "true or false";
    if (s->kind != A_FLOAT && s->kind != A_INT && s->kind != A_BOOL)
        return error_at(ps, at, "%s's '%s' (%s) cannot be written in an expression", name, attr_name(s->id),
                        attr_kind_name(s->kind));
    return error_at(ps, at, "%s's '%s' must be %s, got '%.*s'", name, attr_name(s->id), want, len, at);
}

static Expr *parse_expr(ExprParser *ps);

/* call := NAME '(' expr (',' expr)* (',' NAME '=' value)* ')' */
static Expr *parse_call(ExprParser *ps) {
    const char *at = ps->p;
    int len = ident_len(at);
    char name[64], buf[8];
    snprintf(name, sizeof name, "%.*s", len < 63 ? len : 63, at);
    int op = op_lookup(name);
    if (op < 0)
        return error_at(ps, at, "unknown op '%s'", name), NULL;
    if (!expr_callable((OpId)op))
        return error_at(ps, at, "'%s' is not an elementwise op", name), NULL;
    ps->p += len;
    skip_space(ps);
    if (*ps->p != '(')
        return error_at(ps, ps->p, "expected '(' after '%s', got %s", name, met(ps->p, buf, sizeof buf)),
               NULL;
    ps->p++;
    Expr *e = new_expr(ps, EXPR_CALL);
    int n_attrs = op_table[op].n_attrs;
    Attr *attrs = arena_alloc(ps->a, sizeof *attrs * (size_t)(n_attrs + 1));
    if (!e || !attrs)
        return attrs ? NULL : (diag_error(ps->d, ps->loc, "out of memory"), NULL);
    e->call.op = (OpId)op;
    e->call.attrs = attrs;
    e->call.loc = ps->loc;
    int min, max, given = 0;
    op_arity((OpId)op, &min, &max);
    bool seen_attr = false, given_attr[32] = {false};
    KILN_ASSERT(n_attrs < 32);
    for (skip_space(ps); *ps->p != ')'; skip_space(ps)) {
        if (given + seen_attr > 0) {
            if (*ps->p != ',')
                return error_at(ps, ps->p, "expected ',' or ')' in the call of %s, got %s", name,
                                met(ps->p, buf, sizeof buf)),
                       NULL;
            ps->p++;
            skip_space(ps);
        }
        const char *item = ps->p;
        int ilen = ident_len(item);
        const char *after = item + ilen;
        while (*after == ' ' || *after == '\t')
            after++;
        if (ilen && *after == '=') {
            char key[64];
            snprintf(key, sizeof key, "%.*s", ilen < 63 ? ilen : 63, item);
            int k = op_attr_index_named((OpId)op, key);
            if (k < 0) {
                char sig[1024];
                op_signature((OpId)op, sig, sizeof sig);
                return error_at(ps, item, "%s has no attribute '%s' (signature: %s)", name, key, sig), NULL;
            }
            if (given_attr[k])
                return error_at(ps, item, "%s's '%s' is given twice", name, key), NULL;
            ps->p = after + 1;
            skip_space(ps);
            if (parse_attr_value(ps, (OpId)op, &op_table[op].attrs[k], &attrs[k]))
                return NULL;
            given_attr[k] = seen_attr = true;
            continue;
        }
        if (seen_attr)
            return error_at(ps, item, "an operand of %s after its attributes", name), NULL;
        Expr *arg = parse_expr(ps);
        if (!arg)
            return NULL;
        if (given < 2)
            e->arg[given] = arg;
        given++;
    }
    if (given != max)
        return error_at(ps, at, "%s takes %d operand%s, got %d", name, max, max == 1 ? "" : "s", given), NULL;
    ps->p++;
    e->call.n_in = given;
    return e;
}

/* expr := call | '$' digits | number */
static Expr *parse_expr(ExprParser *ps) {
    char buf[8];
    skip_space(ps);
    const char *at = ps->p;
    if (++ps->depth > EXPR_MAX_DEPTH)
        return error_at(ps, at, "nested more than %d calls deep", EXPR_MAX_DEPTH), NULL;
    Expr *e = NULL;
    if (*at == '$') {
        if (!is_digit(at[1]))
            return error_at(ps, at, "'$' must be followed by an input number, as in $0"), NULL;
        long k = 0;
        for (ps->p++; is_digit(*ps->p); ps->p++)
            k = k < 100000000 ? 10 * k + (*ps->p - '0') : k;
        if (k >= ps->n_inputs)
            return error_at(ps, at, "$%ld is out of range: there %s %d input%s", k,
                            ps->n_inputs == 1 ? "is" : "are", ps->n_inputs, ps->n_inputs == 1 ? "" : "s"),
                   NULL;
        if ((e = new_expr(ps, EXPR_INPUT)))
            e->input = (int)k;
    } else if (number_start(at)) {
        double v;
        if (parse_number(ps, &v))
            return NULL;
        if ((e = new_expr(ps, EXPR_NUMBER)))
            e->number = v;
    } else if (ident_len(at)) {
        e = parse_call(ps);
    } else {
        return error_at(ps, at, "expected an operand ($k, a number or an op call), got %s",
                        met(at, buf, sizeof buf)),
               NULL;
    }
    ps->depth--;
    return e;
}

Expr *expr_parse(Arena *a, OpId op, const char *text, int n_inputs, Loc loc, Diag *d) {
    ExprParser ps = {a, op, text, text, n_inputs, loc, at_quote(loc), d, 0};
    Expr *e = parse_expr(&ps);
    if (!e)
        return NULL;
    skip_space(&ps);
    if (*ps.p) {
        char buf[8];
        return error_at(&ps, ps.p, "unexpected %s after the expression", met(ps.p, buf, sizeof buf)), NULL;
    }
    return e;
}

int expr_first_input(const Node *n) {
    return n->op == OP_ELEMENTWISE ? 0 : 3;
}

Expr *node_expr(Arena *a, const Node *n, Diag *d) {
    int first = expr_first_input(n),
        n_inputs = first == 0 ? n->n_in : 1 + (n->n_in > first ? n->n_in - first : 0);
    return expr_parse(a, n->op, node_attr(n, ATTR_EXPR)->s, n_inputs, attr_loc(n, ATTR_EXPR), d);
}

int expr_calls(const Expr *e) {
    if (e->kind != EXPR_CALL)
        return 0;
    int n = 1;
    for (int k = 0; k < e->call.n_in; k++)
        n += expr_calls(e->arg[k]);
    return n;
}

/* ---- The canonical text ---- */

typedef struct {
    char *s;
    size_t len, cap;
    bool oom;
} Buf;

static void put(Buf *b, const char *s) {
    size_t n = strlen(s);
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 64;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = ir_realloc(b->s, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n + 1);
    b->len += n;
}

static void format_expr(Buf *b, const Expr *e) {
    char num[64];
    switch (e->kind) {
    case EXPR_INPUT:
        snprintf(num, sizeof num, "$%d", e->input);
        put(b, num);
        return;
    case EXPR_NUMBER:
        format_float((float)e->number, num, sizeof num);
        put(b, num);
        return;
    case EXPR_CALL: break;
    }
    const OpInfo *o = &op_table[e->call.op];
    put(b, o->name);
    put(b, "(");
    for (int k = 0; k < e->call.n_in; k++) {
        put(b, k ? ", " : "");
        format_expr(b, e->arg[k]);
    }
    for (int k = 0; k < o->n_attrs; k++) {
        const Attr *a = &e->call.attrs[k];
        if (!a->set)
            continue;
        put(b, ", ");
        put(b, attr_name(o->attrs[k].id));
        put(b, "=");
        switch (o->attrs[k].kind) {
        case A_FLOAT: format_double(a->f, num, sizeof num); break;
        case A_INT: snprintf(num, sizeof num, "%lld", (long long)a->i); break;
        case A_BOOL: snprintf(num, sizeof num, "%s", a->i ? "true" : "false"); break;
        case A_ENUM: snprintf(num, sizeof num, "%s", enum_choices[o->attrs[k].set].words[a->i]); break;
        default: KILN_ASSERT(!"an attribute kind expressions cannot hold");
        }
        put(b, num);
    }
    put(b, ")");
}

char *expr_format(const Expr *e) {
    Buf b = {0};
    format_expr(&b, e);
    if (b.oom) {
        ir_free(b.s);
        return NULL;
    }
    return b.s;
}
