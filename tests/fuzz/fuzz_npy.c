/* libFuzzer target for the .npy reader: any bytes must give a tensor or a clean
 * diagnostic, never a crash, an out-of-bounds read or a leak. Diagnostics go to
 * /dev/null, opened once. */
#include "frontend/frontend.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static FILE *devnull;
    if (!devnull) {
        devnull = fopen("/dev/null", "w");
        /* under libFuzzer's 2 GiB malloc limit: a model's huge tensor is then the
           clean out-of-memory error it is on a machine with too little memory */
        ir_set_alloc_limit((size_t)1 << 30);
    }
    Diag d;
    diag_init(&d, devnull);
    Tensor *t;
    if (npy_parse(data, size, "fuzz.npy", &t, &d) == 0)
        tensor_free(t);
    return 0;
}
