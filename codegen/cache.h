/* Entries of the compile cache (codegen/cache.c), shared by the system compiler's
 * shared objects (jit.c) and the in-process JIT's object files (jit_clang.cpp). */
#ifndef KILN_CACHE_H
#define KILN_CACHE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { CACHE_MISS, CACHE_HIT, CACHE_CORRUPT } CacheLookup;

/* A 128-bit hash, for the cache's keys and the entries' checksums: two independent
 * 64-bit multiplicative hashes (a seed and a multiplier each), each of them four
 * lanes of 8 bytes, so that hashing runs at the speed memory is read (a model's
 * weights are hundreds of megabytes, and a warm load hashes them all). */
typedef struct {
    uint64_t h[2];
} CacheHash;
#define CACHE_HASH_INIT                                                                                      \
    {                                                                                                        \
        { 0xcbf29ce484222325ull, 0x84222325cbf29ce4ull }                                                     \
    }
/* The entries' magic, which names their format and checksum: part of every key, so
 * that entries of another format are never looked up. */
#define CACHE_ENTRY_FORMAT "KILNCAC5"

/* Continues h with data[0..n), and n. */
void cache_hash(CacheHash *h, const void *data, size_t n);
void cache_hash_string(CacheHash *h, const char *s);
/* h as 32 hex digits and a NUL into key[0..n). */
void cache_hash_text(const CacheHash *h, char *key, size_t n);

/* Reads the entry path made for key: on CACHE_HIT, its payload in *payload (free it
 * with cache_entry_free) of *len bytes. CACHE_MISS when there is no such file,
 * CACHE_CORRUPT when there is one that is not a whole entry for key. */
CacheLookup cache_entry_read(const char *path, const char *key, unsigned char **payload, size_t *len);
void cache_entry_free(unsigned char *payload);
/* The same, the file mapped rather than read (for entries of hundreds of
 * megabytes, which a read would copy once more): *payload points into the mapping
 * of *mapped bytes, which cache_entry_unmap releases. */
CacheLookup cache_entry_map(const char *path, const char *key, const unsigned char **payload, size_t *len,
                            size_t *mapped);
void cache_entry_unmap(const unsigned char *payload, size_t mapped);
/* Stores the payload head[0..head_len) then body[0..body_len) as the entry path for
 * key, atomically; 0, or -1 (a cache that cannot be written only costs a later run a
 * compile, so callers may ignore it). */
int cache_entry_write(const char *path, const char *key, const void *head, size_t head_len, const void *body,
                      size_t body_len);
/* Says on stderr that the entry path is corrupt and is being rebuilt. */
void cache_entry_warn(const char *path);

#ifdef __cplusplus
}
#endif

#endif
