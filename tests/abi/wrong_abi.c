/* A shared object whose kiln_model reports ABI version 2, which this kiln does not
 * read. test_libkiln checks that kiln_load refuses it, naming both versions, before
 * calling anything else of the description (create is deliberately absent). */
#include "kiln/model.h"

static const kiln_model_def def = {.abi_version = 2, .name = "from_the_future"};

const kiln_model_def *kiln_model(void) {
    return &def;
}
