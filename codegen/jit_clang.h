/* The in-process JIT: generated C compiled by the Clang and LLVM libraries and linked
 * into the running process with ORC, no compiler process and no temporary file.
 * Built only when CMake finds Clang and LLVM 14 (KILN_CLANG_JIT, which defines
 * KILN_HAVE_CLANG_JIT); codegen/jit.c falls back to the system compiler otherwise. */
#ifndef KILN_JIT_CLANG_H
#define KILN_JIT_CLANG_H

#include "../runtime/kiln/model.h"

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The weights blob that the model's `kiln_weights_blob` is: bytes[0..len), copied;
 * or, with mapping set, inside a cache entry's mapping (cache_entry_map) of mapped
 * bytes at a multiple of 64, used in place: the handle takes the mapping over, and
 * unmaps it when it is freed or its compile fails. */
typedef struct {
    const void *bytes;
    size_t len;
    const unsigned char *mapping;
    size_t mapped;
} JitWeights;

/* What a model's code is compiled from: n translation units of C (made by
 * emit_c_pieces or emit_c_units, built with KILN_WEIGHTS_EXTERN so that they refer to
 * an external `kiln_weights_blob`), of which the last n_kernels are each one kernel's
 * definition, to be compiled after prelude[0..prelude_len); and each unit's cache key. */
typedef struct {
    int n, n_kernels;
    const char *const *sources; /* NULL: only cached objects will do */
    const size_t *lens;
    const char *const *keys;
    const char *const *symbols; /* the n_kernels kernels' function names */
    const char *prelude;
    size_t prelude_len;
} JitUnits;

/* Compiles the units for the CPU cpu (-march=CPU; NULL: native), with LLVM's loop
 * unrolling or without it (unroll), on a thread a unit (the kernels, up to one a
 * core, as translation units of several of them whose code is then split into an
 * object a kernel), and links them into the process with `kiln_weights_blob` bound to
 * the weights and with the object file kernels[0..kernels_len) (the precompiled
 * kernels; none when kernels_len is 0); sets *def to what kiln_model() returns. When
 * cache_dir is not NULL, unit i's object file is taken from, or else stored
 * atomically in, cache_dir/keys[i].o, so that a unit compiled before (by this model
 * or, for a kernel, any other) skips Clang and LLVM's code generation.
 * Returns the handle that owns the code and the weights, or NULL with a message in
 * err[0..errlen). */
void *clang_jit_compile(const JitUnits *units, const JitWeights *weights, const void *kernels,
                        size_t kernels_len, const char *cpu, bool unroll, const char *cache_dir,
                        const kiln_model_def **def, char *err, size_t errlen);
/* Frees the code of a handle from clang_jit_compile; NULL is ignored. */
void clang_jit_free(void *handle);

#ifdef __cplusplus
}
#endif

#endif
