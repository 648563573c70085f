/* The frontend: text (and, later, ONNX) in, Graph out; tensor files in and out. */
#ifndef KILN_FRONTEND_H
#define KILN_FRONTEND_H

#include "../ir/ir.h"

/* ---- Lexer ---- */

typedef enum {
    T_EOF,
    T_NEWLINE,
    T_IDENT,  /* bare identifier */
    T_QUOTED, /* "..." : a name or a string, by context */
    T_INT,
    T_FLOAT, /* also inf, -inf, nan */
    T_EQ,
    T_COMMA,
    T_COLON,
    T_LPAREN,
    T_RPAREN,
    T_LBRACK,
    T_RBRACK,
    T_LE,   /* <=, in `dim N <= 64` */
    T_STAR, /* *, in a symbolic dim's multiple (f32[N*4, 3]) */
    T_ERROR,
} TokKind;

typedef struct {
    TokKind kind;
    Loc loc;
    const char *start; /* the token's text in the source */
    int len;
    char *text; /* T_QUOTED: the unescaped contents (owned by the lexer's arena) */
    int64_t ival;
    double fval;
} Token;

typedef struct {
    const SrcFile *src;
    const char *p;
    int line;
    const char *line_start;
    int depth;    /* open ( and [: newlines inside them are spaces */
    Loc open_loc; /* the outermost bracket still open */
    Arena *arena;
    Diag *diag;
} Lexer;

void lex_init(Lexer *lx, const SrcFile *src, Arena *arena, Diag *d);
/* The next token; T_ERROR after reporting a diagnostic. */
Token lex_next(Lexer *lx);
/* Whether the token's text is exactly `word` (bare identifiers only). */
bool tok_is(const Token *t, const char *word);
const char *tok_kind_name(TokKind k);

/* ---- Parser ---- */

/* Reads a whole file (the path as the user gave it); NULL after a diagnostic. */
SrcFile *srcfile_read(const char *path, Diag *d);
SrcFile *srcfile_from_string(const char *name, const char *text);
void srcfile_free(SrcFile *f);

/* Parses, type-checks and shape-infers a model. The graph keeps pointers into src
 * (for locations), so src must outlive it. NULL after a diagnostic. */
Graph *parse_model(const SrcFile *src, Diag *d);

/* ---- Tensor files (npy.c, safetensors.c) ----
 *
 * Every reader checks everything a hostile file could get wrong (truncation, bad
 * headers, offsets outside the file, dtypes other than little-endian f32, shapes
 * that do not match the data, duplicate names) and reports it naming the file.
 * Writers write a temporary file beside the target and rename it into place, so a
 * failed write leaves nothing behind. */

/* NumPy .npy, format 1.0 to 3.0 read, 1.0 written; '<f4', C order. */
int npy_parse(const unsigned char *buf, size_t len, const char *name, Tensor **out, Diag *d);
int npy_read(const char *path, Tensor **out, Diag *d);
int npy_write(const char *path, const Tensor *t, Diag *d);
/* The bytes of an .npy file holding t; -1 when out of memory. */
int npy_encode(const Tensor *t, unsigned char **buf, size_t *len);

/* safetensors: F32 tensors only (version 1 computes in f32). Appends to out;
 * a name already in out is an error ("duplicate weight"). */
int safetensors_parse(const unsigned char *buf, size_t len, const char *name, TensorList *out, Diag *d);
int safetensors_read(const char *path, TensorList *out, Diag *d);
int safetensors_write(const char *path, const TensorList *l, Diag *d);
/* The bytes of a safetensors file holding l; -1 when out of memory. */
int safetensors_encode(const TensorList *l, unsigned char **buf, size_t *len);

/* ---- ONNX import (onnx.c, onnx_tensor.c, onnx_ops.c; docs/onnx.md) ----
 *
 * A ModelProto becomes a verified Graph: graph inputs become `input`s, float
 * initializers `param`s whose values go to `weights`, small constants `const`s, and
 * each node one or a few kiln ops. Shape-like parameters (Reshape's shape, Slice's
 * starts, Resize's scales, ...) must be constants at import: initializers, Constant
 * nodes, shapes folded at import, or graph inputs bound to a value with a binding
 * (NAME=FILE, FILE an .npy or an ONNX TensorProto .pb). A graph input's dims must be
 * static, or symbolic (dim_param) and fixed at a size by a binding (NAME=SIZE). Every
 * error names the file and the node (name, op type, domain, opset) or tensor; all
 * unsupported nodes of a model are listed at once. */

typedef struct {
    const char *name; /* a graph input, or (file NULL) a symbolic dim (dim_param) */
    const char *file; /* the input's value: .npy (f32) or .pb (an ONNX TensorProto) */
    bool if_needed;   /* a constant only where an op needs one; elsewhere still an
                         input (the conformance runner binds every input this way) */
    int64_t size;     /* the symbolic dim's, wherever a graph input or output has it */
    bool bound;       /* size is the bound of the symbolic dim, which stays the model's own
                         (the first dim of the inputs that have it: a batch) */
} OnnxBind;

/* Whether a model path names an ONNX file (ends in .onnx). */
bool is_onnx_path(const char *path);
/* Imports the model at path; external data is read from its directory. Appends the
 * params' values to weights. NULL after diagnostics. */
Graph *onnx_import(const char *path, const OnnxBind *binds, int n_binds, TensorList *weights, Diag *d);
/* The same from bytes in memory, named `name` in messages; dir is where external
 * data files are looked for (NULL: a model with external data is an error). */
Graph *onnx_import_buffer(const unsigned char *buf, size_t len, const char *name, const char *dir,
                          const OnnxBind *binds, int n_binds, TensorList *weights, Diag *d);
/* Whether the ONNX model buf[0..len) keeps a tensor in an external data file. */
bool onnx_uses_external_data(const unsigned char *buf, size_t len);
/* The directory of path, for the files it names ("." for a bare name); NULL when out
 * of memory. */
char *path_dir(const char *path);
/* A TensorProto file (the conformance tests' input_N.pb) as an f32 tensor, its
 * values converted from the file's dtype; *name (may be NULL) gets its name,
 * ir_malloc'ed. -1 after a diagnostic. */
int onnx_read_tensor(const char *path, Tensor **out, char **name, Diag *d);

/* ---- A model as read from its files (model_input.c) ---- */

typedef struct {
    unsigned char *bytes;
    size_t len;
} ModelBytes;

/* A model and its weights files, each read once: what the model cache hashes
 * (codegen/jit.c) and, on a miss, what is parsed. */
typedef struct {
    const char *name; /* the model's path, or "<model>" for text given in memory */
    bool onnx;
    SrcFile *src;                     /* a .kiln model, once read (text given in memory: from the start) */
    ModelBytes file;                  /* an ONNX model, once read */
    const char *const *weights_paths; /* the caller's */
    int n_weights;
    ModelBytes *weights; /* the weights files', once read */
    bool read;           /* model_input_read succeeded */
} ModelInput;

/* The model at path (.kiln, or .onnx by its name) and the weights files, named, not
 * read yet. */
void model_input_init(ModelInput *in, const char *path, const char *const *weights, int n_weights);
/* A model given as text (copied), and the weights files; -1 after a diagnostic. */
int model_input_text(ModelInput *in, const char *text, const char *const *weights, int n_weights, Diag *d);
/* Reads the files not read yet; -1 after a diagnostic naming the file. */
int model_input_read(ModelInput *in, Diag *d);
/* Frees what in holds, also after a failure. */
void model_input_free(ModelInput *in);
/* The model parsed and verified, or imported with binds (ONNX only), its weights
 * appended to weights: those it came with, then its weights files'. The graph points
 * into in, which must outlive it. NULL after diagnostics. */
Graph *model_input_parse(const ModelInput *in, const OnnxBind *binds, int n_binds, TensorList *weights,
                         Diag *d);

/* The largest file kiln reads: this machine's memory, at most 1 TiB (files are read
 * whole, and a sparse file of a terabyte costs its maker nothing). */
uint64_t file_size_limit(void);
/* Reads a whole regular file (anything else is refused unread); -1 after a diagnostic naming it. */
int read_file_bytes(const char *path, unsigned char **buf, size_t *len, Diag *d);
/* "a directory", "a FIFO", ... for a message about a file of the wrong kind. */
const char *file_kind(unsigned mode);
/* Opens rel, a relative path, read-only under the directory dir, refusing an absolute path,
 * a ".." component, a symbolic link anywhere in it and a last component that is not a
 * regular file. Returns the fd, or -1 with errno set and, for a refusal, *why saying why. */
int open_beneath(const char *dir, const char *rel, const char **why);
/* Writes via a temporary file renamed into place; -1 after a diagnostic. */
int write_file_atomic(const char *path, const void *buf, size_t len, Diag *d);
/* The same, the file's bytes the n parts bufs[i][0..lens[i]) one after another. */
int write_parts_atomic(const char *path, int n, const void *const *bufs, const size_t *lens, Diag *d);
/* write(2) until all len bytes are written (EINTR retried); 0, or -1 with errno. */
int write_fully(int fd, const void *buf, size_t len);

#endif
