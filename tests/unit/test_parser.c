/* Unit tests of the parser, printer and IR through the C API: what text tests
 * cannot see (the graph's structure, allocation failures, float formatting). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/frontend.h"

static const char autograd[] = "model autograd_example\n"
                               "input  x  : f32[2, 2]\n"
                               "param  w1 : f32[] = fill(2.0)\n"
                               "param  w2 : f32[] = fill(3.0)\n"
                               "param  w3 : f32[] = fill(4.0)\n"
                               "l1 = mul(x, w1)\n"
                               "l2 = add(l1, w2)\n"
                               "l3 = mul(l1, w3)\n"
                               "l4 = mul(l2, l3)\n"
                               "loss = mean(l4)\n"
                               "g1, g2, g3 = grad(loss, w1, w2, w3)\n"
                               "output loss, g1, g2, g3\n";

/* Parses text; the caller frees *src and the graph. Diagnostics go to errbuf. */
static Graph *parse_text(const char *text, SrcFile **src, char **errbuf) {
    static size_t len;
    FILE *f = open_memstream(errbuf, &len);
    Diag d;
    diag_init(&d, f);
    *src = srcfile_from_string("t.kiln", text);
    Graph *g = parse_model(*src, &d);
    fclose(f);
    return g;
}

static char *print_to_string(const Graph *g) {
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    print_graph(g, f);
    fclose(f);
    return out;
}

static void test_spec_example_structure(void **state) {
    (void)state;
    SrcFile *src;
    char *err;
    Graph *g = parse_text(autograd, &src, &err);
    assert_non_null(g);
    assert_string_equal(err, "");
    assert_string_equal(g->name, "autograd_example");
    assert_int_equal(g->n_outputs, 4);
    int grad = graph_find(g, "g2");
    assert_true(grad >= 0);
    const Node *n = g->nodes[g->values[grad].node];
    assert_int_equal(n->op, OP_GRAD);
    assert_int_equal(n->n_in, 4);
    assert_int_equal(n->n_out, 3);
    assert_int_equal(g->values[grad].type.rank, 0);
    const Value *l4 = graph_value(g, graph_find(g, "l4"));
    assert_int_equal(l4->type.rank, 2);
    assert_int_equal(verify_graph(g, &(Diag){.out = stderr}), 0);
    graph_free(g);
    srcfile_free(src);
    free(err);
}

static void test_print_is_fixed_point(void **state) {
    (void)state;
    const char *texts[] = {
        autograd,
        "input x : f32[1, 2, 6, 6]\n"
        "param w : f32[4, 2, 3, 3] = uniform(-1, 1, seed=7)\n"
        "const \"c 1\" : f32[2] = [1.5, 1e-7]\n"
        "y = conv(x, w, _, strides=2, pads=1, dilations=[1, 1], layout=\"nchw\")\n"
        "z = clip(y, min=0, max=6.0)\n"
        "r = resize(z, scales=[1, 1, 2, 2], mode=linear)\n"
        "i = interpolate(z, size=4, mode=\"nearest-exact\")\n"
        "output r, i, \"c 1\"\n",
    };
    for (size_t k = 0; k < sizeof texts / sizeof *texts; k++) {
        SrcFile *s1, *s2;
        char *e1, *e2;
        Graph *g1 = parse_text(texts[k], &s1, &e1);
        assert_non_null(g1);
        char *p1 = print_to_string(g1);
        Graph *g2 = parse_text(p1, &s2, &e2);
        assert_non_null(g2);
        char *p2 = print_to_string(g2);
        assert_string_equal(p1, p2);
        /* defaults are dropped, shorthands expanded, `_` trailing inputs removed */
        if (k == 1) {
            assert_non_null(strstr(p1, "conv(x, w, strides=[2, 2], pads=[1, 1, 1, 1])"));
            assert_non_null(strstr(p1, "clip(y, min=0, max=6)"));
            assert_non_null(strstr(p1, "mode=\"nearest-exact\""));
            assert_non_null(strstr(p1, "const \"c 1\" : f32[2] = [1.5, 1e-7]"));
        }
        free(p1), free(p2), free(e1), free(e2);
        graph_free(g1), graph_free(g2);
        srcfile_free(s1), srcfile_free(s2);
    }
}

/* Every allocation failure is reported as an error, never a crash or a leak. */
static void test_allocation_failures(void **state) {
    (void)state;
    int failures = 0;
    for (long n = 0;; n++) {
        SrcFile *src = srcfile_from_string("t.kiln", autograd);
        if (!src)
            continue;
        char *err = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&err, &len);
        Diag d;
        diag_init(&d, f);
        ir_fail_alloc_after(n);
        Graph *g = parse_model(src, &d);
        ir_fail_alloc_after(-1);
        fclose(f);
        if (g) {
            graph_free(g);
            srcfile_free(src);
            free(err);
            break;
        }
        assert_non_null(strstr(err, "out of memory"));
        failures++;
        srcfile_free(src);
        free(err);
    }
    assert_true(failures >= 4); /* graph, arena, node array, value array, name table */
}

static void test_format_double(void **state) {
    (void)state;
    char buf[64];
    struct {
        double v;
        const char *text;
    } cases[] = {{1e-5, "1e-5"},
                 {0.1, "0.1"},
                 {2, "2"},
                 {-0.75, "-0.75"},
                 {1e20, "1e20"},
                 {1.0 / 3, "0.3333333333333333"},
                 {-INFINITY, "-inf"},
                 {123456789, "123456789"}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        format_double(cases[i].v, buf, sizeof buf);
        assert_string_equal(buf, cases[i].text);
    }
    format_float(0.1f, buf, sizeof buf);
    assert_string_equal(buf, "0.1");
    format_float(1.0f / 3, buf, sizeof buf);
    assert_string_equal(buf, "0.33333334");
}

static void test_signature(void **state) {
    (void)state;
    char sig[1024];
    op_signature(OP_CONV, sig, sizeof sig);
    assert_non_null(strstr(sig, "conv(x, w, b?"));
    assert_non_null(strstr(sig, "groups: int = 1"));
    assert_non_null(strstr(sig, "layout: nchw|nhwc = nchw"));
    int lo, hi;
    op_arity(OP_CONCAT, &lo, &hi);
    assert_int_equal(lo, 1);
    assert_int_equal(hi, -1);
    op_arity(OP_GEMM, &lo, &hi);
    assert_int_equal(lo, 2);
    assert_int_equal(hi, 3);
}

/* The interpreter on the spec's example: loss = 40 with x all ones. */
static void test_interp_spec_example(void **state) {
    (void)state;
    const char *text = "input x : f32[2, 2]\n"
                       "param w1 : f32[] = fill(2.0)\n"
                       "param w2 : f32[] = fill(3.0)\n"
                       "param w3 : f32[] = fill(4.0)\n"
                       "l1 = mul(x, w1)\nl2 = add(l1, w2)\nl3 = mul(l1, w3)\nl4 = mul(l2, l3)\n"
                       "loss = mean(l4)\noutput loss\n";
    SrcFile *src;
    char *err;
    Graph *g = parse_text(text, &src, &err);
    assert_non_null(g);
    Type t = type_make(2, (int64_t[]){2, 2});
    Tensor *x = tensor_new(&t), *out[1] = {NULL};
    for (int i = 0; i < 4; i++)
        x->data[i] = 1;
    Diag d;
    diag_init(&d, stderr);
    assert_int_equal(interp_run(g, NULL, (const Tensor *const[]){x}, out, &d), 0);
    assert_float_equal(out[0]->data[0], 40.0, 0);
    tensor_free(x);
    tensor_free(out[0]);
    graph_free(g);
    srcfile_free(src);
    free(err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spec_example_structure),
        cmocka_unit_test(test_print_is_fixed_point),
        cmocka_unit_test(test_allocation_failures),
        cmocka_unit_test(test_format_double),
        cmocka_unit_test(test_signature),
        cmocka_unit_test(test_interp_spec_example),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
