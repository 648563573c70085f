/* ONNX TensorProto data: initializers, Constant values, conformance-test .pb files.
 *
 * A tensor's elements are in exactly one place: raw_data (little-endian bytes), a
 * typed repeated field (float_data; int32_data for every integer type of 32 bits or
 * less, bool and float16; int64_data; double_data; uint64_data for uint32 and
 * uint64), or an external file named by the external_data entries `location`,
 * `offset` and `length`, relative to the model's directory. The shape is checked
 * first (rank at most kiln's, dims >= 0, the element count within kiln's limit), then
 * the data's length against it, before anything is allocated from the data. An
 * external location is opened with open_beneath, one component at a time under the
 * model's directory: an absolute path, a ".." component or a symbolic link anywhere
 * in it is refused (the model file decides what is read, so it must not reach
 * /etc/passwd), and offset + length must lie inside the file. Integer dtypes keep their exact values beside
 * the f32 ones. */
#include "onnx_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__)
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the ONNX reader assumes a little-endian host");
#endif

static void *pb_alloc(void *ctx, size_t n) {
    void *p = ir_malloc(n ? n : 1);
    if (!p)
        *(bool *)ctx = true;
    return p;
}

static void pb_free(void *ctx, void *p) {
    (void)ctx;
    ir_free(p);
}

ProtobufCAllocator onnx_allocator(bool *oom) {
    return (ProtobufCAllocator){pb_alloc, pb_free, oom};
}

typedef enum { EL_NONE, EL_F32, EL_F64, EL_F16, EL_BF16, EL_SIGNED, EL_UNSIGNED, EL_BOOL } ElemKind;

typedef struct {
    const char *name;
    ElemKind kind;
    int size; /* bytes in raw_data */
} DTypeInfo;

static DTypeInfo dtype_info(int32_t t) {
    switch (t) {
    case 1: return (DTypeInfo){"FLOAT", EL_F32, 4};
    case 2: return (DTypeInfo){"UINT8", EL_UNSIGNED, 1};
    case 3: return (DTypeInfo){"INT8", EL_SIGNED, 1};
    case 4: return (DTypeInfo){"UINT16", EL_UNSIGNED, 2};
    case 5: return (DTypeInfo){"INT16", EL_SIGNED, 2};
    case 6: return (DTypeInfo){"INT32", EL_SIGNED, 4};
    case 7: return (DTypeInfo){"INT64", EL_SIGNED, 8};
    case 8: return (DTypeInfo){"STRING", EL_NONE, 0};
    case 9: return (DTypeInfo){"BOOL", EL_BOOL, 1};
    case 10: return (DTypeInfo){"FLOAT16", EL_F16, 2};
    case 11: return (DTypeInfo){"DOUBLE", EL_F64, 8};
    case 12: return (DTypeInfo){"UINT32", EL_UNSIGNED, 4};
    case 13: return (DTypeInfo){"UINT64", EL_UNSIGNED, 8};
    case 14: return (DTypeInfo){"COMPLEX64", EL_NONE, 0};
    case 15: return (DTypeInfo){"COMPLEX128", EL_NONE, 0};
    case 16: return (DTypeInfo){"BFLOAT16", EL_BF16, 2};
    default: return (DTypeInfo){"UNDEFINED", EL_NONE, 0};
    }
}

int onnx_kiln_dtype(int32_t t) {
    switch (t) {
    case 1: return DT_F32;
    case 6: return DT_I32;
    case 7: return DT_I64;
    case 9: return DT_BOOL;
    default: return -1;
    }
}

const char *onnx_dtype_name(int32_t dtype) {
    return dtype_info(dtype).name;
}

static float half_to_float(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0    ? ldexpf((float)m, -24)
              : e == 31 ? (m ? NAN : INFINITY)
                        : ldexpf((float)(m | 1024), e - 25);
    return h & 0x8000 ? -v : v;
}

static float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Element i of little-endian bytes p of the dtype, into c. */
static void store_raw(OConst *c, const DTypeInfo *di, const unsigned char *p, int64_t i) {
    const unsigned char *e = p + i * di->size;
    uint64_t u = 0;
    for (int k = 0; k < di->size; k++)
        u |= (uint64_t)e[k] << (8 * k);
    switch (di->kind) {
    case EL_F32: {
        uint32_t b = (uint32_t)u;
        memcpy(&c->f[i], &b, 4);
        break;
    }
    case EL_F64: {
        double x;
        memcpy(&x, &u, 8);
        c->f[i] = (float)x;
        break;
    }
    case EL_F16: c->f[i] = half_to_float((uint16_t)u); break;
    case EL_BF16: c->f[i] = bf16_to_float((uint16_t)u); break;
    case EL_SIGNED: {
        int shift = 64 - 8 * di->size;
        int64_t s = (int64_t)(u << shift) >> shift;
        c->ints[i] = s;
        break;
    }
    case EL_UNSIGNED: c->ints[i] = u > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)u; break;
    case EL_BOOL: c->ints[i] = u != 0; break;
    case EL_NONE: break;
    }
}

/* The external file's bytes [offset, offset + len) into buf. */
static int read_external(Importer *im, const Onnx__TensorProto *t, const char *what, size_t want,
                         unsigned char **buf) {
    const char *location = NULL;
    int64_t offset = 0, length = -1;
    for (size_t k = 0; k < t->n_external_data; k++) {
        const Onnx__StringStringEntryProto *e = t->external_data[k];
        const char *key = e->key ? e->key : "", *val = e->value ? e->value : "";
        char *end;
        if (strcmp(key, "location") == 0)
            location = val;
        else if (strcmp(key, "offset") == 0 || strcmp(key, "length") == 0) {
            errno = 0;
            long long v = strtoll(val, &end, 10);
            if (errno || *end || end == val || v < 0)
                return diag_error(im->d, (Loc){0},
                                  "%s: %s: external data %s '%s' is not a non-negative integer", im->file,
                                  what, key, val);
            *(key[0] == 'o' ? &offset : &length) = v;
        }
    }
    if (!location || !*location)
        return diag_error(im->d, (Loc){0}, "%s: %s: external data without a 'location'", im->file, what);
    if (!im->dir)
        return diag_error(im->d, (Loc){0},
                          "%s: %s: external data '%s' cannot be read (the model is not a file)", im->file,
                          what, location);
    if (length >= 0 && (uint64_t)length != want)
        return diag_error(im->d, (Loc){0},
                          "%s: %s: external data length %lld does not match its shape (%zu bytes)", im->file,
                          what, (long long)length, want);
    const char *why;
    int fd = open_beneath(im->dir, location, &why);
    struct stat st;
    int rc = 0;
    if (fd < 0 && why)
        rc = diag_error(im->d, (Loc){0},
                        "%s: %s: external data location '%s' is refused: %s (it must name a regular file "
                        "inside the model's directory '%s', with no '..' and no symbolic link)",
                        im->file, what, location, why, im->dir);
    else if (fd < 0)
        rc = diag_error(im->d, (Loc){0}, "%s: %s: cannot open external data '%s' in '%s': %s", im->file, what,
                        location, im->dir, strerror(errno));
    else if (fstat(fd, &st) != 0)
        rc = diag_error(im->d, (Loc){0}, "%s: %s: cannot read external data '%s': %s", im->file, what,
                        location, strerror(errno));
    else if ((uint64_t)offset > (uint64_t)st.st_size || want > (uint64_t)st.st_size - (uint64_t)offset)
        rc = diag_error(im->d, (Loc){0},
                        "%s: %s: external data '%s' is %lld bytes, too short for %zu bytes at offset %lld",
                        im->file, what, location, (long long)st.st_size, want, (long long)offset);
    else if (!(*buf = arena_alloc(&im->arena, want ? want : 1)))
        rc = diag_error(im->d, (Loc){0}, "out of memory");
    for (size_t got = 0; !rc && got < want;) {
        ssize_t r = pread(fd, *buf + got, want - got, (off_t)(offset + (int64_t)got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            rc = diag_error(im->d, (Loc){0}, "%s: %s: cannot read external data '%s'", im->file, what,
                            location);
        else
            got += (size_t)r;
    }
    if (fd >= 0)
        close(fd);
    return rc;
}

int onnx_tensor_decode(Importer *im, const Onnx__TensorProto *t, const char *what, OConst **out) {
    DTypeInfo di = dtype_info(t->data_type);
    if (di.kind == EL_NONE)
        return diag_error(im->d, (Loc){0}, "%s: %s has dtype %s, which kiln does not read", im->file, what,
                          di.name);
    if (t->n_dims > KILN_MAX_RANK)
        return diag_error(im->d, (Loc){0}, "%s: %s has rank %zu (kiln's largest is %d)", im->file, what,
                          t->n_dims, KILN_MAX_RANK);
    int64_t numel = 1;
    for (size_t k = 0; k < t->n_dims; k++) {
        if (t->dims[k] < 0)
            return diag_error(im->d, (Loc){0}, "%s: %s has a negative dim (%lld)", im->file, what,
                              (long long)t->dims[k]);
        if (!ck_mul(numel, t->dims[k], &numel) || numel > KILN_MAX_NUMEL)
            return diag_error(im->d, (Loc){0}, "%s: %s has too many elements", im->file, what);
    }
    bool is_int = di.kind == EL_SIGNED || di.kind == EL_UNSIGNED || di.kind == EL_BOOL;
    int64_t nbytes = 0;
    if (!ck_mul(numel, di.size, &nbytes) || (uint64_t)nbytes > SIZE_MAX)
        return diag_error(im->d, (Loc){0}, "%s: %s has too many elements", im->file, what);
    size_t bytes = (size_t)nbytes;
    bool external = t->has_data_location && t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
    const unsigned char *raw = NULL;
    size_t have = 0;
    const char *field = "raw_data";
    /* The data's size is checked against the shape before anything the shape sizes
     * is allocated: a hostile shape with no data behind it allocates nothing. */
    if (external) {
        unsigned char *buf = NULL;
        if (read_external(im, t, what, bytes, &buf))
            return -1;
        raw = buf;
    } else if (t->has_raw_data) {
        if (t->raw_data.len != bytes)
            return diag_error(im->d, (Loc){0},
                              "%s: %s: raw_data holds %zu bytes, its shape and dtype %s need %zu", im->file,
                              what, t->raw_data.len, di.name, bytes);
        raw = t->raw_data.data;
    } else {
        switch (di.kind) {
        case EL_F32: have = t->n_float_data, field = "float_data"; break;
        case EL_F64: have = t->n_double_data, field = "double_data"; break;
        case EL_SIGNED:
            if (t->data_type == 7)
                have = t->n_int64_data, field = "int64_data";
            else
                have = t->n_int32_data, field = "int32_data";
            break;
        case EL_UNSIGNED:
            if (t->data_type == 12 || t->data_type == 13)
                have = t->n_uint64_data, field = "uint64_data";
            else
                have = t->n_int32_data, field = "int32_data";
            break;
        default: have = t->n_int32_data, field = "int32_data"; break;
        }
        if (have != (size_t)numel)
            return diag_error(im->d, (Loc){0}, "%s: %s: %s holds %zu elements, its shape needs %lld",
                              im->file, what, field, have, (long long)numel);
    }
    OConst *c = oconst_new(im, is_int, (int)t->n_dims, t->dims);
    if (!c)
        return diag_error(im->d, (Loc){0}, "out of memory");
    c->dtype = di.kind == EL_BOOL ? DT_BOOL : t->data_type == 6 ? DT_I32 : is_int ? DT_I64 : DT_F32;
    if (raw) {
        for (int64_t i = 0; i < numel; i++)
            store_raw(c, &di, raw, i);
    } else {
        for (int64_t i = 0; i < numel; i++) {
            switch (di.kind) {
            case EL_F32: c->f[i] = t->float_data[i]; break;
            case EL_F64: c->f[i] = (float)t->double_data[i]; break;
            case EL_F16: c->f[i] = half_to_float((uint16_t)t->int32_data[i]); break;
            case EL_BF16: c->f[i] = bf16_to_float((uint16_t)t->int32_data[i]); break;
            case EL_SIGNED: c->ints[i] = t->data_type == 7 ? t->int64_data[i] : t->int32_data[i]; break;
            case EL_UNSIGNED:
                c->ints[i] =
                    t->data_type == 12 || t->data_type == 13
                        ? (t->uint64_data[i] > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)t->uint64_data[i])
                        : (int64_t)(uint32_t)t->int32_data[i];
                break;
            case EL_BOOL: c->ints[i] = t->int32_data[i] != 0; break;
            case EL_NONE: break;
            }
        }
    }
    if (is_int)
        for (int64_t i = 0; i < numel; i++)
            c->f[i] = (float)c->ints[i];
    *out = c;
    return 0;
}

int onnx_read_tensor(const char *path, Tensor **out, char **name, Diag *d) {
    *out = NULL;
    if (name)
        *name = NULL;
    unsigned char *buf;
    size_t len;
    if (read_file_bytes(path, &buf, &len, d))
        return -1;
    Importer im = {.file = path, .d = d};
    int rc = 0;
    bool oom = false;
    ProtobufCAllocator pa = onnx_allocator(&oom);
    Onnx__TensorProto *t = onnx__tensor_proto__unpack(&pa, len, buf);
    OConst *c = NULL;
    if (t && name && t->name && !(*name = ir_strdup(t->name)))
        rc = diag_error(d, (Loc){0}, "out of memory");
    if (!t && oom)
        rc = diag_error(d, (Loc){0}, "%s: out of memory reading the tensor", path);
    else if (!t)
        rc = diag_error(d, (Loc){0}, "%s: not an ONNX TensorProto (the protobuf is malformed or truncated)",
                        path);
    else if (!rc && !(rc = onnx_tensor_decode(&im, t, "the tensor", &c)) && c->numel == 0)
        rc = diag_error(d, (Loc){0}, "%s: the tensor has no elements (kiln's tensors have at least one)",
                        path);
    if (!rc && !(*out = oconst_tensor(c)))
        rc = diag_error(d, (Loc){0}, "out of memory");
    if (t)
        onnx__tensor_proto__free_unpacked(t, &pa);
    arena_free(&im.arena);
    ir_free(buf);
    return rc;
}
