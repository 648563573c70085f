/* The random ops' generator (runtime/philox.h): Philox4x32-10 against the
 * known-answer vectors Random123 publishes (its kat_vectors, the three
 * "philox4x32 10" lines: counter, key, result), and kiln_philox's mapping of
 * (seed, offset, element i) to a key, a counter and one of its four words, with
 * every half of seed, offset and i / 4 in its place. tests/ref/philox.py, the
 * numpy implementation the batteries and the dropout example's reference use, is
 * checked against the same vectors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "../../runtime/philox.h"

static void known_answers(void **state) {
    (void)state;
    static const struct {
        unsigned int ctr[4], key[2], want[4];
    } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
         {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
         {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (size_t k = 0; k < sizeof kat / sizeof *kat; k++) {
        unsigned int ctr[4] = {kat[k].ctr[0], kat[k].ctr[1], kat[k].ctr[2], kat[k].ctr[3]};
        kiln_philox4x32_10(ctr, kat[k].key);
        for (int j = 0; j < 4; j++)
            assert_int_equal(ctr[j], kat[k].want[j]);
    }
}

/* Element i of key (seed, offset) is word i % 4 at counter (i / 4 low, high,
 * offset low, high) under key (seed low, high). */
static void element_mapping(void **state) {
    (void)state;
    static const long long seeds[] = {0, 1, 0x299f31d0a4093822LL, -1},
                           offsets[] = {0, 7, 0x0370734413198a2eLL, -1};
    static const long long is[] = {0, 1, 2, 3, 4, 7, (1LL << 34) + 6, (1LL << 62) + 9};
    for (size_t s = 0; s < sizeof seeds / sizeof *seeds; s++)
        for (size_t o = 0; o < sizeof offsets / sizeof *offsets; o++)
            for (size_t k = 0; k < sizeof is / sizeof *is; k++) {
                unsigned long long us = (unsigned long long)seeds[s], uo = (unsigned long long)offsets[o],
                                   c = (unsigned long long)is[k] / 4;
                unsigned int key[2] = {(unsigned int)us, (unsigned int)(us >> 32)};
                unsigned int ctr[4] = {(unsigned int)c, (unsigned int)(c >> 32), (unsigned int)uo,
                                       (unsigned int)(uo >> 32)};
                kiln_philox4x32_10(ctr, key);
                long long w = kiln_philox(seeds[s], offsets[o], is[k]);
                assert_true(w >= 0 && w <= 0xffffffffLL);
                assert_int_equal(w, ctr[is[k] % 4]);
            }
    /* Random123's all-zero vector is elements 0..3 of key (0, 0) */
    assert_int_equal(kiln_philox(0, 0, 0), 0x6627e8d5);
    assert_int_equal(kiln_philox(0, 0, 3), 0x9b00dbd8);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(known_answers),
        cmocka_unit_test(element_mapping),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
