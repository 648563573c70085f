/* safetensors files: named weights, the format of --weights and of the params a
 * --dump-dir stage writes.
 *
 * A file is an 8-byte little-endian header length N, N bytes of JSON, then the data
 * buffer. The JSON object maps each tensor's name to
 * {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, the offsets
 * counting from the start of the data buffer; a "__metadata__" entry (free-form
 * strings) is ignored. cJSON parses the header; every entry is then checked before
 * anything is allocated (F32, I64, I32 or BOOL, integer dims >= 1, offsets inside the buffer and
 * exactly as long as the shape), names are checked for duplicates within the file
 * and against the list being appended to by sorting them all, and only then are the
 * tensors copied out (memcpy, since the data may sit unaligned). A failure leaves
 * the list as it was.
 *
 * The writer follows the reference implementation: compact JSON, entries in the
 * list's order with the data packed in that order, the header padded with spaces
 * to a multiple of 8 bytes so the data buffer starts aligned. */
#include "frontend.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__BYTE_ORDER__)
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "the safetensors reader assumes a little-endian host");
#endif

/* The reference implementation's limit on the header. */
enum { MAX_HEADER = 100 * 1000 * 1000 };

/* One entry of the header, checked. */
typedef struct {
    const char *name;
    Type type;
    size_t begin;
} Entry;

/* A JSON number that is a whole number in [0, 2^53] (where doubles are exact). */
static bool get_count(const cJSON *j, int64_t *v) {
    if (!cJSON_IsNumber(j))
        return false;
    double x = j->valuedouble;
    if (!(x >= 0 && x <= 9007199254740992.0) || x != floor(x))
        return false;
    *v = (int64_t)x;
    return true;
}

/* The safetensors names of the dtypes kiln reads and writes. */
static const struct {
    DType dtype;
    const char *name;
} dtypes[] = {{DT_F32, "F32"}, {DT_I64, "I64"}, {DT_I32, "I32"}, {DT_BOOL, "BOOL"}};

static const char *dtype_text(DType t) {
    for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++)
        if (dtypes[i].dtype == t)
            return dtypes[i].name;
    return "?";
}

static int check_entry(const cJSON *e, const char *file, size_t data_len, Entry *out, Diag *d) {
    const char *name = e->string;
    if (!cJSON_IsObject(e))
        return diag_error(d, (Loc){0}, "%s: the entry for tensor '%s' is not a JSON object", file, name);
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *offsets = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dtype))
        return diag_error(d, (Loc){0}, "%s: tensor '%s': \"dtype\" is missing or not a string", file, name);
    size_t known = 0;
    while (known < sizeof dtypes / sizeof *dtypes && strcmp(dtype->valuestring, dtypes[known].name) != 0)
        known++;
    if (known == sizeof dtypes / sizeof *dtypes)
        return diag_error(d, (Loc){0}, "%s: tensor '%s' has dtype '%s' (kiln reads F32, I64, I32 and BOOL)",
                          file, name, dtype->valuestring);
    int64_t size = dtype_size(dtypes[known].dtype);
    if (!cJSON_IsArray(shape))
        return diag_error(d, (Loc){0}, "%s: tensor '%s': \"shape\" is missing or not an array", file, name);
    int rank = cJSON_GetArraySize(shape);
    if (rank > KILN_MAX_RANK)
        return diag_error(d, (Loc){0}, "%s: tensor '%s' has rank %d (kiln's largest is %d)", file, name, rank,
                          KILN_MAX_RANK);
    int64_t dims[KILN_MAX_RANK], numel = 1;
    for (int i = 0; i < rank; i++) {
        const cJSON *dim = cJSON_GetArrayItem(shape, i);
        if (!get_count(dim, &dims[i]) || dims[i] < 1)
            return diag_error(d, (Loc){0}, "%s: tensor '%s': shape entry %d is not an integer >= 1", file,
                              name, i);
        int64_t bytes;
        if (!ck_mul(numel, dims[i], &numel) || !ck_mul(numel, size, &bytes))
            return diag_error(d, (Loc){0}, "%s: tensor '%s': the shape has too many elements", file, name);
    }
    int64_t begin, end;
    if (!cJSON_IsArray(offsets) || cJSON_GetArraySize(offsets) != 2 ||
        !get_count(cJSON_GetArrayItem(offsets, 0), &begin) ||
        !get_count(cJSON_GetArrayItem(offsets, 1), &end))
        return diag_error(d, (Loc){0},
                          "%s: tensor '%s': \"data_offsets\" is missing or not a pair of integers >= 0", file,
                          name);
    if (begin > end)
        return diag_error(d, (Loc){0}, "%s: tensor '%s': data_offsets [%lld, %lld] end before they begin",
                          file, name, (long long)begin, (long long)end);
    if ((uint64_t)end > data_len)
        return diag_error(d, (Loc){0},
                          "%s: tensor '%s': data_offsets [%lld, %lld] fall outside the %zu-byte data buffer",
                          file, name, (long long)begin, (long long)end, data_len);
    if (end - begin != numel * size)
        return diag_error(
            d, (Loc){0},
            "%s: tensor '%s': data_offsets [%lld, %lld] span %lld bytes, but the shape needs %lld", file,
            name, (long long)begin, (long long)end, (long long)(end - begin), (long long)(numel * size));
    *out = (Entry){name, type_make(rank, dims), (size_t)begin};
    out->type.dtype = dtypes[known].dtype;
    return 0;
}

typedef struct {
    const char *name;
    bool in_file; /* from this file, rather than already in the list */
} NameRef;

static int compare_names(const void *a, const void *b) {
    return strcmp(((const NameRef *)a)->name, ((const NameRef *)b)->name);
}

/* Sorting finds every duplicate in n log n, which matters for a hostile file with
 * millions of entries. A pair both already in the list is not this file's fault. */
static int check_duplicates(const Entry *e, int n, const TensorList *out, const char *file, Diag *d) {
    int total = out->n + n;
    NameRef *refs = ir_malloc(sizeof *refs * (size_t)total);
    if (!refs)
        return diag_error(d, (Loc){0}, "%s: out of memory", file);
    for (int i = 0; i < out->n; i++)
        refs[i] = (NameRef){out->items[i].name, false};
    for (int i = 0; i < n; i++)
        refs[out->n + i] = (NameRef){e[i].name, true};
    qsort(refs, (size_t)total, sizeof *refs, compare_names);
    int rc = 0;
    for (int i = 1; i < total && !rc; i++)
        if ((refs[i - 1].in_file || refs[i].in_file) && strcmp(refs[i - 1].name, refs[i].name) == 0)
            rc = diag_error(d, (Loc){0}, "duplicate weight '%s' in %s", refs[i].name, file);
    ir_free(refs);
    return rc;
}

/* Checks every entry of the header, then copies the tensors out of data. */
static int read_entries(const cJSON *root, const unsigned char *data, size_t data_len, const char *file,
                        TensorList *out, Diag *d) {
    int n = 0;
    Entry *entries = ir_malloc(sizeof *entries * ((size_t)cJSON_GetArraySize(root) + 1));
    if (!entries)
        return diag_error(d, (Loc){0}, "%s: out of memory", file);
    int rc = 0;
    for (const cJSON *e = root->child; e && !rc; e = e->next)
        if (strcmp(e->string, "__metadata__") != 0)
            rc = check_entry(e, file, data_len, &entries[n++], d);
    if (!rc)
        rc = check_duplicates(entries, n, out, file, d);
    int old_n = out->n;
    for (int i = 0; i < n && !rc; i++) {
        Tensor *t = tensor_new(&entries[i].type);
        if (!t || tensors_add(out, entries[i].name, t) != 0) {
            rc = diag_error(d, (Loc){0}, "%s: out of memory", file);
            break;
        }
        size_t bytes = (size_t)(dtype_size(t->type.dtype) * type_numel(&t->type));
        memcpy(t->bytes, data + entries[i].begin, bytes);
        for (size_t k = 0; t->type.dtype == DT_BOOL && k < bytes && !rc; k++)
            if (t->b[k] > 1)
                rc = diag_error(d, (Loc){0}, "%s: tensor '%s': element %zu is %d, not a bool (0 or 1)", file,
                                entries[i].name, k, t->b[k]);
    }
    if (rc) {
        while (out->n > old_n) {
            out->n--;
            ir_free(out->items[out->n].name);
            tensor_free(out->items[out->n].tensor);
        }
    }
    ir_free(entries);
    return rc;
}

static bool all_space(const char *p, const char *end) {
    for (; p < end; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
            return false;
    return true;
}

int safetensors_parse(const unsigned char *buf, size_t len, const char *name, TensorList *out, Diag *d) {
    if (len < 8)
        return diag_error(d, (Loc){0},
                          "%s: not a safetensors file (%zu bytes, too short for the header length)", name,
                          len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | buf[i];
    if (n > MAX_HEADER)
        return diag_error(d, (Loc){0}, "%s: header length %llu is over the limit of %d bytes", name,
                          (unsigned long long)n, MAX_HEADER);
    if (n > len - 8)
        return diag_error(d, (Loc){0}, "%s: header length %llu runs past the end of the file (%zu bytes)",
                          name, (unsigned long long)n, len);

    const char *json = (const char *)buf + 8, *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, (size_t)n, &end, false);
    if (!root)
        return diag_error(d, (Loc){0}, "%s: the header is not valid JSON (near byte %d of it)", name,
                          end ? (int)(end - json) : 0);
    int rc;
    if (!all_space(end, json + n))
        rc = diag_error(d, (Loc){0}, "%s: the header has text after its JSON object", name);
    else if (!cJSON_IsObject(root))
        rc = diag_error(d, (Loc){0}, "%s: the header is not a JSON object", name);
    else
        rc = read_entries(root, buf + 8 + n, len - 8 - (size_t)n, name, out, d);
    cJSON_Delete(root);
    return rc;
}

int safetensors_read(const char *path, TensorList *out, Diag *d) {
    unsigned char *buf;
    size_t len;
    if (read_file_bytes(path, &buf, &len, d) != 0)
        return -1;
    int rc = safetensors_parse(buf, len, path, out, d);
    ir_free(buf);
    return rc;
}

static size_t tensor_bytes(const Tensor *t) {
    return (size_t)(dtype_size(t->type.dtype) * type_numel(&t->type));
}

/* {"NAME":{"dtype":"F32","shape":[...],"data_offsets":[b,e]},...} with the data packed in order. */
static char *header_json(const TensorList *l) {
    cJSON *root = cJSON_CreateObject();
    size_t offset = 0;
    for (int i = 0; root && i < l->n; i++) {
        const Type *t = &l->items[i].tensor->type;
        size_t bytes = (size_t)(dtype_size(t->dtype) * type_numel(t));
        cJSON *e = cJSON_AddObjectToObject(root, l->items[i].name);
        cJSON *shape = e && cJSON_AddStringToObject(e, "dtype", dtype_text(t->dtype))
                           ? cJSON_AddArrayToObject(e, "shape")
                           : NULL;
        bool ok = shape != NULL;
        for (int k = 0; ok && k < t->rank; k++)
            ok = cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->dims[k]));
        double range[2] = {(double)offset, (double)(offset + bytes)};
        if (!ok || !cJSON_AddItemToObject(e, "data_offsets", cJSON_CreateDoubleArray(range, 2))) {
            cJSON_Delete(root);
            return NULL;
        }
        offset += bytes;
    }
    char *text = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return text;
}

int safetensors_encode(const TensorList *l, unsigned char **out, size_t *len) {
    char *json = header_json(l);
    if (!json)
        return -1;
    size_t n = strlen(json), padded = (n + 7) / 8 * 8, data = 0;
    for (int i = 0; i < l->n; i++)
        data += tensor_bytes(l->items[i].tensor);
    unsigned char *buf = ir_malloc(8 + padded + data);
    if (!buf) {
        cJSON_free(json);
        return -1;
    }
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(buf + 8, json, n);
    memset(buf + 8 + n, ' ', padded - n);
    cJSON_free(json);
    unsigned char *p = buf + 8 + padded;
    for (int i = 0; i < l->n; i++) {
        size_t bytes = tensor_bytes(l->items[i].tensor);
        memcpy(p, l->items[i].tensor->bytes, bytes);
        p += bytes;
    }
    *out = buf;
    *len = 8 + padded + data;
    return 0;
}

int safetensors_write(const char *path, const TensorList *l, Diag *d) {
    unsigned char *buf;
    size_t len;
    if (safetensors_encode(l, &buf, &len))
        return diag_error(d, (Loc){0}, "out of memory writing '%s'", path);
    int rc = write_file_atomic(path, buf, len, d);
    ir_free(buf);
    return rc;
}
