/* The C emitter: a lowered Program as one translation unit.
 *
 * In order: the public header kiln/model.h and the runtime's (runtime/model_rt.h),
 * pasted so the shared object needs no kiln library; the declarations of kiln's
 * precompiled kernels (runtime/kernels.h, whose object, with the runtime's
 * model_rt.c, is linked in beside this source: cc_kernel_object); the BLAS
 * prototypes; the
 * weights, linked in as binary data with an `.incbin` of the blob file (or, for an
 * in-process JIT, an external symbol the host defines); one function per kernel
 * text (kernels defined once, below); the run function calling the kernels in order,
 * each call under the comment of the ops it computes; and the `kiln_model`
 * definition. Kernel bodies are the lowering's kernel IR,
 * printed by kir_print.c: the language description (`Lang`) says only how a kernel
 * is declared and looped, and how its hints are spelled.
 * A profiling build (Program.profile, for `kiln bench --profile`) differs only in
 * the run function, which reads a monotonic clock after every kernel and adds the
 * difference to that kernel's slot, and in the exported `kiln_profile` that hands
 * out the slots with the kernels' names, comments and FLOPs. The header that
 * `kiln compile --header` writes is made here too. Every name of the model that
 * appears in this source is in a comment or string literal that c_text.c escaped,
 * or part of an identifier value_name mangled. */
#include "codegen.h"
#include "cache.h"

#include <string.h>
#include <unistd.h>

extern const char kiln_model_h_text[];
extern const char kiln_runtime_text[];
extern const char kiln_kernel_math_text[];
extern const char kiln_kernels_h_text[];

const Lang lang_c = {
    .name = "c",
    /* noinline: kernels inlined into graph_run only cost compile time (10-15% of Clang's) */
    .kernel_decl = "static __attribute__((noinline)) void",
    .params = "(KILN_MAYBE_UNUSED const KilnArgs *args, KILN_MAYBE_UNUSED void *const *buf, int64_t begin, "
              "int64_t end)",
    .args = "args->",
    .buffers = "buf",
    .restrict_kw = "restrict ",
    .parallel_open = "for (int64_t i = begin; i < end; i++)",
    .call_open = "(void)begin, (void)end;",
    .unroll_hint = "#pragma GCC unroll", /* GCC's spelling, which Clang reads too */
    .vector_hint = "KILN_INDEPENDENT",   /* defined by emit_c_model for each compiler */
};

/* The expression for a value's buffer, as a float pointer; *constant when it points
 * at memory the kernels only read (the inputs, the weights). */
static void buffer_expr(const Program *p, const Lang *l, int v, char *buf, size_t n, bool *constant) {
    Buffer b = p->buf[v];
    *constant = b.kind == BUF_INPUT || b.kind == BUF_WEIGHT;
    switch (b.kind) {
    case BUF_INPUT: snprintf(buf, n, "%sin[%lld]", l->args, (long long)b.offset); break;
    case BUF_OUTPUT: snprintf(buf, n, "%sout[%lld]", l->args, (long long)b.offset); break;
    case BUF_WEIGHT: snprintf(buf, n, "%swt + %lld", l->args, (long long)(b.offset / 4)); break;
    case BUF_STATE: snprintf(buf, n, "%sst + %lld", l->args, (long long)(b.offset / 4)); break;
    case BUF_WORK: snprintf(buf, n, "%sws + %lld", l->args, (long long)(b.offset / 4)); break;
    case BUF_NONE: /* the compile fails (diag_take_assert); the text stays a C expression */
        KILN_ASSERT(!"a kernel uses a value with no buffer");
        snprintf(buf, n, "NULL");
        break;
    }
}

static bool seen_before(const int *ids, int n, int v) {
    for (int i = 0; i < n; i++)
        if (ids[i] == v)
            return true;
    return false;
}

/* Copies text line by line, each indented by `indent` spaces. */
void indent_lines(Str *out, const char *text, int indent) {
    for (const char *p = text; p && *p;) {
        const char *nl = strchr(p, '\n');
        int len = nl ? (int)(nl - p) : (int)strlen(p);
        if (len > 0)
            str_printf(out, "%*s%.*s\n", indent, "", len, p);
        else
            str_printf(out, "\n");
        p = nl ? nl + 1 : NULL;
    }
}

/* Whether another value the kernel uses has v's memory (an in-place result and
 * its input, a view and its value): then neither pointer may be `restrict`. */
static bool shares_memory(const Program *p, const Kernel *k, int v) {
    Buffer b = p->buf[v];
    for (int i = 0; i < k->n_reads + k->n_writes; i++) {
        int u = i < k->n_reads ? k->reads[i] : k->writes[i - k->n_reads];
        if (u >= 0 && u != v && p->buf[u].kind == b.kind && p->buf[u].offset == b.offset &&
            kir_uses_value(k->ir, u))
            return true;
    }
    return false;
}

/* The C type of dtype t's elements. */
static const char *element_ctype(DType t) {
    switch (t) {
    case DT_I64: return "int64_t";
    case DT_I32: return "int32_t";
    case DT_BOOL: return "unsigned char";
    default: return "float";
    }
}

/* "const float *restrict x = ws + 16;", cast where the buffer is another type's. */
static void emit_pointer(Str *out, const Lang *l, DType t, bool writable, bool restricted, const char *name,
                         const char *expr) {
    const char *c = writable ? "" : "const ", *e = element_ctype(t), *r = restricted ? l->restrict_kw : "";
    if (t == DT_F32)
        str_printf(out, "    %sfloat *%s%s = %s;\n", c, r, name, expr);
    else
        str_printf(out, "    %s%s *%s%s = (%s%s *)(%s);\n", c, e, r, name, c, e, expr);
}

/* The pointers kernel k declares, in order, into ptrs (room for n_reads + n_writes +
 * 2): each value it reads (once, and not one it writes too), each value it writes
 * (-1 - j: the caller's j-th output), its scratch (KIR_SCRATCH) and its table
 * (KIR_TABLE), where its body uses them. Returns how many. */
static int kernel_pointers(const Kernel *k, int *ptrs) {
    int n = 0;
    for (int r = 0; r < k->n_reads; r++) {
        int v = k->reads[r];
        if (!seen_before(k->reads, r, v) && !seen_before(k->writes, k->n_writes, v) &&
            kir_uses_value(k->ir, v))
            ptrs[n++] = v;
    }
    for (int w = 0; w < k->n_writes; w++)
        if (kir_uses_value(k->ir, k->writes[w]))
            ptrs[n++] = k->writes[w];
    if (k->scratch_bytes && kir_uses_value(k->ir, KIR_SCRATCH))
        ptrs[n++] = KIR_SCRATCH;
    if (k->table_bytes && kir_uses_value(k->ir, KIR_TABLE))
        ptrs[n++] = KIR_TABLE;
    return n;
}

static int *kernel_pointers_alloc(const Kernel *k, int *n) {
    int *ptrs = ir_calloc((size_t)(k->n_reads + k->n_writes + 2), sizeof *ptrs);
    *n = ptrs ? kernel_pointers(k, ptrs) : 0;
    return ptrs;
}

/* Where the pointer `ptr` of kernel k points, as an expression of l->args; *constant
 * as buffer_expr. */
static void pointer_expr(const Program *p, const Lang *l, const Kernel *k, int ptr, char *buf, size_t n,
                         bool *constant) {
    *constant = ptr == KIR_TABLE;
    if (ptr == KIR_SCRATCH)
        snprintf(buf, n, "%sws + %lld", l->args, (long long)(k->scratch / 4));
    else if (ptr == KIR_TABLE)
        snprintf(buf, n, "%swt + %lld", l->args, (long long)(k->table / 4));
    else if (ptr < 0)
        snprintf(buf, n, "%sout[%d]", l->args, -1 - ptr);
    else
        buffer_expr(p, l, ptr, buf, n, constant);
}

/* Declares kernel k's pointers (ptrs, kernel_pointers'): from where they point, or
 * from l->buffers' array, as buf0, buf1, ... (kir_print's names for them). */
static void emit_kernel_decls(const Program *p, const Lang *l, const Kernel *k, const int *ptrs, int n,
                              Str *out) {
    char expr[128], name[32];
    for (int j = 0; j < n; j++) {
        int v = ptrs[j];
        bool constant;
        if (l->buffers)
            snprintf(expr, sizeof expr, "%s[%d]", l->buffers, j);
        else
            pointer_expr(p, l, k, v, expr, sizeof expr, &constant);
        if (v == KIR_SCRATCH || v == KIR_TABLE) {
            str_printf(out, "    %sfloat *%s%s = %s;\n", v == KIR_TABLE ? "const " : "", l->restrict_kw,
                       v == KIR_TABLE ? "table" : "scratch", expr);
            continue;
        }
        bool writable = seen_before(k->writes, k->n_writes, v);
        if (l->buffers)
            snprintf(name, sizeof name, "buf%d", j);
        else if (v < 0)
            snprintf(name, sizeof name, "out%d", -1 - v);
        DType t = p->g->values[v < 0 ? p->g->outputs[-1 - v] : v].type.dtype;
        emit_pointer(out, l, t, writable, v < 0 || !shares_memory(p, k, v),
                     l->buffers || v < 0 ? name : value_name(p, v), expr);
    }
}

/* Whether a body has the PARALLEL loop of a kernel's iterations. */
static bool has_parallel_loop(const KBody *kb) {
    for (const KStmt *s = kb->body; s; s = s->next)
        if (s->kind == KS_FOR && (s->flags & K_PARALLEL))
            return true;
    return false;
}

/* Kernel k after its name: parameters, pointers and body. */
static void emit_kernel_text(const Program *p, const Lang *l, const Kernel *k, Str *out) {
    int n, *ptrs = kernel_pointers_alloc(k, &n);
    if (!ptrs) {
        out->oom = true;
        return;
    }
    str_printf(out, "%s {\n", l->params);
    emit_kernel_decls(p, l, k, ptrs, n, out);
    if (!has_parallel_loop(k->ir))
        str_printf(out, "    %s\n", l->call_open);
    kir_print(p, l, k->ir, l->buffers ? ptrs : NULL, n, out, 4);
    str_printf(out, "}\n\n");
    ir_free(ptrs);
}

void emit_kernel(const Program *p, const Lang *l, const Kernel *k, Str *out) {
    c_comment(out, "%s", k->comment);
    str_printf(out, "\n%s ", l->kernel_decl);
    if (k->kind == K_GEMM && l->launch_bounds)
        str_printf(out, "%s(%d) ", l->launch_bounds, GEMM_BLOCK);
    str_printf(out, "%s", k->name);
    emit_kernel_text(p, l, k, out);
}

/* The ABI's name of dtype t (kiln/model.h). */
static const char *abi_dtype(DType t) {
    switch (t) {
    case DT_I64: return "KILN_I64";
    case DT_I32: return "KILN_I32";
    case DT_BOOL: return "KILN_BOOL";
    default: return "KILN_F32";
    }
}

static void emit_infos(const Program *p, Str *out, const char *what, const int *ids, int n) {
    for (int i = 0; i < n; i++) {
        const Type *t = &p->g->values[ids[i]].type;
        str_printf(out, "static const int64_t %s%d_shape[] = {", what, i);
        for (int k = 0; k < t->rank; k++) /* -k: k times the symbolic dim (abi.md) */
            str_printf(out, "%s%lld", k ? ", " : "",
                       (long long)(k == 0 && t->sym ? -t->sym_mult : t->dims[k]));
        str_printf(out, "%s};\n", t->rank ? "" : "0");
    }
    str_printf(out, "static const kiln_tensor_info model_%s[] = {\n", what);
    for (int i = 0; i < n; i++) {
        str_printf(out, "    {\"");
        c_string(out, p->g->values[ids[i]].name);
        const Type *t = &p->g->values[ids[i]].type;
        str_printf(out, "\", %s, %d, %s%d_shape},\n", abi_dtype(t->dtype), t->rank, what, i);
    }
    if (n == 0)
        str_printf(out, "    {0}\n");
    str_printf(out, "};\n");
}

/* The kernels of p and then of p->at_one, the k-th of them and (owner not NULL)
 * the program it belongs to. */
static int all_kernels(const Program *p) {
    return p->n_kernels + (p->at_one ? p->at_one->n_kernels : 0);
}

static const Kernel *kernel_at(const Program *p, int k, const Program **owner) {
    const Program *q = k < p->n_kernels ? p : p->at_one;
    if (owner)
        *owner = q;
    return &q->kernels[k < p->n_kernels ? k : k - p->n_kernels];
}

void emit_unit_bytes(const Program *p, Str *out, const char *what, const int *ids, int n) {
    str_printf(out, "static const int64_t model_%s_unit_bytes[] = {", what);
    for (int i = 0; i < n; i++) {
        const Type *t = &p->g->values[ids[i]].type;
        int64_t items = t->sym ? p->g->sym.bound : p->split,
                unit = items ? type_numel(t) / items * dtype_size(t->dtype) : 0;
        str_printf(out, "%s%lld", i ? ", " : "", (long long)unit);
    }
    str_printf(out, "%s};\n", n ? "" : "0");
}

/* The per-kernel tables and the clock of a profiling build (sized at least 1, as C
 * has no empty arrays), and kiln_profile, exported for kiln bench. */
void emit_profile_tables(const Program *p, Str *out) {
    int n = all_kernels(p) ? all_kernels(p) : 1;
    str_printf(out,
               "/* Profiling: seconds per kernel, summed over runs, and what each kernel is. */\n"
               "#include <time.h>\n\n"
               "static double kiln_prof_seconds[%d];\n",
               n);
    const char *what[2] = {"names", "comments"};
    for (int t = 0; t < 2; t++) {
        str_printf(out, "static const char *const kiln_prof_%s[%d] = {\n", what[t], n);
        for (int k = 0; k < all_kernels(p); k++) {
            const Kernel *kn = kernel_at(p, k, NULL);
            str_printf(out, "    \"");
            c_string(out, t == 0 ? kn->name : kn->comment);
            str_printf(out, "\",\n");
        }
        str_printf(out, "%s};\n", all_kernels(p) ? "" : "    0\n");
    }
    /* a split batch's kernels run once an item, and their seconds add up over the items */
    int64_t runs = p->split ? p->split : 1;
    str_printf(out, "static const int64_t kiln_prof_flops[%d] = {", n);
    for (int k = 0; k < all_kernels(p); k++)
        str_printf(out, "%s%lld", k ? ", " : "", (long long)(kernel_at(p, k, NULL)->flops * runs));
    str_printf(out, "%s};\n\n", all_kernels(p) ? "" : "0");
    str_printf(out,
               "static double kiln_prof_now(void) {\n"
               "    struct timespec t;\n"
               "    clock_gettime(CLOCK_MONOTONIC, &t);\n"
               "    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;\n"
               "}\n\n"
               "__attribute__((visibility(\"default\")))\n"
               "int kiln_profile(double **seconds, const char *const **names, const char *const **comments,\n"
               "                 const int64_t **flops) {\n"
               "    *seconds = kiln_prof_seconds;\n"
               "    *names = kiln_prof_names;\n"
               "    *comments = kiln_prof_comments;\n"
               "    *flops = kiln_prof_flops;\n"
               "    return %d;\n"
               "}\n\n",
               all_kernels(p));
}

static bool calls_blas(const KStmt *s) {
    for (; s; s = s->next)
        if ((s->kind == KS_CALL && strncmp(s->name, "cblas_", 6) == 0) || calls_blas(s->body) ||
            calls_blas(s->orelse))
            return true;
    return false;
}

static bool uses_blas(const Program *p) {
    for (int k = 0; k < p->n_kernels; k++)
        if (calls_blas(p->kernels[k].ir->body))
            return true;
    return false;
}

void emit_runtime(Str *out, const char *runtime) {
    const char *include = "#include \"kiln/model.h\"\n", *skip = strstr(runtime, include);
    str_printf(out, "%s\n", kiln_model_h_text);
    if (skip)
        str_printf(out, "%.*s%s\n", (int)(skip - runtime), runtime, skip + strlen(include));
    else
        str_printf(out, "%s\n", runtime);
}

void emit_weights_blob(const Program *p, Str *out) {
    str_printf(out, "/* The weights: %lld bytes of params, consts and kernel tables. */\n",
               (long long)p->weights_bytes);
    str_printf(
        out,
        "#ifdef KILN_WEIGHTS_EXTERN\n"
        "extern const unsigned char kiln_weights_blob[];\n"
        "#else\n"
        "__asm__(\".section .rodata\\n.balign 64\\n.hidden kiln_weights_blob\\n\"\n"
        "        \"kiln_weights_blob:\\n.incbin \\\"\" KILN_WEIGHTS_FILE \"\\\"\\n.byte 0\\n.previous\");\n"
        "extern const unsigned char kiln_weights_blob[] __attribute__((visibility(\"hidden\")));\n"
        "#endif\n\n");
}

/* The params an update changes, in the order of their place in the state. */
static int state_params(const Program *p, int *ids) {
    int n = 0;
    for (int i = 0; i < p->g->n_nodes; i++) {
        const Node *nd = p->g->nodes[i];
        if (nd->op == OP_PARAM && p->buf[nd->out[0]].kind == BUF_STATE)
            ids[n++] = nd->out[0];
    }
    return n;
}

void emit_model_def(const Program *p, Str *out, const char *rt) {
    int *params = ir_calloc((size_t)p->g->n_nodes + 1, sizeof *params);
    if (!params) {
        out->oom = true;
        return;
    }
    int n_params = state_params(p, params);
    emit_infos(p, out, "inputs", p->inputs, p->n_inputs);
    emit_infos(p, out, "outputs", p->g->outputs, p->g->n_outputs);
    emit_infos(p, out, "params", params, n_params);
    /* each param's place in the state and its size in bytes */
    str_printf(out, "static const int64_t model_param_at[][2] = {\n");
    for (int i = 0; i < n_params; i++) {
        const Type *t = &p->g->values[params[i]].type;
        str_printf(out, "    {%lld, %lld},\n", (long long)p->buf[params[i]].offset,
                   (long long)(type_numel(t) * dtype_size(t->dtype)));
    }
    str_printf(
        out,
        "%s};\n\n"
        "static int model_read_param(void *instance, int32_t i, void *dst) {\n"
        "    return i < 0 || i >= %d || %s_read_state(instance, model_param_at[i][0], model_param_at[i][1], "
        "dst);\n"
        "}\n"
        "static int model_write_param(void *instance, int32_t i, const void *src) {\n"
        "    return i < 0 || i >= %d || %s_write_state(instance, model_param_at[i][0], "
        "model_param_at[i][1], src);\n"
        "}\n",
        n_params ? "" : "    {0, 0}\n", n_params, rt, n_params, rt);
    ir_free(params);
    str_printf(
        out,
        "\nstatic int model_create_comm(void **instance, const kiln_comm *comm, char *err, size_t errlen) {\n"
        "    return %s_create(&program, comm, instance, err, errlen);\n"
        "}\n"
        "static int model_create(void **instance, char *err, size_t errlen) {\n"
        "    return %s_create(&program, NULL, instance, err, errlen);\n"
        "}\n",
        rt, rt);
    /* what run's nonzero results mean (docs/abi.md) */
    str_printf(out, "\nstatic const char *const model_faults[] = {\n");
    for (int f = 0; f < p->n_faults; f++) {
        str_printf(out, "    \"");
        c_string(out, p->faults[f]);
        str_printf(out, "\",\n");
    }
    str_printf(out,
               "    0\n};\n"
               "static const char *model_run_error(int32_t fault) {\n"
               "    return fault >= 1 && fault <= %d ? model_faults[fault - 1] : 0;\n"
               "}\n",
               p->n_faults);
    const SymDim *sym = &p->g->sym;
    str_printf(out, "\nstatic const char *const model_sym_names[] = {\"");
    c_string(out, sym->name ? sym->name : "");
    str_printf(out, "\"};\nstatic const int64_t model_sym_bounds[] = {%lld};\n", (long long)sym->bound);
    str_printf(out, "\nstatic const kiln_model_def model_def = {\n    KILN_ABI_VERSION, KILN_EXT_PARAMS | "
                    "KILN_EXT_COMM | KILN_EXT_RUN_ERROR | KILN_EXT_SYM, \"");
    c_string(out, p->g->name);
    str_printf(out,
               "\", %d, %d, model_inputs, model_outputs,\n"
               "    model_create, %s_run, %s_destroy,\n"
               "    %d, model_params, model_read_param, model_write_param, model_create_comm,\n"
               "    model_run_error, %d, model_sym_names, model_sym_bounds, %s_run_sym,\n"
               "};\n\n"
               "__attribute__((visibility(\"default\"))) const kiln_model_def *kiln_model(void) {\n"
               "    return &model_def;\n"
               "}\n",
               p->n_inputs, p->g->n_outputs, rt, rt, n_params, sym->name ? 1 : 0, rt);
}

void emit_header(const Graph *g, Str *out) {
    c_comment(out, "Model '%s', compiled by kiln.", g->name);
    str_printf(out, "\n");
    int n = graph_inputs(g, NULL, 0), *ids = ir_calloc((size_t)n + 1, sizeof *ids);
    if (!ids) {
        out->oom = true;
        return;
    }
    graph_inputs(g, ids, n);
    if (g->sym.name) {
        c_comment(out, "%s: a symbolic dim, from 1 to %lld at each run_sym (docs/abi.md)", g->sym.name,
                  (long long)g->sym.bound);
        str_printf(out, "\n");
    }
    char ty[160];
    for (int i = 0; i < n; i++) {
        c_comment(out, "inputs[%d]:  %s %s", i, g->values[ids[i]].name,
                  type_str(&g->values[ids[i]].type, ty, sizeof ty));
        str_printf(out, "\n");
    }
    for (int k = 0; k < g->n_outputs; k++) {
        c_comment(out, "outputs[%d]: %s %s", k, g->values[g->outputs[k]].name,
                  type_str(&g->values[g->outputs[k]].type, ty, sizeof ty));
        str_printf(out, "\n");
    }
    str_printf(out, "\n%s", kiln_model_h_text);
    ir_free(ids);
}

/* A kernel of a model split into units: defined in one and called from the main
 * unit, so not static. */
static const Lang lang_c_unit = {
    .name = "c",
    .kernel_decl = "__attribute__((noinline, visibility(\"hidden\"))) void",
    .params = "(KILN_MAYBE_UNUSED const KilnArgs *args, KILN_MAYBE_UNUSED void *const *buf, int64_t begin, "
              "int64_t end)",
    .args = "args->",
    .buffers = "buf",
    .restrict_kw = "restrict ",
    .parallel_open = "for (int64_t i = begin; i < end; i++)",
    .call_open = "(void)begin, (void)end;",
    .unroll_hint = "#pragma GCC unroll",
    .vector_hint = "KILN_INDEPENDENT",
};

/* ---- Kernels defined once ----
 *
 * A C kernel reaches its buffers only through `buf`, so its text holds nothing of
 * where a model keeps them: the layers of one op and shape are the same text. Each
 * text is defined once, named by its hash and what its first kernel computes
 * (k<16 hex digits>_<op>_<part>), so that a model's source holds it once and the
 * in-process JIT's cache holds its object once for every model that has it. */
enum { HASH_NAME = 17 }; /* a definition's name up to its hash: "k" and 16 hex digits */

typedef struct {
    int n;            /* kernel_at's kernels */
    int *def;         /* per kernel: the first kernel with its text, which defines it */
    Str *text;        /* per defining kernel: its text after the name */
    char (*name)[96]; /* per kernel: its definition's name */
} CKernels;

static void c_kernels_free(CKernels *ck) {
    for (int k = 0; ck->text && k < ck->n; k++)
        str_free(&ck->text[k]);
    ir_free(ck->def);
    ir_free(ck->text);
    ir_free(ck->name);
}

static int c_kernels_make(const Program *p, CKernels *ck) {
    *ck = (CKernels){.n = all_kernels(p)};
    ck->def = ir_calloc((size_t)ck->n + 1, sizeof *ck->def);
    ck->text = ir_calloc((size_t)ck->n + 1, sizeof *ck->text);
    ck->name = ir_calloc((size_t)ck->n + 1, sizeof *ck->name);
    if (!ck->def || !ck->text || !ck->name)
        return -1;
    for (int k = 0; k < ck->n; k++) {
        const Program *owner;
        const Kernel *kn = kernel_at(p, k, &owner);
        Str *text = &ck->text[k];
        emit_kernel_text(owner, &lang_c_unit, kn, text);
        if (text->oom)
            return -1;
        CacheHash h = CACHE_HASH_INIT;
        cache_hash(&h, text->s, text->len);
        char hex[33];
        cache_hash_text(&h, hex, sizeof hex);
        const char *what = strchr(kn->name + strlen(owner->kernel_prefix), '_');
        snprintf(ck->name[k], sizeof ck->name[k], "k%.16s%s", hex, what ? what : "");
        ck->def[k] = k;
        for (int j = 0; j < k && ck->def[k] == k; j++) /* the same text: the first one's definition */
            if (ck->def[j] == j && memcmp(ck->name[j], ck->name[k], HASH_NAME) == 0 &&
                ck->text[j].len == text->len && memcmp(ck->text[j].s, text->s, text->len) == 0) {
                ck->def[k] = j;
                memcpy(ck->name[k], ck->name[j], sizeof ck->name[k]);
                str_free(text);
            }
    }
    return 0;
}

/* The array of pointers a call of kernel k of q hands it, or NULL when it has none. */
static void emit_call_buffers(const Program *q, const Kernel *k, Str *out) {
    int n, *ptrs = kernel_pointers_alloc(k, &n);
    char expr[128];
    str_printf(out, n ? "(void *const[]){" : "NULL");
    for (int j = 0; j < n; j++) {
        bool constant;
        pointer_expr(q, &lang_c, k, ptrs[j], expr, sizeof expr, &constant);
        str_printf(out, constant ? "%s(void *)(%s)" : "%s%s", j ? ", " : "", expr);
    }
    str_printf(out, n ? "}" : "");
    if (!ptrs)
        out->oom = true;
    ir_free(ptrs);
}

/* graph_run (or NAME) of q, p itself or p->at_one: each kernel called in turn, a
 * LOOP over the iterations the run's size needs, under the comment of what it
 * computes; with p's profile, each timed into its slot of p's tables. */
static void emit_graph_run(const Program *p, const Program *q, const CKernels *ck, const char *name,
                           Str *out) {
    int first = q == p ? 0 : p->n_kernels;
    str_printf(out, "static void %s(KilnInstance *inst, const KilnArgs *args) {\n", name);
    if (p->profile && q->n_kernels)
        str_printf(out, "    double kiln_prof_then = kiln_prof_now(), kiln_prof_at;\n");
    for (int k = 0; k < q->n_kernels; k++) {
        const Kernel *kn = &q->kernels[k];
        const char *callee = ck->name[first + k];
        str_printf(out, "    ");
        c_comment(out, "%s", kn->comment);
        if (kn->kind == K_LOOP || kn->kind == K_GEMM)
            str_printf(out, "\n    kiln_rt_parallel(inst, %s, args, ", callee);
        else
            str_printf(out, "\n    %s(args, ", callee);
        emit_call_buffers(q, kn, out);
        if (kn->kind == K_LOOP && kn->sym_rows && kn->sym_tile == 1) /* the rows of args->sym units */
            str_printf(out, ", args->sym * %lld, %lld);\n", (long long)(kn->sym_rows * kn->sym_width),
                       (long long)kn->grain);
        else if (kn->kind == K_LOOP && kn->sym_rows)
            str_printf(out, ", (args->sym * %lld + %lld) / %lld * %lld, %lld);\n", (long long)kn->sym_rows,
                       (long long)(kn->sym_tile - 1), (long long)kn->sym_tile, (long long)kn->sym_width,
                       (long long)kn->grain);
        else if (kn->kind == K_LOOP)
            str_printf(out, ", %lld, %lld);\n", (long long)kn->count, (long long)kn->grain);
        else if (kn->kind == K_GEMM && kn->sym_rows && (kn->sym_by_batch || kn->batch == 1))
            str_printf(out, ", args->sym * %lld, 1);\n",
                       (long long)(kn->sym_rows * (kn->sym_by_batch ? kn->m : 1))); /* rows in order */
        else if (kn->kind == K_GEMM)
            str_printf(out, ", %lld, 1);\n", (long long)(kn->batch * kn->m));
        else
            str_printf(out, ", 0, 1);\n");
        if (p->profile)
            str_printf(out,
                       "    kiln_prof_at = kiln_prof_now();\n"
                       "    kiln_prof_seconds[%d] += kiln_prof_at - kiln_prof_then;\n"
                       "    kiln_prof_then = kiln_prof_at;\n",
                       first + k);
    }
    if (q->n_kernels == 0)
        str_printf(out, "    (void)inst, (void)args;\n");
    str_printf(out, "}\n\n");
}

/* What every kernel is compiled after: the runtime's header and math, the
 * precompiled kernels' declarations, BLAS's, and the vector type. */
static void emit_c_prelude(const Program *p, Str *out) {
    emit_runtime(out, kiln_runtime_text);
    str_printf(out, "%s\n", kiln_kernel_math_text);
    if (program_uses_philox(p))
        str_printf(out, "%s\n", kiln_philox_text);
    str_printf(out, "%s\n", kiln_kernels_h_text);
    str_printf(out,
               "#include <math.h>\n\n"
               "/* OpenBLAS, declared here so that no BLAS header is needed. */\n"
               "enum { CblasRowMajor = 101, CblasNoTrans = 111, CblasTrans = 112 };\n"
               "void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,\n"
               "                 const float *a, int lda, const float *b, int ldb, float beta, float *c,\n"
               "                 int ldc);\n"
               "void cblas_sgemv(int order, int trans, int m, int n, float alpha, const float *a, int lda,\n"
               "                 const float *x, int incx, float beta, float *y, int incy);\n"
               "void openblas_set_num_threads(int n);\n\n"
               "/* Before a loop whose iterations touch disjoint elements: vectorize it without\n"
               "   testing its pointers for overlap at run time, which GCC gives up on beyond\n"
               "   ten pairs of them. */\n"
               "#ifdef __clang__\n"
               "#define KILN_INDEPENDENT _Pragma(\"clang loop vectorize(assume_safety)\")\n"
               "#else\n"
               "#define KILN_INDEPENDENT _Pragma(\"GCC ivdep\")\n"
               "#endif\n\n");
    if (p->vector_floats > 0)
        str_printf(out,
                   "/* A vector register of floats (GCC's and Clang's vector extension), read and\n"
                   "   written at any alignment. */\n"
                   "typedef float kiln_vf __attribute__((vector_size(%d), aligned(4)));\n\n",
                   4 * p->vector_floats);
}

/* The definition of kernel text d of ck in language l. */
static void emit_definition(const CKernels *ck, const Lang *l, int d, Str *out) {
    str_printf(out, "%s %s%s", l->kernel_decl, ck->name[d], ck->text[d].s);
}

/* Unit `unit` of `units` (emit_c_units): the definitions of every units-th kernel
 * text, from the unit-th on; the first unit also the run function and kiln_model,
 * declaring the others'. The whole model when units is 1; unit -1: only the first's
 * run function and kiln_model (emit_c_pieces). */
static int emit_c_unit(const Program *p, const CKernels *ck, int unit, int units, Str *out, Diag *d) {
    const Lang *l = units > 1 || unit < 0 ? &lang_c_unit : &lang_c;
    c_comment(out, "Generated by kiln from model '%s'.", p->g->name);
    str_printf(out, "\n\n");
    emit_c_prelude(p, out);
    emit_weights_blob(p, out);
    for (int k = 0, defs = 0; k < ck->n; k++)
        if (ck->def[k] == k && defs++ % units == unit)
            emit_definition(ck, l, k, out);
    if (unit > 0) {
        if (out->oom)
            return diag_error(d, (Loc){0}, "out of memory generating C");
        return 0;
    }
    for (int k = 0, defs = 0; k < ck->n; k++)
        if (ck->def[k] == k && defs++ % units != unit)
            str_printf(out, "%s %s%s;\n", l->kernel_decl, ck->name[k], l->params);
    if (p->profile)
        emit_profile_tables(p, out);
    emit_graph_run(p, p, ck, "graph_run", out);
    if (p->at_one)
        emit_graph_run(p, p->at_one, ck, "graph_run_one", out);
    emit_unit_bytes(p, out, "in", p->inputs, p->n_inputs);
    emit_unit_bytes(p, out, "out", p->g->outputs, p->g->n_outputs);
    const char *blas =
        uses_blas(p) || (p->at_one && uses_blas(p->at_one)) ? "openblas_set_num_threads" : "NULL";
    if (p->at_one) /* the model at size 1 of its symbolic dim, which run_sym runs there */
        str_printf(out,
                   "static const KilnProgram program_one = {%lld, 0, kiln_weights_blob, graph_run_one, "
                   "%s,\n                                        0, %d, %d, model_in_unit_bytes, "
                   "model_out_unit_bytes, NULL, 0};\n",
                   (long long)p->at_one->workspace_bytes, blas, p->n_inputs, p->g->n_outputs);
    str_printf(out,
               "static const KilnProgram program = {%lld, %lld, kiln_weights_blob, graph_run, %s,\n"
               "                                    %lld, %d, %d, model_in_unit_bytes, model_out_unit_bytes, "
               "%s, %lld};\n\n",
               (long long)p->workspace_bytes, (long long)p->state_bytes, blas, (long long)p->g->sym.bound,
               p->n_inputs, p->g->n_outputs, p->at_one ? "&program_one" : "NULL", (long long)p->split);
    emit_model_def(p, out, "kiln_rt");
    if (out->oom)
        return diag_error(d, (Loc){0}, "out of memory generating C");
    return 0;
}

/* The units of p (ck made for them), each into out[u]. */
static int emit_units(const Program *p, int units, Str *out, Diag *d) {
    CKernels ck;
    int rc = c_kernels_make(p, &ck) ? diag_error(d, (Loc){0}, "out of memory generating C") : 0;
    for (int u = 0; !rc && u < units; u++)
        rc = emit_c_unit(p, &ck, u, units, &out[u], d);
    c_kernels_free(&ck);
    return rc;
}

int emit_c_model(const Program *p, Str *out, Diag *d) {
    return emit_units(p, 1, out, d);
}

int c_unit_count(const Program *p) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int n = cores < 1 ? 1 : cores > C_MAX_UNITS ? C_MAX_UNITS : (int)cores;
    int most = all_kernels(p) / 8;
    return n < most ? n : most < 1 ? 1 : most;
}

int emit_c_units(const Program *p, int units, Str *out, Diag *d) {
    return emit_units(p, units, out, d);
}

int emit_c_pieces(const Program *p, CPieces *out, Diag *d) {
    *out = (CPieces){0};
    CKernels ck;
    int rc = c_kernels_make(p, &ck);
    for (int k = 0; !rc && k < ck.n; k++)
        out->n_kernels += ck.def[k] == k;
    out->kernels = rc ? NULL : ir_calloc((size_t)out->n_kernels + 1, sizeof *out->kernels);
    out->names = rc ? NULL : ir_calloc((size_t)out->n_kernels + 1, sizeof *out->names);
    if (rc || !out->kernels || !out->names) {
        c_kernels_free(&ck);
        return diag_error(d, (Loc){0}, "out of memory generating C");
    }
    emit_c_prelude(p, &out->prelude);
    rc = emit_c_unit(p, &ck, -1, 1, &out->main, d);
    for (int k = 0, i = 0; k < ck.n; k++)
        if (ck.def[k] == k) {
            memcpy(out->names[i], ck.name[k], sizeof out->names[i]);
            emit_definition(&ck, &lang_c_unit, k, &out->kernels[i++]);
        }
    for (int i = 0; i < out->n_kernels; i++)
        out->prelude.oom |= out->kernels[i].oom;
    c_kernels_free(&ck);
    if (!rc && out->prelude.oom)
        rc = diag_error(d, (Loc){0}, "out of memory generating C");
    return rc;
}

void c_pieces_free(CPieces *c) {
    str_free(&c->prelude);
    str_free(&c->main);
    for (int i = 0; c->kernels && i < c->n_kernels; i++)
        str_free(&c->kernels[i]);
    ir_free(c->kernels);
    ir_free(c->names);
}
