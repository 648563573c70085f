/* Internal to libkiln and the driver: compiling and loading a graph through the
 * compile cache. */
#ifndef KILN_JIT_H
#define KILN_JIT_H

#include "../runtime/kiln/kiln.h"
#include "codegen.h"

/* How a graph is compiled in process. */
typedef struct {
    const char *cache; /* the compile cache's directory; NULL: the default one */
    Target target;
    bool memplan;         /* plan the workspace with reuse (the pipeline's `memplan` stage) */
    const char *dump_dir; /* also write the generated C as DIR/model.c; NULL: no */
    Str *report;          /* non-NULL: the memory plan's report (plan_report) is appended here */
    const char *cpu;      /* the -march the code is built for (cc_cpus); NULL: native */
} JitOptions;

/* Compiles g (already optimized) through the cache and loads it; NULL with
 * diagnostics in d and a summary in err. */
kiln_module *jit_graph(Graph *g, const TensorList *weights, const JitOptions *o, Diag *d, kiln_error *err);
/* The same with a clock around every kernel, compiled by the system compiler into a
 * shared object: the module's handle is dlopen's, and dlsym finds kiln_profile in it
 * (emit_c_model describes it); for kiln bench --profile. */
kiln_module *jit_graph_profiled(Graph *g, const TensorList *weights, const JitOptions *o, Diag *d,
                                kiln_error *err);

#endif
