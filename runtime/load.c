/* Loading a compiled model: the file checked (elf_check.c), dlopen, the one symbol,
 * the ABI check, an instance.
 *
 * kiln_load needs only this file; kiln_jit (codegen/jit.c) compiles a model and
 * loads the result through the same kiln_module, dlopened or, for the in-process
 * JIT, made by kiln_module_new with the JIT's own unload. */
#include "kiln/kiln.h"
#include "module.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void set_error(kiln_error *err, kiln_error_kind kind, const char *fmt, va_list ap) {
    if (err) {
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        err->kind = kind;
    }
}

int kiln_set_error(kiln_error *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    /* the format's words, as diag_error classifies: a path cannot pose as one */
    set_error(err, strstr(fmt, "out of memory") ? KILN_ERROR_NO_MEMORY : KILN_ERROR_USER, fmt, ap);
    va_end(ap);
    return -1;
}

int kiln_set_error_kind(kiln_error *err, kiln_error_kind kind, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    set_error(err, kind, fmt, ap);
    va_end(ap);
    return -1;
}

static void unload_so(void *handle) {
    dlclose(handle);
}

kiln_module *kiln_module_open(const char *path, const char *shown_as, kiln_error *err) {
    if (kiln_check_shared_object(path, shown_as, err) != 0)
        return NULL;
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        kiln_set_error(err, "cannot load '%s': %s", shown_as, dlerror());
        return NULL;
    }
    const kiln_model_def *(*entry)(void);
    void *sym = dlsym(handle, "kiln_model");
    memcpy(&entry, &sym, sizeof entry); /* POSIX: a data pointer from dlsym may hold a function */
    return kiln_module_new(handle, unload_so, entry ? entry() : NULL, shown_as, err);
}

kiln_module *kiln_module_new(void *handle, void (*unload)(void *handle), const kiln_model_def *def,
                             const char *shown_as, kiln_error *err) {
    if (!def) {
        kiln_set_error(err, "'%s' is not a kiln model (it has no kiln_model symbol)", shown_as);
        unload(handle);
        return NULL;
    }
    if (def->abi_version != KILN_ABI_VERSION) {
        kiln_set_error(err, "'%s' is a kiln model of ABI version %u; this kiln reads version %d", shown_as,
                       def->abi_version, KILN_ABI_VERSION);
        unload(handle);
        return NULL;
    }
    bool params = def->extensions & KILN_EXT_PARAMS, comm = def->extensions & KILN_EXT_COMM,
         run_error = def->extensions & KILN_EXT_RUN_ERROR, sym = def->extensions & KILN_EXT_SYM;
    if (!def->create || !def->run || !def->destroy || def->n_inputs < 0 || def->n_outputs < 0 ||
        (def->n_inputs && !def->inputs) || (def->n_outputs && !def->outputs) ||
        (params &&
         (def->n_params < 0 || (def->n_params && !def->params) || !def->read_param || !def->write_param)) ||
        (comm && (!params || !def->create_comm)) || (run_error && (!comm || !def->run_error)) ||
        (sym && (!run_error || !def->run_sym || def->n_sym < 0 || def->n_sym > 1 ||
                 (def->n_sym &&
                  (!def->sym_names || !def->sym_names[0] || !def->sym_bounds || def->sym_bounds[0] < 1))))) {
        kiln_set_error(err, "'%s' is a malformed kiln model (its kiln_model_def lacks a function or table)",
                       shown_as);
        unload(handle);
        return NULL;
    }
    kiln_module *m = calloc(1, sizeof *m);
    if (!m) {
        kiln_set_error(err, "out of memory");
        unload(handle);
        return NULL;
    }
    m->handle = handle;
    m->unload = unload;
    m->def = def;
    char msg[512] = "";
    if (def->create(&m->instance, msg, sizeof msg) != 0) {
        /* a compiled model reports in words only (abi.md); kiln's own runtime says
           when the fault is kiln's (NVRTC rejecting the kernels kiln generated) */
        kiln_set_error_kind(err, strstr(msg, "(a bug in kiln") ? KILN_ERROR_INTERNAL : KILN_ERROR_USER,
                            "cannot create an instance of '%s': %s", shown_as, msg);
        unload(handle);
        free(m);
        return NULL;
    }
    return m;
}

kiln_module *kiln_load(const char *path, kiln_error *err) {
    if (!path) {
        kiln_set_error(err, "kiln_load: the path is NULL");
        return NULL;
    }
    /* dlopen searches the library path for a bare name; a file path is meant here */
    char buf[4096];
    if (!strchr(path, '/') && snprintf(buf, sizeof buf, "./%s", path) < (int)sizeof buf)
        return kiln_module_open(buf, path, err);
    return kiln_module_open(path, path, err);
}

int kiln_run_sym(kiln_module *m, const int64_t *sizes, const void *const *inputs, void *const *outputs,
                 kiln_error *err) {
    if (!m)
        return kiln_set_error(err, "kiln_run: no module");
    const kiln_model_def *def = m->def;
    if ((def->n_inputs > 0 && !inputs) || (def->n_outputs > 0 && !outputs))
        return kiln_set_error(err, "kiln_run: the %s array is NULL (the model '%s' has %d)",
                              !inputs && def->n_inputs > 0 ? "inputs" : "outputs", def->name,
                              !inputs && def->n_inputs > 0 ? def->n_inputs : def->n_outputs);
    for (int i = 0; i < def->n_inputs; i++)
        if (!inputs[i])
            return kiln_set_error(err, "kiln_run: input %d ('%s') is NULL", i, def->inputs[i].name);
    for (int i = 0; i < def->n_outputs; i++)
        if (!outputs[i])
            return kiln_set_error(err, "kiln_run: output %d ('%s') is NULL", i, def->outputs[i].name);
    int n_sym = def->extensions & KILN_EXT_SYM ? def->n_sym : 0;
    if (sizes && n_sym > 0 && (sizes[0] < 1 || sizes[0] > def->sym_bounds[0]))
        return kiln_set_error(err, "kiln_run: the model '%s' runs at %s from 1 to %lld, not %lld", def->name,
                              def->sym_names[0], (long long)def->sym_bounds[0], (long long)sizes[0]);
    int fault = sizes && n_sym > 0 ? def->run_sym(m->instance, sizes, inputs, outputs)
                                   : def->run(m->instance, inputs, outputs);
    const char *why = fault && (def->extensions & KILN_EXT_RUN_ERROR) ? def->run_error(fault) : NULL;
    const char *comm_why = fault && m->comm.error ? m->comm.error(m->comm.ctx) : NULL;
    if (why && comm_why)
        return kiln_set_error(err, "the model '%s' failed to run: %s: %s", def->name, why, comm_why);
    if (why)
        return kiln_set_error(err, "the model '%s' failed to run: %s", def->name, why);
    if (fault)
        return kiln_set_error(err, "the model '%s' failed to run (its run-time check %d failed)%s%s",
                              def->name, fault, comm_why ? ": " : "", comm_why ? comm_why : "");
    return 0;
}

int kiln_run(kiln_module *m, const void *const *inputs, void *const *outputs, kiln_error *err) {
    return kiln_run_sym(m, NULL, inputs, outputs, err);
}

const kiln_model_def *kiln_def(const kiln_module *m) {
    return m ? m->def : NULL;
}

/* The bytes of a tensor the model describes; 0 for a dtype or shape it cannot have. */
static size_t info_bytes(const kiln_tensor_info *t) {
    static const size_t dtype_bytes[] = {
        [KILN_F32] = 4, [KILN_F16] = 2, [KILN_BF16] = 2, [KILN_I64] = 8, [KILN_I32] = 4, [KILN_BOOL] = 1};
    if (t->dtype < KILN_F32 || t->dtype > KILN_BOOL || t->rank < 0 || (t->rank && !t->shape))
        return 0;
    size_t n = dtype_bytes[t->dtype];
    for (int k = 0; k < t->rank; k++)
        if (t->shape[k] < 0 || __builtin_mul_overflow(n, (size_t)t->shape[k], &n))
            return 0;
    return n;
}

/* The index of the updated param `name`, checked against a buffer of `bytes`; -1 with err set. */
static int find_param(const kiln_module *m, const char *name, size_t bytes, const char *fn, kiln_error *err) {
    if (!m || !name)
        return kiln_set_error(err, "%s: no %s", fn, m ? "name" : "module");
    const kiln_model_def *def = m->def;
    if (!(def->extensions & KILN_EXT_PARAMS))
        return kiln_set_error(err,
                              "%s: the model '%s' was compiled by a kiln that did not describe its params; "
                              "compile it again",
                              fn, def->name);
    for (int i = 0; i < def->n_params; i++) {
        const kiln_tensor_info *t = &def->params[i];
        if (!t->name || strcmp(t->name, name) != 0)
            continue;
        size_t need = info_bytes(t);
        if (need != bytes)
            return kiln_set_error(err, "%s: the param '%s' of '%s' is %zu bytes, but the buffer is %zu", fn,
                                  name, def->name, need, bytes);
        return i;
    }
    return kiln_set_error(err, "%s: the model '%s' has no param '%s' that its runs update", fn, def->name,
                          name);
}

int kiln_read_param(kiln_module *m, const char *name, void *dst, size_t bytes, kiln_error *err) {
    int i = find_param(m, name, bytes, "kiln_read_param", err);
    if (i < 0)
        return -1;
    if (!dst)
        return kiln_set_error(err, "kiln_read_param: the buffer for '%s' is NULL", name);
    if (m->def->read_param(m->instance, i, dst))
        return kiln_set_error(err, "kiln_read_param: the model '%s' could not copy out '%s'", m->def->name,
                              name);
    return 0;
}

int kiln_write_param(kiln_module *m, const char *name, const void *src, size_t bytes, kiln_error *err) {
    int i = find_param(m, name, bytes, "kiln_write_param", err);
    if (i < 0)
        return -1;
    if (!src)
        return kiln_set_error(err, "kiln_write_param: the buffer for '%s' is NULL", name);
    if (m->def->write_param(m->instance, i, src))
        return kiln_set_error(err, "kiln_write_param: the model '%s' could not copy in '%s'", m->def->name,
                              name);
    return 0;
}

int kiln_set_comm(kiln_module *m, const kiln_comm *comm, kiln_error *err) {
    if (!m)
        return kiln_set_error(err, "kiln_set_comm: no module");
    if (!(m->def->extensions & KILN_EXT_COMM))
        return kiln_set_error(err,
                              "kiln_set_comm: the model '%s' was compiled by a kiln without collectives; "
                              "compile it again",
                              m->def->name);
    void *instance;
    char msg[512] = "";
    if (m->def->create_comm(&instance, comm, msg, sizeof msg) != 0)
        return kiln_set_error(err, "kiln_set_comm: cannot create an instance of '%s': %s", m->def->name, msg);
    m->def->destroy(m->instance);
    m->instance = instance;
    m->comm = comm ? *comm : (kiln_comm){0};
    return 0;
}

const char *kiln_version(void) {
    return KILN_VERSION;
}

void kiln_free(kiln_module *m) {
    if (!m)
        return;
    m->def->destroy(m->instance);
    m->unload(m->handle);
    free(m);
}
