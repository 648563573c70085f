/* Entries of the compile cache: a payload with a trailer that makes it verifiable.
 *
 * An entry is the payload (an object file or a shared object, byte for byte as the
 * compiler made it) followed by a 64-byte trailer: the magic "KILNCACH", the entry's
 * key (the hash its file is named by, so a file copied or renamed to another key is
 * not taken for it), the payload's length and its 64-bit FNV-1a checksum, each
 * little-endian (the checksum cache_hash, 8 bytes a step). The trailer goes at the end rather than the start
 * because a shared object entry is dlopened in place, and the loader ignores bytes past what the ELF headers
 * describe. An entry is written to a temporary file and renamed into place, so a reader sees a whole entry or
 * none; one that fails any check (short, wrong magic or key, bad checksum) reads as CACHE_CORRUPT, and the
 * caller rebuilds it and says so once (cache_entry_warn). */
#include "cache.h"
#include "../frontend/frontend.h"

#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const char MAGIC[8] = "KILNCAC2";
enum { KEY_BYTES = 40, TRAILER_BYTES = 8 + KEY_BYTES + 8 + 8 };

uint64_t cache_hash(uint64_t h, uint64_t mul, const void *data, size_t n) {
    const unsigned char *b = data;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, sizeof w);
        h = (h ^ w) * mul;
        h ^= h >> 29;
    }
    for (; i < n; i++)
        h = (h ^ b[i]) * mul;
    return h;
}

static uint64_t checksum(const unsigned char *p, size_t n) {
    return cache_hash(0xcbf29ce484222325ull, 0x100000001b3ull, p, n);
}

static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* The trailer for payload under key, into t. */
static void make_trailer(unsigned char *t, const char *key, const unsigned char *payload, size_t len) {
    memset(t, 0, TRAILER_BYTES);
    memcpy(t, MAGIC, 8);
    size_t k = strlen(key);
    memcpy(t + 8, key, k < KEY_BYTES ? k : KEY_BYTES);
    put_u64(t + 8 + KEY_BYTES, len);
    put_u64(t + 16 + KEY_BYTES, checksum(payload, len));
}

CacheLookup cache_entry_read(const char *path, const char *key, unsigned char **payload, size_t *len) {
    *payload = NULL;
    *len = 0;
    FILE *quiet = fopen("/dev/null", "w");
    if (!quiet)
        return CACHE_MISS;
    Diag d;
    diag_init(&d, quiet);
    unsigned char *buf = NULL;
    size_t n = 0;
    bool exists = access(path, F_OK) == 0;
    int rc = exists ? read_file_bytes(path, &buf, &n, &d) : -1;
    fclose(quiet);
    if (!exists)
        return CACHE_MISS;
    if (rc != 0 || n < TRAILER_BYTES) {
        ir_free(buf);
        return CACHE_CORRUPT;
    }
    size_t body = n - TRAILER_BYTES;
    unsigned char want[TRAILER_BYTES];
    make_trailer(want, key, buf, body);
    if (memcmp(buf + body, want, TRAILER_BYTES) != 0) {
        ir_free(buf);
        return CACHE_CORRUPT;
    }
    *payload = buf;
    *len = body;
    return CACHE_HIT;
}

void cache_entry_free(unsigned char *payload) {
    ir_free(payload);
}

CacheLookup cache_entry_map(const char *path, const char *key, const unsigned char **payload, size_t *len,
                            size_t *mapped) {
    *payload = NULL;
    *len = *mapped = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return CACHE_MISS;
    struct stat st;
    void *map = MAP_FAILED;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size >= TRAILER_BYTES)
        map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return CACHE_CORRUPT;
    size_t body = (size_t)st.st_size - TRAILER_BYTES;
    unsigned char want[TRAILER_BYTES];
    make_trailer(want, key, map, body);
    if (memcmp((const unsigned char *)map + body, want, TRAILER_BYTES) != 0) {
        munmap(map, (size_t)st.st_size);
        return CACHE_CORRUPT;
    }
    *payload = map;
    *len = body;
    *mapped = (size_t)st.st_size;
    return CACHE_HIT;
}

void cache_entry_unmap(const unsigned char *payload, size_t mapped) {
    if (payload)
        munmap((void *)payload, mapped);
}

int cache_entry_write(const char *path, const char *key, const void *payload, size_t len) {
    unsigned char *buf = ir_malloc(len + TRAILER_BYTES);
    if (!buf)
        return -1;
    memcpy(buf, payload, len);
    make_trailer(buf + len, key, buf, len);
    FILE *quiet = fopen("/dev/null", "w");
    Diag d;
    diag_init(&d, quiet ? quiet : stderr);
    int rc = quiet ? write_file_atomic(path, buf, len + TRAILER_BYTES, &d) : -1;
    if (quiet)
        fclose(quiet);
    ir_free(buf);
    return rc;
}

void cache_entry_warn(const char *path) {
    fprintf(stderr, "kiln: warning: cache entry %s is corrupt; rebuilding it\n", path);
}
