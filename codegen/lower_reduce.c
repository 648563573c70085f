/* Lowering of the reductions and normalizations: sum, mean, reduce_max, softmax,
 * log_softmax, batch_norm and layer_norm.
 *
 * Each is one LOOP kernel, built as kernel IR. A reduction gives an iteration to
 * each result: x is seen as runs of dims, adjacent dims that are all reduced or all
 * kept merged into one run (dims of size 1 dropped), so the result's flat index
 * maps to its first input element through the kept runs' constant strides, and the
 * reduced runs become nested `for` loops in the body. softmax and layer_norm give
 * an iteration to each row (one position of every other dim) and make the
 * reference's passes over it: the max (softmax) or the mean (layer_norm) first, so
 * that large inputs neither overflow nor cancel. batch_norm is elementwise: each
 * element finds its channel and computes that channel's scale / sqrt(var + eps)
 * from the params. Sums accumulate in double, as the interpreter does (each float
 * converted before it is added); everything else is float. A sum along a contiguous
 * row keeps eight partial sums, element j in sum j % 8, added pairwise at the end:
 * one chain of dependent adds would be 8 times slower, and the C compiler may not
 * reorder it itself. */
#include "codegen.h"
#include "../ir/ops_impl.h"

#include <math.h>

enum { REDUCE_WORK = 16384 }; /* input elements worth giving a thread */

static Kernel *new_loop(Program *p, const Node *n, int64_t count, int64_t work_per_iteration, Diag *d) {
    int64_t grain = work_per_iteration >= REDUCE_WORK ? 1 : REDUCE_WORK / work_per_iteration;
    Kernel *k = kernel_loop(p, n, NULL, count, grain, d);
    if (k) /* results and rows in order, the symbolic dim's outermost (never reduced) */
        kernel_follows(p, k, &p->g->values[n->out[0]].type, count, 1, 1);
    return k;
}

/* for (NAME = 0; NAME < count; NAME++), opened; returns NAME as an expression. */
static KExpr *open_loop(KBuilder *b, const char *name, int64_t count) {
    return k_var(b, kb_for(b, name, KT_I64, k_int(b, 0), k_int(b, count), NULL, 0));
}

/* base + var * stride, the index of a loop's element. */
static KExpr *step(KBuilder *b, KExpr *base, KExpr *var, int64_t stride) {
    return k_add(b, base, k_mul(b, var, k_int(b, stride)));
}

/* (double)x, as C converts a float added to a double. */
static KExpr *widen(KBuilder *b, KExpr *x) {
    return k_cast(b, KT_F64, x);
}

enum { SUM_LANES = 8 };

/* The double sum of the `count` elements of xs from `row` on, each widened, or of
 * their squared distances from `center` when it is given: in SUM_LANES partial sums
 * (the array lanes_name), the elements after the last whole group of lanes added
 * last. The sum is the variable `name`. */
static KExpr *row_sum(KBuilder *b, const char *name, const char *lanes_name, int xs, KExpr *row,
                      int64_t count, KExpr *center) {
    int64_t whole = count >= 2 * SUM_LANES ? count / SUM_LANES * SUM_LANES : 0;
    KExpr *total = k_f64(b, 0);
    if (whole > 0) {
        int lanes = kb_array(b, lanes_name, KT_F64, SUM_LANES, 0, false, true);
        KExpr *group = k_var(b, kb_for(b, "j", KT_I64, k_int(b, 0), k_int(b, whole), k_int(b, SUM_LANES), 0));
        KExpr *lane = open_loop(b, "l", SUM_LANES);
        kb_unroll(b, SUM_LANES);
        KExpr *x = widen(b, k_load(b, xs, k_add(b, row, k_add(b, group, lane))));
        kb_store_add(b, lanes, lane, center ? k_mul(b, k_sub(b, x, center), k_sub(b, x, center)) : x);
        kb_end(b);
        kb_end(b);
        KExpr *part[SUM_LANES];
        for (int l = 0; l < SUM_LANES; l++)
            part[l] = k_load(b, lanes, k_int(b, l));
        for (int width = SUM_LANES / 2; width >= 1; width /= 2)
            for (int l = 0; l < width; l++)
                part[l] = k_add(b, part[l], part[l + width]);
        total = part[0];
    }
    int sum = kb_decl(b, name, KT_F64, total);
    if (whole < count) {
        KExpr *j = k_var(b, kb_for(b, "j", KT_I64, k_int(b, whole), k_int(b, count), NULL, 0));
        KExpr *x = widen(b, k_load(b, xs, k_add(b, row, j)));
        kb_accum(b, sum, center ? k_mul(b, k_sub(b, x, center), k_sub(b, x, center)) : x);
        kb_end(b);
    }
    return k_var(b, sum);
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

enum { COLUMN_BLOCK = 16 };

/* The columns of each of `outer` [rows, cols] matrices of x summed down its rows: a
 * reduction over dims before the last ones and after the first ones, such as a
 * batch norm's statistics or a global mean with channels last. An iteration per
 * block of adjacent columns (COLUMN_BLOCK, or the largest power of two below it
 * dividing cols) walks the rows once, its sums in a local array, and so reads each
 * cache line of x once, where an iteration per result would read a float from
 * every line. Each column adds its rows in order, as that loop does. The C target's:
 * CUDA's threads of the loop per result read adjacent columns together already. */
static int column_sums(Program *p, const Node *n, int64_t outer, int64_t rows, int64_t cols, Diag *d) {
    int64_t block = COLUMN_BLOCK;
    while (cols % block)
        block /= 2;
    Kernel *k = new_loop(p, n, outer * (cols / block), rows * block, d);
    if (!k)
        return -1;
    KBuilder *b = &k->b;
    int xs = kb_value(b, n->in[0], false), ys = kb_value(b, n->out[0], true);
    KExpr *i = k_var(b, k->iter), *blocks = k_int(b, cols / block);
    KExpr *first = k_var(b, kb_let(b, "first", KT_I64, k_mul(b, k_mod(b, i, blocks), k_int(b, block))));
    KExpr *matrix = k_var(b, kb_let(b, "matrix", KT_I64, k_div(b, i, blocks)));
    int acc = kb_array(b, "acc", KT_F64, block, 0, false, true);
    KExpr *row = k_madd(b, k_madd(b, matrix, rows, open_loop(b, "r", rows)), cols, first);
    KExpr *lane = k_var(b, kb_for(b, "l", KT_I64, k_int(b, 0), k_int(b, block), NULL, K_VECTOR));
    kb_store_add(b, acc, lane, widen(b, k_load(b, xs, k_add(b, row, lane))));
    kb_end(b);
    kb_end(b);
    lane = open_loop(b, "l", block);
    KExpr *sum = k_load(b, acc, lane);
    if (n->op == OP_MEAN)
        sum = k_div(b, sum, k_f64(b, (double)rows));
    kb_store(b, ys, k_madd(b, matrix, cols, k_add(b, first, lane)), k_cast(b, KT_F32, sum));
    kb_end(b);
    return 0;
}

/* The loop variables of the reduced runs, r0 the outermost. */
static const char *const run_vars[KILN_MAX_RANK] = {"r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7"};

int lower_reduce(Program *p, const Node *n, Diag *d) {
    const Type *x = &p->g->values[n->in[0]].type;
    bool reduced[KILN_MAX_RANK];
    reduced_dims(n, x, reduced);
    Run runs[KILN_MAX_RANK];
    int n_runs = runs_of(x, reduced, runs);
    int64_t group = 1, results = 1;
    for (int r = 0; r < n_runs; r++)
        *(runs[r].reduced ? &group : &results) *= runs[r].size;
    bool column = p->target == TARGET_C && n->op != OP_REDUCE_MAX && n_runs >= 2 && n_runs <= 3 &&
                  !runs[n_runs - 1].reduced && runs[n_runs - 2].reduced;
    if (column)
        return column_sums(p, n, n_runs == 3 ? runs[0].size : 1, group, runs[n_runs - 1].size, d);
    Kernel *k = new_loop(p, n, results, group, d);
    if (!k)
        return -1;
    KBuilder *b = &k->b;
    KExpr *i = k_var(b, k->iter);
    /* the first element of result i: its kept runs unraveled from i */
    KExpr *first = k_int(b, 0);
    int64_t after = results; /* results per step of the current kept run */
    for (int r = 0; r < n_runs; r++) {
        if (runs[r].reduced)
            continue;
        after /= runs[r].size;
        KExpr *at = k_div(b, i, k_int(b, after));
        if (after * runs[r].size < results)
            at = k_mod(b, at, k_int(b, runs[r].size));
        first = step(b, first, at, runs[r].stride);
    }
    KExpr *start = first->kind == KE_INT ? first : k_var(b, kb_let(b, "first", KT_I64, first));
    bool is_max = n->op == OP_REDUCE_MAX;
    int xs = kb_value(b, n->in[0], false), ys = kb_value(b, n->out[0], true);
    if (!is_max && n_runs > 0 && runs[n_runs - 1].reduced && runs[n_runs - 1].stride == 1 &&
        group == runs[n_runs - 1].size) {
        /* one contiguous run */
        KExpr *sum = row_sum(b, "acc", "acc_lanes", xs, start, group, NULL);
        KExpr *result = n->op == OP_MEAN ? k_div(b, sum, k_f64(b, (double)group)) : sum;
        kb_store(b, ys, i, k_cast(b, KT_F32, result));
        return 0;
    }
    int acc =
        is_max ? kb_decl(b, "acc", KT_F32, k_f32(b, -INFINITY)) : kb_decl(b, "acc", KT_F64, k_f64(b, 0));
    /* one loop per reduced run, r0 outermost */
    int depth = 0;
    KExpr *at = start;
    for (int r = 0; r < n_runs; r++) {
        if (!runs[r].reduced)
            continue;
        at = step(b, at, open_loop(b, run_vars[depth], runs[r].size), runs[r].stride);
        depth++;
    }
    KExpr *element = k_load(b, xs, at);
    KExpr *result;
    if (is_max) {
        /* NaN wins, as in the reference: once acc is NaN nothing is greater */
        KExpr *v = k_var(b, kb_let(b, "v", KT_F32, element)), *a = k_var(b, acc);
        kb_if(b, k_bin(b, KE_OR, k_bin(b, KE_NE, v, v), k_bin(b, KE_GT, v, a)));
        kb_assign(b, acc, v);
        kb_end(b);
        result = k_var(b, acc);
    } else {
        kb_accum(b, acc, widen(b, element));
        result = k_var(b, acc);
        if (n->op == OP_MEAN)
            result = k_div(b, result, k_f64(b, (double)group));
    }
    while (depth-- > 0)
        kb_end(b);
    kb_store(b, ys, i, k_cast(b, KT_F32, result));
    return 0;
}

/* ---- softmax, log_softmax ---- */

/* Where row i of x, walked as [outer, len, inner], starts: at element (i / inner,
 * 0, i % inner); its element j is inner elements after element j - 1. */
static KExpr *row_start(KBuilder *b, KExpr *i, int64_t outer, int64_t len, int64_t inner) {
    if (inner == 1)
        return k_mul(b, i, k_int(b, len));
    if (outer == 1)
        return i;
    return k_madd(b, k_div(b, i, k_int(b, inner)), len * inner, k_mod(b, i, k_int(b, inner)));
}

/* exp(x - max), with the exp of a non-positive argument that vectorizes
 * (runtime/kernel_math.h) */
static KExpr *exp_shifted(KBuilder *b, KExpr *x, int max) {
    KExpr *shifted = k_sub(b, x, k_var(b, max));
    return k_call(b, KT_F32, "kiln_expf_nonpositive", 1, &shifted);
}

int lower_softmax(Program *p, const Node *n, Diag *d) {
    const Type *x = &p->g->values[n->in[0]].type;
    int axis = norm_axis(node_int(n, ATTR_AXIS), x->rank);
    int64_t outer, len = x->dims[axis], inner;
    split_at_axis(x, axis, &outer, &inner);
    Kernel *k = new_loop(p, n, outer * inner, len, d);
    if (!k)
        return -1;
    KBuilder *b = &k->b;
    int xs = kb_value(b, n->in[0], false), ys = kb_value(b, n->out[0], true);
    KExpr *first = row_start(b, k_var(b, k->iter), outer, len, inner);
    KExpr *row = k_var(b, kb_let(b, "row", KT_I64, first));
    /* NaN is skipped by the max, but reaches every result through the sum */
    int max = kb_decl(b, "max", KT_F32, k_f32(b, -INFINITY));
    KExpr *at = step(b, row, open_loop(b, "j", len), inner);
    KExpr *xj = k_load(b, xs, at);
    kb_assign(b, max, k_select(b, k_bin(b, KE_GT, xj, k_var(b, max)), xj, k_var(b, max)));
    kb_end(b);
    int sum = kb_decl(b, "sum", KT_F64, k_f64(b, 0));
    if (n->op == OP_SOFTMAX) {
        at = step(b, row, open_loop(b, "j", len), inner);
        kb_store(b, ys, at, exp_shifted(b, k_load(b, xs, at), max));
        kb_accum(b, sum, widen(b, k_load(b, ys, at)));
        kb_end(b);
        KExpr *inverse = k_cast(b, KT_F32, k_div(b, k_f64(b, 1), k_var(b, sum)));
        KExpr *scale = k_var(b, kb_let(b, "scale", KT_F32, inverse));
        at = step(b, row, open_loop(b, "j", len), inner);
        kb_store(b, ys, at, k_mul(b, k_load(b, ys, at), scale));
        kb_end(b);
    } else {
        at = step(b, row, open_loop(b, "j", len), inner);
        kb_accum(b, sum, widen(b, exp_shifted(b, k_load(b, xs, at), max)));
        kb_end(b);
        KExpr *total = k_var(b, sum);
        KExpr *log_sum =
            k_var(b, kb_let(b, "log_sum", KT_F32, k_cast(b, KT_F32, k_call(b, KT_F64, "log", 1, &total))));
        at = step(b, row, open_loop(b, "j", len), inner);
        kb_store(b, ys, at, k_sub(b, k_sub(b, k_load(b, xs, at), k_var(b, max)), log_sum));
        kb_end(b);
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
    KBuilder *b = &k->b;
    KExpr *i = k_var(b, k->iter);
    /* the channel: the run's (nchw), or j (nhwc) */
    KExpr *run_channel = inner > 1 ? k_var(b, kb_let(b, "c", KT_I64, k_mod(b, i, k_int(b, channels)))) : NULL;
    KExpr *j = open_loop(b, "j", run), *ch = run_channel ? run_channel : j;
    KExpr *var = k_add(b, k_load(b, kb_value(b, n->in[4], false), ch), k_f32(b, node_float(n, ATTR_EPSILON)));
    KExpr *root = k_call(b, KT_F32, "sqrtf", 1, &var);
    KExpr *scale =
        k_var(b, kb_let(b, "scale", KT_F32, k_div(b, k_load(b, kb_value(b, n->in[1], false), ch), root)));
    KExpr *at = k_madd(b, i, run, j);
    KExpr *centered =
        k_sub(b, k_load(b, kb_value(b, n->in[0], false), at), k_load(b, kb_value(b, n->in[3], false), ch));
    kb_store(b, kb_value(b, n->out[0], true), at,
             k_add(b, k_mul(b, centered, scale), k_load(b, kb_value(b, n->in[2], false), ch)));
    kb_end(b);
    return 0;
}

/* ---- layer_norm ---- */

/* The element of an optional scale or bias t for position j of the normalized
 * shape: j itself when t has that shape, else through norm's multi-index idx. */
static KExpr *norm_operand(KBuilder *b, const Program *p, int v, const Type *norm, KExpr *j,
                           KExpr *const *idx) {
    const Type *t = &p->g->values[v].type;
    KExpr *at = j;
    if (!type_equal(t, norm)) {
        KView view = kview_broadcast(t, norm);
        at = kview_index(b, &view, idx);
    }
    return k_load(b, kb_value(b, v, false), at);
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
    KBuilder *b = &k->b;
    int xs = kb_value(b, n->in[0], false);
    KExpr *row = k_var(b, kb_let(b, "row", KT_I64, k_mul(b, k_var(b, k->iter), k_int(b, size))));
    KExpr *count = k_f64(b, (double)size);
    KExpr *mean = k_var(
        b, kb_let(b, "mean", KT_F64, k_div(b, row_sum(b, "sum", "sum_lanes", xs, row, size, NULL), count)));
    KExpr *var = row_sum(b, "var", "var_lanes", xs, row, size, mean);
    KExpr *m = k_var(b, kb_let(b, "m", KT_F32, k_cast(b, KT_F32, mean)));
    KExpr *spread = k_add(b, k_div(b, var, count), k_f64(b, node_float(n, ATTR_EPSILON)));
    KExpr *rstd =
        k_var(b, kb_let(b, "rstd", KT_F32,
                        k_cast(b, KT_F32, k_div(b, k_f64(b, 1), k_call(b, KT_F64, "sqrt", 1, &spread)))));
    KExpr *j = open_loop(b, "j", size), *idx[KILN_MAX_RANK];
    bool broadcast = (scale >= 0 && !type_equal(&p->g->values[scale].type, &norm)) ||
                     (bias >= 0 && !type_equal(&p->g->values[bias].type, &norm));
    if (broadcast)
        kb_unravel(b, j, &norm, "n", idx);
    KExpr *y = k_mul(b, k_sub(b, k_load(b, xs, k_add(b, row, j)), m), rstd);
    if (scale >= 0)
        y = k_mul(b, y, norm_operand(b, p, scale, &norm, j, idx));
    if (bias >= 0)
        y = k_add(b, y, norm_operand(b, p, bias, &norm, j, idx));
    kb_store(b, kb_value(b, n->out[0], true), k_add(b, row, j), y);
    kb_end(b);
    return 0;
}

/* ---- argmax, cumsum: one iteration per line along the axis ---- */

/* argmax keeps the first largest (a NaN, once met, stays the largest), as
 * torch.argmax, or with select_last the first from the end; cumsum adds in double for f32 (rounding each
 * running sum once, as the interpreter does) and in the integer type otherwise, storing before the add when
 * exclusive. */
int lower_scan(Program *p, const Node *n, Diag *d) {
    const Type *x = &p->g->values[n->in[0]].type;
    int axis = norm_axis(node_int(n, ATTR_AXIS), x->rank > 0 ? x->rank : 1);
    int64_t outer = 1, inner = 1, dim = x->rank ? x->dims[axis] : 1;
    if (x->rank)
        split_at_axis(x, axis, &outer, &inner);
    Kernel *k = new_loop(p, n, outer * inner, dim, d);
    if (!k)
        return -1;
    KBuilder *b = &k->b;
    KExpr *i = k_var(b, k->iter);
    KExpr *base = k_var(b, kb_let(b, "base", KT_I64,
                                  k_add(b, k_mul(b, k_div(b, i, k_int(b, inner)), k_int(b, dim * inner)),
                                        k_mod(b, i, k_int(b, inner)))));
    int xb = kb_value(b, n->in[0], false), yb = kb_value(b, n->out[0], true);
    if (n->op == OP_ARGMAX) {
        /* select_last: the same scan from the end */
        bool last = node_bool(n, ATTR_SELECT_LAST);
        int64_t first = last ? dim - 1 : 0;
        int best = kb_decl(b, "best", KT_F32, k_load(b, xb, k_add(b, base, k_int(b, first * inner)))),
            at = kb_decl(b, "at", KT_I64, k_int(b, first));
        KExpr *s = k_var(b, kb_for(b, "s", KT_I64, k_int(b, 1), k_int(b, dim), NULL, 0));
        if (last)
            s = k_var(b, kb_let(b, "r", KT_I64, k_sub(b, k_int(b, dim - 1), s)));
        KExpr *v =
            k_var(b, kb_let(b, "v", KT_F32, k_load(b, xb, k_add(b, base, k_mul(b, s, k_int(b, inner))))));
        KExpr *best_is_nan = k_bin(b, KE_NE, k_var(b, best), k_var(b, best));
        kb_if(b, k_and(b, k_not(b, best_is_nan),
                       k_bin(b, KE_OR, k_bin(b, KE_NE, v, v), k_bin(b, KE_GT, v, k_var(b, best)))));
        kb_assign(b, best, v);
        kb_assign(b, at, s);
        kb_end(b);
        kb_end(b);
        kb_store(b, yb, i, k_var(b, at));
        return 0;
    }
    KType t = dtype_ktype(x->dtype), acc_t = t == KT_F32 ? KT_F64 : t;
    int acc = kb_decl(b, "acc", acc_t,
                      acc_t == KT_F64   ? k_f64(b, 0)
                      : acc_t == KT_I32 ? k_i32(b, 0)
                                        : k_int(b, 0));
    KExpr *s = k_var(b, kb_for(b, "s", KT_I64, k_int(b, 0), k_int(b, dim), NULL, 0));
    if (node_bool(n, ATTR_REVERSE))
        s = k_sub(b, k_int(b, dim - 1), s);
    KExpr *at = k_var(b, kb_let(b, "at", KT_I64, k_add(b, base, k_mul(b, s, k_int(b, inner)))));
    KExpr *v = k_load(b, xb, at);
    bool exclusive = node_bool(n, ATTR_EXCLUSIVE);
    KExpr *sum = k_var(b, acc);
    if (exclusive)
        kb_store(b, yb, at, acc_t == t ? sum : k_cast(b, t, sum));
    kb_accum(b, acc, acc_t == t ? v : k_cast(b, acc_t, v));
    if (!exclusive)
        kb_store(b, yb, at, acc_t == t ? sum : k_cast(b, t, sum));
    kb_end(b);
    return 0;
}
