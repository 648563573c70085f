/* A model as the contract's version 1 declares it (abi.md), before kiln described
 * a model's params: its own copy of the struct, without `extensions` (padding there)
 * or anything after `destroy`. test_libkiln checks that kiln_load still loads and
 * runs it, and that kiln_read_param says it has no description of its params. The
 * asserts hold the contract's fields where kiln/model.h puts them. */
#include "kiln/model.h"

#include <stddef.h>

typedef struct {
    uint32_t abi_version;
    const char *name;
    int32_t n_inputs, n_outputs;
    const kiln_tensor_info *inputs, *outputs;
    int (*create)(void **instance, char *err, size_t errlen);
    int (*run)(void *instance, const void *const *inputs, void *const *outputs);
    void (*destroy)(void *instance);
} v1_model_def;

#define SAME_PLACE(field)                                                                                    \
    _Static_assert(offsetof(v1_model_def, field) == offsetof(kiln_model_def, field), #field)
SAME_PLACE(abi_version);
SAME_PLACE(name);
SAME_PLACE(n_inputs);
SAME_PLACE(n_outputs);
SAME_PLACE(inputs);
SAME_PLACE(outputs);
SAME_PLACE(create);
SAME_PLACE(run);
SAME_PLACE(destroy);

static int instance;

static int create(void **in, char *err, size_t errlen) {
    (void)err, (void)errlen;
    *in = &instance;
    return 0;
}

/* y = 2 x */
static int run(void *in, const void *const *inputs, void *const *outputs) {
    (void)in;
    const float *x = inputs[0];
    float *y = outputs[0];
    y[0] = 2 * x[0];
    return 0;
}

static void destroy(void *in) {
    (void)in;
}

static const int64_t one[] = {1};
static const kiln_tensor_info x = {"x", KILN_F32, 1, one}, y = {"y", KILN_F32, 1, one};
static const v1_model_def def = {1, "version_1", 1, 1, &x, &y, create, run, destroy};

const kiln_model_def *kiln_model(void);
const kiln_model_def *kiln_model(void) {
    return (const kiln_model_def *)&def;
}
