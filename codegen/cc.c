/* Compiling generated C into a shared object with the system C compiler.
 *
 * The source and the weights blob go into a fresh temporary directory, the compiler
 * ($KILN_CC, default `cc`) runs there with its output captured, and the shared
 * object is moved into place through a temporary file beside the target; the
 * directory is removed whatever happens, so nothing is left behind. Emulated CUDA
 * kernels are C++ that the system C++ compiler ($KILN_CXX, default `c++`) compiles
 * first, into an object linked into the same shared object. */
#include "codegen.h"
#include "../frontend/frontend.h"

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
 * it GCC does not turn the selects of clamps (clip, relu6) into vector blends. */
const char *const cc_flags[] = {"-O3",        "-march=native",       "-fPIC",
                                "-shared",    "-fvisibility=hidden", "-fno-math-errno",
                                "-std=gnu11", "-fno-trapping-math"};

enum { DIR_MAX = 512, PATH_MAX_LEN = DIR_MAX + 64 };

static int write_in(const char *dir, const char *name, const void *buf, size_t len, Diag *d) {
    char path[PATH_MAX_LEN];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return write_file_atomic(path, buf, len, d);
}

/* Runs argv with stdout and stderr into log; returns its exit status, or -1. */
static int run_logged(char *const *argv, const char *log) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0)
        return -1;
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void remove_dir(const char *dir) {
    const char *names[] = {"model.c", "kernels.cpp", "kernels.o", "weights.bin", "model.so", "cc.log"};
    char path[PATH_MAX_LEN];
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
}

/* Runs a compiler; on failure, the diagnostic quotes the start of its log. */
static int run_compiler(char **argv, const char *log, Diag *d) {
    int status = run_logged(argv, log);
    if (status == 0)
        return 0;
    unsigned char *text = NULL;
    size_t len = 0;
    Diag quiet = {fopen("/dev/null", "w"), 0};
    if (quiet.out && read_file_bytes(log, &text, &len, &quiet) == 0 && len > 2000)
        len = 2000;
    if (quiet.out)
        fclose(quiet.out);
    diag_error(d, (Loc){0}, "the compiler '%s' %s (a bug in kiln, or no compiler here)%s%.*s", argv[0],
               status < 0 ? "could not run" : "failed", len ? ":\n" : "", (int)len, text ? (const char *)text : "");
    ir_free(text);
    return -1;
}

static const char *compiler(const char *env, const char *fallback) {
    const char *cc = getenv(env);
    return cc && *cc ? cc : fallback;
}

int cc_compile_so(const Source *src, const Program *p, const char *out_path, Diag *d) {
    const char *tmp = getenv("TMPDIR");
    char dir[DIR_MAX], weights_def[PATH_MAX_LEN], so[PATH_MAX_LEN], c_file[PATH_MAX_LEN], log[PATH_MAX_LEN];
    char cxx_file[PATH_MAX_LEN], obj[PATH_MAX_LEN];
    if (snprintf(dir, sizeof dir, "%s/kiln-cc-XXXXXX", tmp && *tmp ? tmp : "/tmp") >= (int)sizeof dir)
        return diag_error(d, (Loc){0}, "TMPDIR is too long");
    if (!mkdtemp(dir))
        return diag_error(d, (Loc){0}, "cannot create a temporary directory: %s", strerror(errno));
    snprintf(c_file, sizeof c_file, "%s/model.c", dir);
    snprintf(cxx_file, sizeof cxx_file, "%s/kernels.cpp", dir);
    snprintf(obj, sizeof obj, "%s/kernels.o", dir);
    snprintf(so, sizeof so, "%s/model.so", dir);
    snprintf(log, sizeof log, "%s/cc.log", dir);
    snprintf(weights_def, sizeof weights_def, "-DKILN_WEIGHTS_FILE=\"%s/weights.bin\"", dir);
    int rc = write_in(dir, "model.c", src->host.s, src->host.len, d) ||
             write_in(dir, "weights.bin", p->weights, (size_t)p->weights_bytes, d) ||
             (src->emulated && write_in(dir, "kernels.cpp", src->kernels.s, src->kernels.len, d));
    if (!rc && src->emulated) {
        char *argv[] = {(char *)compiler("KILN_CXX", "c++"), "-O2", "-fPIC", "-fno-exceptions", "-fno-rtti",
                        "-o", obj, "-c", cxx_file, NULL};
        rc = run_compiler(argv, log, d);
    }
    if (!rc) {
        char *argv[32];
        int argc = 0;
        argv[argc++] = (char *)compiler("KILN_CC", "cc");
        for (size_t i = 0; i < sizeof cc_flags / sizeof *cc_flags; i++)
            argv[argc++] = (char *)cc_flags[i];
        argv[argc++] = weights_def;
        argv[argc++] = "-o";
        argv[argc++] = so;
        argv[argc++] = c_file;
        if (src->emulated)
            argv[argc++] = obj;
        if (p->blas)
            argv[argc++] = "-lopenblas";
        argv[argc++] = "-lm";
        argv[argc++] = "-lpthread";
        argv[argc] = NULL;
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
    remove_dir(dir);
    return rc ? -1 : 0;
}
