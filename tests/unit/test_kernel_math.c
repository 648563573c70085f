/* The vectorizable math of the C target's kernels (runtime/kernel_math.h), against
 * libm in double: kiln_expf within 2 units in the last place of the correctly
 * rounded exp on every 97th float from -87.3 to 88.7 and the 64 at each end of
 * that range; 0 below it, infinity above, NaN for NaN. */
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

static int64_t ulps(float x) {
    int64_t d = order(kiln_expf(x)) - order((float)exp((double)x));
    return d < 0 ? -d : d;
}

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void expf_within_2_ulp(void **state) {
    (void)state;
    int64_t worst = 0;
    float worst_at = 0;
    uint32_t lo, hi;
    float l = -87.3f, h = 88.7f;
    memcpy(&lo, &l, sizeof lo);
    memcpy(&hi, &h, sizeof hi);
    /* the negative floats (bits 0x80000000, -0, up to lo) and the positive (0 up to
       hi): every 97th, then the 64 at the end */
    for (int sign = 0; sign < 2; sign++) {
        uint32_t first = sign ? 0x80000000u : 0, last = sign ? lo : hi;
        for (uint32_t u = first; u <= last; u += u < last - 64 ? 97 : 1) {
            int64_t e = ulps(from_bits(u));
            if (e > worst)
                worst = e, worst_at = from_bits(u);
        }
    }
    if (worst > 2)
        fail_msg("kiln_expf(%.9g) is %lld ulp from exp", worst_at, (long long)worst);
}

static void expf_edges(void **state) {
    (void)state;
    assert_true(isnan(kiln_expf(NAN)));
    assert_true(isinf(kiln_expf(INFINITY)) && kiln_expf(INFINITY) > 0);
    assert_true(isinf(kiln_expf(89.0f)));
    assert_true(kiln_expf(-INFINITY) == 0.0f && kiln_expf(-100.0f) == 0.0f);
    assert_true(kiln_expf(0.0f) == 1.0f);
    assert_true(isfinite(kiln_expf(88.72283f)) && kiln_expf(88.72283f) > 3.4e38f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(expf_within_2_ulp),
        cmocka_unit_test(expf_edges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
