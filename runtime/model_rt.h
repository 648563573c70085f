/* What a compiled model's generated code sees of the runtime (model_rt.c): the
 * buffers a kernel is handed, the description of the program, and the calls that
 * run it. kiln pastes this header (after kiln/model.h) into each generated
 * translation unit; model_rt.c is compiled once, with kiln, into the object of
 * precompiled kernels that every model links (runtime/kernels.c), so a model's
 * compile spends no time on the thread pool. Its symbols are hidden: a .so exports
 * only kiln_model. */
#ifndef KILN_MODEL_RT_H
#define KILN_MODEL_RT_H

#include "kiln/model.h"

#include <stddef.h>
#include <stdint.h>

/* The buffers a kernel sees: the caller's inputs and outputs, the workspace, the
 * weights, and the state (the params a training step updates). */
typedef struct {
    const float *const *in;
    float *const *out;
    float *ws;
    const float *wt;
    float *st;
    int *fault;            /* a run-time check that failed: the program's fault number, else 0 */
    const kiln_comm *comm; /* the processes a collective reduces over; NULL: this one alone */
    int64_t sym;           /* the size of the model's symbolic dim at this run; 0: it has none */
} KilnArgs;

/* Raises fault f of the program (the number a kernel's check was given); any
   thread may, and the last one to store wins. */
#define KILN_FAULT(f) __atomic_store_n(args->fault, (f), __ATOMIC_RELAXED)

/* allreduce: count floats of src summed over the processes into dst (which may be
   src), divided by their number for a mean; fault f of the program when the
   communicator fails. One process copies. */
#define KILN_ALLREDUCE(src, dst, count, mean, f) kiln_rt_allreduce(args, src, dst, count, mean, f)

void kiln_rt_allreduce(const KilnArgs *args, const float *src, float *dst, int64_t count, int mean, int f);

/* A kernel computes iterations [begin, end) of its loop; buf holds the pointers to the
   buffers it reads and writes, in the order it declares them, so that its code holds
   nothing of where a model keeps them and one kernel serves every layer of its shape. */
typedef void (*KilnKernel)(const KilnArgs *a, void *const *buf, int64_t begin, int64_t end);
/* Before a kernel's args and buf, which many kernels do not read. */
#define KILN_MAYBE_UNUSED __attribute__((unused))

typedef struct KilnInstance KilnInstance;

/* What the generated code tells the runtime about its model. */
typedef struct KilnProgram {
    int64_t workspace_bytes;
    int64_t state_bytes; /* the state starts as a copy of the weights' first state_bytes */
    const unsigned char *weights;
    void (*run)(KilnInstance *inst, const KilnArgs *a);
    void (*set_blas_threads)(int n); /* NULL when the model calls no BLAS */
    /* A symbolic dim's bound (0: the model has none), and the bytes of one unit of it
       in each input and output (0: a port without it). A run at a smaller size copies
       those ports through buffers of the bound's size, so that every kernel may read
       and write as many rows as the bound has. */
    int64_t sym_bound;
    int32_t n_in, n_out;
    const int64_t *in_unit_bytes, *out_unit_bytes;
    /* The model compiled for size 1 of the dim, which a run at that size runs instead
       (on the same workspace, the larger of the two); NULL: none. */
    const struct KilnProgram *at_one;
    /* A static batch of `split` items, which run computes one at a time: run is the
       model at one item, on each item's rows of the ports (whose unit bytes are an
       item's); 0: the whole batch at once. */
    int64_t split;
} KilnProgram;

/* Runs kernel k on buf over [0, count) on the instance's threads, in chunks of at
 * least grain iterations; on the caller alone when there are fewer than two. */
void kiln_rt_parallel(KilnInstance *in, KilnKernel k, const KilnArgs *a, void *const *buf, int64_t count,
                      int64_t grain);

/* kiln_model_def's create (with comm NULL, or create_comm), destroy and run for
 * the program prog, and the bytes of the state behind its read_param and
 * write_param. */
int kiln_rt_create(const KilnProgram *prog, const kiln_comm *comm, void **instance, char *err, size_t errlen);
void kiln_rt_destroy(void *instance);
int kiln_rt_run(void *instance, const void *const *inputs, void *const *outputs);
/* run_sym: at sizes[0] of the symbolic dim (ignored without one); -1 when it is
   outside 1 to the bound. kiln_rt_run runs at the bound. */
int kiln_rt_run_sym(void *instance, const int64_t *sizes, const void *const *inputs, void *const *outputs);
int kiln_rt_read_state(void *instance, int64_t offset, int64_t bytes, void *dst);
int kiln_rt_write_state(void *instance, int64_t offset, int64_t bytes, const void *src);

#endif
