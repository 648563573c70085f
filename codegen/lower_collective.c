/* Lowering of allreduce: a CALL kernel, run once and in order on the thread that
 * runs the model, handing x to the instance's communicator (KILN_ALLREDUCE,
 * runtime/model_rt.c), which writes the sum (or mean) over the processes into the
 * result: in place where the memory plan puts the result over x. Every process runs
 * the same kernels in the same order, so their collectives pair up. The CUDA target
 * prints no body: its runtime does the step on the host, between launches
 * (emit_cuda.c). */
#include "codegen.h"

int lower_allreduce(Program *p, const Node *n, Diag *d) {
    int fault = program_fault(p, n, "the communicator failed", d);
    Kernel *k = fault < 0 ? NULL : kernel_new(p, n, K_CALL, NULL);
    if (!k)
        return fault < 0 ? -1 : diag_error(d, n->loc, "out of memory");
    kernel_reads(k, n->in[0]);
    kernel_writes(k, n->out[0]);
    k->in_place = true;
    k->allreduce_fault = fault;
    KBuilder *b = &k->b;
    KExpr *x = k_addr(b, kb_value(b, n->in[0], false), k_int(b, 0)),
          *y = k_addr(b, kb_value(b, n->out[0], true), k_int(b, 0));
    bool mean = node_enum(n, ATTR_OP) == ALLREDUCE_OP_MEAN;
    kb_call(b, "KILN_ALLREDUCE", 5,
            (KExpr *[]){x, y, k_int(b, type_numel(&p->g->values[n->out[0]].type)), k_i32(b, mean),
                        k_i32(b, fault)});
    return 0;
}
