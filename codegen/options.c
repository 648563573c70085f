/* kiln_options: the settings of a compile, and the one place libkiln reads them from
 * the environment.
 *
 * A setting that changes what kiln builds (the compilers, the CPU, OpenBLAS or not,
 * CUDA on the GPU or emulated, the compile cache) reaches the code that uses it as
 * an explicit value: a field of kiln_options, checked and turned into JitOptions
 * here, then a Program or a Toolchain. Nothing deeper reads a variable, so a
 * program that links libkiln decides every setting itself, and the environment is
 * only its defaults: kiln_options_from_env reads them once per process (the first
 * call copies them; getenv is not safe against a concurrent setenv, and settings
 * that change under a running compile would make its cache key lie). The kiln
 * driver reads them through the same function, once, before its options. */
#include "jit.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum { SETTING_MAX = 4096 };

static struct {
    kiln_options options;
    char cache_dir[SETTING_MAX], cc[SETTING_MAX], cxx[SETTING_MAX], cpu[SETTING_MAX];
} from_env;
static pthread_once_t from_env_once = PTHREAD_ONCE_INIT;

/* value copied into buf, or NULL when it is unset, empty or too long to be a path */
static const char *copy_setting(const char *value, char *buf) {
    if (!value || !*value || strlen(value) >= SETTING_MAX)
        return NULL;
    return strcpy(buf, value);
}

static bool env_is(const char *name, const char *value) {
    const char *v = getenv(name);
    return v && strcmp(v, value) == 0;
}

static void read_env(void) {
    kiln_options *o = &from_env.options;
    const char *dir = getenv("KILN_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char path[SETTING_MAX];
    if (dir && *dir)
        o->cache_dir = copy_setting(dir, from_env.cache_dir);
    else if (xdg && *xdg && snprintf(path, sizeof path, "%s/kiln", xdg) < (int)sizeof path)
        o->cache_dir = copy_setting(path, from_env.cache_dir);
    else if (home && *home && snprintf(path, sizeof path, "%s/.cache/kiln", home) < (int)sizeof path)
        o->cache_dir = copy_setting(path, from_env.cache_dir);
    o->cc = copy_setting(getenv("KILN_CC"), from_env.cc);
    o->cxx = copy_setting(getenv("KILN_CXX"), from_env.cxx);
    o->cpu = copy_setting(getenv("KILN_CPU"), from_env.cpu);
    o->jit = env_is("KILN_JIT", "cc") ? "cc" : NULL;
    o->blas = env_is("KILN_BLAS", "off") ? "off" : NULL;
    o->cuda = env_is("KILN_CUDA", "emulate") ? "emulate" : NULL;
}

kiln_options kiln_options_from_env(void) {
    pthread_once(&from_env_once, read_env);
    return from_env.options;
}

static const char *or_default(const char *given, const char *dflt) {
    return given && *given ? given : dflt;
}

/* Which of `choices` (NULL-terminated; the first is the default, for NULL) value
 * is; -1 after a diagnostic naming them. */
static int choice(const char *field, const char *value, const char *const *choices, Diag *d) {
    if (!value)
        return 0;
    for (int i = 0; choices[i]; i++)
        if (strcmp(value, choices[i]) == 0)
            return i;
    return diag_error(d, (Loc){0}, "unknown %s '%s' (%s or %s)", field, value, choices[0], choices[1]);
}

int jit_options_from(const kiln_options *given, JitOptions *jo, Diag *d) {
    kiln_options env = kiln_options_from_env(), o = given ? *given : env;
    o.cache_dir = or_default(o.cache_dir, env.cache_dir);
    o.jit = or_default(o.jit, env.jit);
    o.cc = or_default(o.cc, env.cc);
    o.cxx = or_default(o.cxx, env.cxx);
    o.blas = or_default(o.blas, env.blas);
    o.cuda = or_default(o.cuda, env.cuda);
    int target = choice("target", o.target, (const char *const[]){"c", "cuda", NULL}, d);
    int jit = choice("jit", o.jit, (const char *const[]){"clang", "cc", NULL}, d);
    int blas = choice("blas", o.blas, (const char *const[]){"on", "off", NULL}, d);
    int cuda = choice("cuda", o.cuda, (const char *const[]){"gpu", "emulate", NULL}, d);
    if (target < 0 || jit < 0 || blas < 0 || cuda < 0)
        return -1;
    if (o.cpu && !cc_cpu_valid(o.cpu))
        return diag_error(d, (Loc){0}, "unknown cpu '%s' (native, x86-64, x86-64-v2, x86-64-v3 or x86-64-v4)",
                          o.cpu);
    *jo = (JitOptions){.cache = o.cache_dir,
                       .target = target == 1 ? TARGET_CUDA : TARGET_C,
                       .tools = {o.cc, o.cxx, o.cpu},
                       .clang = jit == 0,
                       .blas = blas == 0,
                       .cuda_emulated = cuda == 1};
    return 0;
}

int diag_relay_error(Diag *d, const kiln_error *err) {
    DiagKind kind = err->kind == KILN_ERROR_INTERNAL    ? DIAG_INTERNAL
                    : err->kind == KILN_ERROR_NO_MEMORY ? DIAG_NO_MEMORY
                                                        : DIAG_USER;
    return diag_relay(d, kind, err->message);
}
