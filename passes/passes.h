/* The pass pipeline: the list of passes in order, and how a command selects them.
 *
 * A pass is a graph-to-graph function. The pipeline runs the passes the options
 * select, restores dependency order and runs the verifier after each (when asked:
 * tests and debug builds), and with a dump directory writes `00-input.kiln` and
 * `NN-PASS.kiln` after each pass, each a valid model that kiln accepts as it is.
 *
 * Passes see the weights: a param with a weight or an initializer, like a const,
 * has a value known at compile time. A pass never changes a weight in place; a
 * value it computes becomes a new param with a new name (pass_add_param), and the
 * dump of a stage carries those params in `NN-PASS.safetensors`. */
#ifndef KILN_PASSES_H
#define KILN_PASSES_H

#include "../ir/ir.h"

typedef struct {
    Graph *g;
    TensorList *weights; /* the given weights, then the params passes made */
    int n_given;         /* weights->items[0 .. n_given) are the given ones */
    Diag *d;
} PassContext;

typedef struct {
    const char *name;
    int level; /* the lowest -O level that runs it */
    /* NULL for a stage of code generation (memory planning), which the pipeline
     * lists so that -O, --passes and --no-NAME select it like any pass. */
    int (*run)(PassContext *c);
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
    bool lower;           /* the graph is to run or be compiled: autodiff runs whatever else does */
    bool check;           /* --check: compare the outputs after every pass (check.c) */
    /* the inputs of --check in declaration order; NULL: deterministic random ones */
    const Tensor *const *check_inputs;
    /* where the check's inputs and reference outputs go after the passes, for the
       caller to compare the target's outputs with (check_outputs); NULL: freed */
    struct Check *check_result;
} PipelineOptions;

/* Checks that every name in `only` and `disabled` is a pass; -1 after a diagnostic. */
int pipeline_check_names(const PipelineOptions *o, Diag *d);
/* Runs the selected passes on g; the params they make are appended to weights. */
int pipeline_run(Graph *g, TensorList *weights, const PipelineOptions *o, Diag *d);
/* Whether the options select the pass (or code generation stage) `name`. */
bool pipeline_selects(const PipelineOptions *o, const char *name);

/* ---- What passes share (pass_util.c) ---- */

/* The value of v when it is known at compile time: a const, or a param with a
 * weight or an initializer. 1 with a new tensor in *out, 0 when not known, -1
 * after a diagnostic. */
int pass_known_value(PassContext *c, int v, Tensor **out);
/* The value of v when it is a known f32 scalar (one element): true with it in *out;
 * false when not known, with *rc set to -1 after a diagnostic. */
bool pass_known_scalar(PassContext *c, int v, double *out, int *rc);
/* A new param holding t (ownership passes to the weights), named from `base` so
 * that no value or weight has the name yet; appended to the graph (the pipeline
 * restores order). Its value id, or -1 after a diagnostic. */
int pass_add_param(PassContext *c, const char *base, Tensor *t, Loc loc);
/* The node defining value v (NULL for an orphan). */
Node *pass_definer(const Graph *g, int v);
/* The node defining v when v is read once (uses: graph_count_uses) and the node
 * is an `op`; NULL otherwise. */
Node *pass_single_use(const Graph *g, const int *uses, int v, OpId op);
/* The node reading v when v is read once (uses: graph_count_uses) and the node is
 * an `op`, its index in *at; NULL otherwise. */
Node *pass_only_reader(const Graph *g, const int *uses, int v, OpId op, int *at);
/* A pattern rewrite from node `node` (an op of pass_fuse_each's): marks in dead the
 * nodes it replaces (uses: graph_count_uses of the graph the pass began with);
 * 0 when it rewrote or did not match, -1 after a diagnostic. */
typedef int (*PassFuseAt)(PassContext *c, int node, const int *uses, bool *dead);
/* Calls fuse_at on every node of op that no rewrite has marked dead, in order, then
 * removes the dead ones (pass_remove_dead). */
int pass_fuse_each(PassContext *c, OpId op, PassFuseAt fuse_at);
/* Removes the nodes that dead marks among the first n_nodes (those the pass began
 * with; the nodes it added after them stay) and restores dependency order; -1 after
 * a diagnostic. */
int pass_remove_dead(PassContext *c, const bool *dead, int n_nodes);

/* Building nodes: pass_new_node makes an op node with one result, a fresh value
 * named from base; the pass_set_* calls set its attributes; pass_finish normalizes
 * them and infers the result's type, returning its value id (-1 after a diagnostic). */
Node *pass_new_node(PassContext *c, OpId op, int n_in, const int *in, const char *base, Loc loc);
void pass_set_int(Node *n, AttrId attr, int64_t v);
void pass_set_float(Node *n, AttrId attr, double v);
/* choice: the index of the enum's word, e.g. LAYOUT_NHWC */
void pass_set_enum(Node *n, AttrId attr, int choice);
int pass_set_ints(PassContext *c, Node *n, AttrId attr, const int64_t *v, int count);
/* A reshape's shape: dims, the first one -1 when sym (the value reshaped has the
 * graph's symbolic dim, whatever size it has at a run). */
int pass_set_shape(PassContext *c, Node *n, const int64_t *dims, int rank, bool sym);
int pass_finish(PassContext *c, Node *n);
/* ---- --check (check.c) ---- */

/* How one tensor differs from the reference: the largest error |got - want| (NaN
 * against a number counts as infinite), where, and whether every element is
 * within |a - b| <= 1e-4 + 1e-4 |b| (NaN matching NaN). index < 0: no element differs. */
typedef struct {
    double max_error;
    int64_t index;
    double got, want;
    bool ok;
} CheckDiff;

void check_compare(const Tensor *got, const Tensor *want, CheckDiff *diff);

/* The inputs of the check and the unoptimized model's outputs on them, followed by
 * its updated params' new values. */
typedef struct Check {
    int n_inputs;
    const char **input_names;
    Tensor **inputs;
    int n_outputs, n_updates;
    Tensor **want; /* n_outputs + n_updates */
} Check;

/* Runs the unoptimized graph on the given inputs (declaration order), or on random
 * ones when `given` is NULL, and keeps its outputs. -1 after a diagnostic. */
int check_begin(Check *k, const Graph *g, const TensorList *w, const Tensor *const *given, Diag *d);
/* Runs g after pass `pass` and compares its outputs and new param values with the
 * reference: a line on d->out when they agree, else -1 after an error naming the
 * output or param and the error. */
int check_stage(Check *k, const Graph *g, const TensorList *w, const char *pass, Diag *d);
/* Compares outputs computed some other way (by a target) with the reference,
 * output i of g in got[i]: "check: NAME ok (max error E)" on d->out when they
 * agree, else -1 after an error saying that WHAT ("the C target") changed an output. */
int check_outputs(const Check *k, const Graph *g, Tensor *const *got, const char *name, const char *what,
                  Diag *d);
/* The check's inputs for g's declared inputs, in declaration order (borrowed);
 * -1 after a diagnostic when g declares an input the check does not have. */
int check_bind_inputs(const Check *k, const Graph *g, const Tensor **in, Diag *d);
void check_free(Check *k);

/* The passes, one file each. */
int pass_autodiff(PassContext *c);
int pass_cse(PassContext *c);
int pass_to_linear(PassContext *c);
int pass_layout(PassContext *c);
int pass_fold(PassContext *c);
int pass_fuse_attention(PassContext *c);
int pass_fuse_layer_norm(PassContext *c);
int pass_fuse_gelu(PassContext *c);
int pass_fuse_elementwise(PassContext *c);
int pass_fuse_epilogue(PassContext *c);
int pass_dce(PassContext *c);

#endif
