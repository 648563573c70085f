/* Lowering of the reductions and normalizations: sum, mean, reduce_max, softmax,
 * log_softmax, batch_norm and layer_norm.
 *
 * Each is one LOOP kernel. A reduction gives an iteration to each result: x is seen
 * as runs of dims, adjacent dims that are all reduced or all kept merged into one
 * run (dims of size 1 dropped), so the result's flat index maps to its first input
 * element through the kept runs' constant strides, and the reduced runs become
 * nested `for` loops in the body. softmax and layer_norm give an iteration to each
 * row (one position of every other dim) and make the reference's passes over it:
 * the max (softmax) or the mean (layer_norm) first, so that large inputs neither
 * overflow nor cancel. batch_norm is elementwise: each element finds its channel and
 * computes that channel's scale / sqrt(var + eps) from the params. Sums accumulate
 * in double, as the interpreter does; everything else is float. */
#include "codegen.h"
#include "../ir/ops_impl.h"

#include <math.h>
#include <string.h>

enum { REDUCE_WORK = 16384 }; /* input elements worth giving a thread */

static Kernel *new_loop(Program *p, const Node *n, int64_t count, int64_t work_per_iteration, Diag *d) {
    int64_t grain = work_per_iteration >= REDUCE_WORK ? 1 : REDUCE_WORK / work_per_iteration;
    return kernel_loop(p, n, NULL, count, grain, d);
}

/* ---- sum, mean, reduce_max ---- */

/* Adjacent dims of x that are all reduced or all kept, as one run. */
typedef struct {
    int64_t size, stride;
    bool reduced;
} Run;

/* The runs of x; dims of size 1 move nothing and are dropped. */
static int runs_of(const Type *x, const bool *reduced, Run *runs) {
    int64_t st[KILN_MAX_RANK];
    type_strides(x, st);
    int n = 0;
    for (int k = 0; k < x->rank; k++) {
        if (x->dims[k] == 1)
            continue;
        if (n > 0 && runs[n - 1].reduced == reduced[k]) {
            runs[n - 1].size *= x->dims[k];
            runs[n - 1].stride = st[k];
        } else {
            runs[n++] = (Run){x->dims[k], st[k], reduced[k]};
        }
    }
    return n;
}

/* The dims `axes` reduces, as in ir/op_reduce.c (the verifier checked them): an
 * unset or empty list reduces them all. */
static void reduced_dims(const Node *n, const Type *x, bool *reduced) {
    const Attr *a = node_attr(n, ATTR_AXES);
    bool all = !a->set || a->n == 0;
    for (int k = 0; k < x->rank; k++)
        reduced[k] = all;
    for (int i = 0; !all && i < a->n; i++)
        reduced[norm_axis(a->ints[i], x->rank)] = true;
}

int lower_reduce(Program *p, const Node *n, Diag *d) {
    const Type *x = &p->g->values[n->in[0]].type;
    bool reduced[KILN_MAX_RANK];
    reduced_dims(n, x, reduced);
    Run runs[KILN_MAX_RANK];
    int n_runs = runs_of(x, reduced, runs);
    int64_t group = 1, results = 1;
    for (int r = 0; r < n_runs; r++)
        *(runs[r].reduced ? &group : &results) *= runs[r].size;
    Kernel *k = new_loop(p, n, results, group, d);
    if (!k)
        return -1;
    Str *s = &k->body;
    /* the first element of result i: its kept runs unraveled from i */
    str_printf(s, "const float *x = %s + ", value_name(p, n->in[0]));
    int64_t after = results; /* results per step of the current kept run */
    bool any = false;
    for (int r = 0; r < n_runs; r++) {
        if (runs[r].reduced)
            continue;
        int64_t size = runs[r].size;
        after /= size;
        /* * / and % bind alike, left to right: i / after % size * stride */
        str_printf(s, "%si", any ? " + " : "");
        if (after > 1)
            str_printf(s, " / %lld", (long long)after);
        if (after * size < results)
            str_printf(s, " %% %lld", (long long)size);
        str_printf(s, " * %lld", (long long)runs[r].stride);
        any = true;
    }
    str_printf(s, "%s;\n", any ? "" : "0");
    bool is_max = n->op == OP_REDUCE_MAX;
    char inf[32];
    float_literal(-INFINITY, inf, sizeof inf);
    if (is_max)
        str_printf(s, "float acc = %s;\n", inf);
    else
        str_printf(s, "double acc = 0.0;\n");
    /* one loop per reduced run, r0 outermost */
    int depth = 0;
    char at[256] = "0";
    size_t len = 0;
    for (int r = 0; r < n_runs; r++) {
        if (!runs[r].reduced)
            continue;
        str_printf(s, "%*sfor (int64_t r%d = 0; r%d < %lld; r%d++)%s\n", 4 * depth, "", depth, depth,
                   (long long)runs[r].size, depth, is_max ? " {" : "");
        len += (size_t)snprintf(at + len, sizeof at - len, "%sr%d * %lld", len ? " + " : "", depth,
                                (long long)runs[r].stride);
        depth++;
    }
    if (is_max) {
        /* NaN wins, as in the reference: once acc is NaN nothing is greater */
        str_printf(s, "%*sfloat v = x[%s];\n", 4 * depth, "", at);
        str_printf(s, "%*sif (v != v || v > acc)\n%*sacc = v;\n", 4 * depth, "", 4 * depth + 4, "");
        for (int level = depth - 1; level >= 0; level--)
            str_printf(s, "%*s}\n", 4 * level, "");
        str_printf(s, "%s[i] = acc;\n", value_name(p, n->out[0]));
    } else {
        str_printf(s, "%*sacc += x[%s];\n", 4 * depth, "", at);
        if (n->op == OP_MEAN)
            str_printf(s, "%s[i] = (float)(acc / %lld.0);\n", value_name(p, n->out[0]), (long long)group);
        else
            str_printf(s, "%s[i] = (float)acc;\n", value_name(p, n->out[0]));
    }
    return 0;
}

/* ---- softmax, log_softmax ---- */

/* `const float *NAME = V + first;` for a row of length len: x walked as [outer,
 * len, inner], row i starting at element (i / inner, 0, i % inner). */
static void row_pointer(Str *s, const char *decl, const char *v, int64_t outer, int64_t len, int64_t inner) {
    if (inner == 1)
        str_printf(s, "%s = %s + i * %lld;\n", decl, v, (long long)len);
    else if (outer == 1)
        str_printf(s, "%s = %s + i;\n", decl, v);
    else
        str_printf(s, "%s = %s + i / %lld * %lld + i %% %lld;\n", decl, v, (long long)inner,
                   (long long)(len * inner), (long long)inner);
}

int lower_softmax(Program *p, const Node *n, Diag *d) {
    const Type *x = &p->g->values[n->in[0]].type;
    int axis = norm_axis(node_int(n, ATTR_AXIS), x->rank);
    int64_t outer, len = x->dims[axis], inner;
    split_at_axis(x, axis, &outer, &inner);
    Kernel *k = new_loop(p, n, outer * inner, len, d);
    if (!k)
        return -1;
    Str *s = &k->body;
    char inf[32], e[32] = "[j]"; /* element j of the row */
    float_literal(-INFINITY, inf, sizeof inf);
    if (inner > 1)
        snprintf(e, sizeof e, "[j * %lld]", (long long)inner);
    row_pointer(s, "const float *x", value_name(p, n->in[0]), outer, len, inner);
    row_pointer(s, "float *y", value_name(p, n->out[0]), outer, len, inner);
    /* NaN is skipped by the max, but reaches every result through the sum */
    str_printf(s, "float max = %s;\n", inf);
    str_printf(s, "for (int64_t j = 0; j < %lld; j++)\n    max = x%s > max ? x%s : max;\n", (long long)len, e,
               e);
    str_printf(s, "double sum = 0.0;\n");
    if (n->op == OP_SOFTMAX) {
        str_printf(s, "for (int64_t j = 0; j < %lld; j++) {\n", (long long)len);
        str_printf(s, "    y%s = expf(x%s - max);\n    sum += y%s;\n}\n", e, e, e);
        str_printf(s, "float scale = (float)(1.0 / sum);\n");
        str_printf(s, "for (int64_t j = 0; j < %lld; j++)\n    y%s *= scale;\n", (long long)len, e);
    } else {
        str_printf(s, "for (int64_t j = 0; j < %lld; j++)\n    sum += expf(x%s - max);\n", (long long)len, e);
        str_printf(s, "float log_sum = (float)log(sum);\n");
        str_printf(s, "for (int64_t j = 0; j < %lld; j++)\n    y%s = x%s - max - log_sum;\n", (long long)len,
                   e, e);
    }
    return 0;
}

/* ---- batch_norm ---- */

int lower_batch_norm(Program *p, const Node *n, Diag *d) {
    const Type *x = &p->g->values[n->in[0]].type;
    int c = layout_is_nhwc(n) ? x->rank - 1 : 1;
    int64_t channels = x->dims[c], inner = 1; /* elements between one channel and the next */
    for (int i = c + 1; i < x->rank; i++)
        inner *= x->dims[i];
    /* one iteration per run of elements sharing a channel (nchw), or per position with
       all its channels (nhwc): the inner loop is contiguous and vectorizes */
    int64_t run = inner > 1 ? inner : channels, rows = type_numel(x) / run;
    Kernel *k = new_loop(p, n, rows, run, d);
    if (!k)
        return -1;
    k->in_place = true; /* x is read at the element written; the others have another type */
    char eps[32];
    float_literal(node_float(n, ATTR_EPSILON), eps, sizeof eps);
    const char *y = value_name(p, n->out[0]), *xs = value_name(p, n->in[0]);
    const char *scale = value_name(p, n->in[1]), *bias = value_name(p, n->in[2]);
    const char *mean = value_name(p, n->in[3]), *var = value_name(p, n->in[4]);
    const char *ch = inner > 1 ? "c" : "j";
    if (inner > 1)
        str_printf(&k->body, "int64_t c = i %% %lld;\n", (long long)channels);
    str_printf(&k->body, "for (int64_t j = 0; j < %lld; j++) {\n", (long long)run);
    str_printf(&k->body, "    float scale = %s[%s] / sqrtf(%s[%s] + %s);\n", scale, ch, var, ch, eps);
    str_printf(&k->body, "    %s[i * %lld + j] = (%s[i * %lld + j] - %s[%s]) * scale + %s[%s];\n}\n", y,
               (long long)run, xs, (long long)run, mean, ch, bias, ch);
    return 0;
}

/* ---- layer_norm ---- */

/* The element of an optional scale or bias t for position j of the normalized
 * shape: j itself when t has that shape, else through the n0.. unraveled from j.
 * Returns whether it needs them. */
static bool norm_operand(const Program *p, int v, const Type *norm, char *buf, size_t cap) {
    const Type *t = &p->g->values[v].type;
    char off[256] = "j";
    if (!type_equal(t, norm))
        broadcast_offset(t, norm, "n", off, sizeof off);
    snprintf(buf, cap, "%s[%s]", value_name(p, v), off);
    return !type_equal(t, norm) && type_numel(t) > 1;
}

int lower_layer_norm(Program *p, const Node *n, Diag *d) {
    const Type *x = &p->g->values[n->in[0]].type;
    int axis = norm_axis(node_int(n, ATTR_AXIS), x->rank);
    Type norm = type_make(x->rank - axis, x->dims + axis);
    int64_t size = type_numel(&norm), rows = type_numel(x) / size;
    int scale = n->n_in > 1 ? n->in[1] : -1, bias = n->n_in > 2 ? n->in[2] : -1;
    Kernel *k = new_loop(p, n, rows, size, d);
    if (!k)
        return -1;
    Str *s = &k->body;
    str_printf(s, "const float *x = %s + i * %lld;\n", value_name(p, n->in[0]), (long long)size);
    str_printf(s, "float *y = %s + i * %lld;\n", value_name(p, n->out[0]), (long long)size);
    str_printf(s, "double mean = 0.0, var = 0.0;\n");
    str_printf(s, "for (int64_t j = 0; j < %lld; j++)\n    mean += x[j];\n", (long long)size);
    str_printf(s, "mean /= %lld.0;\n", (long long)size);
    str_printf(s, "for (int64_t j = 0; j < %lld; j++)\n    var += (x[j] - mean) * (x[j] - mean);\n",
               (long long)size);
    str_printf(s, "float m = (float)mean, rstd = (float)(1.0 / sqrt(var / %lld.0 + %.17g));\n",
               (long long)size, node_float(n, ATTR_EPSILON));
    char sc[320] = "", bi[320] = "";
    bool unravel = false;
    if (scale >= 0)
        unravel |= norm_operand(p, scale, &norm, sc, sizeof sc);
    if (bias >= 0)
        unravel |= norm_operand(p, bias, &norm, bi, sizeof bi);
    str_printf(s, "for (int64_t j = 0; j < %lld; j++) {\n", (long long)size);
    if (unravel) {
        Str idx = {0};
        emit_unravel(&idx, "j", &norm, "n");
        for (const char *line = idx.s; line && *line;) {
            const char *nl = strchr(line, '\n');
            str_printf(s, "    %.*s\n", (int)(nl - line), line);
            line = nl + 1;
        }
        if (idx.oom)
            s->oom = true;
        str_free(&idx);
    }
    str_printf(s, "    y[j] = (x[j] - m) * rstd%s%s%s%s;\n}\n", scale >= 0 ? " * " : "", sc,
               bias >= 0 ? " + " : "", bi);
    return 0;
}
