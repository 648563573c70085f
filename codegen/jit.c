/* kiln_jit: compiling a model in process and loading it, with a compile cache.
 *
 * The model is parsed, optimized and lowered, and the C is generated. Where kiln was
 * built with Clang and LLVM (KILN_HAVE_CLANG_JIT) and kiln_options.jit is not `cc`, the C
 * is compiled and linked in memory (jit_clang.cpp), its object file cached as
 * KEY.o. Otherwise the system compiler makes a shared object, cached as KEY.so, and
 * it is dlopened. KEY is a hash of the generated source, the precompiled kernels,
 * the compiler flags and the CPU, and for a shared object the weights it holds;
 * only a miss compiles. Each entry carries its key and
 * a checksum (codegen/cache.c); one that fails them, or whose shared object fails
 * the loader's checks, is compiled again and overwritten, with one warning. The cache directory is
 * kiln_options.cache_dir (its default from the environment: codegen/options.c); without one, or
 * when it cannot be used, the clang JIT caches nothing and the shared object is built
 * in a temporary file removed once loaded.
 *
 * A library call's diagnostics become its kiln_error: the text, and the kind of the
 * worst of them. An internal assertion that failed on the way (KILN_ASSERT) makes
 * the call fail as kiln's own error even where everything else went well: its
 * result cannot be trusted. */
#include "codegen.h"
#include "jit.h"
#include "cache.h"
#include "../frontend/frontend.h"
#include "../ir/tempfiles.h"
#include "../passes/passes.h"
#include "../runtime/module.h"
#ifdef KILN_HAVE_CLANG_JIT
#include "jit_clang.h"
#endif

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* One lane of the cache key: a multiplicative hash of data, 8 bytes a step (the
 * weights of a large model are tens of megabytes, hashed on every load). */
static uint64_t hash_bytes(uint64_t h, uint64_t mul, const void *data, size_t n) {
    const unsigned char *b = data;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, sizeof w);
        h = (h ^ w) * mul;
        h ^= h >> 29;
    }
    for (; i < n; i++)
        h = (h ^ b[i]) * mul;
    return h;
}

static uint64_t hash_string(uint64_t h, uint64_t mul, const char *s) {
    return hash_bytes(h, mul, s, strlen(s) + 1);
}

/* Hashes this CPU's model name and feature flags: -march=native code built on one
 * CPU may not run on another that shares the cache directory. */
static uint64_t cpu_hash(uint64_t h, uint64_t mul) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[8192];
    int seen = 0;
    while (f && seen < 2 && fgets(line, sizeof line, f))
        if (strncmp(line, "model name", 10) == 0 || strncmp(line, "flags", 5) == 0) {
            h = hash_string(h, mul, line);
            seen++;
        }
    if (f)
        fclose(f);
    return h;
}

/* Two independent 64-bit hashes of everything that determines the compiled code: the
 * source, the precompiled kernels linked in, the compilers, their flags and the CPU,
 * and the weights when they are part of it (a shared object's; the in-process JIT
 * binds them at load, so its object is the same for any weights). */
static void cache_key(const Source *src, const Program *p, const Toolchain *tc, bool weights, char *key,
                      size_t n) {
    const uint64_t seeds[2] = {0xcbf29ce484222325ull, 0x84222325cbf29ce4ull};
    const uint64_t muls[2] = {0x100000001b3ull, 0x9e3779b97f4a7c15ull};
    KernelObject kernels = p->vector_floats > 0 ? cc_kernel_object(p->vector_floats) : (KernelObject){0};
    uint64_t h[2];
    for (int k = 0; k < 2; k++) {
        uint64_t m = muls[k];
        h[k] = cpu_hash(seeds[k], m);
        h[k] = hash_bytes(h[k], m, src->host.s, src->host.len);
        if (src->emulated)
            h[k] = hash_bytes(h[k], m, src->kernels.s, src->kernels.len);
        h[k] = hash_bytes(h[k], m, kernels.bytes, kernels.len);
        if (weights)
            h[k] = hash_bytes(h[k], m, p->weights, (size_t)p->weights_bytes);
        for (size_t f = 0; f < sizeof cc_flags / sizeof *cc_flags; f++)
            h[k] = hash_string(h[k], m, cc_flags[f]);
        h[k] = hash_string(h[k], m, tc->cpu ? tc->cpu : "native");
        const char *compilers[] = {tc->cc, tc->cxx};
        for (int c = 0; c < 2; c++)
            if (compilers[c])
                h[k] = hash_string(h[k], m, compilers[c]);
    }
    snprintf(key, n, "%016llx%016llx", (unsigned long long)h[0], (unsigned long long)h[1]);
}

/* mkdir -p */
static bool make_dirs(const char *path) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(buf, 0777) != 0 && errno != EEXIST)
                return false;
            *p = '/';
        }
    return mkdir(buf, 0777) == 0 || errno == EEXIST;
}

static bool cache_dir(const char *given, char *dir, size_t n) {
    if (!given || !*given || snprintf(dir, n, "%s", given) >= (int)n)
        return false;
    return make_dirs(dir) && access(dir, W_OK) == 0;
}

/* The in-process JIT, unless it is not built or the options ask for the system compiler. */
static kiln_module *jit_in_process(const Graph *g, const Program *p, const Str *src, const JitOptions *o,
                                   const char *dir, const char *key, Diag *d, kiln_error *err, bool *used) {
#ifdef KILN_HAVE_CLANG_JIT
    *used = o->clang;
    if (!*used)
        return NULL;
    const char *cpu = o->tools.cpu ? o->tools.cpu : "native";
    const kiln_model_def *def = NULL;
    char msg[2048];
    KernelObject kernels = p->vector_floats > 0 ? cc_kernel_object(p->vector_floats) : (KernelObject){0};
    void *h = clang_jit_compile(src->s, src->len, p->weights, (size_t)p->weights_bytes, kernels.bytes,
                                kernels.len, cpu, dir, key, &def, msg, sizeof msg);
    if (h) {
        kiln_module *m = kiln_module_new(h, clang_jit_free, def, g->name, err);
        if (!m)
            diag_relay_error(d, err);
        return m;
    }
    /* kiln's own failure when Clang rejected the generated code, which it says */
    diag_relay(d, strstr(msg, "(a bug in kiln") ? DIAG_INTERNAL : DIAG_USER, msg);
    kiln_set_error(err, "cannot compile the model");
    return NULL;
#else
    (void)g, (void)p, (void)src, (void)o, (void)dir, (void)key, (void)d, (void)err;
    *used = false;
    return NULL;
#endif
}

/* DIR/model.c, or DIR/model.cu with the CUDA kernels, for --dump-dir. */
static int dump_source(const char *dir, const Program *p, const Source *src, Diag *d) {
    char path[4200];
    bool cuda = p->target == TARGET_CUDA;
    snprintf(path, sizeof path, "%s/model.%s", dir, cuda ? "cu" : "c");
    const Str *shown = cuda ? &src->kernels : &src->host;
    if (write_file_atomic(path, shown->s, shown->len, d))
        return -1;
    snprintf(path, sizeof path, "%s/model.kir", dir);
    return write_file_atomic(path, src->kir.s ? src->kir.s : "", src->kir.len, d);
}

/* Makes path a good cache entry (codegen/cache.c) for the shared object of src: kept
 * when it is one whose shared object passes the loader's checks, else compiled (into a
 * temporary file beside it) and written, with a warning when a corrupt entry was there. */
static int so_entry(const Source *src, const Program *p, const char *path, const char *key, const char *name,
                    const Toolchain *tc, Diag *d) {
    unsigned char *payload = NULL;
    size_t len = 0;
    kiln_error ignored;
    CacheLookup found = cache_entry_read(path, key, &payload, &len);
    cache_entry_free(payload);
    if (found == CACHE_HIT && kiln_check_shared_object(path, name, &ignored) != 0)
        found = CACHE_CORRUPT;
    if (found == CACHE_HIT)
        return 0;
    if (found == CACHE_CORRUPT)
        cache_entry_warn(path);
    /* a name of its own (mkstemp), as another thread may be building the same entry */
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.build-XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0)
        return diag_error(d, (Loc){0}, "cannot write the cache entry '%s': %s", path, strerror(errno));
    close(fd);
    int slot = tempfiles_add(tmp);
    int rc = cc_compile_so(src, p, tmp, tc, d);
    if (!rc)
        rc = read_file_bytes(tmp, &payload, &len, d);
    unlink(tmp);
    tempfiles_forget(slot);
    if (!rc && cache_entry_write(path, key, payload, len) != 0)
        rc = diag_error(d, (Loc){0}, "cannot write the cache entry '%s'", path);
    ir_free(payload);
    return rc;
}

/* The profiling build is different source, so it has its own cache entry; it is
 * always a dlopened shared object, so that kiln bench can dlsym its kiln_profile. */
static void stage(const JitOptions *o, const char *what) {
    if (o->stage)
        o->stage(what);
}

static kiln_module *jit(Graph *g, const TensorList *weights, const JitOptions *o, bool profile, Diag *d,
                        kiln_error *err) {
    stage(o, "lowering");
    Program *p = program_lower(g, weights, &(LowerOptions){o->target, o->memplan, o->blas, o->tools.cpu}, d);
    Source src = {0};
    if (p)
        p->profile = profile;
    if (p && o->report)
        plan_report(p, o->report);
    if (!p || program_source(p, o->cuda_emulated, &src, d) ||
        (o->dump_dir && dump_source(o->dump_dir, p, &src, d))) {
        program_free(p);
        source_free(&src);
        kiln_set_error(err, "cannot compile the model");
        return NULL;
    }
    char dir[4096], key[40], path[4200];
    if (o->tools.cpu && !cc_cpu_valid(o->tools.cpu)) {
        diag_error(d, (Loc){0}, "unknown cpu '%s' (native, x86-64, x86-64-v2, x86-64-v3 or x86-64-v4)",
                   o->tools.cpu);
        program_free(p);
        source_free(&src);
        kiln_set_error(err, "cannot compile the model");
        return NULL;
    }
    cache_key(&src, p, &o->tools, false, key, sizeof key);
    bool cached = cache_dir(o->cache, dir, sizeof dir), in_process = false;
#ifdef KILN_HAVE_CLANG_JIT
    bool clang = o->clang && !profile && !src.emulated;
#else
    bool clang = false;
#endif
    stage(o, clang ? "compiling its C in process with Clang" : "compiling its C with the system compiler");
    kiln_module *m = profile || src.emulated
                         ? NULL
                         : jit_in_process(g, p, &src.host, o, cached ? dir : NULL, key, d, err, &in_process);
    if (in_process) {
        program_free(p);
        source_free(&src);
        return m;
    }
    cache_key(&src, p, &o->tools, true, key, sizeof key);
    if (cached)
        snprintf(path, sizeof path, "%s/%s.so", dir, key);
    else {
        /* unique to this call: threads compiling the same model each load and
           remove a file of their own */
        static atomic_ulong serial;
        snprintf(path, sizeof path, "%s/kiln-jit-%s-%ld-%lu.so", tempfiles_dir(), key, (long)getpid(),
                 atomic_fetch_add(&serial, 1));
    }
    /* an uncached shared object lives only until it is loaded; a signal meanwhile
       removes it */
    int slot = cached ? -1 : tempfiles_add(path);
    if ((cached && so_entry(&src, p, path, key, g->name, &o->tools, d) == 0) ||
        (!cached && cc_compile_so(&src, p, path, &o->tools, d) == 0)) {
        if (!(m = kiln_module_open(path, g->name, err)))
            diag_relay_error(d, err);
    } else {
        kiln_set_error(err, "cannot compile the model");
    }
    if (!cached) {
        unlink(path);
        tempfiles_forget(slot);
    }
    program_free(p);
    source_free(&src);
    return m;
}

/* Code generated past a failed internal assertion is not handed out to run. */
static kiln_module *checked(kiln_module *m, Diag *d, kiln_error *err) {
    if (!diag_take_assert(d))
        return m;
    kiln_free(m);
    kiln_set_error_kind(err, KILN_ERROR_INTERNAL, "cannot compile the model");
    return NULL;
}

kiln_module *jit_graph(Graph *g, const TensorList *weights, const JitOptions *o, Diag *d, kiln_error *err) {
    return checked(jit(g, weights, o, false, d, err), d, err);
}

kiln_module *jit_graph_profiled(Graph *g, const TensorList *weights, const JitOptions *o, Diag *d,
                                kiln_error *err) {
    return checked(jit(g, weights, o, true, d, err), d, err);
}

/* A parsed or imported graph compiled as the library's options say: their weights
 * files after any the graph came with, their target, -O level and settings. */
static kiln_module *jit_loaded(Graph *g, TensorList *weights, const kiln_options *opts, Diag *d,
                               kiln_error *err) {
    JitOptions jo;
    if (jit_options_from(opts, &jo, d))
        return NULL;
    for (int i = 0; opts && i < opts->n_weights; i++)
        if (safetensors_read(opts->weights[i], weights, d))
            return NULL;
    PipelineOptions po = {.level = opts ? opts->opt_level : 2, .verify = true, .lower = true};
    jo.memplan = pipeline_selects(&po, "memplan");
    if (pipeline_run(g, weights, &po, d) == 0)
        return jit_graph(g, weights, &jo, d, err);
    return NULL;
}

static kiln_error_kind error_kind(const Diag *d) {
    if (!d->errors)
        return KILN_ERROR_USER;
    return d->kind == DIAG_INTERNAL    ? KILN_ERROR_INTERNAL
           : d->kind == DIAG_NO_MEMORY ? KILN_ERROR_NO_MEMORY
                                       : KILN_ERROR_USER;
}

/* The end of a library call: a failed internal assertion fails it too, and err
 * gets the call's diagnostics (their text and kind) when it failed. */
static kiln_module *finish_call(kiln_module *m, Diag *d, FILE *f, char **msg, kiln_error *err) {
    if (diag_take_assert(d)) {
        kiln_free(m);
        m = NULL;
    }
    if (f)
        fclose(f);
    if (!m && *msg && **msg)
        kiln_set_error_kind(err, error_kind(d), "%s", *msg);
    free(*msg);
    *msg = NULL;
    return m;
}

/* The diagnostics of a library call go into err: the first line of them. */
static kiln_module *jit_source(const char *name, const char *text, const kiln_options *opts,
                               kiln_error *err) {
    char *msg = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&msg, &len);
    Diag d;
    diag_init(&d, f ? f : stderr);
    kiln_module *m = NULL;
    SrcFile *src = srcfile_from_string(name, text);
    if (!src)
        diag_error(&d, (Loc){0}, "out of memory");
    Graph *g = src ? parse_model(src, &d) : NULL;
    TensorList weights = {0};
    if (g && verify_graph(g, &d) == 0)
        m = jit_loaded(g, &weights, opts, &d, err);
    m = finish_call(m, &d, f, &msg, err);
    tensors_free(&weights);
    graph_free(g);
    srcfile_free(src);
    return m;
}

kiln_module *kiln_jit(const char *model_text, const kiln_options *opts, kiln_error *err) {
    if (!model_text) {
        kiln_set_error(err, "kiln_jit: the model text is NULL");
        return NULL;
    }
    return jit_source("<model>", model_text, opts, err);
}

/* An ONNX model: imported (frontend/onnx.c) with its weights, then compiled as a
 * parsed one. */
static kiln_module *jit_onnx(const char *path, const kiln_options *opts, kiln_error *err) {
    char *msg = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&msg, &len);
    Diag d;
    diag_init(&d, f ? f : stderr);
    kiln_module *m = NULL;
    TensorList weights = {0};
    Graph *g = onnx_import(path, NULL, 0, &weights, &d);
    if (g)
        m = jit_loaded(g, &weights, opts, &d, err);
    else if (!d.errors)
        diag_error(&d, (Loc){0}, "cannot import '%s'", path);
    m = finish_call(m, &d, f, &msg, err);
    tensors_free(&weights);
    graph_free(g);
    return m;
}

kiln_module *kiln_jit_file(const char *path, const kiln_options *opts, kiln_error *err) {
    if (!path) {
        kiln_set_error(err, "kiln_jit_file: the path is NULL");
        return NULL;
    }
    if (is_onnx_path(path))
        return jit_onnx(path, opts, err);
    char *msg = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&msg, &len);
    Diag d;
    diag_init(&d, f ? f : stderr);
    SrcFile *src = srcfile_read(path, &d);
    if (f)
        fclose(f);
    kiln_module *m = NULL;
    if (src)
        m = jit_source(path, src->text, opts, err);
    else
        kiln_set_error_kind(err, error_kind(&d), "%s", msg && *msg ? msg : "cannot read the model");
    free(msg);
    srcfile_free(src);
    return m;
}
