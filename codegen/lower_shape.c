/* Lowering of the data-movement ops: transpose, concat, slice and pad.
 *
 * Each is one LOOP kernel over the result's elements that maps element i back to
 * the input element it copies, as the reference kernels in ir/op_shape.c do, with
 * every start, stride and bound a constant of the text. transpose and slice copy a
 * block of the result's last dims per iteration, unravelling the block's index and
 * summing its coordinates times constant strides (a slice's start folded into one
 * base offset, its step into the strides); concat splits i into the positions
 * before, along and after the axis and picks its input with a chain of `if`s on the
 * axis position; pad maps each padded coordinate into the (cropped) input through
 * the mode's rule, and constant padding tests the coordinates' bounds. Dims of size
 * 1 in the result contribute nothing and are left out of the sums. pad_grad, the
 * adjoint of pad, gathers for each element of its result the elements of dy that
 * copy it. */
#include "codegen.h"
#include "../ir/ops_impl.h"

#include <string.h>

enum { COPY_GRAIN = 16384 };

static Kernel *loop_over_output(Program *p, const Node *n, Diag *d) {
    return kernel_loop(p, n, NULL, type_numel(&p->g->values[n->out[0]].type), COPY_GRAIN, d);
}

/* Appends ` + VAR * COEF` (` - VAR * -COEF` when negative) to an index expression
 * of len characters in buf, or `VAR * COEF` when it is empty. */
static size_t add_term(char *buf, size_t len, size_t cap, const char *var, int k, int64_t coef) {
    if (len >= cap)
        return len;
    const char *sign = coef < 0 ? (len ? " - " : "-") : len ? " + " : "";
    unsigned long long mag = coef < 0 ? 0ull - (unsigned long long)coef : (unsigned long long)coef;
    return len + (size_t)snprintf(buf + len, cap - len, "%s%s%d * %llu", sign, var, k, mag);
}

/* BASE + TERMS as an index into out, either part left out when it adds nothing. */
static void with_base(char *out, size_t cap, int64_t base, const char *terms) {
    if (!*terms)
        snprintf(out, cap, "%lld", (long long)base);
    else if (base == 0)
        snprintf(out, cap, "%s", terms);
    else
        snprintf(out, cap, "%lld + %s", (long long)base, terms);
}

/* The LOOP copying y[o0, o1, ...] from x[base + o0 * coef[0] + ...] (transpose and
 * slice). An iteration copies a block of the last two dims of y (the last one when
 * that is long), so the index arithmetic is paid per block, and the inner loops
 * walk the block with constant strides; dims of size 1 are left out. */
static int strided_copy(Program *p, const Node *n, int64_t base, const int64_t *coef, Diag *d) {
    const Type *y = &p->g->values[n->out[0]].type;
    int r = y->rank, inner = r >= 2 && y->dims[r - 1] < 256 ? 2 : r >= 1 ? 1 : 0;
    int64_t block = 1;
    Type outer = *y;
    for (int j = r - inner; j < r; j++) {
        block *= y->dims[j];
        outer.dims[j] = 1;
    }
    Kernel *k = kernel_loop(p, n, NULL, type_numel(y) / block, block >= COPY_GRAIN ? 1 : COPY_GRAIN / block, d);
    if (!k)
        return -1;
    Str *s = &k->body;
    emit_unravel(s, "i", &outer, "o");
    char terms[512] = "", at[600], yn[80];
    size_t len = 0;
    for (int j = 0; j < r - inner; j++)
        if (y->dims[j] != 1)
            len = add_term(terms, len, sizeof terms, "o", j, coef[j]);
    with_base(at, sizeof at, base, terms);
    snprintf(yn, sizeof yn, "%s", value_name(p, n->out[0]));
    str_printf(s, "const float *src = %s + %s;\nfloat *dst = %s + i * %lld;\n", value_name(p, n->in[0]), at, yn,
               (long long)block);
    if (inner == 0)
        str_printf(s, "dst[0] = src[0];\n");
    else if (inner == 1)
        str_printf(s, "for (int64_t b = 0; b < %lld; b++)\n    dst[b] = src[b * %lld];\n",
                   (long long)y->dims[r - 1], (long long)coef[r - 1]);
    else
        str_printf(s,
                   "for (int64_t a = 0; a < %lld; a++)\n"
                   "    for (int64_t b = 0; b < %lld; b++)\n"
                   "        dst[a * %lld + b] = src[a * %lld + b * %lld];\n",
                   (long long)y->dims[r - 2], (long long)y->dims[r - 1], (long long)y->dims[r - 1],
                   (long long)coef[r - 2], (long long)coef[r - 1]);
    return 0;
}

/* ---- transpose ---- */

int lower_transpose(Program *p, const Node *n, Diag *d) {
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
    int64_t before, after;
    split_at_axis(y, axis, &before, &after);
    long long outer = before, along = y->dims[axis], inner = after; /* as the text prints them */
    Kernel *k = loop_over_output(p, n, d);
    if (!k)
        return -1;
    Str *s = &k->body;
    /* i is (o, a, r): before the axis, along it, after it */
    if (outer > 1)
        str_printf(s, "int64_t o = i / %lld;\n", along * inner);
    str_printf(s, "int64_t a = i");
    if (inner > 1)
        str_printf(s, " / %lld", inner);
    if (outer > 1)
        str_printf(s, " %% %lld", along);
    str_printf(s, ";\n");
    if (inner > 1)
        str_printf(s, "int64_t r = i %% %lld;\n", inner);
    char yname[80];
    snprintf(yname, sizeof yname, "%s", value_name(p, n->out[0]));
    long long first = 0; /* the axis position where input `in` starts */
    for (int in = 0; in < n->n_in; in++) {
        long long extent = p->g->values[n->in[in]].type.dims[axis];
        bool last = in == n->n_in - 1;
        if (n->n_in > 1)
            str_printf(s, "%s", in == 0 ? "if" : last ? "else" : "else if");
        if (!last)
            str_printf(s, " (a < %lld)", first + extent);
        str_printf(s, "%s%s[i] = %s[", n->n_in > 1 ? "\n    " : "", yname, value_name(p, n->in[in]));
        if (outer > 1)
            str_printf(s, "o * %lld + ", extent * inner);
        if (first > 0 && inner > 1)
            str_printf(s, "(a - %lld) * %lld + r];\n", first, inner);
        else if (inner > 1)
            str_printf(s, "a * %lld + r];\n", inner);
        else if (first > 0)
            str_printf(s, "a - %lld];\n", first);
        else
            str_printf(s, "a];\n");
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

/* ---- pad ---- */

/* Result coordinate oK becomes position jK of the cropped input: the kept part of
 * x, crop = max(-begin, 0) elements in. Outside [0, kept), constant padding reads
 * the value, edge the nearest end and reflect the mirror image (the ends not
 * repeated), as ir/op_shape.c's pad_source does. */
int lower_pad(Program *p, const Node *n, Diag *d) {
    const Type *x = &p->g->values[n->in[0]].type, *y = &p->g->values[n->out[0]].type;
    const Attr *pads = node_attr(n, ATTR_PADS);
    bool constant = node_enum(n, ATTR_MODE) == PAD_MODE_CONSTANT;
    int64_t xs[KILN_MAX_RANK], base = 0;
    type_strides(x, xs);
    Kernel *k = loop_over_output(p, n, d);
    if (!k)
        return -1;
    Str *s = &k->body;
    emit_unravel(s, "i", y, "o");
    char terms[512] = "", inside[512] = "";
    size_t len = 0, in_len = 0;
    for (int j = 0; j < x->rank; j++) {
        long long b = pads->ints[j], e = pads->ints[j + x->rank];
        long long crop = b < 0 ? -b : 0, kept = x->dims[j] - crop - (e < 0 ? -e : 0);
        base += crop * xs[j];
        if (b <= 0 && e <= 0) { /* only cropped: o is already the position */
            if (y->dims[j] != 1)
                len = add_term(terms, len, sizeof terms, "o", j, xs[j]);
            continue;
        }
        if (b > 0)
            str_printf(s, "int64_t j%d = o%d - %lld;\n", j, j, b);
        else
            str_printf(s, "int64_t j%d = o%d;\n", j, j);
        /* below 0 only with a begin pad, at kept or above only with an end pad */
        if (constant) {
            if (b > 0)
                in_len += (size_t)snprintf(inside + in_len, sizeof inside - in_len, "%sj%d >= 0",
                                           in_len ? " && " : "", j);
            if (e > 0 && in_len < sizeof inside)
                in_len += (size_t)snprintf(inside + in_len, sizeof inside - in_len, "%sj%d < %lld",
                                           in_len ? " && " : "", j, kept);
            len = add_term(terms, len, sizeof terms, "j", j, xs[j]);
            continue;
        }
        char below[64] = "", above[80] = "";
        if (node_enum(n, ATTR_MODE) == PAD_MODE_EDGE) {
            if (b > 0)
                snprintf(below, sizeof below, "j%d < 0 ? 0 : ", j);
            if (e > 0)
                snprintf(above, sizeof above, "j%d > %lld ? %lld : ", j, kept - 1, kept - 1);
        } else {
            if (b > 0)
                snprintf(below, sizeof below, "j%d < 0 ? -j%d : ", j, j);
            if (e > 0)
                snprintf(above, sizeof above, "j%d > %lld ? %lld - j%d : ", j, kept - 1, 2 * (kept - 1), j);
        }
        str_printf(s, "j%d = %s%sj%d;\n", j, below, above, j);
        len = add_term(terms, len, sizeof terms, "j", j, xs[j]);
    }
    char index[600];
    with_base(index, sizeof index, base, terms);
    char yname[80];
    snprintf(yname, sizeof yname, "%s", value_name(p, n->out[0]));
    if (constant && in_len > 0) {
        char value[32];
        float_literal(node_float(n, ATTR_VALUE), value, sizeof value);
        str_printf(s, "%s[i] = %s ? %s[%s] : %s;\n", yname, inside, value_name(p, n->in[0]), index, value);
    } else {
        str_printf(s, "%s[i] = %s[%s];\n", yname, value_name(p, n->in[0]), index);
    }
    return 0;
}

/* ---- pad_grad ---- */

/* Appends the condition `q{k} OP bound` to a conjunction in buf. */
static size_t add_bound(char *buf, size_t len, size_t cap, int k, const char *op, long long bound) {
    if (len >= cap)
        return len;
    return len + (size_t)snprintf(buf + len, cap - len, "%sq%d %s %lld", len ? " && " : "", k, op, bound);
}

/* Iteration i is element i of dx: the sum of the elements of dy that copy it,
 * pad_source's preimage one dim at a time. Along dim K, coordinate qK is position
 * jK = qK - crop of the kept part of x (crop: what a negative begin width cuts),
 * which dy's position jK + begin copies (begin, end: the positive widths). With
 * edge padding the first kept element also gathers the whole begin padding and the
 * last the end padding, a range oK = loK .. hiK; with reflect, position j also
 * gathers its mirror images begin - j (for 1 <= j <= begin) and
 * begin + 2 (kept - 1) - j (for kept - 1 - end <= j <= kept - 2), a list cK of up
 * to three. Constant padding gathers nothing more, and a cropped element nothing
 * at all. The sum is in double, as in the reference. */
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
    Str *s = &k->body;
    emit_unravel(s, "i", x, "q");
    char terms[512] = "", inside[512] = "";
    size_t len = 0, in_len = 0;
    int loops = 0;
    Str open = {0};
    for (int j = 0; j < x->rank; j++) {
        long long b = pads->ints[j], e = pads->ints[j + x->rank];
        long long crop = b < 0 ? -b : 0, kept = x->dims[j] - crop - (e < 0 ? -e : 0);
        long long begin = b > 0 ? b : 0, end = e > 0 ? e : 0, shift = begin - crop;
        if (crop > 0)
            in_len = add_bound(inside, in_len, sizeof inside, j, ">=", crop);
        if (crop + kept < x->dims[j])
            in_len = add_bound(inside, in_len, sizeof inside, j, "<", crop + kept);
        if ((!edge && !reflect) || (begin == 0 && end == 0)) { /* one element: the same place, shifted */
            base += shift * ys[j];
            len = add_term(terms, len, sizeof terms, "q", j, ys[j]);
            continue;
        }
        if (edge) {
            str_printf(s, "int64_t lo%d = q%d + %lld, hi%d = q%d + %lld;\n", j, j, shift, j, j, shift);
            if (begin > 0)
                str_printf(s, "if (q%d == %lld)\n    lo%d = 0;\n", j, crop, j);
            if (end > 0)
                str_printf(s, "if (q%d == %lld)\n    hi%d = %lld;\n", j, crop + kept - 1, j,
                           (long long)y->dims[j] - 1);
            str_printf(&open, "for (int64_t o%d = lo%d; o%d <= hi%d; o%d++) {\n", j, j, j, j, j);
        } else {
            str_printf(s, "int64_t c%d[3] = {q%d + %lld}, n%d = 1;\n", j, j, shift, j);
            if (begin > 0)
                str_printf(s, "if (q%d >= %lld && q%d <= %lld)\n    c%d[n%d++] = %lld - q%d;\n", j, crop + 1,
                           j, crop + begin, j, j, begin + crop, j);
            if (end > 0)
                str_printf(s, "if (q%d >= %lld && q%d <= %lld)\n    c%d[n%d++] = %lld - q%d;\n", j,
                           crop + kept - 1 - end, j, crop + kept - 2, j, j, begin + 2 * (kept - 1) + crop, j);
            str_printf(&open, "for (int64_t t%d = 0; t%d < n%d; t%d++) {\nint64_t o%d = c%d[t%d];\n", j, j, j,
                       j, j, j, j);
        }
        len = add_term(terms, len, sizeof terms, "o", j, ys[j]);
        loops++;
    }
    char index[600];
    with_base(index, sizeof index, base, terms);
    str_printf(s, "double acc = 0.0;\n");
    if (in_len)
        str_printf(s, "if (%s) {\n", inside);
    str_printf(s, "%s", open.s ? open.s : "");
    str_printf(s, "acc += %s[%s];\n", value_name(p, n->in[0]), index);
    for (int j = 0; j < loops + (in_len > 0); j++)
        str_printf(s, "}\n");
    str_printf(s, "%s[i] = (float)acc;\n", value_name(p, n->out[0]));
    bool oom = open.oom;
    str_free(&open);
    return oom ? diag_error(d, n->loc, "out of memory") : 0;
}
