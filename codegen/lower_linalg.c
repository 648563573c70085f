/* Lowering of matmul, gemm and linear: for the C target, each is one CALL kernel
 * around cblas_sgemm; for CUDA, one K_GEMM kernel (each *_gemm function).
 *
 * matmul follows numpy as ir/op_linalg.c does: a 1-D a is the row [1, K] and a 1-D
 * b the column [K, 1], and the dims before the last two broadcast. One sgemm runs
 * per item of the broadcast batch, in a loop whose item i finds its matrices of a
 * and b through constant strides (0 along a broadcast dim); when b is one matrix
 * shared by the whole batch and a is a dense stack, the batch folds into the rows of
 * a single sgemm. gemm's trans_a and trans_b are sgemm's own flags; its c, broadcast
 * to the result, is written first as beta * c and sgemm adds alpha op(a) op(b) to
 * it. linear is x, as [prod(leading dims), in], times w transposed, then the bias
 * added row by row; fused_linear computes its epilogue in that same loop, each
 * element finished as the bias reaches it. Each kernel counts its FLOPs, 2 M N K per
 * GEMM, for kiln bench. */
#include "codegen.h"
#include "../ir/ops_impl.h"

#include <limits.h>
#include <string.h>

enum { GEMV_ROWS = 128, TILE_ROWS = 64 };

static Kernel *new_call(Program *p, const Node *n, Diag *d) {
    Kernel *k = kernel_new(p, n, K_CALL, "sgemm");
    if (!k) {
        diag_error(d, n->loc, "out of memory");
        return NULL;
    }
    for (int i = 0; i < n->n_in; i++)
        if (n->in[i] >= 0)
            kernel_reads(k, n->in[i]);
    kernel_writes(k, n->out[0]);
    return k;
}

/* Appends text with every line indented by four more spaces. */
static void append_indented(Str *s, const Str *text) {
    for (const char *line = text->s; line && *line;) {
        const char *nl = strchr(line, '\n');
        str_printf(s, "    %.*s\n", (int)(nl - line), line);
        line = nl + 1;
    }
    if (text->oom)
        s->oom = true;
}

/* ---- matmul ---- */

/* An operand of matmul as a stack of matrices: a 1-D a is a row, a 1-D b a column. */
static Type as_matrices(const Type *t, bool is_b) {
    if (t->rank != 1)
        return *t;
    int64_t dims[2] = {is_b ? t->dims[0] : 1, is_b ? 1 : t->dims[0]};
    return type_make(2, dims);
}

/* " + b0 * S0 + ...": where batch item (b0, ...) of the stack t, broadcast to
 * batch, starts; matrix elements per item. Empty when every item is the first. */
static void batch_offset(const Type *t, const Type *batch, int64_t matrix, char *buf, size_t cap) {
    int64_t st[KILN_MAX_RANK];
    broadcast_strides(t, batch, st);
    size_t len = 0;
    buf[0] = 0;
    for (int k = 0; k < batch->rank && len < cap; k++)
        if (st[k] != 0)
            len += (size_t)snprintf(buf + len, cap - len, " + b%d * %lld", k, (long long)(st[k] * matrix));
}

/* cblas_sgemm and cblas_sgemv take int sizes and leading dimensions: a larger one
 * would be converted to a wrong int in the generated call. */
static int blas_too_large(const Node *n, long long m, long long cols, long long depth, Diag *d) {
    if (m <= INT_MAX && cols <= INT_MAX && depth <= INT_MAX)
        return 0;
    return diag_error(d, n->loc, "%s: a GEMM of %lld x %lld x %lld is too large for BLAS",
                      op_table[n->op].name, m, cols, depth);
}

/* matmul as one K_GEMM kernel, batch item bi at its offsets in a, b and y. */
static int matmul_gemm(Program *p, const Node *n, const Type *ba, const Type *bb, const Type *batch,
                       long long count, long long m_len, long long n_len, long long k_len, Diag *d) {
    Kernel *k = kernel_gemm(p, n, NULL, count, m_len, n_len, k_len, d);
    if (!k)
        return -1;
    char at_a[300] = "", at_b[300] = "", at_y[64];
    if (count > 1) {
        emit_unravel(&k->load_a, "bi", batch, "b");
        emit_unravel(&k->load_b, "bi", batch, "b");
        batch_offset(ba, batch, m_len * k_len, at_a, sizeof at_a);
        batch_offset(bb, batch, k_len * n_len, at_b, sizeof at_b);
    }
    str_printf(&k->load_a, "v = %s[r * %lld + kk%s];\n", value_name(p, n->in[0]), k_len, at_a);
    str_printf(&k->load_b, "v = %s[kk * %lld + q%s];\n", value_name(p, n->in[1]), n_len, at_b);
    k->a_depth_inner = true;
    snprintf(at_y, sizeof at_y, "(bi * %lld + r) * %lld + q", m_len, n_len);
    emit_gemm_store(&k->body, p, n, NULL, NULL, at_y);
    return 0;
}

int lower_matmul(Program *p, const Node *n, Diag *d) {
    Type ma = as_matrices(&p->g->values[n->in[0]].type, false);
    Type mb = as_matrices(&p->g->values[n->in[1]].type, true);
    Type ba = type_make(ma.rank - 2, ma.dims), bb = type_make(mb.rank - 2, mb.dims), batch;
    broadcast_types(&ba, &bb, &batch);
    long long m_len = ma.dims[ma.rank - 2], k_len = ma.dims[ma.rank - 1], n_len = mb.dims[mb.rank - 1];
    long long count = type_numel(&batch);
    char a[80], b[80], y[80];
    snprintf(a, sizeof a, "%s", value_name(p, n->in[0]));
    snprintf(b, sizeof b, "%s", value_name(p, n->in[1]));
    snprintf(y, sizeof y, "%s", value_name(p, n->out[0]));
    /* b shared by a dense stack of a: the stack is one tall matrix */
    if (type_numel(&bb) == 1 && type_equal(&ba, &batch)) {
        m_len *= count;
        count = 1;
    }
    if (!p->blas)
        return matmul_gemm(p, n, &ba, &bb, &batch, count, m_len, n_len, k_len, d);
    if (blas_too_large(n, m_len, n_len, k_len, d))
        return -1;
    Kernel *k = new_call(p, n, d);
    if (!k)
        return -1;
    k->flops = lower_flops(5, (int64_t[]){2, count, m_len, n_len, k_len});
    const char *gemm = "cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, %lld, %lld, %lld, 1.0f, %s%s, "
                       "%lld, %s%s, %lld, 0.0f, %s%s, %lld);\n";
    if (count == 1) {
        str_printf(&k->body, gemm, m_len, n_len, k_len, a, "", k_len, b, "", n_len, y, "", n_len);
        return 0;
    }
    /* the result's dropped dims have size 1, so it is laid out as [batch, M, N] */
    char at_a[300], at_b[300], at_y[64];
    batch_offset(&ba, &batch, m_len * k_len, at_a, sizeof at_a);
    batch_offset(&bb, &batch, k_len * n_len, at_b, sizeof at_b);
    snprintf(at_y, sizeof at_y, " + i * %lld", m_len * n_len);
    Str item = {0};
    emit_unravel(&item, "i", &batch, "b");
    str_printf(&item, gemm, m_len, n_len, k_len, a, at_a, k_len, b, at_b, n_len, y, at_y, n_len);
    str_printf(&k->body, "for (int64_t i = 0; i < %lld; i++) {\n", count);
    append_indented(&k->body, &item);
    str_printf(&k->body, "}\n");
    str_free(&item);
    return 0;
}

/* ---- gemm ---- */

/* gemm as a K_GEMM kernel: y = alpha op(a) op(b) + beta c, c broadcast. */
static int gemm_gemm(Program *p, const Node *n, const char *alpha, const char *beta, Diag *d) {
    const Type *at = &p->g->values[n->in[0]].type, *bt = &p->g->values[n->in[1]].type;
    const Type *yt = &p->g->values[n->out[0]].type;
    bool ta = node_bool(n, ATTR_TRANS_A), tb = node_bool(n, ATTR_TRANS_B);
    int c = n->n_in > 2 ? n->in[2] : -1;
    Kernel *k = kernel_gemm(p, n, NULL, 1, yt->dims[0], yt->dims[1], at->dims[!ta], d);
    if (!k)
        return -1;
    str_printf(&k->load_a, ta ? "v = %s[kk * %lld + r];\n" : "v = %s[r * %lld + kk];\n", value_name(p, n->in[0]),
               (long long)at->dims[1]);
    str_printf(&k->load_b, tb ? "v = %s[q * %lld + kk];\n" : "v = %s[kk * %lld + q];\n", value_name(p, n->in[1]),
               (long long)bt->dims[1]);
    k->a_depth_inner = !ta;
    k->b_depth_inner = tb;
    Str *s = &k->body;
    str_printf(s, "int64_t i = r * %lld + q;\n", (long long)yt->dims[1]);
    char term[360] = "";
    if (c >= 0) {
        const Type *ct = &p->g->values[c].type;
        char off[256] = "i";
        if (type_numel(ct) == 1) {
            snprintf(off, sizeof off, "0");
        } else if (!type_equal(ct, yt)) {
            emit_unravel(s, "i", yt, "o");
            broadcast_offset(ct, yt, "o", off, sizeof off);
        }
        snprintf(term, sizeof term, " + %s * %s[%s]", beta, value_name(p, c), off);
    }
    str_printf(s, "%s[i] = %s * acc%s;\n", value_name(p, n->out[0]), alpha, term);
    return 0;
}

int lower_gemm(Program *p, const Node *n, Diag *d) {
    const Type *at = &p->g->values[n->in[0]].type, *bt = &p->g->values[n->in[1]].type;
    const Type *yt = &p->g->values[n->out[0]].type;
    bool ta = node_bool(n, ATTR_TRANS_A), tb = node_bool(n, ATTR_TRANS_B);
    int c = n->n_in > 2 ? n->in[2] : -1;
    char alpha[32], beta[32], y[80];
    float_literal(node_float(n, ATTR_ALPHA), alpha, sizeof alpha);
    float_literal(node_float(n, ATTR_BETA), beta, sizeof beta);
    snprintf(y, sizeof y, "%s", value_name(p, n->out[0]));
    if (!p->blas)
        return gemm_gemm(p, n, alpha, beta, d);
    if (blas_too_large(n, yt->dims[0], yt->dims[1], at->dims[!ta], d))
        return -1;
    Kernel *k = new_call(p, n, d);
    if (!k)
        return -1;
    if (c >= 0) {
        /* y = beta * c broadcast, which sgemm then adds to */
        const Type *ct = &p->g->values[c].type;
        char off[256] = "i", scaled[64] = "";
        Str fill = {0};
        if (type_numel(ct) == 1) {
            snprintf(off, sizeof off, "0");
        } else if (!type_equal(ct, yt)) {
            emit_unravel(&fill, "i", yt, "o");
            broadcast_offset(ct, yt, "o", off, sizeof off);
        }
        if (node_float(n, ATTR_BETA) != 1)
            snprintf(scaled, sizeof scaled, "%s * ", beta);
        str_printf(&fill, "%s[i] = %s%s[%s];\n", y, scaled, value_name(p, c), off);
        str_printf(&k->body, "for (int64_t i = 0; i < %lld; i++) {\n", (long long)type_numel(yt));
        append_indented(&k->body, &fill);
        str_printf(&k->body, "}\n");
        str_free(&fill);
    }
    k->flops = lower_flops(4, (int64_t[]){2, yt->dims[0], yt->dims[1], at->dims[!ta]});
    str_printf(&k->body, "cblas_sgemm(CblasRowMajor, %s, %s, %lld, %lld, %lld, %s, %s, %lld, ",
               ta ? "CblasTrans" : "CblasNoTrans", tb ? "CblasTrans" : "CblasNoTrans", (long long)yt->dims[0],
               (long long)yt->dims[1], (long long)at->dims[!ta], alpha, value_name(p, n->in[0]),
               (long long)at->dims[1]);
    str_printf(&k->body, "%s, %lld, %s, %s, %lld);\n", value_name(p, n->in[1]), (long long)bt->dims[1],
               c >= 0 ? "1.0f" : "0.0f", y, (long long)yt->dims[1]);
    return 0;
}

/* ---- linear ---- */

/* linear (and fused_linear) as a K_GEMM kernel: x [rows, in] times w [out, in]
 * transposed, each element finished with the bias and the epilogue. */
static int linear_gemm(Program *p, const Node *n, long long rows, long long in_len, long long out_len, Diag *d) {
    Arena arena = {0};
    const Expr *epilogue = NULL;
    if (n->op == OP_FUSED_LINEAR && !(epilogue = node_expr(&arena, n, d)))
        return -1;
    Kernel *k = kernel_gemm(p, n, NULL, 1, rows, out_len, in_len, d);
    if (k) {
        str_printf(&k->load_a, "v = %s[r * %lld + kk];\n", value_name(p, n->in[0]), in_len);
        str_printf(&k->load_b, "v = %s[q * %lld + kk];\n", value_name(p, n->in[1]), in_len);
        k->a_depth_inner = k->b_depth_inner = true;
        char bias[96], at[64];
        if (n->n_in > 2 && n->in[2] >= 0)
            snprintf(bias, sizeof bias, "%s[q]", value_name(p, n->in[2]));
        snprintf(at, sizeof at, "r * %lld + q", out_len);
        emit_gemm_store(&k->body, p, n, epilogue, n->n_in > 2 && n->in[2] >= 0 ? bias : NULL, at);
        if (epilogue)
            kernel_annotate(k, node_attr(n, ATTR_EXPR)->s);
    }
    arena_free(&arena);
    return k ? 0 : -1;
}

int lower_linear(Program *p, const Node *n, Diag *d) {
    const Type *x = &p->g->values[n->in[0]].type, *w = &p->g->values[n->in[1]].type;
    long long rows = 1, in_len = w->dims[1], out_len = w->dims[0];
    for (int i = 0; i < x->rank - 1; i++)
        rows *= x->dims[i];
    int b = n->n_in > 2 ? n->in[2] : -1;
    if (!p->blas)
        return linear_gemm(p, n, rows, in_len, out_len, d);
    if (blas_too_large(n, 1, out_len, in_len, d))
        return -1;
    /* one row (batch 1): a matrix-vector product, in chunks of outputs the pool runs
       in parallel, each at the speed of reading its part of w; more rows: a GEMM per
       tile of rows, also in parallel, each tile finished (bias, epilogue) while it
       is in cache */
    bool gemv = rows == 1;
    long long chunk = gemv ? (out_len < GEMV_ROWS ? out_len : GEMV_ROWS) : (rows < TILE_ROWS ? rows : TILE_ROWS);
    long long count = ((gemv ? out_len : rows) + chunk - 1) / chunk;
    Kernel *k = kernel_loop(p, n, gemv ? "sgemv" : "sgemm", count, 1, d);
    if (!k)
        return -1;
    char y[80], xn[80], wn[80];
    snprintf(y, sizeof y, "%s", value_name(p, n->out[0]));
    snprintf(xn, sizeof xn, "%s", value_name(p, n->in[0]));
    snprintf(wn, sizeof wn, "%s", value_name(p, n->in[1]));
    k->flops = lower_flops(4, (int64_t[]){2, rows, out_len, in_len});
    long long total = gemv ? out_len : rows;
    str_printf(&k->body, "int64_t r0 = i * %lld;\nint m = %lld - r0 < %lld ? (int)(%lld - r0) : %lld;\n", chunk,
               total, chunk, total, chunk);
    if (gemv)
        str_printf(&k->body,
                   "cblas_sgemv(CblasRowMajor, CblasNoTrans, m, %lld, 1.0f, %s + r0 * %lld, %lld, %s, 1, 0.0f, "
                   "%s + r0, 1);\n",
                   in_len, wn, in_len, in_len, xn, y);
    else
        str_printf(&k->body,
                   "cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, %lld, %lld, 1.0f, %s + r0 * %lld, %lld, "
                   "%s, %lld, 0.0f, %s + r0 * %lld, %lld);\n",
                   out_len, in_len, xn, in_len, in_len, wn, in_len, y, out_len, out_len);
    Arena arena = {0};
    const Expr *epilogue = NULL;
    if (n->op == OP_FUSED_LINEAR && !(epilogue = node_expr(&arena, n, d)))
        return -1;
    /* the bias and the epilogue on the chunk of outputs, or the tile of rows */
    char cols_text[32];
    snprintf(cols_text, sizeof cols_text, "%lld", out_len);
    if (b >= 0 || epilogue)
        str_printf(&k->body, gemv ? "float *tile = %s + r0;\n" : "float *tile = %s + r0 * %lld;\n", y, out_len);
    emit_tile_epilogue(&k->body, p, n, epilogue, b >= 0 ? value_name(p, b) : "", gemv ? "r0 + q" : "q",
                       gemv ? "1" : "m", gemv ? "m" : cols_text, out_len, 1);
    if (epilogue)
        kernel_annotate(k, node_attr(n, ATTR_EXPR)->s);
    arena_free(&arena);
    return 0;
}
