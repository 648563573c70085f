/* Lowering of the data-movement ops: transpose, concat, slice and pad.
 *
 * Each is one LOOP kernel over the result's elements, built as kernel IR, that maps
 * element i back to the input element it copies, as the reference kernels in
 * ir/op_shape.c do, with every start, stride and bound a constant. transpose and
 * slice copy a block of the result's last dims per iteration, unravelling the
 * block's index and summing its coordinates times constant strides (a slice's start
 * folded into one base offset, its step into the strides); concat splits i into the
 * positions before, along and after the axis and picks its input with one `if` per
 * input on the axis position (siblings, not a nest, so that any number of inputs
 * fits); pad maps each padded coordinate into the (cropped) input through the mode's
 * rule, and constant padding tests the coordinates' bounds. Dims of size 1 in the
 * result contribute nothing and fold out of the sums. pad_grad, the adjoint of pad,
 * gathers for each element of its result the elements of dy that copy it. */
#include "codegen.h"
#include "../ir/ops_impl.h"

#include <string.h>

enum { COPY_GRAIN = 16384 };

static Kernel *loop_over_output(Program *p, const Node *n, Diag *d) {
    const Type *t = &p->g->values[n->out[0]].type;
    Kernel *k = kernel_loop(p, n, NULL, type_numel(t), COPY_GRAIN, d);
    if (k)
        kernel_follows(p, k, t, k->count, 1, 1);
    return k;
}

/* e as a let named `name`, unless it is a constant or a variable already. */
static KExpr *named(KBuilder *b, const char *name, KExpr *e) {
    return e->kind == KE_INT || e->kind == KE_VAR ? e : k_var(b, kb_let(b, name, KT_I64, e));
}

/* e + c, spelled e - |c| when c is negative. */
static KExpr *plus(KBuilder *b, KExpr *e, int64_t c) {
    return c < 0 ? k_sub(b, e, k_int(b, -c)) : k_add(b, e, k_int(b, c));
}

/* base + idx[0] * strides[0] + ... + idx[n-1] * strides[n-1]. */
static KExpr *offset(KBuilder *b, int64_t base, int n, KExpr *const *idx, const int64_t *strides) {
    KExpr *e = k_int(b, base);
    for (int j = 0; j < n; j++)
        e = k_add(b, e, k_mul(b, idx[j], k_int(b, strides[j])));
    return e;
}

/* The LOOP copying y[o0, o1, ...] from x[base + o0 * coef[0] + ...] (transpose and
 * slice). An iteration copies a block of the last two dims of y (the last one when
 * that is long), so the index arithmetic is paid per block, and the inner loops
 * walk the block with constant strides; dims of size 1 fold away. */
static int strided_copy(Program *p, const Node *n, int64_t base, const int64_t *coef, Diag *d) {
    const Type *y = &p->g->values[n->out[0]].type;
    int r = y->rank, inner = r >= 2 && y->dims[r - 1] < 256 ? 2 : r >= 1 ? 1 : 0;
    int64_t block = 1;
    Type outer = *y;
    for (int j = r - inner; j < r; j++) {
        block *= y->dims[j];
        outer.dims[j] = 1;
    }
    Kernel *k =
        kernel_loop(p, n, NULL, type_numel(y) / block, block >= COPY_GRAIN ? 1 : COPY_GRAIN / block, d);
    if (!k)
        return -1;
    kernel_follows(p, k, y, k->count, 1, 1);
    KBuilder *b = &k->b;
    KExpr *i = k_var(b, k->iter), *o[KILN_MAX_RANK];
    kb_unravel(b, i, &outer, "o", o);
    KExpr *src = named(b, "src", offset(b, base, r - inner, o, coef));
    KExpr *dst = named(b, "dst", k_mul(b, i, k_int(b, block)));
    int x = kb_value(b, n->in[0], false), yb = kb_value(b, n->out[0], true);
    if (inner == 0) {
        kb_store(b, yb, dst, k_load(b, x, src));
        return 0;
    }
    KExpr *at_a = k_int(b, 0), *at_b = k_int(b, 0);
    if (inner == 2) {
        KExpr *a = k_var(b, kb_for(b, "a", KT_I64, k_int(b, 0), k_int(b, y->dims[r - 2]), NULL, 0));
        at_a = k_mul(b, a, k_int(b, y->dims[r - 1]));
        at_b = k_mul(b, a, k_int(b, coef[r - 2]));
    }
    KExpr *bv = k_var(b, kb_for(b, "b", KT_I64, k_int(b, 0), k_int(b, y->dims[r - 1]), NULL, 0));
    kb_store(b, yb, k_add(b, k_add(b, dst, at_a), bv),
             k_load(b, x, k_add(b, k_add(b, src, at_b), k_mul(b, bv, k_int(b, coef[r - 1])))));
    for (int j = 0; j < inner; j++)
        kb_end(b);
    return 0;
}

/* ---- transpose ---- */

int lower_transpose(Program *p, const Node *n, Diag *d) {
    if (transpose_feeds_padded_conv(p, n) || transpose_feeds_linear(p, n) || attention_absorbs(p, n))
        return 0; /* its reader reads the transpose's input in its place */
    const Type *x = &p->g->values[n->in[0]].type, *y = &p->g->values[n->out[0]].type;
    const Attr *a = node_attr(n, ATTR_PERM);
    int64_t xs[KILN_MAX_RANK], coef[KILN_MAX_RANK];
    type_strides(x, xs);
    for (int j = 0; j < y->rank; j++) /* result dim j is x's dim perm[j]; no perm reverses them */
        coef[j] = xs[a->set ? a->ints[j] : y->rank - 1 - j];
    return strided_copy(p, n, 0, coef, d);
}

/* ---- concat ---- */

int lower_concat(Program *p, const Node *n, Diag *d) {
    const Type *y = &p->g->values[n->out[0]].type;
    int axis = norm_axis(node_int(n, ATTR_AXIS), y->rank);
    int64_t outer, inner, along = y->dims[axis];
    split_at_axis(y, axis, &outer, &inner);
    Kernel *k = loop_over_output(p, n, d);
    if (!k)
        return -1;
    KBuilder *b = &k->b;
    KExpr *i = k_var(b, k->iter);
    /* i is (o, a, r): before the axis, along it, after it */
    KExpr *o = outer > 1 ? named(b, "o", k_div(b, i, k_int(b, along * inner))) : k_int(b, 0);
    KExpr *a = k_div(b, i, k_int(b, inner));
    a = named(b, "a", outer > 1 ? k_mod(b, a, k_int(b, along)) : a);
    KExpr *r = named(b, "r", k_mod(b, i, k_int(b, inner)));
    int yb = kb_value(b, n->out[0], true);
    int64_t first = 0; /* the axis position where input `in` starts */
    for (int in = 0; in < n->n_in; in++) {
        int64_t extent = p->g->values[n->in[in]].type.dims[axis];
        KExpr *cond = NULL;
        if (in > 0)
            cond = k_bin(b, KE_GE, a, k_int(b, first));
        if (in < n->n_in - 1) {
            KExpr *below = k_lt(b, a, k_int(b, first + extent));
            cond = cond ? k_and(b, cond, below) : below;
        }
        if (cond)
            kb_if(b, cond);
        KExpr *at =
            k_add(b, k_mul(b, o, k_int(b, extent * inner)), k_mul(b, plus(b, a, -first), k_int(b, inner)));
        at = k_add(b, at, r);
        kb_store(b, yb, i, k_load(b, kb_value(b, n->in[in], false), at));
        if (cond)
            kb_end(b);
        first += extent;
    }
    return 0;
}

/* ---- slice ---- */

/* The first index and the step along every dim of x, as ir/op_shape.c's
 * slice_ranges finds them (the verifier checked the attributes): a negative start
 * counts from the end, then a forward slice clamps it to [0, dim] and a backward
 * one to [0, dim - 1]. */
static void slice_starts(const Node *n, const Type *x, int64_t *start, int64_t *step) {
    const Attr *starts = node_attr(n, ATTR_STARTS), *axes = node_attr(n, ATTR_AXES),
               *steps = node_attr(n, ATTR_STEPS);
    for (int k = 0; k < x->rank; k++)
        start[k] = 0, step[k] = 1;
    for (int i = 0; i < starts->n; i++) {
        int axis = norm_axis(axes->set ? axes->ints[i] : i, x->rank);
        int64_t dim = x->dims[axis], s = starts->ints[i], st = steps->set ? steps->ints[i] : 1;
        s = s < 0 ? s + dim : s;
        int64_t hi = st > 0 ? dim : dim - 1;
        start[axis] = s < 0 ? 0 : s > hi ? hi : s;
        step[axis] = st;
    }
}

int lower_slice(Program *p, const Node *n, Diag *d) {
    if (attention_absorbs(p, n))
        return 0; /* its reader reads the slice's input in its place */
    const Type *x = &p->g->values[n->in[0]].type, *y = &p->g->values[n->out[0]].type;
    int64_t start[KILN_MAX_RANK], step[KILN_MAX_RANK], xs[KILN_MAX_RANK], coef[KILN_MAX_RANK], base = 0;
    slice_starts(n, x, start, step);
    type_strides(x, xs);
    for (int j = 0; j < x->rank; j++)
        base += start[j] * xs[j];
    /* a step past the dim leaves one element, so a size-1 dim's step never multiplies */
    for (int j = 0; j < y->rank; j++)
        coef[j] = y->dims[j] != 1 ? step[j] * xs[j] : 0;
    return strided_copy(p, n, base, coef, d);
}

/* ---- strided views ---- */

/* to (dims set) as v's elements regrouped, as numpy reshapes without a copy: v's
 * dims other than 1s and to's dims fall into runs of equal products, and each run
 * of v's must lie evenly apart (each dim's stride its size times the next one's),
 * its last stride then the last stride of to's run. */
static bool regroup(const KView *v, KView *to) {
    int64_t dims[KILN_MAX_RANK], strides[KILN_MAX_RANK];
    int n = 0, i = 0, j = 0;
    for (int k = 0; k < v->rank; k++)
        if (v->dims[k] != 1)
            dims[n] = v->dims[k], strides[n++] = v->strides[k];
    while (i < n && j < to->rank) {
        int i_end = i + 1, j_end = j + 1;
        int64_t had = dims[i], has = to->dims[j];
        while (had != has) {
            if (has < had && j_end < to->rank)
                has *= to->dims[j_end++];
            else if (had < has && i_end < n)
                had *= dims[i_end++];
            else
                return false;
        }
        for (int k = i; k < i_end - 1; k++)
            if (strides[k] != dims[k + 1] * strides[k + 1])
                return false;
        to->strides[j_end - 1] = strides[i_end - 1];
        for (int k = j_end - 1; k > j; k--)
            to->strides[k - 1] = to->strides[k] * to->dims[k];
        i = i_end, j = j_end;
    }
    for (; j < to->rank; j++) /* dims of 1 after the last run */
        to->strides[j] = 0;
    return i == n;
}

bool kview_through(const Program *p, const Node *n, KView *v) {
    const Type *x = &p->g->values[n->in[0]].type, *y = &p->g->values[n->out[0]].type;
    if (x->rank != v->rank || type_numel(y) == 0)
        return false;
    KView to = {.rank = y->rank, .offset = v->offset};
    memcpy(to.dims, y->dims, sizeof(int64_t) * (size_t)y->rank);
    if (n->op == OP_TRANSPOSE) {
        const Attr *a = node_attr(n, ATTR_PERM);
        for (int j = 0; j < y->rank; j++) /* no perm reverses the dims */
            to.strides[j] = v->strides[a->set ? a->ints[j] : y->rank - 1 - j];
    } else if (n->op == OP_SLICE) {
        int64_t start[KILN_MAX_RANK], step[KILN_MAX_RANK];
        slice_starts(n, x, start, step);
        for (int j = 0; j < x->rank; j++) {
            to.offset += start[j] * v->strides[j];
            to.strides[j] = step[j] * v->strides[j];
        }
    } else if (!op_has(n->op, F_VIEW) || !regroup(v, &to)) {
        return false;
    }
    *v = to;
    return true;
}

/* ---- pad ---- */

/* Result coordinate oK becomes position jK of the cropped input: the kept part of
 * x, crop = max(-begin, 0) elements in. Outside [0, kept), constant padding reads
 * the value, edge the nearest end and reflect the mirror image (the ends not
 * repeated), as ir/op_shape.c's pad_source does; sK is the position edge and
 * reflect read. */
int lower_pad(Program *p, const Node *n, Diag *d) {
    const Type *x = &p->g->values[n->in[0]].type, *y = &p->g->values[n->out[0]].type;
    const Attr *pads = node_attr(n, ATTR_PADS);
    int mode = node_enum(n, ATTR_MODE);
    bool edge = mode == PAD_MODE_EDGE, constant = mode == PAD_MODE_CONSTANT;
    int64_t xs[KILN_MAX_RANK], base = 0;
    type_strides(x, xs);
    Kernel *k = loop_over_output(p, n, d);
    if (!k)
        return -1;
    KBuilder *b = &k->b;
    KExpr *i = k_var(b, k->iter), *o[KILN_MAX_RANK], *at[KILN_MAX_RANK] = {0}, *inside = NULL;
    kb_unravel(b, i, y, "o", o);
    for (int j = 0; j < x->rank; j++) {
        int64_t begin = pads->ints[j], end = pads->ints[j + x->rank];
        int64_t crop = begin < 0 ? -begin : 0, kept = x->dims[j] - crop - (end < 0 ? -end : 0);
        base += crop * xs[j];
        if (begin <= 0 && end <= 0) { /* only cropped: o is already the position */
            at[j] = o[j];
            continue;
        }
        KExpr *pos = named(b, kb_name(b, "j", j), begin > 0 ? k_sub(b, o[j], k_int(b, begin)) : o[j]);
        at[j] = pos;
        /* below 0 only with a begin pad, at kept or above only with an end pad */
        if (constant) {
            KExpr *tests[2] = {begin > 0 ? k_bin(b, KE_GE, pos, k_int(b, 0)) : NULL,
                               end > 0 ? k_lt(b, pos, k_int(b, kept)) : NULL};
            for (int t = 0; t < 2; t++)
                if (tests[t])
                    inside = inside ? k_and(b, inside, tests[t]) : tests[t];
            continue;
        }
        KExpr *src = pos;
        if (end > 0)
            src = k_select(b, k_bin(b, KE_GT, pos, k_int(b, kept - 1)),
                           edge ? k_int(b, kept - 1) : k_sub(b, k_int(b, 2 * (kept - 1)), pos), src);
        if (begin > 0)
            src = k_select(b, k_lt(b, pos, k_int(b, 0)), edge ? k_int(b, 0) : k_neg(b, pos), src);
        at[j] = k_var(b, kb_let(b, kb_name(b, "s", j), KT_I64, src));
    }
    KExpr *value = k_load(b, kb_value(b, n->in[0], false), offset(b, base, x->rank, at, xs));
    if (inside)
        value = k_select(b, inside, value, k_f32(b, node_float(n, ATTR_VALUE)));
    kb_store(b, kb_value(b, n->out[0], true), i, value);
    return 0;
}

/* ---- pad_grad ---- */

/* Iteration i is element i of dx: the sum of the elements of dy that copy it,
 * pad_source's preimage one dim at a time. Along dim K, coordinate qK is position
 * jK = qK - crop of the kept part of x (crop: what a negative begin width cuts),
 * which dy's position jK + begin copies (begin, end: the positive widths). With
 * edge padding the first kept element also gathers the whole begin padding and the
 * last the end padding, a range oK = loK .. endK - 1; with reflect, position j also
 * gathers its mirror images begin - j (for 1 <= j <= begin) and
 * begin + 2 (kept - 1) - j (for kept - 1 - end <= j <= kept - 2), a local list cK
 * of up to three, nK long. Constant padding gathers nothing more, and a cropped
 * element nothing at all. The sum is in double, as in the reference. */
int lower_pad_grad(Program *p, const Node *n, Diag *d) {
    const Type *y = &p->g->values[n->in[0]].type, *x = &p->g->values[n->in[1]].type;
    const Attr *pads = node_attr(n, ATTR_PADS);
    int mode = node_enum(n, ATTR_MODE);
    bool edge = mode == PAD_MODE_EDGE, reflect = mode == PAD_MODE_REFLECT;
    int64_t ys[KILN_MAX_RANK], base = 0;
    type_strides(y, ys);
    Kernel *k = loop_over_output(p, n, d);
    if (!k)
        return -1;
    KBuilder *b = &k->b;
    KExpr *i = k_var(b, k->iter), *q[KILN_MAX_RANK], *at[KILN_MAX_RANK], *inside = NULL;
    /* per gathering dim: edge's range [lo, end), or reflect's list and its length */
    KExpr *lo[KILN_MAX_RANK] = {0}, *hi[KILN_MAX_RANK] = {0};
    int list[KILN_MAX_RANK];
    kb_unravel(b, i, x, "q", q);
    for (int j = 0; j < x->rank; j++) {
        int64_t bw = pads->ints[j], ew = pads->ints[j + x->rank];
        int64_t crop = bw < 0 ? -bw : 0, kept = x->dims[j] - crop - (ew < 0 ? -ew : 0);
        int64_t begin = bw > 0 ? bw : 0, end = ew > 0 ? ew : 0, shift = begin - crop;
        KExpr *tests[2] = {crop > 0 ? k_bin(b, KE_GE, q[j], k_int(b, crop)) : NULL,
                           crop + kept < x->dims[j] ? k_lt(b, q[j], k_int(b, crop + kept)) : NULL};
        for (int t = 0; t < 2; t++)
            if (tests[t])
                inside = inside ? k_and(b, inside, tests[t]) : tests[t];
        at[j] = q[j];
        if ((!edge && !reflect) || (begin == 0 && end == 0)) { /* one element: the same place, shifted */
            base += shift * ys[j];
            continue;
        }
        if (edge) {
            KExpr *first = plus(b, q[j], shift), *last = plus(b, q[j], shift + 1);
            if (begin > 0)
                first = k_select(b, k_bin(b, KE_EQ, q[j], k_int(b, crop)), k_int(b, 0), first);
            if (end > 0)
                last =
                    k_select(b, k_bin(b, KE_EQ, q[j], k_int(b, crop + kept - 1)), k_int(b, y->dims[j]), last);
            lo[j] = k_var(b, kb_let(b, kb_name(b, "lo", j), KT_I64, first));
            hi[j] = k_var(b, kb_let(b, kb_name(b, "end", j), KT_I64, last));
            continue;
        }
        list[j] = kb_array(b, kb_name(b, "c", j), KT_I64, 3, 0, false, false);
        int len = kb_decl(b, kb_name(b, "n", j), KT_I64, k_int(b, 1));
        hi[j] = k_var(b, len);
        kb_store(b, list[j], k_int(b, 0), plus(b, q[j], shift));
        int64_t mirror_lo[2] = {crop + 1, crop + kept - 1 - end},
                mirror_hi[2] = {crop + begin, crop + kept - 2};
        int64_t mirror_sum[2] = {begin + crop, begin + 2 * (kept - 1) + crop};
        for (int side = 0; side < 2; side++) {
            if ((side == 0 ? begin : end) == 0)
                continue;
            kb_if(b, k_and(b, k_bin(b, KE_GE, q[j], k_int(b, mirror_lo[side])),
                           k_bin(b, KE_LE, q[j], k_int(b, mirror_hi[side]))));
            kb_store(b, list[j], hi[j], k_sub(b, k_int(b, mirror_sum[side]), q[j]));
            kb_accum(b, len, k_int(b, 1));
            kb_end(b);
        }
    }
    int acc = kb_decl(b, "acc", KT_F64, k_f64(b, 0.0));
    if (inside)
        kb_if(b, inside);
    int loops = 0;
    for (int j = 0; j < x->rank; j++) {
        if (!hi[j])
            continue;
        if (lo[j])
            at[j] = k_var(b, kb_for(b, kb_name(b, "o", j), KT_I64, lo[j], hi[j], NULL, 0));
        else {
            KExpr *t = k_var(b, kb_for(b, kb_name(b, "t", j), KT_I64, k_int(b, 0), hi[j], NULL, 0));
            at[j] = k_var(b, kb_let(b, kb_name(b, "o", j), KT_I64, k_load(b, list[j], t)));
        }
        loops++;
    }
    kb_accum(b, acc,
             k_cast(b, KT_F64, k_load(b, kb_value(b, n->in[0], false), offset(b, base, x->rank, at, ys))));
    for (int j = 0; j < loops + (inside != NULL); j++)
        kb_end(b);
    kb_store(b, kb_value(b, n->out[0], true), i, k_cast(b, KT_F32, k_var(b, acc)));
    return 0;
}
