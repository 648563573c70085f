/* libFuzzer target for the safetensors reader: any bytes must give tensors or a
 * clean diagnostic, never a crash, an out-of-bounds read or a leak. The list starts
 * with one weight so that the duplicate check against it is exercised too.
 * Diagnostics go to /dev/null, opened once. */
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
    TensorList l = {0};
    Type scalar = type_make(0, NULL);
    if (tensors_add(&l, "w", tensor_new(&scalar)) == 0) {
        int n = l.n;
        if (safetensors_parse(data, size, "fuzz.safetensors", &l, &d) != 0)
            KILN_ASSERT(l.n == n);
    }
    tensors_free(&l);
    return 0;
}
