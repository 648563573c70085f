/* The kernel IR on its own: what the constructors simplify, what the verifier
 * rejects, how the printer parenthesizes, and two kernels of the kinds the IR is
 * built for, compiled with the system's C compiler and run against plain loops:
 *   - a register-blocked micro-kernel: a 4 x 4 block of C += A B held in a local
 *     array across the whole depth loop, its inner loops unrolled;
 *   - a kernel parameterized by shape: y = a x + y over a length n passed at run
 *     time, one function for every n;
 *   - vectors: y = 2.5 x + 1 four floats at a time, through vector loads and stores
 *     at any alignment, a splat and a scalar times a vector, its loop unrolled by a
 *     count of its own. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../codegen/codegen.h"

typedef struct {
    Arena arena;
    KBody body;
    KBuilder b;
} Fixture;

static Fixture *fixture(void) {
    Fixture *f = calloc(1, sizeof *f);
    kb_init(&f->b, &f->arena, &f->body);
    return f;
}

static void release(Fixture *f) {
    arena_free(&f->arena);
    free(f);
}

static char *printed(Fixture *f, const char *name) {
    Str s = {0};
    kir_print_function(&f->body, &lang_c, name, &s);
    return s.s;
}

static void test_integer_simplification(void **state) {
    (void)state;
    Fixture *f = fixture();
    KBuilder *b = &f->b;
    KExpr *x = k_var(b, kb_param_var(b, "x", KT_I64));
    assert_ptr_equal(k_mul(b, x, k_int(b, 1)), x);
    assert_ptr_equal(k_add(b, k_int(b, 0), x), x);
    assert_ptr_equal(k_div(b, x, k_int(b, 1)), x);
    KExpr *zero = k_mod(b, x, k_int(b, 1));
    assert_int_equal(zero->kind, KE_INT);
    assert_int_equal(zero->i, 0);
    KExpr *folded = k_add(b, k_mul(b, k_int(b, 6), k_int(b, 7)), k_int(b, 0));
    assert_int_equal(folded->kind, KE_INT);
    assert_int_equal(folded->i, 42);
    /* float arithmetic is kept as written: x * 1.0f is not x for a signalling NaN's sake */
    KExpr *fx = k_var(b, kb_param_var(b, "fx", KT_F32));
    assert_int_equal(k_mul(b, fx, k_f32(b, 1))->kind, KE_MUL);
    release(f);
}

static void test_dead_lets_dropped(void **state) {
    (void)state;
    Fixture *f = fixture();
    KBuilder *b = &f->b;
    int y = kb_param_buf(b, "y", true);
    KExpr *n = k_var(b, kb_param_var(b, "n", KT_I64));
    int i = kb_for(b, "i", KT_I64, k_int(b, 0), n, NULL, 0);
    int unused = kb_let(b, "unused", KT_I64, k_mod(b, k_var(b, i), k_int(b, 3)));
    kb_let(b, "also_unused", KT_I64, k_add(b, k_var(b, unused), k_int(b, 1)));
    kb_store(b, y, k_var(b, i), k_f32(b, 0));
    kb_end(b);
    kir_simplify(&f->body);
    char err[128];
    assert_int_equal(kir_verify(&f->body, KIR_C, err, sizeof err), 0);
    char *text = printed(f, "zero");
    assert_string_equal(text, "void zero(float *restrict y, int64_t n) {\n"
                              "    for (int64_t i = 0; i < n; i++) {\n"
                              "        y[i] = 0.0f;\n"
                              "    }\n"
                              "}\n");
    free(text);
    release(f);
}

/* The verifier's message for a body, or "" when it accepts it. */
static const char *verdict(Fixture *f, KirTarget t) {
    static char err[160];
    err[0] = 0;
    kir_verify(&f->body, t, err, sizeof err);
    return err;
}

static void test_verifier_rejects(void **state) {
    (void)state;
    Fixture *f = fixture();
    KBuilder *b = &f->b;
    int x = kb_param_buf(b, "x", false);
    int i = kb_for(b, "i", KT_I64, k_int(b, 0), k_int(b, 4), NULL, 0);
    kb_end(b);
    kb_store(b, x, k_var(b, i), k_f32(b, 1)); /* i out of scope, and x read-only */
    assert_non_null(strstr(verdict(f, KIR_C), "variable i read outside its scope"));
    release(f);

    f = fixture();
    b = &f->b;
    x = kb_param_buf(b, "x", false);
    kb_store(b, x, k_int(b, 0), k_f32(b, 1));
    assert_non_null(strstr(verdict(f, KIR_C), "only reads"));
    release(f);

    f = fixture();
    b = &f->b;
    kb_barrier(b);
    assert_non_null(strstr(verdict(f, KIR_C), "barrier outside CUDA"));
    assert_string_equal(verdict(f, KIR_CUDA), "");
    release(f);

    f = fixture();
    b = &f->b;
    int a = kb_let(b, "a", KT_I64, k_int(b, 1));
    kb_for(b, "a", KT_I64, k_int(b, 0), k_var(b, a), NULL, 0);
    kb_end(b);
    assert_non_null(strstr(verdict(f, KIR_C), "shadows"));
    release(f);

    f = fixture();
    b = &f->b;
    kb_let(b, "mixed", KT_F32, k_add(b, k_f32(b, 1), k_int(b, 1)));
    assert_non_null(strstr(verdict(f, KIR_C), "two types"));
    release(f);

    f = fixture();
    b = &f->b;
    kb_let(b, "not an identifier", KT_I64, k_int(b, 1));
    assert_non_null(strstr(verdict(f, KIR_C), "not an identifier"));
    release(f);

    f = fixture();
    b = &f->b;
    x = kb_param_buf(b, "x", true);
    kb_vstore(b, x, k_int(b, 0), k_f32(b, 1));
    assert_non_null(strstr(verdict(f, KIR_C), "a vector store of a scalar"));
    release(f);

    f = fixture();
    b = &f->b;
    kb_end(b); /* no block open */
    assert_true(kb_failed(b));
    release(f);
}

static void test_printer_parenthesizes(void **state) {
    (void)state;
    Fixture *f = fixture();
    KBuilder *b = &f->b;
    int y = kb_param_buf(b, "y", true);
    KExpr *p = k_var(b, kb_param_var(b, "p", KT_I64)), *q = k_var(b, kb_param_var(b, "q", KT_I64));
    KExpr *fa = k_load(b, y, k_int(b, 1)), *fb = k_load(b, y, k_int(b, 2)), *fc = k_load(b, y, k_int(b, 3));
    kb_store(b, y, k_sub(b, p, k_sub(b, q, k_int(b, 1))), k_sub(b, k_sub(b, fa, fb), fc));
    kb_store(b, y, k_mul(b, k_add(b, p, q), q), k_sub(b, fa, k_sub(b, fb, fc)));
    kb_store(b, y, k_int(b, 0), k_neg(b, k_neg(b, fa)));
    kb_store(b, y, k_int(b, 0),
             k_select(b, k_lt(b, fa, fb), k_select(b, k_lt(b, fb, fc), fb, fc), k_cast(b, KT_F32, p)));
    char *text = printed(f, "f");
    assert_string_equal(text, "void f(float *restrict y, int64_t p, int64_t q) {\n"
                              "    y[p - (q - 1)] = y[1] - y[2] - y[3];\n"
                              "    y[(p + q) * q] = y[1] - (y[2] - y[3]);\n"
                              "    y[0] = -(-y[1]);\n"
                              "    y[0] = y[1] < y[2] ? (y[2] < y[3] ? y[2] : y[3]) : (float)p;\n"
                              "}\n");
    free(text);
    release(f);
}

/* Double literals print as C doubles: a whole number with `.0`, an exponent as it
 * is, and NaN and infinities as divisions (C has no literal for them). */
static void test_double_literals(void **state) {
    (void)state;
    Fixture *f = fixture();
    KBuilder *b = &f->b;
    kb_let(b, "whole", KT_F64, k_f64(b, 2));
    kb_let(b, "big", KT_F64, k_f64(b, 1e17));
    kb_let(b, "tiny", KT_F64, k_f64(b, 0.1));
    kb_let(b, "nan_value", KT_F64, k_f64(b, NAN));
    kb_let(b, "minus_inf", KT_F64, k_f64(b, -INFINITY));
    char *text = printed(f, "literals");
    assert_string_equal(text, "void literals(void) {\n"
                              "    double whole = 2.0;\n"
                              "    double big = 1e+17;\n"
                              "    double tiny = 0.10000000000000001;\n"
                              "    double nan_value = (0.0 / 0.0);\n"
                              "    double minus_inf = (-1.0 / 0.0);\n"
                              "}\n");
    free(text);
    release(f);
}

/* The 4 x 4 micro-kernel: c[u][w] = sum over kk < depth of a[u * depth + kk] b[kk * 4 + w]. */
static void build_micro_kernel(KBuilder *b) {
    int a = kb_param_buf(b, "a", false), bm = kb_param_buf(b, "b", false), c = kb_param_buf(b, "c", true);
    KExpr *depth = k_var(b, kb_param_var(b, "depth", KT_I64));
    int acc = kb_array(b, "acc", KT_F32, 4, 4, false, true);
    KExpr *kk = k_var(b, kb_for(b, "kk", KT_I64, k_int(b, 0), depth, NULL, 0));
    KExpr *u = k_var(b, kb_for(b, "u", KT_I64, k_int(b, 0), k_int(b, 4), NULL, K_UNROLL));
    KExpr *w = k_var(b, kb_for(b, "w", KT_I64, k_int(b, 0), k_int(b, 4), NULL, K_UNROLL));
    KExpr *product =
        k_mul(b, k_load(b, a, k_add(b, k_mul(b, u, depth), kk)), k_load(b, bm, k_madd(b, kk, 4, w)));
    kb_store2(b, acc, u, w, product, true);
    kb_end(b);
    kb_end(b);
    kb_end(b);
    u = k_var(b, kb_for(b, "u", KT_I64, k_int(b, 0), k_int(b, 4), NULL, 0));
    w = k_var(b, kb_for(b, "w", KT_I64, k_int(b, 0), k_int(b, 4), NULL, 0));
    kb_store(b, c, k_madd(b, u, 4, w), k_load2(b, acc, u, w));
    kb_end(b);
    kb_end(b);
}

/* y = alpha x + y over n elements, n a parameter. */
static void build_axpy(KBuilder *b) {
    int x = kb_param_buf(b, "x", false), y = kb_param_buf(b, "y", true);
    KExpr *n = k_var(b, kb_param_var(b, "n", KT_I64));
    KExpr *alpha = k_var(b, kb_param_var(b, "alpha_bits", KT_I64));
    KExpr *i = k_var(b, kb_for(b, "i", KT_I64, k_int(b, 0), n, NULL, K_VECTOR));
    kb_store(b, y, i, k_add(b, k_mul(b, k_cast(b, KT_F32, alpha), k_load(b, x, i)), k_load(b, y, i)));
    kb_end(b);
}

/* y[i..i+4) = 2.5 x[i..i+4) + 1 for i < n in steps of 4, with 4-float vectors. */
static void build_vector_scale(KBuilder *b) {
    int x = kb_param_buf(b, "x", false), y = kb_param_buf(b, "y", true);
    KExpr *n = k_var(b, kb_param_var(b, "n", KT_I64));
    int one = kb_decl(b, "one", KT_VF32, k_vsplat(b, 1));
    KExpr *i = k_var(b, kb_for(b, "i", KT_I64, k_int(b, 0), n, k_int(b, 4), 0));
    kb_unroll(b, 2);
    KExpr *v = k_var(b, kb_let(b, "v", KT_VF32, k_vload(b, x, i)));
    kb_vstore(b, y, i, k_add(b, k_mul(b, k_f32(b, 2.5), v), k_var(b, one)));
    kb_end(b);
}

/* Compiles C source into a shared object in a temporary directory and opens it. */
static void *compile_and_open(const char *source, char *dir) {
    char path[300], so[300], cmd[1200];
    snprintf(path, sizeof path, "%s/k.c", dir);
    snprintf(so, sizeof so, "%s/k.so", dir);
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs("#include <stdint.h>\n", fp);
    fputs("typedef float kiln_vf __attribute__((vector_size(16), aligned(4)));\n", fp);
    /* the loop hint, as emit_c_model defines it */
    fputs(
        "#ifdef __clang__\n#define KILN_INDEPENDENT _Pragma(\"clang loop vectorize(assume_safety)\")\n#else\n"
        "#define KILN_INDEPENDENT _Pragma(\"GCC ivdep\")\n#endif\n",
        fp);
    fputs(source, fp);
    fclose(fp);
    const char *cc = getenv("CC") ? getenv("CC") : "cc";
    snprintf(cmd, sizeof cmd, "%s -std=gnu11 -O2 -Wall -Wextra -Werror -fPIC -shared -o %s %s", cc, so, path);
    assert_int_equal(system(cmd), 0);
    void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    assert_non_null(h);
    return h;
}

static void test_micro_kernel_and_shape_parameter_run(void **state) {
    (void)state;
    Fixture *mk = fixture(), *ax = fixture(), *vs = fixture();
    build_micro_kernel(&mk->b);
    build_axpy(&ax->b);
    build_vector_scale(&vs->b);
    char err[160];
    assert_false(kb_failed(&mk->b) || kb_failed(&ax->b) || kb_failed(&vs->b));
    assert_int_equal(kir_verify(&mk->body, KIR_C, err, sizeof err), 0);
    assert_int_equal(kir_verify(&ax->body, KIR_C, err, sizeof err), 0);
    assert_int_equal(kir_verify(&vs->body, KIR_C, err, sizeof err), 0);
    assert_non_null(strstr(verdict(vs, KIR_CUDA), "a vector outside C"));
    Str src = {0}, dump = {0};
    kir_print_function(&mk->body, &lang_c, "micro_4x4", &src);
    kir_print_function(&ax->body, &lang_c, "axpy", &src);
    kir_print_function(&vs->body, &lang_c, "vscale", &src);
    kir_dump(NULL, &vs->body, &dump);
    assert_false(src.oom || dump.oom);
    assert_non_null(strstr(src.s, "float acc[4][4] = {{0}};"));
    assert_non_null(strstr(src.s, "#pragma GCC unroll 16"));
    assert_non_null(strstr(src.s, "kiln_vf one = ((kiln_vf){0} + 1.0f);"));
    assert_non_null(strstr(src.s, "#pragma GCC unroll 2\n"));
    assert_non_null(strstr(src.s, "kiln_vf v = *(const kiln_vf *)&x[i];"));
    assert_non_null(strstr(src.s, "*(kiln_vf *)&y[i] = 2.5f * v + one;"));
    assert_non_null(strstr(dump.s, "unroll(2)"));
    assert_non_null(strstr(dump.s, "vload x[i]"));
    assert_non_null(strstr(dump.s, "vstore y[i]"));

    char dir[] = "/tmp/kiln-test-kir-XXXXXX";
    assert_non_null(mkdtemp(dir));
    void *h = compile_and_open(src.s, dir);
    typedef void MicroFn(const float *, const float *, float *, int64_t);
    typedef void AxpyFn(const float *, float *, int64_t, int64_t);
    typedef void VscaleFn(const float *, float *, int64_t);
    MicroFn *micro;
    AxpyFn *axpy;
    /* POSIX's way from dlsym's object pointer to a function pointer */
    *(void **)&micro = dlsym(h, "micro_4x4");
    *(void **)&axpy = dlsym(h, "axpy");
    assert_non_null(micro);
    assert_non_null(axpy);
    enum { DEPTH = 37 };
    float a[4 * DEPTH], bm[DEPTH * 4], c[16];
    for (int i = 0; i < 4 * DEPTH; i++) {
        a[i] = (float)((i * 7) % 13) - 6.0f;
        bm[i] = (float)((i * 5) % 11) * 0.5f - 2.0f;
    }
    micro(a, bm, c, DEPTH);
    for (int u = 0; u < 4; u++)
        for (int w = 0; w < 4; w++) {
            float want = 0.0f;
            for (int kk = 0; kk < DEPTH; kk++)
                want += a[u * DEPTH + kk] * bm[kk * 4 + w];
            assert_float_equal(c[u * 4 + w], want, 1e-4f * (1.0f + (want < 0 ? -want : want)));
        }
    for (int n = 0; n <= 33; n += 11) { /* one function, every length */
        float x[40], y[40];
        for (int i = 0; i < 40; i++)
            x[i] = (float)i, y[i] = 1.0f;
        axpy(x, y, n, 3);
        for (int i = 0; i < 40; i++)
            assert_float_equal(y[i], i < n ? 3.0f * (float)i + 1.0f : 1.0f, 0.0f);
    }
    VscaleFn *vscale;
    *(void **)&vscale = dlsym(h, "vscale");
    assert_non_null(vscale);
    for (int n = 0; n <= 12; n += 4) {
        float x[17], y[17];
        for (int i = 0; i < 17; i++)
            x[i] = (float)i, y[i] = -1.0f;
        vscale(x + 1, y + 1, n); /* not 16-byte aligned */
        for (int i = 0; i < 17; i++)
            assert_float_equal(y[i], i >= 1 && i <= n ? 2.5f * (float)i + 1.0f : -1.0f, 0.0f);
    }
    dlclose(h);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
    str_free(&src);
    str_free(&dump);
    release(mk);
    release(ax);
    release(vs);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_integer_simplification),
        cmocka_unit_test(test_dead_lets_dropped),
        cmocka_unit_test(test_verifier_rejects),
        cmocka_unit_test(test_printer_parenthesizes),
        cmocka_unit_test(test_double_literals),
        cmocka_unit_test(test_micro_kernel_and_shape_parameter_run),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
