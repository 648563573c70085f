/* kiln compile: a model compiled ahead of time into a shared object.
 *
 * The model is parsed, optimized and lowered, the C generated, and the system C
 * compiler makes the .so, with the weights linked in as binary data. --emit-source
 * writes the generated C (as --dump-dir does, into DIR/model.c) and --header the
 * ABI header with the model's inputs and outputs; every file is written through a
 * temporary file, so a failure leaves none of them behind. --memory-report prints
 * the memory plan (plan_report) on stdout. */
#include "driver.h"

#include <string.h>

static const char usage[] =
    "usage: kiln compile MODEL -o OUT.so [--weights FILE.safetensors]... [--target c]\n"
    "                          [-O0|-O1|-O2] [--passes=P,...] [--no-PASS] [--dump-dir DIR]\n"
    "                          [--emit-source FILE.c] [--header FILE.h] [--memory-report] [--check]\n"
    "\n"
    "Compiles MODEL into a shared object exporting kiln_model() (kiln/model.h). The C\n"
    "compiler is $KILN_CC, else cc; the .so needs only libc, libm, pthreads and OpenBLAS.\n"
    "--memory-report prints the workspace plan: each buffer's size, lifetime (kernel\n"
    "indexes) and offset, the peak, and the lower bound (the most bytes live at once);\n"
    "--no-memplan gives every value its own memory. --dump-dir DIR also writes the\n"
    "generated C as DIR/model.c. --check runs the interpreter on random inputs before\n"
    "the passes and after each, then the compiled model, and fails naming the first pass\n"
    "(or the compiled model) that changes an output beyond 1e-4 + 1e-4|expected|; on\n"
    "failure no file is left.\n";

/* --check of the compiled model: loaded and run on the check's inputs, its outputs
 * are compared with the interpreter's before the passes. */
static int check_compiled(const Check *check, const Graph *g, const char *path, Diag *d) {
    kiln_error err = {""};
    kiln_module *m = kiln_load(path, &err);
    if (!m)
        return diag_error(d, (Loc){0}, "%s", err.message);
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
        rc = diag_error(d, (Loc){0}, "%s", err.message);
    if (!rc)
        rc = check_outputs(check, g, out, "target c", "the compiled model", d);
    for (int k = 0; out && k < g->n_outputs; k++)
        tensor_free(out[k]);
    ir_free(in);
    ir_free(inputs);
    ir_free(out);
    ir_free(outputs);
    kiln_free(m);
    return rc;
}

int cmd_compile(int argc, char **argv) {
    Options o;
    if (argc > 2 && (strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0)) {
        fputs(usage, stdout);
        return 0;
    }
    int rc = parse_options(argc, argv, 2,
                           "-o --weights --target -O --passes --no-PASS --dump-dir --emit-source --header "
                           "--memory-report --check",
                           usage, &o);
    if (rc)
        return rc;
    if (!o.out) {
        fprintf(stderr, "kiln: error: kiln compile needs -o OUT.so\n%s", usage);
        return EXIT_USAGE;
    }
    Diag d;
    diag_init(&d, stderr);
    if (o.target && strcmp(o.target, "interp") == 0) {
        diag_error(&d, (Loc){0}, "the interpreter compiles nothing; kiln compile takes --target c or cuda");
        return EXIT_USER;
    }
    JitOptions jo = jit_options(&o);
    SrcFile *src;
    Graph *g;
    TensorList weights = {0};
    Program *p = NULL;
    Source c = {0};
    Str h = {0};
    Check check = {0}; /* --check: the interpreter's outputs before the passes */
    o.pipeline.check_result = &check;
    rc = load_model(&o, true, &d, &src, &g, &weights);
    if (!rc && pipeline_run(g, &weights, &o.pipeline, &d))
        rc = EXIT_USER;
    if (!rc && (!(p = program_lower(g, &weights, jo.target, jo.memplan, &d)) || program_source(p, &c, &d)))
        rc = EXIT_USER;
    /* the source people read: the C, or the CUDA kernels */
    const Str *shown = jo.target == TARGET_CUDA ? &c.kernels : &c.host;
    if (!rc && o.memory_report) {
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
    /* all the files or none: the source and header are written first and removed
       again if the compiler fails */
    bool wrote_source = false, wrote_header = false, wrote_dump = false;
    char dump_path[4200] = "";
    if (o.pipeline.dump_dir)
        snprintf(dump_path, sizeof dump_path, "%s/model.%s", o.pipeline.dump_dir,
                 jo.target == TARGET_CUDA ? "cu" : "c");
    if (!rc && *dump_path && !(wrote_dump = write_file_atomic(dump_path, shown->s, shown->len, &d) == 0))
        rc = EXIT_USER;
    if (!rc && o.emit_source &&
        !(wrote_source = write_file_atomic(o.emit_source, shown->s, shown->len, &d) == 0))
        rc = EXIT_USER;
    if (!rc && o.header && !(wrote_header = !h.oom && write_file_atomic(o.header, h.s, h.len, &d) == 0))
        rc = EXIT_USER;
    if (!rc && cc_compile_so(&c, p, o.out, &d))
        rc = EXIT_USER;
    else if (!rc && o.pipeline.check && check_compiled(&check, g, o.out, &d)) {
        remove(o.out);
        rc = EXIT_USER;
    }
    if (rc && wrote_source)
        remove(o.emit_source);
    if (rc && wrote_dump)
        remove(dump_path);
    if (rc && wrote_header)
        remove(o.header);
    check_free(&check);
    source_free(&c);
    str_free(&h);
    program_free(p);
    tensors_free(&weights);
    graph_free(g);
    srcfile_free(src);
    return rc;
}
