/* Internal to the ONNX importer: what onnx.c (the model, the graph walk, names and
 * errors), onnx_tensor.c (TensorProto data) and onnx_ops.c (the op mapping) share.
 *
 * Every ONNX value name is a symbol: either a kiln value (a float tensor that flows
 * at run time) or a constant known at import (an initializer, a Constant node, a
 * bound input, a folded shape computation), kept with its exact integers when its
 * dtype is an integer one. A constant becomes a kiln `const` or `param` only when an
 * op reads it as data; shape-like parameters are read as numbers and folded into
 * attributes. */
#ifndef KILN_ONNX_INTERNAL_H
#define KILN_ONNX_INTERNAL_H

#include "frontend.h"

#include "onnx.pb-c.h"

/* A tensor known at import. numel may be 0 (an empty list of scales, say). */
typedef struct {
    bool is_int; /* an integer or bool dtype: ints holds the exact values */
    DType dtype; /* what it is as data: f32 (every float dtype), i32, bool or i64 (the
                    other integers) */
    int rank;
    int64_t dims[KILN_MAX_RANK];
    int64_t numel;
    int64_t *ints;    /* is_int */
    float *f;         /* the values as f32 (always) */
    bool initializer; /* a weight of the model: a param when read as data */
} OConst;

typedef struct {
    const char *name;
    int value;                        /* kiln value id, or -1 */
    OConst *c;                        /* or a constant */
    const Onnx__ValueInfoProto *lazy; /* a graph input bound if_needed: declared when read as data */
} Sym;

typedef struct {
    const char *file; /* the model's name in messages */
    const char *dir;  /* where external data lives; NULL: nowhere */
    Graph *g;
    TensorList *weights;
    Diag *d;
    Arena arena;   /* constants and scratch */
    int64_t opset; /* of the default domain */
    Sym *syms;     /* open addressing by name */
    int cap_syms, n_syms;
    const Onnx__NodeProto *node; /* being imported */
    int node_index;              /* its index in the graph's node list */
    bool *attr_used;             /* per attribute of node */
    const OnnxBind *binds;       /* the caller's: graph inputs' values, symbolic dims' sizes */
    int n_binds;
} Importer;

/* ---- onnx_sym.c ---- */

/* Makes g, imported with the symbolic dim `dim` at `bound`, the graph for every size
 * of it, by its differences from probe, imported at bound - 1; -1 after a
 * diagnostic naming file. */
int onnx_generalize(Graph *g, const Graph *probe, const char *dim, int64_t bound, const char *file, Diag *d);

/* ---- onnx.c ---- */

/* "FILE: node 'NAME' (OP, domain D, opset N): MSG" for the current node; -1. */
int im_error(Importer *im, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
Sym *im_sym(Importer *im, const char *name); /* NULL when not defined */

/* Inputs of the current node. Absent: beyond the list or named "". */
bool im_has_input(Importer *im, int k);
int im_n_inputs(Importer *im);
int im_n_outputs(Importer *im);
/* Input k as a kiln value (a constant read as data becomes a const or param). */
int im_input(Importer *im, int k, int *value);
/* Input k as a constant; NULL when absent. An input that is not a constant is an
 * error naming it `what` (and, for a graph input, saying how to bind it). */
int im_const_input(Importer *im, int k, const char *what, OConst **c);
/* Input k's type: a value's, or a constant's shape. */
int im_input_type(Importer *im, int k, Type *t);

/* Attributes of the current node; each lookup marks the attribute as understood
 * (an attribute no lookup marked is an error after the node). Each returns 1 when
 * present, 0 when absent, -1 after an error (a wrong type). */
int im_attr_int(Importer *im, const char *name, int64_t *v);
int im_attr_float(Importer *im, const char *name, double *v);
int im_attr_string(Importer *im, const char *name, const char **v);
int im_attr_strings(Importer *im, const char *name, const char **v, int cap, int *n);
int im_attr_ints(Importer *im, const char *name, int64_t *v, int cap, int *n);
int im_attr_floats(Importer *im, const char *name, double *v, int cap, int *n);
int im_attr_tensor(Importer *im, const char *name, OConst **c);
/* Marks an attribute understood and ignored (it changes nothing kiln computes). */
void im_attr_ignore(Importer *im, const char *name);

/* A new kiln node of op with these inputs; attributes set with the node_set_*
 * below, then im_finish defines its result as the node's output k (out_k >= 0) or
 * a fresh intermediate name (out_k < 0), normalizes and infers it. Returns the
 * value id, or -1 after an error. */
Node *im_node(Importer *im, OpId op, int n_in, const int *in);
int im_finish(Importer *im, Node *n, int out_k);
int im_set_int(Importer *im, Node *n, AttrId attr, int64_t v);
int im_set_float(Importer *im, Node *n, AttrId attr, double v);
int im_set_word(Importer *im, Node *n, AttrId attr, const char *word);
int im_set_ints(Importer *im, Node *n, AttrId attr, const int64_t *v, int count);
int im_set_floats(Importer *im, Node *n, AttrId attr, const double *v, int count);
/* Shorthands: op(x) with no attributes, op(a, b), where(cond, a, b). */
int im_unary(Importer *im, OpId op, int x, int out_k);
int im_binary(Importer *im, OpId op, int a, int b, int out_k);
int im_where(Importer *im, int cond, int a, int b, int out_k);
/* A scalar f32 const (for decompositions); one of the given shape, every element v. */
int im_scalar(Importer *im, double v);
int im_filled(Importer *im, int rank, const int64_t *dims, double v);
/* A scalar const of dtype t holding v; an i64 const of rank `rank`, its dims 1 but
 * dim axis, which holds 0 .. n - 1 (to compare indices with along that dim). */
int im_scalar_of(Importer *im, DType t, int64_t v);
int im_iota(Importer *im, int rank, int axis, int64_t n);
/* A const holding data (owned from here on, freed on failure; NULL: out of memory). */
int im_const_tensor(Importer *im, Tensor *data);
/* Output k of the node as a constant (a folded computation). */
int im_define_const(Importer *im, int out_k, OConst *c);
/* Output k of the node as an existing value (an op that changes nothing). */
int im_alias(Importer *im, int out_k, int value);

/* A constant of the given shape from the importer's arena (values zeroed). */
OConst *oconst_new(Importer *im, bool is_int, int rank, const int64_t *dims);
/* c as a tensor of its dtype; NULL when out of memory. */
Tensor *oconst_tensor(const OConst *c);
/* The kiln dtype of ONNX tensor element type t, or -1 when kiln has none. */
int onnx_kiln_dtype(int32_t t);

/* ---- onnx_tensor.c ---- */

/* Decodes a TensorProto (raw, typed or external data), checking its size against
 * its shape; `what` names it in messages. */
int onnx_tensor_decode(Importer *im, const Onnx__TensorProto *t, const char *what, OConst **out);
/* The dtype's ONNX name ("FLOAT", "INT64", ...). */
const char *onnx_dtype_name(int32_t dtype);
/* The protobuf-c allocator that goes through ir_malloc, setting *oom when an
 * allocation fails (so that a failed unpack can tell out of memory from a
 * malformed file); one per unpack, never shared between threads. */
ProtobufCAllocator onnx_allocator(bool *oom);

/* ---- onnx_ops*.c: the op mapping ---- */

typedef int (*OnnxImportFn)(Importer *im);
typedef struct {
    const char *op_type;
    OnnxImportFn fn;
} OnnxOp;
/* Each family's importers by op type, ending with a NULL op_type. */
extern const OnnxOp onnx_ops_elementwise[], onnx_ops_nn[], onnx_ops_shape[], onnx_ops_logic[], onnx_ops_rnn[];
/* The importer of an op type of the default domain, or NULL. */
OnnxImportFn onnx_find_op(const char *op_type);

/* What the families share (onnx_ops.c). */
enum { ONNX_MAXL = 64 }; /* the longest list attribute or constant list input read */
/* The most elements a constant computed at import may have: shape arithmetic is
 * small, and a hostile model must not make the importer allocate without bound. */
#define ONNX_MAX_FOLDED (1LL << 24)
/* A new constant for a folded result; NULL after an error when too large. */
OConst *im_fold_new(Importer *im, bool is_int, int rank, const int64_t *dims);
/* A constant's values as a list of integers / numbers (a scalar or 1-D). */
int im_const_ints(Importer *im, OConst *c, const char *what, int64_t *v, int *n);
int im_const_floats(Importer *im, OConst *c, const char *what, double *v, int *n);
/* Input k, a constant list of integers: 1 read, 0 absent, -1 error. */
int im_input_ints(Importer *im, int k, const char *what, int64_t *v, int *n);
/* Input k, a constant scalar, into *v when given; -1 after an error. */
int im_bound_input(Importer *im, int k, const char *what, double *v);
/* axis in [-rank, rank) made non-negative. */
int im_axis(Importer *im, int64_t axis, int rank, int *out);
/* Input k's symbol, or NULL when absent. */
Sym *im_in_sym(Importer *im, int k);
/* Input k's constant if ops on it fold at import: a constant, except a float graph
 * input bound only where needed (the conformance runner's), which stays data. */
OConst *im_folded(Importer *im, int k);
/* Whether every given input folds. */
bool im_all_const(Importer *im);
/* x reshaped to dims, defined as output out_k (or an intermediate when < 0). */
int im_reshape(Importer *im, int x, const int64_t *dims, int rank, int out_k);
/* Output 0 as input 0 itself (a constant stays one): Identity, Dropout, Cast to f32. */
int im_pass_through(Importer *im);

#endif
