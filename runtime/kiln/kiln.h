/* libkiln: load compiled models, or compile models in process, and run them.
 *
 *   kiln_module *m = kiln_jit_file("model.kiln", NULL, &err);   // or kiln_load("model.so", &err)
 *   const kiln_model_def *def = kiln_def(m);                     // names and shapes
 *   kiln_run(m, inputs, outputs, &err);                          // as often as wanted
 *   kiln_free(m);
 *
 * Every function that can fail takes a kiln_error and returns NULL or nonzero with
 * a message in err->message. Any number of threads may call these functions at
 * once on different modules. A module holds one instance of its model: one
 * kiln_run at a time per module (kiln_def(m)->create makes further instances, each
 * of which may run on a thread of its own). */
#ifndef KILN_KILN_H
#define KILN_KILN_H

#include "model.h"

/* What libkiln exports: these functions and nothing else (it is built with hidden
 * visibility, and tests/check_exports.sh holds it to this header). */
#if defined(__GNUC__) || defined(__clang__)
#define KILN_API __attribute__((visibility("default")))
#else
#define KILN_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char message[1024];
} kiln_error;

typedef struct {
    const char *target;         /* "c" (the default when NULL) or "cuda" */
    int opt_level;              /* 0, 1 or 2 (the pass pipeline's -O level) */
    const char *const *weights; /* safetensors files with values for params */
    int n_weights;
    const char *cache_dir; /* NULL: $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln */
    const char *cpu;       /* the -march the code is built for: "native" (the default when NULL),
                              "x86-64", "x86-64-v2", "x86-64-v3" or "x86-64-v4" */
} kiln_options;

typedef struct kiln_module kiln_module;

/* Opens a shared object made by `kiln compile` and creates an instance. */
KILN_API kiln_module *kiln_load(const char *path_to_so, kiln_error *err);
/* Compiles a model given as text (or read from a file: .kiln, or .onnx, imported
 * with its initializers as weights) and creates an instance; opts may be NULL for
 * the defaults. */
KILN_API kiln_module *kiln_jit(const char *model_text, const kiln_options *opts, kiln_error *err);
KILN_API kiln_module *kiln_jit_file(const char *path, const kiln_options *opts, kiln_error *err);
/* Runs the model once on dense, C-order float buffers of the sizes kiln_def gives. */
KILN_API int kiln_run(kiln_module *m, const void *const *inputs, void *const *outputs, kiln_error *err);
KILN_API const kiln_model_def *kiln_def(const kiln_module *m);
KILN_API void kiln_free(kiln_module *m);

#ifdef __cplusplus
}
#endif

#endif
