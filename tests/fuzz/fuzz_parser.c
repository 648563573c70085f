/* libFuzzer target: the model parser, the verifier and the printer on arbitrary text.
 * Whatever the input, parsing either fails with a diagnostic or gives a graph that
 * verifies and prints; nothing may crash, leak or read out of bounds. */
#include "frontend/frontend.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static FILE *devnull;
    if (!devnull) {
        devnull = fopen("/dev/null", "w");
        /* under libFuzzer's 2 GiB malloc limit: a model's huge tensor is then the
           clean out-of-memory error it is on a machine with too little memory */
        ir_set_alloc_limit((size_t)1 << 30);
    }
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = 0;
    SrcFile *src = srcfile_from_string("fuzz.kiln", text);
    free(text);
    if (!src)
        return 0;
    src->len = strlen(src->text); /* an embedded NUL ends the text here */
    Diag d;
    diag_init(&d, devnull);
    Graph *g = parse_model(src, &d);
    if (g) {
        if (verify_graph(g, &d) != 0)
            abort(); /* a parsed graph always verifies */
        print_graph(g, devnull);
    }
    graph_free(g);
    srcfile_free(src);
    return 0;
}
