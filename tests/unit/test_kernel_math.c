/* The vectorizable math of the C target's kernels (runtime/kernel_math.h), against
 * libm in double: kiln_expf, kiln_expf_nonpositive, kiln_sigmoidf and kiln_erff within 2 units
 * in the last place of the correctly rounded result, on every 97th float of their
 * ranges and the 64 at each end, kiln_geluf within 8 from -1 up, relatively within
 * 4e-5 from -13 (where it is 1e-37) to -1; and their values at the edges: 0 below
 * -87.3, infinity above 88.72283 (kiln_expf), NaN for NaN. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>

#include "../../runtime/kernel_math.h"

/* Floats in order as integers, so that their difference counts the floats between. */
static int64_t order(float f) {
    int32_t i;
    memcpy(&i, &f, sizeof i);
    return i < 0 ? (int64_t)INT32_MIN - i : i;
}

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static double sigmoid(double x) {
    return 1 / (1 + exp(-x));
}

/* Fails naming the worst x of [lo, hi] (one sign) if f(x) is more than `most` ulp,
 * or relatively more than `relative` (when that is not 0), from ref(x) rounded to
 * float: every 97th float, then the 64 at the far end. */
static void within(const char *name, float (*f)(float), double (*ref)(double), float lo, float hi,
                   int64_t most, double relative) {
    uint32_t first = bits(fabsf(lo) < fabsf(hi) ? lo : hi), last = bits(fabsf(lo) < fabsf(hi) ? hi : lo);
    int64_t worst = 0;
    float worst_at = 0;
    for (uint32_t u = first; u <= last; u += u < last - 64 ? 97 : 1) {
        float x = from_bits(u), exact = (float)ref((double)x);
        int64_t d = order(f(x)) - order(exact);
        d = d < 0 ? -d : d;
        if (relative && fabs(f(x) - (double)exact) <= relative * fabs((double)exact))
            d = 0;
        if (d > worst)
            worst = d, worst_at = x;
    }
    if (worst > most)
        fail_msg("%s(%.9g) is %lld ulp from the exact result", name, worst_at, (long long)worst);
}

static void within_2_ulp(const char *name, float (*f)(float), double (*ref)(double), float lo, float hi) {
    within(name, f, ref, lo, hi, 2, 0);
}

static double gelu(double x) {
    return 0.5 * x * erfc(-x / sqrt(2));
}

static void expf_within_2_ulp(void **state) {
    (void)state;
    within_2_ulp("kiln_expf", kiln_expf, exp, -0.0f, -87.3f);
    within_2_ulp("kiln_expf", kiln_expf, exp, 0.0f, 88.7f);
}

static void expf_nonpositive_within_2_ulp(void **state) {
    (void)state;
    within_2_ulp("kiln_expf_nonpositive", kiln_expf_nonpositive, exp, -0.0f, -87.3f);
}

static void sigmoidf_within_2_ulp(void **state) {
    (void)state;
    within_2_ulp("kiln_sigmoidf", kiln_sigmoidf, sigmoid, -0.0f, -87.3f);
    within_2_ulp("kiln_sigmoidf", kiln_sigmoidf, sigmoid, 0.0f, 3.4e38f);
}

static void erff_within_2_ulp(void **state) {
    (void)state;
    within_2_ulp("kiln_erff", kiln_erff, erf, 0.0f, 10.0f);
    within_2_ulp("kiln_erff", kiln_erff, erf, -0.0f, -10.0f);
    within_2_ulp("kiln_erff", kiln_erff, erf, 1e-30f, 1e-3f);
}

static void geluf_close(void **state) {
    (void)state;
    within("kiln_geluf", kiln_geluf, gelu, 0.0f, 3.4e38f, 8, 0);
    within("kiln_geluf", kiln_geluf, gelu, -0.0f, -1.0f, 8, 0);
    within("kiln_geluf", kiln_geluf, gelu, 1e-30f, 1e-3f, 8, 0);
    within("kiln_geluf", kiln_geluf, gelu, -1.0f, -13.0f, 0, 4e-5);
}

static void edges(void **state) {
    (void)state;
    assert_true(isnan(kiln_expf(NAN)));
    assert_true(isinf(kiln_expf(INFINITY)) && kiln_expf(INFINITY) > 0);
    assert_true(isinf(kiln_expf(89.0f)));
    assert_true(kiln_expf(-INFINITY) == 0.0f && kiln_expf(-100.0f) == 0.0f);
    assert_true(kiln_expf(0.0f) == 1.0f);
    assert_true(isfinite(kiln_expf(88.72283f)) && kiln_expf(88.72283f) > 3.4e38f);
    assert_true(isnan(kiln_expf_nonpositive(NAN)));
    assert_true(kiln_expf_nonpositive(-INFINITY) == 0.0f && kiln_expf_nonpositive(-100.0f) == 0.0f);
    assert_true(kiln_expf_nonpositive(0.0f) == 1.0f && kiln_expf_nonpositive(-0.0f) == 1.0f);
    assert_true(isnan(kiln_sigmoidf(NAN)));
    assert_true(kiln_sigmoidf(INFINITY) == 1.0f && kiln_sigmoidf(100.0f) == 1.0f);
    assert_true(kiln_sigmoidf(-INFINITY) == 0.0f && kiln_sigmoidf(-100.0f) == 0.0f);
    assert_true(kiln_sigmoidf(0.0f) == 0.5f);
    assert_true(isnan(kiln_erff(NAN)));
    assert_true(kiln_erff(INFINITY) == 1.0f && kiln_erff(-INFINITY) == -1.0f && kiln_erff(20.0f) == 1.0f);
    assert_true(kiln_erff(0.0f) == 0.0f && signbit(kiln_erff(-0.0f)));
    assert_true(isnan(kiln_geluf(NAN)) && isnan(kiln_geluf(-INFINITY))); /* -inf times 0, as x Phi(x) */
    assert_true(kiln_geluf(INFINITY) == INFINITY && kiln_geluf(20.0f) == 20.0f && kiln_geluf(-20.0f) == 0.0f);
    assert_true(kiln_geluf(0.0f) == 0.0f && signbit(kiln_geluf(-0.0f)));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(expf_within_2_ulp),     cmocka_unit_test(expf_nonpositive_within_2_ulp),
        cmocka_unit_test(sigmoidf_within_2_ulp), cmocka_unit_test(erff_within_2_ulp),
        cmocka_unit_test(geluf_close),           cmocka_unit_test(edges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
