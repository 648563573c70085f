/* libFuzzer target: shape inference, the interpreter and lowering on one op with
 * extreme attribute values.
 *
 * The bytes are decoded into a one-op model in the text language: an op of the op
 * table (ir/ops.def), declared inputs of small, empty-ish or huge types, and values
 * for its attributes drawn mostly from the edges of int64 (0, 1, -1, INT64_MAX,
 * INT64_MIN, 2^62, 2^40, 2^31...), non-finite floats, and lists of every length, the
 * wrong ones and very long ones included. The model is parsed, which runs shape
 * inference. When that succeeds, every result type must have no negative dim and at
 * most KILN_MAX_NUMEL elements; the interpreter runs it when every tensor is small
 * and every number modest (a window of 2^40 taps over one element is slow, not
 * wrong); the passes and lowering to C source (no compiler) run when every tensor
 * is at most 65536 elements (a table per element is slow under the sanitizers). A
 * crash, a sanitizer report or an abort here is a finding: each must become a clean,
 * located diagnostic. With KILN_FUZZ_PRINT set, the model text goes to stderr, to
 * turn a crash into a test. */
#include "codegen/codegen.h"
#include "frontend/frontend.h"
#include "passes/passes.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
const char *__ubsan_default_options(void);

/* An undefined behaviour report is a finding like a crash: stop, and keep the input. */
const char *__ubsan_default_options(void) {
    return "halt_on_error=1:print_stacktrace=1";
}

typedef struct {
    const uint8_t *p;
    size_t n;
} Bytes;

static unsigned take(Bytes *b) {
    if (!b->n)
        return 0;
    b->n--;
    return *b->p++;
}

/* clang-format off */
static const int64_t edges[] = {
    0, 1, -1, 2, 3, INT64_MAX, INT64_MIN, INT64_MAX - 1, INT64_MIN + 1,
    1LL << 62, -(1LL << 62), (1LL << 62) + 1, 1LL << 31, (1LL << 31) - 1, -(1LL << 31),
    1LL << 32, 1LL << 40, (1LL << 40) + 1, (1LL << 40) - 1, 1LL << 20, (1LL << 23) + 1,
    1LL << 33, INT64_MAX / 2, INT64_MAX / 3,
};
/* clang-format on */
enum { N_EDGES = sizeof edges / sizeof *edges };

/* Mostly small numbers (what makes an op valid), else an edge. */
static int64_t pick_int(Bytes *b, bool *big) {
    unsigned k = take(b);
    if (k < 160)
        return (int64_t)(k % 9) - 2;
    *big = true;
    return edges[k % N_EDGES];
}

static const char *const floats[] = {"0",   "1",    "-1",  "0.5",   "2",    "1e30", "-1e30",
                                     "inf", "-inf", "nan", "1e-30", "1e10", "3",    "-0.25"};
enum { N_FLOATS = sizeof floats / sizeof *floats };

static const char *const exprs[] = {
    "$0", "add($0, $1)", "relu($0)", "mul($0, 2)", "add($0, $2)", "$3", "sub($1, $0)", "exp($0)", ""};
enum { N_EXPRS = sizeof exprs / sizeof *exprs };

/* A dim: small mostly, sometimes 0 (refused by the parser) or large. */
static int64_t pick_dim(Bytes *b, bool *big) {
    static const int64_t large[] = {1LL << 20, 1LL << 30, 1LL << 39, 1LL << 40, (1LL << 23) + 1, 65536};
    unsigned k = take(b);
    if (k < 200)
        return 1 + k % 7;
    *big = true;
    return k < 250 ? large[k % 6] : 0;
}

typedef struct {
    char *s;
    size_t len, cap;
    bool oom;
} Text;

static void put(Text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(Text *t, const char *fmt, ...) {
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int m = vsnprintf(t->s ? t->s + t->len : NULL, t->s ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (m < 0 || t->oom)
            return;
        if (t->s && t->len + (size_t)m < t->cap) {
            t->len += (size_t)m;
            return;
        }
        size_t cap = (t->cap + (size_t)m + 1) * 2;
        char *s = realloc(t->s, cap);
        if (!s) {
            t->oom = true;
            return;
        }
        t->s = s;
        t->cap = cap;
    }
}

/* The model text, and whether any number in it is large (then no interpreter). */
static void model_text(Bytes *b, Text *t, bool *big) {
    int op = OP_RELU + (int)(take(b) % (OP_COUNT - OP_RELU));
    if (op == OP_GRAD)
        op = OP_CONV;
    int min, max;
    op_arity((OpId)op, &min, &max);
    int n_in = max < 0 ? min + (int)(take(b) % 4) : min + (int)(take(b) % (max - min + 1));
    for (int i = 0; i < n_in; i++) {
        int rank = (int)(take(b) % 7);
        if (rank == 6)
            rank = 4;
        put(t, "input x%d : f32[", i);
        for (int k = 0; k < rank; k++)
            put(t, "%s%lld", k ? ", " : "", (long long)pick_dim(b, big));
        put(t, "]\n");
    }
    put(t, "y = %s(", op_table[op].name);
    for (int i = 0; i < n_in; i++) {
        bool absent = op_input_optional((OpId)op, i) && take(b) % 4 == 0;
        if (absent)
            put(t, "%s_", i ? ", " : "");
        else
            put(t, "%sx%d", i ? ", " : "", i);
    }
    const OpInfo *o = &op_table[op];
    for (int a = 0; a < o->n_attrs; a++) {
        const AttrSpec *s = &o->attrs[a];
        if (s->def != DEF_REQUIRED && take(b) % 2)
            continue;
        put(t, ", %s=", attr_name(s->id));
        switch (s->kind) {
        case A_INT: put(t, "%lld", (long long)pick_int(b, big)); break;
        case A_BOOL: put(t, "%s", take(b) % 2 ? "true" : "false"); break;
        case A_FLOAT: put(t, "%s", floats[take(b) % N_FLOATS]); break;
        case A_STRING: put(t, "\"%s\"", exprs[take(b) % N_EXPRS]); break;
        case A_ENUM: {
            const EnumChoices *c = &enum_choices[s->set];
            put(t, "%s", c->words[take(b) % (unsigned)c->n]);
            break;
        }
        case A_INTS:
        case A_FLOATS: {
            unsigned k = take(b), len = k < 200 ? k % 7 : k < 250 ? k % 16 : 100;
            put(t, "[");
            for (unsigned j = 0; j < len; j++) {
                if (s->kind == A_INTS)
                    put(t, "%s%lld", j ? ", " : "", (long long)pick_int(b, big));
                else
                    put(t, "%s%s", j ? ", " : "", floats[take(b) % N_FLOATS]);
            }
            put(t, "]");
            break;
        }
        }
    }
    put(t, ")\noutput y\n");
}

/* The largest element count among the graph's values; aborts on a type that shape
 * inference should never have let through. */
static int64_t largest_value(const Graph *g) {
    int64_t most = 0;
    for (int v = 0; v < g->n_values; v++) {
        const Type *ty = &g->values[v].type;
        int64_t numel = 1;
        KILN_ASSERT(ty->rank >= 0 && ty->rank <= KILN_MAX_RANK);
        for (int k = 0; k < ty->rank; k++) {
            KILN_ASSERT(ty->dims[k] >= 0);
            KILN_ASSERT(ck_mul(numel, ty->dims[k] ? ty->dims[k] : 1, &numel) && numel <= KILN_MAX_NUMEL);
        }
        if (numel > most)
            most = numel;
    }
    return most;
}

static void run_interp(const Graph *g, Diag *d) {
    int n_in = 0, n_out = g->n_outputs;
    Tensor *in[64] = {0}, *out[64] = {0};
    bool ok = true;
    for (int i = 0; i < g->n_nodes && ok; i++) {
        const Node *n = g->nodes[i];
        if (n->op != OP_INPUT)
            continue;
        ok = n_in < 64 && (in[n_in] = tensor_new(&g->values[n->out[0]].type)) != NULL;
        if (ok) {
            int64_t numel = type_numel(&in[n_in]->type);
            for (int64_t k = 0; k < numel; k++)
                in[n_in]->data[k] = (float)((k * 7 + n_in) % 11) - 5.0f;
            n_in++;
        }
    }
    if (ok && n_out <= 64) {
        TensorList weights = {0};
        interp_run(g, &weights, (const Tensor *const *)in, out, d);
        for (int k = 0; k < n_out; k++)
            tensor_free(out[k]);
    }
    for (int k = 0; k < n_in; k++)
        tensor_free(in[k]);
}

static void run_lowering(Graph *g, Diag *d) {
    TensorList weights = {0};
    PipelineOptions po = {.level = 2, .verify = true, .lower = true};
    Program *p = NULL;
    Source src = {0};
    if (pipeline_run(g, &weights, &po, d) == 0 &&
        (p = program_lower(g, &weights, &(LowerOptions){TARGET_C, true, true, NULL}, d)))
        program_source(p, false, &src, d);
    source_free(&src);
    program_free(p);
    tensors_free(&weights);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static FILE *devnull;
    if (!devnull) {
        devnull = fopen("/dev/null", "w");
        /* under libFuzzer's 2 GiB malloc limit: a model's huge tensor is then the
           clean out-of-memory error it is on a machine with too little memory */
        ir_set_alloc_limit((size_t)1 << 30);
    }
    Bytes b = {data, size};
    Text t = {0};
    bool big = false;
    model_text(&b, &t, &big);
    if (getenv("KILN_FUZZ_PRINT") && t.s)
        fputs(t.s, stderr); /* the model of a crash, to make a test of it */
    SrcFile *src = t.oom ? NULL : srcfile_from_string("fuzz.kiln", t.s);
    free(t.s);
    if (!src)
        return 0;
    Diag d;
    diag_init(&d, devnull);
    Graph *g = parse_model(src, &d);
    if (g) {
        int64_t most = largest_value(g);
        if (!big && most <= 4096)
            run_interp(g, &d);
        if (most <= (1 << 16))
            run_lowering(g, &d);
    }
    graph_free(g);
    srcfile_free(src);
    return 0;
}
