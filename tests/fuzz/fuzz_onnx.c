/* libFuzzer target for the ONNX importer: any bytes must give a verified graph or a
 * clean diagnostic, never a crash, an out-of-bounds read or a leak. The bytes are a
 * ModelProto read from memory with no directory, so external data is refused rather
 * than read. The weights list starts with one entry, which a failed import must
 * leave alone. Diagnostics go to /dev/null, opened once. */
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
    TensorList weights = {0};
    Type scalar = type_make(0, NULL);
    if (tensors_add(&weights, "w", tensor_new(&scalar)) == 0) {
        Graph *g = onnx_import_buffer(data, size, "fuzz.onnx", NULL, NULL, 0, &weights, &d);
        if (g)
            graph_free(g);
        else
            KILN_ASSERT(weights.n == 1);
    }
    tensors_free(&weights);
    return 0;
}
