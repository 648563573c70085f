/* Unit tests for --check (passes/check.c): the comparison under cli.md's tolerance,
 * and the error a drifting pass gets. No pass can be broken from outside, so the
 * drift is made by hand: the test checks a model, then edits the graph the way a
 * wrong pass would (a const changed, an op swapped) and asks check_stage about it. */
/* cmocka needs these first, in this order */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include "frontend/frontend.h"
#include "passes/passes.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static Tensor *vec(int n, const float *v) {
    int64_t dims[1] = {n};
    Type t = type_make(1, dims);
    Tensor *x = tensor_new(&t);
    memcpy(x->data, v, sizeof(float) * (size_t)n);
    return x;
}

static void compare(int n, const float *got, const float *want, CheckDiff *diff) {
    Tensor *a = vec(n, got), *b = vec(n, want);
    check_compare(a, b, diff);
    tensor_free(a);
    tensor_free(b);
}

static void test_compare_equal(void **state) {
    (void)state;
    CheckDiff diff;
    compare(3, (float[]){1, -2, INFINITY}, (float[]){1, -2, INFINITY}, &diff);
    assert_true(diff.ok);
    assert_int_equal(diff.index, -1);
    assert_true(diff.max_error == 0);
}

static void test_compare_nan_matches_nan(void **state) {
    (void)state;
    CheckDiff diff;
    compare(2, (float[]){NAN, 0}, (float[]){NAN, 0}, &diff);
    assert_true(diff.ok);
    compare(2, (float[]){0, NAN}, (float[]){0, 1}, &diff);
    assert_false(diff.ok);
    assert_int_equal(diff.index, 1);
    assert_true(isinf(diff.max_error));
}

/* |a - b| <= 1e-4 + 1e-4 |b|: at b = 1000 the bound is 0.1001 */
static void test_compare_tolerance(void **state) {
    (void)state;
    CheckDiff diff;
    compare(2, (float[]){1000.1f, 0.00005f}, (float[]){1000, 0}, &diff);
    assert_true(diff.ok);
    assert_int_equal(diff.index, 0); /* the largest error, though within tolerance */
    compare(2, (float[]){1000.2f, 0}, (float[]){1000, 0}, &diff);
    assert_false(diff.ok);
    compare(1, (float[]){0.0002f}, (float[]){0}, &diff);
    assert_false(diff.ok);
}

/* The largest error is reported, not the first. */
static void test_compare_largest(void **state) {
    (void)state;
    CheckDiff diff;
    compare(4, (float[]){1.5f, 2, 3, 7}, (float[]){1, 2, 3, 4}, &diff);
    assert_false(diff.ok);
    assert_int_equal(diff.index, 3);
    assert_true(diff.max_error == 3);
    assert_true(diff.got == 7 && diff.want == 4);
}

static const char model[] = "input x : f32[2, 3]\n"
                            "const c : f32[3] = [1, 2, 3]\n"
                            "y = mul(x, c)\n"
                            "z = relu(y)\n"
                            "output y, z\n";

/* A training step: a pass that changes only the new value of p must be caught too. */
static const char step_model[] = "input x : f32[3]\n"
                                 "param p : f32[3] = ones\n"
                                 "y = mul(x, p)\n"
                                 "q = add(p, y)\n"
                                 "update p = q\n"
                                 "output y\n";

/* Parses a model, starts a check on random inputs, and hands back the graph. */
static Graph *start_model(const char *text, Check *k, SrcFile **src, Diag *d, FILE *out) {
    diag_init(d, out);
    *src = srcfile_from_string("t.kiln", text);
    Graph *g = parse_model(*src, d);
    assert_non_null(g);
    assert_int_equal(verify_graph(g, d), 0);
    TensorList w = {0};
    assert_int_equal(check_begin(k, g, &w, NULL, d), 0);
    return g;
}

static Graph *start(Check *k, SrcFile **src, Diag *d, FILE *out) {
    return start_model(model, k, src, d, out);
}

static int stage(Check *k, Graph *g, Diag *d) {
    TensorList w = {0};
    return check_stage(k, g, &w, "fake", d);
}

static void test_stage_ok(void **state) {
    (void)state;
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    Check k;
    SrcFile *src;
    Diag d;
    Graph *g = start(&k, &src, &d, out);
    assert_int_equal(stage(&k, g, &d), 0);
    fclose(out);
    assert_string_equal(text, "check: fake ok (max error 0)\n");
    free(text);
    check_free(&k);
    graph_free(g);
    srcfile_free(src);
}

/* A changed const: output 'y' drifts in column 2, where c = 3 becomes 3.5. The
 * error names the pass, the output, the largest error's multi-index and values. */
static void test_stage_drift(void **state) {
    (void)state;
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    Check k;
    SrcFile *src;
    Diag d;
    Graph *g = start(&k, &src, &d, out);
    const float *x = k.inputs[0]->data;
    int row = fabsf(x[5]) > fabsf(x[2]); /* the larger of x[0, 2] and x[1, 2] */
    float xr = x[3 * row + 2];
    Node *c = g->nodes[g->values[graph_find(g, "c")].node];
    c->data->data[2] = 3.5f;
    assert_int_equal(stage(&k, g, &d), -1);
    fclose(out);
    char want[512];
    snprintf(
        want, sizeof want,
        "kiln: error: check: pass 'fake' changed output 'y': largest error %.3g at [%d, 2] (element %d): "
        "got %.9g, expected %.9g\n",
        fabs(0.5 * xr), row, 3 * row + 2, (double)(xr * 3.5f), (double)(xr * 3));
    assert_string_equal(text, want);
    free(text);
    check_free(&k);
    graph_free(g);
    srcfile_free(src);
}

/* An op swapped for another: relu -> neg. */
static void test_stage_wrong_op(void **state) {
    (void)state;
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    Check k;
    SrcFile *src;
    Diag d;
    Graph *g = start(&k, &src, &d, out);
    g->nodes[g->values[graph_find(g, "z")].node]->op = OP_NEG;
    assert_int_equal(stage(&k, g, &d), -1);
    fclose(out);
    assert_non_null(strstr(text, "check: pass 'fake' changed output 'z': largest error "));
    assert_null(strstr(text, "ok"));
    free(text);
    check_free(&k);
    graph_free(g);
    srcfile_free(src);
}

/* An update's value changed (add -> sub) while every output stays the same. */
static void test_stage_update_drift(void **state) {
    (void)state;
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    Check k;
    SrcFile *src;
    Diag d;
    Graph *g = start_model(step_model, &k, &src, &d, out);
    g->nodes[g->values[graph_find(g, "q")].node]->op = OP_SUB;
    assert_int_equal(stage(&k, g, &d), -1);
    fclose(out);
    assert_non_null(strstr(text, "check: pass 'fake' changed the new value of param 'p': largest error "));
    free(text);
    check_free(&k);
    graph_free(g);
    srcfile_free(src);
}

/* Outputs computed elsewhere (a target) against the reference. */
static void test_target_outputs(void **state) {
    (void)state;
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    Check k;
    SrcFile *src;
    Diag d;
    Graph *g = start(&k, &src, &d, out);
    Tensor *got[2] = {tensor_clone(k.want[0]), tensor_clone(k.want[1])};
    got[1]->data[4] += 0.5f;
    assert_int_equal(check_outputs(&k, g, got, "target c", "target 'c'", &d), -1);
    got[1]->data[4] = k.want[1]->data[4];
    assert_int_equal(check_outputs(&k, g, got, "target c", "target 'c'", &d), 0);
    tensor_free(got[1]);
    got[1] = tensor_new(&(Type){DT_F32, 1, {6}, NULL, 0}); /* the right size, the wrong shape */
    assert_int_equal(check_outputs(&k, g, got, "target c", "target 'c'", &d), -1);
    fclose(out);
    assert_non_null(strstr(text,
                           "kiln: error: check: target 'c' changed output 'z': largest error 0.5 at [1, 1] "
                           "(element 4)"));
    assert_non_null(strstr(text, "check: target c ok (max error 0)\n"));
    assert_non_null(
        strstr(text, "check: target 'c' changed the type of output 'z' from f32[2, 3] to f32[6]"));
    tensor_free(got[0]);
    tensor_free(got[1]);
    free(text);
    check_free(&k);
    graph_free(g);
    srcfile_free(src);
}

/* The same random inputs every time. */
static void test_inputs_deterministic(void **state) {
    (void)state;
    Check a, b;
    SrcFile *s1, *s2;
    Diag d;
    Graph *g1 = start(&a, &s1, &d, stderr), *g2 = start(&b, &s2, &d, stderr);
    assert_memory_equal(a.inputs[0]->data, b.inputs[0]->data, 6 * sizeof(float));
    for (int i = 0; i < 6; i++)
        assert_true(a.inputs[0]->data[i] >= -1 && a.inputs[0]->data[i] <= 1);
    check_free(&a);
    check_free(&b);
    graph_free(g1);
    graph_free(g2);
    srcfile_free(s1);
    srcfile_free(s2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compare_equal),     cmocka_unit_test(test_compare_nan_matches_nan),
        cmocka_unit_test(test_compare_tolerance), cmocka_unit_test(test_compare_largest),
        cmocka_unit_test(test_stage_ok),          cmocka_unit_test(test_stage_drift),
        cmocka_unit_test(test_stage_wrong_op),    cmocka_unit_test(test_stage_update_drift),
        cmocka_unit_test(test_target_outputs),    cmocka_unit_test(test_inputs_deterministic),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
