/* An outside program using a compiled model through the ABI alone (spec/abi.md).
 *
 * It includes nothing of kiln but the public header kiln/model.h and links nothing
 * but libdl, as a user's program would: it dlopens the model, looks up kiln_model,
 * checks the ABI version, the number of inputs and outputs and their shapes against
 * the .npy files it is given, creates an instance, runs it twice on the input (the
 * two results must be the same bit for bit), compares output 0 with the expected
 * tensor within |a-b| <= 1e-4 + 1e-4*|b|, destroys the instance and dlcloses the
 * model. The .npy files are read by the small reader below (format 1.0 to 3.0,
 * '<f4', C order), not by kiln's.
 *
 * Usage: abi_test MODEL.so INPUT.npy EXPECTED.npy; exit 0 when every check passes,
 * else 1 after one line saying which check failed. */
#include "kiln/model.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_RANK = 8 };

typedef struct {
    int rank;
    int64_t shape[MAX_RANK];
    int64_t count;
    float *data;
} Array;

/* Prints one line "abi_test: ..." to stderr; returns 1. */
static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "abi_test: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return 1;
}

/* Reads a little-endian float32 C-order .npy file; 0, or 1 after a message. */
static int read_npy(const char *path, Array *a) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return fail("cannot open '%s'", path);
    unsigned char pre[12];
    size_t got = fread(pre, 1, sizeof pre, f);
    int major = got >= 10 ? pre[6] : 0;
    if (got < 10 || memcmp(pre, "\x93NUMPY", 6) != 0 || major < 1 || major > 3 || (major > 1 && got < 12)) {
        fclose(f);
        return fail("'%s' is not a .npy file", path);
    }
    size_t hlen = pre[8] | (size_t)pre[9] << 8, start = 10;
    if (major > 1) {
        hlen |= (size_t)pre[10] << 16 | (size_t)pre[11] << 24;
        start = 12;
    }
    char *header = calloc(hlen + 1, 1);
    if (!header || fseek(f, (long)start, SEEK_SET) != 0 || fread(header, 1, hlen, f) != hlen) {
        free(header);
        fclose(f);
        return fail("'%s': truncated header", path);
    }
    const char *shape = strstr(header, "'shape': (");
    bool ok = strstr(header, "'descr': '<f4'") && strstr(header, "'fortran_order': False") && shape;
    a->rank = 0;
    a->count = 1;
    for (const char *p = shape ? shape + 10 : ""; ok && *p != ')';) {
        char *end;
        long long dim = strtoll(p, &end, 10);
        ok = end != p && dim >= 0 && a->rank < MAX_RANK;
        if (ok) {
            a->shape[a->rank++] = dim;
            a->count *= dim;
            p = end + strspn(end, ", ");
        }
    }
    free(header);
    a->data = ok ? malloc((size_t)a->count * sizeof(float) + 1) : NULL;
    if (ok && a->data && fread(a->data, sizeof(float), (size_t)a->count, f) == (size_t)a->count) {
        fclose(f);
        return 0;
    }
    fclose(f);
    free(a->data);
    a->data = NULL;
    return fail("'%s': not a '<f4' C-order array, or truncated", path);
}

static bool same_shape(const kiln_tensor_info *t, const Array *a) {
    if (t->dtype != KILN_F32 || t->rank != a->rank)
        return false;
    for (int i = 0; i < a->rank; i++)
        if (t->shape[i] != a->shape[i])
            return false;
    return true;
}

static bool close_enough(float got, float want) {
    if (got != got || want != want)
        return got != got && want != want;
    double diff = (double)got - want, mag = want < 0 ? -(double)want : want;
    return (diff < 0 ? -diff : diff) <= 1e-4 + 1e-4 * mag;
}

static int64_t numel(const kiln_tensor_info *t) {
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++)
        n *= t->shape[i];
    return n;
}

/* Runs the instance twice; output 0 of the first run is kept in first, of the
 * second in bufs[0]. */
static int run_twice(const kiln_model_def *def, void *inst, const Array *in, void **bufs, float *first) {
    const void *inputs[1] = {in->data};
    for (int run = 1; run <= 2; run++) {
        if (def->run(inst, inputs, bufs) != 0)
            return fail("run %d of model '%s' failed", run, def->name);
        if (run == 1)
            memcpy(first, bufs[0], (size_t)numel(&def->outputs[0]) * sizeof(float));
    }
    return 0;
}

/* Compares output 0 with the expected values; 0, or 1 after listing mismatches. */
static int compare(const kiln_model_def *def, const float *got, const Array *want) {
    int64_t bad = 0;
    for (int64_t i = 0; i < want->count; i++)
        if (!close_enough(got[i], want->data[i]) && bad++ < 5)
            fprintf(stderr, "abi_test: %s[%lld]: got %.9g, expected %.9g\n", def->outputs[0].name,
                    (long long)i, (double)got[i], (double)want->data[i]);
    return bad ? fail("output '%s' differs from the expected file", def->outputs[0].name) : 0;
}

/* Everything after reading the files: the ABI checks, two runs, the comparison. */
static int check_model(const char *so, const Array *in, const Array *want) {
    void *handle = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    if (!handle)
        return fail("cannot dlopen '%s': %s", so, dlerror());
    const kiln_model_def *(*entry)(void);
    void *sym = dlsym(handle, "kiln_model");
    memcpy(&entry, &sym, sizeof entry); /* POSIX: dlsym's data pointer may hold a function */
    const kiln_model_def *def = entry ? entry() : NULL;
    int rc = 1;
    void *inst = NULL;
    char err[256] = "";
    if (!def)
        fail("'%s' has no kiln_model symbol, or it returned NULL", so);
    else if (def->abi_version != KILN_ABI_VERSION)
        fail("'%s' has ABI version %u, expected %d", so, def->abi_version, KILN_ABI_VERSION);
    else if (def->n_inputs != 1 || def->n_outputs < 1)
        fail("'%s': model '%s' must have one input and at least one output", so, def->name);
    else if (!same_shape(&def->inputs[0], in))
        fail("'%s': input '%s' is not f32 of the input file's shape", so, def->inputs[0].name);
    else if (!same_shape(&def->outputs[0], want))
        fail("'%s': output '%s' is not f32 of the expected file's shape", so, def->outputs[0].name);
    else if (def->create(&inst, err, sizeof err) != 0)
        fail("create failed: %s", err);
    else {
        void **bufs = calloc((size_t)def->n_outputs, sizeof *bufs);
        float *first = malloc((size_t)want->count * sizeof(float) + 1);
        bool ok = bufs && first;
        for (int k = 0; ok && k < def->n_outputs; k++)
            ok = (bufs[k] = malloc((size_t)numel(&def->outputs[k]) * sizeof(float) + 1)) != NULL;
        if (!ok)
            fail("out of memory");
        else if (run_twice(def, inst, in, bufs, first) == 0) {
            if (memcmp(first, bufs[0], (size_t)want->count * sizeof(float)) != 0)
                fail("'%s': two runs on the same input differ", so);
            else
                rc = compare(def, first, want);
        }
        for (int k = 0; bufs && k < def->n_outputs; k++)
            free(bufs[k]);
        free(bufs);
        free(first);
        def->destroy(inst);
    }
    if (dlclose(handle) != 0)
        rc = fail("dlclose failed: %s", dlerror());
    return rc;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: abi_test MODEL.so INPUT.npy EXPECTED.npy\n");
        return 1;
    }
    Array in = {0}, want = {0};
    int rc = read_npy(argv[2], &in) || read_npy(argv[3], &want) || check_model(argv[1], &in, &want);
    free(in.data);
    free(want.data);
    if (!rc)
        printf("abi_test: %s: ok\n", argv[1]);
    return rc;
}
