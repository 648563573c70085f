/* Unit tests for the tensor files: .npy and safetensors readers and writers, and
 * the whole-file helpers under them.
 *
 * Round trips go through real files in a temporary directory. Files numpy wrote
 * are embedded as bytes (made once with numpy 1.24's np.save and
 * np.lib.format.write_array), so the tests need no Python; the writer must
 * reproduce numpy's bytes exactly. Every malformed case builds a small buffer,
 * checks that the parser returns -1 with nothing allocated, and looks for the key
 * words of the message in the diagnostics, captured with open_memstream. */
/* cmocka needs these first, in this order */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include "frontend/frontend.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* clang-format off */
/* np.save(f, np.arange(6, dtype='<f4').reshape(2, 3) * 0.5 - 1) */
static const unsigned char NUMPY_V1[] = {
    0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 0x01, 0x00, 0x76, 0x00, 0x7b, 0x27, 0x64, 0x65, 0x73, 0x63,
    0x72, 0x27, 0x3a, 0x20, 0x27, 0x3c, 0x66, 0x34, 0x27, 0x2c, 0x20, 0x27, 0x66, 0x6f, 0x72, 0x74,
    0x72, 0x61, 0x6e, 0x5f, 0x6f, 0x72, 0x64, 0x65, 0x72, 0x27, 0x3a, 0x20, 0x46, 0x61, 0x6c, 0x73,
    0x65, 0x2c, 0x20, 0x27, 0x73, 0x68, 0x61, 0x70, 0x65, 0x27, 0x3a, 0x20, 0x28, 0x32, 0x2c, 0x20,
    0x33, 0x29, 0x2c, 0x20, 0x7d, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x0a,
    0x00, 0x00, 0x80, 0xbf, 0x00, 0x00, 0x00, 0xbf, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x3f,
    0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0xc0, 0x3f};

/* The same array, np.lib.format.write_array(f, a, version=(2, 0)): a 4-byte header length. */
static const unsigned char NUMPY_V2[] = {
    0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 0x02, 0x00, 0x74, 0x00, 0x00, 0x00, 0x7b, 0x27, 0x64, 0x65,
    0x73, 0x63, 0x72, 0x27, 0x3a, 0x20, 0x27, 0x3c, 0x66, 0x34, 0x27, 0x2c, 0x20, 0x27, 0x66, 0x6f,
    0x72, 0x74, 0x72, 0x61, 0x6e, 0x5f, 0x6f, 0x72, 0x64, 0x65, 0x72, 0x27, 0x3a, 0x20, 0x46, 0x61,
    0x6c, 0x73, 0x65, 0x2c, 0x20, 0x27, 0x73, 0x68, 0x61, 0x70, 0x65, 0x27, 0x3a, 0x20, 0x28, 0x32,
    0x2c, 0x20, 0x33, 0x29, 0x2c, 0x20, 0x7d, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x0a,
    0x00, 0x00, 0x80, 0xbf, 0x00, 0x00, 0x00, 0xbf, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x3f,
    0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0xc0, 0x3f};

/* np.save(f, np.array(3.25, dtype='<f4')): a 0-d array. */
static const unsigned char NUMPY_SCALAR[] = {
    0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59, 0x01, 0x00, 0x76, 0x00, 0x7b, 0x27, 0x64, 0x65, 0x73, 0x63,
    0x72, 0x27, 0x3a, 0x20, 0x27, 0x3c, 0x66, 0x34, 0x27, 0x2c, 0x20, 0x27, 0x66, 0x6f, 0x72, 0x74,
    0x72, 0x61, 0x6e, 0x5f, 0x6f, 0x72, 0x64, 0x65, 0x72, 0x27, 0x3a, 0x20, 0x46, 0x61, 0x6c, 0x73,
    0x65, 0x2c, 0x20, 0x27, 0x73, 0x68, 0x61, 0x70, 0x65, 0x27, 0x3a, 0x20, 0x28, 0x29, 0x2c, 0x20,
    0x7d, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20,
    0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x0a,
    0x00, 0x00, 0x50, 0x40};

/* Headers numpy 1.24 writes (after the 10-byte prefix), for the writer to match. */
static const struct {
    int rank;
    int64_t dims[4];
    const char *header;
} NUMPY_HEADERS[] = {
    {0, {0}, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }"
             "                                                              \n"},
    {1, {5}, "{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }"
             "                                                            \n"},
    {4, {1, 2, 3, 4}, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 3, 4), }"
                      "                                                    \n"},
    {2, {123456, 7}, "{'descr': '<f4', 'fortran_order': False, 'shape': (123456, 7), }"
                     "                                                     \n"},
};
/* clang-format on */

/* ---- Helpers ---- */

static char tmpdir[64];

static int make_tmpdir(void **state) {
    (void)state;
    strcpy(tmpdir, "/tmp/kiln-test-files-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int remove_tmpdir(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static const char *tmp_path(const char *name) {
    static char path[4][256];
    static int which;
    which = (which + 1) % 4;
    snprintf(path[which], sizeof path[which], "%s/%s", tmpdir, name);
    return path[which];
}

static int count_entries(const char *dir) {
    DIR *dp = opendir(dir);
    assert_non_null(dp);
    int n = 0;
    for (struct dirent *e; (e = readdir(dp));)
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(dp);
    return n;
}

/* Diagnostics captured in memory. */
typedef struct {
    Diag d;
    FILE *f;
    char *text;
    size_t len;
} Capture;

static void capture_open(Capture *c) {
    c->text = NULL;
    c->f = open_memstream(&c->text, &c->len);
    assert_non_null(c->f);
    diag_init(&c->d, c->f);
}

static const char *captured(Capture *c) {
    fflush(c->f);
    return c->text ? c->text : "";
}

static void capture_close(Capture *c) {
    fclose(c->f);
    free(c->text);
}

/* Asserts that the message contains each of the NULL-terminated key words. */
static void assert_message(Capture *c, ...) {
    const char *text = captured(c);
    assert_true(strncmp(text, "kiln: error: ", 13) == 0);
    va_list ap;
    va_start(ap, c);
    for (const char *word; (word = va_arg(ap, const char *));)
        if (!strstr(text, word))
            fail_msg("message '%s' lacks '%s'", text, word);
    va_end(ap);
}

static Tensor *make_tensor(int rank, const int64_t *dims, float base) {
    Type t = type_make(rank, dims);
    Tensor *r = tensor_new(&t);
    assert_non_null(r);
    for (int64_t i = 0; i < type_numel(&t); i++)
        r->data[i] = base + 0.25f * (float)i;
    return r;
}

static void assert_tensor_equal(const Tensor *a, const Tensor *b) {
    assert_true(type_equal(&a->type, &b->type));
    assert_memory_equal(a->data, b->data, sizeof(float) * (size_t)type_numel(&a->type));
}

/* ---- .npy ---- */

static unsigned char npy_buf[4096];

/* A .npy file with the given version, header text (used as is) and data bytes. */
static size_t make_npy(int major, const char *header, size_t data_bytes) {
    size_t hlen = strlen(header), prefix = major == 1 ? 10 : 12;
    memcpy(npy_buf, "\x93NUMPY", 6);
    npy_buf[6] = (unsigned char)major;
    npy_buf[7] = 0;
    for (size_t i = 0; i < prefix - 8; i++)
        npy_buf[8 + i] = (unsigned char)(hlen >> (8 * i));
    memcpy(npy_buf + prefix, header, hlen);
    for (size_t i = 0; i < data_bytes; i++)
        npy_buf[prefix + hlen + i] = (unsigned char)i;
    return prefix + hlen + data_bytes;
}

static void test_npy_numpy_files(void **state) {
    (void)state;
    static const float want[6] = {-1, -0.5f, 0, 0.5f, 1, 1.5f};
    const struct {
        const unsigned char *buf;
        size_t len;
    } files[] = {{NUMPY_V1, sizeof NUMPY_V1}, {NUMPY_V2, sizeof NUMPY_V2}};
    for (int i = 0; i < 2; i++) {
        Capture c;
        capture_open(&c);
        Tensor *t;
        assert_int_equal(npy_parse(files[i].buf, files[i].len, "a.npy", &t, &c.d), 0);
        assert_int_equal(t->type.rank, 2);
        assert_int_equal(t->type.dims[0], 2);
        assert_int_equal(t->type.dims[1], 3);
        assert_memory_equal(t->data, want, sizeof want);
        tensor_free(t);
        assert_string_equal(captured(&c), "");
        capture_close(&c);
    }
    /* version 3.0 differs from 2.0 only in the header's encoding (UTF-8) */
    unsigned char v3[sizeof NUMPY_V2];
    memcpy(v3, NUMPY_V2, sizeof v3);
    v3[6] = 3;
    Tensor *t;
    Diag d;
    diag_init(&d, stderr);
    assert_int_equal(npy_parse(v3, sizeof v3, "a.npy", &t, &d), 0);
    assert_memory_equal(t->data, want, sizeof want);
    tensor_free(t);

    assert_int_equal(npy_parse(NUMPY_SCALAR, sizeof NUMPY_SCALAR, "s.npy", &t, &d), 0);
    assert_int_equal(t->type.rank, 0);
    assert_true(t->data[0] == 3.25f);
    tensor_free(t);
}

/* Keys in another order, double quotes, no spaces, no trailing comma or newline. */
static void test_npy_header_variants(void **state) {
    (void)state;
    static const char *headers[] = {
        "{'shape': (2, 3), 'fortran_order': False, 'descr': '<f4'}",
        "{\"descr\":\"<f4\",\"fortran_order\":False,\"shape\":(2,3,)}\n",
        "{ 'descr' : '<f4' , 'shape' : ( 2 , 3 ) , 'fortran_order' : False , }        \n",
    };
    Diag d;
    diag_init(&d, stderr);
    for (size_t i = 0; i < sizeof headers / sizeof *headers; i++) {
        Tensor *t;
        size_t len = make_npy(1, headers[i], 24);
        assert_int_equal(npy_parse(npy_buf, len, "v.npy", &t, &d), 0);
        assert_int_equal(t->type.rank, 2);
        assert_int_equal(t->type.dims[1], 3);
        tensor_free(t);
    }
}

static void test_npy_roundtrip(void **state) {
    (void)state;
    static const int64_t dims[4] = {2, 1, 3, 5};
    const int ranks[] = {0, 1, 4};
    Diag d;
    diag_init(&d, stderr);
    for (int i = 0; i < 3; i++) {
        Tensor *t = make_tensor(ranks[i], dims, -3), *back;
        const char *path = tmp_path("rt.npy");
        assert_int_equal(npy_write(path, t, &d), 0);
        assert_int_equal(npy_read(path, &back, &d), 0);
        assert_tensor_equal(t, back);
        struct stat st;
        assert_int_equal(stat(path, &st), 0);
        assert_int_equal((st.st_size - 4 * type_numel(&t->type)) % 64, 0);
        tensor_free(t);
        tensor_free(back);
    }
    assert_int_equal(d.errors, 0);
}

static void assert_file_bytes(const char *path, const void *want, size_t len) {
    unsigned char *buf;
    size_t got;
    Diag d;
    diag_init(&d, stderr);
    assert_int_equal(read_file_bytes(path, &buf, &got, &d), 0);
    assert_int_equal(got, len);
    assert_memory_equal(buf, want, len);
    ir_free(buf);
}

static void test_npy_write_matches_numpy(void **state) {
    (void)state;
    Diag d;
    diag_init(&d, stderr);
    static const float a[6] = {-1, -0.5f, 0, 0.5f, 1, 1.5f};
    const char *path = tmp_path("np.npy");
    Tensor *t = make_tensor(2, (const int64_t[]){2, 3}, 0);
    memcpy(t->data, a, sizeof a);
    assert_int_equal(npy_write(path, t, &d), 0);
    assert_file_bytes(path, NUMPY_V1, sizeof NUMPY_V1);
    tensor_free(t);

    t = make_tensor(0, NULL, 3.25f);
    assert_int_equal(npy_write(path, t, &d), 0);
    assert_file_bytes(path, NUMPY_SCALAR, sizeof NUMPY_SCALAR);
    tensor_free(t);

    for (size_t i = 0; i < sizeof NUMPY_HEADERS / sizeof *NUMPY_HEADERS; i++) {
        t = make_tensor(NUMPY_HEADERS[i].rank, NUMPY_HEADERS[i].dims, 1);
        assert_int_equal(npy_write(path, t, &d), 0);
        unsigned char *buf;
        size_t len, hlen = strlen(NUMPY_HEADERS[i].header);
        assert_int_equal(read_file_bytes(path, &buf, &len, &d), 0);
        assert_int_equal(len, 10 + hlen + 4 * (size_t)type_numel(&t->type));
        assert_int_equal(buf[8] | buf[9] << 8, hlen);
        assert_memory_equal(buf + 10, NUMPY_HEADERS[i].header, hlen);
        ir_free(buf);
        tensor_free(t);
    }
}

/* Parses buf, expecting failure with a message holding each key word. */
#define EXPECT_NPY_ERROR(buf, len, ...)                                                                      \
    do {                                                                                                     \
        Capture c_;                                                                                          \
        capture_open(&c_);                                                                                   \
        Tensor *t_ = (Tensor *)&c_;                                                                          \
        assert_int_equal(npy_parse(buf, len, "in.npy", &t_, &c_.d), -1);                                     \
        assert_null(t_);                                                                                     \
        assert_message(&c_, "in.npy: ", __VA_ARGS__, (const char *)NULL);                                    \
        capture_close(&c_);                                                                                  \
    } while (0)

#define EXPECT_HEADER_ERROR(header, data_bytes, ...)                                                         \
    do {                                                                                                     \
        size_t len_ = make_npy(1, header, data_bytes);                                                       \
        EXPECT_NPY_ERROR(npy_buf, len_, __VA_ARGS__);                                                        \
    } while (0)

static void test_npy_bad_file(void **state) {
    (void)state;
    EXPECT_NPY_ERROR((const unsigned char *)"", 0, "bad magic");
    EXPECT_NPY_ERROR((const unsigned char *)"\x93NUMPZ\x01\x00", 8, "bad magic");
    EXPECT_NPY_ERROR((const unsigned char *)"PK\x03\x04", 4, "bad magic");
    EXPECT_NPY_ERROR(NUMPY_V1, 7, "truncated header");
    EXPECT_NPY_ERROR(NUMPY_V1, 9, "truncated header");
    EXPECT_NPY_ERROR(NUMPY_V2, 11, "truncated header");
    EXPECT_NPY_ERROR(NUMPY_V1, 60, "truncated header", "118 bytes");
    unsigned char buf[sizeof NUMPY_V1 + 4];
    memcpy(buf, NUMPY_V1, sizeof NUMPY_V1);
    EXPECT_NPY_ERROR(buf, sizeof NUMPY_V1 - 4, "truncated data", "expected 24 bytes, got 20");
    EXPECT_NPY_ERROR(buf, sizeof buf, "trailing data", "expected 24 bytes, got 28");
    buf[6] = 4;
    EXPECT_NPY_ERROR(buf, sizeof NUMPY_V1, "version 4.0");
    buf[6] = 1, buf[7] = 1;
    EXPECT_NPY_ERROR(buf, sizeof NUMPY_V1, "version 1.1");
    /* a 4-byte header length far past the end */
    memcpy(buf, NUMPY_V2, 12);
    buf[11] = 0xff;
    EXPECT_NPY_ERROR(buf, sizeof NUMPY_V2, "truncated header", "4278190196 bytes");
}

static void test_npy_bad_header(void **state) {
    (void)state;
    EXPECT_HEADER_ERROR("", 4, "malformed", "'{'");
    EXPECT_HEADER_ERROR("[]", 4, "malformed", "'{'");
    EXPECT_HEADER_ERROR("{'descr' '<f4'}", 4, "malformed", "':'");
    EXPECT_HEADER_ERROR("{'descr: '<f4'}", 4, "malformed");
    EXPECT_HEADER_ERROR("{'descr': '<f4}", 4, "malformed", "string");
    EXPECT_HEADER_ERROR("{'descr': '<f\\x34'}", 4, "malformed", "string");
    EXPECT_HEADER_ERROR("{descr: '<f4'}", 4, "malformed", "quoted string");
    EXPECT_HEADER_ERROR("{'descr': '<f4' 'shape': ()}", 4, "malformed", "','");
    EXPECT_HEADER_ERROR("{'descr': '<f4', 'fortran_order': False, 'shape': ()} x", 4, "malformed", "after");
    EXPECT_HEADER_ERROR("{'descr': '<f4', 'fortran_order': False, 'shape': ()", 4, "malformed");
    EXPECT_HEADER_ERROR("{'descr': '<f4', 'fortran_order': 0, 'shape': ()}", 4, "fortran_order",
                        "True or False");
    EXPECT_HEADER_ERROR("{'descr': '<f4', 'fortran_order': False, 'shape': [2]}", 8, "shape is not a tuple");
    EXPECT_HEADER_ERROR("{'descr': '<f4', 'fortran_order': False, 'shape': (2 3)}", 24, "malformed", "')'");
    EXPECT_HEADER_ERROR("{'descr': '<f4', 'fortran_order': False, 'shape': (2.5,)}", 8, "malformed");
    EXPECT_HEADER_ERROR("{'descr': '<f4', 'fortran_order': False, 'shape': (x,)}", 8, "integer");
    EXPECT_HEADER_ERROR("{'descr': '<f4', 'fortran_order': False}", 4, "lacks 'shape'");
    EXPECT_HEADER_ERROR("{'fortran_order': False, 'shape': ()}", 4, "lacks 'descr'");
    EXPECT_HEADER_ERROR("{'descr': '<f4', 'shape': ()}", 4, "lacks 'fortran_order'");
    EXPECT_HEADER_ERROR("{}", 4, "lacks");
    EXPECT_HEADER_ERROR("{'descr': '<f4', 'fortran_order': False, 'shape': (), 'x': 1}", 4,
                        "unexpected key 'x'");
    EXPECT_HEADER_ERROR("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': ()}", 4,
                        "'descr' appears twice");
}

static void test_npy_bad_meaning(void **state) {
    (void)state;
    EXPECT_HEADER_ERROR("{'descr': '<f8', 'fortran_order': False, 'shape': (2,)}", 16,
                        "dtype '<f8' is not supported", "'<f4'");
    EXPECT_HEADER_ERROR("{'descr': '>f4', 'fortran_order': False, 'shape': (2,)}", 8, "dtype '>f4'");
    EXPECT_HEADER_ERROR("{'descr': '|u1', 'fortran_order': False, 'shape': (2,)}", 2, "dtype '|u1'");
    EXPECT_HEADER_ERROR("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}", 8, "malformed");
    EXPECT_HEADER_ERROR("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3)}", 24, "fortran_order",
                        "not supported");
    EXPECT_HEADER_ERROR("{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3)}", 24, "dimension 1", "-3",
                        "negative");
    EXPECT_HEADER_ERROR("{'descr': '<f4', 'fortran_order': False, 'shape': (0,)}", 0, "dimension 0", "is 0",
                        "zero-size");
    EXPECT_HEADER_ERROR("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 1, 1, 1)}", 4,
                        "more than 8 dimensions");
    EXPECT_HEADER_ERROR("{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 4)}", 16,
                        "too many elements");
    EXPECT_HEADER_ERROR("{'descr': '<f4', 'fortran_order': False, 'shape': (3037000500, 3037000500)}", 16,
                        "too many elements");
    EXPECT_HEADER_ERROR("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}", 16,
                        "too large");
    EXPECT_HEADER_ERROR("{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000,)}", 16,
                        "truncated data", "expected 4000000000000 bytes, got 16");
}

/* Every allocation failure is reported, and leaks nothing (ASan checks that). */
static void test_npy_alloc_failure(void **state) {
    (void)state;
    int failures = 0;
    for (long n = 0;; n++) {
        Capture c;
        capture_open(&c);
        Tensor *t = (Tensor *)&c;
        ir_fail_alloc_after(n);
        int rc = npy_parse(NUMPY_V1, sizeof NUMPY_V1, "a.npy", &t, &c.d);
        ir_fail_alloc_after(-1);
        if (rc == 0) {
            tensor_free(t);
            capture_close(&c);
            break;
        }
        assert_null(t);
        assert_message(&c, "a.npy: out of memory", (const char *)NULL);
        capture_close(&c);
        failures++;
        assert_true(n < 100);
    }
    assert_true(failures > 0);
}

static void test_read_errors(void **state) {
    (void)state;
    Capture c;
    capture_open(&c);
    Tensor *t;
    assert_int_equal(npy_read(tmp_path("missing.npy"), &t, &c.d), -1);
    assert_null(t);
    assert_message(&c, "cannot open", "missing.npy", "No such file", (const char *)NULL);
    capture_close(&c);

    capture_open(&c);
    assert_int_equal(npy_read(tmpdir, &t, &c.d), -1);
    assert_message(&c, "cannot read", tmpdir, "it is a directory, not a regular file", (const char *)NULL);
    capture_close(&c);

    /* an empty file reads as zero bytes, which are not a .npy file */
    capture_open(&c);
    const char *path = tmp_path("empty.npy");
    assert_int_equal(write_file_atomic(path, "", 0, &c.d), 0);
    unsigned char *buf;
    size_t len;
    assert_int_equal(read_file_bytes(path, &buf, &len, &c.d), 0);
    assert_int_equal(len, 0);
    ir_free(buf);
    assert_int_equal(npy_read(path, &t, &c.d), -1);
    assert_message(&c, "empty.npy: not a .npy file", (const char *)NULL);
    capture_close(&c);
    unlink(path);
}

/* open_beneath opens rel under dir and nothing else; want_why NULL: it must open. */
static void expect_beneath(const char *dir, const char *rel, const char *want_why) {
    const char *why = NULL;
    int fd = open_beneath(dir, rel, &why);
    if (fd >= 0)
        close(fd);
    if (!want_why && fd < 0)
        fail_msg("open_beneath('%s', '%s') failed: %s", dir, rel, why ? why : strerror(errno));
    if (want_why && (fd >= 0 || !why || strcmp(why, want_why) != 0))
        fail_msg("open_beneath('%s', '%s'): expected '%s', got fd %d, '%s'", dir, rel, want_why, fd,
                 why ? why : "(no reason)");
}

/* ONNX external data is opened this way: it used to follow a symbolic link anywhere. */
static void test_hostile_open_beneath(void **state) {
    (void)state;
    Diag d;
    diag_init(&d, stderr);
    char base[256]; /* tmp_path's buffers are reused */
    snprintf(base, sizeof base, "%s", tmp_path("beneath"));
    assert_int_equal(mkdir(base, 0755), 0);
    assert_int_equal(mkdir(tmp_path("beneath/sub"), 0755), 0);
    assert_int_equal(write_file_atomic(tmp_path("beneath/sub/w.bin"), "data", 4, &d), 0);
    assert_int_equal(write_file_atomic(tmp_path("outside.bin"), "data", 4, &d), 0);
    assert_int_equal(symlink(tmp_path("outside.bin"), tmp_path("beneath/link.bin")), 0);
    assert_int_equal(symlink("sub", tmp_path("beneath/linkdir")), 0);
    assert_int_equal(mkfifo(tmp_path("beneath/fifo"), 0600), 0);

    expect_beneath(base, "sub/w.bin", NULL);
    expect_beneath(base, "./sub//w.bin", NULL);
    expect_beneath(base, "link.bin", "a component of it is a symbolic link");
    expect_beneath(base, "linkdir/w.bin", "a component of it is a symbolic link");
    expect_beneath(base, "../outside.bin", "it has a '..' component");
    expect_beneath(base, "sub/../sub/w.bin", "it has a '..' component");
    expect_beneath(base, "sub/..", "it has a '..' component");
    expect_beneath(base, tmp_path("outside.bin"), "it is an absolute path");
    expect_beneath(base, "", "it is empty");
    expect_beneath(base, "sub/", "it names a directory");
    expect_beneath(base, "sub", "it is not a regular file");
    expect_beneath(base, "fifo", "it is not a regular file");
    const char *why = "unset";
    assert_int_equal(open_beneath(base, "missing.bin", &why), -1);
    assert_int_equal(errno, ENOENT);
    assert_null(why);
    /* a name like "a..b" is not a ".." component */
    assert_int_equal(write_file_atomic(tmp_path("beneath/a..b"), "x", 1, &d), 0);
    expect_beneath(base, "a..b", NULL);
}

/* A failed write reports the target and leaves nothing behind, not even the temporary. */
static void test_failed_write_leaves_nothing(void **state) {
    (void)state;
    Tensor *t = make_tensor(1, (const int64_t[]){3}, 1);
    TensorList l = {0};
    assert_int_equal(tensors_add(&l, "w", tensor_clone(t)), 0);

    const char *missing = tmp_path("no/such/dir/out.npy");
    Capture c;
    capture_open(&c);
    assert_int_equal(npy_write(missing, t, &c.d), -1);
    assert_message(&c, "cannot write", missing, "No such file", (const char *)NULL);
    capture_close(&c);

    /* the rename fails on a target that is a directory, after the temporary was written */
    const char *sub = tmp_path("sub");
    assert_int_equal(mkdir(sub, 0755), 0);
    int before = count_entries(tmpdir);
    capture_open(&c);
    assert_int_equal(npy_write(sub, t, &c.d), -1);
    assert_message(&c, "cannot write", sub, (const char *)NULL);
    capture_close(&c);
    capture_open(&c);
    assert_int_equal(safetensors_write(sub, &l, &c.d), -1);
    assert_message(&c, "cannot write", sub, (const char *)NULL);
    capture_close(&c);
    assert_int_equal(count_entries(tmpdir), before);
    assert_int_equal(count_entries(sub), 0);
    rmdir(sub);

    /* success replaces an existing file and leaves no temporary either */
    const char *path = tmp_path("over.npy");
    Diag d;
    diag_init(&d, stderr);
    assert_int_equal(write_file_atomic(path, "old contents", 12, &d), 0);
    before = count_entries(tmpdir);
    assert_int_equal(npy_write(path, t, &d), 0);
    assert_int_equal(count_entries(tmpdir), before);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_size, 128 + 12);
    unlink(path);
    tensor_free(t);
    tensors_free(&l);
}

/* ---- safetensors ---- */

static unsigned char st_buf[4096];

/* A safetensors file: the header JSON (its length as the 8-byte prefix) and data bytes. */
static size_t make_st(const char *json, size_t data_bytes) {
    size_t n = strlen(json);
    for (int i = 0; i < 8; i++)
        st_buf[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(st_buf + 8, json, n);
    for (size_t i = 0; i < data_bytes; i++)
        st_buf[8 + n + i] = (unsigned char)(i * 7);
    return 8 + n + data_bytes;
}

static void test_st_roundtrip(void **state) {
    (void)state;
    TensorList l = {0}, back = {0};
    assert_int_equal(tensors_add(&l, "conv.w", make_tensor(4, (const int64_t[]){2, 1, 3, 3}, -1)), 0);
    assert_int_equal(tensors_add(&l, "scale", make_tensor(0, NULL, 7)), 0);
    assert_int_equal(tensors_add(&l, "odd \"name\"\\", make_tensor(1, (const int64_t[]){5}, 2)), 0);
    Diag d;
    diag_init(&d, stderr);
    const char *path = tmp_path("rt.safetensors");
    assert_int_equal(safetensors_write(path, &l, &d), 0);
    assert_int_equal(safetensors_read(path, &back, &d), 0);
    assert_int_equal(back.n, 3);
    for (int i = 0; i < 3; i++) {
        assert_string_equal(back.items[i].name, l.items[i].name);
        assert_tensor_equal(back.items[i].tensor, l.items[i].tensor);
    }

    /* the reference layout: compact JSON in list order, packed offsets, spaces to a multiple of 8 */
    static const char json[] =
        "{\"conv.w\":{\"dtype\":\"F32\",\"shape\":[2,1,3,3],\"data_offsets\":[0,72]},"
        "\"scale\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[72,76]},"
        "\"odd \\\"name\\\"\\\\\":{\"dtype\":\"F32\",\"shape\":[5],\"data_offsets\":[76,96]}}";
    unsigned char *buf;
    size_t len, n = sizeof json - 1, padded = (n + 7) / 8 * 8;
    assert_int_equal(read_file_bytes(path, &buf, &len, &d), 0);
    assert_int_equal(len, 8 + padded + 96);
    assert_int_equal(buf[0] | buf[1] << 8, padded);
    assert_memory_equal(buf + 8, json, n);
    for (size_t i = n; i < padded; i++)
        assert_int_equal(buf[8 + i], ' ');
    ir_free(buf);

    /* an empty list is a valid file */
    TensorList empty = {0};
    assert_int_equal(safetensors_write(path, &empty, &d), 0);
    assert_int_equal(safetensors_read(path, &empty, &d), 0);
    assert_int_equal(empty.n, 0);
    tensors_free(&l);
    tensors_free(&back);
    assert_int_equal(d.errors, 0);
}

/* Metadata, entries out of data order, data unaligned in the buffer, appending to a list. */
static void test_st_parse(void **state) {
    (void)state;
    size_t len = make_st("{\"b\": {\"data_offsets\": [10, 14], \"shape\": [], \"dtype\": \"F32\"},\n"
                         " \"__metadata__\": {\"format\": \"pt\"},\n"
                         " \"a\": {\"dtype\": \"F32\", \"shape\": [1, 2], \"data_offsets\": [1, 9]}}   ",
                         15);
    TensorList l = {0};
    Diag d;
    diag_init(&d, stderr);
    assert_int_equal(tensors_add(&l, "x", make_tensor(0, NULL, 0)), 0);
    assert_int_equal(safetensors_parse(st_buf, len, "p.safetensors", &l, &d), 0);
    assert_int_equal(l.n, 3);
    assert_string_equal(l.items[1].name, "b");
    assert_string_equal(l.items[2].name, "a");
    const unsigned char *data = st_buf + len - 15;
    assert_int_equal(l.items[1].tensor->type.rank, 0);
    assert_memory_equal(l.items[1].tensor->data, data + 10, 4);
    assert_int_equal(l.items[2].tensor->type.dims[1], 2);
    assert_memory_equal(l.items[2].tensor->data, data + 1, 8);
    tensors_free(&l);
}

#define EXPECT_ST_ERROR(buf, len, ...)                                                                       \
    do {                                                                                                     \
        Capture c_;                                                                                          \
        capture_open(&c_);                                                                                   \
        TensorList l_ = {0};                                                                                 \
        assert_int_equal(tensors_add(&l_, "existing", make_tensor(0, NULL, 0)), 0);                          \
        assert_int_equal(safetensors_parse(buf, len, "in.safetensors", &l_, &c_.d), -1);                     \
        assert_int_equal(l_.n, 1);                                                                           \
        assert_message(&c_, __VA_ARGS__, (const char *)NULL);                                                \
        tensors_free(&l_);                                                                                   \
        capture_close(&c_);                                                                                  \
    } while (0)

#define EXPECT_JSON_ERROR(json, data_bytes, ...)                                                             \
    do {                                                                                                     \
        size_t len_ = make_st(json, data_bytes);                                                             \
        EXPECT_ST_ERROR(st_buf, len_, __VA_ARGS__);                                                          \
    } while (0)

static void test_st_bad_file(void **state) {
    (void)state;
    EXPECT_ST_ERROR((const unsigned char *)"", 0, "in.safetensors: ", "too short");
    EXPECT_ST_ERROR((const unsigned char *)"\x02\0\0\0\0\0\0", 7, "in.safetensors: ", "too short");
    EXPECT_ST_ERROR((const unsigned char *)"\x03\0\0\0\0\0\0\0{}", 10, "in.safetensors: ", "header length 3",
                    "past the end");
    EXPECT_ST_ERROR((const unsigned char *)"\0\0\0\0\0\0\0\x80{}", 10, "in.safetensors: ", "over the limit");
    EXPECT_ST_ERROR((const unsigned char *)"\x01\xe1\xf5\x05\0\0\0\0{}", 10, "header length 100000001",
                    "over the limit");
    EXPECT_ST_ERROR((const unsigned char *)"\xff\xff\xff\xff\xff\xff\xff\xff{}", 10, "over the limit");
    EXPECT_ST_ERROR((const unsigned char *)"\0\0\0\0\0\0\0\0", 8, "in.safetensors: ", "not valid JSON");
    EXPECT_JSON_ERROR("{\"a\": {\"dtype\": \"F32\",", 0, "in.safetensors: ", "not valid JSON");
    EXPECT_JSON_ERROR("{\"a\" 1}", 0, "not valid JSON");
    EXPECT_JSON_ERROR("{} {}", 0, "text after");
    EXPECT_ST_ERROR((const unsigned char *)"\x03\0\0\0\0\0\0\0{}\0", 11, "text after");
    EXPECT_JSON_ERROR("[1, 2]", 0, "in.safetensors: ", "not a JSON object");
    EXPECT_JSON_ERROR("\"F32\"", 0, "not a JSON object");
    EXPECT_JSON_ERROR("7", 0, "not a JSON object");
}

static void test_st_bad_entry(void **state) {
    (void)state;
    EXPECT_JSON_ERROR("{\"w\": [1]}", 0, "in.safetensors: ", "'w'", "not a JSON object");
    EXPECT_JSON_ERROR("{\"w\": {\"dtype\": \"F64\", \"shape\": [1], \"data_offsets\": [0, 8]}}", 8, "'w'",
                      "dtype 'F64'", "F32");
    EXPECT_JSON_ERROR("{\"w\": {\"dtype\": \"BF16\", \"shape\": [1], \"data_offsets\": [0, 2]}}", 2,
                      "dtype 'BF16'");
    EXPECT_JSON_ERROR("{\"w\": {\"dtype\": 32, \"shape\": [1], \"data_offsets\": [0, 4]}}", 4, "'w'",
                      "dtype");
    EXPECT_JSON_ERROR("{\"w\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", 4, "'w'", "dtype");
    EXPECT_JSON_ERROR("{\"w\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", 4, "'w'", "shape");
    EXPECT_JSON_ERROR("{\"w\": {\"dtype\": \"F32\", \"shape\": 1, \"data_offsets\": [0, 4]}}", 4, "'w'",
                      "shape");
    EXPECT_JSON_ERROR("{\"w\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [0, 0]}}", 0, "'w'",
                      "shape entry 0", ">= 1");
    EXPECT_JSON_ERROR("{\"w\": {\"dtype\": \"F32\", \"shape\": [2, -1], \"data_offsets\": [0, 4]}}", 4,
                      "shape entry 1");
    EXPECT_JSON_ERROR("{\"w\": {\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": [0, 4]}}", 4,
                      "shape entry 0");
    EXPECT_JSON_ERROR("{\"w\": {\"dtype\": \"F32\", \"shape\": [\"2\"], \"data_offsets\": [0, 8]}}", 8,
                      "shape entry 0");
    EXPECT_JSON_ERROR("{\"w\": {\"dtype\": \"F32\", \"shape\": [1e300], \"data_offsets\": [0, 8]}}", 8,
                      "shape entry 0");
    EXPECT_JSON_ERROR(
        "{\"w\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": [0, 4]}}", 4, "'w'",
        "rank 9");
    EXPECT_JSON_ERROR(
        "{\"w\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296], \"data_offsets\": [0, 4]}}", 4,
        "'w'", "too many elements");
    EXPECT_JSON_ERROR("{\"w\": {\"dtype\": \"F32\", \"shape\": [1]}}", 4, "'w'", "data_offsets");
    EXPECT_JSON_ERROR("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0]}}", 4,
                      "data_offsets");
    EXPECT_JSON_ERROR("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4, 8]}}", 8,
                      "data_offsets");
    EXPECT_JSON_ERROR("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [-4, 0]}}", 4,
                      "data_offsets");
    EXPECT_JSON_ERROR("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, \"4\"]}}", 4,
                      "data_offsets");
    EXPECT_JSON_ERROR("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": {\"0\": 4}}}", 4,
                      "data_offsets");
}

static void test_st_bad_offsets(void **state) {
    (void)state;
    EXPECT_JSON_ERROR("{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 4, "'w'",
                      "[0, 8]", "outside the 4-byte data buffer");
    EXPECT_JSON_ERROR("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 12]}}", 4,
                      "outside");
    EXPECT_JSON_ERROR("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 4]}}", 16,
                      "end before they begin");
    EXPECT_JSON_ERROR(
        "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 18446744073709551616]}}", 4,
        "data_offsets");
    EXPECT_JSON_ERROR(
        "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 9007199254740992]}}", 4,
        "outside");
    EXPECT_JSON_ERROR("{\"w\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 20]}}", 24,
                      "'w'", "span 20 bytes", "needs 24");
    EXPECT_JSON_ERROR("{\"w\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [0, 0]}}", 4,
                      "span 0 bytes", "needs 4");
    /* the second entry is bad: the first must not stay in the list */
    EXPECT_JSON_ERROR("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
                      " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 4]}}",
                      4, "'b'", "span 4 bytes", "needs 8");
}

static void test_st_duplicates(void **state) {
    (void)state;
    EXPECT_JSON_ERROR("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
                      " \"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
                      8, "duplicate weight 'w' in in.safetensors");
    EXPECT_JSON_ERROR("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
                      " \"existing\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}",
                      4, "duplicate weight 'existing' in in.safetensors");

    /* reading the same file twice into one list */
    TensorList l = {0};
    assert_int_equal(tensors_add(&l, "w", make_tensor(1, (const int64_t[]){2}, 0)), 0);
    Diag d;
    diag_init(&d, stderr);
    const char *path = tmp_path("b.safetensors");
    assert_int_equal(safetensors_write(path, &l, &d), 0);
    Capture c;
    capture_open(&c);
    assert_int_equal(safetensors_read(path, &l, &c.d), -1);
    assert_int_equal(l.n, 1);
    assert_message(&c, "duplicate weight 'w' in ", path, (const char *)NULL);
    capture_close(&c);
    tensors_free(&l);
}

static void test_st_alloc_failure(void **state) {
    (void)state;
    size_t len = make_st("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                         " \"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 12]},"
                         " \"c\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [8, 12]}}",
                         12);
    int failures = 0;
    for (long n = 0;; n++) {
        Capture c;
        capture_open(&c);
        TensorList l = {0};
        ir_fail_alloc_after(n);
        int rc = safetensors_parse(st_buf, len, "a.safetensors", &l, &c.d);
        ir_fail_alloc_after(-1);
        if (rc == 0) {
            assert_int_equal(l.n, 3);
            tensors_free(&l);
            capture_close(&c);
            break;
        }
        assert_int_equal(l.n, 0);
        assert_message(&c, "a.safetensors: out of memory", (const char *)NULL);
        tensors_free(&l);
        capture_close(&c);
        failures++;
        assert_true(n < 100);
    }
    assert_true(failures > 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_npy_numpy_files),
        cmocka_unit_test(test_npy_header_variants),
        cmocka_unit_test(test_npy_roundtrip),
        cmocka_unit_test(test_npy_write_matches_numpy),
        cmocka_unit_test(test_npy_bad_file),
        cmocka_unit_test(test_npy_bad_header),
        cmocka_unit_test(test_npy_bad_meaning),
        cmocka_unit_test(test_npy_alloc_failure),
        cmocka_unit_test(test_read_errors),
        cmocka_unit_test(test_hostile_open_beneath),
        cmocka_unit_test(test_failed_write_leaves_nothing),
        cmocka_unit_test(test_st_roundtrip),
        cmocka_unit_test(test_st_parse),
        cmocka_unit_test(test_st_bad_file),
        cmocka_unit_test(test_st_bad_entry),
        cmocka_unit_test(test_st_bad_offsets),
        cmocka_unit_test(test_st_duplicates),
        cmocka_unit_test(test_st_alloc_failure),
    };
    return cmocka_run_group_tests(tests, make_tmpdir, remove_tmpdir);
}
