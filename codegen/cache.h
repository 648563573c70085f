/* Entries of the compile cache (codegen/cache.c), shared by the system compiler's
 * shared objects (jit.c) and the in-process JIT's object files (jit_clang.cpp). */
#ifndef KILN_CACHE_H
#define KILN_CACHE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { CACHE_MISS, CACHE_HIT, CACHE_CORRUPT } CacheLookup;

/* Reads the entry path made for key: on CACHE_HIT, its payload in *payload (free it
 * with cache_entry_free) of *len bytes. CACHE_MISS when there is no such file,
 * CACHE_CORRUPT when there is one that is not a whole entry for key. */
CacheLookup cache_entry_read(const char *path, const char *key, unsigned char **payload, size_t *len);
void cache_entry_free(unsigned char *payload);
/* Stores payload as the entry path for key, atomically; 0, or -1 (a cache that cannot
 * be written only costs a later run a compile, so callers may ignore it). */
int cache_entry_write(const char *path, const char *key, const void *payload, size_t len);
/* Says on stderr that the entry path is corrupt and is being rebuilt. */
void cache_entry_warn(const char *path);

#ifdef __cplusplus
}
#endif

#endif
