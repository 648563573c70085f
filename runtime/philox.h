/* Philox4x32-10, the counter-based generator of kiln's random ops (uniform,
 * dropout), as Random123 defines it (Salmon, Moraes, Dror and Shaw, "Parallel
 * random numbers: as easy as 1, 2, 3", SC 2011), and as PyTorch and JAX use it.
 *
 * A counter-based generator is a function of (key, counter): nothing is carried
 * from one number to the next, so element i of a result is computed from i alone,
 * by whichever thread (or CUDA thread, or the interpreter) gets it, and every
 * target and thread count gives the same bits. One round maps the counter
 * (c0, c1, c2, c3) under the key (k0, k1) to
 *   (hi(M1 c2) ^ c1 ^ k0, lo(M1 c2), hi(M0 c0) ^ c3 ^ k1, lo(M0 c0)),
 * hi and lo the halves of the 64-bit product; the key grows by (W0, W1) (mod 2^32)
 * before each round but the first; ten rounds. kiln_philox4x32_10 is that, checked
 * against Random123's known-answer vectors (tests/unit/test_philox.c).
 *
 * kiln_philox gives element i of a random op's result for the key (seed, offset),
 * an i64[2] of the model: the word i % 4 of Philox4x32-10 with key (seed's low and
 * high 32 bits) and counter (i / 4's low and high 32 bits, offset's low and high),
 * as an integer in [0, 2^32). Distinct offsets (or seeds) give independent streams,
 * so a training step's dropouts take offsets offset, offset + 1, ... and the step
 * adds their count to the offset (docs/language.md).
 *
 * The interpreter includes this file; kiln pastes it into generated C and CUDA
 * (where KILN_PHILOX_FN makes the functions __device__), so it uses only C that
 * CUDA shares: no headers, unsigned int and unsigned long long for the words. */
#ifndef KILN_PHILOX_FN
#define KILN_PHILOX_FN static inline
#endif

/* ctr = Philox4x32-10(ctr, key), in place. */
KILN_PHILOX_FN void kiln_philox4x32_10(unsigned int ctr[4], const unsigned int key[2]) {
    unsigned int k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        unsigned long long p0 = 0xD2511F53ull * ctr[0], p1 = 0xCD9E8D57ull * ctr[2];
        unsigned int c1 = ctr[1], c3 = ctr[3];
        ctr[0] = (unsigned int)(p1 >> 32) ^ c1 ^ k0;
        ctr[1] = (unsigned int)p1;
        ctr[2] = (unsigned int)(p0 >> 32) ^ c3 ^ k1;
        ctr[3] = (unsigned int)p0;
    }
}

/* Word i % 4 of Philox4x32-10 at counter (i / 4, offset) under key seed, in
 * [0, 2^32); i >= 0. */
KILN_PHILOX_FN long long kiln_philox(long long seed, long long offset, long long i) {
    unsigned long long s = (unsigned long long)seed, o = (unsigned long long)offset,
                       c = (unsigned long long)i >> 2;
    unsigned int key[2] = {(unsigned int)s, (unsigned int)(s >> 32)};
    unsigned int ctr[4] = {(unsigned int)c, (unsigned int)(c >> 32), (unsigned int)o,
                           (unsigned int)(o >> 32)};
    kiln_philox4x32_10(ctr, key);
    return (long long)ctr[i & 3];
}
