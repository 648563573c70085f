/* Internal to libkiln: what a kiln_module holds, shared by loading and the JIT. */
#ifndef KILN_MODULE_H
#define KILN_MODULE_H

#include "kiln/kiln.h"

struct kiln_module {
    void *handle;                 /* from dlopen, or the in-process JIT's */
    void (*unload)(void *handle); /* frees handle: dlclose, or clang_jit_free */
    const kiln_model_def *def;
    void *instance;
    kiln_comm comm; /* what kiln_set_comm gave the instance; size 0: none */
};

/* Sets err->message, of kind KILN_ERROR_NO_MEMORY when fmt says "out of memory",
 * else KILN_ERROR_USER; returns -1. */
int kiln_set_error(kiln_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The same, of the given kind. */
int kiln_set_error_kind(kiln_error *err, kiln_error_kind kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Checks, without mapping or running any of it, that path is a regular file holding a
 * whole ELF shared object for this machine that defines kiln_model; -1 with err set. */
int kiln_check_shared_object(const char *path, const char *shown_as, kiln_error *err);
/* The same checks on an open file (tests/fuzz/fuzz_elf.c feeds it a memfd). */
int kiln_check_elf_fd(int fd, const char *shown_as, kiln_error *err);
/* dlopen path (shown in messages as shown_as), check the ABI, create an instance. */
kiln_module *kiln_module_open(const char *path, const char *shown_as, kiln_error *err);
/* The module of code already loaded: checks def's ABI and creates an instance. The
 * module owns handle, and unload frees it, also when this fails. */
kiln_module *kiln_module_new(void *handle, void (*unload)(void *handle), const kiln_model_def *def,
                             const char *shown_as, kiln_error *err);

#endif
