/* The parser of the model language: tokens in, a type-checked Graph out.
 *
 * A recursive-descent parser, one function per grammar rule (the rule sits above
 * its function). Each statement is checked as soon as it is read: names must be
 * defined before use and only once, the op call must match the op table's
 * signature, attributes are converted to their schema's kind and normalized, and
 * shape inference runs, so every error points at the statement that caused it.
 * The parser stops at the first error. */
#include "frontend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    Lexer lx;
    Token tok; /* the current token */
    Graph *g;
    Diag *d;
    bool saw_statement;
} Parser;

static const char *const keywords[] = {"model", "input", "param", "const", "output",
                                       "_",     "true",  "false", "inf",   "nan"};

static int advance(Parser *p) {
    p->tok = lex_next(&p->lx);
    return p->tok.kind == T_ERROR ? -1 : 0;
}

static int error_at_tok(Parser *p, const char *what) {
    if (p->tok.kind == T_ERROR)
        return -1; /* the lexer has reported it */
    if (p->tok.kind == T_EOF && p->lx.depth > 0)
        return diag_error(p->d, p->lx.open_loc, "this bracket is not closed before the end of the file");
    if (p->tok.kind == T_IDENT || p->tok.kind == T_INT || p->tok.kind == T_FLOAT)
        return diag_error(p->d, p->tok.loc, "expected %s, got '%.*s'", what, p->tok.len, p->tok.start);
    return diag_error(p->d, p->tok.loc, "expected %s, got %s", what, tok_kind_name(p->tok.kind));
}

static int expect(Parser *p, TokKind k, const char *what) {
    if (p->tok.kind != k)
        return error_at_tok(p, what);
    return advance(p);
}

static bool is_keyword(const char *s, size_t n) {
    for (size_t i = 0; i < sizeof keywords / sizeof *keywords; i++)
        if (strlen(keywords[i]) == n && memcmp(keywords[i], s, n) == 0)
            return true;
    return false;
}

/* name := IDENT (not a keyword) | QUOTED */
static int parse_name(Parser *p, const char **name, Loc *loc) {
    *loc = p->tok.loc;
    if (p->tok.kind == T_QUOTED) {
        *name = p->tok.text;
    } else if (p->tok.kind == T_IDENT && !is_keyword(p->tok.start, (size_t)p->tok.len)) {
        *name = arena_strndup(&p->g->arena, p->tok.start, (size_t)p->tok.len);
        if (!*name)
            return diag_error(p->d, *loc, "out of memory");
    } else if (p->tok.kind == T_IDENT || p->tok.kind == T_FLOAT) {
        return diag_error(p->d, *loc, "'%.*s' is a keyword; quote it to use it as a name", p->tok.len,
                          p->tok.start);
    } else {
        return error_at_tok(p, "a name");
    }
    return advance(p);
}

/* A value name that must already be defined. */
static int parse_use(Parser *p, int *id) {
    const char *name;
    Loc loc;
    if (parse_name(p, &name, &loc))
        return -1;
    *id = graph_find(p->g, name);
    if (*id < 0)
        return diag_error(p->d, loc, "'%s' is not defined (a name must be defined before its first use)",
                          name);
    return 0;
}

static int check_new_name(Parser *p, const char *name, Loc loc) {
    int id = graph_find(p->g, name);
    if (id >= 0) {
        diag_error(p->d, loc, "redefinition of '%s'", name);
        Loc first = p->g->nodes[p->g->values[id].node]->loc;
        diag_note(p->d, "'%s' was first defined at %s:%d", name, first.file->name, first.line);
        return -1;
    }
    return 0;
}

static int define(Parser *p, const char *name, Loc loc, Node *n, int index) {
    if (check_new_name(p, name, loc))
        return -1;
    if (graph_define(p->g, name, n, index) < 0)
        return diag_error(p->d, loc, "out of memory");
    return 0;
}

static int parse_int(Parser *p, int64_t *v, const char *what) {
    if (p->tok.kind != T_INT)
        return error_at_tok(p, what);
    *v = p->tok.ival;
    return advance(p);
}

static int parse_number(Parser *p, double *v) {
    if (p->tok.kind != T_INT && p->tok.kind != T_FLOAT)
        return error_at_tok(p, "a number");
    *v = p->tok.fval;
    return advance(p);
}

/* dim := INT | SYM ['*' INT]: SYM, the model's symbolic dim, only as the first */
static int parse_dim(Parser *p, Type *t) {
    Loc loc = p->tok.loc;
    const SymDim *sym = &p->g->sym;
    if (p->tok.kind != T_IDENT)
        return parse_int(p, &t->dims[t->rank], "a dimension");
    if (!sym->name || !tok_is(&p->tok, sym->name))
        return diag_error(p->d, loc, "'%.*s' is not a declared dim (declare it first: dim %.*s <= SIZE)",
                          p->tok.len, p->tok.start, p->tok.len, p->tok.start);
    if (t->rank > 0)
        return diag_error(p->d, loc, "the symbolic dim %s can only be a type's first dim", sym->name);
    int64_t mult = 1;
    if (advance(p) || (p->tok.kind == T_STAR && (advance(p) || parse_int(p, &mult, "an integer after '*'"))))
        return -1;
    if (mult < 1 || !ck_mul(mult, sym->bound, &t->dims[0]))
        return diag_error(p->d, loc, "%s*%lld is not a positive size", sym->name, (long long)mult);
    t->sym = sym->name;
    t->sym_mult = mult;
    return 0;
}

/* type := DTYPE '[' [dim {',' dim}] ']' */
static int parse_type(Parser *p, Type *t) {
    Loc loc = p->tok.loc;
    if (p->tok.kind != T_IDENT)
        return error_at_tok(p, "a type such as f32[2, 3]");
    int dtype = dtype_lookup(p->tok.start, (size_t)p->tok.len);
    if (dtype == DT_F16 || dtype == DT_BF16)
        return diag_error(p->d, loc, "dtype '%.*s' is reserved; kiln computes in f32, i64, i32 and bool",
                          p->tok.len, p->tok.start);
    if (dtype < 0)
        return diag_error(p->d, loc, "unknown dtype '%.*s' (expected f32, i64, i32 or bool)", p->tok.len,
                          p->tok.start);
    *t = (Type){(DType)dtype, 0, {0}, NULL, 0};
    if (advance(p) || expect(p, T_LBRACK, "'[' after the dtype"))
        return -1;
    int64_t numel = 1;
    while (p->tok.kind != T_RBRACK) {
        if (t->rank > 0 && expect(p, T_COMMA, "',' or ']'"))
            return -1;
        Loc dloc = p->tok.loc;
        if (t->rank == KILN_MAX_RANK)
            return diag_error(p->d, dloc, "too many dimensions (at most %d)", KILN_MAX_RANK);
        if (parse_dim(p, t))
            return -1;
        int64_t dim = t->dims[t->rank];
        if (dim < 1)
            return diag_error(p->d, dloc, "dimension %lld must be positive", (long long)dim);
        if (!ck_mul(numel, dim, &numel) || numel > KILN_MAX_NUMEL)
            return diag_error(p->d, dloc, "tensor too large");
        t->rank++;
    }
    return advance(p);
}

/* ---- Attribute values ---- */

typedef enum { V_NUM, V_WORD, V_STRING, V_BOOL, V_LIST } ValKind;

typedef struct {
    ValKind kind;
    bool is_int;   /* V_NUM; for V_LIST, every element an integer */
    double num;    /* V_NUM, V_BOOL */
    int64_t ival;  /* V_NUM with is_int */
    const char *s; /* V_WORD, V_STRING */
    int n;         /* V_LIST: numbers only */
    double *nums;
    int64_t *ints;
    Loc loc;
} RawValue;

/* value := number | word | string | true | false | '[' [number {',' number}] ']' */
static int parse_value(Parser *p, RawValue *v) {
    Arena *a = &p->g->arena;
    memset(v, 0, sizeof *v);
    v->loc = p->tok.loc;
    switch (p->tok.kind) {
    case T_INT:
        v->kind = V_NUM;
        v->is_int = true;
        v->ival = p->tok.ival;
        v->num = p->tok.fval;
        return advance(p);
    case T_FLOAT:
        v->kind = V_NUM;
        v->num = p->tok.fval;
        return advance(p);
    case T_QUOTED:
        v->kind = V_STRING;
        v->s = p->tok.text;
        return advance(p);
    case T_IDENT:
        if (tok_is(&p->tok, "true") || tok_is(&p->tok, "false")) {
            v->kind = V_BOOL;
            v->num = tok_is(&p->tok, "true");
        } else {
            v->kind = V_WORD;
            v->s = arena_strndup(a, p->tok.start, (size_t)p->tok.len);
            if (!v->s)
                return diag_error(p->d, v->loc, "out of memory");
        }
        return advance(p);
    case T_LBRACK: {
        v->kind = V_LIST;
        v->is_int = true;
        int cap = 0;
        if (advance(p))
            return -1;
        while (p->tok.kind != T_RBRACK) {
            if (v->n > 0 && expect(p, T_COMMA, "',' or ']'"))
                return -1;
            if (p->tok.kind != T_INT && p->tok.kind != T_FLOAT)
                return error_at_tok(p, "a number in the list");
            if (v->n == cap) {
                cap = cap ? 2 * cap : 8;
                double *nums = arena_alloc(a, sizeof *nums * (size_t)cap);
                int64_t *ints = arena_alloc(a, sizeof *ints * (size_t)cap);
                if (!nums || !ints)
                    return diag_error(p->d, v->loc, "out of memory");
                if (v->n) {
                    memcpy(nums, v->nums, sizeof *nums * (size_t)v->n);
                    memcpy(ints, v->ints, sizeof *ints * (size_t)v->n);
                }
                v->nums = nums;
                v->ints = ints;
            }
            v->is_int &= p->tok.kind == T_INT;
            v->ints[v->n] = p->tok.ival;
            v->nums[v->n++] = p->tok.fval;
            if (advance(p))
                return -1;
        }
        return advance(p);
    }
    default: return error_at_tok(p, "an attribute value");
    }
}

static const char *raw_kind_name(const RawValue *v) {
    switch (v->kind) {
    case V_NUM: return v->is_int ? "an integer" : "a float";
    case V_WORD: return "a word";
    case V_STRING: return "a string";
    case V_BOOL: return "a bool";
    case V_LIST: return "a list";
    }
    return "?";
}

static int signature_note(Parser *p, OpId op) {
    char sig[1024];
    op_signature(op, sig, sizeof sig);
    diag_note(p->d, "signature: %s", sig);
    return -1;
}

/* Converts a raw value to the attribute's kind. */
static int convert_attr(Parser *p, OpId op, const AttrSpec *s, const RawValue *v, Attr *a) {
    Arena *ar = &p->g->arena;
    a->set = true;
    a->loc = v->loc;
    bool ok = false;
    switch (s->kind) {
    case A_INT:
        ok = v->kind == V_NUM && v->is_int;
        a->i = v->ival;
        break;
    case A_FLOAT:
        ok = v->kind == V_NUM;
        a->f = v->num;
        break;
    case A_BOOL:
        ok = v->kind == V_BOOL;
        a->i = (int64_t)v->num;
        break;
    case A_ENUM:
        ok = v->kind == V_WORD || v->kind == V_STRING;
        a->i = ok ? enum_lookup(s->set, v->s, strlen(v->s)) : 0;
        if (ok && a->i < 0) {
            diag_error(p->d, v->loc, "%s's '%s' must be one of %s, got '%s'", op_table[op].name,
                       attr_name(s->id), enum_choices[s->set].text, v->s);
            return signature_note(p, op);
        }
        break;
    case A_STRING:
        ok = v->kind == V_WORD || v->kind == V_STRING;
        a->s = v->s;
        break;
    case A_INTS:
        ok = (v->kind == V_LIST || v->kind == V_NUM) && v->is_int;
        a->n = v->kind == V_LIST ? v->n : 1;
        a->ints = arena_alloc(ar, sizeof(int64_t) * (size_t)(a->n + 1));
        if (!a->ints)
            return diag_error(p->d, v->loc, "out of memory");
        for (int k = 0; ok && k < a->n; k++)
            a->ints[k] = v->kind == V_LIST ? v->ints[k] : v->ival;
        break;
    case A_FLOATS:
        ok = v->kind == V_LIST || v->kind == V_NUM;
        a->n = v->kind == V_LIST ? v->n : 1;
        a->floats = arena_alloc(ar, sizeof(double) * (size_t)(a->n + 1));
        if (!a->floats)
            return diag_error(p->d, v->loc, "out of memory");
        for (int k = 0; ok && k < a->n; k++)
            a->floats[k] = v->kind == V_LIST ? v->nums[k] : v->num;
        break;
    }
    if (!ok) {
        const char *want = s->kind == A_INTS     ? "a list of integers"
                           : s->kind == A_FLOATS ? "a list of numbers"
                           : s->kind == A_INT    ? "an integer"
                           : s->kind == A_FLOAT  ? "a number"
                           : s->kind == A_BOOL   ? "true or false"
                                                 : "a word";
        diag_error(p->d, v->loc, "%s's '%s' must be %s, got %s", op_table[op].name, attr_name(s->id), want,
                   raw_kind_name(v));
        return signature_note(p, op);
    }
    return 0;
}

/* The edit distance between two short words, for "did you mean". */
static int distance(const char *a, const char *b) {
    int la = (int)strlen(a), lb = (int)strlen(b);
    if (la > 63 || lb > 63)
        return 99;
    int row[64];
    for (int j = 0; j <= lb; j++)
        row[j] = j;
    for (int i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = i;
        for (int j = 1; j <= lb; j++) {
            int up = row[j];
            int best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

static const char *closest_op(const char *name) {
    const char *best = NULL;
    int best_d = 3;
    for (int i = 0; i < OP_COUNT; i++) {
        int dist = op_is_decl((OpId)i) ? 99 : distance(name, op_table[i].name);
        if (dist < best_d) {
            best_d = dist;
            best = op_table[i].name;
        }
    }
    return best;
}

/* ---- Statements ---- */

typedef struct {
    const char *name;
    Loc loc;
} NameLoc;

enum { MAX_ARGS = 4096 }; /* inputs of one call, results of one statement */

/* call := OPNAME '(' [arg {',' arg}] ')' [':' type {',' type}]
 * arg  := name | '_' | IDENT '=' value       (positional arguments first) */
static int parse_call(Parser *p, NameLoc *results, int n_results) {
    Loc op_loc = p->tok.loc;
    if (p->tok.kind != T_IDENT)
        return error_at_tok(p, "an op name");
    char opname[64];
    snprintf(opname, sizeof opname, "%.*s", p->tok.len < 63 ? p->tok.len : 63, p->tok.start);
    int op = op_lookup(opname);
    if (op < 0) {
        const char *near = closest_op(opname);
        diag_error(p->d, op_loc, "unknown op '%s'", opname);
        if (near)
            diag_note(p->d, "did you mean '%s'?", near);
        return -1;
    }
    if (advance(p) || expect(p, T_LPAREN, "'(' after the op name"))
        return -1;

    int args[MAX_ARGS];
    Loc arg_locs[MAX_ARGS];
    int n_args = 0;
    RawValue vals[32];
    const AttrSpec *specs[32];
    int n_vals = 0;
    const OpInfo *info = &op_table[op];
    while (p->tok.kind != T_RPAREN) {
        if (n_args + n_vals > 0 && expect(p, T_COMMA, "',' or ')'"))
            return -1;
        Loc loc = p->tok.loc;
        if (p->tok.kind == T_IDENT && !is_keyword(p->tok.start, (size_t)p->tok.len)) {
            /* An attribute if '=' follows: peek by lexing ahead on a copy. */
            Lexer save = p->lx;
            Token next = lex_next(&save);
            if (next.kind == T_EQ) {
                char key[64];
                snprintf(key, sizeof key, "%.*s", p->tok.len < 63 ? p->tok.len : 63, p->tok.start);
                int ai = op_attr_index_named((OpId)op, key);
                if (ai < 0) {
                    diag_error(p->d, loc, "%s has no attribute '%s'", info->name, key);
                    return signature_note(p, (OpId)op);
                }
                for (int k = 0; k < n_vals; k++)
                    if (specs[k] == &info->attrs[ai])
                        return diag_error(p->d, loc, "attribute '%s' is given twice", key);
                if (n_vals == 32)
                    return diag_error(p->d, loc, "too many attributes");
                if (advance(p) || advance(p) || parse_value(p, &vals[n_vals]))
                    return -1;
                specs[n_vals++] = &info->attrs[ai];
                continue;
            }
        }
        if (n_vals > 0)
            return diag_error(p->d, loc, "positional inputs must come before attributes");
        if (n_args == MAX_ARGS)
            return diag_error(p->d, loc, "too many inputs");
        arg_locs[n_args] = loc;
        if (tok_is(&p->tok, "_")) {
            args[n_args++] = -1;
            if (advance(p))
                return -1;
        } else if (parse_use(p, &args[n_args++])) {
            return -1;
        }
    }
    if (advance(p))
        return -1;

    int lo, hi;
    op_arity((OpId)op, &lo, &hi);
    if (n_args < lo || (hi >= 0 && n_args > hi)) {
        if (hi < 0)
            diag_error(p->d, op_loc, "%s takes at least %d inputs, got %d", info->name, lo, n_args);
        else if (lo == hi)
            diag_error(p->d, op_loc, "%s takes %d input%s, got %d", info->name, lo, lo == 1 ? "" : "s",
                       n_args);
        else
            diag_error(p->d, op_loc, "%s takes %d to %d inputs, got %d", info->name, lo, hi, n_args);
        return signature_note(p, (OpId)op);
    }
    for (int i = 0; i < n_args; i++)
        if (args[i] < 0 && !op_input_optional((OpId)op, i)) {
            diag_error(p->d, arg_locs[i], "input %d of %s is required and cannot be '_'", i + 1, info->name);
            return signature_note(p, (OpId)op);
        }
    while (n_args > lo && args[n_args - 1] < 0)
        n_args--; /* `conv(x, w, _)` is `conv(x, w)` */
    int want_results = op == OP_GRAD ? n_args - 1 : 1;
    if (n_results != want_results)
        return diag_error(p->d, results[0].loc, "%s gives %d result%s, but %d name%s assigned", info->name,
                          want_results, want_results == 1 ? "" : "s", n_results,
                          n_results == 1 ? " is" : "s are");

    Node *n = graph_add_node(p->g, (OpId)op, n_args, n_results, op_loc);
    if (!n)
        return diag_error(p->d, op_loc, "out of memory");
    memcpy(n->in, args, sizeof(int) * (size_t)n_args);
    for (int k = 0; k < n_vals; k++)
        if (convert_attr(p, (OpId)op, specs[k], &vals[k], &n->attrs[specs[k] - info->attrs]))
            return -1;
    for (int i = 0; i < n_results; i++)
        if (define(p, results[i].name, results[i].loc, n, i))
            return -1;
    if (attrs_normalize(p->g, n, p->d))
        return signature_note(p, (OpId)op);
    if (infer_node(p->g, n, p->d))
        return -1;

    if (p->tok.kind == T_COLON) {
        if (advance(p))
            return -1;
        for (int i = 0; i < n_results; i++) {
            if (i > 0 && expect(p, T_COMMA, "',' and the next result type"))
                return -1;
            Loc tloc = p->tok.loc;
            Type t = {0};
            if (parse_type(p, &t))
                return -1;
            const Type *inferred = &p->g->values[n->out[i]].type;
            if (!type_equal(&t, inferred)) {
                char a[128], b[128];
                return diag_error(p->d, tloc, "declared type %s of '%s' does not match the inferred type %s",
                                  type_str(&t, a, sizeof a), results[i].name,
                                  type_str(inferred, b, sizeof b));
            }
            if (i == 0)
                n->type_loc = tloc;
        }
    }
    return 0;
}

/* Stores the number at the token as element `pos` of a const of t's dtype: any
 * number for f32, an integer in range for i64 and i32, 0 or 1 (true or false)
 * for bool. */
static int literal_element(Parser *p, Tensor *t, int64_t pos) {
    DType dt = t->type.dtype;
    Loc loc = p->tok.loc;
    if (dt == DT_BOOL && (tok_is(&p->tok, "true") || tok_is(&p->tok, "false"))) {
        t->b[pos] = tok_is(&p->tok, "true");
        return advance(p);
    }
    if (dt == DT_F32) {
        double v = 0;
        if (parse_number(p, &v))
            return -1;
        t->data[pos] = (float)v;
        return 0;
    }
    int64_t v = 0;
    if (parse_int(p, &v, dt == DT_BOOL ? "true, false, 0 or 1" : "an integer"))
        return -1;
    if ((dt == DT_I32 && (v < INT32_MIN || v > INT32_MAX)) || (dt == DT_BOOL && v != 0 && v != 1))
        return diag_error(p->d, loc, "%lld is not a %s value", (long long)v, dtype_name(dt));
    if (dt == DT_I64)
        t->i64[pos] = v;
    else if (dt == DT_I32)
        t->i32[pos] = (int32_t)v;
    else
        t->b[pos] = (uint8_t)v;
    return 0;
}

static bool at_element(const Parser *p) {
    return p->tok.kind == T_INT || p->tok.kind == T_FLOAT || tok_is(&p->tok, "true") ||
           tok_is(&p->tok, "false");
}

/* literal := element | '[' literal {',' literal} ']'   (nested to the type's shape)
 * element := number | true | false */
static int parse_literal_dim(Parser *p, Tensor *out, int dim, int64_t *pos) {
    const Type *t = &out->type;
    if (dim == t->rank) {
        if (!at_element(p))
            return error_at_tok(p, "a number");
        return literal_element(p, out, (*pos)++);
    }
    Loc loc = p->tok.loc;
    if (expect(p, T_LBRACK, dim == 0 ? "a number or '['" : "'[' (the literal is nested to the type's shape)"))
        return -1;
    for (int64_t i = 0;; i++) {
        if (p->tok.kind == T_RBRACK) {
            if (i != t->dims[dim])
                return diag_error(p->d, loc, "literal has %lld entries along dimension %d, the type has %lld",
                                  (long long)i, dim, (long long)t->dims[dim]);
            return advance(p);
        }
        if (i > 0 && expect(p, T_COMMA, "',' or ']'"))
            return -1;
        if (i >= t->dims[dim])
            return diag_error(p->d, p->tok.loc, "literal has more than %lld entries along dimension %d",
                              (long long)t->dims[dim], dim);
        if (parse_literal_dim(p, out, dim + 1, pos))
            return -1;
    }
}

static int parse_literal(Parser *p, Node *n, const Type *t) {
    /* A bracketed literal spells every value, each taking a byte and its comma at
       least: a type it could never fill is refused before its memory is asked for. */
    const SrcFile *src = p->lx.src;
    size_t text_left = src->len - (size_t)(p->lx.p - src->text);
    if (p->tok.kind == T_LBRACK && (uint64_t)type_numel(t) > (uint64_t)text_left / 2 + 1) {
        char ty[160];
        return diag_error(p->d, p->tok.loc,
                          "a literal of type %s needs %lld values; the %zu bytes left cannot hold them",
                          type_str(t, ty, sizeof ty), (long long)type_numel(t), text_left);
    }
    n->data = tensor_new(t);
    if (!n->data)
        return diag_error(p->d, p->tok.loc, "out of memory");
    if (at_element(p)) {
        if (literal_element(p, n->data, 0))
            return -1;
        int64_t size = dtype_size(t->dtype);
        for (int64_t i = 1; i < type_numel(t); i++)
            memcpy((char *)n->data->bytes + i * size, n->data->bytes, (size_t)size);
        return 0;
    }
    int64_t pos = 0;
    return parse_literal_dim(p, n->data, 0, &pos);
}

/* init := zeros | ones | fill '(' number ')'
 *       | uniform '(' number ',' number [',' seed '=' INT] ')'
 *       | normal '(' number ',' number [',' seed '=' INT] ')' */
static int parse_init(Parser *p, ParamInit *init) {
    Loc loc = p->tok.loc;
    if (tok_is(&p->tok, "zeros") || tok_is(&p->tok, "ones")) {
        init->kind = tok_is(&p->tok, "zeros") ? INIT_ZEROS : INIT_ONES;
        return advance(p);
    }
    int args;
    if (tok_is(&p->tok, "fill")) {
        init->kind = INIT_FILL;
        args = 1;
    } else if (tok_is(&p->tok, "uniform") || tok_is(&p->tok, "normal")) {
        init->kind = tok_is(&p->tok, "uniform") ? INIT_UNIFORM : INIT_NORMAL;
        args = 2;
    } else {
        return error_at_tok(
            p, "an initializer (zeros, ones, fill(v), uniform(lo, hi, seed=N), normal(mean, std, seed=N))");
    }
    if (advance(p) || expect(p, T_LPAREN, "'('") || parse_number(p, &init->a))
        return -1;
    if (args == 2 && (expect(p, T_COMMA, "','") || parse_number(p, &init->b)))
        return -1;
    if (args == 2 && p->tok.kind == T_COMMA) {
        int64_t seed = 0;
        if (advance(p))
            return -1;
        if (!tok_is(&p->tok, "seed"))
            return error_at_tok(p, "'seed='");
        if (advance(p) || expect(p, T_EQ, "'=' after seed") || parse_int(p, &seed, "an integer seed"))
            return -1;
        if (seed < 0)
            return diag_error(p->d, loc, "the seed must not be negative");
        init->seed = (uint64_t)seed;
    }
    if (init->kind == INIT_UNIFORM && !(init->a <= init->b))
        return diag_error(p->d, loc, "uniform needs lo <= hi");
    if (init->kind == INIT_NORMAL && !(init->b >= 0))
        return diag_error(p->d, loc, "normal needs a non-negative standard deviation");
    return expect(p, T_RPAREN, "')'");
}

/* Whether v is a value of the integer or bool dtype t. */
static bool holds(DType t, double v) {
    if (t == DT_BOOL)
        return v == 0 || v == 1;
    double limit = t == DT_I32 ? 2147483648.0 : 9223372036854775808.0;
    return v == floor(v) && v >= -limit && v < limit;
}

/* decl := ('input' | 'param' | 'const') name ':' type ['=' (init | literal)] */
static int parse_decl(Parser *p, OpId op) {
    const char *name;
    Loc loc;
    Type t = {0};
    if (advance(p) || parse_name(p, &name, &loc) || expect(p, T_COLON, "':' and a type") || parse_type(p, &t))
        return -1;
    if (check_new_name(p, name, loc))
        return -1;
    if (t.sym && op != OP_INPUT)
        return diag_error(p->d, loc, "%s '%s' cannot have the symbolic dim %s: only inputs and results do",
                          op_table[op].name, name, t.sym);
    Node *n = graph_add_node(p->g, op, 0, 1, loc);
    if (!n)
        return diag_error(p->d, loc, "out of memory");
    if (define(p, name, loc, n, 0))
        return -1;
    p->g->values[n->out[0]].type = t;
    if (op == OP_INPUT)
        return 0;
    if (p->tok.kind != T_EQ) {
        if (op == OP_CONST)
            return error_at_tok(p, "'=' and a literal");
        return 0;
    }
    if (advance(p))
        return -1;
    if (op == OP_CONST)
        return parse_literal(p, n, &t);
    Loc init_loc = p->tok.loc;
    if (parse_init(p, &n->init))
        return -1;
    bool random = n->init.kind == INIT_UNIFORM || n->init.kind == INIT_NORMAL;
    if (t.dtype != DT_F32 && (random || (n->init.kind == INIT_FILL && !holds(t.dtype, n->init.a))))
        return diag_error(p->d, init_loc, "a %s param takes zeros, ones or fill of a %s value",
                          dtype_name(t.dtype), dtype_name(t.dtype));
    return 0;
}

/* output := 'output' name {',' name} */
static int parse_output(Parser *p) {
    Loc loc = p->tok.loc;
    if (advance(p))
        return -1;
    int cap = 0;
    do {
        if (p->g->n_outputs > 0 && advance(p))
            return -1;
        if (p->g->n_outputs == cap) {
            cap = cap ? 2 * cap : 16;
            int *ids = arena_alloc(&p->g->arena, sizeof(int) * (size_t)cap);
            if (!ids)
                return diag_error(p->d, loc, "out of memory");
            if (p->g->n_outputs)
                memcpy(ids, p->g->outputs, sizeof(int) * (size_t)p->g->n_outputs);
            p->g->outputs = ids;
        }
        if (parse_use(p, &p->g->outputs[p->g->n_outputs]))
            return -1;
        p->g->n_outputs++;
    } while (p->tok.kind == T_COMMA);
    return 0;
}

/* update := 'update' name '=' name: the param first, then its new value */
static int parse_update(Parser *p) {
    Graph *g = p->g;
    Loc loc = {0};
    int param, value;
    if (advance(p))
        return -1;
    loc = p->tok.loc;
    if (parse_use(p, &param))
        return -1;
    const Node *def = g->nodes[g->values[param].node];
    if (def->op != OP_PARAM)
        return diag_error(p->d, loc, "'%s' is not a param: only a param can be updated",
                          g->values[param].name);
    const Update *first = graph_update_of(g, param);
    if (first) {
        diag_error(p->d, loc, "'%s' is updated twice", g->values[param].name);
        diag_note(p->d, "its first update is at %s:%d", first->loc.file->name, first->loc.line);
        return -1;
    }
    if (expect(p, T_EQ, "'=' and the param's new value"))
        return -1;
    Loc value_loc = p->tok.loc;
    if (parse_use(p, &value))
        return -1;
    const Type *want = &g->values[param].type, *got = &g->values[value].type;
    if (!type_equal(want, got)) {
        char a[160], b[160];
        return diag_error(p->d, value_loc, "'%s' is %s, but the param '%s' it updates is %s",
                          g->values[value].name, type_str(got, a, sizeof a), g->values[param].name,
                          type_str(want, b, sizeof b));
    }
    if (g->n_updates % 16 == 0) {
        Update *grown = arena_alloc(&g->arena, sizeof *grown * (size_t)(g->n_updates + 16));
        if (!grown)
            return diag_error(p->d, loc, "out of memory");
        if (g->n_updates)
            memcpy(grown, g->updates, sizeof *grown * (size_t)g->n_updates);
        g->updates = grown;
    }
    g->updates[g->n_updates++] = (Update){param, value, loc};
    return 0;
}

/* dim := 'dim' IDENT '<=' INT: the model's symbolic dim and its bound */
static int parse_sym_dim(Parser *p) {
    SymDim *sym = &p->g->sym;
    Loc loc = {0};
    if (advance(p))
        return -1;
    loc = p->tok.loc;
    if (p->tok.kind != T_IDENT || is_keyword(p->tok.start, (size_t)p->tok.len))
        return error_at_tok(p, "the dim's name (an identifier)");
    if (sym->name)
        return diag_error(p->d, loc, "a second symbolic dim '%.*s': a model has at most one (%s)", p->tok.len,
                          p->tok.start, sym->name);
    if (p->tok.len > 64 || dtype_lookup(p->tok.start, (size_t)p->tok.len) >= 0)
        return diag_error(p->d, loc, "'%.*s' cannot name a dim (a dtype, or longer than 64 bytes)",
                          p->tok.len > 64 ? 64 : p->tok.len, p->tok.start);
    const char *name = arena_strndup(&p->g->arena, p->tok.start, (size_t)p->tok.len);
    if (!name)
        return diag_error(p->d, loc, "out of memory");
    int64_t bound = 0;
    Loc bound_loc = {0};
    if (advance(p) || expect(p, T_LE, "'<=' and the dim's bound"))
        return -1;
    bound_loc = p->tok.loc;
    if (parse_int(p, &bound, "the dim's bound (an integer)"))
        return -1;
    if (bound < 2 || bound > KILN_MAX_NUMEL)
        return diag_error(p->d, bound_loc, "dim %s's bound %lld is not between 2 and 2^40", name,
                          (long long)bound);
    *sym = (SymDim){name, bound, loc};
    return 0;
}

/* 'update' and 'dim' are statement keywords only where a name cannot stand. */
static bool starts_statement(const Parser *p, const char *keyword) {
    if (!tok_is(&p->tok, keyword))
        return false;
    Lexer ahead = p->lx;
    Token next = lex_next(&ahead);
    return next.kind != T_EQ && next.kind != T_COMMA;
}

/* stmt := 'model' name | dim | decl | update | output | name {',' name} '=' call */
static int parse_statement(Parser *p) {
    Token t = p->tok;
    if (t.kind == T_IDENT && is_keyword(t.start, (size_t)t.len)) {
        Lexer ahead = p->lx;
        Token next = lex_next(&ahead);
        if (next.kind == T_EQ || next.kind == T_COMMA)
            return diag_error(p->d, t.loc, "'%.*s' is a keyword; quote it to use it as a name", t.len,
                              t.start);
    }
    if (tok_is(&t, "model")) {
        Loc loc;
        const char *name;
        if (p->saw_statement)
            return diag_error(p->d, t.loc, "'model' must be the first statement");
        p->saw_statement = true;
        if (advance(p) || parse_name(p, &name, &loc))
            return -1;
        p->g->name = name;
        return 0;
    }
    p->saw_statement = true;
    if (p->g->n_outputs)
        return diag_error(p->d, t.loc, "'output' must be the last statement");
    if (tok_is(&t, "input"))
        return parse_decl(p, OP_INPUT);
    if (tok_is(&t, "param"))
        return parse_decl(p, OP_PARAM);
    if (tok_is(&t, "const"))
        return parse_decl(p, OP_CONST);
    if (tok_is(&t, "output"))
        return parse_output(p);
    if (starts_statement(p, "update"))
        return parse_update(p);
    if (starts_statement(p, "dim"))
        return parse_sym_dim(p);
    NameLoc results[MAX_ARGS];
    int n = 0;
    do {
        if (n > 0 && advance(p))
            return -1;
        if (n == MAX_ARGS)
            return diag_error(p->d, p->tok.loc, "too many results");
        if (parse_name(p, &results[n].name, &results[n].loc))
            return -1;
        for (int i = 0; i < n; i++)
            if (strcmp(results[i].name, results[n].name) == 0)
                return diag_error(p->d, results[n].loc, "redefinition of '%s'", results[n].name);
        n++;
    } while (p->tok.kind == T_COMMA);
    if (p->tok.kind != T_EQ)
        return error_at_tok(p, n == 1 && t.kind == T_IDENT ? "'=' (or a statement keyword)" : "'='");
    if (advance(p))
        return -1;
    return parse_call(p, results, n);
}

static const char *file_stem(Arena *a, const char *path) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    const char *dot = strrchr(base, '.');
    size_t n = dot && dot != base ? (size_t)(dot - base) : strlen(base);
    return arena_strndup(a, base, n ? n : strlen(base));
}

/* model := { [stmt] NEWLINE } EOF */
Graph *parse_model(const SrcFile *src, Diag *d) {
    Parser p = {0};
    p.d = d;
    p.g = graph_new();
    if (!p.g) {
        diag_error(d, (Loc){0}, "out of memory");
        return NULL;
    }
    lex_init(&p.lx, src, &p.g->arena, d);
    if (advance(&p))
        goto fail;
    while (p.tok.kind != T_EOF) {
        if (p.tok.kind == T_NEWLINE) {
            if (advance(&p))
                goto fail;
            continue;
        }
        if (parse_statement(&p))
            goto fail;
        if (p.tok.kind != T_NEWLINE && p.tok.kind != T_EOF) {
            error_at_tok(&p, "the end of the statement");
            goto fail;
        }
    }
    if (!p.g->n_outputs) {
        diag_error(d, p.tok.loc, "the model has no 'output' statement");
        goto fail;
    }
    if (!p.g->name && !(p.g->name = file_stem(&p.g->arena, src->name))) {
        diag_error(d, (Loc){0}, "out of memory");
        goto fail;
    }
    return p.g;
fail:
    graph_free(p.g);
    return NULL;
}
