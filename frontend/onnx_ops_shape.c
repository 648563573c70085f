/* The ONNX op mapping (see onnx_ops.c): shapes and data movement, resampling, and
 * constants. Parameters that arrive as constant inputs become kiln attributes; on
 * constants these ops fold at import (the shape arithmetic exporters emit), so no
 * integer tensor reaches run time. */
#include "onnx_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- Shapes ---- */

int im_reshape(Importer *im, int x, const int64_t *dims, int rank, int out_k) {
    Node *n = im_node(im, OP_RESHAPE, 1, &x);
    return !n || im_set_ints(im, n, ATTR_SHAPE, dims, rank) ? -1 : im_finish(im, n, out_k);
}

/* A constant with the same values and a new shape. */
static int const_reshape(Importer *im, OConst *c, const int64_t *dims, int rank) {
    /* counted before anything is allocated: a wrong shape may be far larger */
    int64_t numel = 1;
    bool empty = false;
    for (int k = 0; k < rank; k++)
        empty = empty || dims[k] == 0;
    for (int k = 0; k < rank && !empty; k++)
        if (dims[k] < 0 || !ck_mul(numel, dims[k], &numel) || numel > c->numel)
            break;
    if ((empty ? 0 : numel) != c->numel)
        return im_error(im, "cannot reshape a constant of %lld elements to the given shape",
                        (long long)c->numel);
    OConst *r = oconst_new(im, c->is_int, rank, dims);
    if (!r)
        return im_error(im, "out of memory");
    memcpy(r->f, c->f, sizeof(float) * (size_t)c->numel);
    if (c->is_int)
        memcpy(r->ints, c->ints, sizeof(int64_t) * (size_t)c->numel);
    return im_define_const(im, 0, r);
}

static int imp_reshape(Importer *im) {
    int64_t shape[ONNX_MAXL], allowzero = 0;
    int n = 0, r;
    if (im_attr_int(im, "allowzero", &allowzero) < 0)
        return -1;
    if (im->opset < 5)
        r = im_attr_ints(im, "shape", shape, ONNX_MAXL, &n);
    else
        r = im_input_ints(im, 1, "shape", shape, &n);
    if (r < 0)
        return -1;
    if (r == 0)
        return im_error(im, "the shape is required");
    Type t = {0};
    if (im_input_type(im, 0, &t))
        return -1;
    if (n > KILN_MAX_RANK)
        return im_error(im, "the shape has %d dims (kiln's largest rank is %d)", n, KILN_MAX_RANK);
    int64_t dims[KILN_MAX_RANK], known = 1;
    int infer = -1;
    for (int k = 0; k < n; k++) {
        dims[k] = shape[k];
        if (shape[k] == 0 && !allowzero) {
            if (k >= t.rank)
                return im_error(im, "shape entry %d is 0 (copy the input's dim), but the input has rank %d",
                                k, t.rank);
            dims[k] = t.dims[k];
        }
        if (dims[k] == -1) {
            if (infer >= 0)
                return im_error(im, "the shape has more than one -1");
            infer = k;
        } else if (dims[k] < 1) {
            return im_error(im, "shape entry %d is %lld; kiln's dims are >= 1", k, (long long)dims[k]);
        } else if (known > KILN_MAX_NUMEL / dims[k]) {
            return im_error(im, "the shape is too large");
        } else {
            known *= dims[k];
        }
    }
    int64_t numel = type_numel(&t);
    if (infer >= 0) {
        if (numel % known)
            return im_error(im, "cannot reshape %lld elements to the given shape", (long long)numel);
        dims[infer] = numel / known;
    }
    if (im_folded(im, 0))
        return const_reshape(im, im_folded(im, 0), dims, n);
    int x;
    if (im_input(im, 0, &x))
        return -1;
    return im_reshape(im, x, dims, n, 0) < 0 ? -1 : 0;
}

static int imp_flatten(Importer *im) {
    int64_t axis = 1;
    int x;
    if (im_attr_int(im, "axis", &axis) < 0 || im_input(im, 0, &x))
        return -1;
    Node *n = im_node(im, OP_FLATTEN, 1, &x);
    return !n || im_set_int(im, n, ATTR_AXIS, axis) || im_finish(im, n, 0) < 0 ? -1 : 0;
}

static int imp_transpose(Importer *im) {
    int64_t perm[ONNX_MAXL];
    int n_perm = 0, r, x;
    if ((r = im_attr_ints(im, "perm", perm, ONNX_MAXL, &n_perm)) < 0 || im_input(im, 0, &x))
        return -1;
    Node *n = im_node(im, OP_TRANSPOSE, 1, &x);
    return !n || (r == 1 && im_set_ints(im, n, ATTR_PERM, perm, n_perm)) || im_finish(im, n, 0) < 0 ? -1 : 0;
}

/* Squeeze, Unsqueeze: axes an attribute before opset 13, an input from it. */
static int squeeze_like(Importer *im, bool un) {
    int64_t axes[ONNX_MAXL];
    int n_axes = 0, r;
    if (im->opset < 13)
        r = im_attr_ints(im, "axes", axes, ONNX_MAXL, &n_axes);
    else
        r = im_input_ints(im, 1, "axes", axes, &n_axes);
    if (r < 0)
        return -1;
    if (un && r == 0)
        return im_error(im, "axes is required");
    Type t = {0};
    if (im_input_type(im, 0, &t))
        return -1;
    OConst *c0 = im_folded(im, 0);
    if (c0) { /* fold: the new shape by the same rule */
        int64_t dims[KILN_MAX_RANK];
        int rank = 0;
        bool mark[KILN_MAX_RANK + ONNX_MAXL] = {0};
        int out_rank = un ? t.rank + n_axes : t.rank;
        if (out_rank > KILN_MAX_RANK)
            return im_error(im, "the result has rank %d (at most %d)", out_rank, KILN_MAX_RANK);
        for (int k = 0; k < n_axes; k++) {
            int a;
            if (im_axis(im, axes[k], out_rank, &a))
                return -1;
            mark[a] = true;
        }
        if (un) {
            for (int k = 0, j = 0; k < out_rank; k++)
                dims[rank++] = mark[k] ? 1 : t.dims[j++];
        } else {
            for (int k = 0; k < t.rank; k++)
                if (!(n_axes ? mark[k] : t.dims[k] == 1))
                    dims[rank++] = t.dims[k];
        }
        return const_reshape(im, c0, dims, rank);
    }
    int x;
    if (im_input(im, 0, &x))
        return -1;
    Node *n = im_node(im, un ? OP_UNSQUEEZE : OP_SQUEEZE, 1, &x);
    return !n || ((un || n_axes) && im_set_ints(im, n, ATTR_AXES, axes, n_axes)) || im_finish(im, n, 0) < 0
               ? -1
               : 0;
}

static int imp_squeeze(Importer *im) {
    return squeeze_like(im, false);
}
static int imp_unsqueeze(Importer *im) {
    return squeeze_like(im, true);
}

static int imp_concat(Importer *im) {
    int64_t axis;
    int r = im_attr_int(im, "axis", &axis);
    if (r < 0)
        return -1;
    if (r == 0)
        return im_error(im, "axis is required");
    int n_in = im_n_inputs(im);
    if (n_in < 1)
        return im_error(im, "needs at least one input");
    if (im_all_const(im)) { /* fold */
        OConst *first = im_in_sym(im, 0)->c;
        int a;
        if (im_axis(im, axis, first->rank, &a))
            return -1;
        int64_t dims[KILN_MAX_RANK];
        memcpy(dims, first->dims, sizeof dims);
        dims[a] = 0;
        bool is_int = first->is_int;
        for (int k = 0; k < n_in; k++) {
            OConst *c = im_in_sym(im, k)->c;
            if (c->rank != first->rank || c->is_int != is_int)
                return im_error(im, "the constant inputs differ in rank or dtype");
            for (int j = 0; j < c->rank; j++)
                if (j != a && c->dims[j] != first->dims[j])
                    return im_error(im, "the constant inputs' shapes do not agree");
            dims[a] += c->dims[a];
        }
        OConst *out = oconst_new(im, is_int, first->rank, dims);
        if (!out)
            return im_error(im, "out of memory");
        int64_t outer = 1, inner = 1;
        for (int j = 0; j < a; j++)
            outer *= dims[j];
        for (int j = a + 1; j < first->rank; j++)
            inner *= dims[j];
        int64_t pos = 0;
        for (int64_t o = 0; o < outer; o++)
            for (int k = 0; k < n_in; k++) {
                OConst *c = im_in_sym(im, k)->c;
                int64_t len = c->dims[a] * inner;
                memcpy(out->f + pos, c->f + o * len, sizeof(float) * (size_t)len);
                if (is_int)
                    memcpy(out->ints + pos, c->ints + o * len, sizeof(int64_t) * (size_t)len);
                pos += len;
            }
        return im_define_const(im, 0, out);
    }
    int *in = arena_alloc(&im->arena, sizeof(int) * (size_t)n_in);
    if (!in)
        return im_error(im, "out of memory");
    for (int k = 0; k < n_in; k++)
        if (im_input(im, k, &in[k]))
            return -1;
    Node *n = im_node(im, OP_CONCAT, n_in, in);
    return !n || im_set_int(im, n, ATTR_AXIS, axis) || im_finish(im, n, 0) < 0 ? -1 : 0;
}

/* Slice's start/end along a dim of length len, clamped as ONNX defines. */
static void slice_range(int64_t len, int64_t start, int64_t end, int64_t step, int64_t *s, int64_t *e) {
    if (start < 0)
        start = start < -len ? 0 : start + len;
    if (end < 0)
        end = end < -len ? -1 : end + len;
    if (step > 0) {
        *s = start > len ? len : start;
        *e = end > len ? len : end < 0 ? 0 : end;
    } else {
        *s = start > len - 1 ? len - 1 : start;
        *e = end > len - 1 ? len - 1 : end;
    }
}

/* Slicing a constant: the general strided copy. */
static int fold_slice(Importer *im, OConst *c, const int64_t *starts, const int64_t *ends,
                      const int64_t *axes, const int64_t *steps, int n) {
    int64_t begin[KILN_MAX_RANK], step[KILN_MAX_RANK], dims[KILN_MAX_RANK];
    for (int k = 0; k < c->rank; k++)
        begin[k] = 0, step[k] = 1, dims[k] = c->dims[k];
    for (int i = 0; i < n; i++) {
        int a;
        if (im_axis(im, axes[i], c->rank, &a))
            return -1;
        if (steps[i] == 0)
            return im_error(im, "a step is 0");
        int64_t s, e;
        slice_range(c->dims[a], starts[i], ends[i], steps[i], &s, &e);
        /* a step beyond the dim takes one element; as (span + step - 1) / step, with
           neither that sum nor -INT64_MIN overflowing */
        int64_t span = steps[i] > 0 ? e - s : s - e;
        int64_t mag = steps[i] > 0 ? steps[i] : steps[i] < -c->dims[a] ? c->dims[a] : -steps[i];
        int64_t len = span > 0 ? (span - 1) / mag + 1 : 0;
        begin[a] = s, step[a] = steps[i], dims[a] = len;
    }
    OConst *out = oconst_new(im, c->is_int, c->rank, dims);
    if (!out)
        return im_error(im, "out of memory");
    for (int64_t i = 0; i < out->numel; i++) {
        int64_t rem = i, src = 0, stride = 1;
        for (int k = c->rank - 1; k >= 0; k--) {
            int64_t idx = rem % dims[k];
            rem /= dims[k];
            src += (begin[k] + idx * step[k]) * stride;
            stride *= c->dims[k];
        }
        out->f[i] = c->f[src];
        if (c->is_int)
            out->ints[i] = c->ints[src];
    }
    return im_define_const(im, 0, out);
}

static int imp_slice(Importer *im) {
    int64_t starts[ONNX_MAXL], ends[ONNX_MAXL], axes[ONNX_MAXL], steps[ONNX_MAXL];
    int ns = 0, ne = 0, na = 0, nst = 0, ra, rs;
    if (im->opset < 10) {
        if (im_attr_ints(im, "starts", starts, ONNX_MAXL, &ns) < 0 ||
            im_attr_ints(im, "ends", ends, ONNX_MAXL, &ne) < 0 ||
            (ra = im_attr_ints(im, "axes", axes, ONNX_MAXL, &na)) < 0)
            return -1;
        rs = 0;
    } else if (im_input_ints(im, 1, "starts", starts, &ns) < 0 ||
               im_input_ints(im, 2, "ends", ends, &ne) < 0 ||
               (ra = im_input_ints(im, 3, "axes", axes, &na)) < 0 ||
               (rs = im_input_ints(im, 4, "steps", steps, &nst)) < 0) {
        return -1;
    }
    if (ns != ne || (ra && na != ns) || (rs && nst != ns))
        return im_error(im, "starts, ends, axes and steps differ in length");
    if (!ra)
        for (int k = 0; k < ns; k++)
            axes[k] = k;
    if (!rs)
        for (int k = 0; k < ns; k++)
            steps[k] = 1;
    if (im_folded(im, 0))
        return fold_slice(im, im_folded(im, 0), starts, ends, axes, steps, ns);
    int x;
    if (im_input(im, 0, &x))
        return -1;
    Node *n = im_node(im, OP_SLICE, 1, &x);
    return !n || im_set_ints(im, n, ATTR_STARTS, starts, ns) || im_set_ints(im, n, ATTR_ENDS, ends, ns) ||
                   im_set_ints(im, n, ATTR_AXES, axes, ns) || im_set_ints(im, n, ATTR_STEPS, steps, ns) ||
                   im_finish(im, n, 0) < 0
               ? -1
               : 0;
}

/* Opset 18's axes input or attribute of Pad and Resize: the n axes of a rank-`rank`
 * input, each into [0, rank) in a[], none given twice. */
static int resolve_axes(Importer *im, const int64_t *axes, int n, int rank, int *a) {
    bool seen[KILN_MAX_RANK] = {false};
    for (int k = 0; k < n; k++) {
        if (im_axis(im, axes[k], rank, &a[k]))
            return -1;
        if (seen[a[k]])
            return im_error(im, "axis %lld is given twice", (long long)axes[k]);
        seen[a[k]] = true;
    }
    return 0;
}

/* Pad-18's pads of the given axes (each begin, then each end) as pads of every axis,
 * the others 0; *np becomes 2 rank. */
static int pads_on_axes(Importer *im, const Type *t, const int64_t *axes, int n_axes, int64_t *pads,
                        int *np) {
    int a[ONNX_MAXL];
    if (*np != 2 * n_axes)
        return im_error(im, "pads has %d entries for %d axes", *np, n_axes);
    if (resolve_axes(im, axes, n_axes, t->rank, a))
        return -1;
    int64_t all[2 * KILN_MAX_RANK] = {0};
    for (int k = 0; k < n_axes; k++) {
        all[a[k]] = pads[k];
        all[t->rank + a[k]] = pads[n_axes + k];
    }
    memcpy(pads, all, sizeof(int64_t) * 2 * (size_t)t->rank);
    *np = 2 * t->rank;
    return 0;
}

static int imp_pad(Importer *im) {
    int64_t pads[ONNX_MAXL];
    int np = 0, r;
    double value = 0;
    const char *mode = "constant";
    if (im_attr_string(im, "mode", &mode) < 0)
        return -1;
    if (im->opset < 11) {
        if ((r = im_attr_ints(im, im->opset < 2 ? "paddings" : "pads", pads, ONNX_MAXL, &np)) < 0 ||
            im_attr_float(im, "value", &value) < 0)
            return -1;
    } else {
        if ((r = im_input_ints(im, 1, "pads", pads, &np)) < 0 ||
            im_bound_input(im, 2, "constant_value", &value))
            return -1;
    }
    if (r == 0)
        return im_error(im, "pads is required");
    int x;
    Type t = {0};
    if (im_input(im, 0, &x) || im_input_type(im, 0, &t))
        return -1;
    int64_t axes[ONNX_MAXL];
    int n_axes = 0;
    if (im->opset >= 18 && (r = im_input_ints(im, 3, "axes", axes, &n_axes)) < 0)
        return -1;
    if (n_axes && (r = pads_on_axes(im, &t, axes, n_axes, pads, &np)) < 0)
        return -1;
    Node *n = im_node(im, OP_PAD, 1, &x);
    return !n || im_set_ints(im, n, ATTR_PADS, pads, np) || im_set_word(im, n, ATTR_MODE, mode) ||
                   im_set_float(im, n, ATTR_VALUE, value) || im_finish(im, n, 0) < 0
               ? -1
               : 0;
}

/* Expand: x broadcast with the shape (both ways: the result is their broadcast). */
static int imp_expand(Importer *im) {
    int64_t shape[ONNX_MAXL];
    int ns = 0, r, x;
    Type t = {0};
    if ((r = im_input_ints(im, 1, "shape", shape, &ns)) < 0 || im_input_type(im, 0, &t))
        return -1;
    if (r == 0)
        return im_error(im, "the shape is required");
    int rank = ns > t.rank ? ns : t.rank;
    if (rank > KILN_MAX_RANK)
        return im_error(im, "the result has rank %d (at most %d)", rank, KILN_MAX_RANK);
    int64_t dims[KILN_MAX_RANK];
    for (int k = 0; k < rank; k++) {
        int ks = k - (rank - ns), kt = k - (rank - t.rank);
        int64_t a = ks >= 0 ? shape[ks] : 1, b = kt >= 0 ? t.dims[kt] : 1;
        if (a != b && a != 1 && b != 1)
            return im_error(im, "the shape does not broadcast with the input's");
        dims[k] = a == 1 ? b : a;
    }
    if (im_input(im, 0, &x))
        return -1;
    Node *n = im_node(im, OP_EXPAND, 1, &x);
    return !n || im_set_ints(im, n, ATTR_SHAPE, dims, rank) || im_finish(im, n, 0) < 0 ? -1 : 0;
}

/* Split: one slice per output. */
static int imp_split(Importer *im) {
    int64_t axis = 0, split[ONNX_MAXL];
    int n_split = 0, r;
    Type t = {0};
    if (im_attr_int(im, "axis", &axis) < 0 || im_input_type(im, 0, &t))
        return -1;
    if (im->opset < 13)
        r = im_attr_ints(im, "split", split, ONNX_MAXL, &n_split);
    else
        r = im_input_ints(im, 1, "split", split, &n_split);
    if (r < 0)
        return -1;
    int a, n_out = im_n_outputs(im), x;
    int64_t parts = 0; /* opset 18's num_outputs: parts of ceil(dim / parts), the last smaller */
    if (im_axis(im, axis, t.rank, &a) || im_input(im, 0, &x) ||
        (im->opset >= 18 && im_attr_int(im, "num_outputs", &parts) < 0))
        return -1;
    if (n_out < 1 || n_out > ONNX_MAXL)
        return im_error(im, "has %d outputs", n_out);
    if (parts && r)
        return im_error(im, "has both split and num_outputs");
    if (parts && parts != n_out)
        return im_error(im, "num_outputs is %lld for %d outputs", (long long)parts, n_out);
    if (r == 0) {
        int64_t part = t.dims[a] / n_out + (parts && t.dims[a] % n_out); /* parts round up */
        if (parts ? part * (n_out - 1) >= t.dims[a] : t.dims[a] % n_out)
            return im_error(im, "dim %d (%lld) does not split into %d %sparts", a, (long long)t.dims[a],
                            n_out, parts ? "" : "equal ");
        for (int k = 0; k < n_out; k++)
            split[k] = k < n_out - 1 ? part : t.dims[a] - part * (n_out - 1);
        n_split = n_out;
    }
    if (n_split != n_out)
        return im_error(im, "split has %d entries for %d outputs", n_split, n_out);
    int64_t pos = 0;
    for (int k = 0; k < n_out; k++) {
        int64_t start = pos, end, ax = a, one = 1;
        if (split[k] < 0 || !ck_add(pos, split[k], &end))
            return im_error(im, "split[%d] = %lld is out of range", k, (long long)split[k]);
        pos = end;
        if (!*(im->node->output[k] ? im->node->output[k] : ""))
            continue;
        Node *n = im_node(im, OP_SLICE, 1, &x);
        if (!n || im_set_ints(im, n, ATTR_STARTS, &start, 1) || im_set_ints(im, n, ATTR_ENDS, &end, 1) ||
            im_set_ints(im, n, ATTR_AXES, &ax, 1) || im_set_ints(im, n, ATTR_STEPS, &one, 1) ||
            im_finish(im, n, k) < 0)
            return -1;
    }
    if (pos != t.dims[a])
        return im_error(im, "the split sizes add up to %lld, the dim is %lld", (long long)pos,
                        (long long)t.dims[a]);
    return 0;
}

/* Tile: x reshaped with a 1 before each dim, expanded to the repeats, reshaped to
 * the product. */
static int imp_tile(Importer *im) {
    int64_t reps[ONNX_MAXL];
    int nr = 0, x;
    Type t = {0};
    if (im_input_ints(im, 1, "repeats", reps, &nr) < 0 || im_input_type(im, 0, &t) || im_input(im, 0, &x))
        return -1;
    if (nr != t.rank)
        return im_error(im, "repeats has %d entries for an input of rank %d", nr, t.rank);
    if (2 * t.rank > KILN_MAX_RANK)
        return im_error(im, "rank %d is too large to tile (at most %d)", t.rank, KILN_MAX_RANK / 2);
    int64_t split[KILN_MAX_RANK], big[KILN_MAX_RANK], out[KILN_MAX_RANK];
    for (int k = 0; k < t.rank; k++) {
        if (reps[k] < 1)
            return im_error(im, "repeat %lld is not at least 1", (long long)reps[k]);
        split[2 * k] = 1, split[2 * k + 1] = t.dims[k];
        big[2 * k] = reps[k], big[2 * k + 1] = t.dims[k];
        if (!ck_mul(reps[k], t.dims[k], &out[k]) || out[k] > KILN_MAX_NUMEL)
            return im_error(im, "repeats[%d] = %lld is too large for dim %d (%lld)", k, (long long)reps[k], k,
                            (long long)t.dims[k]);
    }
    int y;
    Node *n;
    if ((y = im_reshape(im, x, split, 2 * t.rank, -1)) < 0 || !(n = im_node(im, OP_EXPAND, 1, &y)) ||
        im_set_ints(im, n, ATTR_SHAPE, big, 2 * t.rank) || (y = im_finish(im, n, -1)) < 0)
        return -1;
    return im_reshape(im, y, out, t.rank, 0) < 0 ? -1 : 0;
}

/* DepthToSpace (DCR or CRD) and SpaceToDepth: reshape, transpose, reshape. */
static int space_depth(Importer *im, bool to_space) {
    int64_t bs = 0;
    const char *mode = "DCR";
    int x;
    Type t = {0};
    if (im_attr_int(im, "blocksize", &bs) < 0 || (to_space && im_attr_string(im, "mode", &mode) < 0) ||
        im_input(im, 0, &x) || im_input_type(im, 0, &t))
        return -1;
    if (t.rank != 4 || bs < 1)
        return im_error(im, "needs a 4-D input and a blocksize >= 1");
    int64_t N = t.dims[0], C = t.dims[1], H = t.dims[2], W = t.dims[3], bs2, far;
    /* the largest product below is the result's spatial size or channels, so a
       blocksize whose square times them fits keeps every dim in range */
    if (!ck_mul(bs, bs, &bs2) || !ck_mul(bs2, H > W ? (H > C ? H : C) : (W > C ? W : C), &far))
        return im_error(im, "blocksize = %lld is too large", (long long)bs);
    int64_t mid[6], perm[6], out[4];
    if (to_space) {
        if (C % bs2)
            return im_error(im, "channels %lld are not a multiple of blocksize^2", (long long)C);
        bool dcr = strcmp(mode, "DCR") == 0;
        if (!dcr && strcmp(mode, "CRD") != 0)
            return im_error(im, "mode '%s' is not DCR or CRD", mode);
        int64_t c = C / bs2;
        int64_t m1[6] = {N, bs, bs, c, H, W}, m2[6] = {N, c, bs, bs, H, W};
        int64_t p1[6] = {0, 3, 4, 1, 5, 2}, p2[6] = {0, 1, 4, 2, 5, 3};
        memcpy(mid, dcr ? m1 : m2, sizeof mid);
        memcpy(perm, dcr ? p1 : p2, sizeof perm);
        out[0] = N, out[1] = c, out[2] = H * bs, out[3] = W * bs;
    } else {
        if (H % bs || W % bs)
            return im_error(im, "the spatial dims are not multiples of the blocksize");
        int64_t m[6] = {N, C, H / bs, bs, W / bs, bs}, p[6] = {0, 3, 5, 1, 2, 4};
        memcpy(mid, m, sizeof mid);
        memcpy(perm, p, sizeof perm);
        out[0] = N, out[1] = C * bs2, out[2] = H / bs, out[3] = W / bs;
    }
    int y;
    Node *n;
    if ((y = im_reshape(im, x, mid, 6, -1)) < 0 || !(n = im_node(im, OP_TRANSPOSE, 1, &y)) ||
        im_set_ints(im, n, ATTR_PERM, perm, 6) || (y = im_finish(im, n, -1)) < 0)
        return -1;
    return im_reshape(im, y, out, 4, 0) < 0 ? -1 : 0;
}

static int imp_depth_to_space(Importer *im) {
    return space_depth(im, true);
}
static int imp_space_to_depth(Importer *im) {
    return space_depth(im, false);
}

/* ---- Resampling ---- */

/* Resize-18's attributes: antialias and keep_aspect_ratio_policy at their defaults
 * (kiln's resize has neither), and axes, the dims that scales or sizes give, as
 * scales and sizes of every dim, the others unchanged. */
static int resize_18(Importer *im, const Type *t, const char *coord, double *scales, int *n_scales,
                     int64_t *sizes, int *n_sizes) {
    int64_t antialias = 0, axes[ONNX_MAXL];
    const char *policy = "stretch";
    int n_axes = 0;
    if (im_attr_int(im, "antialias", &antialias) < 0 ||
        im_attr_string(im, "keep_aspect_ratio_policy", &policy) < 0 ||
        im_attr_ints(im, "axes", axes, ONNX_MAXL, &n_axes) < 0)
        return -1;
    if (antialias)
        return im_error(im, "antialias=%lld is not supported", (long long)antialias);
    if (strcmp(policy, "stretch") != 0 && *n_sizes)
        return im_error(im, "keep_aspect_ratio_policy '%s' is not supported (only 'stretch')", policy);
    if (!n_axes)
        return 0;
    if (strcmp(coord, "tf_crop_and_resize") == 0)
        return im_error(im, "tf_crop_and_resize with axes is not supported");
    int given = *n_scales ? *n_scales : *n_sizes;
    if (given != n_axes)
        return im_error(im, "%s has %d entries for %d axes", *n_scales ? "scales" : "sizes", given, n_axes);
    int a[ONNX_MAXL];
    if (resolve_axes(im, axes, n_axes, t->rank, a))
        return -1;
    double all_scales[KILN_MAX_RANK];
    int64_t all_sizes[KILN_MAX_RANK];
    for (int k = 0; k < t->rank; k++) {
        all_scales[k] = 1;
        all_sizes[k] = t->dims[k];
    }
    for (int k = 0; k < n_axes; k++) {
        all_scales[a[k]] = *n_scales ? scales[k] : 1;
        all_sizes[a[k]] = *n_sizes ? sizes[k] : t->dims[a[k]];
    }
    memcpy(scales, all_scales, sizeof(double) * (size_t)t->rank);
    memcpy(sizes, all_sizes, sizeof(int64_t) * (size_t)t->rank);
    *(*n_scales ? n_scales : n_sizes) = t->rank;
    return 0;
}

/* Resize (opsets 10, 11, 13, 18 and 19) and Upsample (opsets 7 and 9, scales as an
 * attribute and then an input): kiln's resize, whose attributes are Resize's.
 * Resize-10 and Upsample compute with asymmetric coordinates and, for nearest, floor. */
static int imp_resize_op(Importer *im, bool upsample) {
    double scales[ONNX_MAXL];
    int64_t sizes[ONNX_MAXL];
    int n_scales = 0, n_sizes = 0;
    bool old = upsample || im->opset < 11;
    const char *mode = "nearest", *coord = old ? "asymmetric" : "half_pixel",
               *nearest = old ? "floor" : "round_prefer_floor";
    double cubic = -0.75, extrap = 0;
    int64_t exclude = 0;
    if (im_attr_string(im, "mode", &mode) < 0)
        return -1;
    if (!old &&
        (im_attr_string(im, "coordinate_transformation_mode", &coord) < 0 ||
         im_attr_string(im, "nearest_mode", &nearest) < 0 || im_attr_float(im, "cubic_coeff_a", &cubic) < 0 ||
         im_attr_int(im, "exclude_outside", &exclude) < 0 ||
         im_attr_float(im, "extrapolation_value", &extrap) < 0))
        return -1;
    if (strcmp(mode, "bilinear") == 0) /* Upsample-7's name for it */
        mode = "linear";
    OConst *roi = NULL, *sc = NULL, *sz = NULL;
    if (upsample && im->opset < 9) {
        if (im_attr_floats(im, "scales", scales, ONNX_MAXL, &n_scales) < 0)
            return -1;
    } else {
        int k_scales = old ? 1 : 2;
        if ((!old && im_const_input(im, 1, "roi", &roi)) || im_const_input(im, k_scales, "scales", &sc) ||
            (!old && im_const_input(im, 3, "sizes", &sz)))
            return -1;
        if (sc && im_const_floats(im, sc, "scales", scales, &n_scales))
            return -1;
        if (sz && im_const_ints(im, sz, "sizes", sizes, &n_sizes))
            return -1;
    }
    if (!n_scales && !n_sizes)
        return im_error(im, "neither scales nor sizes is given");
    if (n_scales && n_sizes)
        return im_error(im, "both scales and sizes are given");
    int x;
    Type t = {0};
    if (im_input(im, 0, &x) || im_input_type(im, 0, &t) ||
        (im->opset >= 18 && resize_18(im, &t, coord, scales, &n_scales, sizes, &n_sizes)))
        return -1;
    Node *n = im_node(im, OP_RESIZE, 1, &x);
    if (!n || (n_scales && im_set_floats(im, n, ATTR_SCALES, scales, n_scales)) ||
        (n_sizes && im_set_ints(im, n, ATTR_SIZES, sizes, n_sizes)) || im_set_word(im, n, ATTR_MODE, mode) ||
        im_set_word(im, n, ATTR_COORDINATE_TRANSFORMATION_MODE, coord) ||
        im_set_word(im, n, ATTR_NEAREST_MODE, nearest) || im_set_float(im, n, ATTR_CUBIC_COEFF_A, cubic) ||
        im_set_int(im, n, ATTR_EXCLUDE_OUTSIDE, exclude != 0) ||
        im_set_float(im, n, ATTR_EXTRAPOLATION_VALUE, extrap))
        return -1;
    if (strcmp(coord, "tf_crop_and_resize") == 0) {
        double r[ONNX_MAXL];
        int nr = 0;
        if (!roi)
            return im_error(im, "tf_crop_and_resize needs the roi input");
        if (im_const_floats(im, roi, "roi", r, &nr) || im_set_floats(im, n, ATTR_ROI, r, nr))
            return -1;
    }
    /* kiln checks the words against its choices and says which are allowed */
    return im_finish(im, n, 0) < 0 ? -1 : 0;
}

static int imp_resize(Importer *im) {
    return imp_resize_op(im, false);
}
static int imp_upsample(Importer *im) {
    return imp_resize_op(im, true);
}

/* ---- Constants and shape computations, folded ---- */

static int imp_constant(Importer *im) {
    OConst *c = NULL;
    double f, fs[ONNX_MAXL];
    int64_t i, is[ONNX_MAXL];
    int n, r;
    if ((r = im_attr_tensor(im, "value", &c)) < 0)
        return -1;
    if (!r && (r = im_attr_float(im, "value_float", &f)) == 1) {
        if (!(c = oconst_new(im, false, 0, NULL)))
            return im_error(im, "out of memory");
        c->f[0] = (float)f;
    }
    if (!c && r >= 0 && (r = im_attr_int(im, "value_int", &i)) == 1) {
        if (!(c = oconst_new(im, true, 0, NULL)))
            return im_error(im, "out of memory");
        c->ints[0] = i, c->f[0] = (float)i;
    }
    if (!c && r >= 0 && (r = im_attr_floats(im, "value_floats", fs, ONNX_MAXL, &n)) == 1) {
        int64_t d = n;
        if (!(c = oconst_new(im, false, 1, &d)))
            return im_error(im, "out of memory");
        for (int k = 0; k < n; k++)
            c->f[k] = (float)fs[k];
    }
    if (!c && r >= 0 && (r = im_attr_ints(im, "value_ints", is, ONNX_MAXL, &n)) == 1) {
        int64_t d = n;
        if (!(c = oconst_new(im, true, 1, &d)))
            return im_error(im, "out of memory");
        for (int k = 0; k < n; k++)
            c->ints[k] = is[k], c->f[k] = (float)is[k];
    }
    if (r < 0)
        return -1;
    if (!c)
        return im_error(im, "no value kiln reads (value, value_float(s) or value_int(s))");
    return im_define_const(im, 0, c);
}

static int int_list_const(Importer *im, const int64_t *v, int n, int rank) {
    int64_t d = n;
    OConst *c = oconst_new(im, true, rank, &d);
    if (!c)
        return im_error(im, "out of memory");
    for (int k = 0; k < n; k++)
        c->ints[k] = v[k], c->f[k] = (float)v[k];
    return im_define_const(im, 0, c);
}

static int imp_shape(Importer *im) {
    Type t = {0};
    int64_t start = 0, end = KILN_MAX_RANK;
    int r;
    if (im_attr_int(im, "start", &start) < 0 || (r = im_attr_int(im, "end", &end)) < 0 ||
        im_input_type(im, 0, &t))
        return -1;
    if (r == 0)
        end = t.rank;
    int64_t s, e;
    slice_range(t.rank, start, end, 1, &s, &e);
    return int_list_const(im, t.dims + s, e > s ? (int)(e - s) : 0, 1);
}

static int imp_size(Importer *im) {
    Type t = {0};
    if (im_input_type(im, 0, &t))
        return -1;
    int64_t n = type_numel(&t);
    return int_list_const(im, &n, 1, 0);
}

/* Cast: of a constant, folded; of a run-time value, only to float. */
static int imp_cast(Importer *im) {
    int64_t to = 0;
    if (im_attr_int(im, "to", &to) < 0)
        return -1;
    if (im->opset >= 19)
        im_attr_ignore(im, "saturate"); /* how float8 conversions overflow; kiln has no float8 */
    OConst *src = im_folded(im, 0);
    bool to_float = to == 1 || to == 10 || to == 11 || to == 16;
    bool to_int =
        to == 2 || to == 3 || to == 4 || to == 5 || to == 6 || to == 7 || to == 9 || to == 12 || to == 13;
    if (src) {
        OConst *c = oconst_new(im, to_int, src->rank, src->dims);
        if (!c)
            return im_error(im, "out of memory");
        if (!to_float && !to_int)
            return im_error(im, "cast to %s is not supported", onnx_dtype_name((int32_t)to));
        c->dtype = onnx_kiln_dtype((int32_t)to) >= 0 ? (DType)onnx_kiln_dtype((int32_t)to)
                   : to_int                          ? DT_I64
                                                     : DT_F32;
        for (int64_t i = 0; i < c->numel; i++) {
            double v = src->is_int ? (double)src->ints[i] : src->f[i];
            if (to_int) {
                int64_t iv = src->is_int    ? src->ints[i]
                             : isnan(v)     ? 0
                             : v >= 9.2e18  ? INT64_MAX
                             : v <= -9.2e18 ? INT64_MIN
                                            : (int64_t)v;
                c->ints[i] = to == 9 ? iv != 0 : iv;
                c->f[i] = (float)c->ints[i];
            } else {
                c->f[i] = (float)v;
            }
        }
        return im_define_const(im, 0, c);
    }
    int kiln_to = onnx_kiln_dtype((int32_t)to), x;
    if (kiln_to < 0)
        return im_error(im,
                        "cast of a run-time tensor to %s; kiln's run-time tensors are FLOAT, INT64, INT32 "
                        "or BOOL",
                        onnx_dtype_name((int32_t)to));
    Type t = {0};
    if (im_input_type(im, 0, &t) || im_input(im, 0, &x))
        return -1;
    if ((int)t.dtype == kiln_to)
        return im_pass_through(im);
    Node *n = im_node(im, OP_CAST, 1, &x);
    return n && !im_set_word(im, n, ATTR_TO, dtype_name((DType)kiln_to)) && im_finish(im, n, 0) >= 0 ? 0 : -1;
}

static int imp_constant_of_shape(Importer *im) {
    int64_t dims[ONNX_MAXL];
    int n = 0, r;
    OConst *value = NULL;
    if ((r = im_input_ints(im, 0, "the shape", dims, &n)) < 0 || im_attr_tensor(im, "value", &value) < 0)
        return -1;
    if (r == 0 || n > KILN_MAX_RANK)
        return im_error(im, "the shape is missing or has more than %d dims", KILN_MAX_RANK);
    int64_t numel = 1;
    for (int k = 0; k < n; k++) {
        if (dims[k] < 0)
            return im_error(im, "the shape has a negative dim");
        if (!ck_mul(numel, dims[k] ? dims[k] : 1, &numel) || numel > KILN_MAX_NUMEL)
            return im_error(im, "the shape is too large");
    }
    if (value && value->numel != 1)
        return im_error(im, "value must hold one element");
    OConst *c = im_fold_new(im, value && value->is_int, n, dims);
    if (!c)
        return -1;
    for (int64_t i = 0; i < c->numel; i++) {
        c->f[i] = value ? value->f[0] : 0;
        if (c->is_int)
            c->ints[i] = value->ints[0];
    }
    return im_define_const(im, 0, c);
}

static int imp_range(Importer *im) {
    OConst *s, *l, *d;
    if (im_const_input(im, 0, "start", &s) || im_const_input(im, 1, "limit", &l) ||
        im_const_input(im, 2, "delta", &d))
        return -1;
    if (!s || !l || !d || s->numel != 1 || l->numel != 1 || d->numel != 1)
        return im_error(im, "start, limit and delta must be single constants");
    bool is_int = s->is_int;
    if (l->is_int != is_int || d->is_int != is_int)
        return im_error(im, "start, limit and delta must have one type");
    double a = is_int ? (double)s->ints[0] : s->f[0], b = l->is_int ? (double)l->ints[0] : l->f[0];
    double step = d->is_int ? (double)d->ints[0] : d->f[0];
    if (step == 0)
        return im_error(im, "delta is 0");
    double count = ceil((b - a) / step);
    if (isnan(count))
        return im_error(im, "start, limit or delta is not a number");
    if (count < 0)
        count = 0;
    if (count > (double)ONNX_MAX_FOLDED)
        return im_error(im, "the range is too long");
    int64_t n = (int64_t)count;
    OConst *c = oconst_new(im, is_int, 1, &n);
    if (!c)
        return im_error(im, "out of memory");
    for (int64_t i = 0; i < n; i++) {
        if (is_int) {
            /* the count was taken in double, which rounds near INT64_MAX */
            int64_t v;
            if (!ck_mul(i, d->ints[0], &v) || !ck_add(v, s->ints[0], &v))
                return im_error(im, "element %lld of the range (start %lld, delta %lld) overflows int64",
                                (long long)i, (long long)s->ints[0], (long long)d->ints[0]);
            c->ints[i] = v, c->f[i] = (float)v;
        } else
            c->f[i] = (float)(s->f[0] + (float)i * d->f[0]);
    }
    return im_define_const(im, 0, c);
}

/* GatherElements: kiln's gather_elements (of constants, folded by the fold pass). */
static int imp_gather_elements(Importer *im) {
    int64_t axis = 0;
    int in[2];
    if (im_attr_int(im, "axis", &axis) < 0 || im_input(im, 0, &in[0]) || im_input(im, 1, &in[1]))
        return -1;
    Node *n = im_node(im, OP_GATHER_ELEMENTS, 2, in);
    return n && !im_set_int(im, n, ATTR_AXIS, axis) && im_finish(im, n, 0) >= 0 ? 0 : -1;
}

/* Gather: on constants, folded (shape arithmetic); on a run-time tensor with
 * constant indices, a slice per index, concatenated along the axis in the indices'
 * row-major order, then reshaped to the input's dims with the axis replaced by the
 * indices' dims (none for a scalar index). */
static int imp_gather(Importer *im) {
    int64_t axis = 0;
    OConst *idx;
    Type t = {0};
    if (im_attr_int(im, "axis", &axis) < 0 || im_input_type(im, 0, &t))
        return -1;
    if (!im_folded(im, 1) || im_folded(im, 1)->numel > ONNX_MAXL) { /* indices known only at run time */
        int in[2];
        if (im_input(im, 0, &in[0]) || im_input(im, 1, &in[1]))
            return -1;
        Node *n = im_node(im, OP_GATHER, 2, in);
        return n && !im_set_int(im, n, ATTR_AXIS, axis) && im_finish(im, n, 0) >= 0 ? 0 : -1;
    }
    if (im_const_input(im, 1, "indices", &idx))
        return -1;
    int a;
    if (im_axis(im, axis, t.rank, &a))
        return -1;
    if (!idx->is_int)
        return im_error(im, "indices must be integers");
    if (t.rank - 1 + idx->rank > KILN_MAX_RANK)
        return im_error(im, "the result would have rank %d (at most %d)", t.rank - 1 + idx->rank,
                        KILN_MAX_RANK);
    if (idx->numel == 0 || idx->numel > ONNX_MAXL)
        return im_error(im, "indices has %lld entries (1 to %d)", (long long)idx->numel, ONNX_MAXL);
    int64_t ids[ONNX_MAXL];
    for (int64_t i = 0; i < idx->numel; i++) {
        ids[i] = idx->ints[i] < 0 ? idx->ints[i] + t.dims[a] : idx->ints[i];
        if (ids[i] < 0 || ids[i] >= t.dims[a])
            return im_error(im, "index %lld is out of range for a dim of %lld", (long long)idx->ints[i],
                            (long long)t.dims[a]);
    }
    int64_t dims[KILN_MAX_RANK];
    int rank = 0;
    for (int k = 0; k < t.rank; k++) {
        if (k == a) {
            for (int j = 0; j < idx->rank; j++)
                dims[rank++] = idx->dims[j];
        } else {
            dims[rank++] = t.dims[k];
        }
    }
    if (im_folded(im, 0)) {
        OConst *c = im_folded(im, 0), *out = im_fold_new(im, c->is_int, rank, dims);
        if (!out)
            return -1;
        int64_t outer = 1, inner = 1;
        for (int k = 0; k < a; k++)
            outer *= t.dims[k];
        for (int k = a + 1; k < t.rank; k++)
            inner *= t.dims[k];
        int64_t pos = 0;
        for (int64_t o = 0; o < outer; o++)
            for (int64_t i = 0; i < idx->numel; i++)
                for (int64_t j = 0; j < inner; j++, pos++) {
                    int64_t src = (o * t.dims[a] + ids[i]) * inner + j;
                    out->f[pos] = c->f[src];
                    if (c->is_int)
                        out->ints[pos] = c->ints[src];
                }
        return im_define_const(im, 0, out);
    }
    int x, parts[ONNX_MAXL];
    if (im_input(im, 0, &x))
        return -1;
    for (int64_t i = 0; i < idx->numel; i++) {
        int64_t start = ids[i], end = ids[i] + 1, ax = a, one = 1;
        Node *n = im_node(im, OP_SLICE, 1, &x);
        if (!n || im_set_ints(im, n, ATTR_STARTS, &start, 1) || im_set_ints(im, n, ATTR_ENDS, &end, 1) ||
            im_set_ints(im, n, ATTR_AXES, &ax, 1) || im_set_ints(im, n, ATTR_STEPS, &one, 1) ||
            (parts[i] = im_finish(im, n, -1)) < 0)
            return -1;
    }
    int y = parts[0];
    if (idx->numel > 1) {
        Node *n = im_node(im, OP_CONCAT, (int)idx->numel, parts);
        if (!n || im_set_int(im, n, ATTR_AXIS, a) || (y = im_finish(im, n, -1)) < 0)
            return -1;
    }
    return im_reshape(im, y, dims, rank, 0) < 0 ? -1 : 0;
}

/* Shapes, resampling and constants, by ONNX op type. */
const OnnxOp onnx_ops_shape[] = {
    {"Cast", imp_cast},
    {"Concat", imp_concat},
    {"Constant", imp_constant},
    {"ConstantOfShape", imp_constant_of_shape},
    {"DepthToSpace", imp_depth_to_space},
    {"Expand", imp_expand},
    {"Flatten", imp_flatten},
    {"Gather", imp_gather},
    {"GatherElements", imp_gather_elements},
    {"Pad", imp_pad},
    {"Range", imp_range},
    {"Reshape", imp_reshape},
    {"Resize", imp_resize},
    {"Shape", imp_shape},
    {"Size", imp_size},
    {"Slice", imp_slice},
    {"SpaceToDepth", imp_space_to_depth},
    {"Split", imp_split},
    {"Squeeze", imp_squeeze},
    {"Tile", imp_tile},
    {"Transpose", imp_transpose},
    {"Unsqueeze", imp_unsqueeze},
    {"Upsample", imp_upsample},
    {NULL, NULL},
};
