/* kiln opt: parse, verify and optimize a model, and print it in canonical form.
 *
 * With -o the text goes to a file, through driver/outputs.c: written whole or not
 * at all, never over the model it read; otherwise to standard output. */
#include "driver.h"

#include <stdlib.h>
#include <string.h>

static const OptionSpec options[] = {
    OPT_LEVEL,
    OPT_PASSES,
    OPT_NO_PASS,
    {"-o", "OUT.kiln", "write the model to OUT.kiln instead of standard output"},
    {"--list-passes", NULL, "print the pass names, in pipeline order, and nothing else"},
    OPT_DUMP_DIR,
    OPT_WEIGHTS,
    OPT_BIND,
    OPT_DIM,
    {"--target", "interp|c|cuda",
     "accepted for symmetry with the other commands; kiln opt generates no code"},
    {"--check", NULL,
     "run the interpreter on random inputs before the passes and after each, and fail naming the first pass "
     "that changes an output beyond 1e-4 + 1e-4|expected|"},
    OPT_HELP,
    {NULL, NULL, NULL},
};

static const Command command = {
    "opt",
    "MODEL [options]\n       kiln opt --list-passes",
    "Prints MODEL after the passes --passes= lists, or else after the pipeline of the -O\n"
    "level (default -O2); -O0 prints the parsed, verified model unchanged. -o writes the\n"
    "file whole or not at all, and never over a file the command reads.\n",
    options,
};

int cmd_opt(int argc, char **argv) {
    Options o;
    if (help_requested(argc, argv, &command)) {
        printf("\npasses, in pipeline order:\n");
        for (int i = 0; i < pass_count; i++)
            printf("  %-12s -O%d  %s\n", pass_list[i].name, pass_list[i].level, pass_list[i].summary);
        return 0;
    }
    int rc = parse_options(argc, argv, 2, &command, &o);
    if (rc)
        return rc;
    o.pipeline.lower = false; /* -O0 prints the model unchanged, grad and all */
    if (o.list_passes) {
        for (int i = 0; i < pass_count; i++)
            puts(pass_list[i].name);
        return 0;
    }
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
            print_graph(g, f);
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
