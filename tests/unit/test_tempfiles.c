/* Unit tests for the registry of temporary paths (ir/tempfiles.h) that the driver's
 * signal handler empties: what it removes, in what order, and what it forgets.
 *
 *   - a directory registered before its files is removed after them (newest
 *     first), so a compile's kiln-cc-* directory goes whole;
 *   - a forgotten path (renamed into place) is left alone;
 *   - a full table refuses a path (-1) rather than overwrite a live slot, and frees
 *     its slots again once the paths are removed. */
/* cmocka needs these first, in this order */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include "ir/tempfiles.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void touch(const char *path) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fclose(f);
}

static void test_hostile_sigint_dir_removed_whole(void **state) {
    (void)state;
    char dir[] = "/tmp/kiln-test-tempfiles-XXXXXX", a[64], b[64], kept[64];
    assert_non_null(mkdtemp(dir));
    snprintf(a, sizeof a, "%s/a", dir);
    snprintf(b, sizeof b, "%s/b", dir);
    snprintf(kept, sizeof kept, "%s.kept", dir);
    assert_true(tempfiles_add(dir) >= 0);
    assert_true(tempfiles_add(a) >= 0);
    int slot_b = tempfiles_add(b);
    assert_true(slot_b >= 0);
    int slot_kept = tempfiles_add(kept);
    touch(a);
    touch(kept);
    tempfiles_forget(slot_kept); /* renamed into place: not a temporary any more */
    tempfiles_remove_all();      /* b was registered but never made: no harm */
    struct stat st;
    assert_int_equal(stat(a, &st), -1);
    assert_int_equal(stat(dir, &st), -1);
    assert_int_equal(stat(kept, &st), 0);
    unlink(kept);
}

static void test_hostile_tempfiles_table_full(void **state) {
    (void)state;
    int n = 0;
    while (tempfiles_add("/nonexistent/kiln-test-path") >= 0)
        n++;
    assert_true(n > 0);
    tempfiles_remove_all(); /* frees every slot */
    assert_true(tempfiles_add("/nonexistent/kiln-test-path") >= 0);
    tempfiles_remove_all();
    char long_path[8192];
    memset(long_path, 'x', sizeof long_path - 1);
    long_path[sizeof long_path - 1] = 0;
    assert_int_equal(tempfiles_add(long_path), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hostile_sigint_dir_removed_whole),
        cmocka_unit_test(test_hostile_tempfiles_table_full),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
