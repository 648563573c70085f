/* Text from a model in generated C and CUDA: names are data, never code.
 *
 * A model names itself, its values and (through ONNX) its nodes with any bytes it
 * likes. Generated code refers to a value only by value_name's identifier, made of
 * [A-Za-z0-9_] alone; wherever the original text appears (the names the ABI
 * exposes, the profile's tables, the comments that say what a kernel computes),
 * it goes through one of the two functions here, which escape it so that it can
 * neither end its literal or comment early nor start a line of its own:
 *   - c_string writes the contents of a string literal: `"` and `\` escaped, every
 *     byte outside printable ASCII as a three-digit octal escape (so that a digit
 *     after it cannot join it), and `??` as `?\?`, which no trigraph can read;
 *   - c_comment writes a whole comment: the same escapes, plus `*` before `/` and
 *     `/` before `*` written `*\/` and `/\*`, so the text holds neither the end of
 *     the comment nor the start of a nested one. A comment is one line.
 * The escapes are the same in both, so a reader of the comment can tell which
 * bytes a name had. */
#include "codegen.h"

#include <stdarg.h>

/* How byte s[0] of text is written: "" as it is, else its escape (in buf). */
static const char *escape_of(const char *s, bool comment, char buf[8]) {
    unsigned char c = (unsigned char)s[0];
    char next = s[1];
    if (c == '"' || c == '\\')
        snprintf(buf, 8, "\\%c", c);
    else if (c < 32 || c > 126)
        snprintf(buf, 8, "\\%03o", c);
    else if (c == '?' && next == '?')
        snprintf(buf, 8, "?\\");
    else if (comment && ((c == '*' && next == '/') || (c == '/' && next == '*')))
        snprintf(buf, 8, "%c\\", c);
    else
        buf[0] = 0;
    return buf;
}

/* Appends text escaped, the bytes that need no escape a run at a time (a CUDA
 * model's whole kernel source goes through here). */
static void put_escaped(Str *out, const char *text, bool comment) {
    char buf[8];
    const char *run = text;
    for (const char *s = text; *s; s++)
        if (*escape_of(s, comment, buf)) {
            str_printf(out, "%.*s%s", (int)(s - run), run, buf);
            run = s + 1;
        }
    str_printf(out, "%s", run);
}

void c_string(Str *out, const char *s) {
    put_escaped(out, s, false);
}

void c_comment(Str *out, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *text = n >= 0 ? ir_malloc((size_t)n + 1) : NULL;
    if (!text) {
        out->oom = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(text, (size_t)n + 1, fmt, ap);
    va_end(ap);
    str_printf(out, "/* ");
    put_escaped(out, text, true);
    str_printf(out, " */");
    ir_free(text);
}
