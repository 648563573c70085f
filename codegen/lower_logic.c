/* Lowering of the ops of every dtype (ir/op_logic.c): comparisons, logic, where
 * and cast as one broadcasting loop each (lower_broadcast, which reads each input
 * as its own element type), and gather and gather_elements as loops over the result
 * that check every index they read.
 *
 * A comparison of floats is C's, which is IEEE's: false wherever a NaN is. A cast
 * of a float to an integer saturates, NaN giving 0, written out as selects so that
 * no target converts a float it cannot represent (undefined in C). A gather index
 * out of range stores nothing and raises the program's fault for that node, which
 * `run` returns (program_fault). */
#include "codegen.h"

/* 0 of x's type. */
static KExpr *zero_of(KBuilder *b, const KExpr *x) {
    return x->type == KT_F32 ? k_f32(b, 0) : x->type == KT_I32 ? k_i32(b, 0) : k_int(b, 0);
}

/* Float x as integer type t: saturating, NaN to 0. */
static KExpr *float_to_int(KBuilder *b, KExpr *x, KType t) {
    bool wide = t == KT_I64;
    KExpr *lo = wide ? k_int(b, INT64_MIN) : k_i32(b, INT32_MIN),
          *hi = wide ? k_int(b, INT64_MAX) : k_i32(b, INT32_MAX);
    double limit = wide ? 9223372036854775808.0 : 2147483648.0;
    KExpr *in_range = k_select(b, k_bin(b, KE_LT, x, k_f32(b, -limit)), lo, k_cast(b, t, x));
    return k_select(b, k_bin(b, KE_NE, x, x), wide ? k_int(b, 0) : k_i32(b, 0),
                    k_select(b, k_bin(b, KE_GE, x, k_f32(b, limit)), hi, in_range));
}

static KExpr *cast_element(KBuilder *b, KExpr *x, KType to) {
    if (x->type == to)
        return x;
    if (to == KT_BOOL)
        return k_bin(b, KE_NE, x, zero_of(b, x));
    if (x->type == KT_F32)
        return float_to_int(b, x, to);
    return k_cast(b, to, x);
}

static KExpr *logic_element(KBuilder *b, KExpr *const *x, const void *ctx) {
    const Node *n = ctx;
    switch (n->op) {
    case OP_EQUAL: return k_bin(b, KE_EQ, x[0], x[1]);
    case OP_LESS: return k_bin(b, KE_LT, x[0], x[1]);
    case OP_LESS_EQUAL: return k_bin(b, KE_LE, x[0], x[1]);
    case OP_GREATER: return k_bin(b, KE_GT, x[0], x[1]);
    case OP_GREATER_EQUAL: return k_bin(b, KE_GE, x[0], x[1]);
    case OP_NOT: return k_not(b, x[0]);
    case OP_AND: return k_bin(b, KE_AND, x[0], x[1]);
    case OP_OR: return k_bin(b, KE_OR, x[0], x[1]);
    case OP_WHERE: return k_select(b, x[0], x[1], x[2]);
    case OP_CAST: return cast_element(b, x[0], dtype_ktype(cast_dtype(n)));
    default: KILN_ASSERT(!"not an op of lower_compare");
    }
    return x[0];
}

int lower_compare(Program *p, const Node *n, Diag *d) {
    bool used[3] = {true, true, true};
    return lower_broadcast(p, n, used, logic_element, n, NULL, d);
}

/* The index element at `at` of node n's indices (input indices_at), as i64, and the
 * position along a dim of size dim it names (a negative one counting from the end). */
static KExpr *index_row(KBuilder *b, const Node *n, int indices_at, KExpr *at, int64_t dim) {
    KExpr *j = k_load(b, kb_value(b, n->in[indices_at], false), at);
    if (j->type != KT_I64)
        j = k_cast(b, KT_I64, j);
    j = let_index(b, "j", j);
    return let_index(b, "row", k_select(b, k_lt(b, j, k_int(b, 0)), k_add(b, j, k_int(b, dim)), j));
}

int lower_gather(Program *p, const Node *n, Diag *d) {
    const Type *x = &p->g->values[n->in[0]].type, *idx = &p->g->values[n->in[1]].type;
    int axis = norm_axis(node_int(n, ATTR_AXIS), x->rank);
    int64_t outer, inner, dim = x->dims[axis], count = type_numel(idx);
    split_at_axis(x, axis, &outer, &inner);
    int fault = program_fault(p, n, "an index of the gather is out of range", d);
    Kernel *k = fault < 0 ? NULL : kernel_loop(p, n, NULL, outer * count, 16384 / (inner + 1) + 1, d);
    if (!k)
        return -1;
    kernel_follows(p, k, &p->g->values[n->out[0]].type, k->count, 1, 1); /* slices in order */
    KBuilder *b = &k->b;
    KExpr *i = k_var(b, k->iter);
    KExpr *o = let_index(b, "o", k_div(b, i, k_int(b, count))),
          *at = let_index(b, "at", k_mod(b, i, k_int(b, count)));
    KExpr *row = index_row(b, n, 1, at, dim);
    kb_if(b, k_bin(b, KE_OR, k_lt(b, row, k_int(b, 0)), k_bin(b, KE_GE, row, k_int(b, dim))));
    kb_call(b, "KILN_FAULT", 1, (KExpr *[]){k_i32(b, fault)});
    kb_else(b);
    KExpr *from = k_mul(b, k_add(b, k_mul(b, o, k_int(b, dim)), row), k_int(b, inner));
    int q = kb_for(b, "q", KT_I64, k_int(b, 0), k_int(b, inner), NULL, K_VECTOR);
    kb_store(b, kb_value(b, n->out[0], true), k_add(b, k_mul(b, i, k_int(b, inner)), k_var(b, q)),
             k_load(b, kb_value(b, n->in[0], false), k_add(b, from, k_var(b, q))));
    kb_end(b);
    kb_end(b);
    return 0;
}

/* gather_grad: dx zeroed, then one iteration per element of a slice of x (o, q),
 * adding dy's elements at that place of every gathered slice in the order of the
 * indices, so no two iterations write one element. An index out of range was the
 * gather's fault already; it adds nothing here. */
int lower_gather_grad(Program *p, const Node *n, Diag *d) {
    const Type *x = &p->g->values[n->in[1]].type, *idx = &p->g->values[n->in[2]].type;
    int axis = norm_axis(node_int(n, ATTR_AXIS), x->rank);
    int64_t outer, inner, dim = x->dims[axis], count = type_numel(idx);
    split_at_axis(x, axis, &outer, &inner);
    Kernel *zero = kernel_loop(p, n, "zero", type_numel(x), 16384, d);
    if (!zero)
        return -1;
    kb_store(&zero->b, kb_value(&zero->b, n->out[0], true), k_var(&zero->b, zero->iter), k_f32(&zero->b, 0));
    Kernel *k = kernel_loop(p, n, NULL, outer * inner, 16384 / (count + 1) + 1, d);
    if (!k)
        return -1;
    KBuilder *b = &k->b;
    KExpr *i = k_var(b, k->iter);
    KExpr *o = let_index(b, "o", k_div(b, i, k_int(b, inner))),
          *q = let_index(b, "q", k_mod(b, i, k_int(b, inner)));
    int dx = kb_value(b, n->out[0], true), dy = kb_value(b, n->in[0], false);
    KExpr *at = k_var(b, kb_for(b, "at", KT_I64, k_int(b, 0), k_int(b, count), NULL, 0));
    KExpr *row = index_row(b, n, 2, at, dim);
    kb_if(b, k_and(b, k_bin(b, KE_GE, row, k_int(b, 0)), k_lt(b, row, k_int(b, dim))));
    kb_store_add(
        b, dx, k_add(b, k_mul(b, k_add(b, k_mul(b, o, k_int(b, dim)), row), k_int(b, inner)), q),
        k_load(b, dy, k_add(b, k_mul(b, k_add(b, k_mul(b, o, k_int(b, count)), at), k_int(b, inner)), q)));
    kb_end(b);
    kb_end(b);
    return 0;
}

/* Coordinate `dim` of element `at`, the elements numbered in C order over shape it
 * without its dim `skip` (-1: none). */
static KExpr *coordinate(KBuilder *b, const Type *it, KExpr *at, int dim, int skip) {
    int64_t stride = 1;
    for (int k = dim + 1; k < it->rank; k++)
        stride *= k == skip ? 1 : it->dims[k];
    return k_mod(b, k_div(b, at, k_int(b, stride)), k_int(b, it->dims[dim]));
}

/* gather_elements: one iteration per element of the result (the indices' shape),
 * reading x at its coordinates but for axis, where the index says. */
int lower_gather_elements(Program *p, const Node *n, Diag *d) {
    const Type *x = &p->g->values[n->in[0]].type, *idx = &p->g->values[n->in[1]].type;
    int axis = norm_axis(node_int(n, ATTR_AXIS), x->rank);
    int fault = program_fault(p, n, "an index of the gather_elements is out of range", d);
    Kernel *k = fault < 0 ? NULL : kernel_loop(p, n, NULL, type_numel(idx), 16384, d);
    if (!k)
        return -1;
    kernel_follows(p, k, &p->g->values[n->out[0]].type, k->count, 1, 1); /* elements in order */
    KBuilder *b = &k->b;
    KExpr *i = k_var(b, k->iter), *row = index_row(b, n, 1, i, x->dims[axis]), *from = k_int(b, 0);
    int64_t stride = 1;
    for (int dim = x->rank - 1; dim >= 0; stride *= x->dims[dim--])
        from = k_add(b, from, k_mul(b, dim == axis ? row : coordinate(b, idx, i, dim, -1), k_int(b, stride)));
    kb_if(b, k_bin(b, KE_OR, k_lt(b, row, k_int(b, 0)), k_bin(b, KE_GE, row, k_int(b, x->dims[axis]))));
    kb_call(b, "KILN_FAULT", 1, (KExpr *[]){k_i32(b, fault)});
    kb_else(b);
    kb_store(b, kb_value(b, n->out[0], true), i, k_load(b, kb_value(b, n->in[0], false), from));
    kb_end(b);
    return 0;
}

/* gather_elements_grad: dx zeroed, then one iteration per line of the indices along
 * axis (the elements that differ only there), adding dy's elements into dx in the
 * order of the indices: a line writes only its own line of dx, so no two iterations
 * write one element. An index out of range was the gather's fault already; it adds
 * nothing here. */
int lower_gather_elements_grad(Program *p, const Node *n, Diag *d) {
    const Type *x = &p->g->values[n->in[1]].type, *idx = &p->g->values[n->in[2]].type;
    int axis = norm_axis(node_int(n, ATTR_AXIS), x->rank);
    int64_t along = idx->dims[axis];
    Kernel *zero = kernel_loop(p, n, "zero", type_numel(x), 16384, d);
    if (!zero)
        return -1;
    kb_store(&zero->b, kb_value(&zero->b, n->out[0], true), k_var(&zero->b, zero->iter), k_f32(&zero->b, 0));
    Kernel *k = kernel_loop(p, n, NULL, along ? type_numel(idx) / along : 0, 16384 / (along + 1) + 1, d);
    if (!k)
        return -1;
    KBuilder *b = &k->b;
    KExpr *line = k_var(b, k->iter), *at0 = k_int(b, 0), *to0 = k_int(b, 0);
    int64_t idx_stride = 1, x_stride = 1, idx_axis_stride = 1, x_axis_stride = 1;
    for (int dim = x->rank - 1; dim >= 0; idx_stride *= idx->dims[dim], x_stride *= x->dims[dim--])
        if (dim == axis) {
            idx_axis_stride = idx_stride;
            x_axis_stride = x_stride;
        } else {
            KExpr *c = let_index(b, kb_name(b, "c", dim), coordinate(b, idx, line, dim, axis));
            at0 = k_add(b, at0, k_mul(b, c, k_int(b, idx_stride)));
            to0 = k_add(b, to0, k_mul(b, c, k_int(b, x_stride)));
        }
    at0 = let_index(b, "at0", at0);
    to0 = let_index(b, "to0", to0);
    KExpr *s = k_var(b, kb_for(b, "s", KT_I64, k_int(b, 0), k_int(b, along), NULL, 0));
    KExpr *at = let_index(b, "at", k_add(b, at0, k_mul(b, s, k_int(b, idx_axis_stride))));
    KExpr *row = index_row(b, n, 2, at, x->dims[axis]);
    kb_if(b, k_and(b, k_bin(b, KE_GE, row, k_int(b, 0)), k_lt(b, row, k_int(b, x->dims[axis]))));
    kb_store_add(b, kb_value(b, n->out[0], true), k_add(b, to0, k_mul(b, row, k_int(b, x_axis_stride))),
                 k_load(b, kb_value(b, n->in[0], false), at));
    kb_end(b);
    kb_end(b);
    return 0;
}
