/* Unit tests for the drawing of elementwise expressions in kiln dot (ir/dot.c).
 *
 * The expression walker by itself: the dot nodes and edges it writes for well-formed
 * expressions (labels in the canonical form the printer uses), and that a malformed
 * one is refused with nothing written (kiln dot then draws the op as a plain node). */
/* cmocka needs these first, in this order */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include "ir/ir.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int rc;
    char *inner, *outer;
    char root[64];
} Drawn;

static Drawn draw(const char *expr) {
    static const char *const inputs[] = {"in0", "in1", "in2"};
    Drawn r = {0};
    size_t n1, n2;
    FILE *f = open_memstream(&r.inner, &n1), *g = open_memstream(&r.outer, &n2);
    r.rc = dot_expr(f, g, expr, "e", inputs, 3, r.root, sizeof r.root);
    fclose(f);
    fclose(g);
    return r;
}

static void drawn_free(Drawn *r) {
    free(r->inner);
    free(r->outer);
}

static void test_nested_calls(void **state) {
    (void)state;
    Drawn r = draw("relu(add($0, $1))");
    assert_int_equal(r.rc, 0);
    assert_string_equal(r.root, "e_0");
    assert_string_equal(r.inner, "    e_0 [label=\"relu\"];\n"
                                 "    e_1 [label=\"add\"];\n"
                                 "    e_1 -> e_0;\n");
    assert_string_equal(r.outer, "  in0 -> e_1;\n"
                                 "  in1 -> e_1;\n");
    drawn_free(&r);
}

static void test_numbers_and_attrs(void **state) {
    (void)state;
    Drawn r = draw(" leaky_relu( mul($2, -1.5e-3), alpha = 0.1 ) ");
    assert_int_equal(r.rc, 0);
    assert_string_equal(r.inner, "    e_0 [label=\"leaky_relu\\nalpha=0.1\"];\n"
                                 "    e_1 [label=\"mul\"];\n"
                                 "    e_3 [label=\"-0.0015\", shape=plaintext];\n"
                                 "    e_3 -> e_1;\n"
                                 "    e_1 -> e_0;\n");
    assert_string_equal(r.outer, "  in2 -> e_1;\n");
    drawn_free(&r);
}

/* clip with a bound at its default (not shown), and an input used twice */
static void test_several_attrs(void **state) {
    (void)state;
    Drawn r = draw("clip(mul($0,$0),min=-1,max=inf)");
    assert_int_equal(r.rc, 0);
    assert_non_null(strstr(r.inner, "e_0 [label=\"clip\\nmin=-1\"]"));
    assert_string_equal(r.outer, "  in0 -> e_1;\n  in0 -> e_1;\n");
    drawn_free(&r);
}

/* `$k` alone draws nothing: the result is the input itself */
static void test_bare_input(void **state) {
    (void)state;
    Drawn r = draw("$1");
    assert_int_equal(r.rc, 0);
    assert_string_equal(r.root, "in1");
    assert_string_equal(r.inner, "");
    drawn_free(&r);
}

static void test_malformed(void **state) {
    (void)state;
    static const char *const bad[] = {
        "",      "relu(", "relu($0",  "relu($0) x", "$3",      "$", "add($0,,$1)", "relu(alpha=1, $0)",
        "f(a=)", "(1)",   "relu($0]", "add($0 $1)", "f(x=$0)",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        Drawn r = draw(bad[i]);
        if (r.rc != -1)
            fail_msg("'%s' was accepted", bad[i]);
        assert_string_equal(r.inner, "");
        assert_string_equal(r.outer, "");
        drawn_free(&r);
    }
}

/* Deep nesting is refused rather than recursed into without bound. */
static void test_too_deep(void **state) {
    (void)state;
    char expr[4096] = "";
    for (int i = 0; i < 500; i++)
        strcat(expr, "relu(");
    strcat(expr, "$0");
    for (int i = 0; i < 500; i++)
        strcat(expr, ")");
    Drawn r = draw(expr);
    assert_int_equal(r.rc, -1);
    drawn_free(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nested_calls),  cmocka_unit_test(test_numbers_and_attrs),
        cmocka_unit_test(test_several_attrs), cmocka_unit_test(test_bare_input),
        cmocka_unit_test(test_malformed),     cmocka_unit_test(test_too_deep),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
