/* Source files: read whole into memory, NUL-terminated, for the lexer and for the
 * diagnostics that show a line of them. */
#include "frontend.h"

#include <errno.h>
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
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        diag_error(d, (Loc){0}, "cannot open '%s': %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = ir_malloc(cap);
    while (buf) {
        len += fread(buf + len, 1, cap - len - 1, fp);
        if (len < cap - 1)
            break;
        char *bigger = ir_realloc(buf, cap * 2);
        if (!bigger)
            ir_free(buf);
        buf = bigger;
        cap *= 2;
    }
    bool failed = ferror(fp);
    fclose(fp);
    SrcFile *f = buf ? ir_calloc(1, sizeof *f) : NULL;
    char *name = f ? ir_strdup(path) : NULL;
    if (!name || failed) {
        diag_error(d, (Loc){0}, failed ? "cannot read '%s'" : "out of memory reading '%s'", path);
        ir_free(buf), ir_free(f), ir_free(name);
        return NULL;
    }
    buf[len] = 0;
    *f = (SrcFile){name, buf, len};
    return f;
}

void srcfile_free(SrcFile *f) {
    if (!f)
        return;
    ir_free((char *)f->name);
    ir_free((char *)f->text);
    ir_free(f);
}
