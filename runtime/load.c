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
    kiln_module *m = kiln_module_new(handle, unload_so, entry ? entry() : NULL, shown_as, err);
    if (m) {
        sym = dlsym(handle, "kiln_run_error");
        memcpy(&m->run_error, &sym, sizeof m->run_error);
    }
    return m;
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
    if (!def->create || !def->run || !def->destroy || def->n_inputs < 0 || def->n_outputs < 0 ||
        (def->n_inputs && !def->inputs) || (def->n_outputs && !def->outputs)) {
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

int kiln_run(kiln_module *m, const void *const *inputs, void *const *outputs, kiln_error *err) {
    if (!m)
        return kiln_set_error(err, "kiln_run: no module");
    if ((m->def->n_inputs > 0 && !inputs) || (m->def->n_outputs > 0 && !outputs))
        return kiln_set_error(err, "kiln_run: the %s array is NULL (the model '%s' has %d)",
                              !inputs && m->def->n_inputs > 0 ? "inputs" : "outputs", m->def->name,
                              !inputs && m->def->n_inputs > 0 ? m->def->n_inputs : m->def->n_outputs);
    for (int i = 0; i < m->def->n_inputs; i++)
        if (!inputs[i])
            return kiln_set_error(err, "kiln_run: input %d ('%s') is NULL", i, m->def->inputs[i].name);
    for (int i = 0; i < m->def->n_outputs; i++)
        if (!outputs[i])
            return kiln_set_error(err, "kiln_run: output %d ('%s') is NULL", i, m->def->outputs[i].name);
    int fault = m->def->run(m->instance, inputs, outputs);
    const char *why = fault && m->run_error ? m->run_error(fault) : NULL;
    if (why)
        return kiln_set_error(err, "the model '%s' failed to run: %s", m->def->name, why);
    if (fault)
        return kiln_set_error(err, "the model '%s' failed to run (its run-time check %d failed)",
                              m->def->name, fault);
    return 0;
}

const kiln_model_def *kiln_def(const kiln_module *m) {
    return m ? m->def : NULL;
}

void kiln_free(kiln_module *m) {
    if (!m)
        return;
    m->def->destroy(m->instance);
    m->unload(m->handle);
    free(m);
}
