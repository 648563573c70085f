/* Unit tests of the op table's completeness (ir/ops.def, ir/unary.def, ir/binary.def).
 *
 * A forgotten piece of an op would otherwise show only when a model uses it: these
 * walk every op and check that each has what its flags promise. Names are unique and
 * callable; every op has shape inference, and a reference kernel and a lowering unless
 * it is a declaration or replaced before code generation; the flags agree with the
 * functions the table names (a unary op is inferred, evaluated and lowered as one, a
 * view is a copy, a layout op has a layout attribute). Every unary and binary row has
 * a reference, C expressions that name only attributes the op has, and derivatives
 * that agree with central differences of the reference at smooth points, with the
 * default attributes and others, for every choice of an enum attribute; the gradient ops accept each row's op
 * and carry its attributes; and autodiff has a rule for each elementwise op. */
/* cmocka needs these first, in this order */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include "codegen/codegen.h"
#include "frontend/frontend.h"
#include "passes/passes.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* The lowering column, which only codegen/lower.c reads otherwise. */
static const LowerFn lowerings[OP_COUNT] = {
#define OP(id, name, inputs, attrs, infer, eval, lower, flags) [OP_##id] = lower,
#include "ir/ops.def"
#undef OP
};

/* Each row of unary.def and binary.def as functions of its columns. */
typedef struct {
    OpId op;
    const char *name;
    double (*f)(const double *p, double x);
    double (*df)(const double *p, double x);
    const char *(*c)(const double *p);
    const char *(*dc)(const double *p);
} UnaryRow;

#define UNARY(id, nm, attrs, reference, c_text, derivative, c_derivative)                                    \
    static double f_##id(const double *p, double x) {                                                        \
        (void)p, (void)x;                                                                                    \
        return reference;                                                                                    \
    }                                                                                                        \
    static double df_##id(const double *p, double x) {                                                       \
        (void)p, (void)x;                                                                                    \
        return derivative;                                                                                   \
    }                                                                                                        \
    static const char *c_##id(const double *p) {                                                             \
        (void)p;                                                                                             \
        return c_text;                                                                                       \
    }                                                                                                        \
    static const char *dc_##id(const double *p) {                                                            \
        (void)p;                                                                                             \
        return c_derivative;                                                                                 \
    }
#include "ir/unary.def"
#undef UNARY

static const UnaryRow unary_rows[] = {
#define UNARY(id, nm, ...) {OP_##id, nm, f_##id, df_##id, c_##id, dc_##id},
#include "ir/unary.def"
#undef UNARY
};

typedef struct {
    OpId op;
    const char *name;
    double (*f)(double a, double b);
    double (*da)(double a, double b);
    double (*db)(double a, double b);
    const char *c, *dc_a, *dc_b;
} BinaryRow;

#define BINARY(id, nm, reference, c_text, d_da, d_db, c_da, c_db)                                            \
    static double f_##id(double a, double b) {                                                               \
        return reference;                                                                                    \
    }                                                                                                        \
    static double da_##id(double a, double b) {                                                              \
        (void)a, (void)b;                                                                                    \
        return d_da;                                                                                         \
    }                                                                                                        \
    static double db_##id(double a, double b) {                                                              \
        (void)a, (void)b;                                                                                    \
        return d_db;                                                                                         \
    }
#include "ir/binary.def"
#undef BINARY

static const BinaryRow binary_rows[] = {
#define BINARY(id, nm, reference, c_text, d_da, d_db, c_da, c_db)                                            \
    {OP_##id, nm, f_##id, da_##id, db_##id, c_text, c_da, c_db},
#include "ir/binary.def"
#undef BINARY
};

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static int count_flagged(unsigned flag) {
    int n = 0;
    for (int op = 0; op < OP_COUNT; op++)
        n += op_has((OpId)op, flag);
    return n;
}

static const AttrSpec *attr_spec(OpId op, AttrId id) {
    int k = op_attr_index(op, id);
    return k >= 0 ? &op_table[op].attrs[k] : NULL;
}

static void test_names(void **state) {
    (void)state;
    for (int op = 0; op < OP_COUNT; op++) {
        const char *name = op_table[op].name;
        assert_non_null(name);
        assert_true(name[0] != 0);
        for (int other = 0; other < op; other++)
            if (strcmp(op_table[other].name, name) == 0)
                fail_msg("two ops are called '%s'", name);
        assert_int_equal(op_lookup(name), op_is_decl((OpId)op) ? -1 : op);
    }
}

static void test_functions(void **state) {
    (void)state;
    for (int op = 0; op < OP_COUNT; op++) {
        const OpInfo *o = &op_table[op];
        bool kernel = !op_has((OpId)op, F_DECL) && !op_has((OpId)op, F_NO_KERNEL);
        if (!o->infer)
            fail_msg("%s has no shape inference", o->name);
        if ((o->eval != NULL) != kernel)
            fail_msg("%s %s a reference kernel", o->name, kernel ? "lacks" : "has");
        if ((lowerings[op] != NULL) != kernel)
            fail_msg("%s %s a lowering", o->name, kernel ? "lacks" : "has");
        int n = 0;
        while (o->attrs[n].id != ATTR_COUNT)
            n++;
        assert_int_equal(n, o->n_attrs);
    }
}

static void test_flags(void **state) {
    (void)state;
    for (int op = 0; op < OP_COUNT; op++) {
        const OpInfo *o = &op_table[op];
        OpId id = (OpId)op;
        int min, max;
        op_arity(id, &min, &max);
        if (op_has(id, F_UNARY)) {
            assert_false(op_has(id, F_BINARY));
            assert_true(op_has(id, F_ELEMENTWISE));
            assert_true(min == 1 && max == 1);
            assert_true(o->infer == infer_unary && o->eval == eval_unary && lowerings[op] == lower_unary);
        }
        if (op_has(id, F_BINARY)) {
            assert_true(op_has(id, F_ELEMENTWISE));
            assert_true(min == 2 && max == 2);
            assert_true(o->infer == infer_broadcast && o->eval == eval_binary &&
                        lowerings[op] == lower_binary);
        }
        assert_int_equal(expr_callable(id), op_has(id, F_UNARY) || op_has(id, F_BINARY));
        if (op_has(id, F_VIEW))
            assert_true(o->eval == eval_copy && lowerings[op] == lower_copy && min == 1 && max == 1);
        if (op_has(id, F_LAYOUT)) {
            const AttrSpec *s = attr_spec(id, ATTR_LAYOUT);
            if (!s || s->kind != A_ENUM || s->set != ENUM_LAYOUT)
                fail_msg("%s is flagged layout-sensitive but has no nchw|nhwc layout", o->name);
        }
        if (op_has(id, F_DECL))
            assert_true(min == 0 && max == 0);
    }
    assert_int_equal(count_flagged(F_UNARY), COUNT(unary_rows));
    assert_int_equal(count_flagged(F_BINARY), COUNT(binary_rows));
}

/* Central differences of f at x, NAN where f is not finite around x. */
static double numeric_slope(double (*f)(const double *, double), const double *p, double x) {
    double h = 1e-6, up = f(p, x + h), down = f(p, x - h);
    return isfinite(up) && isfinite(down) && isfinite(f(p, x)) ? (up - down) / (2 * h) : NAN;
}

/* Every $k of a row's C text names one of the op's n attributes. */
static void check_c_text(const char *op, const char *text, int n) {
    if (!text || !*text)
        fail_msg("%s has an empty C expression", op);
    for (const char *s = strchr(text, '$'); s; s = strchr(s + 1, '$'))
        if (s[1] < '0' || s[1] >= '0' + n)
            fail_msg("%s's C expression '%s' names an attribute it does not have", op, text);
}

/* Points away from every row's kinks (0, +-3, hardsigmoid's +-2.5). */
static const double smooth[] = {-1.7, -0.6, 0.3, 1.1, 2.2};

static void check_unary_row(const UnaryRow *r, const double *p) {
    const OpInfo *o = &op_table[r->op];
    check_c_text(r->name, r->c(p), o->n_attrs);
    check_c_text(r->name, r->dc(p), o->n_attrs);
    for (int i = 0; i < COUNT(smooth); i++) {
        double want = numeric_slope(r->f, p, smooth[i]), got = r->df(p, smooth[i]);
        if (!isnan(want) && fabs(got - want) > 1e-5 * (1 + fabs(want)))
            fail_msg("%s'(%g) is %g by its row, %g by central differences", r->name, smooth[i], got, want);
    }
}

static void test_unary_rows(void **state) {
    (void)state;
    for (int i = 0; i < COUNT(unary_rows); i++) {
        const UnaryRow *r = &unary_rows[i];
        const OpInfo *o = &op_table[r->op];
        assert_string_equal(o->name, r->name);
        assert_true(op_has(r->op, F_UNARY));
        assert_true(o->n_attrs <= UNARY_MAX_PARAMS);
        if (enum_lookup(attr_spec(OP_UNARY_GRAD, ATTR_OP)->set, r->name, strlen(r->name)) != i)
            fail_msg("unary_grad's op does not accept %s", r->name);
        double p[UNARY_MAX_PARAMS] = {0};
        int enum_attr = -1, choices = 1;
        for (int k = 0; k < o->n_attrs; k++) {
            const AttrSpec *s = &o->attrs[k], *g = attr_spec(OP_UNARY_GRAD, s->id);
            if (!g || g->kind != s->kind || g->set != s->set)
                fail_msg("unary_grad lacks %s's attribute '%s' (the end of ir/unary.def)", r->name,
                         attr_name(s->id));
            assert_true(s->kind == A_FLOAT || s->kind == A_ENUM);
            assert_true(s->def == DEF_VALUE);
            if (s->kind == A_FLOAT)
                continue;
            assert_int_equal(enum_attr, -1); /* the loop below tries one enum's choices */
            enum_attr = k;
            choices = enum_choices[s->set].n;
        }
        /* the defaults, then other values (default 1.5 + 0.25, away from every row's
           kinks at the smooth points), for each choice of the enum */
        for (int varied = 0; varied < 2; varied++)
            for (int choice = 0; choice < choices; choice++) {
                for (int k = 0; k < o->n_attrs; k++)
                    if (o->attrs[k].kind == A_FLOAT)
                        p[k] = varied ? o->attrs[k].dflt * 1.5 + 0.25 : o->attrs[k].dflt;
                if (enum_attr >= 0)
                    p[enum_attr] = choice;
                check_unary_row(r, p);
            }
    }
}

static void test_binary_rows(void **state) {
    (void)state;
    static const double points[][2] = {{0.7, 1.3}, {1.6, -0.4}, {2.1, 2.5}, {0.4, 0.3}};
    for (int i = 0; i < COUNT(binary_rows); i++) {
        const BinaryRow *r = &binary_rows[i];
        assert_string_equal(op_table[r->op].name, r->name);
        assert_true(op_has(r->op, F_BINARY));
        if (enum_lookup(attr_spec(OP_BINARY_GRAD, ATTR_OP)->set, r->name, strlen(r->name)) != i)
            fail_msg("binary_grad's op does not accept %s", r->name);
        check_c_text(r->name, r->c, 0);
        check_c_text(r->name, r->dc_a, 0);
        check_c_text(r->name, r->dc_b, 0);
        for (int k = 0; k < COUNT(points); k++) {
            double a = points[k][0], b = points[k][1], h = 1e-6;
            double want_a = (r->f(a + h, b) - r->f(a - h, b)) / (2 * h);
            double want_b = (r->f(a, b + h) - r->f(a, b - h)) / (2 * h);
            if (fabs(r->da(a, b) - want_a) > 1e-5 * (1 + fabs(want_a)) ||
                fabs(r->db(a, b) - want_b) > 1e-5 * (1 + fabs(want_b)))
                fail_msg("%s's derivatives at (%g, %g) are %g, %g by its row, %g, %g by central differences",
                         r->name, a, b, r->da(a, b), r->db(a, b), want_a, want_b);
        }
    }
}

/* autodiff expands grad(sum(op(x, ...)), x) for every elementwise op. */
static void test_gradient_rules(void **state) {
    (void)state;
    for (int op = 0; op < OP_COUNT; op++) {
        if (!op_has((OpId)op, F_UNARY) && !op_has((OpId)op, F_BINARY))
            continue;
        char text[512];
        snprintf(text, sizeof text,
                 "model m\ninput x : f32[3]\ninput z : f32[3]\ny = %s(x%s)\ns = sum(y)\ng = grad(s, x)\n"
                 "output g\n",
                 op_table[op].name, op_has((OpId)op, F_BINARY) ? ", z" : "");
        Diag d;
        diag_init(&d, stderr);
        SrcFile *src = srcfile_from_string("t.kiln", text);
        Graph *g = parse_model(src, &d);
        assert_non_null(g);
        TensorList none = {0};
        PassContext c = {g, &none, 0, &d};
        if (pass_autodiff(&c))
            fail_msg("autodiff has no rule for %s", op_table[op].name);
        graph_free(g);
        srcfile_free(src);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),       cmocka_unit_test(test_functions),
        cmocka_unit_test(test_flags),       cmocka_unit_test(test_unary_rows),
        cmocka_unit_test(test_binary_rows), cmocka_unit_test(test_gradient_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
