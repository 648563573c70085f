/* Internal to libkiln and the driver: compiling and loading a graph through the
 * compile cache. */
#ifndef KILN_JIT_H
#define KILN_JIT_H

#include "../runtime/kiln/kiln.h"
#include "codegen.h"
#include "../frontend/frontend.h"

/* How a graph is compiled in process: every setting explicit, none read here from
 * the environment (jit_options_from makes one from the public kiln_options). */
typedef struct {
    const char *cache; /* the compile cache's directory; NULL: none, a temporary file */
    Target target;
    bool memplan;                    /* plan the workspace with reuse (the pipeline's `memplan` stage) */
    const char *dump_dir;            /* also write the generated C as DIR/model.c; NULL: no */
    Str *report;                     /* non-NULL: the memory plan's report (plan_report) is appended here */
    Toolchain tools;                 /* the system compilers and the CPU */
    bool clang;                      /* compile in process with Clang's libraries, where kiln has them */
    bool blas;                       /* the C target's GEMMs call OpenBLAS, where kiln has it */
    bool cuda_emulated;              /* the CUDA target's kernels run on the CPU */
    void (*stage)(const char *what); /* told what the compile does next (a progress line); NULL: none */
    const char *model_key; /* the model cache's key of the graph before its passes (jit.c); NULL: none */
} JitOptions;

/* The settings of o, whose NULL fields take kiln_options_from_env's values (all of
 * them when o is NULL), checked and made explicit in *jo (memplan, dump_dir and
 * report left off); -1 after a diagnostic naming a value outside a field's list. */
int jit_options_from(const kiln_options *o, JitOptions *jo, Diag *d);

/* A kiln_error reported in d as an error of its kind. */
int diag_relay_error(Diag *d, const kiln_error *err);

/* Compiles g (already optimized) through the cache and loads it; NULL with
 * diagnostics in d and a summary in err. */
kiln_module *jit_graph(Graph *g, const TensorList *weights, const JitOptions *o, Diag *d, kiln_error *err);
/* The same with a clock around every kernel, compiled by the system compiler into a
 * shared object: the module's handle is dlopen's, and dlsym finds kiln_profile in it
 * (emit_c_model describes it); for kiln bench --profile. */
kiln_module *jit_graph_profiled(Graph *g, const TensorList *weights, const JitOptions *o, Diag *d,
                                kiln_error *err);

/* The model cache's key: hex digits and a NUL. */
enum { MODEL_KEY_BYTES = 40 };

/* The model in, compiled at -O level (its default pipeline) with jo's settings, from
 * the model cache (jit.c), where jo's in-process C target has one and holds it; else
 * NULL. Files in has not read are hashed a chunk at a time, never held whole. */
kiln_module *jit_from_model_cache(const ModelInput *in, int level, const JitOptions *jo, kiln_error *err);
/* After a miss, with in read: where in can have a model entry, jo->model_key = key
 * (MODEL_KEY_BYTES), the key of what was read, so that jit_graph, given the graph
 * parsed from in after that pipeline, writes the entry. */
void jit_keep_model(const ModelInput *in, int level, JitOptions *jo, char *key);

#endif
