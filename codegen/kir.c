/* Building, simplifying and verifying kernel IR (see kir.h).
 *
 * Nodes live in the program's arena and are never freed one by one. When an
 * allocation fails, the builder remembers it and every later call returns a shared
 * dummy expression and appends nothing, so a lowering checks once, at the end
 * (kb_failed), instead of after every call. Misuse that only a bug in a lowering
 * can cause (kb_end with no block open, too deep a nest) is remembered the same way
 * and reported by kir_verify's caller as an internal error. */
#include "kir.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static KExpr dummy_expr = {.kind = KE_INT, .type = KT_I64};
static KStmt *sink; /* where statements would go once memory has run out: nothing writes it */

void kb_init(KBuilder *b, Arena *a, KBody *body) {
    *b = (KBuilder){.arena = a, .kb = body};
    b->tail[0] = &body->body;
    while (*b->tail[0])
        b->tail[0] = &(*b->tail[0])->next;
}

bool kb_failed(const KBuilder *b) {
    return b->oom || b->misuse;
}

static void *alloc(KBuilder *b, size_t n) {
    if (b->oom)
        return NULL;
    void *p = arena_alloc(b->arena, n);
    if (!p)
        b->oom = true;
    return p;
}

/* ---- Buffers and variables ---- */

static int add_buf(KBuilder *b, KBuf buf) {
    KBody *kb = b->kb;
    for (int i = 0; i < kb->n_bufs; i++)
        if (buf.kind != KB_LOCAL && buf.kind != KB_SHARED && kb->bufs[i].kind == buf.kind &&
            kb->bufs[i].value == buf.value && kb->bufs[i].type == buf.type) {
            kb->bufs[i].writable |= buf.writable;
            return i;
        }
    if (kb->n_bufs == kb->cap_bufs) {
        int cap = kb->cap_bufs ? 2 * kb->cap_bufs : 8;
        KBuf *nb = alloc(b, (size_t)cap * sizeof *nb);
        if (!nb)
            return 0;
        if (kb->n_bufs)
            memcpy(nb, kb->bufs, (size_t)kb->n_bufs * sizeof *nb);
        kb->bufs = nb;
        kb->cap_bufs = cap;
    }
    kb->bufs[kb->n_bufs] = buf;
    return kb->n_bufs++;
}

KType dtype_ktype(DType t) {
    switch (t) {
    case DT_I64: return KT_I64;
    case DT_I32: return KT_I32;
    case DT_BOOL: return KT_BOOL;
    default: return KT_F32;
    }
}

int kb_value(KBuilder *b, int id, bool writable) {
    const Graph *g = b->graph;
    int value = id < 0 && g ? g->outputs[-1 - id] : id;
    KType t = g ? dtype_ktype(g->values[value].type.dtype) : KT_F32;
    return id < 0 ? add_buf(b, (KBuf){.kind = KB_OUTPUT, .value = -1 - id, .writable = true, .type = t})
                  : add_buf(b, (KBuf){.kind = KB_VALUE, .value = id, .writable = writable, .type = t});
}

int kb_scratch(KBuilder *b) {
    return add_buf(b, (KBuf){.kind = KB_SCRATCH, .writable = true, .type = KT_F32});
}

int kb_param_buf(KBuilder *b, const char *name, bool writable) {
    return add_buf(b, (KBuf){.kind = KB_PARAM,
                             .value = -2 - b->kb->n_bufs,
                             .writable = writable,
                             .type = KT_F32,
                             .name = name});
}

int kb_table_of(KBuilder *b, KType t) {
    return add_buf(b, (KBuf){.kind = KB_TABLE, .type = t});
}

int kb_table(KBuilder *b) {
    return kb_table_of(b, KT_F32);
}

static KStmt *append(KBuilder *b, KStmtKind kind) {
    KStmt *s = alloc(b, sizeof *s);
    if (!s)
        return NULL;
    s->kind = kind;
    *b->tail[b->depth] = s;
    b->tail[b->depth] = &s->next;
    return s;
}

int kb_array(KBuilder *b, const char *name, KType t, int64_t rows, int64_t cols, bool shared, bool zero) {
    int64_t size = cols ? rows * cols : rows;
    int buf = add_buf(b, (KBuf){.kind = shared ? KB_SHARED : KB_LOCAL,
                                .value = -1,
                                .writable = true,
                                .type = t,
                                .size = size,
                                .cols = cols,
                                .name = name});
    KStmt *s = append(b, KS_ARRAY);
    if (s) {
        s->buf = buf;
        s->zero = zero;
    }
    return buf;
}

int kb_new_var(KBuilder *b, const char *name, KType t) {
    KBody *kb = b->kb;
    if (kb->n_vars == kb->cap_vars) {
        int cap = kb->cap_vars ? 2 * kb->cap_vars : 16;
        KVarInfo *nv = alloc(b, (size_t)cap * sizeof *nv);
        if (!nv)
            return 0;
        if (kb->n_vars)
            memcpy(nv, kb->vars, (size_t)kb->n_vars * sizeof *nv);
        kb->vars = nv;
        kb->cap_vars = cap;
    }
    kb->vars[kb->n_vars] = (KVarInfo){name, t, false};
    return kb->n_vars++;
}

int kb_param_var(KBuilder *b, const char *name, KType t) {
    int var = kb_new_var(b, name, t);
    if (!b->oom)
        b->kb->vars[var].param = true;
    return var;
}

const char *kb_name(KBuilder *b, const char *prefix, int k) {
    char name[32];
    snprintf(name, sizeof name, "%s%d", prefix, k);
    char *kept = b->oom ? NULL : arena_strdup(b->arena, name);
    if (!kept)
        b->oom = true;
    return kept ? kept : prefix;
}

/* ---- Expressions ---- */

static KExpr *node(KBuilder *b, KExprKind kind, KType t) {
    KExpr *e = alloc(b, sizeof *e);
    if (!e)
        return &dummy_expr;
    e->kind = kind;
    e->type = t;
    return e;
}

static KExpr *int_literal(KBuilder *b, KType t, int64_t v) {
    KExpr *e = node(b, KE_INT, t);
    if (e != &dummy_expr)
        e->i = v;
    return e;
}

static KExpr *float_literal_of(KBuilder *b, KType t, double v) {
    KExpr *e = node(b, KE_FLOAT, t);
    if (e != &dummy_expr)
        e->f = v;
    return e;
}

KExpr *k_int(KBuilder *b, int64_t v) {
    return int_literal(b, KT_I64, v);
}

KExpr *k_i32(KBuilder *b, int64_t v) {
    return int_literal(b, KT_I32, v);
}

KExpr *k_f32(KBuilder *b, double v) {
    return float_literal_of(b, KT_F32, v);
}

KExpr *k_f64(KBuilder *b, double v) {
    return float_literal_of(b, KT_F64, v);
}

KExpr *k_var(KBuilder *b, int var) {
    KType t = var >= 0 && var < b->kb->n_vars ? b->kb->vars[var].type : KT_I64;
    KExpr *e = node(b, KE_VAR, t);
    if (e != &dummy_expr)
        e->var = var;
    return e;
}

/* A load, address or vector load of buffer buf at index. */
static KExpr *access(KBuilder *b, KExprKind kind, KType t, int buf, KExpr *index) {
    KExpr *e = node(b, kind, t);
    if (e != &dummy_expr) {
        e->buf = buf;
        e->a = index;
    }
    return e;
}

KExpr *k_load(KBuilder *b, int buf, KExpr *index) {
    return access(b, KE_LOAD, buf >= 0 && buf < b->kb->n_bufs ? b->kb->bufs[buf].type : KT_F32, buf, index);
}

static KExpr *flat2(KBuilder *b, int buf, KExpr *row, KExpr *col) {
    int64_t cols = buf >= 0 && buf < b->kb->n_bufs ? b->kb->bufs[buf].cols : 0;
    KExpr *e = node(b, KE_ADD, row->type);
    if (e != &dummy_expr) { /* kept as row * cols + col for the printer's a[row][col] */
        e->a = row;
        e->b = col;
        e->i = cols;
    }
    return e;
}

KExpr *k_load2(KBuilder *b, int buf, KExpr *row, KExpr *col) {
    KExpr *e = k_load(b, buf, flat2(b, buf, row, col));
    if (e != &dummy_expr)
        e->n_args = 2; /* marks a two-index access */
    return e;
}

KExpr *k_addr(KBuilder *b, int buf, KExpr *index) {
    return access(b, KE_ADDR, KT_PTR, buf, index);
}

KExpr *k_vload(KBuilder *b, int buf, KExpr *index) {
    return access(b, KE_VLOAD, KT_VF32, buf, index);
}

KExpr *k_vsplat(KBuilder *b, double v) {
    return float_literal_of(b, KT_VF32, v);
}

KExpr *k_symbol(KBuilder *b, const char *name) {
    KExpr *e = node(b, KE_SYMBOL, KT_I32);
    if (e != &dummy_expr)
        e->name = name;
    return e;
}

KExpr *k_sym_size(KBuilder *b) {
    return node(b, KE_SYM_SIZE, KT_I64);
}

KExpr *k_special(KBuilder *b, KSpecial s) {
    KExpr *e = node(b, KE_SPECIAL, KT_I32);
    if (e != &dummy_expr)
        e->special = s;
    return e;
}

KExpr *k_neg(KBuilder *b, KExpr *a) {
    if (a->kind == KE_INT)
        return int_literal(b, a->type, -a->i);
    KExpr *e = node(b, KE_NEG, a->type);
    if (e != &dummy_expr)
        e->a = a;
    return e;
}

KExpr *k_not(KBuilder *b, KExpr *a) {
    KExpr *e = node(b, KE_NOT, KT_BOOL);
    if (e != &dummy_expr)
        e->a = a;
    return e;
}

KExpr *k_cast(KBuilder *b, KType t, KExpr *a) {
    if (a->type == t)
        return a;
    KExpr *e = node(b, KE_CAST, t);
    if (e != &dummy_expr)
        e->a = a;
    return e;
}

static bool is_int(const KExpr *e, int64_t v) {
    return e->kind == KE_INT && e->i == v;
}

static bool integral(KType t) {
    return t == KT_I32 || t == KT_I64;
}

static KType result_type(KExprKind op, KType t) {
    return op >= KE_LT && op <= KE_OR ? KT_BOOL : t;
}

/* Integer arithmetic of constants, as C would compute it where it does not
 * overflow (else left for the compiler to see). */
static bool fold(KExprKind op, int64_t x, int64_t y, int64_t *r) {
    switch (op) {
    case KE_ADD: return ck_add(x, y, r);
    case KE_SUB: return ck_sub(x, y, r);
    case KE_MUL: return ck_mul(x, y, r);
    case KE_DIV: return y != 0 && !(x == INT64_MIN && y == -1) && (*r = x / y, true);
    case KE_MOD: return y != 0 && !(x == INT64_MIN && y == -1) && (*r = x % y, true);
    default: return false;
    }
}

KExpr *k_bin(KBuilder *b, KExprKind op, KExpr *x, KExpr *y) {
    if (integral(x->type) && x->type == y->type) {
        int64_t r;
        if (x->kind == KE_INT && y->kind == KE_INT && fold(op, x->i, y->i, &r))
            return int_literal(b, x->type, r);
        switch (op) {
        case KE_ADD:
            if (is_int(x, 0))
                return y;
            if (is_int(y, 0))
                return x;
            break;
        case KE_SUB:
            if (is_int(y, 0))
                return x;
            break;
        case KE_MUL:
            if (is_int(x, 1))
                return y;
            if (is_int(y, 1))
                return x;
            if (is_int(x, 0) || is_int(y, 0))
                return int_literal(b, x->type, 0);
            break;
        case KE_DIV:
            if (is_int(y, 1))
                return x;
            break;
        case KE_MOD:
            if (is_int(y, 1))
                return int_literal(b, x->type, 0);
            break;
        default: break;
        }
    }
    KExpr *e = node(b, op, result_type(op, y->type == KT_VF32 ? KT_VF32 : x->type));
    if (e != &dummy_expr) {
        e->a = x;
        e->b = y;
    }
    return e;
}

KExpr *k_add(KBuilder *b, KExpr *x, KExpr *y) {
    return k_bin(b, KE_ADD, x, y);
}
KExpr *k_sub(KBuilder *b, KExpr *x, KExpr *y) {
    return k_bin(b, KE_SUB, x, y);
}
KExpr *k_mul(KBuilder *b, KExpr *x, KExpr *y) {
    return k_bin(b, KE_MUL, x, y);
}
KExpr *k_div(KBuilder *b, KExpr *x, KExpr *y) {
    return k_bin(b, KE_DIV, x, y);
}
KExpr *k_mod(KBuilder *b, KExpr *x, KExpr *y) {
    return k_bin(b, KE_MOD, x, y);
}
KExpr *k_lt(KBuilder *b, KExpr *x, KExpr *y) {
    return k_bin(b, KE_LT, x, y);
}
KExpr *k_and(KBuilder *b, KExpr *x, KExpr *y) {
    return k_bin(b, KE_AND, x, y);
}

KExpr *k_madd(KBuilder *b, KExpr *x, int64_t stride, KExpr *y) {
    return k_add(b, k_mul(b, x, int_literal(b, x->type, stride)), y);
}

KExpr *k_select(KBuilder *b, KExpr *c, KExpr *x, KExpr *y) {
    KExpr *e = node(b, KE_SELECT, x->type);
    if (e != &dummy_expr) {
        e->a = c;
        e->b = x;
        e->c = y;
    }
    return e;
}

static KExpr *with_args(KBuilder *b, KExprKind kind, KType t, const char *name, int n, KExpr **args) {
    KExpr *e = node(b, kind, t);
    if (e == &dummy_expr)
        return e;
    e->name = name;
    e->n_args = n;
    e->args = alloc(b, (size_t)(n ? n : 1) * sizeof *e->args);
    if (!e->args)
        return &dummy_expr;
    for (int i = 0; i < n; i++)
        e->args[i] = args[i];
    return e;
}

KExpr *k_call(KBuilder *b, KType t, const char *fn, int n, KExpr **args) {
    return with_args(b, KE_CALL, t, fn, n, args);
}

KExpr *k_formula(KBuilder *b, KType t, const char *formula, int n, KExpr **args) {
    char *text = b->oom ? NULL : arena_strdup(b->arena, formula);
    if (!text) {
        b->oom = true;
        return &dummy_expr;
    }
    return with_args(b, KE_FORMULA, t, text, n, args);
}

/* ---- Statements ---- */

static void define_var(KBuilder *b, KStmtKind kind, int var, KExpr *value) {
    KStmt *s = append(b, kind);
    if (s) {
        s->var = var;
        s->a = value;
    }
}

void kb_let_var(KBuilder *b, int var, KExpr *value) {
    define_var(b, KS_LET, var, value);
}

void kb_decl_var(KBuilder *b, int var, KExpr *init) {
    define_var(b, KS_DECL, var, init);
}

static int define(KBuilder *b, KStmtKind kind, const char *name, KType t, KExpr *value) {
    int var = kb_new_var(b, name, t);
    define_var(b, kind, var, value);
    return var;
}

int kb_let(KBuilder *b, const char *name, KType t, KExpr *value) {
    return define(b, KS_LET, name, t, value);
}

int kb_decl(KBuilder *b, const char *name, KType t, KExpr *init) {
    return define(b, KS_DECL, name, t, init);
}

static void assign(KBuilder *b, int var, KExpr *value, bool accumulate) {
    KStmt *s = append(b, KS_ASSIGN);
    if (s) {
        s->var = var;
        s->a = value;
        s->accumulate = accumulate;
    }
}

void kb_assign(KBuilder *b, int var, KExpr *value) {
    assign(b, var, value, false);
}

void kb_accum(KBuilder *b, int var, KExpr *value) {
    assign(b, var, value, true);
}

static void store(KBuilder *b, int buf, KExpr *index, KExpr *value, bool accumulate, bool two_d) {
    KStmt *s = append(b, KS_STORE);
    if (s) {
        s->buf = buf;
        s->index = index;
        s->a = value;
        s->accumulate = accumulate;
        s->n_args = two_d ? 2 : 0;
    }
}

void kb_store(KBuilder *b, int buf, KExpr *index, KExpr *value) {
    store(b, buf, index, value, false, false);
}

void kb_store_add(KBuilder *b, int buf, KExpr *index, KExpr *value) {
    store(b, buf, index, value, true, false);
}

void kb_vstore(KBuilder *b, int buf, KExpr *index, KExpr *value) {
    KStmt *s = append(b, KS_VSTORE);
    if (s) {
        s->buf = buf;
        s->index = index;
        s->a = value;
    }
}

void kb_store2(KBuilder *b, int buf, KExpr *row, KExpr *col, KExpr *value, bool accumulate) {
    store(b, buf, flat2(b, buf, row, col), value, accumulate, true);
}

/* Opens a block whose statements chain from *first (the builder's sink when
 * memory ran out, so that kb_end still balances). */
static void open_block(KBuilder *b, KStmt *s, KStmt **first) {
    if (b->depth + 1 >= KB_MAX_DEPTH) {
        b->misuse = true;
        return;
    }
    b->depth++;
    b->open[b->depth] = s;
    b->first[b->depth] = first ? first : &sink;
    b->tail[b->depth] = b->first[b->depth];
}

void kb_for_var(KBuilder *b, int var, KExpr *lo, KExpr *hi, KExpr *step, unsigned flags) {
    KStmt *s = append(b, KS_FOR);
    if (s) {
        s->var = var;
        s->lo = lo;
        s->hi = hi;
        s->step = step;
        s->flags = flags;
        s->unroll = flags & K_UNROLL ? 16 : 0;
    }
    open_block(b, s, s ? &s->body : NULL);
}

void kb_unroll(KBuilder *b, int count) {
    KStmt *s = b->open[b->depth];
    if (b->depth == 0 || (s && s->kind != KS_FOR) || count < 1) {
        b->misuse = true;
        return;
    }
    if (s) {
        s->flags |= K_UNROLL;
        s->unroll = count;
    }
}

int kb_for(KBuilder *b, const char *name, KType t, KExpr *lo, KExpr *hi, KExpr *step, unsigned flags) {
    int var = kb_new_var(b, name, t);
    kb_for_var(b, var, lo, hi, step, flags);
    return var;
}

void kb_if(KBuilder *b, KExpr *cond) {
    KStmt *s = append(b, KS_IF);
    if (s)
        s->a = cond;
    open_block(b, s, s ? &s->body : NULL);
}

void kb_scope(KBuilder *b) {
    KStmt *s = append(b, KS_BLOCK);
    open_block(b, s, s ? &s->body : NULL);
}

void kb_else(KBuilder *b) {
    KStmt *s = b->open[b->depth];
    if (b->depth == 0 || (s && s->kind != KS_IF)) {
        b->misuse = true;
        return;
    }
    b->tail[b->depth] = s ? &s->orelse : &sink;
}

void kb_end(KBuilder *b) {
    if (b->depth == 0) {
        b->misuse = true;
        return;
    }
    b->depth--;
}

static KStmt *with_stmt_args(KBuilder *b, KStmtKind kind, const char *fn, int n, KExpr **args) {
    KStmt *s = append(b, kind);
    if (!s)
        return NULL;
    s->name = fn;
    s->n_args = n;
    s->args = alloc(b, (size_t)(n ? n : 1) * sizeof *s->args);
    if (s->args)
        for (int i = 0; i < n; i++)
            s->args[i] = args[i];
    return s;
}

void kb_call(KBuilder *b, const char *fn, int n, KExpr **args) {
    with_stmt_args(b, KS_CALL, fn, n, args);
}

void kb_barrier(KBuilder *b) {
    append(b, KS_BARRIER);
}

void kb_begin_block(KBuilder *b) {
    open_block(b, NULL, alloc(b, sizeof(KStmt *)));
}

KStmt *kb_take(KBuilder *b) {
    if (b->depth == 0 || b->open[b->depth]) {
        b->misuse = true;
        return NULL;
    }
    b->depth--;
    return b->oom ? NULL : *b->first[b->depth + 1];
}

/* A copy of statement list s: its statements and nested blocks (expressions,
 * which nothing changes after building, are shared). */
static KStmt *copy_list(KBuilder *b, const KStmt *s) {
    KStmt *head = NULL, **tail = &head;
    for (; s; s = s->next) {
        KStmt *c = alloc(b, sizeof *c);
        if (!c)
            return NULL;
        *c = *s;
        c->next = NULL;
        c->body = copy_list(b, s->body);
        c->orelse = copy_list(b, s->orelse);
        *tail = c;
        tail = &c->next;
    }
    return head;
}

void kb_splice(KBuilder *b, const KStmt *s) {
    KStmt *c = copy_list(b, s);
    if (!c)
        return;
    *b->tail[b->depth] = c;
    while (c->next)
        c = c->next;
    b->tail[b->depth] = &c->next;
}

/* ---- Views ---- */

KView kview_of(const Type *t) {
    KView v = {.rank = t->rank};
    int64_t s = 1;
    for (int j = t->rank - 1; j >= 0; j--) {
        v.dims[j] = t->dims[j];
        v.strides[j] = s;
        s *= t->dims[j];
    }
    return v;
}

KView kview_broadcast(const Type *t, const Type *to) {
    KView own = kview_of(t), v = {.rank = to->rank};
    for (int j = 0; j < to->rank; j++) {
        int k = j - (to->rank - t->rank);
        v.dims[j] = to->dims[j];
        v.strides[j] = k >= 0 && t->dims[k] != 1 ? own.strides[k] : 0;
    }
    return v;
}

KExpr *kview_index(KBuilder *b, const KView *v, KExpr *const *idx) {
    KExpr *e = NULL;
    for (int j = 0; j < v->rank; j++)
        if (v->dims[j] != 1 && v->strides[j] != 0)
            e = e ? k_madd(b, idx[j], v->strides[j], e) : k_mul(b, idx[j], k_int(b, v->strides[j]));
    if (!e)
        return k_int(b, v->offset);
    return v->offset ? k_add(b, k_int(b, v->offset), e) : e;
}

void kb_unravel(KBuilder *b, KExpr *flat, const Type *t, const char *prefix, KExpr **idx) {
    int64_t inner = 1;
    for (int j = t->rank - 1; j >= 0; j--) {
        if (t->dims[j] == 1) {
            idx[j] = k_int(b, 0);
            continue;
        }
        KExpr *e = k_div(b, flat, k_int(b, inner));
        bool outermost = true;
        for (int o = 0; o < j; o++)
            outermost &= t->dims[o] == 1;
        if (!outermost)
            e = k_mod(b, e, k_int(b, t->dims[j]));
        idx[j] = k_var(b, kb_let(b, kb_name(b, prefix, j), KT_I64, e));
        inner *= t->dims[j];
    }
}

/* ---- Dead lets ---- */

/* Counts the reads of each variable into uses and marks the buffers kb's body
 * loads, stores or takes the address of. */
static void count_expr(KBody *kb, const KExpr *e, int *uses) {
    if (!e)
        return;
    if (e->kind == KE_VAR)
        uses[e->var]++;
    if (e->kind == KE_LOAD || e->kind == KE_ADDR || e->kind == KE_VLOAD)
        kb->bufs[e->buf].used = true;
    count_expr(kb, e->a, uses);
    count_expr(kb, e->b, uses);
    count_expr(kb, e->c, uses);
    for (int i = 0; i < e->n_args && e->kind >= KE_CALL; i++)
        count_expr(kb, e->args[i], uses);
}

static void count_list(KBody *kb, const KStmt *s, int *uses) {
    for (; s; s = s->next) {
        count_expr(kb, s->a, uses);
        count_expr(kb, s->index, uses);
        count_expr(kb, s->lo, uses);
        count_expr(kb, s->hi, uses);
        count_expr(kb, s->step, uses);
        for (int i = 0; i < s->n_args && s->kind == KS_CALL; i++)
            count_expr(kb, s->args[i], uses);
        if (s->kind == KS_ASSIGN)
            uses[s->var]++; /* a variable assigned to is kept with its declaration */
        if (s->kind == KS_STORE || s->kind == KS_VSTORE)
            kb->bufs[s->buf].used = true;
        count_list(kb, s->body, uses);
        count_list(kb, s->orelse, uses);
    }
}

static bool drop_dead(KStmt **list, const int *uses) {
    bool dropped = false;
    for (KStmt **at = list; *at;) {
        KStmt *s = *at;
        if ((s->kind == KS_LET || s->kind == KS_DECL) && uses[s->var] == 0) {
            *at = s->next;
            dropped = true;
            continue;
        }
        dropped |= drop_dead(&s->body, uses);
        dropped |= drop_dead(&s->orelse, uses);
        at = &s->next;
    }
    return dropped;
}

void kir_simplify(KBody *kb) {
    int uses_small[256], *uses = kb->n_vars <= 256 ? uses_small : ir_calloc((size_t)kb->n_vars, sizeof *uses);
    if (!uses) { /* the body stays as built, which is correct, only longer */
        for (int i = 0; i < kb->n_bufs; i++)
            kb->bufs[i].used = true;
        return;
    }
    do {
        memset(uses, 0, (size_t)kb->n_vars * sizeof *uses);
        for (int i = 0; i < kb->n_bufs; i++)
            kb->bufs[i].used = false;
        count_list(kb, kb->body, uses);
    } while (drop_dead(&kb->body, uses));
    if (uses != uses_small)
        ir_free(uses);
}

/* ---- Verification ---- */

typedef struct {
    const KBody *kb;
    KirTarget target;
    signed char *state; /* per variable: 0 unseen, 1 in scope, 2 out of scope again */
    char *err;
    size_t errlen;
} Verifier;

static int fail(Verifier *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(Verifier *v, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->err, v->errlen, fmt, ap);
    va_end(ap);
    return -1;
}

static bool identifier(const char *s) {
    if (!s || !(*s == '_' || (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z')))
        return false;
    for (; *s; s++)
        if (!(*s == '_' || (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9')))
            return false;
    return true;
}

static const char *var_name(const Verifier *v, int var) {
    return var >= 0 && var < v->kb->n_vars ? v->kb->vars[var].name : "?";
}

static int check_buf(Verifier *v, int buf) {
    if (buf < 0 || buf >= v->kb->n_bufs)
        return fail(v, "buffer %d does not exist", buf);
    if (v->kb->bufs[buf].kind == KB_SHARED && v->target != KIR_CUDA)
        return fail(v, "shared array %s outside CUDA", v->kb->bufs[buf].name);
    return 0;
}

/* Vectors are the C target's, read and written in buffers of floats; buf -1: no
 * buffer. */
static int check_vector_access(Verifier *v, int buf) {
    if (v->target != KIR_C)
        return fail(v, "a vector outside C");
    if (buf < 0)
        return 0;
    if (check_buf(v, buf))
        return -1;
    const KBuf *b = &v->kb->bufs[buf];
    return b->type == KT_F32 && b->kind != KB_SHARED ? 0
                                                     : fail(v, "a vector access to a buffer not of floats");
}

/* + - * / of a vector and a vector or a float scalar. */
static bool vector_arithmetic(const KExpr *e) {
    KType x = e->a->type, y = e->b->type;
    return e->kind >= KE_ADD && e->kind <= KE_DIV && (x == KT_VF32 || y == KT_VF32) &&
           (x == KT_VF32 || x == KT_F32) && (y == KT_VF32 || y == KT_F32);
}

static int check_expr(Verifier *v, const KExpr *e) {
    if (!e)
        return fail(v, "a missing operand");
    switch (e->kind) {
    case KE_INT:
    case KE_SYMBOL: return 0;
    case KE_FLOAT: return e->type == KT_VF32 ? check_vector_access(v, -1) : 0;
    case KE_VAR:
        if (e->var < 0 || e->var >= v->kb->n_vars || v->state[e->var] != 1)
            return fail(v, "variable %s read outside its scope", var_name(v, e->var));
        return 0;
    case KE_SPECIAL: return v->target == KIR_CUDA ? 0 : fail(v, "a thread index outside CUDA");
    case KE_SYM_SIZE: return v->target == KIR_CUDA ? fail(v, "the symbolic dim's size on CUDA") : 0;
    case KE_LOAD:
    case KE_ADDR:
        if (check_buf(v, e->buf) || check_expr(v, e->a))
            return -1;
        return integral(e->a->type) ? 0 : fail(v, "a non-integer index");
    case KE_VLOAD:
        if (check_vector_access(v, e->buf) || check_expr(v, e->a))
            return -1;
        return integral(e->a->type) ? 0 : fail(v, "a non-integer index");
    case KE_NEG:
    case KE_NOT:
    case KE_CAST: return check_expr(v, e->a);
    case KE_SELECT:
        if (check_expr(v, e->a) || check_expr(v, e->b) || check_expr(v, e->c))
            return -1;
        if (e->a->type != KT_BOOL)
            return fail(v, "a select whose condition is not a comparison");
        return e->b->type == e->c->type ? 0 : fail(v, "a select of two types");
    case KE_CALL:
    case KE_FORMULA:
        for (int i = 0; i < e->n_args; i++)
            if (check_expr(v, e->args[i]))
                return -1;
        return identifier(e->name) || e->kind == KE_FORMULA ? 0 : fail(v, "a call of a non-identifier");
    default:
        if (check_expr(v, e->a) || check_expr(v, e->b))
            return -1;
        if (e->a->type != e->b->type && !vector_arithmetic(e))
            return fail(v, "an operator (kind %d) applied to two types", (int)e->kind);
        if ((e->kind == KE_MOD || e->kind == KE_AND || e->kind == KE_OR) &&
            !(integral(e->a->type) || e->a->type == KT_BOOL))
            return fail(v, "%% or a logical operator on floats");
        return 0;
    }
}

static int check_list(Verifier *v, const KStmt *s);

static int enter(Verifier *v, int var) {
    if (var < 0 || var >= v->kb->n_vars)
        return fail(v, "variable %d does not exist", var);
    if (!identifier(v->kb->vars[var].name))
        return fail(v, "variable name '%s' is not an identifier", v->kb->vars[var].name);
    if (v->state[var] != 0)
        return fail(v, "variable %s defined twice", var_name(v, var));
    for (int o = 0; o < v->kb->n_vars; o++)
        if (o != var && v->state[o] == 1 && strcmp(v->kb->vars[o].name, v->kb->vars[var].name) == 0)
            return fail(v, "variable %s shadows another", var_name(v, var));
    v->state[var] = 1;
    return 0;
}

static int check_stmt(Verifier *v, const KStmt *s) {
    switch (s->kind) {
    case KS_LET:
    case KS_DECL:
        if (check_expr(v, s->a))
            return -1;
        if (s->a->type != v->kb->vars[s->var].type && s->a->kind != KE_INT && s->a->kind != KE_FLOAT)
            return fail(v, "%s initialized with another type", var_name(v, s->var));
        return enter(v, s->var);
    case KS_ASSIGN:
        if (check_expr(v, s->a))
            return -1;
        if (s->var < 0 || s->var >= v->kb->n_vars || v->state[s->var] != 1)
            return fail(v, "variable %s assigned outside its scope", var_name(v, s->var));
        return 0;
    case KS_STORE:
        if (check_buf(v, s->buf) || check_expr(v, s->index) || check_expr(v, s->a))
            return -1;
        if (!v->kb->bufs[s->buf].writable)
            return fail(v, "a store to a buffer the kernel only reads");
        return 0;
    case KS_VSTORE:
        if (check_vector_access(v, s->buf) || check_expr(v, s->index) || check_expr(v, s->a))
            return -1;
        if (!v->kb->bufs[s->buf].writable)
            return fail(v, "a store to a buffer the kernel only reads");
        return s->a->type == KT_VF32 ? 0 : fail(v, "a vector store of a scalar");
    case KS_FOR: {
        if (check_expr(v, s->lo) || check_expr(v, s->hi) || (s->step && check_expr(v, s->step)))
            return -1;
        if (enter(v, s->var))
            return -1;
        int r = check_list(v, s->body);
        v->state[s->var] = 0; /* a sibling loop may reuse it */
        return r;
    }
    case KS_IF:
        if (check_expr(v, s->a))
            return -1;
        if (s->a->type != KT_BOOL)
            return fail(v, "an if whose condition is not a comparison");
        return check_list(v, s->body) || check_list(v, s->orelse) ? -1 : 0;
    case KS_CALL:
        for (int i = 0; i < s->n_args; i++)
            if (check_expr(v, s->args[i]))
                return -1;
        return identifier(s->name) ? 0 : fail(v, "a call of a non-identifier");
    case KS_BARRIER: return v->target == KIR_CUDA ? 0 : fail(v, "a barrier outside CUDA");
    case KS_ARRAY: return check_buf(v, s->buf);
    case KS_BLOCK: return check_list(v, s->body);
    }
    return fail(v, "a statement of unknown kind %d", (int)s->kind);
}

/* Checks a block; the variables it defines go out of scope at its end. */
static int check_list(Verifier *v, const KStmt *s) {
    const KStmt *first = s;
    for (; s; s = s->next)
        if (check_stmt(v, s))
            return -1;
    for (s = first; s; s = s->next)
        if (s->kind == KS_LET || s->kind == KS_DECL)
            v->state[s->var] = 0;
    return 0;
}

int kir_verify(const KBody *kb, KirTarget t, char *err, size_t errlen) {
    Verifier v = {kb, t, ir_calloc((size_t)kb->n_vars + 1, 1), err, errlen};
    if (!v.state)
        return KIR_NO_MEMORY;
    for (int i = 0; i < kb->n_vars; i++)
        v.state[i] = kb->vars[i].param;
    int r = check_list(&v, kb->body);
    ir_free(v.state);
    return r;
}
