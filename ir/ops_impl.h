/* For ir/ and codegen/: the shape inference functions and reference kernels the op table
 * names, and the small helpers they share. Each op family keeps its inference and
 * its kernel side by side in one file (op_elementwise.c, op_conv.c, ...), so an op's
 * whole meaning is read in one place. */
#ifndef KILN_OPS_IMPL_H
#define KILN_OPS_IMPL_H

#include "ir.h"

#define OP(id, name, inputs, attrs, infer, eval, lower, flags) int infer(Graph *g, Node *n, Diag *d);
#include "ops.def"
#undef OP
/* The reference kernels (NULL in the table has no prototype to declare). */
int eval_unary(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_binary(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_elementwise(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_reduce(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_softmax(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_batch_norm(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_layer_norm(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_matmul(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_gemm(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_linear(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_attention(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
/* An attention node's scale: its `scale`, or 1 / sqrt(E) for q [..., L, E]. */
double attention_scale(const Node *n, const Type *q);
int eval_conv(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_fused_conv(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_fused_linear(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
/* What the fused ops share: their epilogue's checks, after the head op's inference,
 * and its evaluation over the head's result y (in: the node's inputs). */
int infer_epilogue(Graph *g, Node *n, Diag *d);
int eval_epilogue(const Node *n, const Tensor *const *in, Tensor *y, Diag *d);
int eval_conv_transpose(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_pool(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_global_avg_pool(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_adaptive_avg_pool(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_copy(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_transpose(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_concat(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_slice(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_pad(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_conv_weight_grad(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_pool_grad(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_adaptive_avg_pool_grad(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_pad_grad(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_resample(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_resample_grad(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_expand(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_compare(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_where(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_cast(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_gather(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_gather_grad(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_gather_elements(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_gather_elements_grad(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_argmax(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_cumsum(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_uniform(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_dropout(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
/* dropout's threshold: an element is kept when its word's top 24 bits are at least
 * this, ceil(p 2^24), so exactly when uniform's value there is at least p; and the
 * scale of a kept element, 1 / (1 - p) rounded to f32 (ir/op_random.c). */
int64_t dropout_threshold(const Node *n);
float dropout_scale(const Node *n);
int eval_unary_grad(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
int eval_binary_grad(const Node *n, const Tensor *const *in, Tensor **out, Diag *d);
/* The op a unary_grad or binary_grad node differentiates (its `op`), and the
 * choice of `op` that names elementwise op `op`. */
OpId differentiated_op(const Node *n);
int grad_op_choice(OpId op);

const char *attr_kind_name(AttrKind k);
/* The dtype a cast node converts to. */
DType cast_dtype(const Node *n);

/* ---- Helpers for inference ---- */

/* The type of input i, or NULL when that optional input is absent. */
const Type *in_type(const Graph *g, const Node *n, int i);
/* Sets the type of result i. */
void set_out_type(Graph *g, Node *n, int i, Type t);
/* "f32[2, 3]", for messages: tstr(t) is a char array inside a temporary that lives
 * until the end of the full expression (C11 6.2.4p8), so it is used as an argument
 * (diag_error(d, loc, "%s", tstr(t))) and never kept. No static buffer: any number
 * of threads may build messages at once. */
typedef struct {
    char s[160];
} TypeText;
TypeText type_text(const Type *t);
#define tstr(t) (type_text(t).s)
/* Copies src's elements at .. at + count - 1 to dst's i .. i + count - 1 (one dtype). */
void copy_elements(Tensor *dst, int64_t i, const Tensor *src, int64_t at, int64_t count);
/* Maps a possibly negative axis into [0, rank); -1 when out of range. */
int norm_axis(int64_t axis, int rank);
/* Marks the dims of x that reduction n's `axes` reduces; an unset or empty list
 * reduces them all, as ONNX does with noop_with_empty_axes = 0. -1 after a
 * diagnostic at a bad axis. */
int reduce_axes(const Node *n, const Type *x, bool *reduced, Diag *d);
/* Numpy broadcasting of a and b into out (of a's dtype); false when incompatible. */
bool broadcast_types(const Type *a, const Type *b, Type *out);
/* Whether t stretches to `to` by numpy broadcasting without changing `to`. */
bool broadcasts_to(const Type *t, const Type *to);
/* Whether the node's `layout` attribute is nhwc. */
bool layout_is_nhwc(const Node *n);
/* Where to point at attribute `id`: its own text when written, else the op. */
Loc attr_loc(const Node *n, AttrId id);
/* Every v[i] (of the list attribute `id`, a size, window, pad or stride) at least min
 * and at most KILN_MAX_NUMEL; -1 after a diagnostic naming the attribute and value. */
int check_size_attr(const Node *n, AttrId id, const int64_t *v, int count, int64_t min, Diag *d);
/* The `shape` attribute of a node that makes a tensor of it (expand, uniform): its dims
 * into dims[KILN_MAX_RANK], each checked as check_size_attr does; the rank, or -1
 * after a diagnostic. */
int shape_attr(const Node *n, int64_t *dims, int64_t min, Diag *d);
/* A result of rank at most KILN_MAX_RANK, every dim >= 0 and no larger than the parser
 * allows a declared tensor (KILN_MAX_NUMEL); -1 after a diagnostic. */
int check_size(const Node *n, const Type *t, Diag *d);
bool too_large(double numel);
/* t's element count into *numel, computed with ck_mul; false when a dim is negative or
 * the count (with empty dims counted as 1) passes KILN_MAX_NUMEL. */
bool checked_numel(const Type *t, int64_t *numel);
/* "OP: NAME[i] = V WHY" at the attribute (no [i] when i < 0; WHY NULL: "is too large",
 * or "is too small" for a negative V);
 * returns -1. For a number of the model whose arithmetic overflowed. */
int attr_too_large(const Node *n, AttrId id, int i, int64_t v, const char *why, Diag *d);
/* A gradient op's dy and x of one rank: its list attributes have the length dy's
 * rank gives (the first input's), and are read as x's; -1 after a diagnostic. */
int check_grad_ranks(const Node *n, const Type *dy, const Type *x, Diag *d);

/* slice's first index and step per dim of x (0 and 1 where not sliced), and its
 * result type; -1 after a diagnostic (ir/op_shape.c). */
int slice_ranges(const Node *n, const Type *x, int64_t *start, int64_t *step, Type *out, Diag *d);

/* ---- Resampling (ir/op_resize.c) ---- */

/* One axis of a resampling: output index o along it reads input indices
 * index[o * taps + j] with weights weight[o * taps + j], j < taps; index[o * taps]
 * is -1 where o lies outside the input (tf_crop_and_resize), which then takes the
 * extrapolation value. Indices are clamped into [0, in_len). */
typedef struct {
    int axis;
    int64_t in_len, out_len;
    int taps;
    int64_t *index;
    double *weight;
} ResampleAxis;

/* What a resize or interpolate (or its grad) computes: the axes it changes, in the
 * order they are applied, each a 1-D map over the result of the one before. */
typedef struct {
    int n_axes;
    ResampleAxis axes[KILN_MAX_RANK];
    double extrapolation;
} Resampling;

/* The resampling of node n from type x to type y; -1 when memory runs out. */
int resample_plan(const Node *n, const Type *x, const Type *y, Resampling *r);
void resample_free(Resampling *r);
/* The data that pass `pass` (applied to x's resampling) sees as [outer, len, inner]. */
void resample_pass_shape(const Resampling *r, const Type *x, int pass, int64_t *outer, int64_t *inner);

/* ---- Helpers for kernels ---- */

/* An activation or conv weight seen as [outer, channel, spatial...] whatever its
 * layout: channel dim 1 for nchw, the last for nhwc. */
typedef struct {
    int ns;                                /* spatial dims */
    int64_t n, c, sp[KILN_MAX_RANK - 2];   /* sizes */
    int64_t sn, sc, ss[KILN_MAX_RANK - 2]; /* element strides */
} View;

View view_of(const Type *t, bool nhwc);
/* The offset of element (b, c, pos...) of a view. */
int64_t view_offset(const View *v, int64_t b, int64_t c, const int64_t *pos);

/* Row-major strides of t into s; returns the element count. */
int64_t type_strides(const Type *t, int64_t *s);
/* t seen as [outer, dims[axis], inner]: the elements before the axis and after it. */
void split_at_axis(const Type *t, int axis, int64_t *outer, int64_t *inner);
/* Strides of `from` as seen when broadcast to `to` (0 on broadcast dims). */
void broadcast_strides(const Type *from, const Type *to, int64_t *s);
/* Advances a multi-index over dims; false after the last element. */
bool next_index(int64_t *idx, const int64_t *dims, int rank);

#endif
