/* Code generation: a verified graph lowered to kernels, and the kernels emitted as
 * source for a target language.
 *
 * Lowering decides everything once, for every language: which kernels there are,
 * what each computes, where every value lives, and the index arithmetic. A kernel
 * is either
 *   - a LOOP: `count` independent iterations, the body computing iteration `i`
 *     (one output element, or one row for reductions); C runs the iterations on the
 *     runtime's thread pool, CUDA gives each one a thread;
 *   - a CALL: a body run once, in order (a BLAS call such as cblas_sgemm); or
 *   - a GEMM: products of matrices given by their element loads, which gemm.c
 *     schedules for the target (row loops for C, shared-memory tiles for CUDA).
 * Bodies are kernel IR (kir.h), built by the lowerings, simplified and verified
 * when lowering ends (kernel_finish), and printed per language by kir_print.c: what
 * differs between languages, how a kernel is declared and how it finds its
 * iteration, is the `Lang` description.
 *
 * Memory: inputs and outputs are the caller's buffers; params and consts live in
 * one weights blob; every other value lives in one workspace that the instance
 * allocates once. A param that an update changes lives in the instance's state,
 * which starts as a copy of the blob's first state_bytes; after the kernels of a
 * run, each update's value is copied there, unless the plan could put the value
 * there directly (see lower_updates in lower.c). The memory plan (plan.c) gives
 * each workspace buffer its offset: with the `memplan` stage, buffers whose
 * lifetimes (in kernel order) are disjoint share memory, an elementwise kernel may
 * write over an input that dies there, and a view (reshape, flatten, squeeze,
 * unsqueeze, identity) is its input's buffer; without it, every value has its own
 * offset. */
#ifndef KILN_CODEGEN_H
#define KILN_CODEGEN_H

#include "../ir/ops_impl.h"
#include "../runtime/kernels.h"
#include "kir.h"

/* ---- A growing string ---- */

typedef struct {
    char *s;
    size_t len, cap;
    bool oom; /* an append failed; the text is incomplete */
} Str;

void str_printf(Str *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void str_free(Str *s);

/* ---- Where values live ---- */

typedef enum {
    BUF_INPUT,  /* the caller's i-th input */
    BUF_OUTPUT, /* the caller's i-th output */
    BUF_WEIGHT, /* byte offset into the weights blob */
    BUF_STATE,  /* byte offset into the instance's state: the params a training step
                   updates, which create copies from the start of the blob */
    BUF_WORK,   /* byte offset into the workspace */
    BUF_NONE,   /* not materialized (dead value) */
} BufKind;

typedef struct {
    BufKind kind;
    int64_t offset; /* byte offset (weights, workspace) or index (inputs, outputs) */
} Buffer;

/* ---- Kernels ---- */

typedef enum { K_LOOP, K_CALL, K_GEMM } KernelKind;

/* The targets a program is lowered for. */
typedef enum { TARGET_C, TARGET_CUDA } Target;

typedef struct {
    KernelKind kind;
    const Node *node; /* the op node it computes (part of) */
    char *name;       /* a C identifier, unique in the program */
    char *comment;    /* the ops it computes, e.g. "conv layer1.0.conv1 (im2col)" */
    int64_t count;    /* K_LOOP: iterations */
    /* K_LOOP of a program with a symbolic dim: a run at size n runs only the first
       ceil(n sym_rows / sym_tile) sym_width iterations, which compute the rows of
       the first n units of the dim in order, sym_rows rows a unit, sym_tile rows per
       sym_width iterations (kernel_follows); sym_rows 0: every run runs all count.
       K_GEMM: sym_rows of its m rows (sym_by_batch: of its batch items) are a unit
       of the dim, in order (gemm_follows). */
    int64_t sym_rows, sym_tile, sym_width;
    bool sym_by_batch;
    int64_t grain;         /* K_LOOP: fewest iterations worth giving a thread */
    int *reads, n_reads;   /* value ids the body reads */
    int *writes, n_writes; /* value ids it writes; -1 - k: the caller's k-th output, as `outK` */
    /* Workspace of the node's own (im2col, a padded input), at byte offset `scratch`: the kernels of
       one node that name scratch share it (one fills it, the next reads it). */
    int64_t scratch_bytes;
    int64_t scratch;
    /* Constant data of the kernel's own (a resampling's index and weight tables), at
       byte offset `table` of the weights blob when table_bytes > 0; program_table
       puts it there. */
    int64_t table_bytes;
    int64_t table;
    /* Where in the table the packed panels of a GEMM's B begin, which end it
       (kb_packed_gemm); 0: the table has none. */
    int64_t panels_from;
    /* Elementwise: every read of the written value's type is read only at the element
       being written, so the result may overwrite such a read where it dies (plan.c).
       The lowering sets it. */
    bool in_place;
    /* An allreduce's fault number (program_fault), else 0: on the CUDA target such a
       K_CALL is no kernel but a step that the runtime does on the host. */
    int allreduce_fault;
    int64_t flops; /* FLOPs per run where lowering counts them (GEMMs), else 0 */
    /* The body as kernel IR, and the builder a lowering appends to: inside the
       PARALLEL loop over `i` (variable `iter`) for a K_LOOP, at the top for a K_CALL. */
    KBody *ir; /* in the program's arena */
    KBuilder b;
    int iter;
    /* K_GEMM: `batch` products of an [m, depth] A and a [depth, n] B (kernel_gemm),
       scheduled for the target when lowering ends (gemm_schedule): load_a sets the
       float variable gemm.v to A(bi, r, kk), load_b to B(bi, kk, q), and store
       stores the float gemm.acc, the sum of element (bi, r, q). */
    int64_t batch, m, n, depth;
    KStmt *load_a, *load_b, *store;
    struct {
        int bi, r, q, kk, v, acc;
    } gemm;
    bool a_depth_inner, b_depth_inner; /* A(.., kk) and A(.., kk + 1) are adjacent in memory */
} Kernel;

/* A buffer of the workspace: a value with the views and in-place results that share
 * its memory, or the scratch of a node's kernels. */
typedef struct {
    int64_t bytes;   /* its size, a multiple of 64 */
    int first, last; /* the kernels that use it: from the first writing it to the last reading it */
    int64_t offset;  /* in the workspace, a multiple of 64 */
    int value;       /* the value it holds first, or -1 for scratch */
    int kernel;      /* scratch: the first kernel using it */
} MemBuffer;

/* How a value came to its buffer. */
typedef enum { MEM_OWN, MEM_VIEW, MEM_IN_PLACE } MemShare;

typedef struct {
    bool reuse;      /* buffers share memory (the `memplan` stage); else one offset each */
    MemBuffer *bufs; /* ordered by first kernel */
    int n_bufs;
    int *buffer;     /* per value id: its index in bufs, or -1 (not in the workspace) */
    MemShare *share; /* per value id: how it came to it */
    int *from;       /* per value id: the value whose memory it took (views, in place), or -1 */
    int64_t peak;    /* the workspace's size */
    int64_t bound;   /* a lower bound: the most bytes live at one kernel */
} MemPlan;

typedef struct Program {
    Graph *g;
    Buffer *buf; /* per value id */
    MemPlan plan;
    int *view_of; /* per value id: the value a view shares memory with (memplan), else -1 */
    int *uses;    /* per value id: the node inputs, outputs and update values naming it */
    int64_t workspace_bytes;
    unsigned char *weights; /* the blob: params and consts, 64-byte aligned each */
    int64_t weights_bytes;
    int64_t state_bytes; /* the updated params, at the start of the blob */
    Kernel *kernels;
    int n_kernels, cap_kernels;
    int *inputs, n_inputs; /* value ids in declaration order */
    Target target;
    /* GEMMs call OpenBLAS: the C target, where kiln is built with it and
       program_lower was asked to (kiln_options.blas). Else the GEMM-heavy ops are K_GEMM kernels
       (kernel_gemm). */
    bool blas;
    /* The floats in one of the C target's vector registers (cc_vector_floats): GEMMs
       with weights known now run on packed weights (lower_packed.c), in register
       tiles of that width. 0 on the CUDA target. */
    int vector_floats;
    bool profile; /* a clock around every kernel call, and kiln_profile (kiln bench) */
    /* What each run-time fault means (program_fault): a kernel that raises fault f
       makes `run` return f, and the model's run_error(f) is faults[f - 1]. */
    const char **faults;
    int n_faults;
    /* A model with a symbolic dim, on the C target: the model lowered again with the
       dim at 1, where the bound's choices of kernels (Winograd for a batch, blocks
       for many items) are not the best, which a run at size 1 runs instead; its
       kernels' names start with "one_", reading this program's weights blob, which
       holds what they read that this program's kernels do not (share_weights). */
    struct Program *at_one;
    /* A static batch of `split` items that never meet, too large for the caches: this
       program is the model at one item, which a run runs on each item in turn (its
       ports' rows); 0: the whole batch at once. */
    int64_t split;
    const char *kernel_prefix; /* "" or "one_" */
    Arena arena;               /* the kernels' IR */
    /* value_name's results, the last 8 of them valid at once: scratch of this
       program's own, so that programs lowered on different threads share none */
    char names[8][80];
    unsigned next_name;
} Program;

/* How to lower a graph. */
typedef struct {
    Target target;
    bool memplan;    /* plan the workspace with reuse (plan.c), else every value its own offset */
    bool blas;       /* the C target's GEMMs call OpenBLAS (where kiln is built with it), else
                        they are generated loops */
    const char *cpu; /* the C target's CPU (cc_cpu_valid; NULL: native), for its vector width */
} LowerOptions;

/* Lowers a verified graph (no grad left) with its weights. NULL after a diagnostic
 * (an op with no lowering, a missing weight). */
Program *program_lower(Graph *g, const TensorList *weights, const LowerOptions *o, Diag *d);
void program_free(Program *p);

/* ---- The memory plan (plan.c) ---- */

/* Fills p->plan and places every workspace value (buffer kind BUF_NONE, defined by
 * an op a kernel computes) and every kernel's scratch, after lowering; reuse: with
 * the sharing the header comment describes. -1 after a diagnostic. */
int plan_memory(Program *p, bool reuse, Diag *d);
/* The plan as a table for people: each buffer with its size, lifetime, offset and
 * values, then the peak, the lower bound and their ratio (kiln compile --memory-report). */
void plan_report(const Program *p, Str *out);

/* ---- What op lowerings use ---- */

/* The product of f[0 .. count) with ck_mul: a size lowering computes from a model's
 * shapes and attributes (a scratch area, a table, a GEMM), which may be larger than
 * any one tensor; -1 after a diagnostic at node n naming `what` when it overflows
 * int64 (or leaves no room to align it to 64 bytes). */
int64_t lower_size(const Node *n, const char *what, int count, const int64_t *f, Diag *d);
/* The same product for a kernel's FLOP count, which is only reported: INT64_MAX
 * when it overflows. */
int64_t lower_flops(int count, const int64_t *f);

/* A new kernel of op node n, named after its first result; its body is empty. */
Kernel *kernel_new(Program *p, const Node *n, KernelKind kind, const char *what);
/* A new LOOP kernel of op node n (named as kernel_new names it) of `count`
 * iterations, at least `grain` of them to a thread, that reads every input n has
 * and writes its first result; NULL after a diagnostic when memory runs out. */
Kernel *kernel_loop(Program *p, const Node *n, const char *what, int64_t count, int64_t grain, Diag *d);
/* Declares that LOOP kernel k computes value type t's rows (`rows` of them at the
 * symbolic dim's bound: t's first dim, or that times what each row of it holds) in
 * order, `tile` rows per `width` iterations, so that a run at a smaller size runs
 * only the iterations its rows need; nothing when t has no symbolic dim. */
void kernel_follows(const Program *p, Kernel *k, const Type *t, int64_t rows, int64_t tile, int64_t width);
/* Declares that K_GEMM kernel k's m rows (by_batch: its batch items) go through the
 * units of value type t's symbolic dim in order; nothing when t has none. */
void gemm_follows(const Program *p, Kernel *k, const Type *t, bool by_batch);
/* A let of an int64 index, or the expression itself where it is a constant or a
 * variable already. */
KExpr *let_index(KBuilder *b, const char *name, KExpr *e);
/* A new run-time fault of node n's kernels, meaning `what` ("an index is out of
 * range"): its number, which a kernel raises with KILN_FAULT(number); -1 after a
 * diagnostic when memory runs out. */
int program_fault(Program *p, const Node *n, const char *what, Diag *d);
void kernel_reads(Kernel *k, int value);
/* Removes the first read of value from k's reads (one the body does not make). */
void kernel_unread(Kernel *k, int value);
/* Makes room in k for `reads` reads and `writes` writes in all, for a kernel that
 * reads or writes more values than its node has inputs or results; -1 when memory
 * runs out (k keeps what it had). */
int kernel_room(Kernel *k, int reads, int writes);
/* A new K_GEMM kernel of op node n: for each of `batch` items bi, the product of an
 * [m, depth] matrix A and a [depth, cols] matrix B. The lowering builds, each
 * between kb_begin_block and kb_take, load_a, the statements setting the float
 * variable gemm.v to A(bi, r, kk), load_b, setting it to B(bi, kk, q) (the indices
 * in range), and store, storing gemm.acc, the sum of element (bi, r, q)
 * (kb_gemm_store). It reads every input n has and writes its first result; NULL
 * after a diagnostic when memory runs out. */
Kernel *kernel_gemm(Program *p, const Node *n, const char *what, int64_t batch, int64_t m, int64_t cols,
                    int64_t depth, Diag *d);
/* Appends `bytes` of data to the weights blob as kernel k's table; -1 after a
 * diagnostic when memory runs out. */
int program_table(Program *p, Kernel *k, const void *data, int64_t bytes, Diag *d);
/* Appends ": text" to k's comment (left as it is when memory runs out). */
void kernel_annotate(Kernel *k, const char *text);
void kernel_writes(Kernel *k, int value);
/* The C identifier of a value in kernel bodies (`v12_layer1_0_conv1`), in one of
 * p's 8 name buffers: valid until 8 more names of p are asked for. */
const char *value_name(const Program *p, int id);
/* A float literal that reads back exactly, e.g. "0.100000001f", "(-1.0f / 0.0f)". */
void float_literal(double v, char *buf, size_t n);

/* The formula (kir.h) of unary op node n (or an expression's call of one) over
 * $0, and of its derivative (its attributes read from n, a node of op or a
 * unary_grad); of binary op `op` (wrt 0), or its derivative by a (1) or b (2), over
 * $0 and $1: the C columns of ir/unary.def and ir/binary.def. */
void unary_formula(const Node *n, char *e, size_t cap);
void unary_derivative_formula(OpId op, const Node *n, char *e, size_t cap);
void binary_formula(OpId op, int wrt, char *e, size_t cap);

/* Lets computing expression e over inputs ($0, $1, ... as the given expressions),
 * one `tN` per call (*next counts them), each with its op's own formula, so a fused
 * op computes exactly what its own kernel computes; returns the result. */
KExpr *kb_expr(KBuilder *b, const Expr *e, KExpr *const *inputs, int *next);

/* The loop finishing a tile of rows x cols elements of fused op n's result in
 * buffer `tile` at tile_at, element (r, q) at tile_at + r * ld + q * step: adds
 * the bias value's element bias_at(r, q) (bias < 0: none), then computes the
 * epilogue (NULL: none) with $0 the element and each of n's inputs from
 * expr_first_input(n) on read at the element's offset in the result. Nothing when
 * there is neither. */
void kb_tile_epilogue(KBuilder *b, const Program *p, const Node *n, const Expr *epilogue, int bias,
                      KExpr *(*bias_at)(KBuilder *b, KExpr *r, KExpr *q, const void *ctx), const void *ctx,
                      int tile, KExpr *tile_at, KExpr *rows, KExpr *cols, int64_t ld, int64_t step);

/* The store block of K_GEMM kernel k: its sum acc plus `bias` (NULL: none), with
 * the epilogue (NULL: none) as kb_tile_epilogue computes it, into n's result at
 * `at` (an expression of the variables bi, r and q). */
void kb_gemm_store(Kernel *k, const Program *p, const Node *n, const Expr *epilogue, KExpr *bias, KExpr *at);

/* Stores epilogue(x0) (NULL: x0) of fused op n, its inputs from expr_first_input(n)
 * on read at offset `at` of the element in the result, into buffer y at `at`. */
void kb_store_epilogue(KBuilder *b, const Program *p, const Node *n, const Expr *epilogue, int y, KExpr *at,
                       KExpr *x0);

/* Offsets of a mixed-radix index, outermost digit first: index i's digit d, (i /
 * the product of the sizes after d) % size[d], times stride[d], summed. A conv's
 * implicit GEMM reads its A this way: a row is (batch item, output position...),
 * a step of the depth (tap..., channel), each digit a stride through x. */
typedef struct {
    int n;
    int64_t size[KILN_MAX_RANK], stride[KILN_MAX_RANK];
} OffsetMap;

/* Appends a digit to m: none for a size of 1; merged into the digit before it when
 * that one steps over exactly `size` of these (then the two are one run). */
void offset_digit(OffsetMap *m, int64_t size, int64_t stride);
/* The offset of index i through m. */
int64_t offset_at(const OffsetMap *m, int64_t i);

/* A GEMM Y = A B of each of `batch` items, B known now (lower_packed.c): A(bi, r, kk)
 * at a_at + bi a_batch + a_rows(r) + a_depth(kk) in buffer a, B(bi, kk, q) at
 * b[bi b_batch + b_depth(kk) + q b_q], Y(bi, r, q) at y_at + bi y_batch + r y_ld + q in
 * buffer y, stored plus the bias value's element bi bias_batch + q (bias -1: none)
 * through node's epilogue (NULL: none). A plain A [rows, depth] with rows lda apart
 * has a_rows {rows: lda} and a_depth {depth: 1}. */
typedef struct {
    int64_t batch, rows, cols, depth;
    int a, y, bias;
    OffsetMap a_rows, a_depth, b_depth;
    int64_t a_at, a_batch, y_at, y_ld, y_batch, bias_batch;
    const float *b;
    int64_t b_q, b_batch;
    int64_t table_at; /* where the packed B starts in the kernel's table, in floats */
    const Node *node;
    const Expr *epilogue;
} PackedGemm;

/* The iterations of the LOOP kernel that runs g. */
int64_t packed_gemm_tiles(const Program *p, const PackedGemm *g);
/* A kernel's table holding g's B packed from float `at` on (g->table_at), the
 * floats before it zeros for the caller to fill, and its size in *bytes; NULL when
 * memory runs out. A B of b_batch 0 is packed once for every item. */
float *packed_gemm_table(const Program *p, const PackedGemm *g, int64_t at, int64_t *bytes);
/* The floats of g's part of that table (its parameter block and packed B), in whole
 * cache lines: where the next part may start. */
int64_t packed_gemm_floats(const Program *p, const PackedGemm *g);
/* Builds LOOP kernel k's body (of packed_gemm_tiles iterations): g's B packed into
 * k's table, and the micro-kernels; and sets k's grain. -1 after a diagnostic when
 * memory runs out. */
int kb_packed_gemm(Program *p, Kernel *k, const PackedGemm *g, Diag *d);
/* Makes the kernel table at byte `at` of blob, whose packed panels began panels_from
 * bytes into it, read its panels at byte `panels` of the blob instead. */
void packed_gemm_repoint(unsigned char *blob, int64_t at, int64_t panels_from, int64_t panels);
/* Every tile of g's batch item bi, as loops over row tiles and panels, its packed B
 * in the kernel's table `table`: a GEMM that one iteration of a LOOP runs whole. Its
 * Y is stored as item y_item's (bi, unless Y is a local array of fewer items). */
void kb_packed_gemm_item(const Program *p, KBuilder *b, const PackedGemm *g, int table, KExpr *bi,
                         KExpr *y_item);

/* cblas_sgemm(CblasRowMajor, ...) of an m x n result (int expressions) at c, the
 * sum running over `depth`, with the float scalars alpha and beta (lower_linalg.c). */
void kb_sgemm(KBuilder *b, bool ta, bool tb, KExpr *m, KExpr *n, int64_t depth, KExpr *alpha, KExpr *a,
              int64_t lda, KExpr *bm, int64_t ldb, KExpr *beta, KExpr *c, int64_t ldc);

typedef int (*LowerFn)(Program *p, const Node *n, Diag *d);

/* The lowerings the op table names, one family per file (lower_*.c). */
int lower_unary(Program *p, const Node *n, Diag *d);
int lower_binary(Program *p, const Node *n, Diag *d);
int lower_elementwise(Program *p, const Node *n, Diag *d);
int lower_copy(Program *p, const Node *n, Diag *d);
int lower_compare(Program *p, const Node *n, Diag *d);
int lower_gather(Program *p, const Node *n, Diag *d);
int lower_gather_grad(Program *p, const Node *n, Diag *d);
int lower_gather_elements(Program *p, const Node *n, Diag *d);
int lower_gather_elements_grad(Program *p, const Node *n, Diag *d);
int lower_scan(Program *p, const Node *n, Diag *d);
/* The value of one result element from its inputs' elements x[k] (loaded, of their
 * element types, where `used`) at the broadcast index. */
typedef KExpr *(*ElementFn)(KBuilder *b, KExpr *const *x, const void *ctx);
/* Node n's result, element by element, as f computes it over the inputs n uses
 * (used[k]), broadcast as numpy does, in blocks where they allow (lower_elementwise.c);
 * `text` names what it computes in the kernel's comment (NULL: n's op). */
int lower_broadcast(Program *p, const Node *n, const bool *used, ElementFn f, const void *ctx,
                    const char *text, Diag *d);
int lower_reduce(Program *p, const Node *n, Diag *d);
int lower_softmax(Program *p, const Node *n, Diag *d);
int lower_batch_norm(Program *p, const Node *n, Diag *d);
int lower_layer_norm(Program *p, const Node *n, Diag *d);
int lower_matmul(Program *p, const Node *n, Diag *d);
int lower_gemm(Program *p, const Node *n, Diag *d);
int lower_linear(Program *p, const Node *n, Diag *d);
int lower_attention(Program *p, const Node *n, Diag *d);
int lower_conv(Program *p, const Node *n, Diag *d);
int lower_conv_transpose(Program *p, const Node *n, Diag *d);
/* Whether transpose node t is the layout pass's, to channels last, of a conv's input
 * that the conv's padded copy transposes instead (lower_conv.c). */
bool transpose_feeds_padded_conv(const Program *p, const Node *t);
/* Whether transpose node t is the layout pass's, back to channels first, of what a
 * linear on packed weights reads flattened, which reads t's input instead
 * (lower_linalg.c). */
bool transpose_feeds_linear(const Program *p, const Node *t);
/* Whether transpose or slice node t computes nothing because an attention reads its
 * input in its place, or writes its result in its place (lower_attention.c). */
bool attention_absorbs(const Program *p, const Node *t);
/* v, a strided view of node n's input, made the view of n's result: n a transpose,
 * a slice or a view op (lower_shape.c). False where that is no strided view of v. */
bool kview_through(const Program *p, const Node *n, KView *v);
/* A conv (or fused_conv, with its epilogue) as Winograd F(4x4, 3x3) or F(2x2, 3x3), when
 * winograd_applies (lower_winograd.c). */
bool winograd_applies(const Program *p, const Node *n);
int lower_winograd(Program *p, const Node *n, const Expr *epilogue, Diag *d);
int lower_pool(Program *p, const Node *n, Diag *d);
/* Whether e is an activation of its operand that the precompiled kernels compute
 * (runtime/kernels.h's KILN_ACT_*): relu, clip to [lo, hi] with lo <= hi (its
 * limits in *lo and *hi), or erf's GELU, its kind in *act. */
bool library_act(const Expr *e, int64_t *act, double *lo, double *hi);

/* The KilnWindow (runtime/kernels.h) of kernel[0] x kernel[1] taps sliding over x,
 * channels last with 2 spatial dims, wo output positions a row: the block a
 * depthwise conv's and a max pool's precompiled row kernels read. */
KilnWindow window_block(const View *x, const int64_t *kernel, const int64_t *strides, const int64_t *pads,
                        const int64_t *dilations, int64_t wo);
int lower_global_avg_pool(Program *p, const Node *n, Diag *d);
int lower_adaptive_avg_pool(Program *p, const Node *n, Diag *d);
int lower_transpose(Program *p, const Node *n, Diag *d);
int lower_concat(Program *p, const Node *n, Diag *d);
int lower_slice(Program *p, const Node *n, Diag *d);
int lower_pad(Program *p, const Node *n, Diag *d);
int lower_conv_weight_grad(Program *p, const Node *n, Diag *d);
int lower_pool_grad(Program *p, const Node *n, Diag *d);
int lower_adaptive_avg_pool_grad(Program *p, const Node *n, Diag *d);
int lower_pad_grad(Program *p, const Node *n, Diag *d);
int lower_expand(Program *p, const Node *n, Diag *d);
int lower_unary_grad(Program *p, const Node *n, Diag *d);
int lower_binary_grad(Program *p, const Node *n, Diag *d);
int lower_resample(Program *p, const Node *n, Diag *d);
int lower_resample_grad(Program *p, const Node *n, Diag *d);
int lower_random(Program *p, const Node *n, Diag *d);
int lower_allreduce(Program *p, const Node *n, Diag *d);
/* Whether a kernel of p calls kiln_philox, so that its source needs runtime/philox.h
 * (kiln_philox_text). */
bool program_uses_philox(const Program *p);
extern const char kiln_philox_text[];

/* ---- Emission ---- */

/* What differs between the languages kernels are written in. */
typedef struct {
    const char *name;          /* "c" */
    const char *kernel_decl;   /* before a kernel's name: "static void" */
    const char *params;        /* after it: "(const KilnArgs *args, void *const *buf, ...)" */
    const char *args;          /* how the body reaches the arguments: "args->" */
    const char *buffers;       /* the array of the kernel's pointers, in the order it declares them
                                  ("buf"); NULL: each from where it points (l->args) */
    const char *restrict_kw;   /* "restrict " */
    const char *parallel_open; /* a PARALLEL loop over `i`, before its block */
    const char *call_open;     /* before a CALL kernel's body */
    const char *barrier;       /* a barrier statement, where there is one */
    const char *unroll_hint;   /* before an UNROLL loop, followed by the count; or NULL */
    const char *vector_hint;   /* before a VECTOR loop, or NULL */
    const char *launch_bounds; /* CUDA: the attribute giving a GEMM kernel's block size */
} Lang;

extern const Lang lang_c, lang_cuda;

/* The whole translation unit of a compiled model: the public header, the runtime,
 * the kernels, the run function and the `kiln_model` definition. With p->profile
 * the run function also sums each kernel's wall time, and the model exports
 *   int kiln_profile(double **seconds, const char *const **names,
 *                    const char *const **comments, const int64_t **flops);
 * returning the number of kernels and, through its arguments, the per-kernel
 * arrays: seconds summed over every run so far (writable, to reset them), the
 * kernels' names and comments, and their FLOPs per run (0 where not counted). */
int emit_c_model(const Program *p, Str *out, Diag *d);
/* The same model as `units` translation units, for compiling them at once: each
 * the runtime and headers and every units-th kernel text (from its index on); the first
 * also the run function and `kiln_model`, calling the others' kernels. */
int emit_c_units(const Program *p, int units, Str *out, Diag *d);
/* The model for compiling each kernel apart (the in-process JIT, which caches each
 * kernel's object by its text): `main`, the unit with the run function and
 * kiln_model, declaring the kernels; each distinct kernel's definition; and the
 * prelude that each of them is compiled after (the runtime's header, the math). */
typedef struct {
    Str prelude, main;
    int n_kernels;
    Str *kernels;
    char (*names)[96]; /* the kernels' function names */
} CPieces;
int emit_c_pieces(const Program *p, CPieces *out, Diag *d);
void c_pieces_free(CPieces *c);
/* How many units p is compiled as: one a core, up to C_MAX_UNITS, but at least 8
 * kernels a unit (a small model's compile is its fixed costs, which every unit pays
 * again). */
enum { C_MAX_UNITS = 4 };
int c_unit_count(const Program *p);

/* The header `kiln compile --header` writes: kiln/model.h after a comment a line
 * naming the model, its inputs and its outputs with their types. */
void emit_header(const Graph *g, Str *out);

/* The CUDA target (emit_cuda.c). The kernels as CUDA C++, for NVRTC; with
 * `emulated`, as C++ for the host instead, after cuda/emulate.h, whose fibers run
 * them on the CPU. */
int emit_cuda_kernels(const Program *p, bool emulated, Str *out, Diag *d);
/* The host side of a compiled CUDA model, in C: kiln/model.h, the CUDA runtime
 * (cuda/cuda_rt.c), the kernel source as a string (or, emulated, declarations of
 * the kernels compiled beside it), the launches, the weights and `kiln_model`. */
int emit_cuda_model(const Program *p, const Str *kernels, bool emulated, Str *out, Diag *d);

/* ---- GEMM schedules (gemm.c) ---- */

/* CUDA: a K_GEMM kernel's block of threads, and the square tile of the result it computes. */
enum { GEMM_BLOCK = 256, GEMM_TILE = 64 };
/* Builds a K_GEMM kernel's body from its loads and store for p's target. */
void gemm_schedule(const Program *p, Kernel *k);

/* ---- Kernel IR (kir_print.c) ---- */

/* A kernel body as source in language l, indented; a value (or output -1 - j) that is
 * ptrs[j] (NULL: none is) named bufj. */
void kir_print(const Program *p, const Lang *l, const KBody *kb, const int *ptrs, int n_ptrs, Str *out,
               int indent);
/* A body whose buffers and sizes are all parameters (kb_param_buf, kb_param_var)
 * as a function `void NAME(params)` of language l. */
void kir_print_function(const KBody *kb, const Lang *l, const char *name, Str *out);
/* A kernel body as text for people (kiln compile --dump-dir). */
void kir_dump(const Program *p, const KBody *kb, Str *out);
/* Whether the body names value id (or KIR_SCRATCH, KIR_TABLE), as kir_simplify found. */
enum { KIR_SCRATCH = -1000, KIR_TABLE = -1001 };
bool kir_uses_value(const KBody *kb, int value);
/* The program's kernel IR as text, one kernel after another. */
void program_dump_kir(const Program *p, Str *out);

/* What the emitters share (emit_c.c). */
void emit_kernel(const Program *p, const Lang *l, const Kernel *k, Str *out);
/* kiln/model.h and a runtime's source without its include of it. */
void emit_runtime(Str *out, const char *runtime);
/* The weights blob, linked in with `.incbin` (or, with KILN_WEIGHTS_EXTERN, defined
 * by the host of an in-process JIT). */
void emit_weights_blob(const Program *p, Str *out);
/* The tensor infos, model_create and model_create_comm (of a `program` defined
 * before), the kiln_model_def and kiln_model; rt is the runtime's prefix: its
 * _create, _run, _destroy, _read_state and _write_state. */
void emit_model_def(const Program *p, Str *out, const char *rt);
/* model_<what>_unit_bytes: per port, the bytes of one unit of the symbolic dim (0: a
 * port without it). */
void emit_unit_bytes(const Program *p, Str *out, const char *what, const int *ids, int n);
/* The per-kernel profiling tables, a clock and kiln_profile (see emit_c_model). */
void emit_profile_tables(const Program *p, Str *out);
void indent_lines(Str *out, const char *text, int indent);

/* ---- Text from a model in generated source (c_text.c) ---- */

/* s as the contents of a C string literal, escaped: quotes, backslashes, `??`,
 * control and non-ASCII bytes. */
void c_string(Str *out, const char *s);
/* A comment of one line saying TEXT, formatted as printf does and escaped as
 * c_string escapes it, with `*` and `/` escaped where they meet: it ends where kiln
 * ends it and holds no nested comment. */
void c_comment(Str *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- Compilers ---- */

/* The flags kiln gives the C compiler, also part of the compile cache's key. */
extern const char *const cc_flags[8];
/* The CPUs code may be built for (-march=CPU), NULL-terminated; "native" is this
 * machine's, the default. */
extern const char *const cc_cpus[];
bool cc_cpu_valid(const char *cpu);
/* The floats in a vector register of code built for cpu (NULL: native, this machine). */
int cc_vector_floats(const char *cpu);
/* The flag that has the compiler vectorize loops that many floats at a time, or NULL
 * when its own choice is that width: GCC's and Clang's tuning for AVX-512 CPUs
 * vectorizes 8 at a time, and the elementwise epilogues (SiLU's exp and division)
 * ran 1.08x faster on EfficientNet-B0 and MobileNetV3-Small 16 at a time. */
const char *cc_vector_width_flag(int vector_floats);
/* kiln's precompiled kernels (runtime/kernels.h) for vectors of that many floats:
 * the object file, built with kiln, that every C-target model is linked with. */
typedef struct {
    const unsigned char *bytes;
    size_t len;
} KernelObject;
KernelObject cc_kernel_object(int vector_floats);
/* The system compilers a shared object is built with, and the CPU it is built for. */
typedef struct {
    const char *cc, *cxx; /* the C and C++ compilers; NULL: "cc" and "c++" */
    const char *cpu;      /* -march=CPU (cc_cpu_valid); NULL: native */
} Toolchain;
/* A program's generated source. */
typedef struct {
    Str host;      /* the C translation unit of the shared object */
    Str kernels;   /* CUDA: the kernels' source (in host as a string, or, emulated, C++ compiled beside it) */
    Str kir;       /* the kernels as kernel IR, for people (--dump-dir) */
    bool emulated; /* CUDA kernels for the CPU (kiln_options.cuda "emulate") */
} Source;

/* The source of p for its target, the CUDA target's kernels built for the CPU when
 * cuda_emulated; -1 after a diagnostic. */
int program_source(const Program *p, bool cuda_emulated, Source *src, Diag *d);
void source_free(Source *src);

/* Compiles a program's source and its weights blob into a shared object at
 * out_path with the compilers of tc; nothing is left behind on failure. */
int cc_compile_so(const Source *src, const Program *p, const char *out_path, const Toolchain *tc, Diag *d);

#endif
