/* kiln_jit: compiling a model in process and loading it, with a compile cache.
 *
 * The model is parsed, optimized and lowered, and the C is generated. Where kiln was
 * built with Clang and LLVM (KILN_HAVE_CLANG_JIT) and kiln_options.jit is not `cc`, the C
 * is compiled and linked in memory (jit_clang.cpp): its run function, and each of its
 * kernels, with an object file cached as KEY.o, so that models share the kernels of
 * the same text. Otherwise the system compiler makes a
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
#define _GNU_SOURCE /* dladdr, dl_iterate_phdr */
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

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Hashes this CPU's model name and feature flags: -march=native code built on one
 * CPU may not run on another that shares the cache directory. */
static void cpu_hash(CacheHash *h) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[8192];
    int seen = 0;
    while (f && seen < 2 && fgets(line, sizeof line, f))
        if (strncmp(line, "model name", 10) == 0 || strncmp(line, "flags", 5) == 0) {
            cache_hash_string(h, line);
            seen++;
        }
    if (f)
        fclose(f);
}

/* What the code is built with and how it is cached: the entries' format, the
 * precompiled kernels of a vector width, the compilers and their flags, the CPU. */
static void toolchain_hash(CacheHash *h, int vector_floats, const Toolchain *tc) {
    KernelObject kernels = vector_floats > 0 ? cc_kernel_object(vector_floats) : (KernelObject){0};
    cache_hash_string(h, CACHE_ENTRY_FORMAT);
    cpu_hash(h);
    cache_hash(h, kernels.bytes, kernels.len);
    for (size_t f = 0; f < sizeof cc_flags / sizeof *cc_flags; f++)
        cache_hash_string(h, cc_flags[f]);
    if (cc_vector_width_flag(vector_floats))
        cache_hash_string(h, cc_vector_width_flag(vector_floats));
    cache_hash_string(h, tc->cpu ? tc->cpu : "native");
    const char *compilers[] = {tc->cc, tc->cxx};
    for (int c = 0; c < 2; c++)
        if (compilers[c])
            cache_hash_string(h, compilers[c]);
}

/* A shared object's key: its source and the weights it holds, with the toolchain. */
static void cache_key(const Source *src, const Program *p, const Toolchain *tc, char *key, size_t n) {
    CacheHash h = CACHE_HASH_INIT;
    toolchain_hash(&h, p->vector_floats, tc);
    cache_hash(&h, src->host.s, src->host.len);
    if (src->emulated)
        cache_hash(&h, src->kernels.s, src->kernels.len);
    cache_hash(&h, p->weights, (size_t)p->weights_bytes);
    cache_hash_text(&h, key, n);
}

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

/* The in-process JIT compiles a C model as its main unit (the run function and
 * kiln_model) and its kernels, each cached by its own key: a hash of its source and
 * of the toolchain (not the weights: the JIT binds them when it links), and for a
 * kernel of the prelude it is compiled after, so that every model with a kernel of
 * the same text finds its object. A CUDA model's host code is one unit. */
enum { OBJECT_KEY_BYTES = 40 };

typedef struct {
    int n;
    char (*keys)[OBJECT_KEY_BYTES + 1];
} UnitKeys;

static void unit_keys_free(UnitKeys *keys) {
    ir_free(keys->keys);
    *keys = (UnitKeys){0};
}

#ifdef KILN_HAVE_CLANG_JIT
static int unit_keys_alloc(UnitKeys *keys, int n) {
    keys->keys = ir_calloc((size_t)n + 1, sizeof *keys->keys);
    keys->n = keys->keys ? n : 0;
    return keys->keys ? 0 : -1;
}

/* Whether Clang's loop unrolling pays for its compile time: in a model of under
 * UNROLL_FLOPS counted FLOPs a run (tens of microseconds), whose short loops it makes
 * 7% faster (the small CNN, one thread); above that it made no difference measured
 * (ResNet-18, MobileNetV2, EfficientNet-B0, MobileNetV3-Small, ResNet-50) and half
 * of each cold JIT was LLVM unrolling loops and selecting their instructions. */
enum { UNROLL_FLOPS = 10 * 1000 * 1000 };

static bool unrolling_pays(const Program *p) {
    int64_t flops = 0;
    for (int i = 0; i < p->n_kernels; i++)
        flops += p->kernels[i].flops;
    return flops < UNROLL_FLOPS;
}

/* Links the units of *keys (what: their C and prelude, compiled with LLVM's loop
 * unrolling or without; or NULL for cached objects only) with the weights blob into
 * a module named name; NULL with why in msg. */
static kiln_module *link_units(const char *name, const UnitKeys *keys, const CPieces *what, bool unroll,
                               const JitWeights *weights, const JitOptions *o, const char *dir, char *msg,
                               size_t n, kiln_error *err) {
    const char **texts = ir_calloc((size_t)keys->n + 1, sizeof *texts),
               **key_ptrs = ir_calloc((size_t)keys->n + 1, sizeof *key_ptrs),
               **symbols = ir_calloc((size_t)keys->n + 1, sizeof *symbols);
    size_t *lens = ir_calloc((size_t)keys->n + 1, sizeof *lens);
    void *h = NULL;
    const kiln_model_def *def = NULL;
    if (texts && key_ptrs && symbols && lens) {
        for (int u = 0; u < keys->n; u++) {
            const Str *text = !what ? NULL : u == 0 ? &what->main : &what->kernels[u - 1];
            texts[u] = text ? text->s : NULL;
            lens[u] = text ? text->len : 0;
            key_ptrs[u] = keys->keys[u];
        }
        for (int k = 0; what && k < what->n_kernels; k++) /* the kernels are units 1 on */
            symbols[k] = what->names[k];
        JitUnits units = {keys->n, what ? what->n_kernels : 0,    what ? texts : NULL,         lens, key_ptrs,
                          symbols, what ? what->prelude.s : NULL, what ? what->prelude.len : 0};
        KernelObject kernels = cc_kernel_object(cc_vector_floats(o->tools.cpu));
        h = clang_jit_compile(&units, weights, kernels.bytes, kernels.len,
                              o->tools.cpu ? o->tools.cpu : "native", unroll, dir, &def, msg, n);
    } else {
        snprintf(msg, n, "out of memory");
        if (weights->mapping)
            cache_entry_unmap(weights->mapping, weights->mapped);
    }
    ir_free(texts), ir_free(key_ptrs), ir_free(symbols), ir_free(lens);
    return h ? kiln_module_new(h, clang_jit_free, def, name, err) : NULL;
}

/* Hashes one unit's source into its key. */
static void unit_key(const Program *p, const JitOptions *o, bool unroll, const Str *prelude, const Str *text,
                     char *key) {
    CacheHash h = CACHE_HASH_INIT;
    toolchain_hash(&h, p->vector_floats, &o->tools);
    cache_hash(&h, &unroll, sizeof unroll);
    if (prelude)
        cache_hash(&h, prelude->s, prelude->len);
    cache_hash(&h, text->s, text->len);
    cache_hash_text(&h, key, OBJECT_KEY_BYTES + 1);
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
    /* the C target's main unit and kernels; the CUDA target's host code (its kernels
       are NVRTC's) as a main unit alone */
    CPieces pieces = {0};
    int rc = p->target == TARGET_C ? emit_c_pieces(p, &pieces, d)
                                   : (str_printf(&pieces.main, "%s", src->host.s ? src->host.s : ""),
                                      pieces.main.oom ? diag_error(d, (Loc){0}, "out of memory") : 0);
    if (!rc && unit_keys_alloc(keys, 1 + pieces.n_kernels))
        rc = diag_error(d, (Loc){0}, "out of memory");
    kiln_module *m = NULL;
    char msg[2048] = "";
    bool unroll = unrolling_pays(p);
    if (rc == 0) {
        unit_key(p, o, unroll, NULL, &pieces.main, keys->keys[0]);
        for (int k = 0; k < pieces.n_kernels; k++)
            unit_key(p, o, unroll, &pieces.prelude, &pieces.kernels[k], keys->keys[1 + k]);
        JitWeights weights = {p->weights, (size_t)p->weights_bytes, NULL, 0};
        m = link_units(g->name, keys, &pieces, unroll, &weights, o, dir, msg, sizeof msg, err);
        if (!m && *msg) /* kiln's own failure when Clang rejected the generated code, which it says */
            diag_relay(d, strstr(msg, "(a bug in kiln") ? DIAG_INTERNAL : DIAG_USER, msg);
        else if (!m)
            diag_relay_error(d, err);
        if (!m)
            kiln_set_error(err, "cannot compile the model");
    }
    c_pieces_free(&pieces);
    return m;
#else
    (void)g, (void)p, (void)src, (void)o, (void)dir, (void)keys, (void)d, (void)err;
    *used = false;
    return NULL;
#endif
}

/* ---- The model cache ----
 *
 * A warm kiln_jit skips everything but reading the model: the entry DIR/MODELKEY.m
 * holds the keys of its units' object files, the model's name and the weights blob
 * as the lowering left it (transformed, packed), found by a hash of what the model
 * is compiled from, as read: the model's bytes (text, or an ONNX file) and its path,
 * the bytes of every weights file, the -O level and BLAS setting, the toolchain, and
 * this build of kiln (its passes, lowering and runtime). On a hit the object entries
 * are linked with that blob; with any entry missing or bad the model is compiled from
 * the same bytes, and the entries are written again. An ONNX model whose weights are
 * in external data files has no model entry (its bytes do not hold them), nor has a
 * model whose compile warned (a warm run would not): each is compiled each time,
 * from cached objects. `kiln run` reads and writes the same entries (driver). */

/* What a model entry holds, in its key: an entry of another layout is another key. */
#define MODEL_ENTRY_FORMAT "n as 8 bytes, n unit keys of 40, the name, the weights blob at a multiple of 64"
enum { BLOB_ALIGN = 64 };

typedef struct {
    uintptr_t self;
    CacheHash *h;
    bool found;
} BuildSearch;

/* Hashes the GNU build ID note of the object that holds search->self. */
static int hash_build_id(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    BuildSearch *search = data;
    bool holds = false;
    for (int i = 0; i < info->dlpi_phnum && !holds; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t start = info->dlpi_addr + ph->p_vaddr;
        holds = ph->p_type == PT_LOAD && search->self >= start && search->self - start < ph->p_memsz;
    }
    for (int i = 0; holds && i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        const unsigned char *note = (const unsigned char *)(info->dlpi_addr + ph->p_vaddr);
        size_t at = 0;
        while (ph->p_type == PT_NOTE && ph->p_memsz - at >= sizeof(ElfW(Nhdr))) {
            ElfW(Nhdr) head;
            memcpy(&head, note + at, sizeof head);
            size_t name = (head.n_namesz + 3u) & ~3u, desc = (head.n_descsz + 3u) & ~3u;
            if (ph->p_memsz - at - sizeof head < name + desc)
                break;
            if (head.n_type == NT_GNU_BUILD_ID && head.n_namesz == 4 &&
                memcmp(note + at + sizeof head, "GNU", 4) == 0) {
                cache_hash(search->h, note + at + sizeof head + name, head.n_descsz);
                search->found = true;
            }
            at += sizeof head + name + desc;
        }
    }
    return holds;
}

/* Hashes this build of kiln: the build ID of the library or program this code is
 * linked into, else that file's size and time. A model entry holds what the passes and
 * the lowering made, for the runtime they were made for. */
static void build_hash(CacheHash *h) {
    static const char self = 0;
    BuildSearch search = {(uintptr_t)&self, h, false};
    dl_iterate_phdr(hash_build_id, &search);
    Dl_info info;
    struct stat st;
    if (!search.found && dladdr(&self, &info) && info.dli_fname && stat(info.dli_fname, &st) == 0) {
        int64_t id[3] = {(int64_t)st.st_size, (int64_t)st.st_mtim.tv_sec, (int64_t)st.st_mtim.tv_nsec};
        cache_hash(h, id, sizeof id);
    }
}

/* The model cache hashes a file a chunk at a time, whether it is read whole or not. */
enum { HASH_CHUNK = 1 << 20 };

static void hash_chunks(CacheHash *h, const unsigned char *bytes, size_t len) {
    for (size_t at = 0; at < len; at += HASH_CHUNK)
        cache_hash(h, bytes + at, len - at < HASH_CHUNK ? len - at : HASH_CHUNK);
    uint64_t n = len;
    cache_hash(h, &n, sizeof n);
}

/* hash_chunks of the regular file at path, read through one chunk's buffer; -1 when
 * it cannot be read, or is too large to (model_input_read then says why, without
 * first reading a sparse terabyte). */
static int hash_file(CacheHash *h, const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    struct stat st;
    unsigned char *chunk = NULL;
    bool ok = fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
              (uint64_t)st.st_size <= file_size_limit() && (chunk = ir_malloc(HASH_CHUNK));
    uint64_t total = 0;
    for (size_t got = HASH_CHUNK; ok && got == HASH_CHUNK; total += got) {
        got = 0;
        for (ssize_t r = 1; ok && r != 0 && got < HASH_CHUNK;) { /* a whole chunk, as hash_chunks sees it */
            r = read(fd, chunk + got, HASH_CHUNK - got);
            ok = r >= 0 || errno == EINTR;
            got += r > 0 ? (size_t)r : 0;
        }
        if (got)
            cache_hash(h, chunk, got);
    }
    cache_hash(h, &total, sizeof total);
    ir_free(chunk);
    if (fd >= 0)
        close(fd);
    return ok ? 0 : -1;
}

/* A file of the model: hashed from its bytes where in has read them, else from the
 * file. */
static int hash_part(CacheHash *h, const ModelInput *in, const char *path, const unsigned char *bytes,
                     size_t len) {
    if (!in->read && path)
        return hash_file(h, path);
    hash_chunks(h, bytes, len);
    return 0;
}

/* The model cache's key of in; -1 when a file cannot be read. */
static int model_key(const ModelInput *in, int level, const JitOptions *o, char *key, size_t n) {
    CacheHash h = CACHE_HASH_INIT;
    build_hash(&h);
    toolchain_hash(&h, cc_vector_floats(o->tools.cpu), &o->tools);
    cache_hash_string(&h, MODEL_ENTRY_FORMAT);
    int settings[3] = {level, o->blas, in->onnx};
    cache_hash(&h, settings, sizeof settings);
    cache_hash_string(&h, in->name);
    int rc = in->onnx  ? hash_part(&h, in, in->name, in->file.bytes, in->file.len)
             : in->src ? hash_part(&h, in, NULL, (const unsigned char *)in->src->text, in->src->len)
                       : hash_part(&h, in, in->name, NULL, 0);
    for (int i = 0; !rc && i < in->n_weights; i++)
        rc = hash_part(&h, in, in->weights_paths[i], in->weights ? in->weights[i].bytes : NULL,
                       in->weights ? in->weights[i].len : 0);
    cache_hash_text(&h, key, n);
    return rc;
}

static void model_entry_path(const char *dir, const char *model_key, char *path, size_t n) {
    snprintf(path, n, "%s/%s.m", dir, model_key);
}

/* Where the name starts in an entry of n units, and where the blob starts. */
static size_t name_offset(uint64_t n) {
    return sizeof n + (size_t)n * OBJECT_KEY_BYTES;
}

static size_t blob_offset(uint64_t n, const char *name) {
    return (name_offset(n) + strlen(name) + 1 + BLOB_ALIGN - 1) / BLOB_ALIGN * BLOB_ALIGN;
}

/* Stores the number of the model's units, their keys (OBJECT_KEY_BYTES each, padded
 * with zeros), its name and p's weights blob under model_key: the blob written from
 * where it lies (it may be hundreds of megabytes). */
static void model_entry_write(const char *dir, const char *model_key, const char *name, const UnitKeys *keys,
                              const Program *p) {
    char path[4200];
    model_entry_path(dir, model_key, path, sizeof path);
    uint64_t n = (uint64_t)keys->n;
    size_t at = blob_offset(n, name);
    unsigned char *head = ir_calloc(at, 1);
    if (!head)
        return; /* a later run compiles again */
    memcpy(head, &n, sizeof n);
    for (int u = 0; u < keys->n; u++)
        memcpy(head + name_offset((uint64_t)u), keys->keys[u], strlen(keys->keys[u]));
    memcpy(head + name_offset(n), name, strlen(name));
    cache_entry_write(path, model_key, head, at, p->weights, (size_t)p->weights_bytes);
    ir_free(head);
}

/* The model from the model cache; NULL when it is not there whole. */
static kiln_module *model_from_cache(const JitOptions *o, const char *dir, const char *model_key,
                                     kiln_error *err) {
#ifdef KILN_HAVE_CLANG_JIT
    char path[4200];
    model_entry_path(dir, model_key, path, sizeof path);
    const unsigned char *payload = NULL;
    size_t len = 0, mapped = 0;
    CacheLookup found = cache_entry_map(path, model_key, &payload, &len, &mapped);
    /* the name ends at the first NUL past the units' keys; the blob starts after it */
    uint64_t n = 0;
    const char *name = NULL;
    if (found == CACHE_HIT && len >= sizeof n)
        memcpy(&n, payload, sizeof n);
    if (found == CACHE_HIT && n >= 1 && n <= len / OBJECT_KEY_BYTES && len > name_offset(n) &&
        memchr(payload + name_offset(n), 0, len - name_offset(n)))
        name = (const char *)payload + name_offset(n);
    if (name && blob_offset(n, name) > len)
        name = NULL;
    if (found == CACHE_CORRUPT || (found == CACHE_HIT && !name))
        cache_entry_warn(path);
    UnitKeys keys = {0};
    if (!name || unit_keys_alloc(&keys, (int)n)) {
        cache_entry_unmap(payload, mapped);
        return NULL;
    }
    for (int u = 0; u < keys.n; u++)
        memcpy(keys.keys[u], payload + name_offset((uint64_t)u), OBJECT_KEY_BYTES);
    char msg[2048];
    size_t at = blob_offset(n, name);
    JitWeights weights = {payload + at, len - at, payload, mapped}; /* the module's from here on */
    kiln_module *m = link_units(name, &keys, NULL, false, &weights, o, dir, msg, sizeof msg, err);
    unit_keys_free(&keys);
    return m;
#else
    (void)o, (void)dir, (void)model_key, (void)err;
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
    if (!rc && cache_entry_write(path, key, NULL, 0, payload, len) != 0)
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
        /* a model entry would skip the warnings, so a model with any has none */
        if (m && cached && o->model_key && !d->warnings)
            model_entry_write(dir, o->model_key, g->name, &units, p);
        unit_keys_free(&units);
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

/* Whether jo has a model cache (the in-process C target's), in dir[0..4096). */
static bool model_cache_dir(const JitOptions *jo, char *dir) {
    return jo->clang && jo->target == TARGET_C && cache_dir(jo->cache, dir, 4096);
}

kiln_module *jit_from_model_cache(const ModelInput *in, int level, const JitOptions *jo, kiln_error *err) {
    char dir[4096], key[MODEL_KEY_BYTES];
    if (!model_cache_dir(jo, dir) || model_key(in, level, jo, key, sizeof key))
        return NULL;
    return model_from_cache(jo, dir, key, err);
}

void jit_keep_model(const ModelInput *in, int level, JitOptions *jo, char *key) {
    char dir[4096];
    if (model_cache_dir(jo, dir) && (!in->onnx || !onnx_uses_external_data(in->file.bytes, in->file.len)) &&
        model_key(in, level, jo, key, MODEL_KEY_BYTES) == 0)
        jo->model_key = key;
}

/* in compiled as the library's options say (their target, -O level and settings),
 * or taken from the model cache. */
static kiln_module *jit_input(ModelInput *in, const JitOptions *given, int level, Diag *d, kiln_error *err) {
    JitOptions jo = *given;
    PipelineOptions po = {.level = level, .verify = true, .lower = true};
    jo.memplan = pipeline_selects(&po, "memplan");
    kiln_module *m = jit_from_model_cache(in, level, &jo, err);
    if (m || model_input_read(in, d))
        return m;
    char key[MODEL_KEY_BYTES];
    jit_keep_model(in, level, &jo, key);
    TensorList weights = {0};
    Graph *g = model_input_parse(in, NULL, 0, &weights, d);
    m = g && pipeline_run(g, &weights, &po, d) == 0 ? jit_graph(g, &weights, &jo, d, err) : NULL;
    tensors_free(&weights);
    graph_free(g);
    return m;
}

/* A library call: the model at path, or the text, with the weights files of opts,
 * compiled; its diagnostics go into err. */
static kiln_module *jit_call(const char *path, const char *text, const kiln_options *opts, kiln_error *err) {
    char *msg = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&msg, &len);
    Diag d;
    diag_init(&d, f ? f : stderr);
    JitOptions jo;
    ModelInput in = {0};
    const char *const *weights = opts ? opts->weights : NULL;
    int n = opts ? opts->n_weights : 0;
    int rc = jit_options_from(opts, &jo, &d);
    if (!rc && path)
        model_input_init(&in, path, weights, n);
    else if (!rc)
        rc = model_input_text(&in, text, weights, n, &d);
    kiln_module *m = rc ? NULL : jit_input(&in, &jo, opts ? opts->opt_level : 2, &d, err);
    model_input_free(&in);
    return finish_call(m, &d, f, &msg, err);
}

kiln_module *kiln_jit(const char *model_text, const kiln_options *opts, kiln_error *err) {
    if (!model_text) {
        kiln_set_error(err, "kiln_jit: the model text is NULL");
        return NULL;
    }
    return jit_call(NULL, model_text, opts, err);
}

kiln_module *kiln_jit_file(const char *path, const kiln_options *opts, kiln_error *err) {
    if (!path) {
        kiln_set_error(err, "kiln_jit_file: the path is NULL");
        return NULL;
    }
    return jit_call(path, NULL, opts, err);
}
