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

/* Reads a whole binary file; -1 after a diagnostic naming it. */
int read_file_bytes(const char *path, unsigned char **buf, size_t *len, Diag *d);
/* Writes via a temporary file renamed into place; -1 after a diagnostic. */
int write_file_atomic(const char *path, const void *buf, size_t len, Diag *d);
/* Writes n files all or nothing: each goes to a temporary file beside it, and the
 * temporaries are renamed into place only once all are written. */
int write_files_atomic(int n, const char *const *paths, const void *const *bufs, const size_t *lens, Diag *d);

#endif
