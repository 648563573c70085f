/* Helpers shared by the shape inference functions and reference kernels. */
#include "ops_impl.h"

#include <stdio.h>
#include <string.h>

const Type *in_type(const Graph *g, const Node *n, int i) {
    if (i >= n->n_in || n->in[i] < 0)
        return NULL;
    return &g->values[n->in[i]].type;
}

void set_out_type(Graph *g, Node *n, int i, Type t) {
    g->values[n->out[i]].type = t;
}

TypeText type_text(const Type *t) {
    TypeText r;
    type_str(t, r.s, sizeof r.s);
    return r;
}

int norm_axis(int64_t axis, int rank) {
    if (axis < -rank || axis >= rank)
        return -1;
    return (int)(axis < 0 ? axis + rank : axis);
}

bool broadcast_types(const Type *a, const Type *b, Type *out) {
    int r = a->rank > b->rank ? a->rank : b->rank;
    *out = (Type){a->dtype, r, {0}, NULL, 0};
    for (int i = 0; i < r; i++) {
        int ia = i - (r - a->rank), ib = i - (r - b->rank);
        int64_t da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;
        if (da != db && da != 1 && db != 1)
            return false;
        out->dims[i] = da == 1 ? db : da;
    }
    return true;
}

bool broadcasts_to(const Type *t, const Type *to) {
    Type b = {0};
    return broadcast_types(t, to, &b) && type_equal(&b, to);
}

bool layout_is_nhwc(const Node *n) {
    return node_enum(n, ATTR_LAYOUT) == LAYOUT_NHWC;
}

Loc attr_loc(const Node *n, AttrId id) {
    const Attr *a = node_attr(n, id);
    return a->set ? a->loc : n->loc;
}

int check_size_attr(const Node *n, AttrId id, const int64_t *v, int count, int64_t min, Diag *d) {
    for (int i = 0; i < count; i++) {
        if (v[i] < min)
            return diag_error(d, attr_loc(n, id), "%s: %s[%d] must be at least %lld, got %lld",
                              op_table[n->op].name, attr_name(id), i, (long long)min, (long long)v[i]);
        /* no dim of any tensor is larger, so neither is any sensible window, pad or stride */
        if (v[i] > KILN_MAX_NUMEL)
            return attr_too_large(n, id, i, v[i], NULL, d);
    }
    return 0;
}

int shape_attr(const Node *n, int64_t *dims, int64_t min, Diag *d) {
    int rank = node_attr(n, ATTR_SHAPE)->n; /* counted before reading it into dims */
    if (rank > KILN_MAX_RANK)
        return diag_error(d, attr_loc(n, ATTR_SHAPE), "%s: shape has %d dims; at most %d",
                          op_table[n->op].name, rank, KILN_MAX_RANK);
    node_ints(n, ATTR_SHAPE, dims, KILN_MAX_RANK, 0);
    return check_size_attr(n, ATTR_SHAPE, dims, rank, min, d) ? -1 : rank;
}

bool too_large(double numel) {
    return numel > (double)KILN_MAX_NUMEL;
}

bool checked_numel(const Type *t, int64_t *numel) {
    /* an empty dim counts as 1 in the bound, so that every stride of the other dims
       fits too, whatever they are */
    int64_t m = 1;
    bool empty = false;
    for (int k = 0; k < t->rank; k++) {
        if (t->dims[k] < 0 || !ck_mul(m, t->dims[k] ? t->dims[k] : 1, &m) || m > KILN_MAX_NUMEL)
            return false;
        empty = empty || t->dims[k] == 0;
    }
    *numel = empty ? 0 : m;
    return true;
}

int check_size(const Node *n, const Type *t, Diag *d) {
    const char *op = op_table[n->op].name;
    if (t->rank < 0 || t->rank > KILN_MAX_RANK)
        return diag_error(d, n->loc, "%s: the result's rank %d is not between 0 and %d", op, t->rank,
                          KILN_MAX_RANK);
    for (int k = 0; k < t->rank; k++)
        if (t->dims[k] < 0)
            return diag_error(d, n->loc, "%s: dim %d of the result would be %lld", op, k,
                              (long long)t->dims[k]);
    int64_t numel;
    if (!checked_numel(t, &numel))
        return diag_error(d, n->loc, "%s: the result %s is too large (more than %lld elements)", op, tstr(t),
                          (long long)KILN_MAX_NUMEL);
    return 0;
}

int attr_too_large(const Node *n, AttrId id, int i, int64_t v, const char *why, Diag *d) {
    char at[24] = "";
    if (i >= 0)
        snprintf(at, sizeof at, "[%d]", i);
    return diag_error(d, attr_loc(n, id), "%s: %s%s = %lld %s", op_table[n->op].name, attr_name(id), at,
                      (long long)v,
                      why     ? why
                      : v < 0 ? "is too small"
                              : "is too large");
}

int check_grad_ranks(const Node *n, const Type *dy, const Type *x, Diag *d) {
    if (dy->rank != x->rank)
        return diag_error(d, n->loc, "%s: dy %s and x %s must have the same rank", op_table[n->op].name,
                          tstr(dy), tstr(x));
    return 0;
}

View view_of(const Type *t, bool nhwc) {
    int64_t st[KILN_MAX_RANK] = {0};
    type_strides(t, st);
    int cdim = nhwc ? t->rank - 1 : 1, first = nhwc ? 1 : 2;
    View v = {.ns = t->rank - 2, .n = t->dims[0], .sn = st[0], .c = t->dims[cdim], .sc = st[cdim]};
    for (int i = 0; i < v.ns; i++) {
        v.sp[i] = t->dims[first + i];
        v.ss[i] = st[first + i];
    }
    return v;
}

int64_t view_offset(const View *v, int64_t b, int64_t c, const int64_t *pos) {
    int64_t o = b * v->sn + c * v->sc;
    for (int i = 0; i < v->ns; i++)
        o += pos[i] * v->ss[i];
    return o;
}

int64_t type_strides(const Type *t, int64_t *s) {
    int64_t n = 1;
    for (int i = t->rank - 1; i >= 0; i--) {
        s[i] = n;
        n *= t->dims[i];
    }
    return n;
}

void split_at_axis(const Type *t, int axis, int64_t *outer, int64_t *inner) {
    *outer = *inner = 1;
    for (int k = 0; k < t->rank; k++)
        if (k < axis)
            *outer *= t->dims[k];
        else if (k > axis)
            *inner *= t->dims[k];
}

void copy_elements(Tensor *dst, int64_t i, const Tensor *src, int64_t at, int64_t count) {
    int64_t size = dtype_size(src->type.dtype);
    memcpy((char *)dst->bytes + i * size, (const char *)src->bytes + at * size, (size_t)(count * size));
}

void broadcast_strides(const Type *from, const Type *to, int64_t *s) {
    int64_t own[KILN_MAX_RANK];
    type_strides(from, own);
    for (int i = 0; i < to->rank; i++) {
        int j = i - (to->rank - from->rank);
        s[i] = j >= 0 && from->dims[j] != 1 ? own[j] : 0;
    }
}

bool next_index(int64_t *idx, const int64_t *dims, int rank) {
    for (int i = rank - 1; i >= 0; i--) {
        if (++idx[i] < dims[i])
            return true;
        idx[i] = 0;
    }
    return false;
}
