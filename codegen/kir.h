/* The kernel IR: what a kernel does, between the lowered graph and source text.
 *
 * A lowering builds each kernel's body as a small tree: statements (lets, mutable
 * variables, assignments, stores, loops, ifs, calls, barriers, local arrays) over
 * expressions (literals, variables, loads, arithmetic, comparisons, selects, math
 * calls and the elementwise tables' formulas). Index expressions come from views
 * (shape, strides, offset), so no lowering writes index arithmetic by hand. A loop
 * carries annotations: PARALLEL (the kernel's iterations, which C spreads over the
 * runtime's threads and CUDA over its threads), UNROLL and VECTOR (hints, printed
 * where the language has a spelling for them; VECTOR promises that no iteration
 * touches an element another one does, so the loop vectorizes without overlap
 * tests).
 *
 * The constructors simplify as they build: integer constants fold, `x * 1`,
 * `x * 0`, `x / 1`, `x % 1`, `x + 0` and `x - 0` vanish (for integers only: float
 * arithmetic is left exactly as written, so the targets compute what the
 * interpreter computes). kir_simplify then drops every let whose variable nothing
 * reads. kir_verify checks a body before it is printed: every variable defined
 * before use and once per scope, every operand of the type its operator needs, every
 * store to a buffer the kernel may write, and target-only constructs (thread
 * indices, barriers, shared arrays) only on their target.
 *
 * One printer per language (kir_print.c) turns a body into C or CUDA, the
 * differences being a `Lang` of spellings; kir_dump writes the same tree as text for
 * people (`kiln compile --dump-dir`). Nothing from a model reaches the tree as text:
 * variable names are the lowering's own identifiers, buffers are named by
 * value_name, and formulas come from kiln's op tables. */
#ifndef KILN_KIR_H
#define KILN_KIR_H

#include "../ir/ir.h"

/* KT_VF32: a vector of floats as wide as the C target's vector registers
 * (Program.vector_floats), C only; arithmetic mixes it with KT_F32 scalars, which
 * stand for the vector of that value in every lane. */
typedef enum { KT_BOOL, KT_I32, KT_I64, KT_F32, KT_F64, KT_PTR, KT_VF32 } KType;

typedef enum {
    KE_INT,      /* i */
    KE_FLOAT,    /* f, as the literal of its type */
    KE_VAR,      /* variable `var` */
    KE_LOAD,     /* buffer `buf` at index a */
    KE_ADDR,     /* the address of buffer `buf`'s element a (a KT_PTR, for calls) */
    KE_VLOAD,    /* the KT_VF32 of float buffer `buf`'s elements from a on */
    KE_SYMBOL,   /* a constant of a called library, `name` (CblasRowMajor) */
    KE_SPECIAL,  /* a CUDA thread or block index, `special` */
    KE_SYM_SIZE, /* the size of the model's symbolic dim at this run (C only) */
    KE_NEG,
    KE_NOT,
    KE_CAST, /* a to `type` */
    KE_ADD,
    KE_SUB,
    KE_MUL,
    KE_DIV,
    KE_MOD,
    KE_LT,
    KE_LE,
    KE_GT,
    KE_GE,
    KE_EQ,
    KE_NE,
    KE_AND,
    KE_OR,
    KE_SELECT,  /* a ? b : c */
    KE_CALL,    /* a math function `name` of args */
    KE_FORMULA, /* an op table's formula `name` over args ($0, $1, ...) */
} KExprKind;

typedef enum { K_THREAD_X, K_BLOCK_X, K_BLOCK_Y, K_BLOCK_Z, K_BLOCK_DIM_X } KSpecial;

typedef struct KExpr KExpr;
struct KExpr {
    KExprKind kind;
    KType type;
    int64_t i;
    double f;
    int var, buf;
    KSpecial special;
    const char *name;
    KExpr *a, *b, *c;
    KExpr **args;
    int n_args;
};

typedef enum {
    KS_LET,    /* const type var = a; */
    KS_DECL,   /* type var = a; (mutable) */
    KS_ASSIGN, /* var = a; or, accumulating, var += a; */
    KS_STORE,  /* buf[index] = a; or, accumulating, += */
    KS_VSTORE, /* float buffer buf's elements from index on = vector a */
    KS_FOR,    /* for (var = lo; var < hi; var += step) body */
    KS_IF,     /* if (a) body else orelse */
    KS_CALL,   /* name(args); */
    KS_BARRIER,
    KS_ARRAY, /* buffer `buf`, a local array, declared here (zeroed when `zero`) */
    KS_BLOCK, /* { body }: a scope of its own */
} KStmtKind;

enum { K_PARALLEL = 1, K_VECTOR = 2, K_UNROLL = 4 };

typedef struct KStmt KStmt;
struct KStmt {
    KStmtKind kind;
    int var, buf;
    bool accumulate, zero;
    unsigned flags; /* KS_FOR: K_PARALLEL, ... */
    int unroll;     /* KS_FOR with K_UNROLL: by how many iterations */
    KExpr *a, *index, *lo, *hi, *step;
    KStmt *body, *orelse;
    const char *name;
    KExpr **args;
    int n_args;
    KStmt *next;
};

/* A kernel's buffers: the values it reads and writes, its scratch and table, and
 * local arrays (registers, or CUDA shared memory). */
typedef enum { KB_VALUE, KB_OUTPUT, KB_SCRATCH, KB_TABLE, KB_LOCAL, KB_SHARED, KB_PARAM } KBufKind;

typedef struct {
    KBufKind kind;
    int value;          /* KB_VALUE: value id; KB_OUTPUT: output index */
    bool writable;      /* the kernel may store into it */
    KType type;         /* element type (local arrays) */
    int64_t size, cols; /* local arrays: elements, and the row length of a 2-D one (0: 1-D) */
    const char *name;   /* local arrays and parameters */
    bool used;          /* the body reads or writes it (set by kir_simplify) */
} KBuf;

typedef struct {
    const char *name;
    KType type;
    bool param; /* a parameter of the function the body is (kir_print_function) */
} KVarInfo;

/* A kernel body and what it names. */
typedef struct {
    KStmt *body;
    KVarInfo *vars;
    int n_vars, cap_vars;
    KBuf *bufs;
    int n_bufs, cap_bufs;
} KBody;

/* Builds a KBody: statements append to the innermost open block. Every function is
 * safe to call after memory ran out (it then builds nothing); kb_failed says so. */
enum { KB_MAX_DEPTH = 32 };

typedef struct {
    Arena *arena;
    KBody *kb;
    KStmt **first[KB_MAX_DEPTH]; /* each open block's first statement */
    KStmt **tail[KB_MAX_DEPTH];  /* where the next statement of each open block goes */
    KStmt *open[KB_MAX_DEPTH];   /* the statement each block belongs to (NULL: top level or kb_begin_block) */
    int depth;
    bool oom, misuse;
    const Graph *graph; /* the element types of kb_value's buffers (NULL: all f32) */
} KBuilder;

void kb_init(KBuilder *b, Arena *a, KBody *body);
bool kb_failed(const KBuilder *b);

/* ---- Buffers ---- */

/* The buffer of value id (read), or the kernel's k-th output when id < 0 (-1 - k),
 * of the value's element type. */
int kb_value(KBuilder *b, int id, bool writable);
/* The KType of dtype t's elements (bool: KT_BOOL, stored one byte each). */
KType dtype_ktype(DType t);
int kb_scratch(KBuilder *b);
int kb_table(KBuilder *b);
/* The kernel's table read as elements of another 4-byte type t (KT_I32: int32
 * indices stored beside float weights), element k at byte 4 k. */
int kb_table_of(KBuilder *b, KType t);
/* A local array of `rows` x `cols` elements (cols 0: 1-D of rows), declared at this
 * point of the body; shared: CUDA shared memory. */
int kb_array(KBuilder *b, const char *name, KType t, int64_t rows, int64_t cols, bool shared, bool zero);

/* Parameters of a body printed as a function of its own (kir_print_function): a
 * float array, and an integer scalar such as a size the kernel is not specialized
 * for. In scope everywhere in the body. */
int kb_param_buf(KBuilder *b, const char *name, bool writable);
int kb_param_var(KBuilder *b, const char *name, KType t);

/* ---- Expressions ---- */

KExpr *k_int(KBuilder *b, int64_t v);
KExpr *k_i32(KBuilder *b, int64_t v);
KExpr *k_f32(KBuilder *b, double v);
KExpr *k_f64(KBuilder *b, double v);
KExpr *k_var(KBuilder *b, int var);
KExpr *k_load(KBuilder *b, int buf, KExpr *index);
/* Element (row, col) of a 2-D local array. */
KExpr *k_load2(KBuilder *b, int buf, KExpr *row, KExpr *col);
KExpr *k_addr(KBuilder *b, int buf, KExpr *index);
/* The vector of float buffer buf's elements from index on (any alignment). */
KExpr *k_vload(KBuilder *b, int buf, KExpr *index);
/* The vector with v in every lane. */
KExpr *k_vsplat(KBuilder *b, double v);
KExpr *k_symbol(KBuilder *b, const char *name);
KExpr *k_special(KBuilder *b, KSpecial s);
KExpr *k_sym_size(KBuilder *b);
KExpr *k_neg(KBuilder *b, KExpr *a);
KExpr *k_not(KBuilder *b, KExpr *a);
KExpr *k_cast(KBuilder *b, KType t, KExpr *a);
KExpr *k_bin(KBuilder *b, KExprKind op, KExpr *x, KExpr *y);
KExpr *k_add(KBuilder *b, KExpr *x, KExpr *y);
KExpr *k_sub(KBuilder *b, KExpr *x, KExpr *y);
KExpr *k_mul(KBuilder *b, KExpr *x, KExpr *y);
KExpr *k_div(KBuilder *b, KExpr *x, KExpr *y);
KExpr *k_mod(KBuilder *b, KExpr *x, KExpr *y);
KExpr *k_lt(KBuilder *b, KExpr *x, KExpr *y);
KExpr *k_and(KBuilder *b, KExpr *x, KExpr *y);
KExpr *k_select(KBuilder *b, KExpr *c, KExpr *x, KExpr *y);
/* A <math.h> function both languages have (expf, fmaxf, ...), of type t. */
KExpr *k_call(KBuilder *b, KType t, const char *fn, int n, KExpr **args);
/* formula: text from an op table over $0 .. $(n-1), of type t. */
KExpr *k_formula(KBuilder *b, KType t, const char *formula, int n, KExpr **args);
/* x * stride + y, the common step of index arithmetic, simplified. */
KExpr *k_madd(KBuilder *b, KExpr *x, int64_t stride, KExpr *y);

/* ---- Statements ---- */

/* PREFIXk, kept in the arena: a name for a let, decl or loop (the IR keeps the
 * pointer, so names are literals or made here). */
const char *kb_name(KBuilder *b, const char *prefix, int k);
/* A new variable's id, for a let, decl or loop; its name must be an identifier. */
int kb_new_var(KBuilder *b, const char *name, KType t);
int kb_let(KBuilder *b, const char *name, KType t, KExpr *value);
int kb_decl(KBuilder *b, const char *name, KType t, KExpr *init);
/* A let or decl of a variable made with kb_new_var (shared by blocks built apart). */
void kb_let_var(KBuilder *b, int var, KExpr *value);
void kb_decl_var(KBuilder *b, int var, KExpr *init);
void kb_assign(KBuilder *b, int var, KExpr *value);
void kb_accum(KBuilder *b, int var, KExpr *value);
void kb_store(KBuilder *b, int buf, KExpr *index, KExpr *value);
void kb_store_add(KBuilder *b, int buf, KExpr *index, KExpr *value);
void kb_store2(KBuilder *b, int buf, KExpr *row, KExpr *col, KExpr *value, bool accumulate);
/* Stores vector value into float buffer buf's elements from index on. */
void kb_vstore(KBuilder *b, int buf, KExpr *index, KExpr *value);
/* Opens `for (name = lo; name < hi; name += step)` (step NULL: 1); returns its
 * variable. kb_end closes it. */
int kb_for(KBuilder *b, const char *name, KType t, KExpr *lo, KExpr *hi, KExpr *step, unsigned flags);
/* A loop over an existing variable (declared with kb_new_var). */
void kb_for_var(KBuilder *b, int var, KExpr *lo, KExpr *hi, KExpr *step, unsigned flags);
/* Marks the innermost open loop UNROLL by `count` iterations (K_UNROLL alone
 * unrolls by 16); a count of the loop's trip count unrolls it fully. */
void kb_unroll(KBuilder *b, int count);
void kb_if(KBuilder *b, KExpr *cond);
/* Opens a scope of its own (closed by kb_end). */
void kb_scope(KBuilder *b);
void kb_else(KBuilder *b);
void kb_end(KBuilder *b);
void kb_call(KBuilder *b, const char *fn, int n, KExpr **args);
void kb_barrier(KBuilder *b);
/* Starts collecting statements apart from the body (a K_GEMM kernel's loads and
 * store); kb_take ends it and returns them. */
void kb_begin_block(KBuilder *b);
KStmt *kb_take(KBuilder *b);
/* Appends statements taken with kb_take, copied, at this point. */
void kb_splice(KBuilder *b, const KStmt *s);

/* ---- Views: index expressions from shape, strides and offset ---- */

typedef struct {
    int rank;
    int64_t dims[KILN_MAX_RANK];
    int64_t strides[KILN_MAX_RANK];
    int64_t offset;
} KView;

/* A contiguous row-major view of t. */
KView kview_of(const Type *t);
/* t as seen broadcast to `to` (stride 0 on broadcast dims), ranks aligned right. */
KView kview_broadcast(const Type *t, const Type *to);
/* offset + sum idx[j] * strides[j], dims of size 1 and zero strides left out. */
KExpr *kview_index(KBuilder *b, const KView *v, KExpr *const *idx);
/* Lets PREFIXj = the j-th coordinate of flat index `flat` in a row-major t (only
 * those of dims > 1; the others are 0), into idx. */
void kb_unravel(KBuilder *b, KExpr *flat, const Type *t, const char *prefix, KExpr **idx);

/* ---- After building ---- */

/* Drops lets nothing reads, repeatedly, and marks the buffers the body uses. */
void kir_simplify(KBody *kb);
/* The target a body may use thread indices, barriers and shared memory for. */
typedef enum { KIR_C, KIR_CUDA } KirTarget;
/* 0; -1 with why in err; or KIR_NO_MEMORY when memory ran out. */
enum { KIR_NO_MEMORY = -2 };
int kir_verify(const KBody *kb, KirTarget t, char *err, size_t errlen);

#endif
