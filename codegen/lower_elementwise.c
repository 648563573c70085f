/* Lowering of the elementwise ops: one LOOP kernel over the output's elements.
 *
 * The scalar expression of each op is its row's C column in ir/unary.def or
 * ir/binary.def, in the C subset that C and CUDA share; it computes in float, as
 * the targets do (the derivative columns are read here too, for lower_grad.c).
 * Binary ops with equal shapes index both operands with `i`; with broadcasting,
 * the output index is unraveled and each operand gets its own offset with
 * constant strides. A fused `elementwise` node reads each input once per element,
 * then computes its expression as one statement per call, each written with the
 * expression of that op's own kernel; where its inputs are contiguous or constant
 * over blocks of the output's trailing dims (a per-channel scale, a bias), it loops
 * over blocks so that offsets are computed once per block and the inner loop
 * vectorizes. Every kernel here reads an operand of the result's type only at the
 * element it writes, so all are marked in_place. The copy ops (reshape, flatten,
 * squeeze, unsqueeze, identity) are a plain copy, or nothing when the memory plan
 * makes the result a view of its input (view_of). */
#include "codegen.h"

#include <string.h>

/* Elements worth giving a thread: the kernel before an elementwise one (a conv, say)
 * usually split its result across the threads, so running a small one on the
 * caller alone had it read the rest from the other cores' caches; 16384 left
 * MobileNetV3-Small's squeeze-and-excite multiplies there, 3.5% of its time. */
enum { ELEMENTWISE_GRAIN = 4096 };

static bool ident_start(char c) {
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static Kernel *loop_over_output(Program *p, const Node *n, Diag *d) {
    const Type *t = &p->g->values[n->out[0]].type;
    Kernel *k = kernel_loop(p, n, NULL, type_numel(t), ELEMENTWISE_GRAIN, d);
    if (k) {
        k->in_place = true;
        kernel_follows(p, k, t, k->count, 1, 1);
    }
    return k;
}

/* A C column of unary.def or binary.def as a formula: each $k replaced by the
 * float literal of attribute value p[k], and the operands, the identifiers
 * operands[0], operands[1] (`x`, or `a` and `b`), by $0 and $1 (kir.h). */
static void row_formula(const char *text, const double *p, const char *const *operands, char *e, size_t cap) {
    size_t len = 0;
    while (*text) {
        char piece[48] = {*text, 0};
        const char *next = text + 1;
        if (*text == '$' && text[1] >= '0' && text[1] < '0' + UNARY_MAX_PARAMS) {
            float_literal(p[text[1] - '0'], piece, sizeof piece);
            next = text + 2;
        } else if (ident_start(*text)) {
            size_t n = 1;
            while (ident_start(text[n]) || (text[n] >= '0' && text[n] <= '9'))
                n++;
            snprintf(piece, sizeof piece, "%.*s", (int)n, text);
            for (int k = 0; k < 2 && operands[k]; k++)
                if (strcmp(piece, operands[k]) == 0)
                    snprintf(piece, sizeof piece, "$%d", k);
            next = text + n;
        }
        size_t n = strlen(piece);
        KILN_ASSERT(len + n < cap);
        memcpy(e + len, piece, n);
        len += n;
        text = next;
    }
    e[len] = 0;
}

static const char *const unary_operand[] = {"x", NULL}, *const binary_operands[] = {"a", "b"};

void unary_formula(const Node *n, char *e, size_t cap) {
    double p[UNARY_MAX_PARAMS];
    unary_params(n->op, n, p);
    const char *text = NULL;
    switch (n->op) {
#define UNARY(id, name, attrs, reference, c, ...)                                                            \
    case OP_##id:                                                                                            \
        text = c;                                                                                            \
        break;
#include "../ir/unary.def"
#undef UNARY
    default: KILN_ASSERT(!"not a unary op");
    }
    row_formula(text, p, unary_operand, e, cap);
}

void unary_derivative_formula(OpId op, const Node *n, char *e, size_t cap) {
    double p[UNARY_MAX_PARAMS];
    unary_params(op, n, p);
    const char *text = NULL;
    switch (op) {
#define UNARY(id, name, attrs, reference, c, derivative, c_derivative)                                       \
    case OP_##id:                                                                                            \
        text = c_derivative;                                                                                 \
        break;
#include "../ir/unary.def"
#undef UNARY
    default: KILN_ASSERT(!"not a unary op");
    }
    row_formula(text, p, unary_operand, e, cap);
}

/* The integer ops (op_takes_ints) over x[0] and, for a binary op, x[1], as the
 * interpreter computes them; the C target compiles with -fwrapv, so a sum or
 * product wraps around. */
static KExpr *int_of(KBuilder *b, KType t, int64_t v) {
    return t == KT_I32 ? k_i32(b, v) : k_int(b, v);
}

static KExpr *int_element(KBuilder *b, KExpr *const *x, const void *ctx) {
    const Node *n = ctx;
    KExpr *a = x[0], *c = op_has(n->op, F_BINARY) ? x[1] : NULL;
    switch (n->op) {
    case OP_ADD: return k_add(b, a, c);
    case OP_SUB: return k_sub(b, a, c);
    case OP_MUL: return k_mul(b, a, c);
    case OP_DIV: {
        /* by zero: 0; by -1: the negation (INT_MIN / -1 is undefined in C) */
        KExpr *zero = int_of(b, a->type, 0);
        KExpr *quotient =
            k_select(b, k_bin(b, KE_EQ, c, int_of(b, a->type, -1)), k_neg(b, a), k_div(b, a, c));
        return k_select(b, k_bin(b, KE_EQ, c, zero), zero, quotient);
    }
    case OP_MAX: return k_select(b, k_bin(b, KE_GT, a, c), a, c);
    case OP_MIN: return k_select(b, k_lt(b, a, c), a, c);
    case OP_NEG: return k_neg(b, a);
    case OP_ABS: return k_select(b, k_lt(b, a, int_of(b, a->type, 0)), k_neg(b, a), a);
    default: KILN_ASSERT(!"not an integer op");
    }
    return NULL;
}

int lower_unary(Program *p, const Node *n, Diag *d) {
    if (dtype_is_int(p->g->values[n->out[0]].type.dtype))
        return lower_broadcast(p, n, (const bool[]){true}, int_element, n, NULL, d);
    Kernel *k = loop_over_output(p, n, d);
    if (!k)
        return -1;
    KBuilder *b = &k->b;
    KExpr *i = k_var(b, k->iter);
    char f[512];
    unary_formula(n, f, sizeof f);
    KExpr *x = k_var(b, kb_let(b, "x", KT_F32, k_load(b, kb_value(b, n->in[0], false), i)));
    kb_store(b, kb_value(b, n->out[0], true), i, k_formula(b, KT_F32, f, 1, &x));
    return 0;
}

/* The C column of a binary op's row (wrt: 0 its value, 1 d/da, 2 d/db) as a formula. */
void binary_formula(OpId op, int wrt, char *e, size_t cap) {
    const char *text = NULL;
    switch (op) {
#define BINARY(id, name, reference, c, d_da, d_db, c_da, c_db)                                               \
    case OP_##id:                                                                                            \
        text = wrt == 0 ? c : wrt == 1 ? c_da : c_db;                                                        \
        break;
#include "../ir/binary.def"
#undef BINARY
    default: KILN_ASSERT(!"not a binary op");
    }
    row_formula(text, NULL, binary_operands, e, cap);
}

int lower_copy(Program *p, const Node *n, Diag *d) {
    if (p->view_of && p->view_of[n->out[0]] >= 0)
        return 0;
    Kernel *k = loop_over_output(p, n, d);
    if (!k)
        return -1;
    KBuilder *b = &k->b;
    KExpr *i = k_var(b, k->iter);
    kb_store(b, kb_value(b, n->out[0], true), i, k_load(b, kb_value(b, n->in[0], false), i));
    return 0;
}

/* ---- elementwise: a fused expression in one loop ---- */

KExpr *kb_expr(KBuilder *b, const Expr *e, KExpr *const *inputs, int *next) {
    switch (e->kind) {
    case EXPR_INPUT: return inputs[e->input];
    case EXPR_NUMBER: return k_f32(b, e->number);
    case EXPR_CALL: break;
    }
    KExpr *args[2];
    args[0] = kb_expr(b, e->arg[0], inputs, next);
    if (e->call.n_in == 2)
        args[1] = kb_expr(b, e->arg[1], inputs, next);
    char f[512];
    const char *name = kb_name(b, "t", (*next)++);
    if (e->call.n_in == 1)
        unary_formula(&e->call, f, sizeof f);
    else
        binary_formula(e->call.op, 0, f, sizeof f);
    KExpr *value = k_formula(b, KT_F32, f, e->call.n_in, args);
    return k_var(b, kb_let(b, name, KT_F32, value));
}

/* The epilogue of fused op n applied to x0, the element's value so far, with n's
 * inputs from expr_first_input(n) on read at offset `at` of the element in the
 * result; returns the value to store. */
static KExpr *element_epilogue(KBuilder *b, const Program *p, const Node *n, const Expr *epilogue, KExpr *x0,
                               KExpr *at) {
    if (!epilogue)
        return x0;
    int first = expr_first_input(n), next = 0;
    KExpr **inputs = arena_alloc(b->arena, sizeof *inputs * (size_t)(n->n_in - first + 2));
    if (!inputs) {
        b->oom = true;
        return x0;
    }
    inputs[0] = x0;
    for (int k = first; k < n->n_in; k++) {
        bool one = type_numel(&p->g->values[n->in[k]].type) == 1;
        inputs[k - first + 1] =
            k_var(b, kb_let(b, kb_name(b, "x", k - first + 1), KT_F32,
                            k_load(b, kb_value(b, n->in[k], false), one ? k_int(b, 0) : at)));
    }
    return kb_expr(b, epilogue, inputs, &next);
}

void kb_tile_epilogue(KBuilder *b, const Program *p, const Node *n, const Expr *epilogue, int bias,
                      KExpr *(*bias_at)(KBuilder *b, KExpr *r, KExpr *q, const void *ctx), const void *ctx,
                      int tile, KExpr *tile_at, KExpr *rows, KExpr *cols, int64_t ld, int64_t step) {
    bool biased = bias >= 0 && bias_at;
    if (!biased && !epilogue)
        return;
    int first = expr_first_input(n);
    bool located = false; /* some input is read at the element's offset in y */
    for (int k = first; epilogue && k < n->n_in; k++)
        located |= type_numel(&p->g->values[n->in[k]].type) != 1;
    int r = kb_for(b, "r", KT_I64, k_int(b, 0), rows, NULL, 0);
    int q = kb_for(b, "q", KT_I64, k_int(b, 0), cols, NULL, 0);
    /* vectorized, not unrolled: Clang's unrolling (small models keep it) unrolled
       the 512 columns of the small CNN's Winograd output into 0.33 s of compile */
    kb_unroll(b, 1);
    KExpr *in_tile = k_add(b, ld ? k_mul(b, k_var(b, r), k_int(b, ld)) : k_int(b, 0),
                           k_mul(b, k_var(b, q), k_int(b, step)));
    KExpr *x0 = k_load(b, tile, k_add(b, tile_at, in_tile));
    if (biased)
        x0 = k_add(b, x0, k_load(b, kb_value(b, bias, false), bias_at(b, k_var(b, r), k_var(b, q), ctx)));
    int v0 = kb_let(b, "x0", KT_F32, x0);
    KExpr *in_y = located ? k_add(b, tile_at, in_tile) : NULL;
    kb_store(b, tile, k_add(b, tile_at, in_tile), element_epilogue(b, p, n, epilogue, k_var(b, v0), in_y));
    kb_end(b);
    kb_end(b);
}

void kb_store_epilogue(KBuilder *b, const Program *p, const Node *n, const Expr *epilogue, int y, KExpr *at,
                       KExpr *x0) {
    int v0 = kb_let(b, "x0", KT_F32, x0);
    kb_store(b, y, at, element_epilogue(b, p, n, epilogue, k_var(b, v0), at));
}

void kb_gemm_store(Kernel *k, const Program *p, const Node *n, const Expr *epilogue, KExpr *bias, KExpr *at) {
    KBuilder *b = &k->b;
    KExpr *acc = k_var(b, k->gemm.acc);
    kb_store_epilogue(b, p, n, epilogue, kb_value(b, n->out[0], true), at, bias ? k_add(b, acc, bias) : acc);
}

/* How an input is read inside a block of the output's last dims: FULL when
 * it has those dims as the output does (contiguous in the block), CONST when they
 * are all 1 for it (one value for the whole block). */
enum { ANY, FULL, CONST };

/* The most trailing dims of `to` over which every used input is FULL or CONST
 * (for at most 64 inputs). */
static int block_dims(const Program *p, const Node *n, const bool *used, const Type *to) {
    int state[64] = {ANY};
    KILN_ASSERT(n->n_in <= 64);
    int s = 0;
    for (int k = to->rank - 1; k >= 0; k--, s++) {
        for (int i = 0; i < n->n_in; i++) {
            const Type *t = &p->g->values[n->in[i]].type;
            int at = k - (to->rank - t->rank);
            int64_t dim = at >= 0 ? t->dims[at] : 1;
            int here = to->dims[k] == 1 ? ANY : dim == 1 ? CONST : FULL;
            if (!used[i] || here == ANY)
                continue;
            if (state[i] != ANY && state[i] != here)
                return s;
        }
        for (int i = 0; i < n->n_in; i++) {
            const Type *t = &p->g->values[n->in[i]].type;
            int at = k - (to->rank - t->rank);
            int64_t dim = at >= 0 ? t->dims[at] : 1;
            if (used[i] && to->dims[k] != 1)
                state[i] = dim == 1 ? CONST : FULL;
        }
    }
    return s;
}

static void mark_used(const Expr *e, bool *used) {
    if (e->kind == EXPR_INPUT)
        used[e->input] = true;
    for (int k = 0; e->kind == EXPR_CALL && k < e->call.n_in; k++)
        mark_used(e->arg[k], used);
}

/* Three loop shapes, by how the inputs broadcast:
 *   - none needs an index of its own (each has the output's type or one element):
 *     one iteration per element, inputs read at `i` (or 0);
 *   - the output's trailing dims form blocks of at least ELEMENTWISE_BLOCK elements
 *     in which each input is contiguous or constant (a per-channel scale, a bias):
 *     one iteration per block, the input offsets computed once per block and an
 *     inner loop over the block that compilers vectorize;
 *   - otherwise one iteration per element, the output index unraveled and each
 *     input read at its broadcast offset. */
enum { ELEMENTWISE_BLOCK = 16 };

int lower_broadcast(Program *p, const Node *n, const bool *used, ElementFn f, const void *ctx,
                    const char *text, Diag *d) {
    const Type *to = &p->g->values[n->out[0]].type;
    KExpr **x = arena_alloc(&p->arena, sizeof *x * ((size_t)n->n_in + 1));
    if (!x)
        return diag_error(d, n->loc, "out of memory");
    /* some input needs an index other than i (it has the output's elements in the
     * output's order) or 0 (it has one element) */
    bool indexed = false;
    for (int i = 0; i < n->n_in; i++) {
        int64_t count = type_numel(&p->g->values[n->in[i]].type);
        indexed |= used[i] && count != 1 && count != type_numel(to);
    }
    int s = indexed && n->n_in <= 64 ? block_dims(p, n, used, to) : 0;
    Type outer = type_make(to->rank - s, to->dims);
    int64_t inner = type_numel(to) / type_numel(&outer);
    bool blocked = indexed && inner >= ELEMENTWISE_BLOCK;
    Kernel *k = blocked ? kernel_loop(p, n, NULL, type_numel(&outer),
                                      ELEMENTWISE_GRAIN / inner > 1 ? ELEMENTWISE_GRAIN / inner : 1, d)
                        : loop_over_output(p, n, d);
    if (!k)
        return -1;
    k->in_place = true; /* blocked or not, an input of y's type is read where y is written */
    kernel_follows(p, k, to, k->count, 1, 1);
    /* the comment names the fused ops: "elementwise y: clip(add($0, $1), min=0)" */
    if (text)
        kernel_annotate(k, text);
    KBuilder *b = &k->b;
    KExpr *i = k_var(b, k->iter), *o[KILN_MAX_RANK], *j = NULL;
    if (indexed)
        kb_unravel(b, i, blocked ? &outer : to, "o", o);
    /* inputs constant over a block are read before its loop, the others in it */
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1 && blocked)
            j = k_var(b, kb_for(b, "j", KT_I64, k_int(b, 0), k_int(b, inner), NULL, 0));
        for (int in = 0; in < n->n_in; in++) {
            const Type *t = &p->g->values[n->in[in]].type;
            if (!used[in])
                continue;
            KView v = kview_broadcast(t, to);
            bool full = false; /* in a block, varying along it (else constant over it) */
            for (int dim = outer.rank; blocked && dim < to->rank; dim++)
                full |= v.strides[dim] != 0 && to->dims[dim] != 1;
            bool in_loop = !blocked || full || type_numel(t) == 1 ? pass == 1 : pass == 0;
            if (blocked && type_numel(t) == 1)
                in_loop = pass == 0 ? false : true;
            if (!in_loop)
                continue;
            KExpr *at;
            if (type_numel(t) == 1)
                at = k_int(b, 0);
            else if (blocked && type_numel(t) == type_numel(to))
                at = k_madd(b, i, inner, j);
            else if (blocked) {
                v.rank = outer.rank; /* the block's offset from the outer index; FULL inputs add j */
                at = kview_index(b, &v, o);
                if (full)
                    at = k_add(b, at, j);
            } else if (type_numel(t) != type_numel(to))
                at = kview_index(b, &v, o);
            else
                at = i;
            KExpr *load = k_load(b, kb_value(b, n->in[in], false), at);
            x[in] = k_var(b, kb_let(b, kb_name(b, "x", in), load->type, load));
        }
    }
    kb_store(b, kb_value(b, n->out[0], true), blocked ? k_madd(b, i, inner, j) : i, f(b, x, ctx));
    if (blocked)
        kb_end(b);
    return 0;
}

static KExpr *expr_element(KBuilder *b, KExpr *const *x, const void *e) {
    int next = 0;
    return kb_expr(b, e, x, &next);
}

/* Node n as expression e over its inputs; `text`, the expression as written, names
 * it in the kernel's comment (NULL: n's op names it). */
static int lower_expr(Program *p, const Node *n, const Expr *e, const char *text, Diag *d) {
    bool *used = ir_calloc((size_t)n->n_in + 1, sizeof *used);
    if (!used)
        return diag_error(d, n->loc, "out of memory");
    mark_used(e, used);
    int rc = lower_broadcast(p, n, used, expr_element, e, text, d);
    ir_free(used);
    return rc;
}

int lower_elementwise(Program *p, const Node *n, Diag *d) {
    Arena arena = {0};
    Expr *e = node_expr(&arena, n, d);
    int rc = e ? lower_expr(p, n, e, node_attr(n, ATTR_EXPR)->s, d) : -1;
    arena_free(&arena);
    return rc;
}

/* A binary op is the expression op($0, $1), so that its broadcasting runs as an
 * `elementwise` node's does: in blocks, a per-channel operand read once a block. A
 * scalar const operand is a literal, as fuse_elementwise makes it (so that powf(x,
 * 2.0f) compiles to x * x). */
int lower_binary(Program *p, const Node *n, Diag *d) {
    if (dtype_is_int(p->g->values[n->out[0]].type.dtype))
        return lower_broadcast(p, n, (const bool[]){true, true}, int_element, n, NULL, d);
    Expr operands[2] = {{.kind = EXPR_INPUT, .input = 0}, {.kind = EXPR_INPUT, .input = 1}};
    for (int k = 0; k < 2; k++) {
        const Node *def = p->g->values[n->in[k]].node >= 0 ? p->g->nodes[p->g->values[n->in[k]].node] : NULL;
        if (def && def->op == OP_CONST && def->data->type.rank == 0 && def->data->type.dtype == DT_F32)
            operands[k] = (Expr){.kind = EXPR_NUMBER, .number = def->data->data[0]};
    }
    Expr call = {.kind = EXPR_CALL, .call = *n, .arg = {&operands[0], &operands[1]}};
    return lower_expr(p, n, &call, NULL, d);
}
