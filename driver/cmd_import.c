/* kiln import: an ONNX model translated into a .kiln model and a safetensors file of
 * its weights.
 *
 * The importer (frontend/onnx.c) builds and verifies the graph; the printer writes
 * it in canonical form, and the safetensors writer the params' values. Both files
 * are written all or nothing (driver/outputs.c), so a failure leaves neither, and
 * neither may be the ONNX model or a file it binds. */
#include "driver.h"

#include <stdlib.h>
#include <string.h>

static const OptionSpec options[] = {
    {"-o", "OUT.kiln", "the .kiln model to write (required)"},
    {"--weights-out", "OUT.safetensors",
     "where the initializers' values go (default: OUT with .kiln replaced by .safetensors; no file when the "
     "model has none)"},
    OPT_BIND,
    OPT_DIM,
    OPT_HELP,
    {NULL, NULL, NULL},
};

static const Command command = {
    "import",
    "MODEL.onnx -o OUT.kiln [--weights-out OUT.safetensors] [--bind NAME=FILE]... [--dim NAME=SIZE]...",
    "Translates an ONNX model into the kiln language. The initializers become params.\n"
    "kiln's shapes are static, so shape-like inputs (a Reshape's shape, Resize's scales,\n"
    "...) must be bound with --bind, and symbolic dims fixed with --dim. The result runs with\n"
    "`kiln run OUT.kiln --weights OUT.safetensors`; `kiln run MODEL.onnx` imports on the fly.\n"
    "Both files are written together or not at all, and never over a file the command reads.\n",
    options,
};

int cmd_import(int argc, char **argv) {
    if (help_requested(argc, argv, &command))
        return 0;
    Options o;
    int rc = parse_options(argc, argv, 2, &command, &o);
    if (rc)
        return rc;
    if (!o.out)
        return usage_error(&command, "kiln import needs -o OUT.kiln");
    Diag d;
    diag_init(&d, stderr);
    if (!is_onnx_path(o.model)) {
        diag_error(&d, (Loc){0}, "kiln import reads .onnx models; '%s' is not one", o.model);
        return EXIT_USER;
    }
    /* the weights' default path: OUT with .kiln replaced by .safetensors */
    char wpath[4200];
    size_t n = strlen(o.out);
    if (n > 5 && strcmp(o.out + n - 5, ".kiln") == 0)
        n -= 5;
    snprintf(wpath, sizeof wpath, "%.*s.safetensors", (int)n, o.out);
    /* both files are checked now, though the weights file is written only when the
       model has initializers, which the import tells */
    static Outputs outs;
    outputs_init(&outs);
    outputs_add(&outs, o.out, "-o");
    outputs_add(&outs, o.weights_out ? o.weights_out : wpath, "--weights-out");
    if (outputs_check(&outs, &o, &d))
        return EXIT_USER;
    ModelInput in = {0};
    Graph *g;
    TensorList weights = {0};
    rc = load_model(&o, false, &d, &in, &g, &weights);
    char *text = NULL;
    size_t len = 0;
    if (!rc) {
        FILE *f = open_memstream(&text, &len);
        if (!f) {
            rc = diag_error(&d, (Loc){0}, "out of memory");
        } else {
            fprintf(f, "# Imported from %s by kiln import.\n", o.model);
            print_graph(g, f);
            fclose(f);
        }
    }
    if (!rc && !weights.n && !o.weights_out)
        outs.n = 1; /* no initializers: no weights file */
    if (!rc && outputs_write(&outs, 0, text, len, &d))
        rc = EXIT_USER;
    if (!rc && outs.n == 2) {
        unsigned char *wbuf = NULL;
        size_t wlen = 0;
        if (safetensors_encode(&weights, &wbuf, &wlen))
            rc = diag_error(&d, (Loc){0}, "out of memory writing '%s'", outs.items[1].path);
        else if (outputs_write(&outs, 1, wbuf, wlen, &d))
            rc = EXIT_USER;
        ir_free(wbuf);
    }
    if (!rc && outputs_commit(&outs, &d))
        rc = EXIT_USER;
    outputs_abort(&outs);
    free(text);
    tensors_free(&weights);
    graph_free(g);
    model_input_free(&in);
    return exit_status(rc, &d);
}
