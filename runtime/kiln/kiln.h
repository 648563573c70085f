/* libkiln: load compiled models, or compile models in process, and run them.
 *
 *   kiln_module *m = kiln_jit_file("model.kiln", NULL, &err);   // or kiln_load("model.so", &err)
 *   const kiln_model_def *def = kiln_def(m);                     // names and shapes
 *   kiln_run(m, inputs, outputs, &err);                          // as often as wanted
 *   kiln_read_param(m, "fc.weight", buf, sizeof buf, &err);      // a training step's params
 *   kiln_set_comm(m, kiln_mpi_comm(mpi), &err);                  // data-parallel, kiln/mpi.h
 *   kiln_free(m);
 *
 * Every function that can fail takes a kiln_error and returns NULL or nonzero with
 * a message in err->message and its kind in err->kind: the input's fault, too
 * little memory, or kiln's own (a bug). libkiln never ends the program it runs in:
 * a failed internal check is an error of kind KILN_ERROR_INTERNAL. Any number of
 * threads may call these functions at once on different modules. A module holds
 * one instance of its model: one kiln_run at a time per module
 * (kiln_def(m)->create makes further instances, each of which may run on a thread
 * of its own). */
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

/* Whose fault an error is (the kiln command's exit status follows from it, cli.md). */
typedef enum {
    KILN_ERROR_USER = 1,      /* the model, a weight, an input or an option is wrong, or the machine
                                 lacks something (a file, a C compiler, a GPU) */
    KILN_ERROR_NO_MEMORY = 2, /* an allocation failed: too little memory for the model */
    KILN_ERROR_INTERNAL = 3   /* kiln itself failed, a bug: the message says "(a bug in kiln)" */
} kiln_error_kind;

typedef struct {
    char message[1024];
    kiln_error_kind kind; /* set together with message */
} kiln_error;

/* How kiln_jit compiles. Every setting that changes compilation is here: libkiln
 * reads no environment variable anywhere else than in kiln_options_from_env (and
 * $TMPDIR, where temporary files go). A NULL string field takes
 * kiln_options_from_env's value, its built-in default where that is NULL too; NULL
 * options are kiln_options_from_env's with opt_level 2. A value outside a field's
 * list is an error of kind KILN_ERROR_USER. */
typedef struct {
    const char *target;         /* "c" (the default when NULL) or "cuda" */
    int opt_level;              /* 0, 1 or 2 (the pass pipeline's -O level) */
    const char *const *weights; /* safetensors files with values for params */
    int n_weights;
    const char *cache_dir; /* the compile cache; no cache when NULL here and in the environment */
    const char *cpu;       /* the -march the code is built for: "native" (the default when NULL),
                              "x86-64", "x86-64-v2", "x86-64-v3" or "x86-64-v4" */
    const char *jit;       /* "clang": compiled in process by Clang's libraries (the default where
                              libkiln has them); "cc": by the C compiler into a cached .so, dlopened */
    const char *cc, *cxx;  /* the C and C++ compilers ("cc" and "c++" when NULL) */
    const char *blas;      /* "on" (the default): the C target's GEMMs of weights that change at
                              run time call OpenBLAS where libkiln was built with it; "off":
                              they are generated loops (GEMMs of weights known when the model
                              is compiled are always kiln's own micro-kernels) */
    const char *cuda;      /* "gpu" (the default): the CUDA target runs on the GPU; "emulate": its
                              kernels are built for the CPU */
} kiln_options;

/* The defaults, from the environment, read once (on the first call; the strings
 * stay valid for the life of the process): cache_dir from $KILN_CACHE_DIR, else
 * $XDG_CACHE_HOME/kiln, else $HOME/.cache/kiln; jit "cc" when $KILN_JIT is `cc`;
 * cc and cxx from $KILN_CC and $KILN_CXX; cpu from $KILN_CPU; blas "off" when
 * $KILN_BLAS is `off`;
 * cuda "emulate" when $KILN_CUDA is `emulate`. Every other field is 0 (NULL): its
 * built-in default. kiln_jit takes a NULL field of its options from here; the kiln
 * command starts from these and sets what its own options say. */
KILN_API kiln_options kiln_options_from_env(void);

typedef struct kiln_module kiln_module;

/* Opens a shared object made by `kiln compile` and creates an instance. */
KILN_API kiln_module *kiln_load(const char *path_to_so, kiln_error *err);
/* Compiles a model given as text (or read from a file: .kiln, or .onnx, imported
 * with its initializers as weights) and creates an instance; opts may be NULL for
 * the defaults. */
KILN_API kiln_module *kiln_jit(const char *model_text, const kiln_options *opts, kiln_error *err);
KILN_API kiln_module *kiln_jit_file(const char *path, const kiln_options *opts, kiln_error *err);
/* Runs the model once on dense, C-order float buffers of the sizes kiln_def gives
 * (a model with a symbolic dim at its bound). */
KILN_API int kiln_run(kiln_module *m, const void *const *inputs, void *const *outputs, kiln_error *err);
/* Runs a model with a symbolic dim at sizes[0] of it (docs/abi.md), on buffers of
 * the shapes at that size; sizes NULL, or a model without one: kiln_run. */
KILN_API int kiln_run_sym(kiln_module *m, const int64_t *sizes, const void *const *inputs,
                          void *const *outputs, kiln_error *err);
KILN_API const kiln_model_def *kiln_def(const kiln_module *m);
/* Copies the param `name` that the model's runs update (one of kiln_def(m)->params,
 * docs/abi.md) out of the instance into dst, or from src into it, between runs;
 * bytes is the buffer's size, which must be the param's. */
KILN_API int kiln_read_param(kiln_module *m, const char *name, void *dst, size_t bytes, kiln_error *err);
KILN_API int kiln_write_param(kiln_module *m, const char *name, const void *src, size_t bytes,
                              kiln_error *err);
/* Makes the module's instance anew, its collectives (allreduce) going through comm
 * (NULL: this process alone); e.g. libkiln_mpi's over MPI (kiln/mpi.h). comm is
 * copied, and its ctx must outlive the module. The new instance's params are the
 * ones compiled in, as after loading. */
KILN_API int kiln_set_comm(kiln_module *m, const kiln_comm *comm, kiln_error *err);
KILN_API void kiln_free(kiln_module *m);
/* libkiln's version, "MAJOR.MINOR.PATCH" (the Python package checks that it has its own). */
KILN_API const char *kiln_version(void);

#ifdef __cplusplus
}
#endif

#endif
