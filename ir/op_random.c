/* The random ops: uniform and dropout, on the counter-based generator
 * Philox4x32-10 (runtime/philox.h).
 *
 * Each takes a key, an i64[2] (seed, offset) of the model, usually a param that an
 * `update` advances every step. Element i (in C order) of the result depends on the
 * key and i alone, through w = kiln_philox(seed, offset, i), a word in [0, 2^32):
 * uniform's element is (w >> 8) 2^-24, exact in f32; dropout keeps x's element when
 * w >> 8 >= ceil(p 2^24), which is exactly when uniform's element at that key would
 * be at least p, and gives x * s there (s = 1 / (1 - p) in f32) and x * 0 elsewhere
 * (a zero of x's sign, or NaN for an infinite or NaN x, as torch's x * mask * s).
 * The decision is an integer comparison and the product one f32 multiplication, so
 * the interpreter, C (at any thread count) and CUDA agree bit for bit. The same key
 * gives the same mask, which is how dropout's gradient is dropout of dy with the
 * same key and p (passes/autodiff.c). */
#include "ops_impl.h"

#include "../runtime/philox.h"

#include <math.h>

/* The key is input `at`: an i64[2]; -1 after a diagnostic naming it. */
static int check_key(Graph *g, Node *n, int at, Diag *d) {
    const Type *k = in_type(g, n, at);
    if (k->dtype != DT_I64 || k->rank != 1 || k->dims[0] != 2)
        return diag_error(d, n->loc, "%s: the key '%s' is %s; it must be i64[2] (seed, offset)",
                          op_table[n->op].name, g->values[n->in[at]].name, tstr(k));
    return 0;
}

int infer_uniform(Graph *g, Node *n, Diag *d) {
    if (check_key(g, n, 0, d))
        return -1;
    int64_t dims[KILN_MAX_RANK];
    int rank = shape_attr(n, dims, 1, d);
    if (rank < 0)
        return -1;
    Type t = type_make(rank, dims);
    if (check_size(n, &t, d))
        return -1;
    set_out_type(g, n, 0, t);
    return 0;
}

int infer_dropout(Graph *g, Node *n, Diag *d) {
    const Type *x = in_type(g, n, 0);
    if (x->dtype != DT_F32)
        return diag_error(d, n->loc, "dropout: x '%s' is %s; it must be f32", g->values[n->in[0]].name,
                          tstr(x));
    if (check_key(g, n, 1, d))
        return -1;
    double p = node_float(n, ATTR_P);
    if (!(p >= 0 && p < 1))
        return diag_error(d, attr_loc(n, ATTR_P), "dropout: p = %g must be in [0, 1)", p);
    set_out_type(g, n, 0, *x);
    return 0;
}

int64_t dropout_threshold(const Node *n) {
    return (int64_t)ceil(node_float(n, ATTR_P) * 16777216.0);
}

float dropout_scale(const Node *n) {
    return (float)(1.0 / (1.0 - node_float(n, ATTR_P)));
}

int eval_uniform(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    (void)n, (void)d;
    int64_t seed = in[0]->i64[0], offset = in[0]->i64[1];
    for (int64_t i = 0; i < type_numel(&out[0]->type); i++)
        out[0]->data[i] = (float)(kiln_philox(seed, offset, i) >> 8) * 0x1p-24f;
    return 0;
}

int eval_dropout(const Node *n, const Tensor *const *in, Tensor **out, Diag *d) {
    (void)d;
    int64_t seed = in[1]->i64[0], offset = in[1]->i64[1], threshold = dropout_threshold(n);
    float scale = dropout_scale(n);
    for (int64_t i = 0; i < type_numel(&out[0]->type); i++) {
        bool keep = kiln_philox(seed, offset, i) >> 8 >= threshold;
        out[0]->data[i] = (float)((double)in[0]->data[i] * (keep ? scale : 0.0f));
    }
    return 0;
}
