/* kiln run: run a model on inputs from .npy files, write or print its outputs.
 *
 * Everything that can be checked is checked before the model runs (every --input
 * names a declared input of the right type, every --output names an output, every
 * declared input is given), and outputs are written only after the whole run
 * succeeded, each through a temporary file, so a failure leaves no output file. */
#include "driver.h"

#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: kiln run MODEL [--input NAME=FILE.npy]... [--output NAME=FILE.npy]...\n"
    "                      [--weights FILE.safetensors]... [--target interp|c|cuda]\n"
    "                      [-O0|-O1|-O2] [--passes=P,...] [--no-PASS] [--dump-dir DIR]\n"
    "\n"
    "Runs MODEL once. Without --output, prints each output's name, type and first values.\n"
    "The reference interpreter (--target interp) is the only target in this version and\n"
    "the default.\n";

static int find_binding(const Binding *b, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(b[i].name, name) == 0)
            return i;
    return -1;
}

static bool has_duplicate(const Binding *b, int n, const char *what) {
    for (int i = 0; i < n; i++)
        if (find_binding(b, i, b[i].name) >= 0) {
            fprintf(stderr, "kiln: error: %s '%s' is given twice\n", what, b[i].name);
            return true;
        }
    return false;
}

/* Reads every declared input from its --input file, in declaration order. */
static int read_inputs(const Graph *g, const Options *o, Tensor **in, Diag *d) {
    int ids[MAX_FILES];
    int n = graph_inputs(g, ids, MAX_FILES);
    if (n > MAX_FILES)
        return diag_error(d, (Loc){0}, "the model has more than %d inputs", MAX_FILES);
    for (int i = 0; i < o->n_inputs; i++) {
        int v = graph_find(g, o->inputs[i].name);
        if (v < 0 || g->values[v].node < 0 || g->nodes[g->values[v].node]->op != OP_INPUT)
            return diag_error(d, (Loc){0}, "--input %s: the model has no input named '%s'", o->inputs[i].file,
                              o->inputs[i].name);
    }
    for (int i = 0; i < n; i++) {
        const Value *v = &g->values[ids[i]];
        char ty[160];
        type_str(&v->type, ty, sizeof ty);
        int b = find_binding(o->inputs, o->n_inputs, v->name);
        if (b < 0)
            return diag_error(d, (Loc){0}, "input '%s' (%s) was not given; pass --input %s=FILE.npy", v->name,
                              ty, v->name);
        /* the input's name and type go into every message about its file */
        char label[512];
        snprintf(label, sizeof label, "input '%s' (%s) from %s", v->name, ty, o->inputs[b].file);
        unsigned char *buf;
        size_t len;
        if (read_file_bytes(o->inputs[b].file, &buf, &len, d))
            return -1;
        int rc = npy_parse(buf, len, label, &in[i], d);
        ir_free(buf);
        if (rc)
            return -1;
        if (!type_equal(&in[i]->type, &v->type)) {
            char got[160];
            return diag_error(d, (Loc){0}, "input '%s' must be %s, but %s holds %s", v->name, ty,
                              o->inputs[b].file, type_str(&in[i]->type, got, sizeof got));
        }
    }
    return 0;
}

static void print_output(const char *name, const Tensor *t) {
    char ty[160];
    int64_t n = type_numel(&t->type), shown = n < 10 ? n : 10;
    printf("%s: %s =", name, type_str(&t->type, ty, sizeof ty));
    for (int64_t i = 0; i < shown; i++)
        printf(" %g", t->data[i]);
    if (shown < n)
        printf(" ... (%lld values)", (long long)n);
    printf("\n");
}

static int write_outputs(const Graph *g, const Options *o, Tensor **out, Diag *d) {
    const char *paths[MAX_FILES];
    const void *bufs[MAX_FILES] = {0};
    size_t lens[MAX_FILES];
    int rc = 0;
    for (int i = 0; i < o->n_outputs && !rc; i++) {
        int k = 0;
        while (strcmp(g->values[g->outputs[k]].name, o->outputs[i].name) != 0)
            k++;
        paths[i] = o->outputs[i].file;
        if (npy_encode(out[k], (unsigned char **)&bufs[i], &lens[i]))
            rc = diag_error(d, (Loc){0}, "out of memory writing '%s'", paths[i]);
    }
    if (!rc)
        rc = write_files_atomic(o->n_outputs, paths, bufs, lens, d);
    for (int i = 0; i < o->n_outputs; i++)
        ir_free((void *)bufs[i]);
    return rc;
}

int cmd_run(int argc, char **argv) {
    Options o;
    if (argc > 2 && (strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0)) {
        fputs(usage, stdout);
        return 0;
    }
    int rc = parse_options(
        argc, argv, 2, "--weights --input --output --target -O --passes --no-PASS --dump-dir", usage, &o);
    if (rc)
        return rc;
    if (has_duplicate(o.inputs, o.n_inputs, "--input") || has_duplicate(o.outputs, o.n_outputs, "--output"))
        return EXIT_USAGE;
    Diag d;
    diag_init(&d, stderr);
    if (o.target && strcmp(o.target, "interp") != 0) {
        diag_error(&d, (Loc){0}, "target '%s' is not available in this version of kiln; use --target interp",
                   o.target);
        return EXIT_USER;
    }
    SrcFile *src;
    Graph *g;
    TensorList weights = {0};
    Tensor *in[MAX_FILES] = {0}, **out = NULL;
    rc = load_model(&o, true, &d, &src, &g, &weights);
    if (!rc && pipeline_run(g, &o.pipeline, &d))
        rc = EXIT_USER;
    for (int i = 0; !rc && i < o.n_outputs; i++) {
        bool found = false;
        for (int k = 0; k < g->n_outputs; k++)
            found |= strcmp(g->values[g->outputs[k]].name, o.outputs[i].name) == 0;
        if (!found) {
            diag_error(&d, (Loc){0}, "--output %s: the model has no output named '%s'", o.outputs[i].file,
                       o.outputs[i].name);
            rc = EXIT_USER;
        }
    }
    if (!rc && read_inputs(g, &o, in, &d))
        rc = EXIT_USER;
    if (!rc && !(out = ir_calloc((size_t)g->n_outputs, sizeof *out)))
        rc = EXIT_USER;
    if (!rc && interp_run(g, &weights, (const Tensor *const *)in, out, &d))
        rc = EXIT_USER;
    if (!rc && o.n_outputs > 0 && write_outputs(g, &o, out, &d))
        rc = EXIT_USER;
    if (!rc && o.n_outputs == 0)
        for (int k = 0; k < g->n_outputs; k++)
            print_output(g->values[g->outputs[k]].name, out[k]);
    for (int i = 0; i < MAX_FILES; i++)
        tensor_free(in[i]);
    for (int k = 0; out && k < g->n_outputs; k++)
        tensor_free(out[k]);
    ir_free(out);
    tensors_free(&weights);
    graph_free(g);
    srcfile_free(src);
    return rc;
}
