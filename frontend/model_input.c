/* A model as read from its files, once: its text or ONNX bytes, and the bytes of its
 * weights files. The model cache (codegen/jit.c) keys a model by these bytes, and a
 * miss parses these same bytes, so what is hashed and what is compiled cannot
 * disagree even when a file changes meanwhile. */
#include "frontend.h"

#include <string.h>

static int read_weights(ModelInput *in, const char *const *paths, int n, Diag *d) {
    in->weights_paths = paths;
    if (n <= 0)
        return 0;
    if (!(in->weights = ir_calloc((size_t)n, sizeof *in->weights)))
        return diag_error(d, (Loc){0}, "out of memory");
    for (; in->n_weights < n; in->n_weights++) {
        ModelBytes *w = &in->weights[in->n_weights];
        if (read_file_bytes(paths[in->n_weights], &w->bytes, &w->len, d))
            return -1;
    }
    return 0;
}

int model_input_read(ModelInput *in, const char *path, const char *const *weights, int n_weights, Diag *d) {
    *in = (ModelInput){.name = path, .onnx = is_onnx_path(path)};
    int rc = in->onnx                            ? read_file_bytes(path, &in->file.bytes, &in->file.len, d)
             : (in->src = srcfile_read(path, d)) ? 0
                                                 : -1;
    return rc ? rc : read_weights(in, weights, n_weights, d);
}

int model_input_text(ModelInput *in, const char *text, const char *const *weights, int n_weights, Diag *d) {
    *in = (ModelInput){.name = "<model>"};
    if (!(in->src = srcfile_from_string(in->name, text)))
        return diag_error(d, (Loc){0}, "out of memory");
    return read_weights(in, weights, n_weights, d);
}

void model_input_free(ModelInput *in) {
    srcfile_free(in->src);
    ir_free(in->file.bytes);
    for (int i = 0; i < in->n_weights; i++)
        ir_free(in->weights[i].bytes);
    ir_free(in->weights);
    *in = (ModelInput){0};
}

Graph *model_input_parse(const ModelInput *in, const OnnxBind *binds, int n_binds, TensorList *weights,
                         Diag *d) {
    Graph *g = NULL;
    if (in->onnx) {
        char *dir = path_dir(in->name);
        if (!dir)
            diag_error(d, (Loc){0}, "out of memory");
        else if (!(g = onnx_import_buffer(in->file.bytes, in->file.len, in->name, dir, binds, n_binds,
                                          weights, d)) &&
                 !d->errors)
            diag_error(d, (Loc){0}, "cannot import '%s'", in->name);
        ir_free(dir);
    } else if (n_binds) {
        diag_error(d, (Loc){0}, "--bind applies to the inputs of .onnx models; '%s' is not one", in->name);
    } else if ((g = parse_model(in->src, d)) && verify_graph(g, d)) {
        graph_free(g);
        g = NULL;
    }
    for (int i = 0; g && i < in->n_weights; i++)
        if (safetensors_parse(in->weights[i].bytes, in->weights[i].len, in->weights_paths[i], weights, d)) {
            graph_free(g);
            g = NULL;
        }
    return g;
}
