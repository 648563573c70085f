/* Param initializers and the project's deterministic random generator.
 *
 * The generator is SplitMix64: state += 0x9E3779B97F4A7C15, then the state is
 * mixed (xor-shift 30, multiply 0xBF58476D1CE4E5B9, xor-shift 27, multiply
 * 0x94D049BB133111EB, xor-shift 31). The state starts at the seed and elements are
 * filled in C order.
 *   uniform(lo, hi): lo + (hi - lo) * u, u = (next >> 40) / 2^24, in [lo, hi).
 *   normal(mean, std): one Box-Muller draw per element from two 53-bit uniforms
 *     u1 = ((next >> 11) + 1) / 2^53 in (0, 1], u2 = (next >> 11) / 2^53,
 *     mean + std * sqrt(-2 ln u1) * cos(2 pi u2), computed in double.
 * Because params are materialized at compile time, every target sees the same
 * values. docs/language.md repeats this definition. */
#include "ir.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

int param_init_fill(const ParamInit *init, Tensor *t) {
    int64_t n = type_numel(&t->type);
    uint64_t state = init->seed;
    for (int64_t i = 0; i < n; i++) {
        double v = 0;
        switch (init->kind) {
        case INIT_NONE: return -1;
        case INIT_ZEROS: v = 0; break;
        case INIT_ONES: v = 1; break;
        case INIT_FILL: v = init->a; break;
        case INIT_UNIFORM:
            v = init->a + (init->b - init->a) * ((double)(splitmix64(&state) >> 40) / 16777216.0);
            break;
        case INIT_NORMAL: {
            double u1 = ((double)(splitmix64(&state) >> 11) + 1) / 9007199254740992.0;
            double u2 = (double)(splitmix64(&state) >> 11) / 9007199254740992.0;
            v = init->a + init->b * sqrt(-2 * log(u1)) * cos(2 * M_PI * u2);
            break;
        }
        }
        switch (t->type.dtype) {
        case DT_I64: t->i64[i] = (int64_t)v; break;
        case DT_I32: t->i32[i] = (int32_t)v; break;
        case DT_BOOL: t->b[i] = v != 0; break;
        default: t->data[i] = (float)v; break;
        }
    }
    return 0;
}
