/* A model as read from its files, once: its text or ONNX bytes, and the bytes of its
 * weights files. The model cache (codegen/jit.c) keys a model by these bytes, and a
 * miss parses these same bytes, so what is hashed and what is compiled cannot
 * disagree even when a file changes meanwhile. The files are named first and read
 * later (model_input_read), so that a cache hit need not hold them in memory. */
#include "frontend.h"

#include <string.h>

void model_input_init(ModelInput *in, const char *path, const char *const *weights, int n_weights) {
    *in = (ModelInput){
        .name = path, .onnx = is_onnx_path(path), .weights_paths = weights, .n_weights = n_weights};
}

int model_input_text(ModelInput *in, const char *text, const char *const *weights, int n_weights, Diag *d) {
    *in = (ModelInput){.name = "<model>", .weights_paths = weights, .n_weights = n_weights};
    return (in->src = srcfile_from_string(in->name, text)) ? 0 : diag_error(d, (Loc){0}, "out of memory");
}

int model_input_read(ModelInput *in, Diag *d) {
    if (in->read)
        return 0;
    int rc = in->src    ? 0
             : in->onnx ? read_file_bytes(in->name, &in->file.bytes, &in->file.len, d)
             : (in->src = srcfile_read(in->name, d)) ? 0
                                                     : -1;
    if (!rc && in->n_weights > 0 && !(in->weights = ir_calloc((size_t)in->n_weights, sizeof *in->weights)))
        rc = diag_error(d, (Loc){0}, "out of memory");
    for (int i = 0; !rc && i < in->n_weights; i++)
        rc = read_file_bytes(in->weights_paths[i], &in->weights[i].bytes, &in->weights[i].len, d);
    in->read = !rc;
    return rc;
}

void model_input_free(ModelInput *in) {
    srcfile_free(in->src);
    ir_free(in->file.bytes);
    for (int i = 0; in->weights && i < in->n_weights; i++)
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
        diag_error(d, (Loc){0}, "%s applies to the %s of .onnx models; '%s' is not one",
                   binds[0].file ? "--bind" : "--dim", binds[0].file ? "inputs" : "symbolic dims", in->name);
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
