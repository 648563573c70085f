/* Diagnostics: every error goes through here, and failed internal assertions.
 *
 * A located error prints `FILE:LINE:COL: error: MESSAGE`, the source line and a
 * caret under the column (a window of a long line); an error without a position prints `kiln: error: ...`.
 * Errors are returned (as -1), never exited from, and each has a kind (DiagKind):
 * the driver's exit status and libkiln's kiln_error follow from it.
 *
 * kiln runs inside other programs, so a failed KILN_ASSERT cannot end the process
 * either. It is recorded per thread, the first failure only (later ones are most
 * likely its consequences), and diag_take_assert, called wherever kiln hands a
 * result back, reports it as an internal error. The record is per thread because
 * libkiln compiles on many threads at once, each with a Diag of its own. */
#include "ir.h"

#include <stdarg.h>
#include <string.h>

void diag_init(Diag *d, FILE *out) {
    d->out = out ? out : stderr;
    d->errors = 0;
    d->warnings = 0;
    d->kind = DIAG_USER;
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

static int count_error(Diag *d, Loc loc, DiagKind kind, const char *fmt, va_list ap) {
    report(d, loc, "error", fmt, ap);
    if (d->errors++ == 0 || kind > d->kind)
        d->kind = kind;
    return -1;
}

int diag_error(Diag *d, Loc loc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    /* the format, not the message: a file named "out of memory" is no allocation failure */
    count_error(d, loc, strstr(fmt, "out of memory") ? DIAG_NO_MEMORY : DIAG_USER, fmt, ap);
    va_end(ap);
    return -1;
}

int diag_internal(Diag *d, Loc loc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    count_error(d, loc, DIAG_INTERNAL, fmt, ap);
    va_end(ap);
    return -1;
}

static int relay(Diag *d, DiagKind kind, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int relay(Diag *d, DiagKind kind, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    count_error(d, (Loc){0}, kind, fmt, ap);
    va_end(ap);
    return -1;
}

int diag_relay(Diag *d, DiagKind kind, const char *msg) {
    return relay(d, kind, "%s", msg);
}

/* ---- Failed assertions ---- */

_Thread_local long kiln_asserts_left = -1;

void ir_fail_assert_after(long n) {
    kiln_asserts_left = n;
}

static _Thread_local struct {
    const char *cond, *file; /* cond == NULL: no failure recorded */
    int line;
} failed_assert;

void kiln_assert_fail(const char *cond, const char *file, int line) {
#ifdef KILN_FUZZING
    /* the fuzzing build only: a crash is what makes libFuzzer keep the input */
    fprintf(stderr, "kiln: internal error: %s:%d: assertion '%s' failed (a bug in kiln)\n", file, line, cond);
    __builtin_trap();
#endif
    if (!failed_assert.cond) {
        failed_assert.cond = cond;
        failed_assert.file = file;
        failed_assert.line = line;
    }
}

int diag_take_assert(Diag *d) {
    if (!failed_assert.cond)
        return 0;
    diag_internal(d, (Loc){0}, "internal error: %s:%d: assertion '%s' failed (a bug in kiln)",
                  failed_assert.file, failed_assert.line, failed_assert.cond);
    failed_assert.cond = NULL;
    return -1;
}

void diag_warning(Diag *d, Loc loc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    d->warnings++;
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
