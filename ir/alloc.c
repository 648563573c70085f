/* Memory: the one allocation hook, and the arena graphs allocate from.
 *
 * Every allocation in kiln goes through ir_malloc and friends, so a test can make
 * the N-th allocation fail (ir_fail_alloc_after) and check that the failure is
 * reported cleanly (the count is the calling thread's own), and no single
 * allocation may exceed the machine's memory. The arena hands out
 * zeroed memory from large blocks that are freed together. */
#include "ir.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Per thread: a test fails the allocations of the thread it arms, and compiles on
 * other threads go on undisturbed (and unraced). */
static _Thread_local long allocs_left = -1;

void ir_fail_alloc_after(long n) {
    allocs_left = n;
}

static _Thread_local size_t alloc_limit;

void ir_set_alloc_limit(size_t bytes) {
    alloc_limit = bytes;
}

/* A model may declare a tensor of up to KILN_MAX_NUMEL elements (4 TiB of f32),
 * far more than any machine holds: a request beyond physical memory is refused
 * rather than left for the OOM killer. The machine is asked only for large ones. */
static bool fits_memory(size_t n) {
    if (alloc_limit)
        return n <= alloc_limit;
    if (n < ((size_t)1 << 28))
        return true;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages <= 0 || page <= 0 || n / (size_t)page <= (size_t)pages;
}

static bool may_allocate(size_t n) {
    if (!fits_memory(n))
        return false;
    if (allocs_left < 0)
        return true;
    if (allocs_left == 0)
        return false;
    allocs_left--;
    return true;
}

void *ir_malloc(size_t n) {
    return may_allocate(n) ? malloc(n ? n : 1) : NULL;
}
void *ir_calloc(size_t n, size_t size) {
    size_t bytes;
    if (__builtin_mul_overflow(n, size, &bytes))
        return NULL;
    return may_allocate(bytes) ? calloc(n ? n : 1, size ? size : 1) : NULL;
}
void *ir_realloc(void *p, size_t n) {
    return may_allocate(n) ? realloc(p, n ? n : 1) : NULL;
}
void ir_free(void *p) {
    free(p);
}

char *ir_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *r = ir_malloc(n);
    if (r)
        memcpy(r, s, n);
    return r;
}

struct ArenaBlock {
    ArenaBlock *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

enum { ARENA_BLOCK = 64 * 1024 };

void *arena_alloc(Arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    ArenaBlock *b = a->head;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > ARENA_BLOCK ? n : ARENA_BLOCK;
        b = ir_malloc(sizeof *b + cap);
        if (!b)
            return NULL;
        b->used = 0;
        b->cap = cap;
        b->next = a->head;
        a->head = b;
    }
    void *p = b->data + b->used;
    b->used += n;
    memset(p, 0, n);
    return p;
}

char *arena_strndup(Arena *a, const char *s, size_t n) {
    char *r = arena_alloc(a, n + 1);
    if (r)
        memcpy(r, s, n);
    return r;
}

char *arena_strdup(Arena *a, const char *s) {
    return arena_strndup(a, s, strlen(s));
}

void arena_free(Arena *a) {
    for (ArenaBlock *b = a->head, *next; b; b = next) {
        next = b->next;
        ir_free(b);
    }
    a->head = NULL;
}
