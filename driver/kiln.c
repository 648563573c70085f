/* kiln: the command-line driver.
 *
 *   kiln run MODEL ...      run a model (compiled, or in the reference interpreter)
 *   kiln compile MODEL ...  compile a model into a shared object
 *   kiln opt MODEL ...      parse, verify, optimize and print a model
 *   kiln bench MODEL ...    time a compiled model's runs, per kernel with --profile
 *   kiln dot MODEL ...      draw the graph after the passes, as Graphviz text
 *   kiln import MODEL ...   translate an ONNX model into a .kiln model and weights
 *
 * This file dispatches to the commands and holds what they share: option parsing
 * from each command's table, --help printed from the same table, one-line usage
 * errors, the exit status, loading a model with its weights, and the signal
 * handler that removes temporary files when kiln is interrupted. */
#include "driver.h"

#include "../ir/tempfiles.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
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
    "`kiln COMMAND --help` describes a command's options and the environment variables.\n"
    "Exit status: 0 success, 1 bad model/weights/inputs (or out of memory), 2 bad command line,\n"
    "3 internal error.\n";

/* What every command's --help ends with: every variable kiln reads, the compile's
 * settings once, in parse_options (kiln_options_from_env). */
static const char environment[] =
    "\n"
    "environment:\n"
    "  KILN_CACHE_DIR     the compile cache (default $XDG_CACHE_HOME/kiln, else ~/.cache/kiln)\n"
    "  KILN_NUM_THREADS   threads a model runs on, OpenBLAS's included (default and most:\n"
    "                     the number of cores; a value that is not a positive integer is a\n"
    "                     warning, and the default is used)\n"
    "  KILN_JIT           `cc`: compile with the system C compiler into a cached .so instead\n"
    "                     of the in-process Clang JIT\n"
    "  KILN_CC, KILN_CXX  the C and C++ compilers (default cc and c++)\n"
    "  KILN_BLAS          `off`: the C target's GEMMs are generated loops, not OpenBLAS calls\n"
    "  KILN_CUDA          `emulate`: --target cuda builds its kernels for the CPU (no GPU)\n"
    "  KILN_CUDA_DEVICE   the GPU --target cuda runs on (default 0)\n"
    "  KILN_NVRTC         the NVRTC library to load (default: the newest CUDA's)\n"
    "  TMPDIR             where compiles make their temporary directories (default /tmp)\n";

void print_help(const Command *cmd, FILE *out) {
    fprintf(out, "usage: kiln %s %s\n\n%s\noptions:\n", cmd->name, cmd->synopsis, cmd->about);
    for (const OptionSpec *o = cmd->options; o->name; o++) {
        char head[64];
        if (strcmp(o->name, "-O") == 0)
            snprintf(head, sizeof head, "-O0, -O1, -O2");
        else if (strcmp(o->name, "--passes") == 0)
            snprintf(head, sizeof head, "--passes=%s", o->value);
        else
            snprintf(head, sizeof head, "%s%s%s", o->name, o->value ? " " : "", o->value ? o->value : "");
        /* a long option head gets a line of its own */
        fprintf(out, strlen(head) > 28 ? "  %s\n%31s" : "  %-28s ", head, "");
        /* the meaning, wrapped at 80 columns under itself */
        int col = 31;
        bool first = true;
        for (const char *w = o->help; *w;) {
            while (*w == ' ')
                w++;
            int n = (int)strcspn(w, " ");
            if (!n)
                break;
            if (!first && col + 1 + n > 80) {
                fprintf(out, "\n%31s", "");
                col = 31;
            } else if (!first) {
                fputc(' ', out);
                col++;
            }
            fprintf(out, "%.*s", n, w);
            col += n;
            w += n;
            first = false;
        }
        fputc('\n', out);
    }
    fputs(environment, out);
}

bool help_requested(int argc, char **argv, const Command *cmd) {
    for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            print_help(cmd, stdout);
            return true;
        }
    return false;
}

int usage_error(const Command *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("kiln: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (see 'kiln %s%s--help')\n", cmd ? cmd->name : "", cmd ? " " : "");
    return EXIT_USAGE;
}

int tensor_info_type(const char *model, const kiln_model_def *def, const kiln_tensor_info *t, Type *type,
                     Diag *d) {
    static const DType dtypes[] = {
        [KILN_F32] = DT_F32, [KILN_I64] = DT_I64, [KILN_I32] = DT_I32, [KILN_BOOL] = DT_BOOL};
    bool known =
        t->dtype == KILN_F32 || t->dtype == KILN_I64 || t->dtype == KILN_I32 || t->dtype == KILN_BOOL;
    if (!known || t->rank < 0 || t->rank > KILN_MAX_RANK)
        return diag_error(d, (Loc){0}, "%s: tensor '%s' has a dtype or rank this kiln does not handle", model,
                          t->name);
    *type = type_make(t->rank, t->shape);
    type->dtype = dtypes[t->dtype];
    bool sym = (def->extensions & KILN_EXT_SYM) && def->n_sym == 1;
    for (int k = 0; k < t->rank; k++)
        if (t->shape[k] < 1 &&
            !(k == 0 && sym && t->shape[k] < 0 && ck_mul(-t->shape[k], def->sym_bounds[0], &type->dims[0])))
            return diag_error(d, (Loc){0}, "%s: tensor '%s' has a shape this kiln does not handle", model,
                              t->name);
    if (t->rank && t->shape[0] < 0) {
        type->sym = def->sym_names[0];
        type->sym_mult = -t->shape[0];
    }
    return 0;
}

int exit_status(int rc, Diag *d) {
    if (diag_take_assert(d))
        return EXIT_BUG;
    if (rc == 0 || rc == EXIT_USAGE)
        return rc;
    return (d->errors && d->kind == DIAG_INTERNAL) || rc == EXIT_BUG ? EXIT_BUG : EXIT_USER;
}

static const OptionSpec *find_option(const Command *cmd, const char *key) {
    for (const OptionSpec *o = cmd->options; o->name; o++)
        if (strcmp(o->name, key) == 0)
            return o;
    return NULL;
}

/* NAME=FILE (or the form `form` names) */
static int parse_binding(const Command *cmd, const char *arg, Binding *b, const char *form) {
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg || !eq[1])
        return usage_error(cmd, "expected %s, got '%s'", form, arg);
    static char names[4 * MAX_FILES][256];
    static int next;
    char *name = names[next++ % (4 * MAX_FILES)];
    snprintf(name, sizeof names[0], "%.*s", (int)(eq - arg), arg);
    *b = (Binding){name, eq + 1};
    return 0;
}

/* A count option's value: an integer in [min, max]. */
static int parse_count(const Command *cmd, const char *opt, const char *value, long min, long max,
                       long *out) {
    char *end;
    errno = 0;
    long v = strtol(value, &end, 10);
    if (*end || (errno && v != LONG_MAX) || v < min)
        return usage_error(cmd, "%s needs a %s integer, not '%s'", opt, min > 0 ? "positive" : "non-negative",
                           value);
    if (v > max)
        return usage_error(cmd, "%s is at most %ld, not '%s'", opt, max, value);
    *out = v;
    return 0;
}

/* Stores one option's value in o. */
static int set_option(const Command *cmd, const char *key, const char *arg, const char *value, Options *o) {
    if (strcmp(key, "-o") == 0)
        o->out = value;
    else if (strcmp(key, "--weights") == 0)
        o->weights[o->n_weights++] = value;
    else if (strcmp(key, "--input") == 0)
        return parse_binding(cmd, value, &o->inputs[o->n_inputs++], "NAME=FILE");
    else if (strcmp(key, "--output") == 0)
        return parse_binding(cmd, value, &o->outputs[o->n_outputs++], "NAME=FILE");
    else if (strcmp(key, "--bind") == 0)
        return parse_binding(cmd, value, &o->binds[o->n_binds++], "NAME=FILE");
    else if (strcmp(key, "--dim") == 0) {
        Binding dim;
        if (parse_binding(cmd, value, &dim, "NAME=SIZE or NAME<=BOUND"))
            return EXIT_USAGE;
        char *name = (char *)dim.name; /* parse_binding's own copy */
        bool bound = name[strlen(name) - 1] == '<';
        if (bound)
            name[strlen(name) - 1] = 0;
        if (!*name || parse_count(cmd, bound ? "--dim's BOUND" : "--dim's SIZE", dim.file, bound ? 2 : 1,
                                  KILN_MAX_NUMEL, &o->dims[o->n_dims].size))
            return *name ? EXIT_USAGE
                         : usage_error(cmd, "expected NAME=SIZE or NAME<=BOUND, got '%s'", value);
        o->dims[o->n_dims].bound = bound;
        o->dims[o->n_dims++].name = name;
    } else if (strcmp(key, "--weights-out") == 0)
        o->weights_out = value;
    else if (strcmp(key, "--save-weights") == 0)
        o->save_weights = value;
    else if (strcmp(key, "--target") == 0) {
        if (strcmp(value, "interp") && strcmp(value, "c") && strcmp(value, "cuda"))
            return usage_error(cmd, "unknown target '%s' (interp, c or cuda)", value);
        o->target = value;
    } else if (strcmp(key, "--cpu") == 0) {
        if (!cc_cpu_valid(value))
            return usage_error(cmd, "unknown --cpu '%s' (native, x86-64, x86-64-v2, x86-64-v3 or x86-64-v4)",
                               value);
        o->cpu = value;
    } else if (strcmp(key, "--passes") == 0)
        o->pipeline.only = value;
    else if (strcmp(key, "--dump-dir") == 0)
        o->pipeline.dump_dir = value;
    else if (strcmp(key, "--emit-source") == 0)
        o->emit_source = value;
    else if (strcmp(key, "--header") == 0)
        o->header = value;
    else if (strcmp(key, "--steps") == 0)
        return parse_count(cmd, key, value, 1, 1000000000, &o->steps);
    else if (strcmp(key, "--iters") == 0)
        return parse_count(cmd, key, value, 1, 100000000, &o->iters);
    else if (strcmp(key, "--warmup") == 0)
        return parse_count(cmd, key, value, 0, 100000000, &o->warmup);
    else if (strcmp(key, "--batch") == 0) {
        char list[256];
        snprintf(list, sizeof list, "%s", value);
        for (char *save = NULL, *size = strtok_r(list, ",", &save); size; size = strtok_r(NULL, ",", &save)) {
            if (o->n_sizes == (int)(sizeof o->sizes / sizeof *o->sizes))
                return usage_error(cmd, "--batch takes at most %d sizes", o->n_sizes);
            if (parse_count(cmd, key, size, 1, KILN_MAX_NUMEL, &o->sizes[o->n_sizes++]))
                return EXIT_USAGE;
        }
        if (o->n_sizes == 0)
            return usage_error(cmd, "--batch needs sizes, such as 1,8,32");
    } else if (strcmp(key, "--profile") == 0)
        o->profile = true;
    else if (strcmp(key, "--quiet") == 0)
        o->quiet = true;
    else if (strcmp(key, "--list-passes") == 0)
        o->list_passes = true;
    else if (strcmp(key, "--memory-report") == 0)
        o->memory_report = true;
    else if (strcmp(key, "--check") == 0)
        o->pipeline.check = true;
    else if (strcmp(key, "--no-PASS") == 0)
        o->disabled[o->pipeline.n_disabled++] = arg + 5;
    return 0;
}

int parse_options(int argc, char **argv, int first, const Command *cmd, Options *o) {
    memset(o, 0, sizeof *o);
    o->command = cmd;
    o->settings = kiln_options_from_env();
    o->pipeline.level = 2;
    o->steps = 1;
    o->iters = 50;
    o->warmup = 5;
    o->pipeline.verify = true; /* cheap, and catches a broken pass where it happens */
    o->pipeline.lower = true;  /* kiln opt, which only prints, turns it off */
    o->pipeline.disabled = o->disabled;
    for (int i = first; i < argc; i++) {
        char *arg = argv[i];
        char key[64];
        if (arg[0] != '-' || !arg[1]) {
            if (o->model)
                return usage_error(cmd, "unexpected argument '%s' (one model at a time)", arg);
            o->model = arg;
            continue;
        }
        const char *eq = strchr(arg, '=');
        snprintf(key, sizeof key, "%.*s", eq ? (int)(eq - arg) : (int)strlen(arg), arg);
        bool is_level = strcmp(key, "-O0") == 0 || strcmp(key, "-O1") == 0 || strcmp(key, "-O2") == 0;
        bool is_no_pass = strncmp(key, "--no-", 5) == 0 && key[5];
        const OptionSpec *spec = find_option(cmd, is_level ? "-O" : is_no_pass ? "--no-PASS" : key);
        if (!spec || strcmp(key, "--help") == 0)
            return usage_error(cmd, "unknown option '%.200s'", arg);
        const char *value = NULL;
        if (is_level) {
            o->pipeline.level = key[2] - '0';
            if (eq)
                return usage_error(cmd, "option '%s' takes no value", key);
            continue;
        }
        if (spec->value && !is_no_pass) {
            value = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
            if (!value || !*value)
                return usage_error(cmd, "option '%s' needs a value", key);
        } else if (eq && !is_no_pass) {
            return usage_error(cmd, "option '%s' takes no value", key);
        }
        if (o->n_weights == MAX_FILES || o->n_inputs == MAX_FILES || o->n_outputs == MAX_FILES ||
            o->pipeline.n_disabled == MAX_FILES || o->n_binds == MAX_FILES || o->n_dims == MAX_FILES)
            return usage_error(cmd, "too many options (at most %d of a kind)", MAX_FILES);
        if (set_option(cmd, spec->name, arg, value, o))
            return EXIT_USAGE;
    }
    if (!o->model && !o->list_passes)
        return usage_error(cmd, "missing MODEL");
    Diag d;
    diag_init(&d, stderr);
    if (pipeline_check_names(&o->pipeline, &d))
        return EXIT_USAGE;
    return 0;
}

int jit_options(const Options *o, JitOptions *jo, Diag *d) {
    kiln_options settings = o->settings;
    settings.target = o->target && strcmp(o->target, "cuda") == 0 ? "cuda" : "c";
    if (o->cpu)
        settings.cpu = o->cpu;
    if (jit_options_from(&settings, jo, d))
        return -1;
    jo->memplan = pipeline_selects(&o->pipeline, "memplan");
    jo->dump_dir = o->pipeline.dump_dir;
    jo->stage = progress_stage;
    return 0;
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

int read_model(const Options *o, ModelInput *in, Diag *d) {
    if (ends_with(o->model, ".so")) {
        diag_error(d, (Loc){0}, "'%s': this command reads .kiln and .onnx models", o->model);
        return EXIT_USER;
    }
    model_input_init(in, o->model, o->weights, o->n_weights);
    return model_input_read(in, d) ? EXIT_USER : 0;
}

int parse_read_model(const Options *o, const ModelInput *in, bool require_weights, Diag *d, Graph **g,
                     TensorList *weights) {
    OnnxBind binds[2 * MAX_FILES];
    for (int i = 0; i < o->n_binds; i++)
        binds[i] = (OnnxBind){.name = o->binds[i].name, .file = o->binds[i].file};
    for (int i = 0; i < o->n_dims; i++)
        binds[o->n_binds + i] =
            (OnnxBind){.name = o->dims[i].name, .size = o->dims[i].size, .bound = o->dims[i].bound};
    if (!(*g = model_input_parse(in, binds, o->n_binds + o->n_dims, weights, d)))
        return EXIT_USER;
    return check_weights(*g, weights, require_weights, d) ? EXIT_USER : 0;
}

int load_model(const Options *o, bool require_weights, Diag *d, ModelInput *in, Graph **g,
               TensorList *weights) {
    *g = NULL;
    int rc = read_model(o, in, d);
    return rc ? rc : parse_read_model(o, in, require_weights, d, g, weights);
}

/* SIGINT, SIGTERM, SIGHUP, and SIGPIPE (an output written through to a pipe whose
 * reader went away): the temporary files and directories go (with async-signal-safe
 * calls only), then the signal, back at its default action, ends the process as it
 * would have. */
static void on_signal(int sig) {
    tempfiles_remove_all();
    raise(sig);
}

static void catch_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = (int)SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    int signals[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE};
    for (int i = 0; i < 4; i++) {
        struct sigaction old;
        /* a signal ignored by whoever started kiln (nohup) stays ignored */
        if (sigaction(signals[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN)
            sigaction(signals[i], &sa, NULL);
    }
}

int main(int argc, char **argv) {
    if (argc < 2)
        return usage_error(NULL, "missing COMMAND");
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        fputs(usage_main, stdout);
        return 0;
    }
    catch_signals();
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
    return usage_error(NULL, "unknown command '%.200s'", argv[1]);
}
