/* kiln bench: how long one run of a compiled model takes, and where the time goes.
 *
 * The model is JIT-compiled from a .kiln file (through the compile cache) or loaded
 * from a .so made by kiln compile. Inputs come from --input files or, for those not
 * given, from a fixed pseudo-random sequence, so every run of the command times the
 * same work. The model runs --warmup times untimed, then --iters times, each run
 * timed alone with a monotonic clock; the command prints the median, minimum and
 * maximum and the thread count the model was created with (KILN_NUM_THREADS, else
 * the number of cores, as the runtime reads it).
 *
 * --profile times a build of the model with a clock read after every kernel call
 * (emit_c_model's profiling build, found through its exported kiln_profile): the
 * per-kernel sums, reset after the warm-up, give each kernel's time per run, its
 * share of the total and, where lowering counted the kernel's FLOPs (GEMMs), its
 * GFLOP/s. A compiled .so carries no clocks, so --profile needs a .kiln model.
 * With --target cuda, a run's time includes copying the inputs to the device and
 * the outputs back; the profile's are the kernels' own, from device events. */
#include "driver.h"
#include "../runtime/module.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const OptionSpec options[] = {
    {"--iters", "N", "timed runs (default 50)"},
    {"--warmup", "N", "untimed runs first (default 5)"},
    {"--batch", "N[,N...]",
     "time the model at these sizes of its symbolic dim, each in turn (default: its bound; the --input "
     "files give theirs)"},
    {"--profile", NULL,
     "time a build with a clock around every kernel (a .kiln model only), and print each kernel's mean time "
     "per run, its share and, where lowering counted its FLOPs, its GFLOP/s"},
    {"--input", "NAME=FILE.npy",
     "the value of the input NAME (inputs not given get fixed pseudo-random values)"},
    OPT_WEIGHTS,
    OPT_BIND,
    OPT_DIM,
    {"--target", "c|cuda", "time generated C (default) or CUDA (the interpreter cannot be benchmarked)"},
    OPT_CPU,
    OPT_LEVEL,
    OPT_PASSES,
    OPT_NO_PASS,
    OPT_DUMP_DIR,
    {"--memory-report", NULL, "print the workspace plan first, as kiln compile does"},
    OPT_QUIET,
    OPT_HELP,
    {NULL, NULL, NULL},
};

static const Command command = {
    "bench",
    "MODEL [options] [--iters N] [--warmup N] [--profile]",
    "Times MODEL (a .kiln or .onnx file, compiled through the cache, or a .so made by\n"
    "kiln compile): --warmup runs untimed, then --iters runs, and prints\n"
    "  MODEL: median X ms, min Y ms, max Z ms over N runs (T threads)\n"
    "The model uses KILN_NUM_THREADS threads (default: the number of cores).\n",
    options,
};

typedef int (*ProfileFn)(double **seconds, const char *const **names, const char *const **comments,
                         const int64_t **flops);

static double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The thread count the runtime's instance uses (runtime/model_rt.c, kiln_rt_threads):
 * KILN_NUM_THREADS when it is a positive integer, at most the number of cores. */
static int model_threads(void) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN), n;
    cores = cores < 1 ? 1 : cores > 256 ? 256 : cores;
    n = cores;
    const char *s = getenv("KILN_NUM_THREADS");
    char *end;
    long v = s && *s ? strtol(s, &end, 10) : 0;
    if (s && *s && !*end && v >= 1)
        n = v < cores ? v : cores;
    return (int)n;
}

/* Fills n floats with a fixed sequence in [-1, 1) (a 64-bit LCG), different per input. */
static void fill_input(float *x, int64_t n, int input) {
    uint64_t state = 0x9E3779B97F4A7C15ull * (uint64_t)(input + 1);
    for (int64_t i = 0; i < n; i++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(state >> 40) / (double)(1 << 24) * 2.0 - 1.0);
    }
}

/* The model's input and output buffers: inputs from their --input files or filled,
 * outputs zeroed. The tensors are owned by in[] and out[]. */
static int make_buffers(const char *model, const kiln_model_def *def, const Options *o, int64_t size,
                        Tensor **in, Tensor **out, Diag *d) {
    if (def->n_inputs > MAX_PORTS || def->n_outputs > MAX_PORTS)
        return diag_error(d, (Loc){0}, "%s: more than %d inputs or outputs", model, MAX_PORTS);
    for (int b = 0; b < o->n_inputs; b++) {
        int found = -1;
        for (int i = 0; i < def->n_inputs; i++)
            if (strcmp(def->inputs[i].name, o->inputs[b].name) == 0)
                found = i;
        if (found < 0)
            return diag_error(d, (Loc){0}, "--input %s: the model has no input named '%s'", o->inputs[b].file,
                              o->inputs[b].name);
        for (int a = 0; a < b; a++)
            if (strcmp(o->inputs[a].name, o->inputs[b].name) == 0)
                return diag_error(d, (Loc){0}, "--input '%s' is given twice", o->inputs[b].name);
    }
    for (int k = 0; k < def->n_inputs + def->n_outputs; k++) {
        bool is_in = k < def->n_inputs;
        const kiln_tensor_info *info = is_in ? &def->inputs[k] : &def->outputs[k - def->n_inputs];
        Type declared = {0};
        if (tensor_info_type(model, def, info, &declared, d))
            return -1;
        Tensor **slot = is_in ? &in[k] : &out[k - def->n_inputs];
        const char *file = NULL;
        for (int b = 0; is_in && b < o->n_inputs; b++)
            if (strcmp(o->inputs[b].name, info->name) == 0)
                file = o->inputs[b].file;
        if (file) {
            char want[160], got[160];
            int64_t given;
            if (npy_read(file, slot, d))
                return -1;
            if (!type_admits(&declared, &(*slot)->type, &given) || (given && given != size))
                return diag_error(d, (Loc){0}, "input '%s' must be %s at %s = %lld, but %s holds %s",
                                  info->name, type_str(&declared, want, sizeof want),
                                  declared.sym ? declared.sym : "its size", (long long)size, file,
                                  type_str(&(*slot)->type, got, sizeof got));
            continue;
        }
        Type t = type_at(&declared, size);
        if (!(*slot = tensor_new(&t)))
            return diag_error(d, (Loc){0}, "out of memory for tensor '%s'", info->name);
        if (is_in && t.dtype == DT_F32) /* others stay 0, an index valid for any dim */
            fill_input((*slot)->data, type_numel(&t), k);
    }
    return 0;
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Kernel indices by time, longest first, for the profile table. */
static const double *sort_seconds;
static int compare_kernels(const void *a, const void *b) {
    double x = sort_seconds[*(const int *)a], y = sort_seconds[*(const int *)b];
    return (x < y) - (x > y);
}

static int print_profile(ProfileFn profile, long iters, Diag *d) {
    double *seconds;
    const char *const *names, *const *comments;
    const int64_t *flops;
    int n = profile(&seconds, &names, &comments, &flops);
    int *order = ir_calloc((size_t)n + 1, sizeof *order);
    if (!order)
        return diag_error(d, (Loc){0}, "out of memory");
    double total = 0, total_flops = 0;
    int width = 6;
    for (int k = 0; k < n; k++) {
        order[k] = k;
        total += seconds[k];
        total_flops += (double)flops[k];
        if ((int)strlen(names[k]) > width)
            width = (int)strlen(names[k]);
    }
    sort_seconds = seconds;
    qsort(order, (size_t)n, sizeof *order, compare_kernels);
    printf("\n%-*s %10s %7s %8s  %s\n", width, "kernel", "mean ms", "share", "GFLOP/s", "computes");
    for (int r = 0; r < n; r++) {
        int k = order[r];
        double per_run = seconds[k] / (double)iters;
        char rate[32] = "";
        if (flops[k] > 0 && per_run > 0)
            snprintf(rate, sizeof rate, "%.1f", (double)flops[k] / per_run * 1e-9);
        printf("%-*s %10.4f %6.1f%% %8s  %s\n", width, names[k], per_run * 1e3,
               total > 0 ? 100 * seconds[k] / total : 0.0, rate, comments[k]);
    }
    char rate[32] = "";
    if (total_flops > 0 && total > 0)
        snprintf(rate, sizeof rate, "%.1f", total_flops / (total / (double)iters) * 1e-9);
    printf("%-*s %10.4f %6.1f%% %8s  %.4g GFLOP counted per run\n", width, "total",
           total / (double)iters * 1e3, 100.0, rate, total_flops * 1e-9);
    ir_free(order);
    return 0;
}

/* Warm-up, timed runs at `size` of the model's symbolic dim (0: it has none), the
 * summary line, and with --profile the table. */
static int time_model(const Options *o, kiln_module *m, ProfileFn profile, int64_t size, Diag *d) {
    const kiln_model_def *def = kiln_def(m);
    Tensor **in = ir_calloc(MAX_PORTS, sizeof *in), **out = ir_calloc(MAX_PORTS, sizeof *out);
    const void **inputs = ir_calloc(MAX_PORTS, sizeof *inputs);
    void **outputs = ir_calloc(MAX_PORTS, sizeof *outputs);
    double *times = ir_calloc((size_t)o->iters, sizeof *times);
    int rc = times && in && out && inputs && outputs ? make_buffers(o->model, def, o, size, in, out, d)
                                                     : diag_error(d, (Loc){0}, "out of memory");
    for (int i = 0; !rc && i < def->n_inputs; i++)
        inputs[i] = in[i]->data;
    for (int k = 0; !rc && k < def->n_outputs; k++)
        outputs[k] = out[k]->data;
    kiln_error err = {.message = ""};
    const int64_t *sizes = size ? &size : NULL;
    for (long r = 0; !rc && r < o->warmup; r++)
        if (kiln_run_sym(m, sizes, inputs, outputs, &err))
            rc = diag_relay_error(d, &err);
    if (!rc && profile) {
        double *seconds;
        const char *const *names, *const *comments;
        const int64_t *flops;
        int n = profile(&seconds, &names, &comments, &flops);
        memset(seconds, 0, sizeof *seconds * (size_t)n);
    }
    for (long r = 0; !rc && r < o->iters; r++) {
        double start = now_seconds();
        if (kiln_run_sym(m, sizes, inputs, outputs, &err))
            rc = diag_relay_error(d, &err);
        times[r] = (now_seconds() - start) * 1e3;
    }
    if (!rc) {
        qsort(times, (size_t)o->iters, sizeof *times, compare_doubles);
        double median =
            o->iters % 2 ? times[o->iters / 2] : (times[o->iters / 2 - 1] + times[o->iters / 2]) / 2;
        char at[128] = "";
        if (size)
            snprintf(at, sizeof at, " at %s = %lld", def->sym_names[0], (long long)size);
        printf("%s%s: median %.4g ms, min %.4g ms, max %.4g ms over %ld runs (%d threads)\n", o->model, at,
               median, times[0], times[o->iters - 1], o->iters, model_threads());
    }
    if (!rc && profile)
        rc = print_profile(profile, o->iters, d);
    for (int i = 0; in && out && i < MAX_PORTS; i++) {
        tensor_free(in[i]);
        tensor_free(out[i]);
    }
    ir_free(in);
    ir_free(out);
    ir_free(inputs);
    ir_free(outputs);
    ir_free(times);
    return rc;
}

/* time_model at each --batch size (or the bound), or once for a model without a
 * symbolic dim. */
static int time_sizes(const Options *o, kiln_module *m, Diag *d) {
    const kiln_model_def *def = kiln_def(m);
    ProfileFn profile = NULL;
    if (o->profile) {
        void *sym = dlsym(m->handle, "kiln_profile");
        memcpy(&profile, &sym, sizeof profile); /* POSIX: dlsym's pointer may hold a function */
        if (!profile)
            return diag_error(d, (Loc){0}, "'%s' has no profiling clocks; --profile needs a .kiln model",
                              o->model);
    }
    bool sym = (def->extensions & KILN_EXT_SYM) && def->n_sym == 1;
    if (!sym && o->n_sizes)
        return diag_error(d, (Loc){0}, "--batch: '%s' has no symbolic dim", o->model);
    if (!sym)
        return time_model(o, m, profile, 0, d);
    for (int k = 0; k < o->n_sizes; k++)
        if (o->sizes[k] > def->sym_bounds[0])
            return diag_error(d, (Loc){0}, "--batch %ld: '%s' runs at %s from 1 to %lld", o->sizes[k],
                              o->model, def->sym_names[0], (long long)def->sym_bounds[0]);
    int rc = 0;
    for (int k = 0; !rc && k < (o->n_sizes ? o->n_sizes : 1); k++)
        rc = time_model(o, m, profile, o->n_sizes ? o->sizes[k] : def->sym_bounds[0], d);
    return rc;
}

int cmd_bench(int argc, char **argv) {
    if (help_requested(argc, argv, &command))
        return 0;
    Options o;
    int rc = parse_options(argc, argv, 2, &command, &o);
    if (rc)
        return rc;
    Diag d;
    diag_init(&d, stderr);
    if (o.target && strcmp(o.target, "interp") == 0) {
        diag_error(&d, (Loc){0}, "kiln bench times compiled code; the interpreter cannot be benchmarked");
        return EXIT_USER;
    }
    static Outputs none; /* bench writes no file, but its --dump-dir must spare the model */
    outputs_init(&none);
    if (outputs_check(&none, &o, &d))
        return EXIT_USER;
    ModelInput in = {0};
    Graph *g = NULL;
    TensorList weights = {0};
    kiln_module *m = NULL;
    kiln_error err = {.message = ""};
    Str report = {0};
    if (is_shared_object(o.model)) {
        if (o.memory_report)
            rc = diag_error(&d, (Loc){0}, "'%s' is compiled; --memory-report needs a .kiln model", o.model);
        else if (!(m = kiln_load(o.model, &err)))
            rc = diag_relay_error(&d, &err);
    } else {
        progress_start(o.model, o.quiet);
        rc = load_model(&o, true, &d, &in, &g, &weights);
        progress_stage("optimizing");
        rc = rc || pipeline_run(g, &weights, &o.pipeline, &d);
        JitOptions jo;
        rc = rc || jit_options(&o, &jo, &d);
        if (!rc) {
            jo.report = o.memory_report ? &report : NULL;
            m = o.profile ? jit_graph_profiled(g, &weights, &jo, &d, &err)
                          : jit_graph(g, &weights, &jo, &d, &err);
        }
        progress_end();
        if (!rc && !m) /* the diagnostics are printed; a failure to load is only in err */
            rc = d.errors ? -1 : diag_relay_error(&d, &err);
    }
    if (!rc && report.oom)
        rc = diag_error(&d, (Loc){0}, "out of memory");
    else if (!rc && report.s)
        fputs(report.s, stdout);
    str_free(&report);
    if (!rc)
        rc = time_sizes(&o, m, &d);
    kiln_free(m);
    tensors_free(&weights);
    graph_free(g);
    model_input_free(&in);
    return exit_status(rc ? EXIT_USER : 0, &d);
}
