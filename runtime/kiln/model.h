/* kiln/model.h: the compiled-model ABI, version 1.
 *
 * A model compiled by `kiln compile` is a shared object exporting one symbol,
 * `kiln_model`, which returns the description below. A program needs nothing else
 * of kiln to load and run it: dlopen the .so, call kiln_model(), check
 * abi_version, then create, run (as often as wanted) and destroy an instance. */
#ifndef KILN_MODEL_H
#define KILN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { KILN_ABI_VERSION = 1 };
/* kiln_model_def.extensions: which groups of fields past `destroy` the description
   has, in the order of their bits; a model with one has every lower one's too */
enum { KILN_EXT_PARAMS = 1, KILN_EXT_COMM = 2, KILN_EXT_RUN_ERROR = 4, KILN_EXT_SYM = 8 };
enum kiln_dtype { KILN_F32 = 1, KILN_F16 = 2, KILN_BF16 = 3, KILN_I64 = 4, KILN_I32 = 5, KILN_BOOL = 6 };

typedef struct {
    const char *name;
    int32_t dtype; /* enum kiln_dtype; a KILN_BOOL element is one byte, 0 or 1 */
    int32_t rank;
    const int64_t *shape; /* rank entries */
} kiln_tensor_info;

/* A communicator: how a model's collectives (allreduce) reach the other processes of
 * a job. The host program makes it (libkiln_mpi's over MPI, kiln/mpi.h, or its own)
 * and hands it to create_comm. */
typedef struct kiln_comm {
    int32_t rank, size; /* this process is rank [0, size) of size processes */
    void *ctx;          /* the communicator's own, passed to its functions */
    /* Sums count elements of src (of dtype: KILN_F32) over the processes into dst,
       which may be src. Every process calls it with the same count and dtype, in the
       same order. Returns 0, or nonzero when it failed (error says why). */
    int (*allreduce_sum)(void *ctx, const void *src, void *dst, int64_t count, int32_t dtype);
    /* Why the last call failed, or NULL; this field may itself be NULL. */
    const char *(*error)(void *ctx);
} kiln_comm;

typedef struct kiln_model_def {
    uint32_t abi_version;        /* KILN_ABI_VERSION */
    uint32_t extensions;         /* KILN_EXT_*; 0 in a model made before them (it was padding) */
    const char *name;            /* the model's name */
    int32_t n_inputs, n_outputs; /* inputs in declaration order, outputs in `output` order */
    const kiln_tensor_info *inputs, *outputs;
    /* Makes a ready-to-run instance: weights in place, scratch memory reserved.
       Returns 0, or nonzero with a message in err[0..errlen). */
    int (*create)(void **instance, char *err, size_t errlen);
    /* Runs the graph once. inputs[i] and outputs[i] point at dense, C-order buffers of
       the sizes in inputs/outputs (host memory, also for the CUDA target). Reentrant
       across instances; one instance runs one call at a time. */
    int (*run)(void *instance, const void *const *inputs, void *const *outputs);
    void (*destroy)(void *instance);
    /* With KILN_EXT_PARAMS: the params the model's runs update (a training step's
       weights, optimizer state and counters), which read_param and write_param copy
       out of and into an instance between runs, dense and in C order, as params[i]
       describes. Each returns 0, or nonzero for an i out of range or a failed copy. */
    int32_t n_params;
    const kiln_tensor_info *params;
    int (*read_param)(void *instance, int32_t i, void *dst);
    int (*write_param)(void *instance, int32_t i, const void *src);
    /* With KILN_EXT_COMM: create, its collectives going through comm (copied; its ctx
       must outlive the instance). create is create_comm with one process. */
    int (*create_comm)(void **instance, const kiln_comm *comm, char *err, size_t errlen);
    /* With KILN_EXT_RUN_ERROR: what run's nonzero result fault means, the run-time
       check that failed with its op and place in the model; NULL for no check's number. */
    const char *(*run_error)(int32_t fault);
    /* With KILN_EXT_SYM: the model's symbolic dims (kiln makes at most one), by name
       and bound. An input's or output's shape entry -k is k times dim 0's size at a
       run (-1: the size itself). run_sym runs at sizes[i] of dim i, each from 1 to
       its bound, on buffers of the shapes at those sizes, and returns -1, having
       run nothing, when a size is outside that; run runs at the bounds. */
    int32_t n_sym;
    const char *const *sym_names;
    const int64_t *sym_bounds;
    int (*run_sym)(void *instance, const int64_t *sizes, const void *const *inputs, void *const *outputs);
} kiln_model_def;

/* The one symbol a compiled model exports. */
const kiln_model_def *kiln_model(void);

#ifdef __cplusplus
}
#endif

#endif
