/* Diagnostics: every user error goes through here.
 *
 * A located error prints `FILE:LINE:COL: error: MESSAGE`, the source line and a
 * caret under the column (a window of a long line); an error without a position prints `kiln: error: ...`.
 * Errors are returned (as -1), never exited from. */
#include "ir.h"

#include <stdarg.h>
#include <string.h>

void diag_init(Diag *d, FILE *out) {
    d->out = out ? out : stderr;
    d->errors = 0;
    d->internal = 0;
}

/* The source line under a message, and a caret under the column. A line longer than
 * WINDOW bytes (generated or minified text can be megabytes long) is shown as the
 * WINDOW bytes around the column, with "..." where it was cut. */
enum { WINDOW = 100 };

static void show_line(FILE *out, Loc loc) {
    const char *p = loc.file->text;
    for (int line = 1; line < loc.line && *p; p++)
        if (*p == '\n')
            line++;
    const char *end = strchr(p, '\n');
    int len = end ? (int)(end - p) : (int)strlen(p);
    if (len > 0 && p[len - 1] == '\r')
        len--;
    int col = loc.col < 1 ? 1 : loc.col, from = 0, to = len;
    if (len > WINDOW) {
        from = col - 1 - WINDOW / 2;
        from = from < 0 ? 0 : from > len - WINDOW ? len - WINDOW : from;
        to = from + WINDOW;
    }
    const char *before = from > 0 ? "..." : "", *after = to < len ? "..." : "";
    fprintf(out, "%s%.*s%s\n", before, to - from, p + from, after);
    fputs(before, out);
    for (int i = from + 1; i < col; i++)
        fputc(i - 1 < len && p[i - 1] == '\t' ? '\t' : ' ', out);
    fputs("^\n", out);
}

static void report(Diag *d, Loc loc, const char *kind, const char *fmt, va_list ap) {
    if (loc.file)
        fprintf(d->out, "%s:%d:%d: %s: ", loc.file->name, loc.line, loc.col, kind);
    else
        fprintf(d->out, "kiln: %s: ", kind);
    vfprintf(d->out, fmt, ap);
    fputc('\n', d->out);
    if (loc.file && loc.file->text)
        show_line(d->out, loc);
}

static int count_error(Diag *d, Loc loc, bool internal, const char *fmt, va_list ap) {
    report(d, loc, "error", fmt, ap);
    d->errors++;
    d->internal += internal;
    return -1;
}

int diag_error(Diag *d, Loc loc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    count_error(d, loc, false, fmt, ap);
    va_end(ap);
    return -1;
}

int diag_internal(Diag *d, Loc loc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    count_error(d, loc, true, fmt, ap);
    va_end(ap);
    return -1;
}

int diag_relay(Diag *d, const char *msg) {
    return strstr(msg, "(a bug in kiln") ? diag_internal(d, (Loc){0}, "%s", msg)
                                         : diag_error(d, (Loc){0}, "%s", msg);
}

void diag_warning(Diag *d, Loc loc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    report(d, loc, "warning", fmt, ap);
    va_end(ap);
}

void diag_note(Diag *d, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("  note: ", d->out);
    vfprintf(d->out, fmt, ap);
    fputc('\n', d->out);
    va_end(ap);
}
