/* Compiling generated C into a shared object with the system C compiler.
 *
 * The source and the weights blob go into a fresh temporary directory (in $TMPDIR,
 * tempfiles_dir), the compiler (the Toolchain's, kiln_options.cc, default `cc`) runs there with its output
 * captured, and the shared object is moved into place through a temporary file beside the target; the
 * directory is removed whatever happens, so nothing is left behind, and while it
 * exists it and its files are registered (ir/tempfiles.h) for the driver's signal
 * handler to remove if SIGINT or SIGTERM ends the compile. The -march is the
 * caller's choice (native unless told otherwise). A C target model of enough
 * kernels is compiled as translation units (emit_c_units), a compiler process a core
 * all at once, and then linked. Emulated CUDA
 * kernels are C++ that the system C++ compiler (kiln_options.cxx, default `c++`) compiles
 * first, into an object linked into the same shared object. */
#include "codegen.h"
#include "../frontend/frontend.h"
#include "../ir/tempfiles.h"

#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* -fno-trapping-math: no code reads the floating-point exception flags, and without
 * it GCC does not turn the selects of clamps (clip, relu6) into vector blends.
 * -fwrapv: integer arithmetic wraps around, as the interpreter's does. */
const char *const cc_flags[] = {"-O3",
                                "-fPIC",
                                "-shared",
                                "-fvisibility=hidden",
                                "-fno-math-errno",
                                "-std=gnu11",
                                "-fno-trapping-math",
                                "-fwrapv"};

const char *const cc_cpus[] = {"native", "x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4", NULL};

/* The ISA extensions here are those the precompiled kernels for each width are
 * built with (CMakeLists.txt). */
int cc_vector_floats(const char *cpu) {
    if (!cpu || strcmp(cpu, "native") == 0) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_cpu_init();
        bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
        return avx2 && avx512 ? 16 : avx2 ? 8 : 4;
#else
        return 4;
#endif
    }
    return strcmp(cpu, "x86-64-v4") == 0 ? 16 : strcmp(cpu, "x86-64-v3") == 0 ? 8 : 4;
}

const char *cc_vector_width_flag(int vector_floats) {
    return vector_floats == 16 ? "-mprefer-vector-width=512" : NULL;
}

#if defined(__x86_64__)
extern const unsigned char kiln_kernels_vf8[], kiln_kernels_vf16[];
extern const size_t kiln_kernels_vf8_size, kiln_kernels_vf16_size;
#endif
extern const unsigned char kiln_kernels_vf4[];
extern const size_t kiln_kernels_vf4_size;

KernelObject cc_kernel_object(int vector_floats) {
#if defined(__x86_64__)
    if (vector_floats == 16)
        return (KernelObject){kiln_kernels_vf16, kiln_kernels_vf16_size};
    if (vector_floats == 8)
        return (KernelObject){kiln_kernels_vf8, kiln_kernels_vf8_size};
#endif
    (void)vector_floats;
    return (KernelObject){kiln_kernels_vf4, kiln_kernels_vf4_size};
}

bool cc_cpu_valid(const char *cpu) {
    for (int i = 0; cc_cpus[i]; i++)
        if (strcmp(cpu, cc_cpus[i]) == 0)
            return true;
    return false;
}

enum { DIR_MAX = 512, PATH_MAX_LEN = DIR_MAX + 64, FILES = 7, UNIT_FILES = 3 * C_MAX_UNITS };

/* The compile's private directory and the files in it, each registered for removal
 * on a signal while it may exist. */
typedef struct {
    char dir[DIR_MAX];
    int slots[FILES + UNIT_FILES + 1], n;
} WorkDir;

static void work_track(WorkDir *w, const char *path) {
    if (w->n < FILES + UNIT_FILES + 1)
        w->slots[w->n++] = tempfiles_add(path);
}

/* A file of the private directory: no other process writes there, so it is written
 * in place. */
static int write_in(WorkDir *w, const char *name, const void *buf, size_t len, Diag *d) {
    char path[PATH_MAX_LEN];
    snprintf(path, sizeof path, "%s/%s", w->dir, name);
    work_track(w, path);
    FILE *f = fopen(path, "wb");
    bool ok = f && fwrite(buf, 1, len, f) == len;
    if (f && fclose(f) != 0)
        ok = false;
    return ok ? 0 : diag_error(d, (Loc){0}, "cannot write '%s': %s", path, strerror(errno));
}

/* Starts argv with stdout and stderr into log; its pid, or -1. */
static pid_t spawn_logged(char *const *argv, const char *log) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    return rc == 0 ? pid : -1;
}

/* The exit status of the process pid (-1: none), or -1. */
static int wait_status(pid_t pid) {
    int status;
    if (pid < 0)
        return -1;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static const char *const work_files[FILES] = {"model.c",  "kernels.cpp", "kernels.o",     "weights.bin",
                                              "model.so", "cc.log",      "kiln_kernels.o"};

/* The files of unit u: its C, its object and its compiler's log. */
static void unit_path(const WorkDir *w, int u, const char *ext, char *path) {
    snprintf(path, PATH_MAX_LEN, "%s/unit%d.%s", w->dir, u, ext);
}

static void remove_dir(WorkDir *w) {
    char path[PATH_MAX_LEN];
    for (int i = 0; i < FILES; i++) {
        snprintf(path, sizeof path, "%s/%s", w->dir, work_files[i]);
        unlink(path);
    }
    for (int u = 0; u < C_MAX_UNITS; u++)
        for (int e = 0; e < 3; e++) {
            unit_path(w, u, (const char *[]){"c", "o", "log"}[e], path);
            unlink(path);
        }
    rmdir(w->dir);
    for (int i = 0; i < w->n; i++)
        tempfiles_forget(w->slots[i]);
}

/* The diagnostic for a compiler that exited with status (0: none), quoting the start
 * of its log; -1 after one. */
static int compiler_status(int status, const char *compiler, const char *log, Diag *d) {
    if (status == 0)
        return 0;
    unsigned char *text = NULL;
    size_t len = 0;
    FILE *devnull = fopen("/dev/null", "w");
    Diag quiet;
    diag_init(&quiet, devnull);
    if (devnull && read_file_bytes(log, &text, &len, &quiet) == 0 && len > 2000)
        len = 2000;
    if (devnull)
        fclose(devnull);
    /* a compiler that cannot run is this machine's problem; one that rejects the
       generated code is kiln's */
    if (status < 0)
        diag_error(d, (Loc){0},
                   "the compiler '%s' could not run (is a C compiler installed? $KILN_CC names it)",
                   compiler);
    else
        diag_internal(d, (Loc){0},
                      "the compiler '%s' failed on the generated code (a bug in kiln, unless $KILN_CC or "
                      "$KILN_CXX names a broken compiler)%s%.*s",
                      compiler, len ? ":\n" : "", (int)len, text ? (const char *)text : "");
    ir_free(text);
    return -1;
}

/* Runs a compiler; on failure, the diagnostic quotes the start of its log. */
static int run_compiler(char **argv, const char *log, Diag *d) {
    return compiler_status(wait_status(spawn_logged(argv, log)), argv[0], log, d);
}

/* Compiles p as `units` translation units (emit_c_units) into DIR/unitN.o, all at
 * once, a compiler process each: the n arguments of cc before the files, unit 0 with
 * weights_def (the blob is its own), the others referring to it. */
static int compile_units(WorkDir *w, const Program *p, int units, char **cc, int n, char *weights_def,
                         Diag *d) {
    Str sources[C_MAX_UNITS] = {{0}};
    pid_t pids[C_MAX_UNITS];
    char paths[C_MAX_UNITS][3][PATH_MAX_LEN];
    int rc = emit_c_units(p, units, sources, d), started = 0;
    for (; !rc && started < units; started++) {
        int u = started;
        char name[32], *argv[40], **a = argv;
        snprintf(name, sizeof name, "unit%d.c", u);
        for (int e = 0; e < 3; e++) {
            unit_path(w, u, (const char *[]){"c", "o", "log"}[e], paths[u][e]);
            if (e > 0)
                work_track(w, paths[u][e]);
        }
        if ((rc = write_in(w, name, sources[u].s, sources[u].len, d)))
            break;
        for (int i = 0; i < n; i++)
            *a++ = cc[i];
        *a++ = u == 0 ? weights_def : "-DKILN_WEIGHTS_EXTERN";
        *a++ = "-c";
        *a++ = "-o";
        *a++ = paths[u][1];
        *a++ = paths[u][0];
        *a = NULL;
        pids[u] = spawn_logged(argv, paths[u][2]);
    }
    for (int u = 0; u < started; u++) {
        int status = wait_status(pids[u]);
        if (!rc)
            rc = compiler_status(status, cc[0], paths[u][2], d);
    }
    for (int u = 0; u < units; u++)
        str_free(&sources[u]);
    return rc;
}

int cc_compile_so(const Source *src, const Program *p, const char *out_path, const Toolchain *tc, Diag *d) {
    const char *cpu = tc->cpu ? tc->cpu : "native";
    WorkDir w = {.n = 0};
    char *dir = w.dir; /* DIR_MAX bytes */
    char march[64], weights_def[PATH_MAX_LEN], so[PATH_MAX_LEN], c_file[PATH_MAX_LEN], log[PATH_MAX_LEN];
    char cxx_file[PATH_MAX_LEN], obj[PATH_MAX_LEN], kiln_obj[PATH_MAX_LEN];
    if (snprintf(dir, DIR_MAX, "%s/kiln-cc-XXXXXX", tempfiles_dir()) >= DIR_MAX)
        return diag_error(d, (Loc){0}, "TMPDIR is too long");
    if (!cc_cpu_valid(cpu))
        return diag_error(d, (Loc){0},
                          "unknown --cpu '%s' (native, x86-64, x86-64-v2, x86-64-v3 or x86-64-v4)", cpu);
    snprintf(march, sizeof march, "-march=%s", cpu);
    if (!mkdtemp(dir))
        return diag_error(d, (Loc){0}, "cannot create a temporary directory: %s", strerror(errno));
    work_track(&w, dir);
    snprintf(c_file, sizeof c_file, "%s/model.c", dir);
    snprintf(cxx_file, sizeof cxx_file, "%s/kernels.cpp", dir);
    snprintf(obj, sizeof obj, "%s/kernels.o", dir);
    snprintf(kiln_obj, sizeof kiln_obj, "%s/kiln_kernels.o", dir);
    snprintf(so, sizeof so, "%s/model.so", dir);
    snprintf(log, sizeof log, "%s/cc.log", dir);
    snprintf(weights_def, sizeof weights_def, "-DKILN_WEIGHTS_FILE=\"%s/weights.bin\"", dir);
    /* the files the compilers make, registered before they exist */
    work_track(&w, obj);
    work_track(&w, so);
    work_track(&w, log);
    /* the model as units, or as the one file of its source */
    int units = p->target == TARGET_C && !src->emulated ? c_unit_count(p) : 1;
    int rc = (units == 1 && write_in(&w, "model.c", src->host.s, src->host.len, d)) ||
             write_in(&w, "weights.bin", p->weights, (size_t)p->weights_bytes, d) ||
             (src->emulated && write_in(&w, "kernels.cpp", src->kernels.s, src->kernels.len, d));
    KernelObject kernels = cc_kernel_object(p->vector_floats);
    if (!rc && p->vector_floats > 0)
        rc = write_in(&w, "kiln_kernels.o", kernels.bytes, kernels.len, d);
    if (!rc && src->emulated) {
        char *argv[] = {(char *)(tc->cxx ? tc->cxx : "c++"),
                        "-O2",
                        "-fPIC",
                        "-fno-exceptions",
                        "-fno-rtti",
                        "-o",
                        obj,
                        "-c",
                        cxx_file,
                        NULL};
        rc = run_compiler(argv, log, d);
    }
    if (!rc) {
        char *argv[32 + C_MAX_UNITS], units_o[C_MAX_UNITS][PATH_MAX_LEN];
        int argc = 0;
        argv[argc++] = (char *)(tc->cc ? tc->cc : "cc");
        for (size_t i = 0; i < sizeof cc_flags / sizeof *cc_flags; i++)
            argv[argc++] = (char *)cc_flags[i];
        argv[argc++] = march;
        if (cc_vector_width_flag(p->vector_floats))
            argv[argc++] = (char *)cc_vector_width_flag(p->vector_floats);
        if (units > 1) {
            rc = compile_units(&w, p, units, argv, argc, weights_def, d);
            for (int u = 0; u < units; u++) {
                unit_path(&w, u, "o", units_o[u]);
                argv[argc++] = units_o[u];
            }
        } else {
            argv[argc++] = weights_def;
            argv[argc++] = c_file;
        }
        argv[argc++] = "-o";
        argv[argc++] = so;
        if (src->emulated)
            argv[argc++] = obj;
        if (p->vector_floats > 0) { /* the precompiled kernels, those the model calls */
            argv[argc++] = kiln_obj;
            argv[argc++] = "-Wl,--gc-sections";
        }
        if (p->blas)
            argv[argc++] = "-lopenblas";
        argv[argc++] = "-lm";
        argv[argc++] = "-lpthread";
        argv[argc] = NULL;
        if (!rc)
            rc = run_compiler(argv, log, d);
    }
    if (!rc) {
        unsigned char *bytes = NULL;
        size_t len = 0;
        rc = read_file_bytes(so, &bytes, &len, d);
        if (!rc)
            rc = write_file_atomic(out_path, bytes, len, d);
        ir_free(bytes);
    }
    remove_dir(&w);
    return rc ? -1 : 0;
}
