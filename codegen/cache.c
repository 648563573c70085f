/* Entries of the compile cache: a payload with a trailer that makes it verifiable.
 *
 * An entry is the payload (an object file or a shared object, byte for byte as the
 * compiler made it, or a model's weights behind a head) followed by a 72-byte
 * trailer: the magic CACHE_ENTRY_FORMAT, the entry's key (the hash its file is named
 * by, so a file copied or renamed to another key is not taken for it), the
 * payload's length, the length of its head and its 64-bit checksum (cache_hash of
 * the head, then of the rest, so that a writer hashes and writes the two where they
 * lie, copying neither), each little-endian. The trailer goes at the end rather than the start
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
#ifdef __SSE2__
#include <emmintrin.h>
#endif

static const char MAGIC[8] = CACHE_ENTRY_FORMAT;
enum { KEY_BYTES = 40, TRAILER_BYTES = 8 + KEY_BYTES + 8 + 8 + 8 };

static const uint64_t MULTIPLIERS[2] = {0x100000001b3ull, 0x9e3779b97f4a7c15ull};

static uint64_t mix(uint64_t h, uint64_t w, uint64_t mul) {
    h = (h ^ w) * mul;
    return h ^ (h >> 29);
}

/* Long inputs are summed in eight lanes of 64 bits, each adding the product of the
 * two halves of its word (keyed by a constant of its own) and the word two lanes
 * away: 32-bit multiplies, SSE2's pmuludq on x86 (which compilers do not find in the
 * plain C below), so that a hash is as fast as memory. Every 1 KiB the lanes are
 * scrambled so that no lane can settle. */
enum { STRIPE = 64, SCRAMBLE_STRIPES = 16 };
static const uint64_t LANE_KEYS[8] = {0xbe4ba423396cfeb8ull, 0x1cad21f72c81017cull, 0xdb979083e96dd4deull,
                                      0x1f67b3b7a4a44072ull, 0x78e5c0cc4ee679cbull, 0x2172ffcc7dd05a82ull,
                                      0x8e2443f7744608b8ull, 0x4c263a81e69035e0ull};

static void scramble(uint64_t *acc) {
    for (int j = 0; j < 8; j++)
        acc[j] = (acc[j] ^ (acc[j] >> 47) ^ LANE_KEYS[j ^ 6]) * MULTIPLIERS[1];
}

#ifdef __SSE2__
static void stripes(uint64_t *acc, const unsigned char *b, size_t n_stripes) {
    __m128i sum[4], key[4], w[4];
    for (int j = 0; j < 4; j++) {
        sum[j] = _mm_loadu_si128((const __m128i *)(acc + 2 * j));
        key[j] = _mm_loadu_si128((const __m128i *)(LANE_KEYS + 2 * j));
    }
    for (size_t s = 0; s < n_stripes; s++) {
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++)
            w[j] = _mm_loadu_si128((const __m128i *)(b + s * STRIPE + 16 * j));
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            __m128i x = _mm_xor_si128(w[j], key[j]);
            sum[j] = _mm_add_epi64(sum[j], _mm_add_epi64(w[j ^ 1], _mm_mul_epu32(x, _mm_srli_epi64(x, 32))));
        }
        if (s % SCRAMBLE_STRIPES == SCRAMBLE_STRIPES - 1) {
            for (int j = 0; j < 4; j++)
                _mm_storeu_si128((__m128i *)(acc + 2 * j), sum[j]);
            scramble(acc);
            for (int j = 0; j < 4; j++)
                sum[j] = _mm_loadu_si128((const __m128i *)(acc + 2 * j));
        }
    }
    for (int j = 0; j < 4; j++)
        _mm_storeu_si128((__m128i *)(acc + 2 * j), sum[j]);
}
#else
static void stripes(uint64_t *acc, const unsigned char *b, size_t n_stripes) {
    for (size_t s = 0; s < n_stripes; s++) {
        uint64_t w[8];
        memcpy(w, b + s * STRIPE, sizeof w);
        for (int j = 0; j < 8; j++) {
            uint64_t x = w[j] ^ LANE_KEYS[j];
            acc[j] += w[j ^ 2] + (x & 0xffffffffu) * (x >> 32);
        }
        if (s % SCRAMBLE_STRIPES == SCRAMBLE_STRIPES - 1)
            scramble(acc);
    }
}
#endif

void cache_hash(CacheHash *hash, const void *data, size_t n) {
    const unsigned char *b = data;
    uint64_t *h = hash->h;
    size_t i = n / STRIPE * STRIPE;
    if (i) {
        uint64_t acc[8];
        for (int j = 0; j < 8; j++)
            acc[j] = h[j & 1] ^ LANE_KEYS[j];
        stripes(acc, b, n / STRIPE);
        for (int k = 0; k < 2; k++)
            for (int j = 0; j < 8; j++)
                h[k] = mix(h[k], acc[j], MULTIPLIERS[k]);
    }
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, sizeof w);
        for (int k = 0; k < 2; k++)
            h[k] = mix(h[k], w, MULTIPLIERS[k]);
    }
    for (; i < n; i++)
        for (int k = 0; k < 2; k++)
            h[k] = mix(h[k], b[i], MULTIPLIERS[k]);
    for (int k = 0; k < 2; k++)
        h[k] = mix(h[k], n, MULTIPLIERS[k]);
}

void cache_hash_string(CacheHash *h, const char *s) {
    cache_hash(h, s, strlen(s) + 1);
}

void cache_hash_text(const CacheHash *h, char *key, size_t n) {
    snprintf(key, n, "%016llx%016llx", (unsigned long long)h->h[0], (unsigned long long)h->h[1]);
}

static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* The trailer under key of the payload head[0..head_len) then body[0..body_len), into t. */
static void make_trailer(unsigned char *t, const char *key, const void *head, size_t head_len,
                         const void *body, size_t body_len) {
    memset(t, 0, TRAILER_BYTES);
    memcpy(t, MAGIC, 8);
    size_t k = strlen(key);
    memcpy(t + 8, key, k < KEY_BYTES ? k : KEY_BYTES);
    put_u64(t + 8 + KEY_BYTES, head_len + body_len);
    put_u64(t + 16 + KEY_BYTES, head_len);
    CacheHash h = CACHE_HASH_INIT;
    cache_hash(&h, head, head_len);
    cache_hash(&h, body, body_len);
    put_u64(t + 24 + KEY_BYTES, h.h[0] ^ h.h[1]);
}

/* Whether entry[0..n) is a whole entry for key; its payload's length in *len. */
static bool entry_valid(const unsigned char *entry, size_t n, const char *key, size_t *len) {
    if (n < TRAILER_BYTES)
        return false;
    *len = n - TRAILER_BYTES;
    uint64_t head = get_u64(entry + *len + 16 + KEY_BYTES);
    if (head > *len)
        return false;
    unsigned char want[TRAILER_BYTES];
    make_trailer(want, key, entry, (size_t)head, entry + head, *len - (size_t)head);
    return memcmp(entry + *len, want, TRAILER_BYTES) == 0;
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
    size_t body;
    if (rc != 0 || !entry_valid(buf, n, key, &body)) {
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
        map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return CACHE_CORRUPT;
    size_t body;
    if (!entry_valid(map, (size_t)st.st_size, key, &body)) {
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

int cache_entry_write(const char *path, const char *key, const void *head, size_t head_len, const void *body,
                      size_t body_len) {
    unsigned char trailer[TRAILER_BYTES];
    make_trailer(trailer, key, head, head_len, body, body_len);
    FILE *quiet = fopen("/dev/null", "w");
    Diag d;
    diag_init(&d, quiet ? quiet : stderr);
    const void *parts[] = {head, body, trailer};
    size_t lens[] = {head_len, body_len, sizeof trailer};
    int rc = quiet ? write_parts_atomic(path, 3, parts, lens, &d) : -1;
    if (quiet)
        fclose(quiet);
    return rc;
}

void cache_entry_warn(const char *path) {
    fprintf(stderr, "kiln: warning: cache entry %s is corrupt; rebuilding it\n", path);
}
