/* The lexer of the model language.
 *
 * Statements end at a newline, except inside ( ) and [ ], where a newline is just
 * space: the lexer keeps the bracket depth and drops newlines while it is above
 * zero. `#` starts a comment that runs to the end of the line. A double-quoted
 * token is a name or a string depending on where the parser meets it, so it is
 * returned unescaped as T_QUOTED. A leading minus belongs to a number (`-3`,
 * `-inf`); `inf` and `nan` are float literals. */
#include "frontend.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void lex_init(Lexer *lx, const SrcFile *src, Arena *arena, Diag *d) {
    *lx = (Lexer){.src = src, .p = src->text, .line = 1, .line_start = src->text, .arena = arena, .diag = d};
}

static Loc here(const Lexer *lx, const char *p) {
    return (Loc){lx->src, lx->line, (int)(p - lx->line_start) + 1};
}

static bool is_ident_start(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static bool is_ident_char(char c) {
    return is_ident_start(c) || (c >= '0' && c <= '9') || c == '.';
}
static bool is_digit(char c) {
    return c >= '0' && c <= '9';
}

bool tok_is(const Token *t, const char *word) {
    return t->kind == T_IDENT && (int)strlen(word) == t->len && memcmp(t->start, word, (size_t)t->len) == 0;
}

const char *tok_kind_name(TokKind k) {
    switch (k) {
    case T_EOF: return "end of file";
    case T_NEWLINE: return "end of line";
    case T_IDENT: return "identifier";
    case T_QUOTED: return "quoted string";
    case T_INT: return "integer";
    case T_FLOAT: return "number";
    case T_EQ: return "'='";
    case T_COMMA: return "','";
    case T_COLON: return "':'";
    case T_LPAREN: return "'('";
    case T_RPAREN: return "')'";
    case T_LBRACK: return "'['";
    case T_RBRACK: return "']'";
    case T_LE: return "'<='";
    case T_STAR: return "'*'";
    case T_ERROR: return "error";
    }
    return "?";
}

static Token error_token(Lexer *lx, const char *at) {
    Token t = {T_ERROR, here(lx, at), at, 0, NULL, 0, 0};
    return t;
}

static Token lex_number(Lexer *lx, const char *s) {
    const char *p = s;
    Token t = {T_INT, here(lx, s), s, 0, NULL, 0, 0};
    bool neg = *p == '-';
    if (neg)
        p++;
    if (strncmp(p, "inf", 3) == 0 && !is_ident_char(p[3])) {
        t.kind = T_FLOAT;
        t.fval = neg ? -INFINITY : INFINITY;
        t.len = (int)(p + 3 - s);
        lx->p = p + 3;
        return t;
    }
    bool is_float = false;
    while (is_digit(*p))
        p++;
    if (*p == '.') {
        is_float = true;
        p++;
        while (is_digit(*p))
            p++;
    }
    if (*p == 'e' || *p == 'E') {
        const char *e = p + 1;
        if (*e == '+' || *e == '-')
            e++;
        if (is_digit(*e)) {
            is_float = true;
            p = e;
            while (is_digit(*p))
                p++;
        }
    }
    if (is_ident_char(*p)) {
        diag_error(lx->diag, here(lx, s), "malformed number '%.*s'", (int)(p - s + 1), s);
        return error_token(lx, s);
    }
    t.len = (int)(p - s);
    char buf[128];
    if (t.len >= (int)sizeof buf) {
        diag_error(lx->diag, here(lx, s), "number too long");
        return error_token(lx, s);
    }
    memcpy(buf, s, (size_t)t.len);
    buf[t.len] = 0;
    errno = 0;
    if (is_float) {
        t.kind = T_FLOAT;
        t.fval = strtod(buf, NULL);
    } else {
        t.ival = strtoll(buf, NULL, 10);
        t.fval = strtod(buf, NULL);
        if (errno == ERANGE) {
            diag_error(lx->diag, here(lx, s), "integer '%s' is out of range", buf);
            return error_token(lx, s);
        }
    }
    lx->p = p;
    return t;
}

static int hex_digit(char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* A quoted token's escapes: \" and \\, \n and \t, and \xHH for any byte but NUL,
 * so that a name may hold any bytes (an ONNX name a line break) and still print
 * on one line; the printer writes them back the same way. */
static Token lex_quoted(Lexer *lx, const char *s) {
    const char *p = s + 1;
    size_t cap = 0;
    for (const char *q = p; *q && *q != '"' && *q != '\n'; q++, cap++)
        if (*q == '\\' && q[1])
            q++;
    char *out = arena_alloc(lx->arena, cap + 1);
    if (!out) {
        diag_error(lx->diag, here(lx, s), "out of memory");
        return error_token(lx, s);
    }
    size_t n = 0;
    while (*p != '"') {
        if (*p == 0 || *p == '\n') {
            diag_error(lx->diag, here(lx, s), "unterminated string");
            return error_token(lx, s);
        }
        if (*p != '\\') {
            out[n++] = *p++;
            continue;
        }
        if (p[1] == '"' || p[1] == '\\') {
            out[n++] = p[1];
        } else if (p[1] == 'n' || p[1] == 't') {
            out[n++] = p[1] == 'n' ? '\n' : '\t';
        } else if (p[1] == 'x') {
            int hi = hex_digit(p[2]), lo = hi < 0 ? -1 : hex_digit(p[3]);
            if (lo < 0) {
                diag_error(lx->diag, here(lx, p), "escape '\\x' needs two hex digits");
                return error_token(lx, s);
            }
            if (hi == 0 && lo == 0) {
                diag_error(lx->diag, here(lx, p), "a name or string cannot hold a NUL byte ('\\x00')");
                return error_token(lx, s);
            }
            out[n++] = (char)(hi * 16 + lo);
            p += 2;
        } else {
            diag_error(lx->diag, here(lx, p),
                       "unknown escape '\\%c' (only \\\", \\\\, \\n, \\t and \\xHH are allowed)",
                       p[1] > ' ' && p[1] < 127 ? p[1] : ' ');
            return error_token(lx, s);
        }
        p += 2;
    }
    out[n] = 0;
    if (n == 0) {
        diag_error(lx->diag, here(lx, s), "empty quoted name");
        return error_token(lx, s);
    }
    Token t = {T_QUOTED, here(lx, s), s, (int)(p + 1 - s), out, 0, 0};
    lx->p = p + 1;
    return t;
}

static void open_bracket(Lexer *lx, Loc loc) {
    if (lx->depth++ == 0)
        lx->open_loc = loc;
}

Token lex_next(Lexer *lx) {
    for (;;) {
        const char *p = lx->p;
        while (*p == ' ' || *p == '\t' || *p == '\r')
            p++;
        if (*p == '#')
            while (*p && *p != '\n')
                p++;
        lx->p = p;
        if (*p == 0) {
            if (lx->src->text + lx->src->len != p) {
                diag_error(lx->diag, here(lx, p), "NUL byte in the source");
                return error_token(lx, p);
            }
            return (Token){T_EOF, here(lx, p), p, 0, NULL, 0, 0};
        }
        if (*p == '\n') {
            Token t = {T_NEWLINE, here(lx, p), p, 1, NULL, 0, 0};
            lx->p = p + 1;
            lx->line++;
            lx->line_start = p + 1;
            if (lx->depth > 0)
                continue;
            return t;
        }
        Token t = {T_ERROR, here(lx, p), p, 1, NULL, 0, 0};
        switch (*p) {
        case '=': t.kind = T_EQ; break;
        case ',': t.kind = T_COMMA; break;
        case ':': t.kind = T_COLON; break;
        case '(':
            t.kind = T_LPAREN;
            open_bracket(lx, t.loc);
            break;
        case ')':
            t.kind = T_RPAREN;
            if (lx->depth > 0)
                lx->depth--;
            break;
        case '[':
            t.kind = T_LBRACK;
            open_bracket(lx, t.loc);
            break;
        case ']':
            t.kind = T_RBRACK;
            if (lx->depth > 0)
                lx->depth--;
            break;
        case '"': return lex_quoted(lx, p);
        case '*': t.kind = T_STAR; break;
        case '<':
            if (p[1] != '=') {
                diag_error(lx->diag, t.loc, "unexpected character '<' (a dim's bound is written '<=')");
                return error_token(lx, p);
            }
            t.kind = T_LE;
            t.len = 2;
            lx->p = p + 2;
            return t;
        default:
            if (is_digit(*p) || (*p == '-' && (is_digit(p[1]) || strncmp(p + 1, "inf", 3) == 0)) ||
                (*p == '.' && is_digit(p[1])))
                return lex_number(lx, p);
            if (is_ident_start(*p)) {
                const char *q = p;
                while (is_ident_char(*q))
                    q++;
                t.kind = T_IDENT;
                t.len = (int)(q - p);
                if (tok_is(&t, "inf") || tok_is(&t, "nan")) {
                    t.kind = T_FLOAT;
                    t.fval = *p == 'i' ? INFINITY : NAN;
                }
                lx->p = q;
                return t;
            }
            if ((unsigned char)*p >= 0x80)
                diag_error(lx->diag, t.loc, "unexpected non-ASCII character (quote names that contain one)");
            else
                diag_error(lx->diag, t.loc, "unexpected character '%c'", *p);
            return error_token(lx, p);
        }
        lx->p = p + 1;
        return t;
    }
}
