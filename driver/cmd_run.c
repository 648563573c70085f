/* kiln run: run a model on inputs from .npy files, write or print its outputs.
 *
 * Everything that can be checked is checked before the model runs (every --input
 * names a declared input of the right type, every --output names an output, every
 * declared input is given), and outputs are written only after the whole run
 * succeeded, all together through driver/outputs.c, so a failure leaves no output
 * file, and none may name a file the command reads. */
#include "driver.h"

#include <stdlib.h>
#include <string.h>

static const OptionSpec options[] = {
    {"--input", "NAME=FILE.npy", "the value of the input NAME; every declared input needs one"},
    {"--output", "NAME=FILE.npy", "write the output NAME to FILE (else the outputs are printed)"},
    OPT_WEIGHTS,
    OPT_BIND,
    OPT_DIM,
    {"--target", "interp|c|cuda",
     "run the reference interpreter, generated C (default; compiled through the cache) or generated CUDA"},
    OPT_CPU,
    OPT_LEVEL,
    OPT_PASSES,
    OPT_NO_PASS,
    OPT_DUMP_DIR,
    OPT_CHECK,
    {"--steps", "N", "run N times, each run starting from the params the last one updated (a training step)"},
    {"--save-weights", "FILE.safetensors",
     "write every param of the model, with the values the last run left, to FILE (a checkpoint; --weights "
     "FILE resumes from it)"},
    OPT_QUIET,
    OPT_HELP,
    {NULL, NULL, NULL},
};

static const Command command = {
    "run",
    "MODEL [options] [--input NAME=FILE.npy]... [--output NAME=FILE.npy]...",
    "Runs MODEL (a .kiln or .onnx file, or a .so made by kiln compile) once, or N times\n"
    "with --steps (the outputs are the last run's; --save-weights writes the params it\n"
    "leaves). Without --output, prints each output's name, type and first values.\n"
    "--check also compares the target's outputs with the interpreter's. Output files\n"
    "are written only once the whole run succeeded, all together; an output that names\n"
    "a file the command reads is refused.\n",
    options,
};

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

/* A model's inputs or outputs: names and types, from a graph or a compiled model. */
typedef struct {
    const char *name;
    Type type;
} Port;

typedef struct {
    Port in[MAX_PORTS], out[MAX_PORTS];
    int n_in, n_out;
} Signature;

static int graph_signature(const Graph *g, Signature *s, Diag *d) {
    int ids[MAX_PORTS];
    s->n_in = graph_inputs(g, ids, MAX_PORTS);
    if (s->n_in > MAX_PORTS || g->n_outputs > MAX_PORTS)
        return diag_error(d, (Loc){0}, "the model has more than %d inputs or outputs", MAX_PORTS);
    for (int i = 0; i < s->n_in; i++)
        s->in[i] = (Port){g->values[ids[i]].name, g->values[ids[i]].type};
    s->n_out = g->n_outputs;
    for (int k = 0; k < g->n_outputs; k++)
        s->out[k] = (Port){g->values[g->outputs[k]].name, g->values[g->outputs[k]].type};
    return 0;
}

static int port_of(const char *model, const kiln_model_def *def, const kiln_tensor_info *t, Port *p,
                   Diag *d) {
    p->name = t->name;
    return tensor_info_type(model, def, t, &p->type, d);
}

static int compiled_signature(const char *model, const kiln_model_def *def, Signature *s, Diag *d) {
    if (def->n_inputs > MAX_PORTS || def->n_outputs > MAX_PORTS || def->n_inputs < 0 || def->n_outputs < 0)
        return diag_error(d, (Loc){0}, "%s: too many inputs or outputs", model);
    s->n_in = def->n_inputs;
    s->n_out = def->n_outputs;
    for (int i = 0; i < s->n_in; i++)
        if (port_of(model, def, &def->inputs[i], &s->in[i], d))
            return -1;
    for (int k = 0; k < s->n_out; k++)
        if (port_of(model, def, &def->outputs[k], &s->out[k], d))
            return -1;
    return 0;
}

/* Reads every input from its --input file, in declaration order, and the size of the
 * symbolic dim they give (0: the model has none). */
static int read_inputs(const Signature *s, const Options *o, Tensor **in, int64_t *sym_size, Diag *d) {
    *sym_size = 0;
    for (int i = 0; i < o->n_inputs; i++) {
        bool found = false;
        for (int k = 0; k < s->n_in; k++)
            found |= strcmp(s->in[k].name, o->inputs[i].name) == 0;
        if (!found)
            return diag_error(d, (Loc){0}, "--input %s: the model has no input named '%s'", o->inputs[i].file,
                              o->inputs[i].name);
    }
    for (int i = 0; i < s->n_in; i++) {
        const Port *p = &s->in[i];
        char ty[160];
        type_str(&p->type, ty, sizeof ty);
        int b = find_binding(o->inputs, o->n_inputs, p->name);
        if (b < 0)
            return diag_error(d, (Loc){0}, "input '%s' (%s) was not given; pass --input %s=FILE.npy", p->name,
                              ty, p->name);
        /* the input's name and type go into every message about its file */
        char label[512];
        snprintf(label, sizeof label, "input '%s' (%s) from %s", p->name, ty, o->inputs[b].file);
        unsigned char *buf;
        size_t len;
        if (read_file_bytes(o->inputs[b].file, &buf, &len, d))
            return -1;
        int rc = npy_parse(buf, len, label, &in[i], d);
        ir_free(buf);
        if (rc)
            return -1;
        int64_t size_here;
        char got[160];
        char range[100] = "";
        if (p->type.sym)
            snprintf(range, sizeof range, " (%s from 1 to %lld)", p->type.sym,
                     (long long)(p->type.dims[0] / p->type.sym_mult));
        if (!type_admits(&p->type, &in[i]->type, &size_here))
            return diag_error(d, (Loc){0}, "input '%s' must be %s%s, but %s holds %s", p->name, ty, range,
                              o->inputs[b].file, type_str(&in[i]->type, got, sizeof got));
        if (size_here && *sym_size && size_here != *sym_size)
            return diag_error(
                d, (Loc){0},
                "input '%s' (%s) from %s is %s: %s = %lld, but the inputs before it give %s = %lld", p->name,
                ty, o->inputs[b].file, type_str(&in[i]->type, got, sizeof got), p->type.sym,
                (long long)size_here, p->type.sym, (long long)*sym_size);
        if (size_here)
            *sym_size = size_here;
    }
    return 0;
}

static void print_output(const char *name, const Tensor *t) {
    char ty[160];
    int64_t n = type_numel(&t->type), shown = n < 10 ? n : 10;
    printf("%s: %s =", name, type_str(&t->type, ty, sizeof ty));
    for (int64_t i = 0; i < shown; i++)
        if (t->type.dtype == DT_F32)
            printf(" %g", t->data[i]);
        else
            printf(" %lld", (long long)tensor_int(t, i));
    if (shown < n)
        printf(" ... (%lld values)", (long long)n);
    printf("\n");
}

/* Every param of the model as it starts, in declaration order: the values --save-weights
 * writes, once the updated ones are copied in after the runs. */
static int source_params(const Graph *g, const TensorList *weights, TensorList *saved, Diag *d) {
    for (int i = 0; i < g->n_nodes; i++) {
        const Node *n = g->nodes[i];
        Tensor *t = NULL;
        if (n->op != OP_PARAM)
            continue;
        if (param_value(g, n, weights, &t, d))
            return -1;
        if (tensors_add(saved, g->values[n->out[0]].name, t))
            return diag_error(d, (Loc){0}, "out of memory");
    }
    return 0;
}

static int64_t tensor_bytes(const Tensor *t) {
    return type_numel(&t->type) * dtype_size(t->type.dtype);
}

/* The params the interpreter's runs updated, into saved. */
static void interp_updated_params(const TensorList *weights, TensorList *saved) {
    for (int i = 0; i < saved->n; i++) {
        Tensor *t = saved->items[i].tensor, *now = tensors_find(weights, saved->items[i].name);
        if (now && type_equal(&now->type, &t->type))
            memcpy(t->bytes, now->bytes, (size_t)tensor_bytes(t));
    }
}

/* Whether the compiled model describes its updated params; if not, an error saying
 * what needs them. */
static bool describes_params(const char *model, const kiln_module *m, const char *need, Diag *d) {
    if (kiln_def(m)->extensions & KILN_EXT_PARAMS)
        return true;
    diag_error(d, (Loc){0},
               "'%s' was compiled by a kiln that did not describe its params; compile it again %s", model,
               need);
    return false;
}

/* --weights for a .so: the values of params its runs update, written into its
 * instance (a checkpoint resumed); its other params are compiled in. */
static int write_updated_params(const Options *o, kiln_module *m, Diag *d) {
    TensorList given = {0};
    int rc = describes_params(o->model, m, "to give it weights", d) ? 0 : -1;
    for (int i = 0; !rc && i < o->n_weights; i++)
        rc = safetensors_read(o->weights[i], &given, d);
    const kiln_model_def *def = kiln_def(m);
    for (int i = 0; !rc && i < given.n; i++) {
        const NamedTensor *w = &given.items[i];
        int k = 0;
        while (k < def->n_params && strcmp(def->params[k].name, w->name) != 0)
            k++;
        Type type = {0};
        char a[160], b[160];
        if (k == def->n_params) {
            diag_warning(d, (Loc){0},
                         "weight '%s' is not a param that '%s' updates; ignored (the others are "
                         "compiled in)",
                         w->name, o->model);
        } else if (!(rc = tensor_info_type(o->model, def, &def->params[k], &type, d)) &&
                   !type_equal(&type, &w->tensor->type)) {
            rc = diag_error(d, (Loc){0}, "weight '%s' has type %s, but '%s' declares it %s", w->name,
                            type_str(&w->tensor->type, a, sizeof a), o->model, type_str(&type, b, sizeof b));
        } else if (!rc) {
            kiln_error err = {.message = ""};
            if (kiln_write_param(m, w->name, w->tensor->bytes, (size_t)tensor_bytes(w->tensor), &err))
                rc = diag_relay_error(d, &err);
        }
    }
    tensors_free(&given);
    return rc;
}

/* The params the compiled model's runs updated, into saved (added there for a .so,
 * whose other params kiln cannot see). */
static int compiled_updated_params(const char *model, kiln_module *m, TensorList *saved, Diag *d) {
    if (!describes_params(model, m, "to save its weights", d))
        return -1;
    const kiln_model_def *def = kiln_def(m);
    for (int i = 0; i < def->n_params; i++) {
        const char *name = def->params[i].name;
        Type type = {0};
        if (tensor_info_type(model, def, &def->params[i], &type, d))
            return -1;
        Tensor *t = tensors_find(saved, name);
        if (!t && (!(t = tensor_new(&type)) || tensors_add(saved, name, t)))
            return diag_error(d, (Loc){0}, "out of memory");
        if (!type_equal(&t->type, &type))
            return diag_internal(d, (Loc){0},
                                 "the compiled model's param '%s' changed its type (a bug in kiln)", name);
        kiln_error err = {.message = ""};
        if (kiln_read_param(m, name, t->bytes, (size_t)tensor_bytes(t), &err))
            return diag_relay_error(d, &err);
    }
    return 0;
}

/* Every --output file, in outs (registered in the same order), then the
 * --save-weights file, all or none. */
static int write_outputs(const Signature *s, const Options *o, Tensor **out, const TensorList *saved,
                         Outputs *outs, Diag *d) {
    int rc = 0;
    for (int i = 0; i < o->n_outputs && !rc; i++) {
        int k = 0;
        while (strcmp(s->out[k].name, o->outputs[i].name) != 0)
            k++;
        unsigned char *buf = NULL;
        size_t len = 0;
        if (npy_encode(out[k], &buf, &len))
            rc = diag_error(d, (Loc){0}, "out of memory writing '%s'", o->outputs[i].file);
        else
            rc = outputs_write(outs, i, buf, len, d);
        ir_free(buf);
    }
    if (!rc && o->save_weights) {
        unsigned char *buf = NULL;
        size_t len = 0;
        if (safetensors_encode(saved, &buf, &len))
            rc = diag_error(d, (Loc){0}, "out of memory writing '%s'", o->save_weights);
        else
            rc = outputs_write(outs, o->n_outputs, buf, len, d);
        ir_free(buf);
    }
    if (!rc)
        rc = outputs_commit(outs, d);
    else
        outputs_abort(outs);
    return rc;
}

/* Whether a run of the C target can come from the model cache, as kiln_jit_file's
 * does: the -O level's whole pipeline, nothing dumped or checked, no --bind or --dim
 * (which the cache's key leaves out), and no --save-weights (which needs the model's
 * params). */
static bool model_cache_applies(const Options *o) {
    return (!o->target || strcmp(o->target, "c") == 0) && !o->pipeline.only && !o->pipeline.n_disabled &&
           !o->pipeline.dump_dir && !o->pipeline.check && !o->n_binds && !o->n_dims && !o->save_weights;
}

/* Runs the model once: in the interpreter, or compiled (JIT, from the model cache,
 * or a .so). */
static int run_model(const Options *o, Outputs *outs, Diag *d) {
    ModelInput file = {0};
    Graph *g = NULL;
    TensorList weights = {0}, saved = {0};
    kiln_module *m = NULL;
    kiln_error err = {.message = ""};
    Signature *sig = ir_calloc(1, sizeof *sig);
    Tensor **in = ir_calloc(MAX_PORTS, sizeof *in), **out = ir_calloc(MAX_PORTS, sizeof *out);
    Check check = {0}; /* --check: the interpreter's outputs on the inputs, before the passes */
    bool interp = o->target && strcmp(o->target, "interp") == 0, inputs_read = false;
    int64_t sym_size = 0; /* the size of the model's symbolic dim the inputs give */
    int rc = 0;
    if (!sig || !in || !out) {
        rc = diag_error(d, (Loc){0}, "out of memory");
    } else if (is_shared_object(o->model)) {
        if (o->pipeline.check)
            rc = diag_error(d, (Loc){0}, "'%s' is compiled; --check needs the .kiln model", o->model);
        else if (interp)
            rc = diag_error(d, (Loc){0}, "'%s' is compiled; the interpreter runs .kiln models", o->model);
        else if (!(m = kiln_load(o->model, &err)))
            rc = diag_relay_error(d, &err);
        else
            rc = compiled_signature(o->model, kiln_def(m), sig, d) ||
                 (o->n_weights && write_updated_params(o, m, d));
    } else {
        /* --check runs the unoptimized model on the given inputs, so they are read
           before the passes, against its signature */
        PipelineOptions pipeline = o->pipeline;
        pipeline.check_result = &check;
        if (!interp)
            progress_start(o->model, o->quiet);
        JitOptions jo = {0};
        char key[MODEL_KEY_BYTES];
        bool cache = !interp && model_cache_applies(o);
        rc = !interp && jit_options(o, &jo, d);
        if (!rc && cache) {
            model_input_init(&file, o->model, o->weights, o->n_weights);
            m = jit_from_model_cache(&file, o->pipeline.level, &jo, &err);
        }
        if (m) {
            rc = compiled_signature(o->model, kiln_def(m), sig, d);
        } else {
            rc = rc || read_model(o, &file, d);
            if (!rc && cache)
                jit_keep_model(&file, o->pipeline.level, &jo, key);
            rc = rc || parse_read_model(o, &file, true, d, &g, &weights);
            progress_stage("optimizing");
            rc = rc || (o->save_weights && source_params(g, &weights, &saved, d));
            if (!rc && pipeline.check &&
                !(rc = graph_signature(g, sig, d) || read_inputs(sig, o, in, &sym_size, d))) {
                pipeline.check_inputs = (const Tensor *const *)in;
                inputs_read = true;
            }
            rc = rc || pipeline_run(g, &weights, &pipeline, d) || graph_signature(g, sig, d);
            if (!rc && !interp && !(m = jit_graph(g, &weights, &jo, d, &err)))
                rc = -1;
        }
        progress_end();
    }
    for (int i = 0; !rc && i < o->n_outputs; i++) {
        bool found = false;
        for (int k = 0; k < sig->n_out; k++)
            found |= strcmp(sig->out[k].name, o->outputs[i].name) == 0;
        if (!found)
            rc = diag_error(d, (Loc){0}, "--output %s: the model has no output named '%s'",
                            o->outputs[i].file, o->outputs[i].name);
    }
    if (!rc && !inputs_read)
        rc = read_inputs(sig, o, in, &sym_size, d);
    if (!rc && o->pipeline.check && o->steps > 1)
        rc = diag_error(d, (Loc){0}, "--check compares one run; it cannot be combined with --steps");
    for (long step = 0; !rc && interp && step < o->steps; step++) {
        for (int k = 0; k < sig->n_out; k++) {
            tensor_free(out[k]);
            out[k] = NULL;
        }
        rc = interp_step(g, &weights, (const Tensor *const *)in, out, d);
    }
    if (!rc && !interp) {
        const void **inputs = ir_calloc((size_t)sig->n_in + 1, sizeof *inputs);
        void **outputs = ir_calloc((size_t)sig->n_out + 1, sizeof *outputs);
        if (!inputs || !outputs)
            rc = diag_error(d, (Loc){0}, "out of memory");
        for (int i = 0; !rc && i < sig->n_in; i++)
            inputs[i] = in[i]->data;
        for (int k = 0; !rc && k < sig->n_out; k++) {
            Type t = type_at(&sig->out[k].type, sym_size);
            if (!(out[k] = tensor_new(&t)))
                rc = diag_error(d, (Loc){0}, "out of memory");
            else
                outputs[k] = out[k]->data;
        }
        for (long step = 0; !rc && step < o->steps; step++)
            if (kiln_run_sym(m, sym_size ? &sym_size : NULL, inputs, outputs, &err))
                rc = diag_relay_error(d, &err);
        ir_free(inputs);
        ir_free(outputs);
    }
    if (!rc && o->save_weights) {
        if (interp)
            interp_updated_params(&weights, &saved);
        else
            rc = compiled_updated_params(o->model, m, &saved, d);
    }
    if (!rc && o->pipeline.check) {
        char name[64], what[64];
        const char *target = o->target ? o->target : "c";
        snprintf(name, sizeof name, "target %s", target);
        snprintf(what, sizeof what, "target '%s'", target);
        rc = check_outputs(&check, g, out, name, what, d);
    }
    if (!rc && (o->n_outputs > 0 || o->save_weights))
        rc = write_outputs(sig, o, out, &saved, outs, d);
    if (!rc && o->n_outputs == 0)
        for (int k = 0; k < sig->n_out; k++)
            print_output(sig->out[k].name, out[k]);
    for (int i = 0; in && out && i < MAX_PORTS; i++) {
        tensor_free(in[i]);
        tensor_free(out[i]);
    }
    ir_free(in);
    ir_free(out);
    ir_free(sig);
    check_free(&check);
    kiln_free(m);
    tensors_free(&weights);
    tensors_free(&saved);
    graph_free(g);
    model_input_free(&file);
    return rc ? EXIT_USER : 0;
}

int cmd_run(int argc, char **argv) {
    if (help_requested(argc, argv, &command))
        return 0;
    Options o;
    int rc = parse_options(argc, argv, 2, &command, &o);
    if (rc)
        return rc;
    if (has_duplicate(o.inputs, o.n_inputs, "--input") || has_duplicate(o.outputs, o.n_outputs, "--output"))
        return EXIT_USAGE;
    Diag d;
    diag_init(&d, stderr);
    static Outputs outs;
    outputs_init(&outs);
    for (int i = 0; i < o.n_outputs; i++)
        outputs_add(&outs, o.outputs[i].file, "--output");
    if (o.save_weights)
        outputs_add(&outs, o.save_weights, "--save-weights");
    if (outputs_check(&outs, &o, &d))
        return EXIT_USER;
    return exit_status(run_model(&o, &outs, &d), &d);
}
