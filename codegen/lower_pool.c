/* Lowering of the pools: max_pool, avg_pool, global_avg_pool and adaptive_avg_pool,
 * in either layout.
 *
 * Each is one LOOP kernel. max_pool, avg_pool and adaptive_avg_pool take one
 * iteration per output element (max_pool and avg_pool with channels last: per
 * output position, each tap's channels a contiguous vector): the body unravels it into (b, c, p...), and loops
 * over its window with the kernel sizes, strides, dilations and pads baked in as
 * constants, skipping the positions outside the input. Windows start at
 * p * stride - pad_begin; max keeps the last NaN it meets (as the interpreter does)
 * and -inf for a window of padding only; avg divides by the real elements, or with
 * count_include_pad by the window clipped to the padded input. Adaptive windows
 * are torch's [floor(p * in / out), ceil((p + 1) * in / out)), computed in the body.
 * global_avg_pool takes one iteration per (b, c) and sums its spatial extent in
 * double. */
#include "codegen.h"
#include "../ir/ops_impl.h"

#include <math.h>
#include <string.h>

enum { MAX_SPATIAL = 3, WORK_PER_THREAD = 16384 };

static int64_t grain_for(int64_t work) {
    return work >= WORK_PER_THREAD ? 1 : WORK_PER_THREAD / work;
}

/* Emits `int64_t b = i / ..., c = ..., p0 = ...;`: the output element i as (b, c, p...)
 * of the view y, in the layout's order; a dim of size 1 is 0, and b is left out then. */
static void emit_output_index(Str *s, const View *y, bool nhwc) {
    char names[KILN_MAX_RANK][8];
    int64_t sizes[KILN_MAX_RANK], stride = 1;
    int n = 0;
    if (y->n > 1) {
        snprintf(names[n], sizeof names[n], "b");
        sizes[n++] = y->n;
    }
    if (!nhwc) {
        snprintf(names[n], sizeof names[n], "c");
        sizes[n++] = y->c;
    }
    for (int k = 0; k < y->ns; k++) {
        snprintf(names[n], sizeof names[n], "p%d", k);
        sizes[n++] = y->sp[k];
    }
    if (nhwc) {
        snprintf(names[n], sizeof names[n], "c");
        sizes[n++] = y->c;
    }
    int64_t strides[KILN_MAX_RANK];
    for (int k = n - 1; k >= 0; k--) {
        strides[k] = stride;
        stride *= sizes[k];
    }
    for (int k = 0; k < n; k++) {
        if (sizes[k] == 1)
            str_printf(s, "int64_t %s = 0;\n", names[k]);
        else if (k == 0 && strides[k] == 1)
            str_printf(s, "int64_t %s = i;\n", names[k]);
        else if (k == 0)
            str_printf(s, "int64_t %s = i / %lld;\n", names[k], (long long)strides[k]);
        else if (strides[k] == 1)
            str_printf(s, "int64_t %s = i %% %lld;\n", names[k], (long long)sizes[k]);
        else
            str_printf(s, "int64_t %s = i / %lld %% %lld;\n", names[k], (long long)strides[k],
                       (long long)sizes[k]);
    }
}

/* The offset expression of x[b, c, in0...] into e. */
static void x_offset(const View *x, char *e, size_t cap) {
    e[0] = 0;
    if (x->n > 1)
        append_term(e, cap, "b", x->sn);
    append_term(e, cap, "c", x->sc);
    for (int s = 0; s < x->ns; s++) {
        char v[16];
        snprintf(v, sizeof v, "in%d", s);
        append_term(e, cap, v, x->ss[s]);
    }
}

/* One iteration per output element, each doing `work`. */
static Kernel *loop_over_output(Program *p, const Node *n, int64_t work, Diag *d) {
    return kernel_loop(p, n, NULL, type_numel(&p->g->values[n->out[0]].type), grain_for(work), d);
}

/* ---- max_pool and avg_pool ---- */

int lower_pool(Program *p, const Node *n, Diag *d) {
    bool nhwc = layout_is_nhwc(n), is_max = n->op == OP_MAX_POOL;
    View x = view_of(&p->g->values[n->in[0]].type, nhwc), y = view_of(&p->g->values[n->out[0]].type, nhwc);
    int ns = x.ns;
    int64_t kernel[MAX_SPATIAL], strides[MAX_SPATIAL], pads[2 * MAX_SPATIAL], dil[MAX_SPATIAL] = {1, 1, 1};
    node_ints(n, ATTR_KERNEL, kernel, MAX_SPATIAL, ns);
    node_ints(n, ATTR_STRIDES, strides, MAX_SPATIAL, ns);
    node_ints(n, ATTR_PADS, pads, 2 * MAX_SPATIAL, 2 * ns);
    if (is_max)
        node_ints(n, ATTR_DILATIONS, dil, MAX_SPATIAL, ns);
    bool count_pad = !is_max && node_bool(n, ATTR_COUNT_INCLUDE_PAD);
    int64_t window = lower_flops(ns, kernel); /* at most KILN_MAX_NUMEL (infer_pool) */
    /* channels last: an iteration per output position, over all its channels */
    bool vec = nhwc && x.c > 1;
    View at = y;
    if (vec)
        at.c = 1;
    int64_t numel = type_numel(&p->g->values[n->out[0]].type);
    Kernel *k = vec ? kernel_loop(p, n, NULL, numel / y.c, grain_for(lower_flops(2, (int64_t[]){window, y.c})), d)
                    : loop_over_output(p, n, window, d);
    if (!k)
        return -1;
    char xn[80], yn[80], e[256];
    snprintf(xn, sizeof xn, "%s", value_name(p, n->in[0]));
    snprintf(yn, sizeof yn, "%s", value_name(p, n->out[0]));
    Str *b = &k->body;
    emit_output_index(b, &at, nhwc);
    for (int s = 0; s < ns; s++) {
        char pos[16];
        snprintf(pos, sizeof pos, "p%d", s);
        e[0] = 0;
        append_term(e, sizeof e, pos, strides[s]);
        if (pads[s])
            snprintf(e + strlen(e), sizeof e - strlen(e), " - %lld", (long long)pads[s]);
        str_printf(b, "int64_t start%d = %s;\n", s, e);
    }
    char acc[32] = "acc", top[384];
    if (vec)
        snprintf(acc, sizeof acc, "acc[q]");
    float_literal(is_max ? -INFINITY : 0, e, sizeof e);
    if (vec)
        str_printf(b, "float *acc = %s + i * %lld;\nfor (int64_t q = 0; q < %lld; q++)\n    acc[q] = %s;\n", yn,
                   (long long)y.c, (long long)y.c, e);
    else
        str_printf(b, "float acc = %s;\n", e);
    if (!is_max) {
        /* the divisor: the window clipped to the input, or to the padded input */
        str_printf(b, "int64_t count = 1;\n");
        for (int s = 0; s < ns; s++) {
            long long end = count_pad ? x.sp[s] + pads[ns + s] : x.sp[s], kn = kernel[s];
            if (count_pad)
                str_printf(b, "count *= (start%d + %lld < %lld ? start%d + %lld : %lld) - start%d;\n", s, kn,
                           end, s, kn, end, s);
            else
                str_printf(b,
                           "count *= (start%d + %lld < %lld ? start%d + %lld : %lld) - (start%d > 0 ? "
                           "start%d : 0);\n",
                           s, kn, end, s, kn, end, s, s);
        }
    }
    for (int s = 0; s < ns; s++) {
        int ind = 4 * s;
        str_printf(b, "%*sfor (int64_t k%d = 0; k%d < %lld; k%d++) {\n", ind, "", s, s, (long long)kernel[s],
                   s);
        if (dil[s] == 1)
            str_printf(b, "%*s    int64_t in%d = start%d + k%d;\n", ind, "", s, s, s);
        else
            str_printf(b, "%*s    int64_t in%d = start%d + k%d * %lld;\n", ind, "", s, s, s,
                       (long long)dil[s]);
        str_printf(b, "%*s    if (in%d < 0 || in%d >= %lld)\n%*s        continue;\n", ind, "", s, s,
                   (long long)x.sp[s], ind, "");
    }
    x_offset(&x, e, sizeof e);
    int ind = 4 * ns;
    if (vec) {
        str_printf(b, "%*sconst float *row = %s + %s;\n%*sfor (int64_t q = 0; q < %lld; q++) {\n", ind, "", xn, e,
                   ind, "", (long long)y.c);
        snprintf(top, sizeof top, "row[q]");
        ind += 4;
    } else {
        snprintf(top, sizeof top, "%s[%s]", xn, e);
    }
    if (is_max)
        str_printf(b, "%*sfloat v = %s;\n%*s%s = v != v || v > %s ? v : %s;\n", ind, "", top, ind, "", acc, acc,
                   acc);
    else
        str_printf(b, "%*s%s += %s;\n", ind, "", acc, top);
    if (vec)
        str_printf(b, "%*s}\n", ind - 4, "");
    for (int s = ns - 1; s >= 0; s--)
        str_printf(b, "%*s}\n", 4 * s, "");
    if (vec && !is_max)
        str_printf(b, "for (int64_t q = 0; q < %lld; q++)\n    acc[q] = acc[q] / (float)count;\n", (long long)y.c);
    else if (!vec)
        str_printf(b, "%s[i] = %s;\n", yn, is_max ? "acc" : "acc / (float)count");
    return 0;
}

/* ---- global_avg_pool ---- */

int lower_global_avg_pool(Program *p, const Node *n, Diag *d) {
    bool nhwc = layout_is_nhwc(n);
    View x = view_of(&p->g->values[n->in[0]].type, nhwc);
    int64_t count = 1;
    for (int s = 0; s < x.ns; s++)
        count *= x.sp[s];
    Kernel *k = loop_over_output(p, n, count, d);
    if (!k)
        return -1;
    char xn[80], yn[80];
    snprintf(xn, sizeof xn, "%s", value_name(p, n->in[0]));
    snprintf(yn, sizeof yn, "%s", value_name(p, n->out[0]));
    /* y is [N, C] in both layouts: iteration i is (b, c) = (i / C, i % C) */
    char at[128];
    if (nhwc)
        snprintf(at, sizeof at, "i / %lld * %lld + i %% %lld + q * %lld", (long long)x.c, (long long)x.sn,
                 (long long)x.c, (long long)x.c);
    else
        snprintf(at, sizeof at, "i * %lld + q", (long long)count);
    str_printf(&k->body,
               "double sum = 0.0;\n"
               "for (int64_t q = 0; q < %lld; q++)\n"
               "    sum += %s[%s];\n"
               "%s[i] = (float)(sum / %lld.0);\n",
               (long long)count, xn, at, yn, (long long)count);
    return 0;
}

/* ---- adaptive_avg_pool ---- */

int lower_adaptive_avg_pool(Program *p, const Node *n, Diag *d) {
    bool nhwc = layout_is_nhwc(n);
    View x = view_of(&p->g->values[n->in[0]].type, nhwc), y = view_of(&p->g->values[n->out[0]].type, nhwc);
    int ns = x.ns;
    int64_t window = 1;
    for (int s = 0; s < ns; s++)
        window *= (x.sp[s] + y.sp[s] - 1) / y.sp[s] + 1;
    Kernel *k = loop_over_output(p, n, window, d);
    if (!k)
        return -1;
    char xn[80], yn[80], e[256];
    snprintf(xn, sizeof xn, "%s", value_name(p, n->in[0]));
    snprintf(yn, sizeof yn, "%s", value_name(p, n->out[0]));
    Str *b = &k->body;
    emit_output_index(b, &y, nhwc);
    str_printf(b, "float acc = 0.0f;\nint64_t count = 1;\n");
    for (int s = 0; s < ns; s++) {
        long long in = x.sp[s], out = y.sp[s];
        str_printf(b, "int64_t start%d = p%d * %lld / %lld, end%d = ((p%d + 1) * %lld + %lld) / %lld;\n", s,
                   s, in, out, s, s, in, out - 1, out);
        str_printf(b, "count *= end%d - start%d;\n", s, s);
    }
    for (int s = 0; s < ns; s++)
        str_printf(b, "%*sfor (int64_t in%d = start%d; in%d < end%d; in%d++)\n", 4 * s, "", s, s, s, s, s);
    x_offset(&x, e, sizeof e);
    str_printf(b, "%*sacc += %s[%s];\n", 4 * ns, "", xn, e);
    str_printf(b, "%s[i] = acc / (float)count;\n", yn);
    return 0;
}
