/* kiln_jit: compiling a model in process and loading it, with a compile cache.
 *
 * The model is parsed, optimized and lowered, and the C is generated. Where kiln was
 * built with Clang and LLVM (KILN_HAVE_CLANG_JIT) and $KILN_JIT is not `cc`, the C
 * is compiled and linked in memory (jit_clang.cpp), its object file cached as
 * KEY.o. Otherwise the system compiler makes a shared object, cached as KEY.so, and
 * it is dlopened. KEY is a hash of the generated source, the weights, the
 * compiler flags and the CPU; only a miss compiles. Each entry carries its key and
 * a checksum (codegen/cache.c); one that fails them, or whose shared object fails
 * the loader's checks, is compiled again and overwritten, with one warning. The cache directory is
 * $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else ~/.cache/kiln; when it cannot be used, the clang JIT
 * caches nothing and the shared object is built in a temporary file removed once
 * loaded. */
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

static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
    const unsigned char *b = data;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* Hashes this CPU's model name and feature flags: -march=native code built on one
 * CPU may not run on another that shares the cache directory. */
static uint64_t cpu_hash(uint64_t h) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[8192];
    int seen = 0;
    while (f && seen < 2 && fgets(line, sizeof line, f))
        if (strncmp(line, "model name", 10) == 0 || strncmp(line, "flags", 5) == 0) {
            h = fnv1a(h, line, strlen(line));
            seen++;
        }
    if (f)
        fclose(f);
    return h;
}

/* Two independent 64-bit hashes of everything that determines the shared object. */
static void cache_key(const Source *src, const Program *p, const char *cpu, char *key, size_t n) {
    uint64_t h[2] = {0xcbf29ce484222325ull, 0x84222325cbf29ce4ull};
    for (int k = 0; k < 2; k++) {
        h[k] = cpu_hash(h[k]);
        h[k] = fnv1a(h[k], src->host.s, src->host.len);
        if (src->emulated)
            h[k] = fnv1a(h[k], src->kernels.s, src->kernels.len);
        h[k] = fnv1a(h[k], p->weights, (size_t)p->weights_bytes);
        for (size_t f = 0; f < sizeof cc_flags / sizeof *cc_flags; f++)
            h[k] = fnv1a(h[k], cc_flags[f], strlen(cc_flags[f]) + 1);
        h[k] = fnv1a(h[k], cpu, strlen(cpu) + 1);
        const char *compilers[] = {getenv("KILN_CC"), getenv("KILN_CXX")};
        for (int c = 0; c < 2; c++)
            if (compilers[c])
                h[k] = fnv1a(h[k], compilers[c], strlen(compilers[c]) + 1);
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
    const char *env = getenv("KILN_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (given && *given)
        snprintf(dir, n, "%s", given);
    else if (env && *env)
        snprintf(dir, n, "%s", env);
    else if (xdg && *xdg)
        snprintf(dir, n, "%s/kiln", xdg);
    else if (home && *home)
        snprintf(dir, n, "%s/.cache/kiln", home);
    else
        return false;
    return make_dirs(dir) && access(dir, W_OK) == 0;
}

/* The in-process JIT, unless it is not built or $KILN_JIT=cc asks for the system compiler. */
static kiln_module *jit_in_process(const Graph *g, const Program *p, const Str *src, const char *cpu,
                                   const char *dir, const char *key, Diag *d, kiln_error *err, bool *used) {
#ifdef KILN_HAVE_CLANG_JIT
    const char *how = getenv("KILN_JIT");
    *used = !how || strcmp(how, "cc") != 0;
    if (!*used)
        return NULL;
    const kiln_model_def *def = NULL;
    char msg[2048];
    void *h = clang_jit_compile(src->s, src->len, p->weights, (size_t)p->weights_bytes, cpu, dir, key, &def,
                                msg, sizeof msg);
    if (h) {
        kiln_module *m = kiln_module_new(h, clang_jit_free, def, g->name, err);
        if (!m)
            diag_relay(d, err->message);
        return m;
    }
    diag_relay(d, msg); /* kiln's own failure when Clang rejected the generated code */
    kiln_set_error(err, "cannot compile the model");
    return NULL;
#else
    (void)g, (void)p, (void)src, (void)cpu, (void)dir, (void)key, (void)d, (void)err;
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
                    const char *cpu, Diag *d) {
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
    int rc = cc_compile_so(src, p, tmp, cpu, d);
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
static kiln_module *jit(Graph *g, const TensorList *weights, const JitOptions *o, bool profile, Diag *d,
                        kiln_error *err) {
    Program *p = program_lower(g, weights, o->target, o->memplan, d);
    Source src = {0};
    if (p)
        p->profile = profile;
    if (p && o->report)
        plan_report(p, o->report);
    if (!p || program_source(p, &src, d) || (o->dump_dir && dump_source(o->dump_dir, p, &src, d))) {
        program_free(p);
        source_free(&src);
        kiln_set_error(err, "cannot compile the model");
        return NULL;
    }
    char dir[4096], key[40], path[4200];
    const char *cpu = o->cpu ? o->cpu : "native";
    if (!cc_cpu_valid(cpu)) {
        diag_error(d, (Loc){0}, "unknown cpu '%s' (native, x86-64, x86-64-v2, x86-64-v3 or x86-64-v4)", cpu);
        program_free(p);
        source_free(&src);
        kiln_set_error(err, "cannot compile the model");
        return NULL;
    }
    cache_key(&src, p, cpu, key, sizeof key);
    bool cached = cache_dir(o->cache, dir, sizeof dir), in_process = false;
    kiln_module *m = profile || src.emulated ? NULL
                                             : jit_in_process(g, p, &src.host, cpu, cached ? dir : NULL, key,
                                                              d, err, &in_process);
    if (in_process) {
        program_free(p);
        source_free(&src);
        return m;
    }
    if (cached)
        snprintf(path, sizeof path, "%s/%s.so", dir, key);
    else {
        const char *tmp = getenv("TMPDIR");
        /* unique to this call: threads compiling the same model each load and
           remove a file of their own */
        static atomic_ulong serial;
        snprintf(path, sizeof path, "%s/kiln-jit-%s-%ld-%lu.so", tmp && *tmp ? tmp : "/tmp", key,
                 (long)getpid(), atomic_fetch_add(&serial, 1));
    }
    /* an uncached shared object lives only until it is loaded; a signal meanwhile
       removes it */
    int slot = cached ? -1 : tempfiles_add(path);
    if ((cached && so_entry(&src, p, path, key, g->name, cpu, d) == 0) ||
        (!cached && cc_compile_so(&src, p, path, cpu, d) == 0)) {
        if (!(m = kiln_module_open(path, g->name, err)))
            diag_relay(d, err->message);
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

kiln_module *jit_graph(Graph *g, const TensorList *weights, const JitOptions *o, Diag *d, kiln_error *err) {
    return jit(g, weights, o, false, d, err);
}

kiln_module *jit_graph_profiled(Graph *g, const TensorList *weights, const JitOptions *o, Diag *d,
                                kiln_error *err) {
    return jit(g, weights, o, true, d, err);
}

/* A parsed or imported graph compiled as the library's options say: their weights
 * files after any the graph came with, their target and -O level. */
static kiln_module *jit_loaded(Graph *g, TensorList *weights, const kiln_options *opts, Diag *d,
                               kiln_error *err) {
    int ok = 1;
    for (int i = 0; ok && opts && i < opts->n_weights; i++)
        ok = safetensors_read(opts->weights[i], weights, d) == 0;
    PipelineOptions po = {.level = opts ? opts->opt_level : 2, .verify = true, .lower = true};
    Target target = TARGET_C;
    if (ok && opts && opts->target && strcmp(opts->target, "c") != 0 && strcmp(opts->target, "cuda") != 0) {
        diag_error(d, (Loc){0}, "unknown target '%s' (c or cuda)", opts->target);
        ok = 0;
    } else if (opts && opts->target && strcmp(opts->target, "cuda") == 0) {
        target = TARGET_CUDA;
    }
    JitOptions jo = {opts ? opts->cache_dir : NULL, target, pipeline_selects(&po, "memplan"), NULL, NULL,
                     opts ? opts->cpu : NULL};
    if (ok && pipeline_run(g, weights, &po, d) == 0)
        return jit_graph(g, weights, &jo, d, err);
    return NULL;
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
    Graph *g = src ? parse_model(src, &d) : NULL;
    TensorList weights = {0};
    if (g && verify_graph(g, &d) == 0)
        m = jit_loaded(g, &weights, opts, &d, err);
    if (f)
        fclose(f);
    if (!m && msg && *msg)
        kiln_set_error(err, "%s", msg);
    else if (!m && !src)
        kiln_set_error(err, "out of memory");
    free(msg);
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
    if (f)
        fclose(f);
    if (!m && msg && *msg)
        kiln_set_error(err, "%s", msg);
    else if (!m)
        kiln_set_error(err, "cannot import '%s'", path);
    free(msg);
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
        kiln_set_error(err, "%s", msg && *msg ? msg : "cannot read the model");
    free(msg);
    srcfile_free(src);
    return m;
}
