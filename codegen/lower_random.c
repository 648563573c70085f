/* Lowering of the random ops (ir/op_random.c): one LOOP kernel over the result's
 * elements, element i computing its word with kiln_philox(seed, offset, i)
 * (runtime/philox.h, pasted into the generated C and CUDA), so the value depends
 * on i alone, never on the thread that computes it. uniform converts the word's
 * top 24 bits to f32 (exact) and scales them by 2^-24 (exact); dropout compares
 * them with its threshold, an integer comparison, and multiplies x by 1 / (1 - p)
 * or by 0: what the interpreter computes, to the bit. */
#include "codegen.h"

enum { RANDOM_GRAIN = 4096 };

int lower_random(Program *p, const Node *n, Diag *d) {
    Kernel *k = kernel_loop(p, n, NULL, type_numel(&p->g->values[n->out[0]].type), RANDOM_GRAIN, d);
    if (!k)
        return -1;
    k->in_place = true; /* x is read only at the element written (the key is no f32) */
    kernel_follows(p, k, &p->g->values[n->out[0]].type, k->count, 1, 1);
    KBuilder *b = &k->b;
    int key = kb_value(b, n->in[n->op == OP_DROPOUT ? 1 : 0], false);
    KExpr *i = k_var(b, k->iter);
    KExpr *seed = k_var(b, kb_let(b, "seed", KT_I64, k_load(b, key, k_int(b, 0)))),
          *offset = k_var(b, kb_let(b, "offset", KT_I64, k_load(b, key, k_int(b, 1))));
    KExpr *word = k_call(b, KT_I64, "kiln_philox", 3, (KExpr *[]){seed, offset, i});
    KExpr *bits = k_var(b, kb_let(b, "bits", KT_I64, k_div(b, word, k_int(b, 256)))); /* word >> 8 */
    KExpr *y;
    if (n->op == OP_UNIFORM)
        y = k_mul(b, k_cast(b, KT_F32, bits), k_f32(b, 0x1p-24));
    else {
        KExpr *keep = k_bin(b, KE_GE, bits, k_int(b, dropout_threshold(n)));
        y = k_mul(b, k_load(b, kb_value(b, n->in[0], false), i),
                  k_select(b, keep, k_f32(b, dropout_scale(n)), k_f32(b, 0)));
    }
    kb_store(b, kb_value(b, n->out[0], true), i, y);
    return 0;
}

bool program_uses_philox(const Program *p) {
    for (int k = 0; k < p->n_kernels; k++)
        if (p->kernels[k].node &&
            (p->kernels[k].node->op == OP_UNIFORM || p->kernels[k].node->op == OP_DROPOUT))
            return true;
    return false;
}
