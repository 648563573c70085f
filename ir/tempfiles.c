/* The registry of temporary paths (tempfiles.h): a fixed table of slots, each one
 * free, being filled, or live. A slot is claimed with a compare-and-swap, filled,
 * then published as live; the signal handler reads only live slots, so it never
 * sees a half-written path, and nothing here allocates or locks. */
#include "tempfiles.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { SLOTS = 64, PATH_LEN = 4096 };
enum { FREE, FILLING, LIVE };

static atomic_int state[SLOTS];
static atomic_long order[SLOTS]; /* when a slot became live: newest is removed first */
static atomic_long added;        /* how many paths were ever added: the next one's order */
static char paths[SLOTS][PATH_LEN];

const char *tempfiles_dir(void) {
    const char *dir = getenv("TMPDIR");
    return dir && *dir ? dir : "/tmp";
}

int tempfiles_add(const char *path) {
    size_t n = strlen(path);
    if (n >= PATH_LEN)
        return -1;
    for (int i = 0; i < SLOTS; i++) {
        int expected = FREE;
        if (atomic_compare_exchange_strong(&state[i], &expected, FILLING)) {
            memcpy(paths[i], path, n + 1);
            atomic_store(&order[i], atomic_fetch_add(&added, 1));
            atomic_store(&state[i], LIVE);
            return i;
        }
    }
    return -1;
}

void tempfiles_forget(int slot) {
    if (slot >= 0 && slot < SLOTS)
        atomic_store(&state[slot], FREE);
}

void tempfiles_remove_all(void) {
    for (;;) {
        int newest = -1;
        long when = -1;
        for (int i = 0; i < SLOTS; i++)
            if (atomic_load(&state[i]) == LIVE && atomic_load(&order[i]) > when) {
                newest = i;
                when = atomic_load(&order[i]);
            }
        if (newest < 0)
            return;
        if (unlink(paths[newest]) != 0)
            rmdir(paths[newest]);
        atomic_store(&state[newest], FREE);
    }
}
