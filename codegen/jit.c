/* kiln_jit: compiling a model in process and loading it, with a compile cache.
 *
 * The model is parsed, optimized and lowered, and the C is generated. Where kiln was
 * built with Clang and LLVM (KILN_HAVE_CLANG_JIT) and kiln_options.jit is not `cc`, the C
 * is compiled and linked in memory (jit_clang.cpp), as a translation unit a core,
 * each unit's object file cached as KEY.o. Otherwise the system compiler makes a
 * shared object, cached as KEY.so, and it is dlopened. KEY is a hash of the
 * generated source, the precompiled kernels, the compiler flags and the CPU, and for
 * a shared object the weights it holds; only a miss compiles. libkiln's calls also
 * keep the model's lowered weights (KEY.m, the model cache below). Each entry carries its key and
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

static uint64_t hash_string(uint64_t h, uint64_t mul, const char *s) {
    return cache_hash(h, mul, s, strlen(s) + 1);
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

/* Keys are two independent 64-bit hashes of everything that determines what they
 * name. */
static const uint64_t seeds[2] = {0xcbf29ce484222325ull, 0x84222325cbf29ce4ull};
static const uint64_t muls[2] = {0x100000001b3ull, 0x9e3779b97f4a7c15ull};

/* Lane k of a key: what the code is built with (the precompiled kernels of a vector
 * width, the compilers and their flags, the CPU), continuing h. */
static uint64_t toolchain_hash(uint64_t h, int k, int vector_floats, const Toolchain *tc) {
    KernelObject kernels = vector_floats > 0 ? cc_kernel_object(vector_floats) : (KernelObject){0};
    uint64_t m = muls[k];
    h = cpu_hash(h, m);
    h = cache_hash(h, m, kernels.bytes, kernels.len);
    for (size_t f = 0; f < sizeof cc_flags / sizeof *cc_flags; f++)
        h = hash_string(h, m, cc_flags[f]);
    h = hash_string(h, m, tc->cpu ? tc->cpu : "native");
    const char *compilers[] = {tc->cc, tc->cxx};
    for (int c = 0; c < 2; c++)
        if (compilers[c])
            h = hash_string(h, m, compilers[c]);
    return h;
}

static void key_text(const uint64_t *h, char *key, size_t n) {
    snprintf(key, n, "%016llx%016llx", (unsigned long long)h[0], (unsigned long long)h[1]);
}

/* A shared object's key: its source and the weights it holds, with the toolchain. */
static void cache_key(const Source *src, const Program *p, const Toolchain *tc, char *key, size_t n) {
    uint64_t h[2];
    for (int k = 0; k < 2; k++) {
        uint64_t m = muls[k];
        h[k] = toolchain_hash(seeds[k], k, p->vector_floats, tc);
        h[k] = cache_hash(h[k], m, src->host.s, src->host.len);
        if (src->emulated)
            h[k] = cache_hash(h[k], m, src->kernels.s, src->kernels.len);
        h[k] = cache_hash(h[k], m, p->weights, (size_t)p->weights_bytes);
    }
    key_text(h, key, n);
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

/* The in-process JIT compiles a model as up to MAX_UNITS translation units at once,
 * one a core (emit_c_units), each cached by its own key: a hash of its source and
 * of the toolchain (not the weights: the JIT binds them when it links). */
enum { MAX_UNITS = 4, OBJECT_KEY_BYTES = 40 };

typedef struct {
    int n;
    char keys[MAX_UNITS][OBJECT_KEY_BYTES + 1];
} UnitKeys;

/* The units of p: one a core, but at least 8 kernels a unit (a small model's compile
 * is its fixed costs, which every unit pays again). */
static int unit_count(const Program *p) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int n = cores < 1 ? 1 : cores > MAX_UNITS ? MAX_UNITS : (int)cores;
    int most = p->n_kernels / 8;
    return n < most ? n : most < 1 ? 1 : most;
}

#ifdef KILN_HAVE_CLANG_JIT
/* Links the units of *keys (sources: their C, or NULL for cached objects only) with
 * the weights blob into a module named after g; NULL with why in msg. */
static kiln_module *link_units(const Graph *g, const UnitKeys *keys, const Str *sources, const void *blob,
                               size_t blob_bytes, const JitOptions *o, const char *dir, char *msg, size_t n,
                               kiln_error *err) {
    const char *texts[MAX_UNITS], *key_ptrs[MAX_UNITS];
    size_t lens[MAX_UNITS];
    for (int u = 0; u < keys->n; u++) {
        texts[u] = sources ? sources[u].s : NULL;
        lens[u] = sources ? sources[u].len : 0;
        key_ptrs[u] = keys->keys[u];
    }
    KernelObject kernels = cc_kernel_object(cc_vector_floats(o->tools.cpu));
    const kiln_model_def *def = NULL;
    void *h =
        clang_jit_compile(keys->n, sources ? texts : NULL, lens, key_ptrs, blob, blob_bytes, kernels.bytes,
                          kernels.len, o->tools.cpu ? o->tools.cpu : "native", dir, &def, msg, n);
    return h ? kiln_module_new(h, clang_jit_free, def, g->name, err) : NULL;
}
#endif

/* The in-process JIT, unless it is not built or the options ask for the system
 * compiler; the units' keys in *keys. */
static kiln_module *jit_in_process(const Graph *g, const Program *p, const Source *src, const JitOptions *o,
                                   const char *dir, UnitKeys *keys, Diag *d, kiln_error *err, bool *used) {
#ifdef KILN_HAVE_CLANG_JIT
    *used = o->clang;
    if (!*used)
        return NULL;
    /* the C target's kernels in units; the CUDA target's host code (its kernels are
       NVRTC's) in one */
    Str sources[MAX_UNITS] = {{0}};
    keys->n = p->target == TARGET_C ? unit_count(p) : 1;
    kiln_module *m = NULL;
    char msg[2048] = "";
    int rc = p->target == TARGET_C ? emit_c_units(p, keys->n, sources, d)
                                   : (str_printf(&sources[0], "%s", src->host.s ? src->host.s : ""),
                                      sources[0].oom ? diag_error(d, (Loc){0}, "out of memory") : 0);
    if (rc == 0) {
        for (int u = 0; u < keys->n; u++) {
            uint64_t h[2];
            for (int k = 0; k < 2; k++)
                h[k] = cache_hash(toolchain_hash(seeds[k], k, p->vector_floats, &o->tools), muls[k],
                                  sources[u].s, sources[u].len);
            key_text(h, keys->keys[u], sizeof keys->keys[u]);
        }
        m = link_units(g, keys, sources, p->weights, (size_t)p->weights_bytes, o, dir, msg, sizeof msg, err);
        if (!m && *msg) /* kiln's own failure when Clang rejected the generated code, which it says */
            diag_relay(d, strstr(msg, "(a bug in kiln") ? DIAG_INTERNAL : DIAG_USER, msg);
        else if (!m)
            diag_relay_error(d, err);
        if (!m)
            kiln_set_error(err, "cannot compile the model");
    }
    for (int u = 0; u < keys->n; u++)
        str_free(&sources[u]);
    return m;
#else
    (void)g, (void)p, (void)src, (void)o, (void)dir, (void)keys, (void)d, (void)err;
    *used = false;
    return NULL;
#endif
}

/* ---- The model cache ----
 *
 * A warm kiln_jit skips the passes and the lowering as well as the compiler: the
 * entry DIR/MODELKEY.m holds the keys of its units' object files and the weights
 * blob as the lowering left it (transformed, packed), found by a hash of what the
 * model is compiled from: its graph as printed before the passes, every weight, the
 * -O level and BLAS setting, and the toolchain. On a hit the object entries are
 * linked with that blob; with any entry missing or bad the model is compiled as
 * usual, and the entries are written again. The passes and the lowering were most of a warm JIT's
 * time (ResNet-18: 0.25 of 0.3 s): Winograd's weight transforms, packing, folding. */

/* What a model entry holds, in its key: an entry of another layout is another key. */
#define MODEL_ENTRY_FORMAT "unit keys 4 x 40, then the weights blob"

/* The model cache's key of g (before its passes) with weights w; false when memory
 * runs out. */
static bool model_key(const Graph *g, const TensorList *w, int level, const JitOptions *o, char *key,
                      size_t n) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return false;
    print_graph(g, f);
    if (fclose(f) != 0) {
        free(text);
        return false;
    }
    uint64_t h[2];
    int settings[2] = {level, o->blas};
    for (int k = 0; k < 2; k++) {
        uint64_t m = muls[k];
        h[k] = toolchain_hash(seeds[k], k, cc_vector_floats(o->tools.cpu), &o->tools);
        h[k] = hash_string(h[k], m, MODEL_ENTRY_FORMAT);
        h[k] = cache_hash(h[k], m, text, len);
        h[k] = cache_hash(h[k], m, settings, sizeof settings);
        for (int i = 0; i < w->n; i++) {
            const Tensor *t = w->items[i].tensor;
            h[k] = hash_string(h[k], m, w->items[i].name);
            h[k] = cache_hash(h[k], m, t->type.dims, sizeof *t->type.dims * (size_t)t->type.rank);
            h[k] = cache_hash(h[k], m, t->data, sizeof(float) * (size_t)type_numel(&t->type));
        }
    }
    free(text);
    key_text(h, key, n);
    return true;
}

static void model_entry_path(const char *dir, const char *model_key, char *path, size_t n) {
    snprintf(path, n, "%s/%s.m", dir, model_key);
}

/* Stores p's weights blob and its units' keys (MAX_UNITS of OBJECT_KEY_BYTES, the
 * unused ones zeros) under model_key. */
static void model_entry_write(const char *dir, const char *model_key, const UnitKeys *keys,
                              const Program *p) {
    char path[4200];
    model_entry_path(dir, model_key, path, sizeof path);
    size_t head = MAX_UNITS * OBJECT_KEY_BYTES, len = head + (size_t)p->weights_bytes;
    unsigned char *payload = ir_calloc(len + 1, 1);
    if (!payload)
        return; /* a later run compiles again */
    for (int u = 0; u < keys->n; u++)
        memcpy(payload + u * OBJECT_KEY_BYTES, keys->keys[u], strlen(keys->keys[u]));
    memcpy(payload + head, p->weights, (size_t)p->weights_bytes);
    cache_entry_write(path, model_key, payload, len);
    ir_free(payload);
}

/* The model of graph g from the model cache; NULL when it is not there whole. */
static kiln_module *model_from_cache(const Graph *g, const JitOptions *o, const char *dir,
                                     const char *model_key, kiln_error *err) {
#ifdef KILN_HAVE_CLANG_JIT
    char path[4200];
    model_entry_path(dir, model_key, path, sizeof path);
    const unsigned char *payload = NULL;
    size_t len = 0, mapped = 0, head = MAX_UNITS * OBJECT_KEY_BYTES;
    CacheLookup found = cache_entry_map(path, model_key, &payload, &len, &mapped);
    if (found == CACHE_CORRUPT)
        cache_entry_warn(path);
    UnitKeys keys = {0};
    for (int u = 0; found == CACHE_HIT && len >= head && u < MAX_UNITS && payload[u * OBJECT_KEY_BYTES];
         u++) {
        memcpy(keys.keys[u], payload + u * OBJECT_KEY_BYTES, OBJECT_KEY_BYTES);
        keys.n++;
    }
    char msg[2048];
    kiln_module *m =
        keys.n ? link_units(g, &keys, NULL, payload + head, len - head, o, dir, msg, sizeof msg, err) : NULL;
    cache_entry_unmap(payload, mapped);
    return m;
#else
    (void)g, (void)o, (void)dir, (void)model_key, (void)err;
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
    bool cached = cache_dir(o->cache, dir, sizeof dir), in_process = false;
#ifdef KILN_HAVE_CLANG_JIT
    bool clang = o->clang && !profile && !src.emulated;
#else
    bool clang = false;
#endif
    stage(o, clang ? "compiling its C in process with Clang" : "compiling its C with the system compiler");
    UnitKeys units = {0};
    kiln_module *m = profile || src.emulated
                         ? NULL
                         : jit_in_process(g, p, &src, o, cached ? dir : NULL, &units, d, err, &in_process);
    if (in_process) {
        if (m && cached && o->model_key)
            model_entry_write(dir, o->model_key, &units, p);
        program_free(p);
        source_free(&src);
        return m;
    }
    cache_key(&src, p, &o->tools, key, sizeof key);
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
    char dir[4096], key[40];
    if (jo.clang && jo.target == TARGET_C && cache_dir(jo.cache, dir, sizeof dir) &&
        model_key(g, weights, po.level, &jo, key, sizeof key)) {
        kiln_module *m = model_from_cache(g, &jo, dir, key, err);
        if (m)
            return m;
        jo.model_key = key;
    }
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
