/* The runtime of a model compiled for the CUDA target.
 *
 * kiln pastes this file into the host code of each CUDA model (after kiln/model.h),
 * so the .so needs no kiln library and no CUDA at build time: the CUDA driver
 * (libcuda.so.1) and NVRTC are found with dlopen when an instance is created.
 *
 * create: picks device $KILN_CUDA_DEVICE (default 0); takes the kernels' binary for
 * this device from the kernel cache, or compiles the kernel source with NVRTC for
 * the device's own architecture (sm_XY) and stores the result there, so the second
 * load compiles nothing; loads it as a module; allocates device memory for the
 * weights (copied once), the state, the workspace and every input and output; and
 * makes a stream. run: copies the inputs to the device, launches the kernels in
 * order on the stream, copies the outputs back and waits; run_sym, at a size below
 * the bound of the model's symbolic dim, copies only that size's part of each port
 * with the dim, and cuts the grids of the kernels that follow it. An allreduce is no
 * kernel: between the launches, run copies its operand to the host, hands it to
 * the communicator given at create, and copies the result back. Every driver call is
 * checked; a failure in run is reported on stderr (the ABI's run has no message).
 * A profiling build (kiln bench --profile) records an event before every kernel
 * and after the last, and adds each kernel's time between them to its slot.
 *
 * The cache is $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else ~/.cache/kiln, one
 * file per key: a hash of the source, the NVRTC options and version, and the device.
 * An entry holds its key and a checksum; one that fails them, or that the driver
 * will not load, is compiled again and overwritten, with one warning naming it.
 *
 * With KILN_CUDA_EMULATE defined (KILN_CUDA=emulate when kiln compiles), the
 * kernels are C++ functions linked into the model, device memory is host memory,
 * and a launch runs the grid on the CPU (cuda/emulate.h). */
#include "kiln/model.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The buffers a kernel sees, as device pointers (kernel arguments by value). */
typedef struct {
    const float *const *in;
    float *const *out;
    float *ws;
    const float *wt;
    float *st;
    int *fault; /* a run-time check that failed: the program's fault number, else 0 */
} KilnArgs;

typedef void (*KilnCudaKernelFn)(KilnArgs args, int64_t count);

/* Where an allreduce's operand or result is: in a buffer (KILN_CUDA_IN, ...) at a
 * byte offset, or for the inputs and outputs, the index of one. */
enum { KILN_CUDA_IN, KILN_CUDA_OUT, KILN_CUDA_WT, KILN_CUDA_ST, KILN_CUDA_WS };
typedef struct {
    int buffer;
    int64_t at;
} KilnCudaPlace;

/* An allreduce, which run does on the host: count floats from src, summed over the
 * processes (divided by their number for a mean), into dst; fault: the program's
 * fault number when the communicator fails. */
typedef struct {
    KilnCudaPlace src, dst;
    int64_t count;
    int mean, fault;
} KilnCudaAllreduce;

/* How a kernel's work follows the symbolic dim (the lowering's Kernel.sym_*): it
 * computes the rows of its result in order, `rows` a unit of the dim, `tile` rows
 * per `width` iterations. grid_axis -1: the iterations are threads (a loop); else
 * they are blocks along that axis of the grid (a GEMM's row tiles or batch items).
 * rows 0: every run runs them all. */
typedef struct {
    int64_t rows, tile, width;
    int grid_axis;
} KilnCudaFollows;

/* One kernel launch: its name in the source, its iteration count (an argument),
 * the grid in blocks, and the threads per block; cooperative: it synchronizes its
 * block's threads (the emulation then runs them as fibers); sym: how a run smaller
 * than the symbolic dim's bound cuts the count and the grid. allreduce: not a
 * kernel but that step, else NULL. */
typedef struct {
    const char *name;
    int64_t count;
    unsigned grid[3], block;
    int cooperative;
    KilnCudaFollows sym;
    const KilnCudaAllreduce *allreduce;
} KilnCudaLaunch;

/* What the generated code tells the runtime about its model. */
typedef struct {
    const char *source; /* the kernels, CUDA C++ */
    int n_kernels;
    const KilnCudaLaunch *launches;
    const KilnCudaKernelFn *emulated; /* emulation: the kernels, else NULL */
    int64_t workspace_bytes, state_bytes, weights_bytes;
    const unsigned char *weights;
    int n_inputs, n_outputs;
    const int64_t *input_bytes, *output_bytes;
    double *profile; /* seconds per kernel, summed over runs; NULL: no profiling */
    /* A symbolic dim's bound (0: the model has none), and the bytes of one unit of
       it in each input and output (0: a port without it). The device buffers are
       the bound's size; a run at a smaller size copies only its units. */
    int64_t sym_bound;
    const int64_t *in_unit_bytes, *out_unit_bytes;
} KilnCudaProgram;

#ifdef KILN_CUDA_EMULATE
void kiln_emu_launch(KilnCudaKernelFn fn, KilnArgs args, int64_t count, const unsigned grid[3],
                     unsigned block, int cooperative);
#endif

/* ---- The CUDA driver API and NVRTC, as far as kiln uses them ---- */

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUevent;
typedef unsigned long long CUdeviceptr;
typedef int nvrtcResult;
typedef void *nvrtcProgram;
enum { CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76 };

typedef struct {
    void *cuda, *nvrtc; /* dlopen handles */
    CUresult (*cuInit)(unsigned);
    CUresult (*cuDeviceGetCount)(int *);
    CUresult (*cuDeviceGet)(CUdevice *, int);
    CUresult (*cuDeviceGetName)(char *, int, CUdevice);
    CUresult (*cuDeviceGetAttribute)(int *, int, CUdevice);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
    CUresult (*cuCtxSetCurrent)(CUcontext);
    CUresult (*cuModuleLoadData)(CUmodule *, const void *);
    CUresult (*cuModuleUnload)(CUmodule);
    CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
    CUresult (*cuMemFree)(CUdeviceptr);
    CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);
    CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*cuMemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
    CUresult (*cuStreamCreate)(CUstream *, unsigned);
    CUresult (*cuStreamDestroy)(CUstream);
    CUresult (*cuStreamSynchronize)(CUstream);
    CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                               unsigned, CUstream, void **, void **);
    CUresult (*cuGetErrorString)(CUresult, const char **);
    CUresult (*cuEventCreate)(CUevent *, unsigned);
    CUresult (*cuEventRecord)(CUevent, CUstream);
    CUresult (*cuEventElapsedTime)(float *, CUevent, CUevent);
    CUresult (*cuEventDestroy)(CUevent);
    nvrtcResult (*nvrtcVersion)(int *, int *);
    nvrtcResult (*nvrtcCreateProgram)(nvrtcProgram *, const char *, const char *, int, const char *const *,
                                      const char *const *);
    nvrtcResult (*nvrtcCompileProgram)(nvrtcProgram, int, const char *const *);
    nvrtcResult (*nvrtcGetProgramLogSize)(nvrtcProgram, size_t *);
    nvrtcResult (*nvrtcGetProgramLog)(nvrtcProgram, char *);
    nvrtcResult (*nvrtcGetCUBINSize)(nvrtcProgram, size_t *);
    nvrtcResult (*nvrtcGetCUBIN)(nvrtcProgram, char *);
    nvrtcResult (*nvrtcDestroyProgram)(nvrtcProgram *);
    const char *(*nvrtcGetErrorString)(nvrtcResult);
} KilnCudaApi;

static void kiln_cuda_error(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void kiln_cuda_error(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* The first of the names dlopen finds; NULL when none. */
static void *kiln_cuda_dlopen(const char *const *names) {
    for (int i = 0; names[i]; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h)
            return h;
    }
    return NULL;
}

/* NVRTC: $KILN_NVRTC, else the names of the CUDA versions kiln knows, newest first. */
static void *kiln_cuda_open_nvrtc(void) {
    const char *env = getenv("KILN_NVRTC");
    const char *names[] = {env && *env ? env : "libnvrtc.so",
                           "libnvrtc.so.13",
                           "libnvrtc.so.12",
                           "libnvrtc.so.11.2",
                           "/usr/local/cuda/lib64/libnvrtc.so",
                           NULL};
    return kiln_cuda_dlopen(names);
}

#define KILN_CUDA_SYM(lib, field, symbol)                                                                    \
    do {                                                                                                     \
        *(void **)&api->field = dlsym(api->lib, symbol);                                                     \
        if (!api->field) {                                                                                   \
            kiln_cuda_error(err, errlen, "the CUDA library has no %s (too old a CUDA for kiln)", symbol);    \
            return 1;                                                                                        \
        }                                                                                                    \
    } while (0)

static int kiln_cuda_load_nvrtc(KilnCudaApi *api, char *err, size_t errlen) {
    if (!(api->nvrtc = kiln_cuda_open_nvrtc())) {
        kiln_cuda_error(
            err, errlen,
            "cannot load NVRTC (libnvrtc.so from the CUDA toolkit; set KILN_NVRTC to its path): %s",
            dlerror());
        return 1;
    }
    KILN_CUDA_SYM(nvrtc, nvrtcVersion, "nvrtcVersion");
    KILN_CUDA_SYM(nvrtc, nvrtcCreateProgram, "nvrtcCreateProgram");
    KILN_CUDA_SYM(nvrtc, nvrtcCompileProgram, "nvrtcCompileProgram");
    KILN_CUDA_SYM(nvrtc, nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize");
    KILN_CUDA_SYM(nvrtc, nvrtcGetProgramLog, "nvrtcGetProgramLog");
    KILN_CUDA_SYM(nvrtc, nvrtcGetCUBINSize, "nvrtcGetCUBINSize");
    KILN_CUDA_SYM(nvrtc, nvrtcGetCUBIN, "nvrtcGetCUBIN");
    KILN_CUDA_SYM(nvrtc, nvrtcDestroyProgram, "nvrtcDestroyProgram");
    KILN_CUDA_SYM(nvrtc, nvrtcGetErrorString, "nvrtcGetErrorString");
    return 0;
}

static int kiln_cuda_load_driver(KilnCudaApi *api, char *err, size_t errlen) {
    const char *names[] = {"libcuda.so.1", "libcuda.so", NULL};
    if (!(api->cuda = kiln_cuda_dlopen(names))) {
        kiln_cuda_error(
            err, errlen,
            "no CUDA driver here (cannot load libcuda.so.1: %s); the CUDA target needs an NVIDIA GPU "
            "and its driver",
            dlerror());
        return 1;
    }
    KILN_CUDA_SYM(cuda, cuInit, "cuInit");
    KILN_CUDA_SYM(cuda, cuDeviceGetCount, "cuDeviceGetCount");
    KILN_CUDA_SYM(cuda, cuDeviceGet, "cuDeviceGet");
    KILN_CUDA_SYM(cuda, cuDeviceGetName, "cuDeviceGetName");
    KILN_CUDA_SYM(cuda, cuDeviceGetAttribute, "cuDeviceGetAttribute");
    KILN_CUDA_SYM(cuda, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    KILN_CUDA_SYM(cuda, cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
    KILN_CUDA_SYM(cuda, cuCtxSetCurrent, "cuCtxSetCurrent");
    KILN_CUDA_SYM(cuda, cuModuleLoadData, "cuModuleLoadData");
    KILN_CUDA_SYM(cuda, cuModuleUnload, "cuModuleUnload");
    KILN_CUDA_SYM(cuda, cuModuleGetFunction, "cuModuleGetFunction");
    KILN_CUDA_SYM(cuda, cuMemAlloc, "cuMemAlloc_v2");
    KILN_CUDA_SYM(cuda, cuMemFree, "cuMemFree_v2");
    KILN_CUDA_SYM(cuda, cuMemcpyHtoD, "cuMemcpyHtoD_v2");
    KILN_CUDA_SYM(cuda, cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
    KILN_CUDA_SYM(cuda, cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
    KILN_CUDA_SYM(cuda, cuStreamCreate, "cuStreamCreate");
    KILN_CUDA_SYM(cuda, cuStreamDestroy, "cuStreamDestroy_v2");
    KILN_CUDA_SYM(cuda, cuStreamSynchronize, "cuStreamSynchronize");
    KILN_CUDA_SYM(cuda, cuLaunchKernel, "cuLaunchKernel");
    KILN_CUDA_SYM(cuda, cuGetErrorString, "cuGetErrorString");
    KILN_CUDA_SYM(cuda, cuEventCreate, "cuEventCreate");
    KILN_CUDA_SYM(cuda, cuEventRecord, "cuEventRecord");
    KILN_CUDA_SYM(cuda, cuEventElapsedTime, "cuEventElapsedTime");
    KILN_CUDA_SYM(cuda, cuEventDestroy, "cuEventDestroy_v2");
    return 0;
}

static const char *kiln_cuda_strerror(const KilnCudaApi *api, CUresult rc) {
    const char *s = NULL;
    if (api->cuGetErrorString && api->cuGetErrorString(rc, &s) == 0 && s)
        return s;
    return "unknown CUDA error";
}

/* Compiles the kernels for architecture sm_<arch> into a new cubin (*out, *len);
 * with check, any warning in the log is an error too. */
static int kiln_cuda_nvrtc_compile(const KilnCudaApi *api, const char *source, int arch, int check,
                                   unsigned char **out, size_t *len, char *err, size_t errlen) {
    char gpu[32];
    snprintf(gpu, sizeof gpu, "--gpu-architecture=sm_%d", arch);
    const char *options[] = {gpu, "--std=c++17", "--device-as-default-execution-space"};
    nvrtcProgram prog = NULL;
    nvrtcResult rc = api->nvrtcCreateProgram(&prog, source, "kiln_model.cu", 0, NULL, NULL);
    if (rc != 0) {
        kiln_cuda_error(err, errlen, "NVRTC cannot take the kernels: %s", api->nvrtcGetErrorString(rc));
        return 1;
    }
    rc = api->nvrtcCompileProgram(prog, 3, options);
    size_t log_len = 0;
    char *log = NULL;
    if (api->nvrtcGetProgramLogSize(prog, &log_len) == 0 && log_len > 1 && (log = malloc(log_len)))
        api->nvrtcGetProgramLog(prog, log);
    int failed = rc != 0 || (check && log && log[0]);
    if (failed)
        kiln_cuda_error(err, errlen, "NVRTC %s the kernels (a bug in kiln): %.1500s",
                        rc != 0 ? "failed to compile" : "warned on",
                        log ? log : api->nvrtcGetErrorString(rc));
    free(log);
    *out = NULL;
    if (!failed && api->nvrtcGetCUBINSize(prog, len) == 0 && (*out = malloc(*len ? *len : 1)) &&
        api->nvrtcGetCUBIN(prog, (char *)*out) != 0) {
        free(*out);
        *out = NULL;
    }
    if (!failed && !*out) {
        kiln_cuda_error(err, errlen, "NVRTC gave no binary for sm_%d", arch);
        failed = 1;
    }
    api->nvrtcDestroyProgram(&prog);
    return failed;
}

/* ---- The kernel cache ---- */

static unsigned long long kiln_cuda_fnv(unsigned long long h, const void *data, size_t n) {
    const unsigned char *b = data;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* The cache directory, created when missing; 0 when there is none to use. */
static int kiln_cuda_cache_dir(char *dir, size_t n) {
    const char *env = getenv("KILN_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (env && *env)
        snprintf(dir, n, "%s", env);
    else if (xdg && *xdg)
        snprintf(dir, n, "%s/kiln", xdg);
    else if (home && *home)
        snprintf(dir, n, "%s/.cache/kiln", home);
    else
        return 0;
    char partial[4096];
    snprintf(partial, sizeof partial, "%s", dir);
    for (char *p = partial + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(partial, 0777);
            *p = '/';
        }
    return (mkdir(dir, 0777) == 0 || errno == EEXIST) && access(dir, W_OK) == 0;
}

/* A cache entry is the cubin followed by a trailer, in the manner of kiln's own
 * compile cache (codegen/cache.c): "KILNCACH", the key (NUL-padded to 40 bytes), the
 * cubin's length and its FNV-1a checksum, little-endian. */
enum { KILN_CUDA_KEY_BYTES = 40, KILN_CUDA_TRAILER = 8 + KILN_CUDA_KEY_BYTES + 16 };

static void kiln_cuda_trailer(unsigned char *t, const char *key, const unsigned char *data, size_t len) {
    unsigned long long sum = kiln_cuda_fnv(0xcbf29ce484222325ull, data, len);
    memset(t, 0, KILN_CUDA_TRAILER);
    memcpy(t, "KILNCACH", 8);
    size_t k = strlen(key);
    memcpy(t + 8, key, k < KILN_CUDA_KEY_BYTES ? k : KILN_CUDA_KEY_BYTES);
    for (int i = 0; i < 8; i++) {
        t[8 + KILN_CUDA_KEY_BYTES + i] = (unsigned char)((unsigned long long)len >> (8 * i));
        t[16 + KILN_CUDA_KEY_BYTES + i] = (unsigned char)(sum >> (8 * i));
    }
}

static void kiln_cuda_cache_warn(const char *path) {
    fprintf(stderr, "kiln: warning: cache entry %s is corrupt; rebuilding it\n", path);
}

/* A regular file's bytes (*len of them), or NULL when it cannot be read whole. */
static unsigned char *kiln_cuda_read(const char *path, size_t *len) {
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return NULL;
    struct stat st;
    unsigned char *data = NULL;
    size_t size = 0, got = 0;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 &&
        (unsigned long long)st.st_size < (1ull << 32) && (data = malloc((size_t)st.st_size))) {
        size = (size_t)st.st_size;
        for (ssize_t r; got < size && (r = read(fd, data + got, size - got)) != 0;)
            if (r > 0)
                got += (size_t)r;
            else if (errno != EINTR)
                break;
    }
    close(fd);
    if (data && got != size) {
        free(data);
        data = NULL;
    }
    *len = data ? size : 0;
    return data;
}

/* The cubin of the entry path for key, or NULL: for no entry, or (*corrupt set) for
 * one that is not a regular file holding a whole entry for key. */
static unsigned char *kiln_cuda_cache_read(const char *path, const char *key, size_t *len, int *corrupt) {
    *corrupt = access(path, F_OK) == 0;
    size_t size = 0;
    unsigned char *data = kiln_cuda_read(path, &size), want[KILN_CUDA_TRAILER];
    *len = 0;
    if (data && size > KILN_CUDA_TRAILER)
        kiln_cuda_trailer(want, key, data, size - KILN_CUDA_TRAILER);
    if (!data || size <= KILN_CUDA_TRAILER ||
        memcmp(data + size - KILN_CUDA_TRAILER, want, KILN_CUDA_TRAILER)) {
        free(data);
        return NULL;
    }
    *corrupt = 0;
    *len = size - KILN_CUDA_TRAILER;
    return data;
}

/* Writes the entry through a temporary file and a rename, so a reader never sees half of it. */
static void kiln_cuda_write(const char *path, const char *key, const unsigned char *data, size_t len) {
    char tmp[4200];
    unsigned char trailer[KILN_CUDA_TRAILER];
    kiln_cuda_trailer(trailer, key, data, len);
    /* mkstemp: two threads (or processes) storing the same entry each get their own */
    snprintf(tmp, sizeof tmp, "%s.XXXXXX", path);
    int fd = mkstemp(tmp);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!f) {
        if (fd >= 0) {
            close(fd);
            unlink(tmp);
        }
        return;
    }
    int ok = fwrite(data, 1, len, f) == len && fwrite(trailer, 1, sizeof trailer, f) == sizeof trailer;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0)
        unlink(tmp);
}

/* ---- Instances ---- */

typedef struct {
    const KilnCudaProgram *prog;
    KilnCudaApi api;
    CUdevice device;
    CUcontext ctx;
    CUmodule module;
    CUstream stream;
    CUfunction *functions;
    CUevent *events; /* profiling: one before each kernel and one after the last */
    CUdeviceptr wt, st, ws, fault;
    CUdeviceptr *inputs, *outputs;   /* the device buffers */
    CUdeviceptr in_table, out_table; /* arrays of them, what KilnArgs points at */
    KilnArgs args;
    kiln_comm comm; /* size 0: none */
    float *staging; /* the host's copy of an allreduce's operand (not emulated) */
} KilnCudaInstance;

#ifdef KILN_CUDA_EMULATE
/* Device memory is host memory here, at least 64-byte aligned as cuMemAlloc's is. */
static int kiln_cuda_alloc(KilnCudaInstance *in, CUdeviceptr *p, size_t bytes) {
    (void)in;
    void *m = NULL;
    if (posix_memalign(&m, 256, bytes ? bytes : 1) != 0)
        return 1;
    *p = (CUdeviceptr)(uintptr_t)m;
    return 0;
}
static void kiln_cuda_release(KilnCudaInstance *in, CUdeviceptr p) {
    (void)in;
    free((void *)(uintptr_t)p);
}
static int kiln_cuda_upload(KilnCudaInstance *in, CUdeviceptr dst, const void *src, size_t bytes) {
    (void)in;
    if (bytes)
        memcpy((void *)(uintptr_t)dst, src, bytes);
    return 0;
}
#else
static int kiln_cuda_alloc(KilnCudaInstance *in, CUdeviceptr *p, size_t bytes) {
    return in->api.cuMemAlloc(p, bytes ? bytes : 1) != 0;
}
static void kiln_cuda_release(KilnCudaInstance *in, CUdeviceptr p) {
    if (p)
        in->api.cuMemFree(p);
}
static int kiln_cuda_upload(KilnCudaInstance *in, CUdeviceptr dst, const void *src, size_t bytes) {
    return bytes && in->api.cuMemcpyHtoD(dst, src, bytes) != 0;
}
#endif

static void kiln_cuda_destroy(void *instance) {
    KilnCudaInstance *in = instance;
    if (!in)
        return;
    const KilnCudaProgram *p = in->prog;
    if (in->ctx)
        in->api.cuCtxSetCurrent(in->ctx);
    for (int i = 0; in->inputs && i < p->n_inputs; i++)
        kiln_cuda_release(in, in->inputs[i]);
    for (int i = 0; in->outputs && i < p->n_outputs; i++)
        kiln_cuda_release(in, in->outputs[i]);
    kiln_cuda_release(in, in->in_table);
    kiln_cuda_release(in, in->out_table);
    kiln_cuda_release(in, in->wt);
    kiln_cuda_release(in, in->st);
    kiln_cuda_release(in, in->ws);
    kiln_cuda_release(in, in->fault);
    for (int k = 0; in->events && k <= p->n_kernels; k++)
        if (in->events[k])
            in->api.cuEventDestroy(in->events[k]);
    if (in->stream)
        in->api.cuStreamDestroy(in->stream);
    if (in->module)
        in->api.cuModuleUnload(in->module);
    if (in->ctx)
        in->api.cuDevicePrimaryCtxRelease(in->device);
    if (in->api.nvrtc)
        dlclose(in->api.nvrtc);
    if (in->api.cuda)
        dlclose(in->api.cuda);
    free(in->functions);
    free(in->events);
    free(in->staging);
    free(in->inputs);
    free(in->outputs);
    free(in);
}

#define KILN_CUDA_CHECK(call, what)                                                                          \
    do {                                                                                                     \
        CUresult kiln_rc = (call);                                                                           \
        if (kiln_rc != 0) {                                                                                  \
            kiln_cuda_error(err, errlen, "%s failed: %s", what, kiln_cuda_strerror(&in->api, kiln_rc));      \
            return 1;                                                                                        \
        }                                                                                                    \
    } while (0)

#ifndef KILN_CUDA_EMULATE
static int kiln_cuda_open_device(KilnCudaInstance *in, char *err, size_t errlen) {
    KilnCudaApi *api = &in->api;
    if (kiln_cuda_load_driver(api, err, errlen))
        return 1;
    int count = 0;
    CUresult rc = api->cuInit(0);
    if (rc == 0)
        rc = api->cuDeviceGetCount(&count);
    if (rc != 0 || count == 0) {
        kiln_cuda_error(err, errlen, "no CUDA device here (%s); the CUDA target needs an NVIDIA GPU",
                        rc != 0 ? kiln_cuda_strerror(api, rc) : "the driver sees none");
        return 1;
    }
    const char *env = getenv("KILN_CUDA_DEVICE");
    int ordinal = env && *env ? atoi(env) : 0;
    if (ordinal < 0 || ordinal >= count) {
        kiln_cuda_error(err, errlen, "KILN_CUDA_DEVICE=%s: there are %d CUDA devices", env, count);
        return 1;
    }
    KILN_CUDA_CHECK(api->cuDeviceGet(&in->device, ordinal), "cuDeviceGet");
    KILN_CUDA_CHECK(api->cuDevicePrimaryCtxRetain(&in->ctx, in->device), "cuDevicePrimaryCtxRetain");
    KILN_CUDA_CHECK(api->cuCtxSetCurrent(in->ctx), "cuCtxSetCurrent");
    return 0;
}

/* The kernels' binary for this device: from the cache, or compiled by NVRTC (and
 * stored there); then loaded, and every kernel found in it. */
static int kiln_cuda_load_module(KilnCudaInstance *in, char *err, size_t errlen) {
    KilnCudaApi *api = &in->api;
    const KilnCudaProgram *p = in->prog;
    int major = 0, minor = 0;
    char device[256] = "";
    KILN_CUDA_CHECK(
        api->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, in->device),
        "cuDeviceGetAttribute");
    KILN_CUDA_CHECK(
        api->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, in->device),
        "cuDeviceGetAttribute");
    KILN_CUDA_CHECK(api->cuDeviceGetName(device, (int)sizeof device - 1, in->device), "cuDeviceGetName");
    int arch = major * 10 + minor;
    unsigned long long h[2] = {0xcbf29ce484222325ull, 0x84222325cbf29ce4ull};
    for (int k = 0; k < 2; k++) {
        h[k] = kiln_cuda_fnv(h[k], p->source, strlen(p->source));
        h[k] = kiln_cuda_fnv(h[k], device, strlen(device));
        h[k] = kiln_cuda_fnv(h[k], &arch, sizeof arch);
    }
    char dir[4096], path[4200] = "", key[64];
    snprintf(key, sizeof key, "%016llx%016llx-sm%d", h[0], h[1], arch);
    if (kiln_cuda_cache_dir(dir, sizeof dir))
        snprintf(path, sizeof path, "%s/cuda-%s.cubin", dir, key);
    size_t len = 0;
    int corrupt = 0;
    unsigned char *cubin = path[0] ? kiln_cuda_cache_read(path, key, &len, &corrupt) : NULL;
    if (cubin && api->cuModuleLoadData(&in->module, cubin) != 0) {
        free(cubin);
        cubin = NULL;
        corrupt = 1;
    }
    if (corrupt) /* compiled afresh below, and the entry overwritten */
        kiln_cuda_cache_warn(path);
    if (!cubin) {
        if (kiln_cuda_load_nvrtc(api, err, errlen) ||
            kiln_cuda_nvrtc_compile(api, p->source, arch, 0, &cubin, &len, err, errlen))
            return 1;
        CUresult rc = api->cuModuleLoadData(&in->module, cubin);
        if (rc == 0 && path[0])
            kiln_cuda_write(path, key, cubin, len);
        free(cubin);
        KILN_CUDA_CHECK(rc, "cuModuleLoadData");
    } else {
        free(cubin);
    }
    for (int k = 0; k < p->n_kernels; k++)
        if (!p->launches[k].allreduce)
            KILN_CUDA_CHECK(api->cuModuleGetFunction(&in->functions[k], in->module, p->launches[k].name),
                            p->launches[k].name);
    KILN_CUDA_CHECK(api->cuStreamCreate(&in->stream, 0), "cuStreamCreate");
    if (p->profile) {
        if (!(in->events = calloc((size_t)p->n_kernels + 1, sizeof *in->events))) {
            kiln_cuda_error(err, errlen, "out of memory creating the instance");
            return 1;
        }
        for (int k = 0; k <= p->n_kernels; k++)
            KILN_CUDA_CHECK(api->cuEventCreate(&in->events[k], 0), "cuEventCreate");
    }
    return 0;
}
#endif

/* Device memory of `bytes`, filled from `from` when not NULL. */
static int kiln_cuda_buffer(KilnCudaInstance *in, CUdeviceptr *p, const void *from, int64_t bytes,
                            const char *what, char *err, size_t errlen) {
    if (kiln_cuda_alloc(in, p, (size_t)bytes)) {
        *p = 0;
        kiln_cuda_error(err, errlen, "out of device memory: %s needs %lld bytes", what, (long long)bytes);
        return 1;
    }
    if (from && kiln_cuda_upload(in, *p, from, (size_t)bytes)) {
        kiln_cuda_error(err, errlen, "cannot copy %s to the device", what);
        return 1;
    }
    return 0;
}

static int kiln_cuda_setup(KilnCudaInstance *in, char *err, size_t errlen) {
    const KilnCudaProgram *p = in->prog;
    if (!(in->functions = calloc((size_t)p->n_kernels + 1, sizeof *in->functions)) ||
        !(in->inputs = calloc((size_t)p->n_inputs + 1, sizeof *in->inputs)) ||
        !(in->outputs = calloc((size_t)p->n_outputs + 1, sizeof *in->outputs))) {
        kiln_cuda_error(err, errlen, "out of memory creating the instance");
        return 1;
    }
#ifndef KILN_CUDA_EMULATE
    if (kiln_cuda_open_device(in, err, errlen) || kiln_cuda_load_module(in, err, errlen))
        return 1;
#endif
    if (kiln_cuda_buffer(in, &in->wt, p->weights, p->weights_bytes, "the weights", err, errlen) ||
        kiln_cuda_buffer(in, &in->st, p->weights, p->state_bytes, "the params a step updates", err, errlen) ||
        kiln_cuda_buffer(in, &in->ws, NULL, p->workspace_bytes, "the workspace", err, errlen) ||
        kiln_cuda_buffer(in, &in->fault, NULL, sizeof(int), "the fault word", err, errlen))
        return 1;
    for (int i = 0; i < p->n_inputs; i++)
        if (kiln_cuda_buffer(in, &in->inputs[i], NULL, p->input_bytes[i], "an input", err, errlen))
            return 1;
    for (int i = 0; i < p->n_outputs; i++)
        if (kiln_cuda_buffer(in, &in->outputs[i], NULL, p->output_bytes[i], "an output", err, errlen))
            return 1;
    if (kiln_cuda_buffer(in, &in->in_table, in->inputs, (int64_t)sizeof(CUdeviceptr) * p->n_inputs,
                         "the inputs", err, errlen) ||
        kiln_cuda_buffer(in, &in->out_table, in->outputs, (int64_t)sizeof(CUdeviceptr) * p->n_outputs,
                         "the outputs", err, errlen))
        return 1;
    in->args.in = (const float *const *)(uintptr_t)in->in_table;
    in->args.out = (float *const *)(uintptr_t)in->out_table;
    in->args.ws = (float *)(uintptr_t)in->ws;
    in->args.wt = (const float *)(uintptr_t)in->wt;
    in->args.st = (float *)(uintptr_t)in->st;
    in->args.fault = (int *)(uintptr_t)in->fault;
    return 0;
}

/* The host memory for the largest allreduce's operand, where it is not emulated. */
static int kiln_cuda_staging(KilnCudaInstance *in) {
#ifdef KILN_CUDA_EMULATE
    (void)in;
    return 0;
#else
    int64_t most = 0;
    for (int k = 0; k < in->prog->n_kernels; k++)
        if (in->prog->launches[k].allreduce && in->prog->launches[k].allreduce->count > most)
            most = in->prog->launches[k].allreduce->count;
    return most && !(in->staging = malloc((size_t)most * sizeof *in->staging));
#endif
}

static int kiln_cuda_create(const KilnCudaProgram *prog, const kiln_comm *comm, void **instance, char *err,
                            size_t errlen) {
    *instance = NULL;
    if (comm && (comm->size < 1 || comm->rank < 0 || comm->rank >= comm->size || !comm->allreduce_sum)) {
        kiln_cuda_error(err, errlen, "the communicator is malformed (rank %d of %d processes%s)",
                        (int)comm->rank, (int)comm->size, comm->allreduce_sum ? "" : ", no allreduce_sum");
        return 1;
    }
    KilnCudaInstance *in = calloc(1, sizeof *in);
    if (!in) {
        kiln_cuda_error(err, errlen, "out of memory creating the instance");
        return 1;
    }
    in->prog = prog;
    if (comm)
        in->comm = *comm;
    if (kiln_cuda_staging(in)) {
        kiln_cuda_error(err, errlen, "out of memory creating the instance");
        kiln_cuda_destroy(in);
        return 1;
    }
    if (kiln_cuda_setup(in, err, errlen)) {
        kiln_cuda_destroy(in);
        return 1;
    }
    *instance = in;
    return 0;
}

static CUdeviceptr kiln_cuda_place(const KilnCudaInstance *in, KilnCudaPlace at) {
    switch (at.buffer) {
    case KILN_CUDA_IN: return in->inputs[at.at];
    case KILN_CUDA_OUT: return in->outputs[at.at];
    case KILN_CUDA_WT: return in->wt + (CUdeviceptr)at.at;
    case KILN_CUDA_ST: return in->st + (CUdeviceptr)at.at;
    default: return in->ws + (CUdeviceptr)at.at;
    }
}

/* The communicator's sum (or mean) of the allreduce's floats at x, in place; the allreduce's
   fault number when it fails, else 0. */
static int kiln_cuda_reduce(const KilnCudaInstance *in, const KilnCudaAllreduce *a, float *x) {
    const kiln_comm *c = &in->comm;
    if (c->size <= 1)
        return 0;
    if (c->allreduce_sum(c->ctx, x, x, a->count, KILN_F32) != 0)
        return a->fault;
    if (a->mean)
        for (int64_t i = 0; i < a->count; i++)
            x[i] = x[i] / (float)c->size;
    return 0;
}

/* A port's bytes at size `size` of the symbolic dim (0: the whole port). */
static size_t kiln_cuda_port_bytes(int64_t bytes, int64_t unit_bytes, int64_t size) {
    return (size_t)(size && unit_bytes ? size * unit_bytes : bytes);
}

/* l's iteration count, and its grid in `grid`, at size `size` of the symbolic dim
   (0: as compiled, for the bound). */
static int64_t kiln_cuda_count(const KilnCudaLaunch *l, int64_t size, unsigned grid[3]) {
    memcpy(grid, l->grid, sizeof l->grid);
    if (!size || !l->sym.rows)
        return l->count;
    int64_t count = (size * l->sym.rows + l->sym.tile - 1) / l->sym.tile * l->sym.width;
    if (l->sym.grid_axis >= 0) {
        grid[l->sym.grid_axis] = (unsigned)count;
        return l->count;
    }
    grid[0] = (unsigned)((count + l->block - 1) / l->block);
    return count;
}

#ifdef KILN_CUDA_EMULATE
#include <time.h>

/* An allreduce between launches, on device memory that is host memory here. */
static int kiln_cuda_allreduce(KilnCudaInstance *in, const KilnCudaAllreduce *a) {
    const float *src = (const float *)(uintptr_t)kiln_cuda_place(in, a->src);
    float *dst = (float *)(uintptr_t)kiln_cuda_place(in, a->dst);
    if (src != dst)
        memcpy(dst, src, (size_t)a->count * sizeof *dst);
    return kiln_cuda_reduce(in, a, dst);
}

static double kiln_cuda_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int kiln_cuda_run_at(KilnCudaInstance *in, int64_t size, const void *const *inputs,
                            void *const *outputs) {
    const KilnCudaProgram *p = in->prog;
    *in->args.fault = 0;
    for (int i = 0; i < p->n_inputs; i++)
        kiln_cuda_upload(in, in->inputs[i], inputs[i],
                         kiln_cuda_port_bytes(p->input_bytes[i], p->in_unit_bytes[i], size));
    for (int k = 0; k < p->n_kernels; k++) {
        const KilnCudaLaunch *l = &p->launches[k];
        double start = p->profile ? kiln_cuda_now() : 0;
        int fault;
        unsigned grid[3];
        int64_t count = kiln_cuda_count(l, size, grid);
        if (!l->allreduce)
            kiln_emu_launch(p->emulated[k], in->args, count, grid, l->block, l->cooperative);
        else if ((fault = kiln_cuda_allreduce(in, l->allreduce)) != 0)
            *in->args.fault = fault;
        if (p->profile)
            p->profile[k] += kiln_cuda_now() - start;
    }
    for (int i = 0; i < p->n_outputs; i++)
        if (p->output_bytes[i])
            memcpy(outputs[i], (const void *)(uintptr_t)in->outputs[i],
                   kiln_cuda_port_bytes(p->output_bytes[i], p->out_unit_bytes[i], size));
    return *in->args.fault;
}
#else
static int kiln_cuda_run_failed(const KilnCudaInstance *in, const char *what, CUresult rc) {
    fprintf(stderr, "kiln: the CUDA model failed to run: %s: %s\n", what, kiln_cuda_strerror(&in->api, rc));
    return 1;
}

/* An allreduce between launches, through the host: the allreduce's fault number
   when the communicator fails, -1 when a copy does (reported), else 0. */
static int kiln_cuda_allreduce(KilnCudaInstance *in, const KilnCudaAllreduce *a) {
    const KilnCudaApi *api = &in->api;
    size_t bytes = (size_t)a->count * sizeof *in->staging;
    CUresult rc = api->cuMemcpyDtoHAsync(in->staging, kiln_cuda_place(in, a->src), bytes, in->stream);
    if (rc == 0)
        rc = api->cuStreamSynchronize(in->stream);
    if (rc != 0) {
        kiln_cuda_run_failed(in, "copying an allreduce's operand to the host", rc);
        return -1;
    }
    int fault = kiln_cuda_reduce(in, a, in->staging);
    if (fault)
        return fault;
    if ((rc = api->cuMemcpyHtoDAsync(kiln_cuda_place(in, a->dst), in->staging, bytes, in->stream)) != 0) {
        kiln_cuda_run_failed(in, "copying an allreduce's result to the device", rc);
        return -1;
    }
    return 0;
}

static int kiln_cuda_run_at(KilnCudaInstance *in, int64_t size, const void *const *inputs,
                            void *const *outputs) {
    const KilnCudaProgram *p = in->prog;
    const KilnCudaApi *api = &in->api;
    int comm_fault = 0;
    CUresult rc = api->cuCtxSetCurrent(in->ctx);
    if (rc != 0)
        return kiln_cuda_run_failed(in, "cuCtxSetCurrent", rc);
    int fault = 0;
    if ((rc = api->cuMemcpyHtoDAsync(in->fault, &fault, sizeof fault, in->stream)) != 0)
        return kiln_cuda_run_failed(in, "clearing the fault word", rc);
    for (int i = 0; i < p->n_inputs; i++)
        if (p->input_bytes[i] &&
            (rc = api->cuMemcpyHtoDAsync(in->inputs[i], inputs[i],
                                         kiln_cuda_port_bytes(p->input_bytes[i], p->in_unit_bytes[i], size),
                                         in->stream)) != 0)
            return kiln_cuda_run_failed(in, "copying an input to the device", rc);
    for (int k = 0; k < p->n_kernels; k++) {
        const KilnCudaLaunch *l = &p->launches[k];
        unsigned grid[3];
        int64_t count = kiln_cuda_count(l, size, grid);
        void *params[] = {&in->args, &count};
        if (in->events && (rc = api->cuEventRecord(in->events[k], in->stream)) != 0)
            return kiln_cuda_run_failed(in, "cuEventRecord", rc);
        if (l->allreduce) {
            int f = kiln_cuda_allreduce(in, l->allreduce);
            if (f < 0)
                return 1;
            comm_fault = f ? f : comm_fault;
            continue;
        }
        if (grid[0] && grid[1] && grid[2] &&
            (rc = api->cuLaunchKernel(in->functions[k], grid[0], grid[1], grid[2], l->block, 1, 1, 0,
                                      in->stream, params, NULL)) != 0)
            return kiln_cuda_run_failed(in, l->name, rc);
    }
    if (in->events && (rc = api->cuEventRecord(in->events[p->n_kernels], in->stream)) != 0)
        return kiln_cuda_run_failed(in, "cuEventRecord", rc);
    for (int i = 0; i < p->n_outputs; i++)
        if (p->output_bytes[i] &&
            (rc = api->cuMemcpyDtoHAsync(outputs[i], in->outputs[i],
                                         kiln_cuda_port_bytes(p->output_bytes[i], p->out_unit_bytes[i], size),
                                         in->stream)) != 0)
            return kiln_cuda_run_failed(in, "copying an output from the device", rc);
    if ((rc = api->cuMemcpyDtoHAsync(&fault, in->fault, sizeof fault, in->stream)) != 0)
        return kiln_cuda_run_failed(in, "reading the fault word", rc);
    if ((rc = api->cuStreamSynchronize(in->stream)) != 0)
        return kiln_cuda_run_failed(in, "running the kernels", rc);
    for (int k = 0; in->events && k < p->n_kernels; k++) {
        float ms = 0;
        if ((rc = api->cuEventElapsedTime(&ms, in->events[k], in->events[k + 1])) != 0)
            return kiln_cuda_run_failed(in, "cuEventElapsedTime", rc);
        p->profile[k] += 1e-3 * ms;
    }
    return fault ? fault : comm_fault;
}
#endif

/* A param's bytes in the state, copied out or in between runs (kiln_model_def's
   read_param and write_param). */
#ifdef KILN_CUDA_EMULATE
static int kiln_cuda_read_state(void *instance, int64_t offset, int64_t bytes, void *dst) {
    const KilnCudaInstance *in = instance;
    memcpy(dst, (const void *)(uintptr_t)(in->st + (CUdeviceptr)offset), (size_t)bytes);
    return 0;
}
#else
static int kiln_cuda_read_state(void *instance, int64_t offset, int64_t bytes, void *dst) {
    KilnCudaInstance *in = instance;
    const KilnCudaApi *api = &in->api;
    CUresult rc = api->cuCtxSetCurrent(in->ctx);
    if (rc == 0 && bytes)
        rc = api->cuMemcpyDtoHAsync(dst, in->st + (CUdeviceptr)offset, (size_t)bytes, in->stream);
    if (rc == 0)
        rc = api->cuStreamSynchronize(in->stream);
    return rc != 0 ? kiln_cuda_run_failed(in, "copying a param from the device", rc) : 0;
}
#endif

static int kiln_cuda_write_state(void *instance, int64_t offset, int64_t bytes, const void *src) {
    KilnCudaInstance *in = instance;
#ifndef KILN_CUDA_EMULATE
    if (in->api.cuCtxSetCurrent(in->ctx) != 0)
        return 1;
#endif
    return kiln_cuda_upload(in, in->st + (CUdeviceptr)offset, src, (size_t)bytes);
}

/* A run at sizes[0] of the symbolic dim (ignored without one): -1 when that is not
 * from 1 to the bound. Only the first that many units of each port with the dim are
 * copied, and only the iterations that compute them launched; the device rows past
 * them keep what an earlier run left, which no row before them reads. */
static int kiln_cuda_run_sym(void *instance, const int64_t *sizes, const void *const *inputs,
                             void *const *outputs) {
    KilnCudaInstance *in = instance;
    int64_t bound = in->prog->sym_bound;
    if (bound && (sizes[0] < 1 || sizes[0] > bound))
        return -1;
    return kiln_cuda_run_at(in, bound ? sizes[0] : 0, inputs, outputs);
}

static int kiln_cuda_run(void *instance, const void *const *inputs, void *const *outputs) {
    return kiln_cuda_run_at(instance, 0, inputs, outputs);
}
