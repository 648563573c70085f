/* The kiln IR: types, tensors, the graph of nodes and values, diagnostics.
 *
 * A Graph owns an arena from which its nodes, attributes, names and types come;
 * they are freed together with graph_free. Tensor data (const literals, weights,
 * interpreter values) is separate and owned explicitly by whoever made it.
 *
 * Values are in SSA form: every value is defined once, by one node (a declaration
 * node for inputs, params and consts; an op node otherwise). Nodes sit in an array
 * in dependency order, so side tables are arrays indexed by node or value id.
 *
 * User errors go through the Diag functions, which print a location, the source
 * line and a caret, and are returned as -1; internal invariants use KILN_ASSERT,
 * whose failure becomes an internal error, never the end of the program. */
#ifndef KILN_IR_H
#define KILN_IR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- Allocation: one hook, so tests can make allocation fail after N calls. ---- */

void *ir_malloc(size_t n);
void *ir_calloc(size_t n, size_t size);
void *ir_realloc(void *p, size_t n);
void ir_free(void *p);
char *ir_strdup(const char *s);
/* After n more successful allocations on the calling thread, every allocation of
 * that thread fails; n < 0 disables. Other threads are not affected. */
void ir_fail_alloc_after(long n);
/* The largest single allocation the calling thread may make, in bytes; 0 (the
 * default) means the machine's physical memory. A larger request fails as out of
 * memory: with overcommit it would succeed and end with the OOM killer once touched. */
void ir_set_alloc_limit(size_t bytes);

/* An internal invariant. kiln runs inside other programs (libkiln), so a failed one
 * does not end the process: the first failure on the calling thread is recorded
 * (condition, file, line) and execution goes on, so the code after an assertion
 * must stay memory-safe without it. Every way out of kiln turns the record into an
 * internal error with diag_take_assert: each pass of the pipeline, libkiln's
 * kiln_jit, the driver's exit status. ir_fail_assert_after is the test hook: the
 * calling thread's assertion after n more that hold fails as if its condition
 * were false (once); n < 0 disarms it. */
#define KILN_ASSERT(cond)                                                                                    \
    ((cond) && kiln_assert_holds() ? (void)0 : kiln_assert_fail(#cond, __FILE__, __LINE__))
/* KILN_ASSERT as a condition, for code that must step around a failure to stay
 * memory-safe: `if (!KILN_CHECK(i < n)) return -1;`. */
#define KILN_CHECK(cond)                                                                                     \
    ((cond) && kiln_assert_holds() ? true : (kiln_assert_fail(#cond, __FILE__, __LINE__), false))
void kiln_assert_fail(const char *cond, const char *file, int line);
void ir_fail_assert_after(long n);
extern _Thread_local long kiln_asserts_left;
static inline bool kiln_assert_holds(void) {
    if (kiln_asserts_left < 0)
        return true;
    return kiln_asserts_left-- > 0;
}

/* ---- Arena ---- */

typedef struct ArenaBlock ArenaBlock;
typedef struct {
    ArenaBlock *head;
} Arena;

void *arena_alloc(Arena *a, size_t n); /* zeroed; NULL when out of memory */
char *arena_strdup(Arena *a, const char *s);
char *arena_strndup(Arena *a, const char *s, size_t n);
void arena_free(Arena *a);

/* ---- Diagnostics ---- */

typedef struct {
    const char *name; /* the path as the user gave it */
    const char *text; /* whole file, NUL-terminated */
    size_t len;
} SrcFile;

typedef struct {
    const SrcFile *file; /* NULL: no position */
    int line, col;       /* 1-based; col counts bytes */
} Loc;

/* Whose an error is, by increasing precedence: the input's or this machine's (a
 * wrong model, weights or option, a missing file, compiler or GPU: diag_error),
 * kiln's own (a bug: diag_internal, a failed KILN_ASSERT), or memory's (an
 * allocation refused: diag_error with "out of memory" in the message's format,
 * the phrase every such report uses). Memory comes first because it explains what
 * follows it: a checker that cannot allocate fails its check too, and a pass
 * that met an allocation failure leaves a graph its verifier rejects. */
typedef enum { DIAG_USER, DIAG_INTERNAL, DIAG_NO_MEMORY } DiagKind;

typedef struct {
    FILE *out;     /* where messages go (stderr by default) */
    int errors;    /* number of errors reported */
    int warnings;  /* and of warnings */
    DiagKind kind; /* the kind of the errors that takes precedence (when errors > 0) */
} Diag;

void diag_init(Diag *d, FILE *out);
/* FILE:LINE:COL: error: MSG, the source line and a caret; or "kiln: error: MSG"
 * when loc has no file. Always returns -1 so callers can `return diag_error(...)`. */
int diag_error(Diag *d, Loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* An error that is kiln's fault, not the input's (a pass broke the graph, the C
 * compiler rejected generated code): reported as diag_error does, of kind
 * DIAG_INTERNAL, so that the driver exits with status 3 (cli.md). */
int diag_internal(Diag *d, Loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A message from elsewhere (a kiln_error, Clang) as an error of the kind it had. */
int diag_relay(Diag *d, DiagKind kind, const char *msg);
/* A KILN_ASSERT failure recorded on this thread, reported in d as the internal
 * error "internal error: FILE:LINE: assertion 'COND' failed (a bug in kiln)" and
 * forgotten: -1; 0 when there was none. */
int diag_take_assert(Diag *d);
void diag_warning(Diag *d, Loc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A continuation line under the last message ("  note: ..."). */
void diag_note(Diag *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- Types ---- */

enum { KILN_MAX_RANK = 8 };
/* The most elements a tensor may have (2^40): keeps every size product in int64. */
#define KILN_MAX_NUMEL (1LL << 40)

/* Checked arithmetic for every size, shape and offset computed from a model's
 * numbers: each stores a + b, a - b or a * b in *r and returns true, or returns
 * false (leaving *r unspecified) when the exact result does not fit in int64_t. */
static inline bool ck_add(int64_t a, int64_t b, int64_t *r) {
    return !__builtin_add_overflow(a, b, r);
}
static inline bool ck_sub(int64_t a, int64_t b, int64_t *r) {
    return !__builtin_sub_overflow(a, b, r);
}
static inline bool ck_mul(int64_t a, int64_t b, int64_t *r) {
    return !__builtin_mul_overflow(a, b, r);
}

/* Element types. f32 is what every arithmetic op computes in; i64 and i32 carry
 * indices and ids, bool (one byte, 0 or 1) the comparisons' results. f16 and bf16
 * are reserved names. */
typedef enum { DT_F32, DT_F16, DT_BF16, DT_I64, DT_I32, DT_BOOL } DType;

/* A type whose first dim scales with the model's symbolic dim (docs/language.md,
 * "Symbolic dims") names it in `sym`, and dims[0] is sym_mult times it, held at the
 * dim's bound: every pass, the memory plan and lowering see the model at its
 * largest, and ir/symbolic.c keeps the rest of the type from depending on it. */
typedef struct {
    DType dtype;
    int rank;
    int64_t dims[KILN_MAX_RANK];
    const char *sym; /* the symbolic dim dims[0] scales with, or NULL: a static type */
    int64_t sym_mult;
} Type;

const char *dtype_name(DType t);
/* The dtype spelled s[0..len), or -1. */
int dtype_lookup(const char *s, size_t len);
/* Bytes per element. */
int64_t dtype_size(DType t);
bool dtype_is_int(DType t); /* i64 or i32 */
int64_t type_numel(const Type *t);
bool type_equal(const Type *a, const Type *b);
/* "f32[2, 3]" (or "f32[N*4, 3]") into buf; returns buf. */
char *type_str(const Type *t, char *buf, size_t n);
Type type_make(int rank, const int64_t *dims);
/* t with its symbolic dim at size n: a static type (t itself when it has none). */
Type type_at(const Type *t, int64_t n);
/* Whether `given` (a static type) is `want` at some size of its symbolic dim, from 1
 * to its bound, that size then in *size (0 when want has none). */
bool type_admits(const Type *want, const Type *given, int64_t *size);

/* ---- Tensors ---- */

typedef struct {
    Type type;
    union { /* type_numel elements of the type's dtype */
        float *data;
        int64_t *i64;
        int32_t *i32;
        uint8_t *b; /* bool */
        void *bytes;
    };
} Tensor;

Tensor *tensor_new(const Type *t); /* zeroed; NULL when out of memory */
Tensor *tensor_clone(const Tensor *t);
void tensor_free(Tensor *t);
/* Element i of an i64, i32 or bool tensor. */
int64_t tensor_int(const Tensor *t, int64_t i);
/* Element i of any tensor as a double (an i64 beyond 2^53 rounds). */
double tensor_double(const Tensor *t, int64_t i);

/* A list of named tensors (weights, a safetensors file); it owns names and tensors. */
typedef struct {
    char *name;
    Tensor *tensor;
} NamedTensor;

typedef struct {
    NamedTensor *items;
    int n, cap;
} TensorList;

/* Appends, taking ownership of t (freed on failure too); -1 when out of memory. */
int tensors_add(TensorList *l, const char *name, Tensor *t);
Tensor *tensors_find(const TensorList *l, const char *name);
void tensors_free(TensorList *l);

/* ---- Attributes ---- */

typedef enum { A_INT, A_FLOAT, A_BOOL, A_ENUM, A_STRING, A_INTS, A_FLOATS } AttrKind;

/* How a list attribute's length follows the first input's rank r. */
typedef enum {
    LEN_ANY,     /* any length */
    LEN_SPATIAL, /* r - 2 entries; a single number stands for all */
    LEN_PADS,    /* 2 * (r - 2) entries; a single number stands for all */
    LEN_RANK2,   /* 2 * r entries; a single number stands for all */
    LEN_RANK,    /* r entries; a single number stands for all */
} AttrLen;

typedef enum {
    DEF_VALUE,    /* has the default `dflt` */
    DEF_REQUIRED, /* must be given */
    DEF_NONE,     /* may be absent, with no value */
} AttrDefault;

/* Attribute ids and enum choices, from ir/attrs.def. */
typedef enum {
#define ATTR(id, name) ATTR_##id,
#include "attrs.def"
#undef ATTR
    ATTR_COUNT
} AttrId;

#define ENUM_BEGIN(set) enum {
#define CHOICE(set, id, word) set##_##id,
#define ENUM_END(set)                                                                                        \
    set##_COUNT                                                                                              \
    }                                                                                                        \
    ;
#include "attrs.def"
#undef ENUM_BEGIN
#undef CHOICE
#undef ENUM_END

typedef enum {
#define ENUM_BEGIN(set) ENUM_##set,
#define CHOICE(set, id, word)
#define ENUM_END(set)
#include "attrs.def"
#undef ENUM_BEGIN
#undef CHOICE
#undef ENUM_END
    ENUM_COUNT
} EnumSet;

/* An enum's choices: words[i] spells choice i; `text` is them all joined by '|'. */
typedef struct {
    const char *const *words;
    int n;
    const char *text;
} EnumChoices;

extern const EnumChoices enum_choices[ENUM_COUNT];
/* The name attribute id has in the text. */
const char *attr_name(AttrId id);
/* The attribute called name, or -1. */
int attr_lookup(const char *name);
/* The index of `word` among set's choices, or -1. */
int enum_lookup(EnumSet set, const char *word, size_t len);

typedef struct {
    AttrId id;
    AttrKind kind;
    AttrDefault def;
    double dflt;       /* number, bool, enum choice, and the fill value of list defaults */
    const char *shown; /* DEF_NONE: the text shown in signatures for no value */
    EnumSet set;       /* A_ENUM: its choices */
    AttrLen len;
} AttrSpec;

typedef struct {
    bool set;
    int n;         /* list length */
    int64_t i;     /* A_INT, A_BOOL, and A_ENUM's choice index */
    double f;      /* A_FLOAT */
    const char *s; /* A_STRING */
    int64_t *ints;
    double *floats;
    Loc loc;
} Attr;

/* ---- The op table (ir/ops.def) ---- */

typedef enum {
#define OP(id, name, inputs, attrs, infer, eval, lower, flags) OP_##id,
#include "ops.def"
#undef OP
    OP_COUNT
} OpId;

struct Node;
struct Graph;
struct Interp;

/* Shape inference: set the node's result types from its inputs and attributes. */
typedef int (*InferFn)(struct Graph *g, struct Node *n, Diag *d);
/* Reference kernel: compute the node's results (already allocated) from its inputs
 * (NULL for an absent optional input). */
typedef int (*EvalFn)(const struct Node *n, const Tensor *const *in, Tensor **out, Diag *d);

/* The classes of ops that passes treat alike: the flags column of ops.def. */
typedef enum {
    F_DECL = 1 << 0,        /* a declaration (input, param, const): not callable, no kernel */
    F_UNARY = 1 << 1,       /* a row of unary.def */
    F_BINARY = 1 << 2,      /* a row of binary.def */
    F_ELEMENTWISE = 1 << 3, /* each result element from the inputs' (broadcast) elements at its
                               index: the unary and binary ops and their fusion, `elementwise` */
    F_VIEW = 1 << 4,        /* the result is the input's data under another type (reshape, ...):
                               a copy, or no code where the memory plan shares the buffer */
    F_LAYOUT = 1 << 5,      /* has a `layout` attribute the layout pass may turn to nhwc */
    F_LAYOUT_FREE = 1 << 6, /* computes the same on channels-last inputs, so the layout pass
                               may move it past the transposes (resize with its lists permuted) */
    F_GRAD_OP = 1 << 7,     /* one of the backward graph's own ops: kiln takes no second
                               derivatives */
    F_NO_KERNEL = 1 << 8,   /* replaced before code generation (grad): no kernel, no lowering */
    F_TYPED = 1 << 9,       /* its inference checks its inputs' dtypes; every other op takes
                               f32 inputs only, or those of F_ANY_DTYPE */
    F_ANY_DTYPE = 1 << 10,  /* moves elements without computing: its inputs share any one
                               dtype, which its result has */
    F_COLLECTIVE = 1 << 11, /* its value depends on the other processes of a job (allreduce): never
                               folded, even from known inputs */
} OpFlag;

typedef struct {
    const char *name;
    const char *inputs;    /* "x, w, b?" or "x1, ..." (variadic) */
    const AttrSpec *attrs; /* n_attrs entries, in the order the printer writes them */
    int n_attrs;
    InferFn infer;
    EvalFn eval;
    unsigned flags; /* OpFlag */
} OpInfo;

extern const OpInfo op_table[OP_COUNT];
/* The op called NAME by a statement, or -1 (declarations are not callable). */
int op_lookup(const char *name);
/* Fewest and most inputs (most < 0: any number). */
void op_arity(OpId op, int *min, int *max);
/* Whether input i of op may be absent (`_`): its name in the op table ends in '?'. */
bool op_input_optional(OpId op, int i);
bool op_is_decl(OpId op);
/* Whether op has every flag in `flags`. */
bool op_has(OpId op, unsigned flags);
/* The elementwise ops that also take i64 and i32 (both inputs of one dtype): add,
 * sub, mul, div, max, min, neg and abs, wrapping around as two's complement. */
bool op_takes_ints(OpId op);
/* "conv(x, w, b?, strides: ints = 1, ...)" into buf. */
void op_signature(OpId op, char *buf, size_t n);

/* ---- Graph ---- */

typedef struct {
    const char *name;
    Type type;
    int node;  /* defining node id */
    int index; /* result index in that node */
} Value;

/* How a param gets its value when no weight is given. */
typedef enum { INIT_NONE, INIT_ZEROS, INIT_ONES, INIT_FILL, INIT_UNIFORM, INIT_NORMAL } InitKind;

typedef struct {
    InitKind kind;
    double a, b; /* fill value; lo, hi; mean, std */
    uint64_t seed;
} ParamInit;

typedef struct Node {
    OpId op;
    int n_in, *in;   /* value ids; -1 for an absent optional input */
    int n_out, *out; /* value ids */
    Attr *attrs;     /* op_table[op].n_attrs entries */
    Loc loc;         /* the op name (or the declared name for declarations) */
    Loc type_loc;    /* the written result type, if any */
    ParamInit init;  /* OP_PARAM */
    Tensor *data;    /* OP_CONST: the literal (owned by the graph) */
} Node;

/* A symbolic dim: sizes from 1 to `bound`, chosen at each run. */
typedef struct {
    const char *name;
    int64_t bound;
    Loc loc;
} SymDim;

/* A training step's param update: after a run, `param` takes the value `value` had. */
typedef struct {
    int param, value;
    Loc loc; /* the param's name in the update statement */
} Update;

typedef struct Graph {
    Arena arena;
    const char *name;
    Node **nodes;
    int n_nodes, cap_nodes;
    Value *values;
    int n_values, cap_values;
    int *outputs;
    int n_outputs;
    Update *updates; /* in statement order; every param at most once */
    int n_updates;
    /* name -> value id + 1, open addressing */
    int *table;
    int table_cap;
    SymDim sym; /* the model's symbolic dim (`dim N <= 64`); sym.name NULL: none */
} Graph;

Graph *graph_new(void);
void graph_free(Graph *g);
/* A new node with room for its inputs, attributes and n_out results (not yet named). */
Node *graph_add_node(Graph *g, OpId op, int n_in, int n_out, Loc loc);
/* Define value `name` as result `index` of node n; returns the id, or -1 (out of memory). */
int graph_define(Graph *g, const char *name, Node *n, int index);
int graph_find(const Graph *g, const char *name); /* value id or -1 */
const Value *graph_value(const Graph *g, int id);
/* Removes the nodes marked dead[i], keeping the others in order; their values
 * become orphans (node -1) that no node or output may use. */
void graph_remove_nodes(Graph *g, const bool *dead);
/* Makes every use of value `from`, by nodes and as an output, a use of `to`. */
void graph_replace_uses(Graph *g, int from, int to);
/* Makes value `id` result `index` of node n, which must be in the graph; its old
 * definer no longer defines it (and may be removed without orphaning it). */
void graph_redefine(Graph *g, int id, Node *n, int index);
/* Restores dependency order after nodes were appended out of place (a pass's new
 * nodes); a graph already in order is unchanged. -1 when out of memory. */
int graph_sort(Graph *g);
/* A name no value has and `taken` (when given) rejects: base, else base.1, base.2, ...
 * From the graph's arena; NULL when out of memory. */
const char *graph_fresh_name(Graph *g, const char *base, bool (*taken)(const char *name, void *ctx),
                             void *ctx);
/* uses[v] (n_values entries): how many node inputs, graph outputs and update values
 * name value v. */
void graph_count_uses(const Graph *g, int *uses);
/* Sets result[v] for every value a run hands on (the outputs and the update values):
 * what passes must keep as a value of its own. result has n_values entries. */
void graph_mark_results(const Graph *g, bool *result);
/* The update of param v, or NULL: an updated param changes from run to run, so it
 * is never a constant. */
const Update *graph_update_of(const Graph *g, int v);
/* Inputs in declaration order. */
int graph_inputs(const Graph *g, int *ids, int cap);

/* Attribute access by id, with the table's default when unset. */
int op_attr_index(OpId op, AttrId id); /* -1 if the op has none */
/* By the name in the text (for the parser and importers); -1 if the op has none. */
int op_attr_index_named(OpId op, const char *name);
const Attr *node_attr(const Node *n, AttrId id);
bool node_has(const Node *n, AttrId id);
int64_t node_int(const Node *n, AttrId id);
double node_float(const Node *n, AttrId id);
bool node_bool(const Node *n, AttrId id);
/* The index of the chosen word among the attribute's choices (e.g. LAYOUT_NHWC). */
int node_enum(const Node *n, AttrId id);
/* The chosen word as written. */
const char *node_enum_word(const Node *n, AttrId id);
/* Copies a list attribute into out (cap entries); an unset list with a default is
 * `count` copies of the default. Returns the number of entries. */
int node_ints(const Node *n, AttrId id, int64_t *out, int cap, int count);
int node_floats(const Node *n, AttrId id, double *out, int cap, int count);
/* The attribute values a unary op's row (unary.def) reads as p[0], p[1], ...: op's
 * attributes in schema order, read by id from n (a node of op, or a unary_grad
 * node, which carries them under the same ids), a float as it is, an enum as the
 * index of its choice. Returns their count (at most UNARY_MAX_PARAMS). */
enum { UNARY_MAX_PARAMS = 4 };
int unary_params(OpId op, const Node *n, double *p);

/* Expands single-number lists to their full length and drops attributes equal to
 * their default, so that equal graphs print the same. Needs the input types. */
int attrs_normalize(Graph *g, Node *n, Diag *d);

/* ---- Elementwise expressions (the `expr` of the `elementwise` op) ---- */

/* An expression over the inputs $0, $1, ... whose calls are elementwise ops of the
 * language (expr_callable), with their attributes as name=value after the operands:
 * "clip(add(mul($0, $1), $2), min=0, max=6)". Numbers are f32 literals. */
typedef enum { EXPR_INPUT, EXPR_NUMBER, EXPR_CALL } ExprKind;

typedef struct Expr {
    ExprKind kind;
    int input;           /* EXPR_INPUT: k of $k */
    double number;       /* EXPR_NUMBER */
    Node call;           /* EXPR_CALL: op, n_in operands and attrs (read with node_float, ...) */
    struct Expr *arg[2]; /* EXPR_CALL: the operands */
} Expr;

/* Whether op may be called in an expression: the unary and binary elementwise ops. */
bool expr_callable(OpId op);
/* Parses `text` with n_inputs inputs into nodes from arena a; NULL after a
 * diagnostic naming op's expr at `loc` (the attribute; moved to the offending
 * character when loc is the opening quote of the string as written in its source
 * file). */
Expr *expr_parse(Arena *a, OpId op, const char *text, int n_inputs, Loc loc, Diag *d);
/* Node n's `expr`, parsed into arena a: an `elementwise` node's over its inputs, a
 * fused op's over $0, its head op's result, and $1 ..., its inputs from
 * expr_first_input(n) on. NULL after a diagnostic. */
Expr *node_expr(Arena *a, const Node *n, Diag *d);
/* The input of node n that $1 stands for in its expr (a fused op), or 0 when $k is
 * input k (elementwise). */
int expr_first_input(const Node *n);
/* Computes e at every element of out, its inputs in[0 .. n_in) read by broadcasting
 * into out's type, each call rounded to f32 as its op rounds it; out may be an input
 * of its own type. -1 when out of memory. */
int expr_eval(const Expr *e, int n_in, const Tensor *const *in, Tensor *out);
/* The canonical text of e (ir_malloc'ed), or NULL when out of memory. */
char *expr_format(const Expr *e);
/* The number of calls in e. */
int expr_calls(const Expr *e);

/* ---- Shape inference, verification, printing ---- */

int infer_node(Graph *g, Node *n, Diag *d);
/* Where n's results have the graph's symbolic dim, after n's inference at its bound,
 * and the checks that n keeps its items apart (ir/symbolic.c). */
int infer_symbolic(Graph *g, Node *n, Diag *d);
int verify_graph(Graph *g, Diag *d);
void print_graph(const Graph *g, FILE *f);
/* The graph as Graphviz text (dot.c): declarations, ops and outputs as nodes, a
 * fused op as a cluster of the ops it stands for. */
void print_dot(const Graph *g, FILE *f);
/* The dot nodes of an elementwise expression ("relu(add($0, 1))"), named PREFIX_K,
 * with their edges to f and the edges from inputs[k] (a dot node per $k) to
 * `outside`; *root gets the node computing the result. -1, with nothing written,
 * when the expression is malformed or names an input >= n_inputs. */
int dot_expr(FILE *f, FILE *outside, const char *expr, const char *prefix, const char *const *inputs,
             int n_inputs, char *root, size_t root_cap);
/* Shortest text that reads back to the same double / float. */
void format_double(double v, char *buf, size_t n);
void format_float(float v, char *buf, size_t n);

/* Param initializers: the project's deterministic generator. */
int param_init_fill(const ParamInit *init, Tensor *t);

/* ---- The reference interpreter ---- */

/* The value of a param: its weight by name (which must have the param's type), or
 * else its initializer. A new tensor in *out, or -1 after a diagnostic. */
int param_value(const Graph *g, const Node *param, const TensorList *weights, Tensor **out, Diag *d);
/* Runs the graph. inputs[i] is the i-th declared input (types already checked by
 * the caller); outputs[i] receives a new tensor for the i-th output. */
int interp_run(const Graph *g, const TensorList *weights, const Tensor *const *inputs, Tensor **outputs,
               Diag *d);
/* interp_run, and with `state` (g->n_updates entries) each update's new value in
 * state[k], leaving `weights` as they are. */
int interp_run_updates(const Graph *g, const TensorList *weights, const Tensor *const *inputs,
                       Tensor **outputs, Tensor **state, Diag *d);
/* Runs one training step: interp_run, after which each updated param's new value
 * replaces (or becomes) its entry in `weights`, so the next step starts from it. */
int interp_step(const Graph *g, TensorList *weights, const Tensor *const *inputs, Tensor **outputs, Diag *d);

#endif
