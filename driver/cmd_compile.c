/* kiln compile: a model compiled ahead of time into a shared object.
 *
 * The model is parsed, optimized and lowered, the C generated, and the system C
 * compiler makes the .so, with the weights linked in as binary data. --emit-source
 * writes the generated C (as --dump-dir does, into DIR/model.c) and --header the
 * ABI header with the model's inputs and outputs. Every file is registered with
 * driver/outputs.c before any work, written to a temporary, and put in place with
 * the others only once all are ready, so a failure leaves none of them behind.
 * --memory-report prints the memory plan (plan_report) on stdout. */
#include "driver.h"

#include <string.h>

static const OptionSpec options[] = {
    {"-o", "OUT.so", "the shared object to write (required)"},
    OPT_WEIGHTS,
    OPT_BIND,
    OPT_DIM,
    {"--target", "c|cuda", "generate C (default) or CUDA kernels with a C host (interp compiles nothing)"},
    OPT_CPU,
    OPT_LEVEL,
    OPT_PASSES,
    OPT_NO_PASS,
    {"--dump-dir", "DIR",
     "write the graph after every pass as DIR/NN-PASS.kiln, and the generated C as DIR/model.c"},
    {"--emit-source", "FILE", "also write the generated source (the C, or the CUDA kernels) to FILE"},
    {"--header", "FILE.h",
     "also write the ABI header kiln/model.h, with the model's inputs and outputs, to FILE.h"},
    {"--memory-report", NULL,
     "print the workspace plan: each buffer's size, lifetime and offset, the peak and the lower bound"},
    {"--check", NULL,
     "run the interpreter on random inputs before the passes and after each, then the compiled model, and "
     "fail naming the first that changes an output beyond 1e-4 + 1e-4|expected|"},
    OPT_QUIET,
    OPT_HELP,
    {NULL, NULL, NULL},
};

static const Command command = {
    "compile",
    "MODEL -o OUT.so [options]",
    "Compiles MODEL into a shared object exporting kiln_model() (kiln/model.h). The C\n"
    "compiler is $KILN_CC, else cc; the .so needs only libc, libm, pthreads and OpenBLAS.\n"
    "It is built for this machine's CPU (-march=native) unless --cpu names another, and\n"
    "may stop with SIGILL on an older CPU (or under valgrind): --cpu x86-64-v2 builds\n"
    "one that runs on any x86-64 made since about 2009. Every file (-o, --emit-source,\n"
    "--header, DIR/model.c) is written only once all are ready, all together; on\n"
    "failure none is, and none may name a file the command reads.\n",
    options,
};

/* --check of the compiled model: loaded and run on the check's inputs, its outputs
 * are compared with the interpreter's before the passes. */
static int check_compiled(const Check *check, const Graph *g, const char *path, const char *target, Diag *d) {
    kiln_error err = {.message = ""};
    kiln_module *m = kiln_load(path, &err);
    if (!m)
        return diag_relay_error(d, &err);
    int n_in = graph_inputs(g, NULL, 0);
    const Tensor **in = ir_calloc((size_t)n_in + 1, sizeof *in);
    const void **inputs = ir_calloc((size_t)n_in + 1, sizeof *inputs);
    Tensor **out = ir_calloc((size_t)g->n_outputs + 1, sizeof *out);
    void **outputs = ir_calloc((size_t)g->n_outputs + 1, sizeof *outputs);
    int rc = in && inputs && out && outputs ? check_bind_inputs(check, g, in, d)
                                            : diag_error(d, (Loc){0}, "out of memory");
    for (int i = 0; !rc && i < n_in; i++)
        inputs[i] = in[i]->data;
    for (int k = 0; !rc && k < g->n_outputs; k++)
        if (!(out[k] = tensor_new(&g->values[g->outputs[k]].type)))
            rc = diag_error(d, (Loc){0}, "out of memory");
        else
            outputs[k] = out[k]->data;
    if (!rc && kiln_run(m, inputs, outputs, &err))
        rc = diag_relay_error(d, &err);
    if (!rc) {
        char name[64];
        snprintf(name, sizeof name, "target %s", target);
        rc = check_outputs(check, g, out, name, "the compiled model", d);
    }
    for (int k = 0; out && k < g->n_outputs; k++)
        tensor_free(out[k]);
    ir_free(in);
    ir_free(inputs);
    ir_free(out);
    ir_free(outputs);
    kiln_free(m);
    return rc;
}

/* The generated files, ready in their temporaries: the dump and --emit-source, the
 * header, and the shared object last (the compiler writes it to its temporary). */
static int write_all(const Options *o, const Toolchain *tc, const Source *c, const Program *p, const Graph *g,
                     const Str *h, Outputs *outs, const Check *check, Diag *d) {
    /* the source people read: the C, or the CUDA kernels; the kernel IR beside it */
    const Str *shown = p->target == TARGET_CUDA ? &c->kernels : &c->host;
    for (int i = 1; i < outs->n; i++) {
        const Output *out = &outs->items[i];
        bool header = o->header && strcmp(out->what, "--header") == 0;
        size_t len = strlen(out->path);
        const Str *text = header ? h : len > 4 && strcmp(out->path + len - 4, ".kir") == 0 ? &c->kir : shown;
        if (text->oom)
            return diag_error(d, (Loc){0}, "out of memory writing '%s'", out->path);
        if (outputs_write(outs, i, text->s ? text->s : "", text->len, d))
            return -1;
    }
    const char *so = outputs_temp(outs, 0, d);
    progress_stage("compiling its C with the system compiler");
    if (!so || cc_compile_so(c, p, so, tc, d))
        return -1;
    progress_stage("checking the compiled model");
    if (o->pipeline.check && check_compiled(check, g, so, p->target == TARGET_CUDA ? "cuda" : "c", d))
        return -1;
    return 0;
}

int cmd_compile(int argc, char **argv) {
    if (help_requested(argc, argv, &command))
        return 0;
    Options o;
    int rc = parse_options(argc, argv, 2, &command, &o);
    if (rc)
        return rc;
    if (!o.out)
        return usage_error(&command, "kiln compile needs -o OUT.so");
    Diag d;
    diag_init(&d, stderr);
    if (o.target && strcmp(o.target, "interp") == 0) {
        diag_error(&d, (Loc){0}, "the interpreter compiles nothing; kiln compile takes --target c or cuda");
        return EXIT_USER;
    }
    JitOptions jo;
    if (jit_options(&o, &jo, &d))
        return exit_status(EXIT_USER, &d);
    char dump_path[4200] = "", kir_path[4200] = "";
    if (o.pipeline.dump_dir) {
        snprintf(dump_path, sizeof dump_path, "%s/model.%s", o.pipeline.dump_dir,
                 jo.target == TARGET_CUDA ? "cu" : "c");
        snprintf(kir_path, sizeof kir_path, "%s/model.kir", o.pipeline.dump_dir);
    }
    static Outputs outs;
    outputs_init(&outs);
    outputs_add(&outs, o.out, "-o");
    if (*dump_path) {
        outputs_add(&outs, dump_path, "--dump-dir");
        outputs_add(&outs, kir_path, "--dump-dir");
    }
    if (o.emit_source)
        outputs_add(&outs, o.emit_source, "--emit-source");
    if (o.header)
        outputs_add(&outs, o.header, "--header");
    if (outputs_check(&outs, &o, &d))
        return EXIT_USER;
    ModelInput in = {0};
    Graph *g;
    TensorList weights = {0};
    Program *p = NULL;
    Source c = {0};
    Str h = {0};
    Check check = {0}; /* --check: the interpreter's outputs before the passes */
    o.pipeline.check_result = &check;
    progress_start(o.model, o.quiet);
    rc = load_model(&o, true, &d, &in, &g, &weights);
    progress_stage("optimizing");
    if (!rc && pipeline_run(g, &weights, &o.pipeline, &d))
        rc = EXIT_USER;
    progress_stage("lowering");
    if (!rc && (!(p = program_lower(g, &weights,
                                    &(LowerOptions){jo.target, jo.memplan, jo.blas, jo.tools.cpu}, &d)) ||
                program_source(p, jo.cuda_emulated, &c, &d)))
        rc = EXIT_USER;
    if (!rc && o.memory_report) {
        progress_end(); /* the report goes to the terminal too */
        Str report = {0};
        plan_report(p, &report);
        if (report.oom)
            rc = diag_error(&d, (Loc){0}, "out of memory");
        else
            fputs(report.s, stdout);
        str_free(&report);
    }
    if (!rc && o.header)
        emit_header(g, &h);
    if (!rc && (write_all(&o, &jo.tools, &c, p, g, &h, &outs, &check, &d) || outputs_commit(&outs, &d)))
        rc = EXIT_USER;
    progress_end();
    outputs_abort(&outs);
    check_free(&check);
    source_free(&c);
    str_free(&h);
    program_free(p);
    tensors_free(&weights);
    graph_free(g);
    model_input_free(&in);
    return exit_status(rc, &d);
}
