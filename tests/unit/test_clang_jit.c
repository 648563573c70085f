/* The in-process Clang JIT (codegen/jit_clang.cpp) against the interpreter, and its
 * object cache. Built only when KILN_CLANG_JIT is on.
 *
 * Each model is parsed, run in the reference interpreter, optimized, and compiled
 * in process by jit_graph into a fresh cache directory; its outputs must match the
 * interpreter's within |a-b| <= 1e-4 + 1e-4*|b|. The models: an elementwise graph
 * given as text, and examples/small_cnn.kiln (convolutions through cblas_sgemm,
 * which the JIT binds to the OpenBLAS kiln links). The cache test compiles
 * small_cnn twice: the first JIT must leave a KEY.o for its run function and one
 * for each kernel text in the directory, and the second must load them, leaving
 * them untouched (same mtime to the nanosecond, nothing else written). KILN_JIT=cc must take the system
 * compiler instead (a KEY.so appears), and C that does not compile must come back as an error naming Clang's
 * complaint, with nothing cached. The cache's hash changes with every bit it is given. */
/* cmocka needs these first, in this order */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include "codegen/cache.h"
#include "codegen/jit.h"
#include "codegen/jit_clang.h"
#include "frontend/frontend.h"
#include "passes/passes.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char ELEMENTWISE[] = "model elementwise\n"
                                  "input a : f32[4, 8]\n"
                                  "input b : f32[8]\n"
                                  "s = add(a, b) : f32[4, 8]\n"
                                  "t = tanh(s) : f32[4, 8]\n"
                                  "e = exp(t) : f32[4, 8]\n"
                                  "y = mul(e, a) : f32[4, 8]\n"
                                  "output y\n";

static bool close_enough(float got, float want) {
    if (isnan(want) || isnan(got))
        return isnan(want) && isnan(got);
    return fabs((double)got - want) <= 1e-4 + 1e-4 * fabs((double)want);
}

/* A fresh cache directory under $TMPDIR, into buf. */
static void make_cache_dir(char *buf, size_t n) {
    const char *tmp = getenv("TMPDIR");
    snprintf(buf, n, "%s/kiln-test-clang-jit-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    assert_non_null(mkdtemp(buf));
}

/* Removes the directory and the files in it. */
static void remove_cache_dir(const char *dir) {
    DIR *dp = opendir(dir);
    char path[4200];
    for (struct dirent *e; dp && (e = readdir(dp));)
        if (e->d_name[0] != '.') {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    if (dp)
        closedir(dp);
    rmdir(dir);
}

/* The files in dir, which must all end in suffix, into paths[0..most) in the order of
 * their names; returns how many. */
static int cache_files(const char *dir, const char *suffix, char (*paths)[4200], int most) {
    struct dirent **names = NULL;
    int n = scandir(dir, &names, NULL, alphasort), count = 0;
    assert_true(n >= 0);
    for (int i = 0; i < n; i++) {
        const char *name = names[i]->d_name;
        size_t len = strlen(name), slen = strlen(suffix);
        if (name[0] != '.' && (len <= slen || strcmp(name + len - slen, suffix) != 0))
            fail_msg("unexpected file '%s' in the cache %s", name, dir);
        if (name[0] != '.' && count < most)
            snprintf(paths[count++], sizeof paths[0], "%s/%s", dir, name);
        free(names[i]);
    }
    free(names);
    return count;
}

/* The one file in dir, which must end in suffix, into path; fails otherwise. */
static void only_file(const char *dir, const char *suffix, char *path, size_t n) {
    char paths[2][4200];
    int count = cache_files(dir, suffix, paths, 2);
    if (count != 1)
        fail_msg("%d files in the cache %s, expected one *%s", count, dir, suffix);
    snprintf(path, n, "%s", paths[0]);
}

/* Parses text, runs it in the interpreter on inputs[0..n_inputs), JITs it with the cache in dir
 * (compiled as kiln_options.jit says: "clang" or "cc"), runs that and compares; returns the number of
 * mismatches, or -1 when something did not run (after printing why). */
static long jit_and_compare(const char *name, const char *text, Tensor *const *inputs, int n_inputs,
                            const char *dir, const char *jit) {
    Diag d;
    diag_init(&d, stdout);
    TensorList weights = {0};
    Tensor *ref = NULL, *got = NULL;
    kiln_module *m = NULL;
    kiln_error err = {.message = ""};
    long bad = -1;
    SrcFile *src = srcfile_from_string(name, text);
    Graph *g = src ? parse_model(src, &d) : NULL;
    PipelineOptions po = {.level = 2, .verify = true};
    if (g && g->n_outputs == 1 && verify_graph(g, &d) == 0 &&
        interp_run(g, &weights, (const Tensor *const *)inputs, &ref, &d) == 0 &&
        pipeline_run(g, &weights, &po, &d) == 0) {
        JitOptions jo;
        kiln_options o = kiln_options_from_env();
        o.cache_dir = dir;
        o.jit = jit;
        if (jit_options_from(&o, &jo, &d) == 0) {
            jo.memplan = pipeline_selects(&po, "memplan");
            m = jit_graph(g, &weights, &jo, &d, &err);
        }
        if (!m)
            printf("%s: jit_graph: %s\n", name, err.message);
        got = tensor_new(&ref->type);
    }
    const void *in[4] = {0};
    for (int i = 0; i < n_inputs && i < 4; i++)
        in[i] = inputs[i]->data;
    void *out[1] = {got ? got->data : NULL};
    if (m && got && kiln_run(m, in, out, &err) != 0)
        printf("%s: kiln_run: %s\n", name, err.message);
    else if (m && got) {
        bad = 0;
        for (int64_t i = 0; i < type_numel(&ref->type); i++)
            if (!close_enough(got->data[i], ref->data[i]) && bad++ < 5)
                printf("%s: [%lld]: JIT %.9g, interpreter %.9g\n", name, (long long)i, (double)got->data[i],
                       (double)ref->data[i]);
    }
    kiln_free(m);
    tensor_free(got);
    tensor_free(ref);
    if (g)
        graph_free(g);
    tensors_free(&weights); /* the params the passes made */
    srcfile_free(src);
    fflush(stdout);
    return bad;
}

/* The elementwise model's inputs: a[4, 8] and b[8], fixed values in [-1, 1]. */
static void elementwise_inputs(Tensor **in) {
    Type ta = {.dtype = DT_F32, .rank = 2, .dims = {4, 8}}, tb = {.dtype = DT_F32, .rank = 1, .dims = {8}};
    in[0] = tensor_new(&ta);
    in[1] = tensor_new(&tb);
    assert_true(in[0] && in[1]);
    for (int i = 0; i < 32; i++)
        in[0]->data[i] = (float)((i * 7) % 17) / 8.0f - 1.0f;
    for (int i = 0; i < 8; i++)
        in[1]->data[i] = (float)((i * 5) % 9) / 4.0f - 1.0f;
}

/* The elementwise graph is one fused kernel: the JIT caches two objects, that
 * kernel's and the run function's. */
static void test_elementwise(void **state) {
    (void)state;
    char dir[4096], objects[3][4200];
    Tensor *in[2];
    make_cache_dir(dir, sizeof dir);
    elementwise_inputs(in);
    long bad = jit_and_compare("elementwise", ELEMENTWISE, in, 2, dir, "clang");
    int n = cache_files(dir, ".o", objects, 3);
    tensor_free(in[0]);
    tensor_free(in[1]);
    remove_cache_dir(dir);
    assert_int_equal(bad, 0);
    assert_int_equal(n, 2);
}

/* small_cnn has 9 kernels of 8 texts (its two max pools differ only in their
 * buffers): the first JIT caches their 8 objects and the run function's, and the
 * second loads them all, writing nothing. */
enum { SMALL_CNN_OBJECTS = 9 };

static void test_small_cnn_and_cache(void **state) {
    (void)state;
    Diag d;
    diag_init(&d, stdout);
    SrcFile *src = srcfile_read(KILN_SOURCE_DIR "/examples/small_cnn.kiln", &d);
    Tensor *x = NULL;
    assert_non_null(src);
    assert_int_equal(npy_read(KILN_SOURCE_DIR "/examples/small_cnn_input.npy", &x, &d), 0);

    char dir[4096], objects[SMALL_CNN_OBJECTS + 1][4200], again[SMALL_CNN_OBJECTS + 1][4200];
    make_cache_dir(dir, sizeof dir);
    long bad = jit_and_compare("small_cnn", src->text, &x, 1, dir, "clang");
    int n = cache_files(dir, ".o", objects, SMALL_CNN_OBJECTS + 1);
    struct stat first[SMALL_CNN_OBJECTS + 1], second;
    for (int i = 0; i < n; i++)
        assert_int_equal(stat(objects[i], &first[i]), 0);

    long bad_again = jit_and_compare("small_cnn", src->text, &x, 1, dir, "clang");
    int n_again = cache_files(dir, ".o", again, SMALL_CNN_OBJECTS + 1);
    assert_int_equal(n, SMALL_CNN_OBJECTS);
    assert_int_equal(n_again, n);
    for (int i = 0; i < n; i++) { /* each cached object was read, not written again */
        assert_string_equal(objects[i], again[i]);
        assert_int_equal(stat(again[i], &second), 0);
        assert_int_equal(first[i].st_ino, second.st_ino);
        assert_int_equal(first[i].st_size, second.st_size);
        assert_int_equal(first[i].st_mtim.tv_sec, second.st_mtim.tv_sec);
        assert_int_equal(first[i].st_mtim.tv_nsec, second.st_mtim.tv_nsec);
    }
    tensor_free(x);
    srcfile_free(src);
    remove_cache_dir(dir);
    assert_int_equal(bad, 0);
    assert_int_equal(bad_again, 0);
}

/* Entries whose trailers are right but whose objects LLVM cannot link (written by
 * something else under the right keys: the kernel's and the run function's) are
 * compiled again and overwritten. */
static void test_hostile_cache_unlinkable_object(void **state) {
    (void)state;
    char dir[4096], objects[3][4200], key[64];
    Tensor *in[2];
    make_cache_dir(dir, sizeof dir);
    elementwise_inputs(in);
    long bad = jit_and_compare("elementwise", ELEMENTWISE, in, 2, dir, "clang");
    int n = cache_files(dir, ".o", objects, 3);
    static const char garbage[] = "\177ELF, but not an object file at all";
    for (int i = 0; i < n; i++) {
        const char *name = strrchr(objects[i], '/') + 1;
        snprintf(key, sizeof key, "%.*s", (int)(strlen(name) - 2), name);
        assert_int_equal(cache_entry_write(objects[i], key, NULL, 0, garbage, sizeof garbage), 0);
    }
    long bad_again = jit_and_compare("elementwise", ELEMENTWISE, in, 2, dir, "clang");
    for (int i = 0; i < n; i++) {
        const char *name = strrchr(objects[i], '/') + 1;
        snprintf(key, sizeof key, "%.*s", (int)(strlen(name) - 2), name);
        unsigned char *payload = NULL;
        size_t len = 0;
        assert_int_equal(cache_entry_read(objects[i], key, &payload, &len), CACHE_HIT);
        cache_entry_free(payload);
        assert_true(len > sizeof garbage); /* the object compiled afresh */
        assert_int_equal(cache_entry_read(objects[i], "another key", &payload, &len), CACHE_CORRUPT);
    }
    tensor_free(in[0]);
    tensor_free(in[1]);
    remove_cache_dir(dir);
    assert_int_equal(bad, 0);
    assert_int_equal(bad_again, 0);
    assert_int_equal(n, 2);
}

/* The cache's hash, which names entries and checks them: any one bit flipped in a
 * buffer long enough for every lane (and the tail past the last stripe), a byte
 * more, or the same bytes fed in other pieces, changes both of its halves. */
static void test_cache_hash(void **state) {
    (void)state;
    enum { N = 2 * 1024 + 77 };
    static unsigned char b[N + 1];
    for (size_t i = 0; i < N; i++)
        b[i] = (unsigned char)(i * 131 + 7);
    CacheHash base = CACHE_HASH_INIT;
    cache_hash(&base, b, N);
    for (size_t i = 0; i < N; i++)
        for (int bit = 0; bit < 8; bit++) {
            b[i] ^= (unsigned char)(1u << bit);
            CacheHash h = CACHE_HASH_INIT;
            cache_hash(&h, b, N);
            b[i] ^= (unsigned char)(1u << bit);
            if (h.h[0] == base.h[0] || h.h[1] == base.h[1])
                fail_msg("flipping bit %d of byte %zu leaves a half of the hash as it was", bit, i);
        }
    CacheHash longer = CACHE_HASH_INIT, pieces = CACHE_HASH_INIT;
    cache_hash(&longer, b, N + 1);
    cache_hash(&pieces, b, 64);
    cache_hash(&pieces, b + 64, N - 64);
    assert_true(longer.h[0] != base.h[0] && longer.h[1] != base.h[1]);
    assert_true(pieces.h[0] != base.h[0] && pieces.h[1] != base.h[1]);
}

static void test_cc_fallback(void **state) {
    (void)state;
    char dir[4096], so[4200];
    Tensor *in[2];
    make_cache_dir(dir, sizeof dir);
    elementwise_inputs(in);
    long bad = jit_and_compare("elementwise", ELEMENTWISE, in, 2, dir, "cc");
    only_file(dir, ".so", so, sizeof so);
    tensor_free(in[0]);
    tensor_free(in[1]);
    remove_cache_dir(dir);
    assert_int_equal(bad, 0);
}

static void test_compile_error(void **state) {
    (void)state;
    static const char bad_c[] = "int f(void) { return undeclared_name; }\n";
    static const unsigned char weights[4] = {0};
    char dir[4096], err[1024] = "";
    const kiln_model_def *def = (const kiln_model_def *)weights;
    make_cache_dir(dir, sizeof dir);
    JitUnits units = {.n = 1,
                      .sources = (const char *const[]){bad_c},
                      .lens = (const size_t[]){sizeof bad_c - 1},
                      .keys = (const char *const[]){"bad"}};
    void *h = clang_jit_compile(&units, &(JitWeights){weights, sizeof weights, NULL, 0}, NULL, 0, NULL, false,
                                dir, &def, err, sizeof err);
    char path[4200];
    snprintf(path, sizeof path, "%s/bad.o", dir);
    bool cached = access(path, F_OK) == 0;
    remove_cache_dir(dir);
    assert_null(h);
    assert_null(def);
    assert_non_null(strstr(err, "undeclared_name"));
    assert_false(cached);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_small_cnn_and_cache),
        cmocka_unit_test(test_hostile_cache_unlinkable_object),
        cmocka_unit_test(test_cache_hash),
        cmocka_unit_test(test_cc_fallback),
        cmocka_unit_test(test_compile_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
