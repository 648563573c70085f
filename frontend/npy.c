/* NumPy .npy files: one tensor per file, the format kiln reads inputs from and
 * writes outputs to.
 *
 * A file is the magic "\x93NUMPY", a major and minor version byte, the header
 * length (2 bytes little-endian in version 1.0, 4 bytes in 2.0 and 3.0), the header,
 * then the raw data. The header is a Python dict literal such as
 * "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }" padded with spaces
 * and a final newline; it is parsed here by a small recursive-descent reader that
 * knows just the literals numpy writes (quoted strings, True/False, tuples of
 * integers), in any key order. Little-endian float32, int64, int32 and bool (one
 * byte, 0 or 1) in C order are accepted,
 * and the data must be exactly as long as the shape says.
 *
 * The writer produces version 1.0 byte for byte as numpy 1.24's np.save does,
 * including the spare spaces numpy leaves after the dict so the first dimension can
 * grow in place, and the padding that makes the header end on a 64-byte boundary.
 * The data is copied with memcpy, so it may sit unaligned in the buffer; kiln's
 * hosts are little-endian, so '<f4' bytes are floats as they stand. */
#include "frontend.h"

#include <stdlib.h>
#include <string.h>

#if defined(__BYTE_ORDER__)
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the .npy reader assumes a little-endian host");
#endif

static const char MAGIC[] = "\x93NUMPY";
enum { MAGIC_LEN = 6, ALIGN = 64, GROWTH_AXIS_MAX_DIGITS = 21 };

/* The header text being parsed, and what has been found in it. */
typedef struct {
    const char *name; /* the file, for messages */
    Diag *d;
    const char *start, *p, *end;
    const char *descr; /* the descr string (not NUL-terminated) */
    int descr_len;
    bool fortran;
    int rank;
    int64_t dims[KILN_MAX_RANK];
    bool have_descr, have_fortran, have_shape;
} Header;

static int bad_header(Header *h, const char *what) {
    return diag_error(h->d, (Loc){0}, "%s: malformed .npy header: %s (at byte %d of the header)", h->name,
                      what, (int)(h->p - h->start));
}

static void skip_space(Header *h) {
    while (h->p < h->end && (*h->p == ' ' || *h->p == '\t' || *h->p == '\n' || *h->p == '\r'))
        h->p++;
}

/* Skips space, then consumes c if it comes next. */
static bool eat(Header *h, char c) {
    skip_space(h);
    if (h->p < h->end && *h->p == c) {
        h->p++;
        return true;
    }
    return false;
}

/* A quoted string without escapes (numpy never writes any in these fields). */
static int parse_string(Header *h, const char **s, int *len) {
    skip_space(h);
    if (h->p >= h->end || (*h->p != '\'' && *h->p != '"'))
        return bad_header(h, "expected a quoted string");
    char quote = *h->p++;
    const char *begin = h->p;
    while (h->p < h->end && *h->p != quote && *h->p != '\\' && *h->p != '\n')
        h->p++;
    if (h->p >= h->end || *h->p != quote)
        return bad_header(h, "unterminated or escaped string");
    *s = begin;
    *len = (int)(h->p - begin);
    h->p++;
    return 0;
}

static bool is_word_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

static int parse_bool(Header *h, bool *v) {
    skip_space(h);
    const char *w = h->p;
    while (h->p < h->end && is_word_char(*h->p))
        h->p++;
    size_t n = (size_t)(h->p - w);
    if (n == 4 && memcmp(w, "True", 4) == 0)
        *v = true;
    else if (n == 5 && memcmp(w, "False", 5) == 0)
        *v = false;
    else {
        h->p = w;
        return bad_header(h, "fortran_order is not True or False");
    }
    return 0;
}

/* An optionally negative decimal integer; negative values are kept so that the
 * shape check can report them. */
static int parse_int(Header *h, int64_t *v) {
    skip_space(h);
    bool neg = h->p < h->end && *h->p == '-';
    if (neg)
        h->p++;
    if (h->p >= h->end || *h->p < '0' || *h->p > '9')
        return bad_header(h, "expected an integer in the shape");
    int64_t x = 0;
    for (; h->p < h->end && *h->p >= '0' && *h->p <= '9'; h->p++) {
        if (x > (INT64_MAX - 9) / 10)
            return bad_header(h, "shape dimension is too large");
        x = x * 10 + (*h->p - '0');
    }
    *v = neg ? -x : x;
    return 0;
}

/* shape: '(' [int {',' int} [',']] ')' */
static int parse_shape(Header *h) {
    if (!eat(h, '('))
        return bad_header(h, "shape is not a tuple");
    h->rank = 0;
    while (!eat(h, ')')) {
        int64_t dim = 0;
        if (parse_int(h, &dim) != 0)
            return -1;
        if (h->rank == KILN_MAX_RANK)
            return diag_error(h->d, (Loc){0},
                              "%s: the shape has more than %d dimensions (kiln's largest rank)", h->name,
                              KILN_MAX_RANK);
        h->dims[h->rank++] = dim;
        if (eat(h, ')'))
            break;
        if (!eat(h, ','))
            return bad_header(h, "expected ',' or ')' in the shape");
    }
    return 0;
}

static int parse_entry(Header *h) {
    const char *key;
    int len;
    if (parse_string(h, &key, &len) != 0)
        return -1;
    if (!eat(h, ':'))
        return bad_header(h, "expected ':' after a key");
    bool *seen = len == 5 && memcmp(key, "descr", 5) == 0             ? &h->have_descr
                 : len == 13 && memcmp(key, "fortran_order", 13) == 0 ? &h->have_fortran
                 : len == 5 && memcmp(key, "shape", 5) == 0           ? &h->have_shape
                                                                      : NULL;
    if (!seen)
        return diag_error(h->d, (Loc){0}, "%s: unexpected key '%.*s' in the .npy header", h->name, len, key);
    if (*seen)
        return diag_error(h->d, (Loc){0}, "%s: key '%.*s' appears twice in the .npy header", h->name, len,
                          key);
    *seen = true;
    if (seen == &h->have_descr)
        return parse_string(h, &h->descr, &h->descr_len);
    if (seen == &h->have_fortran)
        return parse_bool(h, &h->fortran);
    return parse_shape(h);
}

/* dict: '{' [entry {',' entry} [',']] '}', then only padding. */
static int parse_dict(Header *h) {
    if (!eat(h, '{'))
        return bad_header(h, "expected '{'");
    while (!eat(h, '}')) {
        if (parse_entry(h) != 0)
            return -1;
        if (eat(h, '}'))
            break;
        if (!eat(h, ','))
            return bad_header(h, "expected ',' or '}'");
    }
    skip_space(h);
    if (h->p != h->end)
        return bad_header(h, "unexpected text after the dict");
    if (!h->have_descr || !h->have_fortran || !h->have_shape)
        return diag_error(h->d, (Loc){0}, "%s: the .npy header lacks '%s'", h->name,
                          !h->have_descr     ? "descr"
                          : !h->have_fortran ? "fortran_order"
                                             : "shape");
    return 0;
}

/* numpy's descr of each dtype kiln reads and writes (little-endian; bools a byte). */
static const struct {
    DType dtype;
    const char *descr;
} descrs[] = {{DT_F32, "<f4"}, {DT_I64, "<i8"}, {DT_I32, "<i4"}, {DT_BOOL, "|b1"}};

static const char *descr_of(DType t) {
    for (size_t i = 0; i < sizeof descrs / sizeof *descrs; i++)
        if (descrs[i].dtype == t)
            return descrs[i].descr;
    return "?";
}

/* The header's meaning: a dtype kiln reads, C order, a shape kiln can hold. Sets
 * *dtype and *numel. */
static int check_header(Header *h, DType *dtype, int64_t *numel) {
    size_t i = 0;
    while (i < sizeof descrs / sizeof *descrs &&
           !(h->descr_len == 3 && memcmp(h->descr, descrs[i].descr, 3) == 0))
        i++;
    if (i == sizeof descrs / sizeof *descrs)
        return diag_error(h->d, (Loc){0},
                          "%s: dtype '%.*s' is not supported (kiln reads little-endian '<f4', '<i8', '<i4' "
                          "and '|b1')",
                          h->name, h->descr_len, h->descr);
    *dtype = descrs[i].dtype;
    if (h->fortran)
        return diag_error(h->d, (Loc){0}, "%s: fortran_order arrays are not supported (kiln reads C order)",
                          h->name);
    *numel = 1;
    for (int k = 0; k < h->rank; k++) {
        if (h->dims[k] < 1)
            return diag_error(h->d, (Loc){0},
                              "%s: dimension %d of the shape is %lld (kiln tensors have no %s dimensions)",
                              h->name, k, (long long)h->dims[k], h->dims[k] == 0 ? "zero-size" : "negative");
        int64_t bytes;
        if (!ck_mul(*numel, h->dims[k], numel) || !ck_mul(*numel, 8, &bytes))
            return diag_error(h->d, (Loc){0}, "%s: the shape has too many elements", h->name);
    }
    return 0;
}

int npy_parse(const unsigned char *buf, size_t len, const char *name, Tensor **out, Diag *d) {
    *out = NULL;
    if (len < MAGIC_LEN || memcmp(buf, MAGIC, MAGIC_LEN) != 0)
        return diag_error(d, (Loc){0}, "%s: not a .npy file (bad magic)", name);
    if (len < MAGIC_LEN + 2)
        return diag_error(d, (Loc){0}, "%s: truncated header: the file ends after the magic", name);
    int major = buf[6], minor = buf[7];
    if (major < 1 || major > 3 || minor != 0)
        return diag_error(d, (Loc){0}, "%s: unsupported .npy format version %d.%d (kiln reads 1.0 to 3.0)",
                          name, major, minor);
    size_t size_bytes = major == 1 ? 2 : 4, prefix = MAGIC_LEN + 2 + size_bytes;
    if (len < prefix)
        return diag_error(d, (Loc){0}, "%s: truncated header: the file ends inside the header length", name);
    size_t hlen = buf[8] | (size_t)buf[9] << 8;
    if (size_bytes == 4)
        hlen |= (size_t)buf[10] << 16 | (size_t)buf[11] << 24;
    if (hlen > len - prefix)
        return diag_error(d, (Loc){0}, "%s: truncated header: the header is %zu bytes, but only %zu follow",
                          name, hlen, len - prefix);

    const char *text = (const char *)buf + prefix;
    Header h = {.name = name, .d = d, .start = text, .p = text, .end = text + hlen};
    int64_t numel = 0;
    DType dtype = DT_F32;
    if (parse_dict(&h) != 0 || check_header(&h, &dtype, &numel) != 0)
        return -1;
    int64_t bytes = 0;
    if (!ck_mul(numel, dtype_size(dtype), &bytes) || (uint64_t)bytes > SIZE_MAX)
        return diag_error(d, (Loc){0}, "%s: the shape has too many elements", name);
    size_t want = (size_t)bytes, got = len - prefix - hlen;
    if (got < want)
        return diag_error(d, (Loc){0}, "%s: truncated data: expected %zu bytes, got %zu", name, want, got);
    if (got > want)
        return diag_error(d, (Loc){0}, "%s: trailing data: expected %zu bytes, got %zu", name, want, got);

    Type t = type_make(h.rank, h.dims);
    t.dtype = dtype;
    Tensor *r = tensor_new(&t);
    if (!r)
        return diag_error(d, (Loc){0}, "%s: out of memory", name);
    memcpy(r->bytes, buf + prefix + hlen, want);
    for (int64_t i = 0; dtype == DT_BOOL && i < numel; i++)
        if (r->b[i] > 1) {
            tensor_free(r);
            return diag_error(d, (Loc){0}, "%s: element %lld is %d, not a bool (0 or 1)", name, (long long)i,
                              buf[prefix + hlen + (size_t)i]);
        }
    *out = r;
    return 0;
}

int npy_read(const char *path, Tensor **out, Diag *d) {
    unsigned char *buf;
    size_t len;
    *out = NULL;
    if (read_file_bytes(path, &buf, &len, d) != 0)
        return -1;
    int rc = npy_parse(buf, len, path, out, d);
    ir_free(buf);
    return rc;
}

/* The header numpy writes for t, padding and final newline included; returns its length. */
static size_t format_header(const Type *t, char *buf, size_t cap) {
    char shape[KILN_MAX_RANK * 24 + 8];
    size_t n = (size_t)snprintf(shape, sizeof shape, "(");
    for (int i = 0; i < t->rank; i++)
        n += (size_t)snprintf(shape + n, sizeof shape - n, "%s%lld", i ? ", " : "", (long long)t->dims[i]);
    snprintf(shape + n, sizeof shape - n, t->rank == 1 ? ",)" : ")");

    size_t len =
        (size_t)snprintf(buf + MAGIC_LEN + 4, cap - MAGIC_LEN - 4,
                         "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr_of(t->dtype), shape);
    if (t->rank > 0) {
        char first[24];
        int spare = GROWTH_AXIS_MAX_DIGITS - snprintf(first, sizeof first, "%lld", (long long)t->dims[0]);
        for (int i = 0; i < spare; i++)
            buf[MAGIC_LEN + 4 + len++] = ' ';
    }
    /* numpy pads by 1 to ALIGN spaces: a header already aligned gets a whole ALIGN more */
    size_t pad = ALIGN - (MAGIC_LEN + 4 + len + 1) % ALIGN;
    memset(buf + MAGIC_LEN + 4 + len, ' ', pad);
    len += pad;
    buf[MAGIC_LEN + 4 + len++] = '\n';
    memcpy(buf, MAGIC, MAGIC_LEN);
    buf[6] = 1;
    buf[7] = 0;
    buf[8] = (char)(len & 0xff);
    buf[9] = (char)(len >> 8);
    return MAGIC_LEN + 4 + len;
}

int npy_encode(const Tensor *t, unsigned char **buf, size_t *len) {
    char header[1024];
    size_t hlen = format_header(&t->type, header, sizeof header);
    size_t bytes = (size_t)(type_numel(&t->type) * dtype_size(t->type.dtype));
    *buf = ir_malloc(hlen + bytes);
    if (!*buf)
        return -1;
    memcpy(*buf, header, hlen);
    memcpy(*buf + hlen, t->bytes, bytes);
    *len = hlen + bytes;
    return 0;
}

int npy_write(const char *path, const Tensor *t, Diag *d) {
    unsigned char *buf;
    size_t len;
    if (npy_encode(t, &buf, &len))
        return diag_error(d, (Loc){0}, "out of memory writing '%s'", path);
    int rc = write_file_atomic(path, buf, len, d);
    ir_free(buf);
    return rc;
}
