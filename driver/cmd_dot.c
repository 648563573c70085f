/* kiln dot: the graph after the selected passes as Graphviz text (ir/dot.c).
 *
 * The passes are chosen as for kiln opt (--passes=, -O, --no-PASS), so any stage of
 * the pipeline can be drawn. With -o the text goes to a file, written through a
 * temporary file so a failure leaves nothing behind; otherwise to standard output. */
#include "driver.h"

#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: kiln dot MODEL [-O0|-O1|-O2] [--passes=P1,P2,...] [--no-PASS] [-o OUT.dot]\n"
    "                      [--weights FILE.safetensors]... [--dump-dir DIR] [--check]\n"
    "\n"
    "Writes MODEL, after the passes --passes= lists or else after the pipeline of the -O\n"
    "level (default -O2), as a Graphviz graph: inputs, params, consts and outputs each in\n"
    "their own shape, ops with their results' names and types, fused ops as clusters of\n"
    "what they fused. `dot -Tsvg OUT.dot -o OUT.svg` draws it.\n";

int cmd_dot(int argc, char **argv) {
    Options o;
    if (argc > 2 && (strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0)) {
        fputs(usage, stdout);
        return 0;
    }
    int rc = parse_options(argc, argv, 2, "-o --weights --target -O --passes --no-PASS --dump-dir --check",
                           usage, &o);
    if (rc)
        return rc;
    o.pipeline.lower = false; /* the graph as the passes leave it, grad and all */
    Diag d;
    diag_init(&d, stderr);
    SrcFile *src;
    Graph *g;
    TensorList weights = {0};
    rc = load_model(&o, false, &d, &src, &g, &weights);
    if (!rc && pipeline_run(g, &weights, &o.pipeline, &d))
        rc = EXIT_USER;
    if (!rc) {
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        if (!f) {
            rc = EXIT_BUG;
        } else {
            print_dot(g, f);
            fclose(f);
            if (o.out ? write_file_atomic(o.out, text, len, &d) : fwrite(text, 1, len, stdout) != len)
                rc = EXIT_USER;
        }
        free(text);
    }
    tensors_free(&weights);
    graph_free(g);
    srcfile_free(src);
    return rc;
}
