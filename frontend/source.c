/* Source files: read whole into memory, NUL-terminated, for the lexer and for the
 * diagnostics that show a line of them. A model file is read like any other input
 * (read_file_bytes): a regular file, so /dev/zero or a FIFO is an error, not a hang. */
#include "frontend.h"

#include <string.h>

SrcFile *srcfile_from_string(const char *name, const char *text) {
    SrcFile *f = ir_calloc(1, sizeof *f);
    char *n = ir_strdup(name), *t = ir_strdup(text);
    if (!f || !n || !t) {
        ir_free(f), ir_free(n), ir_free(t);
        return NULL;
    }
    *f = (SrcFile){n, t, strlen(t)};
    return f;
}

SrcFile *srcfile_read(const char *path, Diag *d) {
    unsigned char *bytes;
    size_t len;
    if (read_file_bytes(path, &bytes, &len, d) != 0)
        return NULL;
    SrcFile *f = ir_calloc(1, sizeof *f);
    char *name = ir_strdup(path), *text = ir_malloc(len + 1);
    if (!f || !name || !text) {
        diag_error(d, (Loc){0}, "out of memory reading '%s'", path);
        ir_free(bytes), ir_free(f), ir_free(name), ir_free(text);
        return NULL;
    }
    memcpy(text, bytes, len);
    text[len] = 0;
    ir_free(bytes);
    *f = (SrcFile){name, text, len};
    return f;
}

void srcfile_free(SrcFile *f) {
    if (!f)
        return;
    ir_free((char *)f->name);
    ir_free((char *)f->text);
    ir_free(f);
}
