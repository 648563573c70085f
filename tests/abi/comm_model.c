/* A model made by a kiln with collectives but before KILN_EXT_RUN_ERROR (abi.md):
 * y = x summed over the processes of the communicator create_comm was given (x
 * itself without one); when the communicator fails, run returns its check's number,
 * 3, which it has no table to name. test_libkiln checks that kiln_run's message then
 * carries the communicator's own. Built with CLAIMS_RUN_ERROR it declares
 * KILN_EXT_RUN_ERROR without a run_error, and kiln_load must refuse it as malformed. */
#include "kiln/model.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct {
    kiln_comm comm;
    int has_comm;
} Instance;

static int create_comm(void **instance, const kiln_comm *comm, char *err, size_t errlen) {
    Instance *in = calloc(1, sizeof *in);
    if (!in) {
        snprintf(err, errlen, "out of memory");
        return 1;
    }
    if (comm) {
        in->comm = *comm;
        in->has_comm = 1;
    }
    *instance = in;
    return 0;
}

static int create(void **instance, char *err, size_t errlen) {
    return create_comm(instance, NULL, err, errlen);
}

static int run(void *instance, const void *const *inputs, void *const *outputs) {
    const Instance *in = instance;
    const float *x = inputs[0];
    float *y = outputs[0];
    if (!in->has_comm) {
        y[0] = x[0];
        y[1] = x[1];
        return 0;
    }
    return in->comm.allreduce_sum(in->comm.ctx, x, y, 2, KILN_F32) != 0 ? 3 : 0;
}

static void destroy(void *instance) {
    free(instance);
}

static int no_param(void *instance, int32_t i, void *dst) {
    (void)instance, (void)i, (void)dst;
    return 1;
}

static int no_param_write(void *instance, int32_t i, const void *src) {
    (void)instance, (void)i, (void)src;
    return 1;
}

static const int64_t two[] = {2};
static const kiln_tensor_info x = {"x", KILN_F32, 1, two}, y = {"y", KILN_F32, 1, two};
#ifdef CLAIMS_RUN_ERROR
enum { EXTENSIONS = KILN_EXT_PARAMS | KILN_EXT_COMM | KILN_EXT_RUN_ERROR };
#else
enum { EXTENSIONS = KILN_EXT_PARAMS | KILN_EXT_COMM };
#endif
static const kiln_model_def def = {.abi_version = KILN_ABI_VERSION,
                                   .extensions = EXTENSIONS,
                                   .name = "comm_model",
                                   .n_inputs = 1,
                                   .n_outputs = 1,
                                   .inputs = &x,
                                   .outputs = &y,
                                   .create = create,
                                   .run = run,
                                   .destroy = destroy,
                                   .read_param = no_param,
                                   .write_param = no_param_write,
                                   .create_comm = create_comm};

const kiln_model_def *kiln_model(void) {
    return &def;
}
