/* Linear algebra: matmul, gemm, linear and attention.
 *
 * matmul, gemm and linear are dot products of rows with columns, accumulated in double and rounded
 * once per result. matmul follows numpy: a 1-D a is the row [1, K] and a 1-D b the
 * column [K, 1], the dim so added is dropped from the result, and the dims before the
 * last two broadcast. The kernels reach a row or a column through a stride, so the
 * transposes (gemm's trans_a and trans_b, linear's w) are never materialized. */
#include "ops_impl.h"

#include <math.h>

/* sum_k a[k * sa] * b[k * sb], in double. */
static double dot(const float *a, int64_t sa, const float *b, int64_t sb, int64_t len) {
    double s = 0;
    for (int64_t k = 0; k < len; k++)
        s += (double)a[k * sa] * b[k * sb];
    return s;
}

/* ---- matmul ---- */

/* An operand of matmul as a stack of matrices: a 1-D a is a row, a 1-D b a column. */
static Type as_matrices(const Type *t, bool is_b) {
    if (t->rank != 1)
        return *t;
    int64_t dims[2] = {is_b ? t->dims[0] : 1, is_b ? 1 : t->dims[0]};
    return type_make(2, dims);
}

/* The broadcast batch dims (all but the last two) of the matrix stacks a and b. */
static bool batch_dims(const Type *a, const Type *b, Type *batch) {
    Type ba = type_make(a->rank - 2, a->dims), bb = type_make(b->rank - 2, b->dims);
    return broadcast_types(&ba, &bb, batch);
}

int infer_matmul(Graph *g, Node *n, Diag *d) {
    const Type *a = in_type(g, n, 0), *b = in_type(g, n, 1);
    if (a->rank < 1 || b->rank < 1)
        return diag_error(d, n->loc, "matmul: operands need at least one dimension, got a %s and b %s",
                          tstr(a), tstr(b));
    Type ma = as_matrices(a, false), mb = as_matrices(b, true), out;
    int64_t k_a = ma.dims[ma.rank - 1], k_b = mb.dims[mb.rank - 2];
    if (k_a != k_b)
        return diag_error(d, n->loc, "matmul: a %s has %lld columns but b %s has %lld rows", tstr(a),
                          (long long)k_a, tstr(b), (long long)k_b);
    if (!batch_dims(&ma, &mb, &out))
        return diag_error(d, n->loc, "matmul: the batch dims of a %s and b %s cannot be broadcast together",
                          tstr(a), tstr(b));
    if (a->rank > 1)
        out.dims[out.rank++] = ma.dims[ma.rank - 2];
    if (b->rank > 1)
        out.dims[out.rank++] = mb.dims[mb.rank - 1];
    set_out_type(g, n, 0, out);
    return 0;
}

int eval_matmul(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    (void)n, (void)d;
    Type ma = as_matrices(&in[0]->type, false), mb = as_matrices(&in[1]->type, true), batch;
    batch_dims(&ma, &mb, &batch);
    int64_t m_len = ma.dims[ma.rank - 2], k_len = ma.dims[ma.rank - 1], n_len = mb.dims[mb.rank - 1];
    /* strides in whole matrices, 0 along a broadcast batch dim */
    Type ba = type_make(ma.rank - 2, ma.dims), bb = type_make(mb.rank - 2, mb.dims);
    int64_t sa[KILN_MAX_RANK], sb[KILN_MAX_RANK], idx[KILN_MAX_RANK] = {0};
    broadcast_strides(&ba, &batch, sa);
    broadcast_strides(&bb, &batch, sb);
    int64_t count = type_numel(&batch);
    /* the result's dropped dims have size 1, so it is laid out as [batch, M, N] */
    float *y = out[0]->data;
    for (int64_t i = 0; i < count; i++) {
        int64_t ia = 0, ib = 0;
        for (int k = 0; k < batch.rank; k++) {
            ia += idx[k] * sa[k];
            ib += idx[k] * sb[k];
        }
        const float *a = in[0]->data + ia * m_len * k_len, *b = in[1]->data + ib * k_len * n_len;
        for (int64_t r = 0; r < m_len; r++)
            for (int64_t c = 0; c < n_len; c++)
                y[(i * m_len + r) * n_len + c] = (float)dot(a + r * k_len, 1, b + c, n_len, k_len);
        next_index(idx, batch.dims, batch.rank);
    }
    return 0;
}

/* ---- gemm ---- */

int infer_gemm(Graph *g, Node *n, Diag *d) {
    const Type *a = in_type(g, n, 0), *b = in_type(g, n, 1), *c = in_type(g, n, 2);
    if (a->rank != 2 || b->rank != 2)
        return diag_error(d, n->loc, "gemm: a and b must be 2-D, got a %s and b %s", tstr(a), tstr(b));
    bool ta = node_bool(n, ATTR_TRANS_A), tb = node_bool(n, ATTR_TRANS_B);
    int64_t m_len = a->dims[ta], k_a = a->dims[!ta], k_b = b->dims[tb], n_len = b->dims[!tb];
    if (k_a != k_b)
        return diag_error(d, n->loc, "gemm: op(a) is %lld x %lld but op(b) is %lld x %lld (a %s%s, b %s%s)",
                          (long long)m_len, (long long)k_a, (long long)k_b, (long long)n_len, tstr(a),
                          ta ? " transposed" : "", tstr(b), tb ? " transposed" : "");
    int64_t dims[2] = {m_len, n_len};
    Type out = type_make(2, dims);
    if (c && !broadcasts_to(c, &out))
        return diag_error(d, n->loc, "gemm: c %s does not broadcast to the result %s", tstr(c), tstr(&out));
    set_out_type(g, n, 0, out);
    return 0;
}

int eval_gemm(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    (void)d;
    const Type *at = &in[0]->type, *bt = &in[1]->type, *ty = &out[0]->type;
    bool ta = node_bool(n, ATTR_TRANS_A), tb = node_bool(n, ATTR_TRANS_B);
    double alpha = node_float(n, ATTR_ALPHA), beta = node_float(n, ATTR_BETA);
    int64_t m_len = ty->dims[0], n_len = ty->dims[1], k_len = at->dims[!ta];
    /* op(a)[r, k] = a[r * a_row + k * a_k]; op(b)[k, c] = b[k * b_k + c * b_col] */
    int64_t a_row = ta ? 1 : at->dims[1], a_k = ta ? at->dims[1] : 1;
    int64_t b_k = tb ? 1 : bt->dims[1], b_col = tb ? bt->dims[1] : 1;
    /* a trailing absent input is dropped from the node, so in[] may be shorter */
    const Tensor *c = n->n_in > 2 ? in[2] : NULL;
    int64_t cs[2];
    if (c)
        broadcast_strides(&c->type, ty, cs);
    for (int64_t r = 0; r < m_len; r++)
        for (int64_t col = 0; col < n_len; col++) {
            double y = alpha * dot(in[0]->data + r * a_row, a_k, in[1]->data + col * b_col, b_k, k_len);
            if (c)
                y += beta * c->data[r * cs[0] + col * cs[1]];
            out[0]->data[r * n_len + col] = (float)y;
        }
    return 0;
}

/* ---- linear ---- */

/* ---- attention ---- */

double attention_scale(const Node *n, const Type *q) {
    return node_has(n, ATTR_SCALE) ? node_float(n, ATTR_SCALE) : 1 / sqrt((double)q->dims[q->rank - 1]);
}

/* The scores' type: q [..., L, E] with E replaced by k's S. */
static Type attention_scores(const Type *q, const Type *k) {
    Type t = *q;
    t.dims[t.rank - 1] = k->dims[k->rank - 2];
    return t;
}

int infer_attention(Graph *g, Node *n, Diag *d) {
    const Type *q = in_type(g, n, 0), *k = in_type(g, n, 1), *v = in_type(g, n, 2), *mask = in_type(g, n, 3);
    const Type *qkv[3] = {q, k, v};
    static const char *const roles[3] = {"q", "k", "v"};
    const char *name[4];
    for (int i = 0; i < n->n_in; i++)
        name[i] = g->values[n->in[i]].name;
    for (int i = 0; i < 3; i++)
        if (qkv[i]->dtype != DT_F32)
            return diag_error(d, n->loc, "attention: %s '%s' is %s; q, k and v must be f32", roles[i],
                              name[i], tstr(qkv[i]));
    int r = q->rank;
    if (r < 2 || k->rank != r || v->rank != r)
        return diag_error(
            d, n->loc, "attention: q '%s' is %s, k '%s' %s, v '%s' %s; they must have one rank, at least 2",
            name[0], tstr(q), name[1], tstr(k), name[2], tstr(v));
    for (int i = 0; i < r - 2; i++)
        if (k->dims[i] != q->dims[i] || v->dims[i] != q->dims[i])
            return diag_error(d, n->loc,
                              "attention: q '%s' is %s, k '%s' %s, v '%s' %s; their batch dims differ",
                              name[0], tstr(q), name[1], tstr(k), name[2], tstr(v));
    if (k->dims[r - 1] != q->dims[r - 1])
        return diag_error(d, n->loc, "attention: q '%s' is %s, k '%s' %s; they must end in the same E",
                          name[0], tstr(q), name[1], tstr(k));
    if (v->dims[r - 2] != k->dims[r - 2])
        return diag_error(d, n->loc, "attention: k '%s' is %s, v '%s' %s; they must have the same S (dim -2)",
                          name[1], tstr(k), name[2], tstr(v));
    Type scores = attention_scores(q, k);
    if (mask) {
        if (mask->dtype != DT_F32 && mask->dtype != DT_BOOL)
            return diag_error(d, n->loc,
                              "attention: the mask '%s' is %s; it must be f32 (added) or bool (true: attend)",
                              name[3], tstr(mask));
        bool fits = mask->rank <= r;
        for (int i = 0; fits && i < mask->rank; i++) {
            int64_t m = mask->dims[mask->rank - 1 - i];
            fits = m == 1 || m == scores.dims[r - 1 - i];
        }
        if (!fits)
            return diag_error(d, n->loc, "attention: the mask '%s' %s does not broadcast to the scores %s",
                              name[3], tstr(mask), tstr(&scores));
        if (node_bool(n, ATTR_IS_CAUSAL))
            return diag_error(d, n->loc, "attention: a mask and is_causal cannot be given together");
    }
    Type out = *q;
    out.dims[r - 1] = v->dims[r - 1];
    set_out_type(g, n, 0, out);
    return 0;
}

/* Each row of scores in double, softmax, then the weighted sum of v's rows. A row
 * whose every position is masked gives NaN, as softmax over nothing does in torch. */
int eval_attention(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    const Type *q = &in[0]->type, *k = &in[1]->type, *v = &in[2]->type;
    const Tensor *mask = n->n_in > 3 ? in[3] : NULL;
    int r = q->rank;
    int64_t len = q->dims[r - 2], e_len = q->dims[r - 1], s_len = k->dims[r - 2], ev_len = v->dims[r - 1];
    int64_t rows = type_numel(q) / e_len;
    Type scores = attention_scores(q, k);
    int64_t ms[KILN_MAX_RANK] = {0}, idx[KILN_MAX_RANK] = {0};
    if (mask)
        broadcast_strides(&mask->type, &scores, ms);
    double scale = attention_scale(n, q);
    bool causal = node_bool(n, ATTR_IS_CAUSAL);
    double *s = ir_malloc(sizeof *s * (size_t)s_len);
    if (!s)
        return diag_error(d, n->loc, "out of memory");
    for (int64_t row = 0; row < rows; row++) {
        int64_t i = row % len, item = row / len, at = 0;
        for (int x = 0; x < r - 1; x++)
            at += idx[x] * ms[x];
        const float *qr = in[0]->data + row * e_len, *kb = in[1]->data + item * s_len * e_len;
        const float *vb = in[2]->data + item * s_len * ev_len;
        double max = -INFINITY, sum = 0;
        for (int64_t j = 0; j < s_len; j++) {
            double x = dot(qr, 1, kb + j * e_len, 1, e_len) * scale;
            if (mask && mask->type.dtype == DT_BOOL)
                x = mask->b[at + j * ms[r - 1]] ? x : -INFINITY;
            else if (mask)
                x += mask->data[at + j * ms[r - 1]];
            if (causal && j > i)
                x = -INFINITY;
            s[j] = x;
            max = x > max ? x : max;
        }
        for (int64_t j = 0; j < s_len; j++)
            sum += s[j] = exp(s[j] - max);
        for (int64_t c = 0; c < ev_len; c++) {
            double acc = 0;
            for (int64_t j = 0; j < s_len; j++)
                acc += s[j] * vb[j * ev_len + c];
            out[0]->data[row * ev_len + c] = (float)(acc / sum);
        }
        next_index(idx, scores.dims, r - 1);
    }
    ir_free(s);
    return 0;
}

int infer_linear(Graph *g, Node *n, Diag *d) {
    const Type *x = in_type(g, n, 0), *w = in_type(g, n, 1), *b = in_type(g, n, 2);
    if (w->rank != 2)
        return diag_error(d, n->loc, "linear: w must be 2-D [out_features, in_features], got %s", tstr(w));
    if (x->rank < 1 || x->dims[x->rank - 1] != w->dims[1])
        return diag_error(d, n->loc, "linear: x %s must end in the %lld in_features of w %s", tstr(x),
                          (long long)w->dims[1], tstr(w));
    if (b && (b->rank != 1 || b->dims[0] != w->dims[0]))
        return diag_error(d, n->loc, "linear: b must be f32[%lld], one per out_feature of w %s, got %s",
                          (long long)w->dims[0], tstr(w), tstr(b));
    Type out = *x;
    out.dims[out.rank - 1] = w->dims[0];
    set_out_type(g, n, 0, out);
    return 0;
}

int eval_linear(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    (void)d;
    const Type *x = &in[0]->type;
    int64_t rows = 1, in_len = in[1]->type.dims[1], out_len = in[1]->type.dims[0];
    for (int k = 0; k < x->rank - 1; k++)
        rows *= x->dims[k];
    /* a trailing absent input is dropped from the node, so in[] may be shorter */
    const Tensor *b = n->n_in > 2 ? in[2] : NULL;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t o = 0; o < out_len; o++) {
            double y = dot(in[0]->data + r * in_len, 1, in[1]->data + o * in_len, 1, in_len);
            out[0]->data[r * out_len + o] = (float)(b ? y + b->data[o] : y);
        }
    return 0;
}

/* ---- fused_linear: linear, then an elementwise epilogue ---- */

int infer_fused_linear(Graph *g, Node *n, Diag *d) {
    return infer_linear(g, n, d) ? -1 : infer_epilogue(g, n, d);
}

int eval_fused_linear(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    const Tensor *linear_in[3] = {in[0], in[1], n->n_in > 2 ? in[2] : NULL}; /* in[] has n_in entries */
    return eval_linear(n, linear_in, out, d) ? -1 : eval_epilogue(n, in, out[0], d);
}
