/* Text forms of the epilogue helpers, for the lowerings that still print their
 * kernels' bodies as C (emit_tile_epilogue, emit_gemm_store): the same statements
 * kb_tile_epilogue and kb_gemm_store build as kernel IR. */
#include "codegen.h"

#include <string.h>

/* formula with $0 and $1 spelled as the variables a and b. */
static void with_operands(const char *formula, const char *a, const char *b, char *out, size_t cap) {
    size_t len = 0;
    for (const char *c = formula; *c && len + 8 < cap; c++)
        if (c[0] == '$' && (c[1] == '0' || c[1] == '1')) {
            len += (size_t)snprintf(out + len, cap - len, "%s", c[1] == '0' ? a : b);
            c++;
        } else
            out[len++] = *c;
    out[len] = 0;
}

/* Emits the statements computing e and writes the C expression of its result (a
 * variable `tN`, an input `xK` or a literal) into r. Each call is a block that
 * binds the operands to the names its op's expression uses (`x`, or `a` and `b`),
 * so a fused op computes exactly what its own kernel computes. */
static void emit_expr(Str *s, const Expr *e, int *next, char *r, size_t cap) {
    char a[48], b[48], body[512];
    switch (e->kind) {
    case EXPR_INPUT: snprintf(r, cap, "x%d", e->input); return;
    case EXPR_NUMBER: float_literal(e->number, r, cap); return;
    case EXPR_CALL: break;
    }
    emit_expr(s, e->arg[0], next, a, sizeof a);
    if (e->call.n_in == 2)
        emit_expr(s, e->arg[1], next, b, sizeof b);
    snprintf(r, cap, "t%d", (*next)++);
    if (e->call.n_in == 1) {
        char f[512];
        unary_formula(&e->call, f, sizeof f);
        with_operands(f, "x", "x", body, sizeof body);
        str_printf(s, "float %s;\n{\n    float x = %s;\n    %s = %s;\n}\n", r, a, r, body);
    } else {
        char f[512];
        binary_formula(e->call.op, 0, f, sizeof f);
        with_operands(f, "a", "b", body, sizeof body);
        str_printf(s, "float %s;\n{\n    float a = %s, b = %s;\n    %s = %s;\n}\n", r, a, b, r, body);
    }
}

/* Appends text with every line indented by `indent`. */
static void append_indented(Str *dst, const char *text, const char *indent) {
    for (const char *line = text; *line;) {
        const char *nl = strchr(line, '\n');
        int len = nl ? (int)(nl - line) : (int)strlen(line);
        str_printf(dst, "%s%.*s\n", indent, len, line);
        line += len + (nl != NULL);
    }
}

/* Emits, at `ind`, the statements giving `x0` (the element's value so far) the
 * epilogue and storing it into dst: n's inputs from expr_first_input(n) on are
 * read at offset `at` (when not NULL) of the element in the result. */
static void emit_element_epilogue(Str *s, const Program *p, const Node *n, const Expr *epilogue,
                                  const char *at, const char *dst, const char *ind) {
    char res[48] = "x0";
    if (epilogue) {
        int first = expr_first_input(n), next = 0;
        for (int k = first; k < n->n_in; k++) {
            bool one = type_numel(&p->g->values[n->in[k]].type) == 1;
            str_printf(s, "%sfloat x%d = %s[%s];\n", ind, k - first + 1, value_name(p, n->in[k]),
                       one ? "0" : at);
        }
        Str calc = {0};
        emit_expr(&calc, epilogue, &next, res, sizeof res);
        append_indented(s, calc.s ? calc.s : "", ind);
        s->oom |= calc.oom;
        str_free(&calc);
    }
    str_printf(s, "%s%s = %s;\n", ind, dst, res);
}

void emit_tile_epilogue(Str *s, const Program *p, const Node *n, const Expr *epilogue, const char *bias,
                        const char *bias_at, const char *rows, const char *cols, int64_t ld, int64_t step) {
    bool biased = bias_at && bias[0];
    if (!biased && !epilogue)
        return;
    int first = expr_first_input(n);
    bool located = false; /* some input is read at the element's offset in y */
    for (int k = first; epilogue && k < n->n_in; k++)
        located |= type_numel(&p->g->values[n->in[k]].type) != 1;
    char at[96] = "", in_y[128], dst[128], plus_bias[160] = "";
    if (ld)
        append_term(at, sizeof at, "r", ld);
    append_term(at, sizeof at, "q", step);
    snprintf(in_y, sizeof in_y, "at0 + %s", at);
    snprintf(dst, sizeof dst, "tile[%s]", at);
    if (biased)
        snprintf(plus_bias, sizeof plus_bias, " + %s[%s]", bias, bias_at);
    if (located)
        str_printf(s, "int64_t at0 = tile - %s;\n", value_name(p, n->out[0]));
    str_printf(s, "for (int64_t r = 0; r < %s; r++)\n    for (int64_t q = 0; q < %s; q++) {\n", rows, cols);
    str_printf(s, "        float x0 = %s%s;\n", dst, plus_bias);
    emit_element_epilogue(s, p, n, epilogue, in_y, dst, "        ");
    str_printf(s, "    }\n");
}

void emit_gemm_store(Str *s, const Program *p, const Node *n, const Expr *epilogue, const char *bias,
                     const char *at) {
    char dst[160];
    snprintf(dst, sizeof dst, "%s[%s]", value_name(p, n->out[0]), at);
    str_printf(s, "float x0 = acc%s%s;\n", bias ? " + " : "", bias ? bias : "");
    emit_element_epilogue(s, p, n, epilogue, at, dst, "");
}

void kernel_gemm_text(Kernel *k, Str *load_a, Str *load_b, Str *store) {
    KBuilder *b = &k->b;
    Str *parts[3] = {load_a, load_b, store};
    KStmt **blocks[3] = {&k->load_a, &k->load_b, &k->store};
    for (int i = 0; i < 3; i++) {
        kb_begin_block(b);
        kb_text(b, parts[i]->s ? parts[i]->s : "");
        b->oom |= parts[i]->oom;
        *blocks[i] = kb_take(b);
        str_free(parts[i]);
    }
}
