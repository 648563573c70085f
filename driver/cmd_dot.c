/* kiln dot: the graph after the selected passes as Graphviz text (ir/dot.c).
 *
 * The passes are chosen as for kiln opt (--passes=, -O, --no-PASS), so any stage of
 * the pipeline can be drawn. With -o the text goes to a file, through
 * driver/outputs.c: written whole or not at all, never over the model it read;
 * otherwise to standard output. */
#include "driver.h"

#include <stdlib.h>
#include <string.h>

static const OptionSpec options[] = {
    OPT_LEVEL,
    OPT_PASSES,
    OPT_NO_PASS,
    {"-o", "OUT.dot", "write the graph to OUT.dot instead of standard output"},
    OPT_WEIGHTS,
    OPT_BIND,
    OPT_DIM,
    OPT_DUMP_DIR,
    {"--target", "interp|c|cuda",
     "accepted for symmetry with the other commands; kiln dot generates no code"},
    OPT_CHECK,
    OPT_HELP,
    {NULL, NULL, NULL},
};

static const Command command = {
    "dot",
    "MODEL [options] [-o OUT.dot]",
    "Writes MODEL, after the passes --passes= lists or else after the pipeline of the -O\n"
    "level (default -O2), as a Graphviz graph: inputs, params, consts and outputs each in\n"
    "their own shape, ops with their results' names and types, fused ops as clusters of\n"
    "what they fused. `dot -Tsvg OUT.dot -o OUT.svg` draws it.\n",
    options,
};

int cmd_dot(int argc, char **argv) {
    Options o;
    if (help_requested(argc, argv, &command))
        return 0;
    int rc = parse_options(argc, argv, 2, &command, &o);
    if (rc)
        return rc;
    o.pipeline.lower = false; /* the graph as the passes leave it, grad and all */
    Diag d;
    diag_init(&d, stderr);
    static Outputs outs;
    outputs_init(&outs);
    if (o.out)
        outputs_add(&outs, o.out, "-o");
    if (outputs_check(&outs, &o, &d))
        return EXIT_USER;
    ModelInput in = {0};
    Graph *g;
    TensorList weights = {0};
    rc = load_model(&o, false, &d, &in, &g, &weights);
    if (!rc && pipeline_run(g, &weights, &o.pipeline, &d))
        rc = EXIT_USER;
    if (!rc) {
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        if (!f) {
            rc = diag_error(&d, (Loc){0}, "out of memory");
        } else {
            print_dot(g, f);
            fclose(f);
            if (o.out ? outputs_write(&outs, 0, text, len, &d) || outputs_commit(&outs, &d)
                      : fwrite(text, 1, len, stdout) != len)
                rc = EXIT_USER;
        }
        free(text);
    }
    outputs_abort(&outs);
    tensors_free(&weights);
    graph_free(g);
    model_input_free(&in);
    return exit_status(rc, &d);
}
