/* Types, tensors, and the shortest float formatting the printer relies on. */
#include "ir.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *dtype_name(DType t) {
    switch (t) {
    case DT_F32: return "f32";
    case DT_F16: return "f16";
    case DT_BF16: return "bf16";
    case DT_I64: return "i64";
    case DT_I32: return "i32";
    case DT_BOOL: return "bool";
    }
    return "?";
}

int dtype_lookup(const char *s, size_t len) {
    for (int t = DT_F32; t <= DT_BOOL; t++)
        if (strlen(dtype_name((DType)t)) == len && memcmp(dtype_name((DType)t), s, len) == 0)
            return t;
    return -1;
}

int64_t dtype_size(DType t) {
    switch (t) {
    case DT_F16:
    case DT_BF16: return 2;
    case DT_I64: return 8;
    case DT_BOOL: return 1;
    default: return 4;
    }
}

bool dtype_is_int(DType t) {
    return t == DT_I64 || t == DT_I32;
}

int64_t type_numel(const Type *t) {
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++)
        n *= t->dims[i];
    return n;
}

bool type_equal(const Type *a, const Type *b) {
    if (a->dtype != b->dtype || a->rank != b->rank)
        return false;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i])
            return false;
    return a->sym_mult == b->sym_mult;
}

char *type_str(const Type *t, char *buf, size_t n) {
    size_t len = (size_t)snprintf(buf, n, "%s[", dtype_name(t->dtype));
    for (int i = 0; i < t->rank && len < n; i++)
        if (i == 0 && t->sym && t->sym_mult != 1)
            len += (size_t)snprintf(buf + len, n - len, "%s*%lld", t->sym, (long long)t->sym_mult);
        else if (i == 0 && t->sym)
            len += (size_t)snprintf(buf + len, n - len, "%s", t->sym);
        else
            len += (size_t)snprintf(buf + len, n - len, "%s%lld", i ? ", " : "", (long long)t->dims[i]);
    if (len < n)
        snprintf(buf + len, n - len, "]");
    return buf;
}

Type type_make(int rank, const int64_t *dims) {
    Type t = {DT_F32, rank, {0}, NULL, 0};
    for (int i = 0; i < rank; i++)
        t.dims[i] = dims[i];
    return t;
}

Type type_at(const Type *t, int64_t n) {
    Type r = *t;
    if (t->sym)
        r.dims[0] = t->sym_mult * n;
    r.sym = NULL;
    r.sym_mult = 0;
    return r;
}

bool type_admits(const Type *want, const Type *given, int64_t *size) {
    *size = 0;
    if (!want->sym)
        return type_equal(want, given);
    if (given->dtype != want->dtype || given->rank != want->rank || given->sym)
        return false;
    for (int i = 1; i < want->rank; i++)
        if (given->dims[i] != want->dims[i])
            return false;
    int64_t mult = want->sym_mult;
    if (given->dims[0] % mult || given->dims[0] > want->dims[0] || given->dims[0] < mult)
        return false;
    *size = given->dims[0] / mult;
    return true;
}

Tensor *tensor_new(const Type *t) {
    Tensor *r = ir_malloc(sizeof *r);
    if (!r)
        return NULL;
    r->type = *t; /* a tensor holds one size of a symbolic type: its own */
    r->type.sym = NULL;
    r->type.sym_mult = 0;
    r->bytes = ir_calloc((size_t)type_numel(t), (size_t)dtype_size(t->dtype));
    if (!r->data) {
        ir_free(r);
        return NULL;
    }
    return r;
}

Tensor *tensor_clone(const Tensor *t) {
    Tensor *r = tensor_new(&t->type);
    if (r)
        memcpy(r->bytes, t->bytes, (size_t)(dtype_size(t->type.dtype) * type_numel(&t->type)));
    return r;
}

void tensor_free(Tensor *t) {
    if (t) {
        ir_free(t->bytes);
        ir_free(t);
    }
}

int64_t tensor_int(const Tensor *t, int64_t i) {
    switch (t->type.dtype) {
    case DT_I64: return t->i64[i];
    case DT_I32: return t->i32[i];
    case DT_BOOL: return t->b[i];
    default: KILN_ASSERT(!"not an integer tensor");
    }
    return 0;
}

double tensor_double(const Tensor *t, int64_t i) {
    return t->type.dtype == DT_F32 ? t->data[i] : (double)tensor_int(t, i);
}

/* "1e-05" -> "1e-5", "1e+20" -> "1e20": the exponent without padding. */
static void tidy_exponent(char *buf) {
    char *e = strchr(buf, 'e');
    if (!e)
        return;
    char *p = e + 1, *q = e + 1;
    if (*p == '+')
        p++;
    else if (*p == '-')
        *q++ = *p++;
    while (*p == '0' && p[1])
        p++;
    memmove(q, p, strlen(p) + 1);
}

/* The shortest %g text that reads back to v; an integer is written plainly when
 * that is no longer ("40", not "4e1"). */
static void shortest(double v, int max_prec, bool as_float, char *buf, size_t n) {
    if (isnan(v) || isinf(v)) {
        snprintf(buf, n, isnan(v) ? "nan" : v < 0 ? "-inf" : "inf");
        return;
    }
    for (int prec = 1; prec <= max_prec; prec++) {
        snprintf(buf, n, "%.*g", prec, v);
        double back = strtod(buf, NULL);
        if (as_float ? (float)back == (float)v : back == v)
            break;
    }
    tidy_exponent(buf);
    char plain[64];
    if (v == floor(v) && fabs(v) < 1e17 && strchr(buf, 'e')) {
        snprintf(plain, sizeof plain, "%.0f", v);
        if (strlen(plain) <= strlen(buf))
            snprintf(buf, n, "%s", plain);
    }
}

void format_double(double v, char *buf, size_t n) {
    shortest(v, 17, false, buf, n);
}
void format_float(float v, char *buf, size_t n) {
    shortest(v, 9, true, buf, n);
}
