/* Lowering: a verified graph becomes a Program of kernels with a memory plan.
 *
 * Values are placed first: inputs in the caller's input buffers, the values named by
 * `output` in the caller's output buffers (a value output twice, or an output that
 * is an input or a weight, gets a copy kernel), params and consts in the weights
 * blob (their data taken from the weights or the initializers now, at compile
 * time). With memory planning, a view that is no output is marked as sharing its
 * input's memory (view_of), so that it needs no kernel; a view of an input, a
 * weight or an output is placed where that is. Then each op node's lowering, found
 * through the op table, appends its kernels, and the memory plan (plan.c) places
 * everything else in the workspace from the kernels' reads and writes. What the
 * lowerings share (new kernels, value names, index arithmetic, float literals) is
 * here too. */
#include "codegen.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static const LowerFn lowerings[OP_COUNT] = {
#define OP(id, name, inputs, attrs, infer, eval, lower, flags) [OP_##id] = lower,
#include "../ir/ops.def"
#undef OP
};

void str_printf(Str *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || s->oom)
        return;
    if (s->len + (size_t)n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 256;
        while (cap < s->len + (size_t)n + 1)
            cap *= 2;
        char *p = ir_realloc(s->s, cap);
        if (!p) {
            s->oom = true;
            return;
        }
        s->s = p;
        s->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(s->s + s->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    s->len += (size_t)n;
}

void str_free(Str *s) {
    ir_free(s->s);
    *s = (Str){0};
}

/* ---- Names and index arithmetic ---- */

/* The bytes generated identifiers are made of: names are data, and a byte of a
 * name that is none of these becomes `_` (text from a model reaches generated
 * source as an identifier only through value_name and kernel_new). */
static bool ident_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* The buffers are scratch, not part of what the program means, so a const Program
 * hands them out too (every Program is allocated, never a const object). */
const char *value_name(const Program *p, int id) {
    Program *mut = (Program *)p;
    char *b = mut->names[mut->next_name++ % 8];
    int n = snprintf(b, sizeof mut->names[0], "v%d_", id);
    for (const char *s = p->g->values[id].name; *s && n < (int)sizeof mut->names[0] - 1; s++, n++)
        b[n] = ident_char(*s) ? *s : '_';
    b[n] = 0;
    return b;
}

void float_literal(double v, char *buf, size_t n) {
    if (isnan(v))
        snprintf(buf, n, "(0.0f / 0.0f)");
    else if (isinf(v))
        snprintf(buf, n, v < 0 ? "(-1.0f / 0.0f)" : "(1.0f / 0.0f)");
    else {
        char t[40];
        snprintf(t, sizeof t, "%.9g", (double)(float)v);
        snprintf(buf, n, "%s%sf", t, strpbrk(t, ".e") ? "" : ".0"); /* `1f` is no C literal */
    }
}

/* ---- Kernels ---- */

Kernel *kernel_new(Program *p, const Node *n, KernelKind kind, const char *what) {
    if (p->n_kernels == p->cap_kernels) {
        int cap = p->cap_kernels ? 2 * p->cap_kernels : 64;
        Kernel *k = ir_realloc(p->kernels, sizeof *k * (size_t)cap);
        if (!k)
            return NULL;
        p->kernels = k;
        p->cap_kernels = cap;
    }
    Kernel *k = &p->kernels[p->n_kernels];
    *k = (Kernel){.kind = kind, .node = n, .grain = 1};
    const char *opname = op_table[n->op].name;
    Str name = {0}, comment = {0};
    str_printf(&name, "%sk%d_%s%s%s", p->kernel_prefix, p->n_kernels, opname, what ? "_" : "",
               what ? what : "");
    str_printf(&comment, "%s %s%s%s%s", opname, p->g->values[n->out[0]].name, what ? " (" : "",
               what ? what : "", what ? ")" : "");
    k->reads = ir_calloc((size_t)n->n_in + 1, sizeof(int));
    k->writes = ir_calloc((size_t)n->n_out + 1, sizeof(int));
    k->ir = arena_alloc(&p->arena, sizeof *k->ir);
    if (name.oom || comment.oom || !k->reads || !k->writes || !k->ir) {
        str_free(&name), str_free(&comment), ir_free(k->reads), ir_free(k->writes);
        return NULL;
    }
    for (char *c = name.s; *c; c++) /* an identifier, whatever a lowering passes as `what` */
        if (!ident_char(*c))
            *c = '_';
    k->name = name.s;
    k->comment = comment.s;
    kb_init(&k->b, &p->arena, k->ir);
    k->b.graph = p->g;
    if (kind == K_LOOP) /* [0, count): kernel_finish sets the bound once count is known */
        k->iter = kb_for(&k->b, "i", KT_I64, k_int(&k->b, 0), NULL, NULL, K_PARALLEL);
    p->n_kernels++;
    return k;
}

void gemm_follows(const Program *p, Kernel *k, const Type *t, bool by_batch) {
    int64_t along = by_batch ? k->batch : k->m;
    if (!t->sym || along % p->g->sym.bound)
        return;
    k->sym_rows = along / p->g->sym.bound;
    k->sym_by_batch = by_batch;
}

Kernel *kernel_loop(Program *p, const Node *n, const char *what, int64_t count, int64_t grain, Diag *d) {
    Kernel *k = kernel_new(p, n, K_LOOP, what);
    if (!k) {
        diag_error(d, n->loc, "out of memory");
        return NULL;
    }
    k->count = count;
    k->grain = grain;
    for (int i = 0; i < n->n_in; i++)
        if (n->in[i] >= 0)
            kernel_reads(k, n->in[i]);
    kernel_writes(k, n->out[0]);
    return k;
}

void kernel_follows(const Program *p, Kernel *k, const Type *t, int64_t rows, int64_t tile, int64_t width) {
    if (!t->sym || rows % p->g->sym.bound)
        return; /* rows that do not follow the dim (a block over all of t) */
    k->sym_rows = rows / p->g->sym.bound;
    k->sym_tile = tile;
    k->sym_width = width;
}

KilnWindow window_block(const View *x, const int64_t *kernel, const int64_t *strides, const int64_t *pads,
                        const int64_t *dilations, int64_t wo) {
    return (KilnWindow){.c = x->c,
                        .h = x->sp[0],
                        .w = x->sp[1],
                        .x_row = x->ss[0],
                        .x_col = x->ss[1],
                        .kh = kernel[0],
                        .kw = kernel[1],
                        .stride = {strides[0], strides[1]},
                        .pad = {pads[0], pads[1]},
                        .dilation = {dilations[0], dilations[1]},
                        .wo = wo};
}

int64_t lower_size(const Node *n, const char *what, int count, const int64_t *f, Diag *d) {
    int64_t r = 1, room;
    bool ok = true;
    for (int i = 0; i < count && ok; i++)
        ok = ck_mul(r, f[i], &r);
    if (ok && ck_add(r, 64, &room))
        return r;
    return diag_error(d, n->loc, "%s: the %s is too large to address", op_table[n->op].name, what);
}

int64_t lower_flops(int count, const int64_t *f) {
    int64_t r = 1;
    for (int i = 0; i < count; i++)
        if (!ck_mul(r, f[i], &r))
            return INT64_MAX;
    return r;
}

Kernel *kernel_gemm(Program *p, const Node *n, const char *what, int64_t batch, int64_t m, int64_t cols,
                    int64_t depth, Diag *d) {
    Kernel *k = kernel_loop(p, n, what, 0, 1, d);
    if (!k)
        return NULL;
    k->kind = K_GEMM;
    k->b = (KBuilder){0}; /* the schedule builds the body; the lowering, three blocks */
    *k->ir = (KBody){0};
    kb_init(&k->b, &p->arena, k->ir);
    k->b.graph = p->g;
    KBuilder *b = &k->b;
    k->gemm.bi = kb_new_var(b, "bi", KT_I64);
    k->gemm.r = kb_new_var(b, "r", KT_I64);
    k->gemm.q = kb_new_var(b, "q", KT_I64);
    k->gemm.kk = kb_new_var(b, "kk", KT_I64);
    k->gemm.v = kb_new_var(b, "v", KT_F32);
    k->gemm.acc = kb_new_var(b, "acc", KT_F32);
    k->batch = batch;
    k->m = m;
    k->n = cols;
    k->depth = depth;
    k->flops = lower_flops(5, (int64_t[]){2, batch, m, cols, depth});
    return k;
}

void kernel_annotate(Kernel *k, const char *text) {
    Str comment = {0};
    str_printf(&comment, "%s: %s", k->comment, text);
    if (comment.oom) {
        str_free(&comment);
        return;
    }
    ir_free(k->comment);
    k->comment = comment.s;
}

void kernel_reads(Kernel *k, int value) {
    k->reads[k->n_reads++] = value;
}

void kernel_unread(Kernel *k, int value) {
    for (int i = 0; i < k->n_reads; i++)
        if (k->reads[i] == value) {
            memmove(k->reads + i, k->reads + i + 1, sizeof *k->reads * (size_t)(k->n_reads - i - 1));
            k->n_reads--;
            return;
        }
}

int kernel_room(Kernel *k, int reads, int writes) {
    int *r = ir_realloc(k->reads, sizeof(int) * (size_t)(reads + 1)),
        *w = r ? ir_realloc(k->writes, sizeof(int) * (size_t)(writes + 1)) : NULL;
    k->reads = r ? r : k->reads;
    k->writes = w ? w : k->writes;
    return r && w ? 0 : -1;
}
int program_table(Program *p, Kernel *k, const void *data, int64_t bytes, Diag *d) {
    int64_t at = (p->weights_bytes + 63) & ~(int64_t)63, end;
    if (!ck_add(at, bytes, &end) || !ck_add(end, 64, &end))
        return diag_error(d, k->node->loc, "a table of %lld bytes does not fit beside the weights",
                          (long long)bytes);
    unsigned char *w = ir_realloc(p->weights, (size_t)(at + bytes) + 1);
    if (!w)
        return diag_error(d, k->node->loc, "out of memory for a table of %lld bytes", (long long)bytes);
    memset(w + p->weights_bytes, 0, (size_t)(at - p->weights_bytes));
    memcpy(w + at, data, (size_t)bytes);
    p->weights = w;
    p->weights_bytes = at + bytes;
    k->table = at;
    k->table_bytes = bytes;
    return 0;
}

KExpr *let_index(KBuilder *b, const char *name, KExpr *e) {
    return e->kind == KE_INT || e->kind == KE_VAR ? e : k_var(b, kb_let(b, name, KT_I64, e));
}

int program_fault(Program *p, const Node *n, const char *what, Diag *d) {
    char where[512] = "";
    if (n->loc.file)
        snprintf(where, sizeof where, " (%s:%d:%d)", n->loc.file->name, n->loc.line, n->loc.col);
    Str msg = {0};
    str_printf(&msg, "%s '%s'%s: %s", op_table[n->op].name, p->g->values[n->out[0]].name, where, what);
    const char **faults = ir_realloc(p->faults, sizeof *faults * (size_t)(p->n_faults + 1));
    if (msg.oom || !faults) {
        str_free(&msg);
        if (faults)
            p->faults = faults;
        return diag_error(d, n->loc, "out of memory");
    }
    p->faults = faults;
    p->faults[p->n_faults++] = msg.s;
    return p->n_faults;
}

void kernel_writes(Kernel *k, int value) {
    k->writes[k->n_writes++] = value;
}

/* ---- The memory plan ---- */

static int64_t value_bytes(const Program *p, int v) {
    const Type *t = &p->g->values[v].type;
    return type_numel(t) * dtype_size(t->dtype);
}

/* Params and consts into the blob, in node order: first the updated params (the
 * state's initial value), then the others. */
static int place_weights(Program *p, const TensorList *weights, Diag *d) {
    Graph *g = p->g;
    int64_t size = 0;
    for (int state = 1; state >= 0; state--) {
        for (int i = 0; i < g->n_nodes; i++) {
            const Node *n = g->nodes[i];
            bool updated = n->op == OP_PARAM && graph_update_of(g, n->out[0]);
            if ((n->op == OP_PARAM || n->op == OP_CONST) && updated == state) {
                p->buf[n->out[0]] = (Buffer){state ? BUF_STATE : BUF_WEIGHT, size};
                if (!ck_add(size, value_bytes(p, n->out[0]), &size) || !ck_add(size, 63, &size))
                    return diag_error(d, n->loc, "the weights are too large to address");
                size &= ~(int64_t)63;
            }
        }
        if (state)
            p->state_bytes = size;
    }
    p->weights_bytes = size;
    p->weights = ir_calloc((size_t)size + 1, 1);
    if (!p->weights)
        return diag_error(d, (Loc){0}, "out of memory for %lld bytes of weights", (long long)size);
    for (int i = 0; i < g->n_nodes; i++) {
        const Node *n = g->nodes[i];
        Tensor *t = NULL;
        if (n->op == OP_CONST)
            t = tensor_clone(n->data);
        else if (n->op == OP_PARAM && param_value(g, n, weights, &t, d))
            return -1;
        if (n->op != OP_PARAM && n->op != OP_CONST)
            continue;
        if (!t)
            return diag_error(d, n->loc, "out of memory");
        memcpy(p->weights + p->buf[n->out[0]].offset, t->bytes, (size_t)value_bytes(p, n->out[0]));
        tensor_free(t);
    }
    return 0;
}

/* A kernel of node n's copying value src into `dst` (a value id, or -1 - k for the
 * caller's k-th output), element by element. */
static int copy_kernel(Program *p, const Node *n, const char *what, int src, int dst, Diag *d) {
    Kernel *k = kernel_new(p, n, K_LOOP, what);
    if (!k)
        return diag_error(d, (Loc){0}, "out of memory");
    k->count = type_numel(&p->g->values[src].type);
    k->grain = 16384;
    kernel_follows(p, k, &p->g->values[src].type, k->count, 1, 1);
    kernel_writes(k, dst);
    kernel_reads(k, src);
    KBuilder *b = &k->b;
    KExpr *i = k_var(b, k->iter);
    kb_store(b, kb_value(b, dst, true), i, k_load(b, kb_value(b, src, false), i));
    return 0;
}

/* A value output a second time, or output while it is an input or a weight, is
 * copied into its output buffer by a kernel of its own. */
static int copy_to_output(Program *p, int v, int slot, Diag *d) {
    return copy_kernel(p, p->g->nodes[p->g->values[v].node], "copy_to_output", v, -1 - slot, d);
}

/* The value whose memory v's data is in: v, or the value its views lead to. */
static int storage_of(const Program *p, int v) {
    while (p->view_of && p->view_of[v] >= 0)
        v = p->view_of[v];
    return v;
}

/* Whether update u's value can be computed straight into its param's state: with
 * the memory plan on, when the value is a workspace value of its own (no view) and
 * every kernel reading the param's old value (through any view) runs before the
 * first kernel writing the new one, or is that kernel itself, writing elementwise
 * in place (it reads each old element only where it writes the new one). */
static bool update_in_place(const Program *p, const Update *u) {
    int v = u->value;
    if (!p->view_of || p->buf[v].kind != BUF_NONE || p->view_of[v] >= 0)
        return false;
    int last_read = -1, first_write = -1, writers = 0;
    for (int k = 0; k < p->n_kernels; k++) {
        const Kernel *kn = &p->kernels[k];
        for (int r = 0; r < kn->n_reads; r++)
            if (kn->reads[r] >= 0 && storage_of(p, kn->reads[r]) == u->param)
                last_read = k;
        for (int w = 0; w < kn->n_writes; w++)
            if (kn->writes[w] == v) {
                first_write = first_write < 0 ? k : first_write;
                writers++;
            }
    }
    if (first_write < 0 || last_read > first_write)
        return false;
    if (last_read < first_write)
        return true;
    /* in place reads values of the result's type only where it writes: a view of
       the param under another type is read elsewhere */
    const Kernel *kn = &p->kernels[first_write];
    for (int r = 0; r < kn->n_reads; r++)
        if (kn->reads[r] >= 0 && storage_of(p, kn->reads[r]) == u->param &&
            !type_equal(&p->g->values[kn->reads[r]].type, &p->g->values[v].type))
            return false;
    return writers == 1 && kn->in_place;
}

/* A kernel copying update u's value into its param's state, at the end of a run. */
static int copy_update(Program *p, const Update *u, Diag *d) {
    return copy_kernel(p, p->g->nodes[p->g->values[u->param].node], "update", u->value, u->param, d);
}

/* Applies the updates after the run's kernels. An update's value is either placed
 * in its param's state (update_in_place) or copied there by a kernel at the end.
 * All updates take effect together, so a value that is (a view of) another updated
 * param, whose old state it means, is first copied aside, by one kernel that then
 * applies those updates from its scratch; the params such values read are not
 * updated in place, and the other copies come after it. */
static int lower_updates(Program *p, Diag *d) {
    const Graph *g = p->g;
    int n = g->n_updates, rc = 0, n_staged = 0;
    bool *staged = ir_calloc((size_t)n + 1, sizeof *staged), *done = ir_calloc((size_t)n + 1, sizeof *done);
    bool *read_old = ir_calloc((size_t)g->n_values + 1, sizeof *read_old); /* per param */
    if (!staged || !done || !read_old)
        rc = diag_error(d, (Loc){0}, "out of memory");
    for (int k = 0; !rc && k < n; k++) {
        int s = storage_of(p, g->updates[k].value);
        done[k] = s == g->updates[k].param; /* the param itself: nothing changes */
        staged[k] = !done[k] && p->buf[s].kind == BUF_STATE;
        read_old[s] |= staged[k];
        n_staged += staged[k];
    }
    for (int k = 0; !rc && k < n; k++) {
        const Update *u = &g->updates[k];
        if (done[k] || staged[k] || read_old[u->param] || !update_in_place(p, u))
            continue;
        for (int v = 0; v < g->n_values; v++)
            if (storage_of(p, v) == u->value)
                p->buf[v] = p->buf[u->param];
        done[k] = true;
    }
    Kernel *stage = NULL;
    if (!rc && n_staged) {
        const Update *first = NULL;
        for (int k = 0; k < n && !first; k++)
            first = staged[k] ? &g->updates[k] : NULL;
        stage = kernel_new(p, g->nodes[g->values[first->param].node], K_CALL, "staged_updates");
        if (!stage || kernel_room(stage, n_staged, n_staged))
            rc = diag_error(d, (Loc){0}, "out of memory");
    }
    for (int pass = 0; !rc && stage && pass < 2; pass++) { /* copy the values aside, then apply them */
        int64_t at = 0;
        for (int k = 0; k < n; k++) {
            const Update *u = &g->updates[k];
            if (!staged[k])
                continue;
            int64_t count = type_numel(&g->values[u->param].type);
            if (pass == 0)
                kernel_reads(stage, u->value);
            else
                kernel_writes(stage, u->param);
            KBuilder *b = &stage->b;
            int scratch = kb_scratch(b), value = kb_value(b, pass == 0 ? u->value : u->param, pass == 1);
            KExpr *j = k_var(b, kb_for(b, "j", KT_I64, k_int(b, 0), k_int(b, count), NULL, 0));
            KExpr *aside = k_add(b, k_int(b, at), j);
            if (pass == 0)
                kb_store(b, scratch, aside, k_load(b, value, j));
            else
                kb_store(b, value, j, k_load(b, scratch, aside));
            kb_end(b);
            at += count;
        }
        stage->scratch_bytes = at * 4;
    }
    for (int k = 0; !rc && k < n; k++)
        if (!done[k] && !staged[k])
            rc = copy_update(p, &g->updates[k], d);
    ir_free(staged), ir_free(done), ir_free(read_old);
    return rc;
}

static bool output_slot_taken(const Program *p, int v) {
    return p->buf[v].kind != BUF_NONE;
}

/* Views that are no output share their input's memory: a view of a value placed
 * already (an input, a weight, an output, or a view of one) is placed there now, a
 * view of a workspace value joins its buffer in the plan. */
static int mark_views(Program *p) {
    const Graph *g = p->g;
    if (!(p->view_of = ir_calloc((size_t)g->n_values + 1, sizeof *p->view_of)))
        return -1;
    for (int v = 0; v < g->n_values; v++)
        p->view_of[v] = -1;
    for (int i = 0; i < g->n_nodes; i++) { /* in order: a view's input is resolved first */
        const Node *n = g->nodes[i];
        if (!op_has(n->op, F_VIEW) || n->n_in < 1 || n->in[0] < 0 || p->buf[n->out[0]].kind != BUF_NONE)
            continue;
        int x = n->in[0], y = n->out[0];
        p->view_of[y] = x;
        if (p->buf[x].kind != BUF_NONE)
            p->buf[y] = p->buf[x];
    }
    return 0;
}

/* Closes a lowered kernel's IR: its loop, its GEMM schedule; then drops dead lets
 * and verifies it. An ill-formed body is kiln's own bug, reported as internal. */
static int kernel_finish(Program *p, Kernel *k, Diag *d) {
    KBuilder *b = &k->b;
    if (k->kind == K_GEMM)
        gemm_schedule(p, k);
    else if (k->kind == K_LOOP) {
        kb_end(b);
        if (k->ir->body && k->ir->body->kind == KS_FOR)
            k->ir->body->hi = k_int(b, k->count);
        int64_t bound = p->g->sym.bound;
        if (k->sym_rows && (k->sym_rows * bound + k->sym_tile - 1) / k->sym_tile * k->sym_width != k->count)
            return diag_internal(
                d, k->node->loc,
                "kernel %s: its rows (%lld a unit, %lld per %lld iterations) are not its %lld iterations",
                k->name, (long long)k->sym_rows, (long long)k->sym_tile, (long long)k->sym_width,
                (long long)k->count);
    }
    if (b->oom)
        return diag_error(d, k->node->loc, "out of memory");
    char why[160];
    if (b->misuse || b->depth != 0)
        return diag_internal(d, k->node->loc, "kernel %s: its IR's blocks are not closed", k->name);
    kir_simplify(k->ir);
    int rc = kir_verify(k->ir, p->target == TARGET_CUDA ? KIR_CUDA : KIR_C, why, sizeof why);
    if (rc == KIR_NO_MEMORY)
        return diag_error(d, k->node->loc, "out of memory");
    if (rc)
        return diag_internal(d, k->node->loc, "kernel %s: %s", k->name, why);
    return 0;
}

/* A run of the old weights blob that a kernel reads, and where it moves to; `table`
 * is the kernel whose table it is, else -1. */
typedef struct {
    int64_t from, to, at;
    int table;
} Run;

static int by_start(const void *a, const void *b) {
    const Run *x = a, *y = b;
    return (x->from > y->from) - (x->from < y->from);
}

/* The new offset of old offset `at` when one of the n runs (sorted, disjoint) holds
 * it, else 0 (for a value that nothing reads). */
static int64_t moved(const Run *runs, int n, int64_t at) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (runs[mid].from <= at)
            lo = mid;
        else
            hi = mid - 1;
    }
    bool inside = n > 0 && runs[lo].from <= at && (at < runs[lo].to || at == runs[lo].from);
    return inside ? at - runs[lo].from + runs[lo].at : 0;
}

/* The runs of p's weights blob that its kernels read, one for each weight value a
 * kernel reads and each kernel's table, in no order and possibly overlapping; their
 * count, or -1 out of memory. */
static int read_runs(const Program *p, Run **out) {
    int n = 0;
    Run *runs = ir_calloc((size_t)(p->g->n_values + p->n_kernels) + 1, sizeof *runs);
    if (!runs)
        return -1;
    for (int k = 0; k < p->n_kernels; k++) {
        const Kernel *kn = &p->kernels[k];
        for (int r = 0; r < kn->n_reads; r++) {
            int v = kn->reads[r];
            if (v >= 0 && p->buf[v].kind == BUF_WEIGHT && kir_uses_value(kn->ir, v))
                runs[n++] = (Run){p->buf[v].offset, p->buf[v].offset + value_bytes(p, v), 0, -1};
        }
        if (kn->table_bytes)
            runs[n++] = (Run){kn->table, kn->table + kn->table_bytes, 0, k};
    }
    *out = runs;
    return n;
}

/* Sorts the n runs and merges those that overlap or touch, then places them one
 * after another from byte `size` on, each at its old offset modulo 64; the count of
 * merged runs, and the end of the last in *end. */
static int place_runs(Run *runs, int n, int64_t size, int64_t *end) {
    qsort(runs, (size_t)n, sizeof *runs, by_start);
    int merged = 0;
    for (int i = 0; i < n; i++) {
        if (merged && runs[i].from <= runs[merged - 1].to)
            runs[merged - 1].to = runs[i].to > runs[merged - 1].to ? runs[i].to : runs[merged - 1].to;
        else
            runs[merged++] = runs[i];
    }
    for (int i = 0; i < merged; i++) {
        runs[i].at = ((size + 63) & ~(int64_t)63) + runs[i].from % 64;
        size = runs[i].at + runs[i].to - runs[i].from;
    }
    *end = size;
    return merged;
}

/* Drops from the weights blob what no kernel reads: a param whose every reader
 * packed it into its own table at compile time (ResNet-18's .so carried its conv
 * weights twice). The state stays first, as it is; the runs that kernels read (a
 * value, a view into one, a table) move down in order, each keeping its offset
 * modulo 64. */
static int drop_unread_weights(Program *p, Diag *d) {
    Run *runs;
    int n = read_runs(p, &runs);
    if (n < 0)
        return diag_error(d, (Loc){0}, "out of memory");
    int64_t size;
    int merged = place_runs(runs, n, p->state_bytes, &size);
    unsigned char *w = ir_calloc((size_t)size + 1, 1);
    if (!w) {
        ir_free(runs);
        return diag_error(d, (Loc){0}, "out of memory for %lld bytes of weights", (long long)size);
    }
    memcpy(w, p->weights, (size_t)p->state_bytes);
    for (int i = 0; i < merged; i++)
        memcpy(w + runs[i].at, p->weights + runs[i].from, (size_t)(runs[i].to - runs[i].from));
    for (int v = 0; v < p->g->n_values; v++)
        if (p->buf[v].kind == BUF_WEIGHT)
            p->buf[v].offset = moved(runs, merged, p->buf[v].offset);
    for (int k = 0; k < p->n_kernels; k++)
        if (p->kernels[k].table_bytes)
            p->kernels[k].table = moved(runs, merged, p->kernels[k].table);
    ir_free(p->weights);
    p->weights = w;
    p->weights_bytes = size;
    ir_free(runs);
    return 0;
}

static Program *lower_program(Graph *g, const TensorList *weights, const LowerOptions *o, const char *prefix,
                              Diag *d) {
    Program *p = ir_calloc(1, sizeof *p);
    if (!p || !(p->buf = ir_calloc((size_t)g->n_values + 1, sizeof *p->buf)) ||
        !(p->inputs = ir_calloc((size_t)g->n_values + 1, sizeof *p->inputs)) ||
        !(p->uses = ir_calloc((size_t)g->n_values + 1, sizeof *p->uses))) {
        program_free(p);
        diag_error(d, (Loc){0}, "out of memory");
        return NULL;
    }
    p->g = g;
    p->kernel_prefix = prefix;
    graph_count_uses(g, p->uses);
    p->target = o->target;
#ifdef KILN_HAVE_OPENBLAS
    p->blas = o->target == TARGET_C && o->blas;
#endif
    p->vector_floats = o->target == TARGET_C ? cc_vector_floats(o->cpu) : 0;
    for (int v = 0; v < g->n_values; v++)
        p->buf[v].kind = BUF_NONE;
    p->n_inputs = graph_inputs(g, p->inputs, g->n_values);
    for (int i = 0; i < p->n_inputs; i++)
        p->buf[p->inputs[i]] = (Buffer){BUF_INPUT, i};
    if (place_weights(p, weights, d))
        goto fail;
    int copies[4096], n_copies = 0;
    for (int k = 0; k < g->n_outputs; k++) {
        int v = g->outputs[k];
        if (output_slot_taken(p, v)) {
            if (n_copies == (int)(sizeof copies / sizeof *copies)) {
                diag_error(d, (Loc){0}, "too many outputs that need a copy");
                goto fail;
            }
            copies[n_copies++] = k;
        } else {
            p->buf[v] = (Buffer){BUF_OUTPUT, k};
        }
    }
    if (o->memplan && mark_views(p))
        goto oom;
    for (int i = 0; i < g->n_nodes; i++) {
        const Node *n = g->nodes[i];
        if (op_is_decl(n->op))
            continue;
        LowerFn lower = lowerings[n->op];
        if (!lower) {
            diag_error(d, n->loc, "%s cannot be compiled yet; use --target interp", op_table[n->op].name);
            goto fail;
        }
        if (lower(p, n, d))
            goto fail;
    }
    for (int c = 0; c < n_copies; c++)
        if (copy_to_output(p, g->outputs[copies[c]], copies[c], d))
            goto fail;
    if (lower_updates(p, d))
        goto fail;
    for (int k = 0; k < p->n_kernels; k++)
        if (kernel_finish(p, &p->kernels[k], d))
            goto fail;
    if (drop_unread_weights(p, d) || plan_memory(p, o->memplan, d))
        goto fail;
    return p;
oom:
    diag_error(d, (Loc){0}, "out of memory");
fail:
    program_free(p);
    return NULL;
}

/* Whether two programs raise the same faults by the same numbers. */
static bool same_faults(const Program *a, const Program *b) {
    if (a->n_faults != b->n_faults)
        return false;
    for (int f = 0; f < a->n_faults; f++)
        if (strcmp(a->faults[f], b->faults[f]) != 0)
            return false;
    return true;
}

/* Where in p's blob its n runs (read_runs, with their packed panels' runs after
 * them, each `table` the kernel's) hold the bytes [from, to) of blob `w`, at the
 * same offset modulo 64; -1 where none does. */
static int64_t found_in(const Program *p, const Run *theirs, int n, const unsigned char *w, int64_t from,
                        int64_t to) {
    for (int j = 0; j < n; j++)
        if (theirs[j].to - theirs[j].from == to - from && theirs[j].from % 64 == from % 64 &&
            memcmp(p->weights + theirs[j].from, w + from, (size_t)(to - from)) == 0)
            return theirs[j].from;
    return -1;
}

/* Where bytes [from, to) of one's blob lie in the blob after share_weights: in a run
 * p held the same bytes in (found, whose `at` is where), or in one of the runs
 * appended (kept); 0 for bytes no kernel reads. */
static int64_t shared_at(const Run *found, int n_found, const Run *kept, int n_kept, int64_t from,
                         int64_t to) {
    for (int i = 0; i < n_found; i++)
        if (found[i].from <= from && to <= found[i].to)
            return found[i].at + from - found[i].from;
    for (int i = 0; i < n_kept; i++)
        if (kept[i].from <= from && to <= kept[i].to)
            return kept[i].at + from - kept[i].from;
    return 0;
}

/* Makes one, the model at size 1, read p's weights blob. A run one reads whose bytes
 * p's kernels read too (a param, a table), at the same offset modulo 64, is read
 * from there, and so are the packed panels of a GEMM's B that p packed alike (its
 * table's block then points at them); the rest is appended to p's blob. So a
 * symbolic model carries its weights, and the panels packed the same way at both
 * sizes, once. The graph's types are one's, the size 1's; theirs and m are p's
 * read_runs, with room for p's panels. */
static int share_weights(Program *p, Program *one, Run *theirs, int m, Diag *d) {
    for (int k = 0; k < p->n_kernels; k++) {
        const Kernel *kn = &p->kernels[k];
        if (kn->panels_from)
            theirs[m++] = (Run){kn->table + kn->panels_from, kn->table + kn->table_bytes, 0, k};
    }
    Run *mine = NULL, *kept = NULL;
    int n = read_runs(one, &mine), n_found = 0, n_kept = 0;
    if (n >= 0)
        kept = ir_calloc((size_t)n + 1, sizeof *kept);
    if (!kept) {
        ir_free(mine);
        return diag_error(d, (Loc){0}, "out of memory");
    }
    /* the runs found go first in mine (at: where p has them), the others into kept,
       and a table's panels found cut its run short (at: where p has them) */
    int64_t *panels = ir_calloc((size_t)one->n_kernels + 1, sizeof *panels);
    for (int i = 0; panels && i < n; i++) {
        Run r = mine[i];
        int64_t at = found_in(p, theirs, m, one->weights, r.from, r.to);
        const Kernel *kn = r.table >= 0 ? &one->kernels[r.table] : NULL;
        if (at >= 0) {
            mine[n_found++] = (Run){r.from, r.to, at, r.table};
            continue;
        }
        if (kn && kn->panels_from)
            at = found_in(p, theirs, m, one->weights, r.from + kn->panels_from, r.to);
        if (at >= 0) {
            panels[r.table] = at;
            r.to = r.from + kn->panels_from;
        }
        kept[n_kept++] = r;
    }
    int64_t size;
    n_kept = place_runs(kept, n_kept, p->weights_bytes, &size);
    unsigned char *blob = panels ? ir_realloc(p->weights, (size_t)size + 1) : NULL;
    if (!blob) {
        ir_free(mine), ir_free(kept), ir_free(panels);
        return diag_error(d, (Loc){0}, "out of memory for %lld bytes of weights", (long long)size);
    }
    memset(blob + p->weights_bytes, 0, (size_t)(size - p->weights_bytes));
    for (int i = 0; i < n_kept; i++)
        memcpy(blob + kept[i].at, one->weights + kept[i].from, (size_t)(kept[i].to - kept[i].from));
    for (int v = 0; v < one->g->n_values; v++)
        if (one->buf[v].kind == BUF_WEIGHT)
            one->buf[v].offset = shared_at(mine, n_found, kept, n_kept, one->buf[v].offset,
                                           one->buf[v].offset + value_bytes(one, v));
    for (int k = 0; k < one->n_kernels; k++) {
        Kernel *kn = &one->kernels[k];
        if (!kn->table_bytes)
            continue;
        if (panels[k])
            kn->table_bytes = kn->panels_from;
        kn->table = shared_at(mine, n_found, kept, n_kept, kn->table, kn->table + kn->table_bytes);
        if (panels[k])
            packed_gemm_repoint(blob, kn->table, kn->panels_from, panels[k]);
    }
    p->weights = blob;
    p->weights_bytes = size;
    ir_free(one->weights);
    one->weights = NULL;
    one->weights_bytes = 0;
    ir_free(mine), ir_free(kept), ir_free(panels);
    return 0;
}

/* p->at_one: p's graph lowered with its symbolic dim at 1 (each type at that size,
 * the dim gone for the while), reading p's weights blob (share_weights). A
 * specialization whose faults differ is dropped (the model's messages are p's). -1
 * after a diagnostic. */
static int lower_at_one(Program *p, const TensorList *weights, const LowerOptions *o, Diag *d) {
    Graph *g = p->g;
    Run *theirs = NULL, *room;
    int m = read_runs(p, &theirs); /* with room for p's panels: a table's run at most */
    room = m < 0 ? NULL : ir_realloc(theirs, sizeof *theirs * ((size_t)(m + p->n_kernels) + 1));
    Type *types = room ? ir_malloc(sizeof *types * ((size_t)g->n_values + 1)) : NULL;
    if (!types) {
        ir_free(room ? room : theirs);
        return diag_error(d, (Loc){0}, "out of memory");
    }
    theirs = room;
    SymDim sym = g->sym;
    for (int v = 0; v < g->n_values; v++) {
        types[v] = g->values[v].type;
        g->values[v].type = type_at(&types[v], 1);
    }
    g->sym = (SymDim){0};
    Program *one = lower_program(g, weights, o, "one_", d);
    int rc = !one ? -1 : !same_faults(p, one) ? 1 : share_weights(p, one, theirs, m, d);
    g->sym = sym;
    for (int v = 0; v < g->n_values; v++)
        g->values[v].type = types[v];
    ir_free(types);
    ir_free(theirs);
    if (rc) {
        program_free(one);
        return rc < 0 ? -1 : 0;
    }
    p->at_one = one;
    return 0;
}

/* The workspace from which a static batch runs an item at a time: a batch's
 * activations this large leave the caches between one layer and the next, where one
 * item's stay. At a batch of 8, ResNet-50 (64 MiB, against 8 an item) ran 10% faster
 * an item at a time on one core of a Zen 5, EfficientNet-B0 (25 MiB) 5%; at 2
 * threads on a Zen 4, ResNet-50 3% faster, EfficientNet-B0 as fast, and
 * MobileNetV2 (18 MiB), reading all its weights once an item, 4.5% slower. */
#define SPLIT_WORKSPACE (24 << 20)

/* Whether n reshapes x of first dim `batch` to a shape of first dim `batch` too:
 * item by item, which it does at one item with 1 there. */
static bool batch_reshape(const Graph *g, const Node *n, int64_t batch) {
    if (n->op != OP_RESHAPE)
        return false;
    const Attr *a = node_attr(n, ATTR_SHAPE);
    const Type *x = &g->values[n->in[0]].type, *y = &g->values[n->out[0]].type;
    return a->n > 0 && a->ints[0] == batch && x->rank > 0 && x->dims[0] == batch && y->dims[0] == batch;
}

/* p's graph at one item, where it is a static batch whose items never meet and
 * whose workspace is large enough that an item at a time pays (SPLIT_WORKSPACE):
 * every input's first dim the same n above 1, every node keeping its items apart
 * and every output having them, as with a symbolic dim of bound n (ir/symbolic.c).
 * Its split is n, and it reads weights of its own. Sets *rc -1 after a diagnostic;
 * NULL (and *rc 0) where p stays. */
static Program *lower_split(Program *p, const TensorList *weights, const LowerOptions *o, int *rc, Diag *d) {
    Graph *g = p->g;
    int64_t n = 0;
    *rc = 0;
    for (int i = 0; i < p->n_inputs; i++) {
        const Type *t = &g->values[p->inputs[i]].type;
        if (t->rank < 1 || t->dims[0] < 2 || (n && t->dims[0] != n))
            return NULL;
        n = t->dims[0];
    }
    if (!n || p->workspace_bytes < SPLIT_WORKSPACE)
        return NULL;
    Type *types = ir_malloc(sizeof *types * (size_t)g->n_values);
    bool *reshaped = ir_calloc((size_t)g->n_nodes + 1, sizeof *reshaped);
    FILE *sink = types && reshaped ? fopen("/dev/null", "w") : NULL;
    if (!sink) { /* not split: slower, as right */
        ir_free(types), ir_free(reshaped);
        return NULL;
    }
    for (int v = 0; v < g->n_values; v++)
        types[v] = g->values[v].type;
    for (int i = 0; i < p->n_inputs; i++) {
        g->values[p->inputs[i]].type.sym = "batch";
        g->values[p->inputs[i]].type.sym_mult = 1;
    }
    g->sym = (SymDim){"batch", n, {0}};
    /* a reshape whose shape names the batch (the layout pass's, from the static
       types; an export's [n, -1]) names one item for the while */
    for (int i = 0; i < g->n_nodes; i++)
        if ((reshaped[i] = batch_reshape(g, g->nodes[i], n)))
            node_attr(g->nodes[i], ATTR_SHAPE)->ints[0] = 1;
    Diag quiet;
    diag_init(&quiet, sink);
    bool apart = true;
    for (int i = 0; i < g->n_nodes && apart; i++)
        apart = infer_symbolic(g, g->nodes[i], &quiet) == 0;
    for (int k = 0; k < g->n_outputs && apart; k++)
        apart = g->values[g->outputs[k]].type.sym != NULL;
    fclose(sink);
    g->sym = (SymDim){0};
    Program *one = NULL;
    if (apart) {
        for (int v = 0; v < g->n_values; v++)
            g->values[v].type = type_at(&g->values[v].type, 1);
        if (!(one = lower_program(g, weights, o, "", d)))
            *rc = -1;
        else
            one->split = n;
    }
    for (int i = 0; i < g->n_nodes; i++)
        if (reshaped[i])
            node_attr(g->nodes[i], ATTR_SHAPE)->ints[0] = n;
    for (int v = 0; v < g->n_values; v++)
        g->values[v].type = types[v];
    ir_free(types), ir_free(reshaped);
    return one;
}

Program *program_lower(Graph *g, const TensorList *weights, const LowerOptions *o, Diag *d) {
    Program *p = lower_program(g, weights, o, "", d), *one = NULL;
    int rc = 0;
    if (p && o->target == TARGET_C && g->n_updates == 0) {
        if (g->sym.name)
            rc = lower_at_one(p, weights, o, d);
        else if ((one = lower_split(p, weights, o, &rc, d)) != NULL) {
            program_free(p);
            p = one;
        }
    }
    if (rc) {
        program_free(p);
        return NULL;
    }
    return p;
}

void program_free(Program *p) {
    if (!p)
        return;
    for (int f = 0; f < p->n_faults; f++)
        ir_free((char *)p->faults[f]);
    ir_free(p->faults);
    for (int k = 0; k < p->n_kernels; k++) {
        ir_free(p->kernels[k].name);
        ir_free(p->kernels[k].comment);
        ir_free(p->kernels[k].reads);
        ir_free(p->kernels[k].writes);
    }
    arena_free(&p->arena);
    ir_free(p->kernels);
    ir_free(p->plan.bufs);
    ir_free(p->plan.buffer);
    ir_free(p->plan.share);
    ir_free(p->plan.from);
    ir_free(p->view_of);
    ir_free(p->buf);
    ir_free(p->inputs);
    ir_free(p->uses);
    ir_free(p->weights);
    program_free(p->at_one);
    ir_free(p);
}
