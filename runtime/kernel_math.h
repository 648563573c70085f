/* Math the C target's kernels call, written so that compilers vectorize it.
 *
 * libm's expf is a function call that neither GCC nor Clang turns into vector code
 * (without -ffast-math), so a loop applying sigmoid or softmax to a tensor ran one
 * element at a time, at a few nanoseconds each. These are plain arithmetic on
 * floats and their bits, inlined and vectorized with the loop around them:
 *   exp(x) = 2^n exp(r), n = x log2(e) rounded to nearest (by adding 1.5 * 2^23, so
 *   no float-to-int conversion), r = x - n ln(2) with ln(2) in two parts (Cody and
 *   Waite) so r is exact to a float's precision, and exp(r) for |r| <= ln(2)/2 by
 *   Cephes' polynomial of degree 5 (Moshier).
 * kiln_expf builds 2^n in two halves, so that exp(88.72), near the largest float,
 * does not overflow on the way: within 2 units in the last place of expf from -87.3
 * to 88.7 (the test checks every float there); exactly 0 below -87.3 (where expf's
 * results are at most FLT_MIN or denormal), infinity above 88.72283, and NaN for NaN.
 * kiln_expf_nonpositive, for the x <= 0 of softmax's x - max and sigmoid's
 * exp(-|x|), builds 2^n in one and skips the overflow: about a third fewer
 * instructions, the same results there. kiln_sigmoidf is 1 / (1 + exp(-x)) as
 * 1 / (1 + e) for x >= 0 and e / (1 + e) below, e = exp(-|x|), so no exp
 * overflows: within 2 units in the last place of the correctly rounded sigmoid, 0
 * below -87.3, NaN for NaN. kiln_erff (erf, for GELU) is at the end. kiln pastes
 * this file into every generated C model. */
#include <stdint.h>
#include <string.h>

/* exp(r) of the reduced argument of c (clamped to [-87.3, 88.72283]), and in *k
 * the bits whose low 23 hold n + 2^22. */
static inline float kiln_exp_reduced(float c, uint32_t *k) {
    float n = c * 1.44269504088896341f + 12582912.0f;
    memcpy(k, &n, sizeof *k);
    n -= 12582912.0f;
    float r = c - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    return p * r * r + r + 1.0f;
}

static inline float kiln_expf(float x) {
    float c = x < -87.3f ? -87.3f : x > 88.72283f ? 88.72283f : x;
    uint32_t k;
    float e = kiln_exp_reduced(c, &k);
    /* n between -126 and 128: 2^n as 2^h 2^(n - h) */
    int32_t m = (int32_t)(k & 0x7fffffu) - 0x400000, h = m / 2;
    uint32_t b0 = (uint32_t)(h + 127) << 23, b1 = (uint32_t)(m - h + 127) << 23;
    float s0, s1;
    memcpy(&s0, &b0, sizeof s0);
    memcpy(&s1, &b1, sizeof s1);
    float y = e * s0 * s1;
    return x > 88.72283f ? (1.0f / 0.0f) : x < -87.3f ? 0.0f : y;
}

static inline float kiln_expf_nonpositive(float x) {
    float c = x < -87.3f ? -87.3f : x;
    uint32_t k;
    float e = kiln_exp_reduced(c, &k);
    /* n between -126 and 0: its exponent field n + 127, shifted into place (the
       bits above the low 23 of k shift out) */
    uint32_t b = (k + (127u - 0x400000u)) << 23;
    float s;
    memcpy(&s, &b, sizeof s);
    return x < -87.3f ? 0.0f : e * s;
}

/* exp(-|x|) inlined: -|x| by setting the sign bit, and no clamp, as the select
 * that makes it 0 below -87.3 replaces whatever the garbage there came to. */
static inline float kiln_sigmoidf(float x) {
    uint32_t bits, k;
    memcpy(&bits, &x, sizeof bits);
    bits |= 0x80000000u;
    float z;
    memcpy(&z, &bits, sizeof z);
    float e = kiln_exp_reduced(z, &k);
    uint32_t b = (k + (127u - 0x400000u)) << 23;
    float s;
    memcpy(&s, &b, sizeof s);
    e = z < -87.3f ? 0.0f : e * s;
    return (x < 0.0f ? e : 1.0f) / (1.0f + e);
}

/* erfc(z) for z >= 0 from the Chebyshev fit of Numerical Recipes' erfcc, t exp(-z^2 +
 * P(t)) with t = 1 / (1 + z/2): fractional error below 1.2e-7 for every z >= 0. */
static inline float kiln_erfc_nonnegative(float z) {
    float t = 1.0f / (1.0f + 0.5f * z);
    float q = 0.17087277f;
    q = q * t - 0.82215223f;
    q = q * t + 1.48851587f;
    q = q * t - 1.13520398f;
    q = q * t + 0.27886807f;
    q = q * t - 0.18628806f;
    q = q * t + 0.09678418f;
    q = q * t + 0.37409196f;
    q = q * t + 1.00002368f;
    q = q * t - 1.26551223f;
    return t * kiln_expf_nonpositive(q - z * z);
}

/* erf: for |x| < 0.921875 its Maclaurin series to the x^21 term (2/sqrt(pi) sum
 * (-1)^n x^(2n+1) / (n! (2n+1)), the rest below 2e-9 there), else 1 - erfc(|x|);
 * both computed and one selected, so it vectorizes. Within 2 units in the last place
 * of erf everywhere (the test checks); +-1 at +-inf, NaN for NaN. */
static inline float kiln_erff(float x) {
    float z = x < 0.0f ? -x : x, z2 = z * z;
    float s = 1.48071928e-08f;
    s = s * z2 - 1.63658441e-07f;
    s = s * z2 + 1.64621144e-06f;
    s = s * z2 - 1.49256502e-05f;
    s = s * z2 + 0.000120553326f;
    s = s * z2 - 0.000854832702f;
    s = s * z2 + 0.00522397785f;
    s = s * z2 - 0.0268661715f;
    s = s * z2 + 0.112837918f;
    s = s * z2 - 0.376126379f;
    s = s * z2 + 1.12837923f;
    float r = z < 0.921875f ? s * z : 1.0f - kiln_erfc_nonnegative(z);
    return x < 0.0f ? -r : r;
}

/* GELU, x Phi(x) = x erfc(-x / sqrt(2)) / 2, in one branch: erfc of |x| / sqrt(2)
 * gives Phi(x) for x < 0 and 1 - Phi(x) above, and neither needs erf's Maclaurin
 * branch, since where erf is small Phi is near 1/2. Below -1, where
 * 0.5 x (1 + kiln_erff(x / sqrt(2))) loses its digits to 1 + erf (none are left below
 * -5), it keeps a relative 4e-5; within 8 units in the last place above. */
static inline float kiln_geluf(float x) {
    float half_erfc = 0.5f * kiln_erfc_nonnegative((x < 0.0f ? -x : x) * 0.707106781f);
    return x * (x < 0.0f ? half_erfc : 1.0f - half_erfc);
}
