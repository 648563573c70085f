/* The pass pipeline, in order, in one place (QBE's main.c is the model).
 *
 * Each row: the pass name used by --passes= and --no-NAME, the lowest -O level
 * that runs it, and a one-line summary for --list-passes. */
#include "passes.h"

#include "../frontend/frontend.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

const Pass pass_list[] = {
    {"autodiff", 1, pass_autodiff,
     "replace every grad by its backward graph (always, when code is generated)"},
    {"cse", 1, pass_cse, "compute each repeated expression and identical const once"},
    {"to_linear", 1, pass_to_linear,
     "gemm, and matmul plus a bias, as linear (which fuse_epilogue fuses with its activation)"},
    {"layout", 2, pass_layout, "compute convolutions, pools and the ops between them channels last (NHWC)"},
    {"fold", 1, pass_fold, "evaluate ops on known values; fold batch_norm into the conv before it"},
    {"dce", 1, pass_dce, "remove nodes whose results reach no output"},
    {"fuse_attention", 1, pass_fuse_attention,
     "make softmax(q k^T scale + mask) v one attention op, whose kernel never holds the scores"},
    {"fuse_layer_norm", 1, pass_fuse_layer_norm,
     "make (x - mean) / sqrt(mean of squares + eps) * scale + bias one layer_norm op"},
    {"fuse_gelu", 1, pass_fuse_gelu, "make 0.5 x (1 + erf(x / sqrt(2))) one gelu op"},
    {"fuse_elementwise", 1, pass_fuse_elementwise, "fuse trees of elementwise ops into one kernel"},
    {"fuse_epilogue", 1, pass_fuse_epilogue,
     "apply the elementwise op after a conv or linear to its tiles (fused_conv, fused_linear)"},
    {"memplan", 1, NULL, "plan the workspace: buffers with disjoint lifetimes share memory (codegen)"},
};
const int pass_count = (int)(sizeof pass_list / sizeof pass_list[0]);

const Pass *pass_find(const char *name) {
    for (int i = 0; i < pass_count; i++)
        if (strcmp(pass_list[i].name, name) == 0)
            return &pass_list[i];
    return NULL;
}

/* Calls fn on each comma-separated name of list; stops at the first nonzero. */
static int each_name(const char *list, int (*fn)(const char *name, void *ctx), void *ctx) {
    char name[64];
    for (const char *p = list; *p;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        snprintf(name, sizeof name, "%.*s", (int)(len < 63 ? len : 63), p);
        int rc = fn(name, ctx);
        if (rc)
            return rc;
        p += len + (comma != NULL);
    }
    return 0;
}

static int check_one(const char *name, void *ctx) {
    if (pass_find(name))
        return 0;
    return diag_error(ctx, (Loc){0}, "unknown pass '%s' (kiln opt --list-passes lists them)", name);
}

int pipeline_check_names(const PipelineOptions *o, Diag *d) {
    if (o->only && each_name(o->only, check_one, d))
        return -1;
    for (int i = 0; i < o->n_disabled; i++)
        if (check_one(o->disabled[i], d))
            return -1;
    return 0;
}

typedef struct {
    PassContext c;
    const PipelineOptions *o;
    int step;
    Check check;   /* with --check: the reference outputs */
    char *text;    /* with --check: the graph as printed after the last stage */
    bool expanded; /* grad was expanded before the passes the options select */
} Run;

/* The graph as text; NULL when out of memory. */
static char *graph_text(const Graph *g) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return NULL;
    print_graph(g, f);
    fclose(f);
    return text;
}

static bool has_grad(const Graph *g) {
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i]->op == OP_GRAD)
            return true;
    return false;
}

/* --check's reference: the interpreter's outputs on the graph as it is now. */
static int check_start(Run *r) {
    if (check_begin(&r->check, r->c.g, r->c.weights, r->o->check_inputs, r->c.d))
        return -1;
    if (!(r->text = graph_text(r->c.g)))
        return diag_error(r->c.d, (Loc){0}, "out of memory");
    return 0;
}

/* --check after pass `name`: a pass that left the printed graph as it was (same
 * nodes, same params, whose weights never change in place) needs no run. */
static int check_pass(Run *r, const char *name) {
    char *text = graph_text(r->c.g);
    if (!text)
        return diag_error(r->c.d, (Loc){0}, "out of memory");
    int rc = 0;
    if (strcmp(text, r->text) == 0)
        fprintf(r->c.d->out, "check: %s ok (unchanged)\n", name);
    else
        rc = check_stage(&r->check, r->c.g, r->c.weights, name, r->c.d);
    free(r->text);
    r->text = text;
    return rc;
}

/* DIR/NN-STAGE.kiln, and DIR/NN-STAGE.safetensors with the params the passes made
 * that this stage uses (none: no file). Both written together or neither. */
static int dump(Run *r, const char *stage) {
    char kiln_path[4096], st_path[4096];
    snprintf(kiln_path, sizeof kiln_path, "%s/%02d-%s.kiln", r->o->dump_dir, r->step, stage);
    snprintf(st_path, sizeof st_path, "%s/%02d-%s.safetensors", r->o->dump_dir, r->step, stage);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return diag_error(r->c.d, (Loc){0}, "out of memory");
    print_graph(r->c.g, f);
    fclose(f);

    TensorList made = {0}; /* borrows the weights' names and tensors */
    const TensorList *w = r->c.weights;
    made.items = calloc((size_t)(w->n - r->c.n_given) + 1, sizeof *made.items);
    for (int i = r->c.n_given; made.items && i < w->n; i++) {
        int v = graph_find(r->c.g, w->items[i].name);
        if (v >= 0 && r->c.g->values[v].node >= 0)
            made.items[made.n++] = w->items[i];
    }
    int rc = -1;
    if (!made.items)
        diag_error(r->c.d, (Loc){0}, "out of memory");
    else if (made.n == 0)
        rc = write_file_atomic(kiln_path, text, len, r->c.d);
    else if (safetensors_write(st_path, &made, r->c.d) == 0) {
        rc = write_file_atomic(kiln_path, text, len, r->c.d);
        if (rc)
            remove(st_path);
    }
    free(made.items);
    free(text);
    return rc;
}

static bool disabled(const PipelineOptions *o, const char *name) {
    for (int i = 0; i < o->n_disabled; i++)
        if (strcmp(o->disabled[i], name) == 0)
            return true;
    return false;
}

static int run_step(Run *r, const Pass *p) {
    if (!p->run)
        return 0;
    /* a pass whose invariant failed stops the pipeline there, before a later pass
       builds on its graph */
    if (p->run(&r->c) || diag_take_assert(r->c.d))
        return -1;
    if (graph_sort(r->c.g))
        return diag_error(r->c.d, (Loc){0}, "out of memory");
    /* the verifier running out of memory says so, and is no sign of a broken pass */
    if (r->o->verify && verify_graph(r->c.g, r->c.d))
        return r->c.d->kind == DIAG_NO_MEMORY
                   ? -1
                   : diag_internal(r->c.d, (Loc){0}, "the graph is invalid after pass '%s' (a bug in kiln)",
                                   p->name);
    r->step++;
    /* the stage is dumped before it is checked, so a drifting one can be looked at */
    if (r->o->dump_dir && dump(r, p->name))
        return -1;
    return r->text ? check_pass(r, p->name) : 0;
}

static int run_pass(const char *name, void *ctx) {
    Run *r = ctx;
    const Pass *p = pass_find(name);
    if (!KILN_CHECK(p))
        return -1;
    bool expanded = p->run == pass_autodiff && r->expanded;
    return disabled(r->o, name) || expanded ? 0 : run_step(r, p);
}

static int run_passes(Run *r) {
    const PipelineOptions *o = r->o;
    if (o->dump_dir) {
        if (mkdir(o->dump_dir, 0777) != 0 && errno != EEXIST)
            return diag_error(r->c.d, (Loc){0}, "cannot create '%s': %s", o->dump_dir, strerror(errno));
        if (dump(r, "input"))
            return -1;
    }
    /* grad has no kernel: a graph that is to run or be checked has it expanded first,
       at every level */
    if ((o->lower || o->check) && has_grad(r->c.g)) {
        if (run_step(r, pass_find("autodiff")))
            return -1;
        r->expanded = true;
    }
    if (o->check && check_start(r))
        return -1;
    if (o->only)
        return each_name(o->only, run_pass, r);
    for (int i = 0; i < pass_count; i++)
        if (o->level >= pass_list[i].level && run_pass(pass_list[i].name, r))
            return -1;
    return 0;
}

int pipeline_run(Graph *g, TensorList *weights, const PipelineOptions *o, Diag *d) {
    Run r = {{g, weights, weights->n, d}, o, 0, {0}, NULL, false};
    int rc = run_passes(&r);
    if (!rc && o->check && o->check_result)
        *o->check_result = r.check; /* the caller's now */
    else
        check_free(&r.check);
    free(r.text);
    return rc;
}

static int is_name(const char *name, void *ctx) {
    return strcmp(name, ctx) == 0;
}

bool pipeline_selects(const PipelineOptions *o, const char *name) {
    const Pass *p = pass_find(name);
    if (!KILN_CHECK(p))
        return false;
    if (disabled(o, name))
        return false;
    return o->only ? each_name(o->only, is_name, (void *)name) != 0 : o->level >= p->level;
}
