/* Shape and data-movement ops: reshape, flatten, squeeze, unsqueeze, identity,
 * transpose, concat, slice and pad, and pad's gradient pad_grad.
 *
 * The first five keep the data in row-major order and only rename its shape, so
 * they share one kernel, eval_copy. The others map every result element back to one
 * input element (or, for constant padding, to the pad value): each kernel walks the
 * result's multi-index and computes the input offset from per-dimension starts and
 * strides. Inference and kernel read the attributes through the same helper
 * (read_perm, slice_ranges, pad_widths), so the kernel indexes exactly the shape
 * inference promised. Shapes in kiln are positive, so a reshape to a 0 dim, a slice
 * that selects nothing or a pad that crops a dim away are errors rather than empty
 * tensors. */
#include "ops_impl.h"

#include <string.h>

/* "[2, -1, 3]" into buf, for messages. */
static const char *ints_str(const int64_t *v, int count, char *buf, size_t cap) {
    size_t len = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < count && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%lld", i ? ", " : "", (long long)v[i]);
    if (len < cap)
        snprintf(buf + len, cap - len, "]");
    return buf;
}

/* ---- reshape, flatten, squeeze, unsqueeze, identity: the data does not move ---- */

int eval_copy(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    (void)n, (void)d;
    copy_elements(out[0], 0, in[0], 0, type_numel(&in[0]->type));
    return 0;
}

int infer_reshape(Graph *g, Node *n, Diag *d) {
    const Type *x = in_type(g, n, 0);
    const Attr *a = node_attr(n, ATTR_SHAPE);
    char buf[200];
    if (a->n > KILN_MAX_RANK)
        return diag_error(d, a->loc, "reshape: shape has %d dimensions, at most %d are allowed", a->n,
                          KILN_MAX_RANK);
    Type out = {DT_F32, a->n, {0}, NULL, 0};
    int64_t numel = type_numel(x), known = 1;
    int inferred = -1;
    bool fits = true;
    for (int k = 0; k < a->n; k++) {
        int64_t v = a->ints[k];
        if (v == -1 && inferred >= 0)
            return diag_error(d, a->loc, "reshape: shape %s holds more than one -1",
                              ints_str(a->ints, a->n, buf, sizeof buf));
        if (v == 0)
            return diag_error(d, a->loc,
                              "reshape: dimension %d of shape %s is 0; kiln shapes are positive, and 0 "
                              "does not copy the input's dimension as in ONNX Reshape",
                              k, ints_str(a->ints, a->n, buf, sizeof buf));
        if (v < -1)
            return diag_error(d, a->loc, "reshape: dimension %d of shape %s is %lld; only -1 may be negative",
                              k, ints_str(a->ints, a->n, buf, sizeof buf), (long long)v);
        if (v == -1) {
            inferred = k;
            continue;
        }
        /* known * v > numel, tested without overflowing */
        if (v > numel / known)
            fits = false;
        else
            known *= v;
        out.dims[k] = v;
    }
    if (inferred >= 0 && fits && numel % known == 0)
        out.dims[inferred] = numel / known;
    else if (!fits || known != numel)
        return diag_error(d, a->loc, "reshape: x of type %s has %lld elements, which shape %s cannot hold",
                          tstr(x), (long long)numel, ints_str(a->ints, a->n, buf, sizeof buf));
    set_out_type(g, n, 0, out);
    return 0;
}

int infer_flatten(Graph *g, Node *n, Diag *d) {
    const Type *x = in_type(g, n, 0);
    int64_t axis = node_int(n, ATTR_AXIS);
    if (axis < -x->rank || axis > x->rank)
        return diag_error(d, attr_loc(n, ATTR_AXIS),
                          "flatten: axis %lld is out of range [%d, %d] for x of type %s", (long long)axis,
                          -x->rank, x->rank, tstr(x));
    if (axis < 0)
        axis += x->rank;
    Type out = {DT_F32, 2, {1, 1}, NULL, 0};
    for (int k = 0; k < x->rank; k++)
        out.dims[k < axis ? 0 : 1] *= x->dims[k];
    set_out_type(g, n, 0, out);
    return 0;
}

int infer_squeeze(Graph *g, Node *n, Diag *d) {
    const Type *x = in_type(g, n, 0);
    const Attr *a = node_attr(n, ATTR_AXES);
    bool drop[KILN_MAX_RANK] = {false};
    /* no axes, or an empty list, drops every dim of size 1 (as ONNX Runtime does) */
    for (int k = 0; k < x->rank; k++)
        drop[k] = (!a->set || a->n == 0) && x->dims[k] == 1;
    for (int i = 0; a->set && i < a->n; i++) {
        int axis = norm_axis(a->ints[i], x->rank);
        if (axis < 0)
            return diag_error(d, a->loc, "squeeze: axis %lld is out of range for x of type %s",
                              (long long)a->ints[i], tstr(x));
        if (drop[axis])
            return diag_error(d, a->loc, "squeeze: axes name dimension %d of x (%s) twice", axis, tstr(x));
        if (x->dims[axis] != 1)
            return diag_error(d, a->loc, "squeeze: dimension %d of x (%s) has size %lld, not 1", axis,
                              tstr(x), (long long)x->dims[axis]);
        drop[axis] = true;
    }
    Type out = {DT_F32, 0, {0}, NULL, 0};
    for (int k = 0; k < x->rank; k++)
        if (!drop[k])
            out.dims[out.rank++] = x->dims[k];
    set_out_type(g, n, 0, out);
    return 0;
}

/* As in ONNX Unsqueeze (opset 13), axes index the result, whose rank is the input's
 * plus the number of axes. */
int infer_unsqueeze(Graph *g, Node *n, Diag *d) {
    const Type *x = in_type(g, n, 0);
    const Attr *a = node_attr(n, ATTR_AXES);
    int rank = x->rank + a->n;
    if (rank > KILN_MAX_RANK)
        return diag_error(d, a->loc, "unsqueeze: the result would have %d dimensions, at most %d are allowed",
                          rank, KILN_MAX_RANK);
    bool added[KILN_MAX_RANK] = {false};
    for (int i = 0; i < a->n; i++) {
        int axis = norm_axis(a->ints[i], rank);
        if (axis < 0)
            return diag_error(d, a->loc, "unsqueeze: axis %lld is out of range for a result of rank %d",
                              (long long)a->ints[i], rank);
        if (added[axis])
            return diag_error(d, a->loc, "unsqueeze: axes name dimension %d of the result twice", axis);
        added[axis] = true;
    }
    Type out = {DT_F32, rank, {0}, NULL, 0};
    for (int k = 0, next = 0; k < rank; k++)
        out.dims[k] = added[k] ? 1 : x->dims[next++];
    set_out_type(g, n, 0, out);
    return 0;
}

/* ---- transpose ---- */

/* Result dim k is input dim perm[k]; an unset perm reverses the dims. */
static int read_perm(const Node *n, const Type *x, int *perm, Diag *d) {
    const Attr *a = node_attr(n, ATTR_PERM);
    if (!a->set) {
        for (int k = 0; k < x->rank; k++)
            perm[k] = x->rank - 1 - k;
        return 0;
    }
    char buf[200];
    if (a->n != x->rank)
        return diag_error(d, a->loc, "transpose: perm %s has %d entries, but x (%s) has rank %d",
                          ints_str(a->ints, a->n, buf, sizeof buf), a->n, tstr(x), x->rank);
    bool seen[KILN_MAX_RANK] = {false};
    for (int k = 0; k < x->rank; k++) {
        int64_t p = a->ints[k];
        if (p < 0 || p >= x->rank || seen[p])
            return diag_error(d, a->loc, "transpose: perm %s is not a permutation of 0..%d",
                              ints_str(a->ints, a->n, buf, sizeof buf), x->rank - 1);
        seen[p] = true;
        perm[k] = (int)p;
    }
    return 0;
}

int infer_transpose(Graph *g, Node *n, Diag *d) {
    const Type *x = in_type(g, n, 0);
    int perm[KILN_MAX_RANK];
    if (read_perm(n, x, perm, d))
        return -1;
    Type out = {DT_F32, x->rank, {0}, NULL, 0};
    for (int k = 0; k < x->rank; k++)
        out.dims[k] = x->dims[perm[k]];
    set_out_type(g, n, 0, out);
    return 0;
}

/* n elements of `size` bytes, src's `step` elements apart from its element at,
 * into dst's from element i */
static void copy_strided(void *dst, int64_t i, const void *src, int64_t at, int64_t step, int64_t n,
                         int64_t size) {
    if (size == 4) {
        uint32_t *to = (uint32_t *)dst + i;
        const uint32_t *from = (const uint32_t *)src + at;
        for (int64_t j = 0; j < n; j++)
            to[j] = from[j * step];
    } else if (size == 8) {
        uint64_t *to = (uint64_t *)dst + i;
        const uint64_t *from = (const uint64_t *)src + at;
        for (int64_t j = 0; j < n; j++)
            to[j] = from[j * step];
    } else {
        for (int64_t j = 0; j < n; j++)
            memcpy((char *)dst + (i + j) * size, (const char *)src + (at + j * step) * size, (size_t)size);
    }
}

/* A row of y (its last dim) at a time, each a strided walk through x: folding the
 * layout pass's transposes of ResNet-18's weights took a tenth of its cold JIT
 * element by element. */
int eval_transpose(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    const Type *x = &in[0]->type, *y = &out[0]->type;
    int perm[KILN_MAX_RANK];
    if (read_perm(n, x, perm, d))
        return -1;
    int64_t xs[KILN_MAX_RANK], s[KILN_MAX_RANK], idx[KILN_MAX_RANK] = {0};
    type_strides(x, xs);
    for (int k = 0; k < y->rank; k++)
        s[k] = xs[perm[k]];
    int last = y->rank - 1;
    int64_t count = type_numel(y), row = last >= 0 ? y->dims[last] : 1, step = last >= 0 ? s[last] : 0;
    for (int64_t i = 0; i < count; i += row) {
        int64_t at = 0;
        for (int k = 0; k < last; k++)
            at += idx[k] * s[k];
        copy_strided(out[0]->bytes, i, in[0]->bytes, at, step, row, dtype_size(x->dtype));
        next_index(idx, y->dims, last);
    }
    return 0;
}

/* ---- concat ---- */

int infer_concat(Graph *g, Node *n, Diag *d) {
    const Type *x = in_type(g, n, 0);
    int64_t given = node_int(n, ATTR_AXIS);
    int axis = norm_axis(given, x->rank);
    if (axis < 0)
        return diag_error(d, attr_loc(n, ATTR_AXIS), "concat: axis %lld is out of range for x1 of type %s",
                          (long long)given, tstr(x));
    Type out = *x;
    for (int i = 1; i < n->n_in; i++) {
        const Type *xi = in_type(g, n, i);
        bool same = xi->rank == x->rank;
        for (int k = 0; same && k < x->rank; k++)
            same = k == axis || xi->dims[k] == x->dims[k];
        if (!same)
            return diag_error(d, n->loc,
                              "concat: x%d of type %s does not match x1 of type %s outside axis %d", i + 1,
                              tstr(xi), tstr(x), axis);
        out.dims[axis] += xi->dims[axis];
    }
    if (check_size(n, &out, d))
        return -1;
    set_out_type(g, n, 0, out);
    return 0;
}

/* The result is, for each index before the axis, the inputs' blocks one after the
 * other; a block is an input's extent along the axis times everything after it. */
int eval_concat(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    (void)d;
    const Type *y = &out[0]->type;
    int axis = norm_axis(node_int(n, ATTR_AXIS), y->rank);
    int64_t outer, inner;
    split_at_axis(y, axis, &outer, &inner);
    int64_t at = 0;
    for (int64_t o = 0; o < outer; o++)
        for (int i = 0; i < n->n_in; i++) {
            int64_t block = in[i]->type.dims[axis] * inner;
            copy_elements(out[0], at, in[i], o * block, block);
            at += block;
        }
    return 0;
}

/* ---- slice ---- */

/* Index of the first element and step along every dim of x, and the result type.
 * Negative starts and ends count from the end; then, as the ONNX spec says, a
 * forward slice clamps both to [0, dim] and a backward one clamps the start to
 * [0, dim - 1] and the end to [-1, dim - 1], so INT64_MAX and INT64_MIN work as
 * "to the end". */
int slice_ranges(const Node *n, const Type *x, int64_t *start, int64_t *step, Type *out, Diag *d) {
    const Attr *starts = node_attr(n, ATTR_STARTS), *ends = node_attr(n, ATTR_ENDS);
    const Attr *axes = node_attr(n, ATTR_AXES), *steps = node_attr(n, ATTR_STEPS);
    int m = starts->n;
    if (ends->n != m)
        return diag_error(d, ends->loc, "slice: len(ends) = %d differs from len(starts) = %d", ends->n, m);
    if (axes->set && axes->n != m)
        return diag_error(d, axes->loc, "slice: len(axes) = %d differs from len(starts) = %d", axes->n, m);
    if (steps->set && steps->n != m)
        return diag_error(d, steps->loc, "slice: len(steps) = %d differs from len(starts) = %d", steps->n, m);
    if (m > x->rank)
        return diag_error(d, starts->loc, "slice: len(starts) = %d is more than the rank of x (%s)", m,
                          tstr(x));
    bool sliced[KILN_MAX_RANK] = {false};
    *out = *x;
    for (int k = 0; k < x->rank; k++)
        start[k] = 0, step[k] = 1;
    for (int i = 0; i < m; i++) {
        int64_t given = axes->set ? axes->ints[i] : i;
        int axis = norm_axis(given, x->rank);
        if (axis < 0)
            return diag_error(d, axes->loc, "slice: axis %lld is out of range for x of type %s",
                              (long long)given, tstr(x));
        if (sliced[axis])
            return diag_error(d, axes->loc, "slice: axes name dimension %d of x (%s) twice", axis, tstr(x));
        sliced[axis] = true;
        int64_t dim = x->dims[axis], s = starts->ints[i], e = ends->ints[i];
        int64_t st = steps->set ? steps->ints[i] : 1;
        if (st == 0)
            return diag_error(d, steps->loc, "slice: steps[%d] is 0", i);
        s = s < 0 ? s + dim : s;
        e = e < 0 ? e + dim : e;
        int64_t lo = st > 0 ? 0 : -1, hi = st > 0 ? dim : dim - 1;
        s = s < 0 ? 0 : s > hi ? hi : s;
        e = e < lo ? lo : e > hi ? hi : e;
        /* a step beyond the dim takes one element, and -INT64_MIN would overflow */
        int64_t span = st > 0 ? e - s : s - e, mag = st > 0 ? st : st < -dim ? dim : -st;
        int64_t len = span > 0 ? (span - 1) / mag + 1 : 0;
        if (len == 0)
            return diag_error(d, n->loc,
                              "slice: starts %lld, ends %lld, step %lld select nothing of dimension %d "
                              "(size %lld) of x; kiln shapes are positive",
                              (long long)starts->ints[i], (long long)ends->ints[i], (long long)st, axis,
                              (long long)dim);
        start[axis] = s;
        step[axis] = st;
        out->dims[axis] = len;
    }
    return 0;
}

int infer_slice(Graph *g, Node *n, Diag *d) {
    int64_t start[KILN_MAX_RANK], step[KILN_MAX_RANK];
    Type out = {0};
    if (slice_ranges(n, in_type(g, n, 0), start, step, &out, d))
        return -1;
    set_out_type(g, n, 0, out);
    return 0;
}

int eval_slice(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    const Type *x = &in[0]->type, *y = &out[0]->type;
    int64_t start[KILN_MAX_RANK], step[KILN_MAX_RANK], xs[KILN_MAX_RANK], idx[KILN_MAX_RANK] = {0};
    Type t = {0};
    if (slice_ranges(n, x, start, step, &t, d))
        return -1;
    type_strides(x, xs);
    int64_t count = type_numel(y);
    for (int64_t i = 0; i < count; i++) {
        int64_t at = 0;
        for (int k = 0; k < y->rank; k++)
            at += (start[k] + idx[k] * step[k]) * xs[k];
        copy_elements(out[0], i, in[0], at, 1);
        next_index(idx, y->dims, y->rank);
    }
    return 0;
}

/* ---- pad ---- */

typedef enum { PAD_CONSTANT, PAD_REFLECT, PAD_EDGE } PadMode;

static PadMode pad_mode(const Node *n) {
    int m = node_enum(n, ATTR_MODE);
    return m == PAD_MODE_REFLECT ? PAD_REFLECT : m == PAD_MODE_EDGE ? PAD_EDGE : PAD_CONSTANT;
}

/* The pads split per dim into begin and end, and the result type. A negative pad
 * crops; as in ONNX Runtime the crop comes first, and reflect and edge pad from
 * what remains, so reflect needs each pad smaller than that remainder and edge
 * needs a remainder at all. */
static int pad_widths(const Node *n, const Type *x, int64_t *begin, int64_t *end, Type *out, Diag *d) {
    const Attr *a = node_attr(n, ATTR_PADS);
    PadMode mode = pad_mode(n);
    const char *op = op_table[n->op].name;
    *out = *x;
    for (int k = 0; k < x->rank; k++) {
        int64_t dim = x->dims[k], b = a->ints[k], e = a->ints[k + x->rank], size;
        /* pads may be anything an int64 holds */
        if (!ck_add(dim, b, &size))
            return attr_too_large(n, ATTR_PADS, k, b, NULL, d);
        if (!ck_add(size, e, &size))
            return attr_too_large(n, ATTR_PADS, k + x->rank, e, NULL, d);
        if (size < 1)
            return diag_error(d, a->loc,
                              "%s: pads %lld and %lld leave nothing of dimension %d (size %lld) of x", op,
                              (long long)b, (long long)e, k, (long long)dim);
        if (size > KILN_MAX_NUMEL)
            return diag_error(d, a->loc, "%s: the result is too large", op);
        int64_t kept;
        if (!ck_add(dim, b < 0 ? b : 0, &kept) || !ck_add(kept, e < 0 ? e : 0, &kept))
            kept = -1; /* cropped by more than an int64 holds */
        if (kept < (mode == PAD_CONSTANT ? 0 : 1))
            return diag_error(d, a->loc,
                              "%s: pads %lld and %lld crop more than dimension %d (size %lld) of x", op,
                              (long long)b, (long long)e, k, (long long)dim);
        if (mode == PAD_REFLECT && (b >= kept || e >= kept))
            return diag_error(d, a->loc,
                              "%s: reflect needs pads smaller than the dimension they pad, got %lld and %lld "
                              "for dimension %d of size %lld",
                              op, (long long)b, (long long)e, k, (long long)kept);
        begin[k] = b;
        end[k] = e;
        out->dims[k] = size;
    }
    return check_size(n, out, d);
}

int infer_pad(Graph *g, Node *n, Diag *d) {
    int64_t begin[KILN_MAX_RANK], end[KILN_MAX_RANK];
    Type out = {0};
    if (pad_widths(n, in_type(g, n, 0), begin, end, &out, d))
        return -1;
    set_out_type(g, n, 0, out);
    return 0;
}

/* pad_grad(dy, x): dy has the type pad gives x, and the gradient x's. */
int infer_pad_grad(Graph *g, Node *n, Diag *d) {
    const Type *dy = in_type(g, n, 0), *x = in_type(g, n, 1);
    int64_t begin[KILN_MAX_RANK], end[KILN_MAX_RANK];
    Type y = {0};
    if (check_grad_ranks(n, dy, x, d) || pad_widths(n, x, begin, end, &y, d))
        return -1;
    if (!type_equal(dy, &y))
        return diag_error(d, n->loc, "pad_grad: dy must be %s, the pad's result for x %s, got %s", tstr(&y),
                          tstr(x), tstr(dy));
    set_out_type(g, n, 0, *x);
    return 0;
}

/* The position in x that result index i of a dim reads, or -1 for the pad value.
 * j is the position in the cropped dim [crop, crop + kept) that remains of x. */
static int64_t pad_source(PadMode mode, int64_t i, int64_t dim, int64_t b, int64_t e) {
    int64_t crop = b < 0 ? -b : 0, kept = dim - crop - (e < 0 ? -e : 0);
    int64_t j = i - (b > 0 ? b : 0);
    if (j < 0 || j >= kept) {
        if (mode == PAD_CONSTANT)
            return -1;
        if (mode == PAD_EDGE)
            j = j < 0 ? 0 : kept - 1;
        else
            j = j < 0 ? -j : 2 * (kept - 1) - j;
    }
    return crop + j;
}

int eval_pad(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    const Type *x = &in[0]->type, *y = &out[0]->type;
    int64_t begin[KILN_MAX_RANK], end[KILN_MAX_RANK], xs[KILN_MAX_RANK], idx[KILN_MAX_RANK] = {0};
    Type t = {0};
    if (pad_widths(n, x, begin, end, &t, d))
        return -1;
    PadMode mode = pad_mode(n);
    float value = (float)node_float(n, ATTR_VALUE);
    type_strides(x, xs);
    int64_t count = type_numel(y);
    for (int64_t i = 0; i < count; i++) {
        int64_t at = 0;
        for (int k = 0; k < y->rank && at >= 0; k++) {
            int64_t src = pad_source(mode, idx[k], x->dims[k], begin[k], end[k]);
            at = src < 0 ? -1 : at + src * xs[k];
        }
        out[0]->data[i] = at < 0 ? value : in[0]->data[at];
        next_index(idx, y->dims, y->rank);
    }
    return 0;
}

/* The adjoint of eval_pad: each element of dy is added to the element of x it
 * copies (edge and reflect copy some several times; constant padding and cropped
 * elements pass nothing), summed in double and rounded once. */
int eval_pad_grad(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    const Type *y = &in[0]->type, *x = &in[1]->type;
    int64_t begin[KILN_MAX_RANK], end[KILN_MAX_RANK], xs[KILN_MAX_RANK], idx[KILN_MAX_RANK] = {0};
    Type t = {0};
    if (pad_widths(n, x, begin, end, &t, d))
        return -1;
    PadMode mode = pad_mode(n);
    int64_t n_x = type_numel(x), count = type_numel(y);
    double *sum = ir_calloc((size_t)n_x, sizeof *sum);
    if (!sum)
        return diag_error(d, n->loc, "out of memory");
    type_strides(x, xs);
    for (int64_t i = 0; i < count; i++) {
        int64_t at = 0;
        for (int k = 0; k < y->rank && at >= 0; k++) {
            int64_t src = pad_source(mode, idx[k], x->dims[k], begin[k], end[k]);
            at = src < 0 ? -1 : at + src * xs[k];
        }
        if (at >= 0)
            sum[at] += in[0]->data[i];
        next_index(idx, y->dims, y->rank);
    }
    for (int64_t i = 0; i < n_x; i++)
        out[0]->data[i] = (float)sum[i];
    ir_free(sum);
    return 0;
}
