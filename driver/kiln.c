/* kiln: the command-line driver.
 *
 *   kiln run MODEL ...    run a model (the reference interpreter for now)
 *   kiln opt MODEL ...    parse, verify, optimize and print a model
 *   kiln bench MODEL ...  time a compiled model's runs, per kernel with --profile
 *   kiln dot MODEL ...    draw the graph after the passes, as Graphviz text
 *
 * This file dispatches to the commands and holds what they share: option parsing
 * and loading a model with its weights. */
#include "driver.h"

#include <stdlib.h>
#include <string.h>

static const char usage_main[] =
    "usage: kiln COMMAND MODEL [options]\n"
    "\n"
    "commands:\n"
    "  run      run a model on inputs given as .npy files\n"
    "  compile  compile a model into a shared object\n"
    "  bench    time a model's runs, and with --profile each kernel's share\n"
    "  opt      parse, verify and optimize a model, and print it\n"
    "  dot      draw a model after the passes as a Graphviz graph\n"
    "  import   translate an ONNX model into a .kiln model and its weights\n"
    "\n"
    "`kiln COMMAND --help` describes a command's options.\n"
    "Exit status: 0 success, 1 bad model/weights/inputs, 2 bad command line, 3 internal error.\n";

static bool allowed_option(const char *allowed, const char *opt) {
    size_t n = strlen(opt);
    for (const char *p = strstr(allowed, opt); p; p = strstr(p + 1, opt))
        if ((p == allowed || p[-1] == ' ') && (p[n] == ' ' || p[n] == 0))
            return true;
    return false;
}

static int usage_error(const char *usage, const char *fmt, const char *arg) {
    fprintf(stderr, "kiln: error: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n%s", usage);
    return EXIT_USAGE;
}

/* NAME=FILE */
static int parse_binding(const char *arg, Binding *b, const char *usage) {
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg || !eq[1])
        return usage_error(usage, "expected NAME=FILE, got '%s'", arg);
    static char names[2 * MAX_FILES][256];
    static int next;
    char *name = names[next++ % (2 * MAX_FILES)];
    snprintf(name, sizeof names[0], "%.*s", (int)(eq - arg), arg);
    *b = (Binding){name, eq + 1};
    return 0;
}

int parse_options(int argc, char **argv, int first, const char *allowed, const char *usage, Options *o) {
    memset(o, 0, sizeof *o);
    o->pipeline.level = 2;
    o->steps = 1;
    o->pipeline.verify = true; /* cheap, and catches a broken pass where it happens */
    o->pipeline.lower = true;  /* kiln opt, which only prints, turns it off */
    o->pipeline.disabled = o->disabled;
    for (int i = first; i < argc; i++) {
        char *arg = argv[i];
        char key[64];
        const char *value = NULL;
        if (arg[0] != '-' || !arg[1]) {
            if (o->model)
                return usage_error(usage, "unexpected argument '%s' (one model at a time)", arg);
            o->model = arg;
            continue;
        }
        const char *eq = strchr(arg, '=');
        snprintf(key, sizeof key, "%.*s", eq ? (int)(eq - arg) : (int)strlen(arg), arg);
        if (strcmp(key, "-O0") == 0 || strcmp(key, "-O1") == 0 || strcmp(key, "-O2") == 0) {
            o->pipeline.level = key[2] - '0';
            strcpy(key, "-O");
        }
        bool takes_value = strcmp(key, "-o") == 0 || strcmp(key, "--weights") == 0 ||
                           strcmp(key, "--input") == 0 || strcmp(key, "--output") == 0 ||
                           strcmp(key, "--target") == 0 || strcmp(key, "--passes") == 0 ||
                           strcmp(key, "--dump-dir") == 0 || strcmp(key, "--emit-source") == 0 ||
                           strcmp(key, "--header") == 0 || strcmp(key, "--steps") == 0 ||
                           strcmp(key, "--bind") == 0 || strcmp(key, "--weights-out") == 0;
        bool is_no_pass = strncmp(key, "--no-", 5) == 0 && key[5];
        /* --bind goes with every command that reads a model with its weights */
        bool bind_ok = strcmp(key, "--bind") == 0 && allowed_option(allowed, "--weights");
        if (!bind_ok && !allowed_option(allowed, is_no_pass ? "--no-PASS" : key))
            return usage_error(usage, "unknown option '%s'", arg);
        if (takes_value) {
            value = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
            if (!value || !*value)
                return usage_error(usage, "option '%s' needs a value", key);
        } else if (eq && !is_no_pass) {
            return usage_error(usage, "option '%s' takes no value", key);
        }
        if (o->n_weights == MAX_FILES || o->n_inputs == MAX_FILES || o->n_outputs == MAX_FILES ||
            o->pipeline.n_disabled == MAX_FILES || o->n_binds == MAX_FILES)
            return usage_error(usage, "too many options%s", "");
        if (strcmp(key, "-o") == 0)
            o->out = value;
        else if (strcmp(key, "--weights") == 0)
            o->weights[o->n_weights++] = value;
        else if (strcmp(key, "--input") == 0) {
            if (parse_binding(value, &o->inputs[o->n_inputs++], usage))
                return EXIT_USAGE;
        } else if (strcmp(key, "--output") == 0) {
            if (parse_binding(value, &o->outputs[o->n_outputs++], usage))
                return EXIT_USAGE;
        } else if (strcmp(key, "--bind") == 0) {
            if (parse_binding(value, &o->binds[o->n_binds++], usage))
                return EXIT_USAGE;
        } else if (strcmp(key, "--weights-out") == 0) {
            o->weights_out = value;
        } else if (strcmp(key, "--target") == 0) {
            if (strcmp(value, "interp") && strcmp(value, "c") && strcmp(value, "cuda"))
                return usage_error(usage, "unknown target '%s' (interp, c or cuda)", value);
            o->target = value;
        } else if (strcmp(key, "--passes") == 0)
            o->pipeline.only = value;
        else if (strcmp(key, "--dump-dir") == 0)
            o->pipeline.dump_dir = value;
        else if (strcmp(key, "--emit-source") == 0)
            o->emit_source = value;
        else if (strcmp(key, "--header") == 0)
            o->header = value;
        else if (strcmp(key, "--steps") == 0) {
            char *end;
            o->steps = strtol(value, &end, 10);
            if (*end || o->steps < 1 || o->steps > 1000000000)
                return usage_error(usage, "--steps needs a positive integer, not '%s'", value);
        }
        else if (strcmp(key, "--list-passes") == 0)
            o->list_passes = true;
        else if (strcmp(key, "--memory-report") == 0)
            o->memory_report = true;
        else if (strcmp(key, "--check") == 0)
            o->pipeline.check = true;
        else if (is_no_pass)
            o->disabled[o->pipeline.n_disabled++] = arg + 5;
    }
    if (!o->model && !o->list_passes)
        return usage_error(usage, "missing MODEL%s", "");
    Diag d;
    diag_init(&d, stderr);
    if (pipeline_check_names(&o->pipeline, &d))
        return EXIT_USAGE;
    return 0;
}

JitOptions jit_options(const Options *o) {
    Target target = o->target && strcmp(o->target, "cuda") == 0 ? TARGET_CUDA : TARGET_C;
    return (JitOptions){NULL, target, pipeline_selects(&o->pipeline, "memplan"), o->pipeline.dump_dir, NULL};
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

bool is_shared_object(const char *path) {
    return ends_with(path, ".so");
}

/* Mis-shaped weights are errors, and so are missing ones when the model is to run;
 * weights no param uses are warnings. */
static int check_weights(const Graph *g, const TensorList *w, bool require_all, Diag *d) {
    for (int i = 0; i < g->n_nodes; i++) {
        const Node *n = g->nodes[i];
        if (n->op != OP_PARAM || (!require_all && !tensors_find(w, g->values[n->out[0]].name)))
            continue;
        Tensor *t = NULL;
        if (param_value(g, n, w, &t, d))
            return -1;
        tensor_free(t);
    }
    for (int i = 0; i < w->n; i++) {
        int v = graph_find(g, w->items[i].name);
        if (v < 0 || g->nodes[g->values[v].node]->op != OP_PARAM)
            diag_warning(d, (Loc){0}, "weight '%s' is not a param of the model; ignored", w->items[i].name);
    }
    return 0;
}

int load_model(const Options *o, bool require_weights, Diag *d, SrcFile **src, Graph **g,
               TensorList *weights) {
    *src = NULL;
    *g = NULL;
    if (ends_with(o->model, ".so")) {
        diag_error(d, (Loc){0}, "'%s': this command reads .kiln and .onnx models", o->model);
        return EXIT_USER;
    }
    if (is_onnx_path(o->model)) {
        OnnxBind binds[MAX_FILES];
        for (int i = 0; i < o->n_binds; i++)
            binds[i] = (OnnxBind){o->binds[i].name, o->binds[i].file, false};
        if (!(*g = onnx_import(o->model, binds, o->n_binds, weights, d)))
            return EXIT_USER;
    } else if (o->n_binds) {
        diag_error(d, (Loc){0}, "--bind applies to the inputs of .onnx models; '%s' is not one", o->model);
        return EXIT_USER;
    } else {
        *src = srcfile_read(o->model, d);
        if (!*src || !(*g = parse_model(*src, d)) || verify_graph(*g, d))
            return EXIT_USER;
    }
    for (int i = 0; i < o->n_weights; i++)
        if (safetensors_read(o->weights[i], weights, d))
            return EXIT_USER;
    return check_weights(*g, weights, require_weights, d) ? EXIT_USER : 0;
}

int main(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        fputs(usage_main, argc < 2 ? stderr : stdout);
        return argc < 2 ? EXIT_USAGE : 0;
    }
    if (strcmp(argv[1], "run") == 0)
        return cmd_run(argc, argv);
    if (strcmp(argv[1], "opt") == 0)
        return cmd_opt(argc, argv);
    if (strcmp(argv[1], "compile") == 0)
        return cmd_compile(argc, argv);
    if (strcmp(argv[1], "bench") == 0)
        return cmd_bench(argc, argv);
    if (strcmp(argv[1], "dot") == 0)
        return cmd_dot(argc, argv);
    if (strcmp(argv[1], "import") == 0)
        return cmd_import(argc, argv);
    fprintf(stderr, "kiln: error: unknown command '%s'\n%s", argv[1], usage_main);
    return EXIT_USAGE;
}
