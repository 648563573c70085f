/* kiln opt: parse, verify and optimize a model, and print it in canonical form.
 *
 * With -o the text goes to a file, written through a temporary file so a failure
 * leaves nothing behind; otherwise to standard output. */
#include "driver.h"

#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: kiln opt MODEL [-O0|-O1|-O2] [--passes=P1,P2,...] [--no-PASS] [-o OUT.kiln]\n"
    "                      [--dump-dir DIR] [--weights FILE.safetensors]... [--check]\n"
    "       kiln opt --list-passes\n"
    "\n"
    "Prints MODEL after the passes --passes= lists, or else after the pipeline of the -O\n"
    "level (default -O2); -O0 prints the parsed, verified model unchanged. --dump-dir\n"
    "writes DIR/00-input.kiln and DIR/NN-PASS.kiln after every pass. --check runs the\n"
    "interpreter on random inputs before the passes and after each, and fails naming\n"
    "the first pass that changes an output beyond 1e-4 + 1e-4|expected|.\n";

int cmd_opt(int argc, char **argv) {
    Options o;
    if (argc > 2 && (strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0)) {
        fputs(usage, stdout);
        printf("\npasses, in pipeline order:\n");
        for (int i = 0; i < pass_count; i++)
            printf("  %-12s -O%d  %s\n", pass_list[i].name, pass_list[i].level, pass_list[i].summary);
        return 0;
    }
    int rc = parse_options(argc, argv, 2,
                           "-o --weights --target -O --passes --no-PASS --dump-dir --list-passes --check",
                           usage, &o);
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
            print_graph(g, f);
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
