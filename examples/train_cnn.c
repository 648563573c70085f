/* train_cnn: trains a network with a model compiled by kiln, one run() per step.
 *
 *   train_cnn MODEL.so X.npy Y.npy STEPS [--expect LOSS.npy] [--tol T]
 *             [--expect-params NAME,NAME...=PARAMS.npy]
 *
 * MODEL.so is a training step compiled by `kiln compile` (examples/train_cnn.kiln):
 * two inputs, the batch x and its one-hot labels y, and one output, the step's loss
 * (f32[]). Its params (the weights and the optimizer's state) live in the instance
 * and the model's `update` statements change them at the end of every run, so
 * calling run() again and again trains the network.
 *
 * X.npy holds N samples of x's shape less its batch dim, Y.npy N labels of y's;
 * both little-endian float32 ('<f4'), C order. Step s (from 0) takes samples
 * (s B + i) mod N, i = 0 .. B-1, with B the model's batch: the data in order, without
 * shuffling, as examples/gen_train.py trains PyTorch. Each step prints
 *   step S loss L
 * With --expect, the loss of step s is compared with element s of LOSS.npy (a
 * float32 vector of at least STEPS losses, e.g. PyTorch's curve from gen_train.py):
 * a step with |loss - expected| > T max(1, |expected|) is an error naming the first
 * such step; the largest difference is printed either way. T defaults to 1e-4:
 * kiln and PyTorch agree within 2e-6 over the 300 steps of gen_train.py, and
 * PyTorch in float32 and in float64 within 4e-6.
 *
 * With --expect-params, the f32 params named (say a batch norm's running statistics)
 * are read out of the instance after the last step, through the description's
 * read_param (docs/abi.md), and their elements, one param after the other, compared
 * with PARAMS.npy's in the same way.
 *
 * Data-parallel over MPI: built with -DKILN_MPI and libkiln_mpi (kiln/mpi.h), it
 * runs as one process of an MPI job of P, each with its own instance, created with
 * the job's communicator (create_comm, docs/abi.md). Step s then takes P B samples
 * (s P B + i) mod N, and process r the B from i = r B on: the job trains on batches
 * P times the model's, each process on its shard. A model whose allreduce ops
 * average the gradients and the loss over the processes
 * (examples/train_cnn_dp.kiln) then gives the losses of the model with the whole
 * batch in one process (train_cnn.kiln). Only process 0 prints; every process
 * checks. --timeout S (default 60) is how long an allreduce waits for the other
 * processes before the step fails, naming the process that waited; any failure
 * ends the job (MPI_Abort).
 *   mpicc -std=c11 -O2 -DKILN_MPI -I runtime examples/train_cnn.c -o train_cnn_mpi -Lbuild -lkiln_mpi -ldl
 *   mpirun -np 2 ./train_cnn_mpi train_cnn_dp.so examples/train_x.npy examples/train_y.npy 300 \
 *     --expect examples/train_cnn_loss.npy
 *
 * Needs only libc and libdl (and MPI with -DKILN_MPI):
 *   cc -std=c11 -O2 -I runtime examples/train_cnn.c -o train_cnn -ldl
 * Exit status: 0 success, 1 a failure (bad file, bad model, loss beyond tolerance),
 * 2 a malformed command line. */
#define _POSIX_C_SOURCE 200809L
#include <kiln/model.h>
#ifdef KILN_MPI
#include <kiln/mpi.h>
#endif

#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] = "usage: train_cnn MODEL.so X.npy Y.npy STEPS [--expect LOSS.npy] [--tol T]\n"
                            "                 [--expect-params NAME,NAME...=PARAMS.npy]"
#ifdef KILN_MPI
                            " [--timeout S]"
#endif
                            "\n";

static int process = -1; /* this one's rank in an MPI job */

static int fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (process >= 0)
        fprintf(stderr, "train_cnn (process %d): error: ", process);
    else
        fputs("train_cnn: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

/* |v| and max(1, |v|), written out so that no libm is needed */
static double absd(double v) {
    return v < 0 ? -v : v;
}
static double max1_abs(double v) {
    return absd(v) > 1 ? absd(v) : 1;
}

/* ---- A minimal .npy reader: float32, little-endian, C order ---- */

enum { NPY_MAX_RANK = 8 };

typedef struct {
    int rank;
    int64_t shape[NPY_MAX_RANK];
    int64_t count; /* elements */
    float *data;
} Npy;

/* Skips spaces in the header text. */
static const char *skip_space(const char *s) {
    while (*s == ' ')
        s++;
    return s;
}

/* The text after the dict key 'key': (after the colon and spaces), or NULL. */
static const char *dict_value(const char *header, const char *key) {
    char quoted[32];
    snprintf(quoted, sizeof quoted, "'%s'", key);
    const char *at = strstr(header, quoted);
    if (!at)
        return NULL;
    at = skip_space(at + strlen(quoted));
    if (*at != ':')
        return NULL;
    return skip_space(at + 1);
}

/* Parses the header dict; 0, or 1 with a message naming path. */
static int npy_parse_header(const char *path, const char *header, Npy *a) {
    const char *descr = dict_value(header, "descr");
    if (!descr)
        return fail("%s: the .npy header has no 'descr'", path);
    if (strncmp(descr, "'<f4'", 5) != 0) {
        const char *end = strchr(descr + 1, descr[0] == '\'' ? '\'' : ',');
        int len = end ? (int)(end - descr) + (descr[0] == '\'') : 8;
        return fail("%s: dtype %.*s, but train_cnn reads only little-endian float32 ('<f4')", path,
                    len > 40 ? 40 : len, descr);
    }
    const char *fortran = dict_value(header, "fortran_order");
    if (!fortran)
        return fail("%s: the .npy header has no 'fortran_order'", path);
    if (strncmp(fortran, "False", 5) != 0)
        return fail("%s: the array is in Fortran order; train_cnn reads only C order", path);
    const char *shape = dict_value(header, "shape");
    if (!shape || *shape != '(')
        return fail("%s: the .npy header has no shape tuple", path);
    const char *s = shape + 1;
    a->rank = 0;
    a->count = 1;
    for (;;) {
        s = skip_space(s);
        if (*s == ')')
            break;
        if (*s < '0' || *s > '9')
            return fail("%s: malformed shape in the .npy header", path);
        errno = 0;
        char *end;
        long long d = strtoll(s, &end, 10);
        if (errno || d < 0)
            return fail("%s: malformed shape in the .npy header", path);
        if (a->rank == NPY_MAX_RANK)
            return fail("%s: more than %d dims", path, NPY_MAX_RANK);
        a->shape[a->rank++] = d;
        if (d != 0 && a->count > (INT64_C(1) << 40) / d)
            return fail("%s: the array is too large", path);
        a->count *= d;
        s = skip_space(end);
        if (*s == ',')
            s++;
        else if (*s != ')')
            return fail("%s: malformed shape in the .npy header", path);
    }
    return 0;
}

/* Reads path into a (a->data malloc'ed); 0, or 1 with a message naming the file. */
static int npy_read(const char *path, Npy *a) {
    memset(a, 0, sizeof *a);
    FILE *f = fopen(path, "rb");
    if (!f)
        return fail("%s: %s", path, strerror(errno));
    int rc = 1;
    char *header = NULL;
    unsigned char pre[12];
    size_t got = fread(pre, 1, 10, f);
    if (got < 8 || memcmp(pre, "\x93NUMPY", 6) != 0) {
        fail("%s: not a .npy file (bad magic)", path);
        goto done;
    }
    if (got < 10) {
        fail("%s: truncated .npy header", path);
        goto done;
    }
    uint32_t header_len;
    long data_start;
    if (pre[6] == 1) {
        header_len = (uint32_t)pre[8] | (uint32_t)pre[9] << 8;
        data_start = 10;
    } else if (pre[6] == 2 || pre[6] == 3) {
        if (fread(pre + 10, 1, 2, f) != 2) {
            fail("%s: truncated .npy header", path);
            goto done;
        }
        header_len =
            (uint32_t)pre[8] | (uint32_t)pre[9] << 8 | (uint32_t)pre[10] << 16 | (uint32_t)pre[11] << 24;
        data_start = 12;
    } else {
        fail("%s: .npy format version %d.%d, which train_cnn does not read", path, pre[6], pre[7]);
        goto done;
    }
    if (header_len > (1u << 20)) {
        fail("%s: .npy header of %u bytes, too long", path, (unsigned)header_len);
        goto done;
    }
    header = malloc((size_t)header_len + 1);
    if (!header) {
        fail("%s: out of memory", path);
        goto done;
    }
    if (fread(header, 1, header_len, f) != header_len) {
        fail("%s: truncated .npy header", path);
        goto done;
    }
    header[header_len] = 0;
    if (memchr(header, 0, header_len)) {
        fail("%s: malformed .npy header", path);
        goto done;
    }
    if (npy_parse_header(path, header, a))
        goto done;
    data_start += (long)header_len;
    /* the data must be exactly count floats */
    if (fseek(f, 0, SEEK_END) != 0) {
        fail("%s: cannot seek: %s", path, strerror(errno));
        goto done;
    }
    long size = ftell(f);
    if (size < 0) {
        fail("%s: cannot tell its size: %s", path, strerror(errno));
        goto done;
    }
    int64_t want = a->count * 4;
    if ((int64_t)size - data_start < want) {
        fail("%s: truncated: the header promises %lld bytes of data, the file holds %lld", path,
             (long long)want, (long long)(size - data_start));
        goto done;
    }
    if ((int64_t)size - data_start > want) {
        fail("%s: %lld bytes after the data the header describes", path,
             (long long)((int64_t)size - data_start - want));
        goto done;
    }
    a->data = malloc(want ? (size_t)want : 1);
    if (!a->data) {
        fail("%s: out of memory for %lld bytes", path, (long long)want);
        goto done;
    }
    if (fseek(f, data_start, SEEK_SET) != 0 || fread(a->data, 1, (size_t)want, f) != (size_t)want) {
        fail("%s: read error", path);
        goto done;
    }
    /* '<f4' is the host's float on a little-endian machine; convert elsewhere */
    const uint16_t one = 1;
    if (*(const unsigned char *)&one == 0) {
        unsigned char *b = (unsigned char *)a->data;
        for (int64_t i = 0; i < a->count; i++, b += 4) {
            unsigned char t = b[0];
            b[0] = b[3], b[3] = t, t = b[1], b[1] = b[2], b[2] = t;
        }
    }
    rc = 0;
done:
    free(header);
    fclose(f);
    if (rc) {
        free(a->data);
        a->data = NULL;
    }
    return rc;
}

/* "[2, 3]" into buf. */
static const char *shape_str(const int64_t *shape, int rank, char *buf, size_t len) {
    size_t n = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < rank && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (n < len)
        snprintf(buf + n, len - n, "]");
    return buf;
}

/* The data file must hold samples of the input's shape less its batch dim. */
static int check_data(const char *path, const Npy *a, const kiln_tensor_info *in) {
    char want[128], got[128];
    int ok = a->rank == in->rank && a->rank >= 1 && a->shape[0] >= 1;
    for (int i = 1; ok && i < a->rank; i++)
        ok = a->shape[i] == in->shape[i];
    if (!ok)
        return fail("%s: shape %s, but the model's input '%s' is %s: need [N, ...] with the dims after the "
                    "first equal to the input's",
                    path, shape_str(a->shape, a->rank, got, sizeof got), in->name,
                    shape_str(in->shape, in->rank, want, sizeof want));
    return 0;
}

static int64_t numel(const kiln_tensor_info *t) {
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++)
        n *= t->shape[i];
    return n;
}

/* ---- Training ---- */

typedef struct {
    const char *model, *x, *y, *expect, *expect_params;
    long steps;
    double tol, timeout;
} Args;

static int parse_args(int argc, char **argv, Args *a) {
    *a = (Args){.tol = 1e-4, .steps = -1, .timeout = 60};
    const char *pos[4];
    int n_pos = 0;
    for (int i = 1; i < argc; i++) {
        bool timeout = false;
#ifdef KILN_MPI
        timeout = !strcmp(argv[i], "--timeout");
#endif
        if (!strcmp(argv[i], "--expect") || !strcmp(argv[i], "--tol") ||
            !strcmp(argv[i], "--expect-params") || timeout) {
            if (i + 1 == argc) {
                fprintf(stderr, "train_cnn: error: %s needs a value\n%s", argv[i], usage);
                return 2;
            }
            if (!strcmp(argv[i], "--expect")) {
                a->expect = argv[++i];
            } else if (!strcmp(argv[i], "--expect-params")) {
                a->expect_params = argv[++i];
                if (!strchr(a->expect_params, '=')) {
                    fprintf(stderr,
                            "train_cnn: error: --expect-params needs NAME,NAME...=PARAMS.npy, got '%s'\n%s",
                            a->expect_params, usage);
                    return 2;
                }
            } else {
                char *end;
                const char *v = argv[++i];
                double *num = timeout ? &a->timeout : &a->tol;
                *num = strtod(v, &end);
                if (!*v || *end || !(*num >= 0) || isinf(*num)) {
                    fprintf(stderr, "train_cnn: error: %s needs a number >= 0, got '%s'\n%s", argv[i - 1], v,
                            usage);
                    return 2;
                }
            }
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(usage, stdout);
            exit(0);
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "train_cnn: error: unknown option '%s'\n%s", argv[i], usage);
            return 2;
        } else if (n_pos == 4) {
            fprintf(stderr, "train_cnn: error: unexpected argument '%s'\n%s", argv[i], usage);
            return 2;
        } else {
            pos[n_pos++] = argv[i];
        }
    }
    if (n_pos != 4) {
        fprintf(stderr, "train_cnn: error: need MODEL.so X.npy Y.npy STEPS\n%s", usage);
        return 2;
    }
    a->model = pos[0], a->x = pos[1], a->y = pos[2];
    char *end;
    errno = 0;
    long steps = strtol(pos[3], &end, 10);
    if (!*pos[3] || *end || errno || steps < 1 || steps > 100000000) {
        fprintf(stderr, "train_cnn: error: STEPS must be a positive integer, got '%s'\n%s", pos[3], usage);
        return 2;
    }
    a->steps = steps;
    return 0;
}

/* The model must be a training step: inputs x and y of f32, one f32[] output. */
static int check_model(const char *path, const kiln_model_def *m) {
    if (m->abi_version != KILN_ABI_VERSION)
        return fail("%s: model ABI version %u, this program knows version %d", path, (unsigned)m->abi_version,
                    KILN_ABI_VERSION);
    if (m->n_inputs != 2 || m->n_outputs != 1)
        return fail("%s: the model has %d inputs and %d outputs; a training step has 2 inputs (x, y) and "
                    "1 output (the loss)",
                    path, (int)m->n_inputs, (int)m->n_outputs);
    const char *names[2] = {"x", "y"};
    for (int i = 0; i < 2; i++) {
        const kiln_tensor_info *t = &m->inputs[i];
        if (!t->name || strcmp(t->name, names[i]) != 0)
            return fail("%s: input %d is '%s', expected '%s' (inputs x, then y)", path, i + 1,
                        t->name ? t->name : "(null)", names[i]);
        if (t->dtype != KILN_F32)
            return fail("%s: input '%s' is not f32", path, t->name);
        if (t->rank < 1 || t->rank > NPY_MAX_RANK)
            return fail("%s: input '%s' has rank %d; it needs a batch dim", path, t->name, (int)t->rank);
    }
    if (m->inputs[0].shape[0] != m->inputs[1].shape[0])
        return fail("%s: inputs x and y have batch sizes %lld and %lld", path,
                    (long long)m->inputs[0].shape[0], (long long)m->inputs[1].shape[0]);
    const kiln_tensor_info *o = &m->outputs[0];
    if (o->dtype != KILN_F32 || o->rank != 0)
        return fail("%s: the output '%s' is not a scalar f32 (the loss)", path, o->name ? o->name : "(null)");
    return 0;
}

/* --expect-params NAMES=FILE: the params NAMES of the instance, one after the other,
 * against FILE's elements, within tol * max(1, |expected|). */
static int check_params(const char *path, const kiln_model_def *m, void *inst, const char *spec, double tol) {
    if (!(m->extensions & KILN_EXT_PARAMS))
        return fail("%s: the model does not describe its params (compiled by an older kiln)", path);
    const char *eq = strchr(spec, '=');
    Npy want = {0};
    if (npy_read(eq + 1, &want))
        return 1;
    int64_t n_want = want.count, at = 0;
    double max_diff = 0;
    const char *max_name = NULL;
    int rc = 0;
    for (const char *name = spec; name < eq && !rc;) {
        size_t len = strcspn(name, ",=");
        int i = 0;
        while (i < m->n_params && (strlen(m->params[i].name) != len || strncmp(m->params[i].name, name, len)))
            i++;
        int64_t count = i < m->n_params ? numel(&m->params[i]) : 0;
        float *got = i < m->n_params ? malloc(sizeof *got * (size_t)(count + 1)) : NULL;
        if (i == m->n_params)
            rc = fail("%s: no param '%.*s' that the model updates", path, (int)len, name);
        else if (m->params[i].dtype != KILN_F32)
            rc = fail("%s: the param '%.*s' is not f32", path, (int)len, name);
        else if (!got)
            rc = fail("out of memory");
        else if (at + count > n_want)
            rc = fail("%s: %lld values, fewer than the params named", eq + 1, (long long)n_want);
        else if (m->read_param(inst, i, got) != 0)
            rc = fail("%s: cannot read the param '%.*s'", path, (int)len, name);
        for (int64_t e = 0; !rc && e < count; e++) {
            double expected = want.data[at + e], diff = absd((double)got[e] - expected);
            if (!(diff <= tol * max1_abs(expected)))
                rc = fail(
                    "param '%.*s' element %lld: %.9g differs from the expected %.9g by %.3g, more than the "
                    "tolerance %g * max(1, |expected|)",
                    (int)len, name, (long long)e, (double)got[e], expected, diff, tol);
            if (diff > max_diff || !max_name)
                max_diff = diff, max_name = m->params[i].name;
        }
        at += count;
        free(got);
        name += len + (name[len] == ',');
    }
    if (!rc && at != n_want)
        rc =
            fail("%s: %lld values, but the params named hold %lld", eq + 1, (long long)n_want, (long long)at);
    if (!rc)
        printf("params within %g * max(1, |expected|) of %s; largest difference %.3g (%s)\n", tol, eq + 1,
               max_diff, max_name ? max_name : "none");
    free(want.data);
    return rc;
}

int main(int argc, char **argv) {
    Args a;
    int rc = parse_args(argc, argv, &a);
    if (rc)
        return rc;

    Npy x = {0}, y = {0}, expect = {0};
    void *lib = NULL, *inst = NULL;
    float *xb = NULL, *yb = NULL;
    const kiln_model_def *m = NULL;
    const kiln_comm *comm = NULL; /* the MPI job's, or none */
    int64_t processes = 1, rank = 0;
    rc = 1;
#ifdef KILN_MPI
    MPI_Init(&argc, &argv);
    kiln_error kerr;
    kiln_mpi *mpi = kiln_mpi_new(MPI_COMM_WORLD, a.timeout, &kerr);
    if (!mpi) {
        fail("%s", kerr.message);
        goto done;
    }
    comm = kiln_mpi_comm(mpi);
    processes = comm->size, rank = process = comm->rank;
    if (rank > 0 && !freopen("/dev/null", "w", stdout)) {
        fail("cannot silence process %d's output", process);
        goto done;
    }
#endif

    /* a path without a slash would make dlopen search the library path */
    char *so = malloc(strlen(a.model) + 3);
    if (!so) {
        fail("out of memory");
        goto done;
    }
    sprintf(so, "%s%s", strchr(a.model, '/') ? "" : "./", a.model);
    lib = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    free(so);
    if (!lib) {
        fail("cannot load %s: %s", a.model, dlerror());
        goto done;
    }
    const kiln_model_def *(*get)(void);
    void *sym = dlsym(lib, "kiln_model");
    if (!sym) {
        fail("%s: no kiln_model symbol; not a model compiled by kiln", a.model);
        goto done;
    }
    memcpy(&get, &sym, sizeof get); /* object pointer to function pointer, as POSIX allows */
    m = get();
    if (!m) {
        fail("%s: kiln_model() returned NULL", a.model);
        goto done;
    }
    if (check_model(a.model, m))
        goto done;
    const kiln_tensor_info *xi = &m->inputs[0], *yi = &m->inputs[1];

    if (npy_read(a.x, &x) || check_data(a.x, &x, xi) || npy_read(a.y, &y) || check_data(a.y, &y, yi))
        goto done;
    if (x.shape[0] != y.shape[0]) {
        fail("%s holds %lld samples, %s %lld labels", a.x, (long long)x.shape[0], a.y, (long long)y.shape[0]);
        goto done;
    }
    if (a.expect) {
        if (npy_read(a.expect, &expect))
            goto done;
        if (expect.rank != 1) {
            fail("%s: expected a vector of losses, got rank %d", a.expect, expect.rank);
            goto done;
        }
        if (expect.shape[0] < a.steps) {
            fail("%s: %lld losses, fewer than the %ld steps asked for", a.expect, (long long)expect.shape[0],
                 a.steps);
            goto done;
        }
    }

    const int64_t batch = xi->shape[0], n = x.shape[0];
    const int64_t x_sample = numel(xi) / batch, y_sample = numel(yi) / batch;
    xb = malloc(sizeof *xb * (size_t)(x_sample * batch));
    yb = malloc(sizeof *yb * (size_t)(y_sample * batch));
    if (!xb || !yb) {
        fail("out of memory");
        goto done;
    }
    char err[512] = "";
    if (comm && !(m->extensions & KILN_EXT_COMM)) {
        fail("%s: the model takes no communicator (compiled by an older kiln)", a.model);
        goto done;
    }
    if ((comm ? m->create_comm(&inst, comm, err, sizeof err) : m->create(&inst, err, sizeof err)) != 0) {
        inst = NULL;
        fail("%s: create failed: %s", a.model, err[0] ? err : "(no message)");
        goto done;
    }
    printf("model %s: batch %lld, %lld samples, %ld steps", m->name ? m->name : "?", (long long)batch,
           (long long)n, a.steps);
    printf(processes > 1 ? ", %lld processes\n" : "\n", (long long)processes);

    double max_diff = 0, max_loss = 0, bad_loss = 0;
    long max_step = -1, first_bad = -1;
    for (long s = 0; s < a.steps; s++) {
        for (int64_t i = 0; i < batch; i++) {
            int64_t k = ((int64_t)s * processes * batch + rank * batch + i) % n;
            memcpy(xb + i * x_sample, x.data + k * x_sample, sizeof *xb * (size_t)x_sample);
            memcpy(yb + i * y_sample, y.data + k * y_sample, sizeof *yb * (size_t)y_sample);
        }
        float loss = NAN;
        const void *const in[2] = {xb, yb};
        void *const out[1] = {&loss};
        int fault = m->run(inst, in, out);
        if (fault != 0) {
            const char *check = m->extensions & KILN_EXT_RUN_ERROR ? m->run_error(fault) : NULL;
            const char *why = comm && comm->error ? comm->error(comm->ctx) : NULL;
            fail("%s: run failed at step %ld%s%s%s%s", a.model, s, check ? ": " : "", check ? check : "",
                 why ? ": " : "", why ? why : "");
            goto done;
        }
        printf("step %ld loss %.9g\n", s, (double)loss);
        if (a.expect) {
            double want = expect.data[s], diff = absd((double)loss - want);
            if (isnan(diff))
                diff = INFINITY;
            if (diff > max_diff || max_step < 0)
                max_diff = diff, max_step = s, max_loss = loss;
            if (first_bad < 0 && !(diff <= a.tol * max1_abs(want)))
                first_bad = s, bad_loss = loss;
        }
    }
    fflush(stdout);
    rc = 0;
    if (a.expect) {
        printf("largest difference from %s: %.3g at step %ld (loss %.9g, expected %.9g)\n", a.expect,
               max_diff, max_step, max_loss, (double)expect.data[max_step]);
        if (first_bad >= 0) {
            fflush(stdout);
            double want = expect.data[first_bad];
            rc = fail("step %ld: loss %.9g differs from the expected %.9g by %.3g, more than the tolerance "
                      "%g * max(1, |expected|)",
                      first_bad, bad_loss, want, absd(bad_loss - want), a.tol);
        } else {
            printf("all %ld losses within %g * max(1, |expected|)\n", a.steps, a.tol);
        }
    }
    if (!rc && a.expect_params)
        rc = check_params(a.model, m, inst, a.expect_params, a.tol);
done:
    if (inst)
        m->destroy(inst);
    free(xb);
    free(yb);
    free(x.data);
    free(y.data);
    free(expect.data);
    if (lib)
        dlclose(lib);
#ifdef KILN_MPI
    if (rc)
        MPI_Abort(MPI_COMM_WORLD, rc); /* the other processes would wait for this one */
    kiln_mpi_free(mpi);
    MPI_Finalize();
#endif
    return rc;
}
