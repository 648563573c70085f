/* kiln import: an ONNX model translated into a .kiln model and a safetensors file of
 * its weights.
 *
 * The importer (frontend/onnx.c) builds and verifies the graph; the printer writes
 * it in canonical form, and the safetensors writer the params' values. Both files
 * are written all or nothing (write_files_atomic), so a failure leaves neither. */
#include "driver.h"

#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: kiln import MODEL.onnx -o OUT.kiln [--weights-out OUT.safetensors] [--bind NAME=FILE]...\n"
    "\n"
    "Translates an ONNX model into the kiln language. The initializers become params whose\n"
    "values go to --weights-out (default: OUT with .kiln replaced by .safetensors; no file\n"
    "when the model has none). --bind NAME=FILE makes the graph input NAME the constant in\n"
    "FILE (.npy, or an ONNX TensorProto .pb): kiln's shapes are static, so shape-like\n"
    "inputs (a Reshape's shape, Resize's scales, ...) must be bound. The result runs with\n"
    "`kiln run OUT.kiln --weights OUT.safetensors`; `kiln run MODEL.onnx` imports on the fly.\n";

int cmd_import(int argc, char **argv) {
    if (argc > 2 && (strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0)) {
        fputs(usage, stdout);
        return 0;
    }
    Options o;
    int rc = parse_options(argc, argv, 2, "-o --weights-out --bind", usage, &o);
    if (rc)
        return rc;
    if (!o.out) {
        fprintf(stderr, "kiln: error: kiln import needs -o OUT.kiln\n%s", usage);
        return EXIT_USAGE;
    }
    Diag d;
    diag_init(&d, stderr);
    if (!is_onnx_path(o.model)) {
        diag_error(&d, (Loc){0}, "kiln import reads .onnx models; '%s' is not one", o.model);
        return EXIT_USER;
    }
    SrcFile *src;
    Graph *g;
    TensorList weights = {0};
    rc = load_model(&o, false, &d, &src, &g, &weights);
    char *text = NULL, *wpath = NULL;
    size_t len = 0;
    if (!rc) {
        FILE *f = open_memstream(&text, &len);
        if (!f) {
            rc = EXIT_BUG;
        } else {
            fprintf(f, "# Imported from %s by kiln import.\n", o.model);
            print_graph(g, f);
            fclose(f);
        }
    }
    if (!rc && weights.n && !o.weights_out) {
        size_t n = strlen(o.out);
        wpath = malloc(n + sizeof ".safetensors");
        if (!wpath) {
            rc = EXIT_BUG;
        } else {
            memcpy(wpath, o.out, n + 1);
            if (n > 5 && strcmp(wpath + n - 5, ".kiln") == 0)
                wpath[n - 5] = 0;
            strcat(wpath, ".safetensors");
        }
    }
    if (!rc) {
        const char *paths[2] = {o.out, o.weights_out ? o.weights_out : wpath};
        const void *bufs[2] = {text, NULL};
        size_t lens[2] = {len, 0};
        unsigned char *wbuf = NULL;
        int n_files = 1;
        if (paths[1] && strcmp(paths[1], o.out) == 0) {
            diag_error(&d, (Loc){0}, "the weights and the model would both be written to '%s'", o.out);
            rc = EXIT_USER;
        } else if (paths[1]) {
            if (safetensors_encode(&weights, &wbuf, &lens[1])) {
                diag_error(&d, (Loc){0}, "out of memory writing '%s'", paths[1]);
                rc = EXIT_USER;
            }
            bufs[1] = wbuf;
            n_files = 2;
        }
        if (!rc && write_files_atomic(n_files, paths, bufs, lens, &d))
            rc = EXIT_USER;
        ir_free(wbuf);
    }
    free(text);
    free(wpath);
    tensors_free(&weights);
    graph_free(g);
    srcfile_free(src);
    return rc;
}
