/* Printing kernel IR: as C or CUDA source, and as text for people.
 *
 * Expressions print with the fewest parentheses C's precedence allows, so a tree
 * reads back as the same tree: left-associative operators parenthesize a right
 * operand of their own level, and float arithmetic is never reassociated. A
 * kernel's buffers are declared only when its body uses them, and a loop marked
 * PARALLEL is the kernel's iteration space, which each language spells its own
 * way (`Lang`). The dump (kir_dump) shows the same tree with its types and
 * annotations: `let`, `var`, `for i in [lo, hi) parallel`, loads as `buf[index]`. */
#include "codegen.h"
#include "kir.h"

#include <math.h>
#include <string.h>

enum {
    PREC_SELECT = 3,
    PREC_OR = 4,
    PREC_AND = 5,
    PREC_EQ = 9,
    PREC_REL = 10,
    PREC_ADD = 12,
    PREC_MUL = 13,
    PREC_UNARY = 15,
    PREC_PRIMARY = 16
};

typedef struct {
    const Program *p;
    const Lang *l;
    const KBody *kb;
    Str *out;
    bool dump;
    const int *ptrs; /* kir_print's */
    int n_ptrs;
} Printer;

static int prec(const KExpr *e) {
    switch (e->kind) {
    case KE_INT:
    case KE_FLOAT: return e->kind == KE_INT ? (e->i < 0 ? PREC_UNARY : PREC_PRIMARY) : PREC_PRIMARY;
    case KE_VAR:
    case KE_LOAD:
    case KE_SYMBOL:
    case KE_SPECIAL:
    case KE_SYM_SIZE:
    case KE_CALL: return PREC_PRIMARY;
    case KE_FORMULA: return 0; /* its text is parenthesized wherever it is an operand */
    case KE_NEG:
    case KE_NOT:
    case KE_CAST:
    case KE_VLOAD: return PREC_UNARY;
    case KE_ADDR:
    case KE_ADD:
    case KE_SUB: return PREC_ADD;
    case KE_MUL:
    case KE_DIV:
    case KE_MOD: return PREC_MUL;
    case KE_LT:
    case KE_LE:
    case KE_GT:
    case KE_GE: return PREC_REL;
    case KE_EQ:
    case KE_NE: return PREC_EQ;
    case KE_AND: return PREC_AND;
    case KE_OR: return PREC_OR;
    case KE_SELECT: return PREC_SELECT;
    }
    return 0;
}

static const char *type_name(const Lang *l, KType t) {
    switch (t) {
    case KT_BOOL:
    case KT_I32: return "int";
    case KT_I64: return "int64_t";
    case KT_F32: return "float";
    case KT_F64: return "double";
    case KT_PTR: return l ? "float *" : "ptr";
    case KT_VF32: return "kiln_vf";
    }
    return "?";
}

static const char *dump_type(KType t) {
    static const char *const names[] = {"bool", "i32", "i64", "f32", "f64", "ptr", "vf32"};
    return names[t];
}

static const char *buf_name(const Printer *pr, int buf, char *tmp, size_t n) {
    const KBuf *b = &pr->kb->bufs[buf];
    for (int j = 0; j < pr->n_ptrs && (b->kind == KB_VALUE || b->kind == KB_OUTPUT); j++)
        if (pr->ptrs[j] == (b->kind == KB_VALUE ? b->value : -1 - b->value)) {
            snprintf(tmp, n, "buf%d", j);
            return tmp;
        }
    switch (b->kind) {
    case KB_VALUE: return value_name(pr->p, b->value);
    case KB_OUTPUT: snprintf(tmp, n, "out%d", b->value); return tmp;
    case KB_SCRATCH: return "scratch";
    case KB_TABLE: /* declared as floats; another element type reads it through a cast */
        if (b->type == KT_F32)
            return "table";
        snprintf(tmp, n, "((%s%s *)table)", pr->dump ? "" : "const ",
                 pr->dump ? dump_type(b->type) : type_name(pr->l, b->type));
        return tmp;
    case KB_LOCAL:
    case KB_SHARED:
    case KB_PARAM: return b->name;
    }
    return "?";
}

static void print_expr(Printer *pr, const KExpr *e, int min_prec);

static void print_index(Printer *pr, int buf, const KExpr *index, bool two_d) {
    char tmp[32];
    str_printf(pr->out, "%s[", buf_name(pr, buf, tmp, sizeof tmp));
    if (two_d) { /* a local array's [row][col]: index is row * cols + col, kept apart */
        print_expr(pr, index->a, 0);
        str_printf(pr->out, "][");
        print_expr(pr, index->b, 0);
    } else
        print_expr(pr, index, 0);
    str_printf(pr->out, "]");
}

static const char *const op_text[] = {
    [KE_ADD] = " + ", [KE_SUB] = " - ",  [KE_MUL] = " * ", [KE_DIV] = " / ", [KE_MOD] = " % ",
    [KE_LT] = " < ",  [KE_LE] = " <= ",  [KE_GT] = " > ",  [KE_GE] = " >= ", [KE_EQ] = " == ",
    [KE_NE] = " != ", [KE_AND] = " && ", [KE_OR] = " || ",
};

static const char *const special_text[] = {
    [K_THREAD_X] = "threadIdx.x", [K_BLOCK_X] = "blockIdx.x",     [K_BLOCK_Y] = "blockIdx.y",
    [K_BLOCK_Z] = "blockIdx.z",   [K_BLOCK_DIM_X] = "blockDim.x",
};

/* A formula's text with each $k replaced by operand k, parenthesized unless primary. */
static void print_formula(Printer *pr, const KExpr *e) {
    for (const char *c = e->name; *c; c++) {
        if (*c == '$' && c[1] >= '0' && c[1] <= '9' && c[1] - '0' < e->n_args) {
            print_expr(pr, e->args[c[1] - '0'], PREC_PRIMARY);
            c++;
        } else
            str_printf(pr->out, "%c", *c);
    }
}

static void print_expr(Printer *pr, const KExpr *e, int min_prec) {
    Str *o = pr->out;
    bool paren = prec(e) < min_prec;
    if (paren)
        str_printf(o, "(");
    switch (e->kind) {
    case KE_INT: /* C has no literal for INT64_MIN: its magnitude does not fit */
        if (e->i == INT64_MIN)
            str_printf(o, "(-9223372036854775807 - 1)");
        else
            str_printf(o, "%lld", (long long)e->i);
        break;
    case KE_FLOAT:
        if (e->type == KT_VF32) { /* a scalar operand fills every lane */
            char lit[48];
            float_literal(e->f, lit, sizeof lit);
            str_printf(o, e->f == 0 ? "(kiln_vf){0}" : "((kiln_vf){0} + %s)", lit);
        } else if (e->type == KT_F32) {
            char lit[48];
            float_literal(e->f, lit, sizeof lit);
            str_printf(o, "%s", lit);
        } else if (!isfinite(e->f))
            str_printf(o, "(%s / 0.0)", isnan(e->f) ? "0.0" : e->f < 0 ? "-1.0" : "1.0");
        else {
            char lit[40];
            snprintf(lit, sizeof lit, "%.17g", e->f);
            str_printf(o, "%s%s", lit, strpbrk(lit, ".e") ? "" : ".0"); /* `1` is an int */
        }
        break;
    case KE_VAR: str_printf(o, "%s", pr->kb->vars[e->var].name); break;
    case KE_LOAD: print_index(pr, e->buf, e->a, e->n_args == 2); break;
    case KE_VLOAD:
        str_printf(o, pr->dump ? "vload " : "*(const kiln_vf *)&");
        print_index(pr, e->buf, e->a, false);
        break;
    case KE_ADDR: {
        char tmp[32];
        str_printf(o, "%s", buf_name(pr, e->buf, tmp, sizeof tmp));
        if (!(e->a->kind == KE_INT && e->a->i == 0)) {
            str_printf(o, " + ");
            print_expr(pr, e->a, PREC_ADD + 1);
        }
        break;
    }
    case KE_SYMBOL: str_printf(o, "%s", e->name); break;
    case KE_SPECIAL: str_printf(o, "%s", special_text[e->special]); break;
    case KE_SYM_SIZE: str_printf(o, "args->sym"); break;
    case KE_NEG:
    case KE_NOT:
        str_printf(o, e->kind == KE_NEG ? "-" : "!");
        /* -(-x) and -(-1), never the decrement -- */
        print_expr(pr, e->a,
                   e->a->kind == KE_NEG || (e->a->kind == KE_INT && e->a->i < 0) ? PREC_PRIMARY + 1
                                                                                 : PREC_UNARY);
        break;
    case KE_CAST:
        str_printf(o, pr->dump ? "(%s)" : "(%s)", pr->dump ? dump_type(e->type) : type_name(pr->l, e->type));
        print_expr(pr, e->a, PREC_UNARY);
        break;
    case KE_SELECT:
        print_expr(pr, e->a, PREC_OR);
        str_printf(o, " ? ");
        print_expr(pr, e->b, PREC_SELECT + 1);
        str_printf(o, " : ");
        print_expr(pr, e->c, PREC_SELECT);
        break;
    case KE_CALL:
        str_printf(o, "%s(", e->name);
        for (int i = 0; i < e->n_args; i++) {
            str_printf(o, i ? ", " : "");
            print_expr(pr, e->args[i], 0);
        }
        str_printf(o, ")");
        break;
    case KE_FORMULA: print_formula(pr, e); break;
    default:
        print_expr(pr, e->a, prec(e));
        str_printf(o, "%s", op_text[e->kind]);
        print_expr(pr, e->b, prec(e) + 1);
        break;
    }
    if (paren)
        str_printf(o, ")");
}

static void print_list(Printer *pr, const KStmt *s, int indent);

static void print_block(Printer *pr, const KStmt *body, int indent) {
    str_printf(pr->out, " {\n");
    print_list(pr, body, indent + 4);
    str_printf(pr->out, "%*s}\n", indent, "");
}

static void print_for(Printer *pr, const KStmt *s, int indent) {
    Str *o = pr->out;
    const char *v = pr->kb->vars[s->var].name;
    if (pr->dump) {
        str_printf(o, "%*sfor %s: %s in [", indent, "", v, dump_type(pr->kb->vars[s->var].type));
        print_expr(pr, s->lo, 0);
        str_printf(o, ", ");
        print_expr(pr, s->hi, 0);
        str_printf(o, ")");
        if (s->step) {
            str_printf(o, " step ");
            print_expr(pr, s->step, 0);
        }
        str_printf(o, "%s%s", s->flags & K_PARALLEL ? " parallel" : "", s->flags & K_VECTOR ? " vector" : "");
        if (s->flags & K_UNROLL)
            str_printf(o, " unroll(%d)", s->unroll);
        print_block(pr, s->body, indent);
        return;
    }
    if (s->flags & K_PARALLEL) { /* the kernel's iterations, [0, count) */
        str_printf(o, "%*s%s", indent, "", pr->l->parallel_open);
        print_block(pr, s->body, indent);
        return;
    }
    if ((s->flags & K_UNROLL) && pr->l->unroll_hint)
        str_printf(o, "%*s%s %d\n", indent, "", pr->l->unroll_hint, s->unroll);
    if ((s->flags & K_VECTOR) && pr->l->vector_hint)
        str_printf(o, "%*s%s\n", indent, "", pr->l->vector_hint);
    str_printf(o, "%*sfor (%s %s = ", indent, "", type_name(pr->l, pr->kb->vars[s->var].type), v);
    print_expr(pr, s->lo, 0);
    str_printf(o, "; %s < ", v);
    print_expr(pr, s->hi, PREC_REL + 1);
    if (!s->step || (s->step->kind == KE_INT && s->step->i == 1))
        str_printf(o, "; %s++)", v);
    else {
        str_printf(o, "; %s += ", v);
        print_expr(pr, s->step, 0);
        str_printf(o, ")");
    }
    print_block(pr, s->body, indent);
}

static void print_stmt(Printer *pr, const KStmt *s, int indent) {
    Str *o = pr->out;
    const KBody *kb = pr->kb;
    switch (s->kind) {
    case KS_LET:
    case KS_DECL:
        if (pr->dump)
            str_printf(o, "%*s%s %s: %s = ", indent, "", s->kind == KS_LET ? "let" : "var",
                       kb->vars[s->var].name, dump_type(kb->vars[s->var].type));
        else
            str_printf(o, "%*s%s %s = ", indent, "", type_name(pr->l, kb->vars[s->var].type),
                       kb->vars[s->var].name);
        print_expr(pr, s->a, 0);
        str_printf(o, ";\n");
        break;
    case KS_ASSIGN:
        str_printf(o, "%*s%s %s= ", indent, "", kb->vars[s->var].name, s->accumulate ? "+" : "");
        print_expr(pr, s->a, 0);
        str_printf(o, ";\n");
        break;
    case KS_STORE:
        str_printf(o, "%*s", indent, "");
        print_index(pr, s->buf, s->index, s->n_args == 2);
        str_printf(o, " %s= ", s->accumulate ? "+" : "");
        print_expr(pr, s->a, 0);
        str_printf(o, ";\n");
        break;
    case KS_VSTORE:
        str_printf(o, "%*s%s", indent, "", pr->dump ? "vstore " : "*(kiln_vf *)&");
        print_index(pr, s->buf, s->index, false);
        str_printf(o, " = ");
        print_expr(pr, s->a, 0);
        str_printf(o, ";\n");
        break;
    case KS_FOR: print_for(pr, s, indent); break;
    case KS_IF:
        str_printf(o, "%*sif (", indent, "");
        print_expr(pr, s->a, 0);
        str_printf(o, ")");
        print_block(pr, s->body, indent);
        if (s->orelse) {
            str_printf(o, "%*selse", indent, "");
            print_block(pr, s->orelse, indent);
        }
        break;
    case KS_CALL:
        str_printf(o, "%*s%s(", indent, "", s->name);
        for (int i = 0; i < s->n_args; i++) {
            str_printf(o, i ? ", " : "");
            print_expr(pr, s->args[i], 0);
        }
        str_printf(o, ");\n");
        break;
    case KS_BARRIER: str_printf(o, "%*s%s\n", indent, "", pr->dump ? "barrier;" : pr->l->barrier); break;
    case KS_ARRAY: {
        const KBuf *b = &kb->bufs[s->buf];
        str_printf(o, "%*s%s%s %s", indent, "",
                   b->kind == KB_SHARED ? (pr->dump ? "shared " : "__shared__ ") : "",
                   pr->dump ? dump_type(b->type) : type_name(pr->l, b->type), b->name);
        if (b->cols)
            str_printf(o, "[%lld][%lld]", (long long)(b->size / b->cols), (long long)b->cols);
        else
            str_printf(o, "[%lld]", (long long)b->size);
        str_printf(o, "%s;\n", s->zero ? (b->cols ? " = {{0}}" : " = {0}") : "");
        break;
    }
    case KS_BLOCK:
        str_printf(o, "%*s{\n", indent, "");
        print_list(pr, s->body, indent + 4);
        str_printf(o, "%*s}\n", indent, "");
        break;
    }
}

static void print_list(Printer *pr, const KStmt *s, int indent) {
    for (; s; s = s->next)
        print_stmt(pr, s, indent);
}

bool kir_uses_value(const KBody *kb, int value) {
    for (int i = 0; i < kb->n_bufs; i++) {
        const KBuf *b = &kb->bufs[i];
        if (b->used &&
            ((b->kind == KB_VALUE && b->value == value) || (b->kind == KB_OUTPUT && -1 - b->value == value) ||
             (b->kind == KB_SCRATCH && value == KIR_SCRATCH) || (b->kind == KB_TABLE && value == KIR_TABLE)))
            return true;
    }
    return false;
}

void kir_print(const Program *p, const Lang *l, const KBody *kb, const int *ptrs, int n_ptrs, Str *out,
               int indent) {
    Printer pr = {p, l, kb, out, false, ptrs, ptrs ? n_ptrs : 0};
    print_list(&pr, kb->body, indent);
}

void kir_print_function(const KBody *kb, const Lang *l, const char *name, Str *out) {
    Printer pr = {NULL, l, kb, out, false, NULL, 0};
    str_printf(out, "void %s(", name);
    int n = 0;
    for (int i = 0; i < kb->n_bufs; i++)
        if (kb->bufs[i].kind == KB_PARAM)
            str_printf(out, "%s%sfloat *%s%s", n++ ? ", " : "", kb->bufs[i].writable ? "" : "const ",
                       l->restrict_kw, kb->bufs[i].name);
    for (int i = 0; i < kb->n_vars; i++)
        if (kb->vars[i].param)
            str_printf(out, "%s%s %s", n++ ? ", " : "", type_name(l, kb->vars[i].type), kb->vars[i].name);
    str_printf(out, "%s) {\n", n ? "" : "void");
    print_list(&pr, kb->body, 4);
    str_printf(out, "}\n");
}

void kir_dump(const Program *p, const KBody *kb, Str *out) {
    Printer pr = {p, &lang_c, kb, out, true, NULL, 0};
    print_list(&pr, kb->body, 4);
}

static const char *const kind_names[] = {[K_LOOP] = "loop", [K_CALL] = "call", [K_GEMM] = "gemm"};

void program_dump_kir(const Program *p, Str *out) {
    c_comment(out, "The kernels of model '%s' as kernel IR (%s target).", p->g->name,
              p->target == TARGET_CUDA ? "cuda" : "c");
    str_printf(out, "\n");
    for (int k = 0; k < p->n_kernels; k++) {
        const Kernel *kn = &p->kernels[k];
        str_printf(out, "\n");
        c_comment(out, "%s", kn->comment);
        str_printf(out, "\nkernel %s %s", kn->name, kind_names[kn->kind]);
        if (kn->kind == K_LOOP)
            str_printf(out, " count %lld grain %lld", (long long)kn->count, (long long)kn->grain);
        if (kn->kind == K_GEMM)
            str_printf(out, " batch %lld m %lld n %lld depth %lld", (long long)kn->batch, (long long)kn->m,
                       (long long)kn->n, (long long)kn->depth);
        str_printf(out, " {\n");
        kir_dump(p, kn->ir, out);
        str_printf(out, "}\n");
    }
}
