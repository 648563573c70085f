/* The pass pipeline: the list of passes in order, and how a command selects them.
 *
 * A pass is a graph-to-graph function. The pipeline runs the passes the options
 * select, runs the verifier after each (when asked: tests and debug builds), and
 * with a dump directory writes `00-input.kiln` and `NN-PASS.kiln` after each pass,
 * each a valid model that kiln accepts as it is. */
#ifndef KILN_PASSES_H
#define KILN_PASSES_H

#include "../ir/ir.h"

typedef struct {
    const char *name;
    int level; /* the lowest -O level that runs it */
    int (*run)(Graph *g, Diag *d);
    const char *summary;
} Pass;

extern const Pass pass_list[];
extern const int pass_count;

const Pass *pass_find(const char *name);

typedef struct {
    int level;             /* -O0, -O1, -O2 */
    const char *only;      /* --passes=a,b,c: exactly these, in this order; NULL: by level */
    const char **disabled; /* --no-PASS */
    int n_disabled;
    const char *dump_dir; /* --dump-dir */
    bool verify;          /* run the verifier after every pass */
} PipelineOptions;

/* Checks that every name in `only` and `disabled` is a pass; -1 after a diagnostic. */
int pipeline_check_names(const PipelineOptions *o, Diag *d);
int pipeline_run(Graph *g, const PipelineOptions *o, Diag *d);

/* The passes, one file each. */
int pass_dce(Graph *g, Diag *d);

#endif
