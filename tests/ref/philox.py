"""Philox4x32-10 in numpy, written from Random123's definition (not from kiln's C),
for the references of kiln's random ops (docs/language.md, runtime/philox.h).

    words(seed, offset, n)         element i's word, i < n: uint64 in [0, 2^32)
    uniform(seed, offset, shape)   kiln's uniform: (word >> 8) * 2^-24, float32
    keep_mask(seed, offset, shape, p)
                                   dropout's mask: word >> 8 >= ceil(p * 2^24)
    dropout_scale(p)               1 / (1 - p) as float32

Element i of a result with key (seed, offset) is word i % 4 of Philox4x32-10 with
key (seed's low and high 32 bits) at counter (i // 4's low and high 32 bits,
offset's low and high). Running this file checks Random123's known-answer vectors.
"""
import math

import numpy as np

M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
MASK = 0xFFFFFFFF


def philox4x32_10(ctr, key):
    """ctr: uint64 array [4, n] of 32-bit words; key: two ints. Returns [4, n]."""
    c = [np.asarray(w, dtype=np.uint64) & MASK for w in ctr]
    k0, k1 = key[0] & MASK, key[1] & MASK
    for r in range(10):
        if r:
            k0, k1 = (k0 + W0) & MASK, (k1 + W1) & MASK
        p0 = np.uint64(M0) * c[0]  # < 2^64: no overflow
        p1 = np.uint64(M1) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ np.uint64(k0), p1 & np.uint64(MASK),
             (p0 >> np.uint64(32)) ^ c[3] ^ np.uint64(k1), p0 & np.uint64(MASK)]
    return c


def words(seed, offset, n):
    seed, offset = seed % 2**64, offset % 2**64
    i = np.arange(n, dtype=np.uint64)
    q = i >> np.uint64(2)
    zeros = np.zeros(n, dtype=np.uint64)
    out = philox4x32_10([q & np.uint64(MASK), q >> np.uint64(32), zeros + (offset & MASK), zeros + (offset >> 32)],
                        (seed & MASK, seed >> 32))
    return np.choose((i & np.uint64(3)).astype(np.int64), out)


def uniform(seed, offset, shape):
    n = int(np.prod(shape, dtype=np.int64))
    return ((words(seed, offset, n) >> np.uint64(8)).astype(np.float64) * 2.0**-24).astype(np.float32).reshape(shape)


def keep_mask(seed, offset, shape, p):
    n = int(np.prod(shape, dtype=np.int64))
    return ((words(seed, offset, n) >> np.uint64(8)) >= math.ceil(p * 2**24)).reshape(shape)


def dropout_scale(p):
    return np.float32(1.0 / (1.0 - p))


def check_known_answers():
    """Random123's kat_vectors, the philox4x32 10 lines: counter, key, result."""
    kat = [((0, 0, 0, 0), (0, 0), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
           ((MASK,) * 4, (MASK, MASK), (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
           ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
            (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1))]
    for ctr, key, want in kat:
        got = [int(w) for w in philox4x32_10([np.array([w], dtype=np.uint64) for w in ctr], key)]
        assert got == list(want), (ctr, key, [hex(w) for w in got])
    assert [int(w) for w in words(0, 0, 4)] == list(kat[0][2])


check_known_answers()

if __name__ == "__main__":
    print("Philox4x32-10: Random123's known answers match")
