/* Unit tests of the cse and fold passes through the C API: the graph before and
 * after gives the same outputs on random inputs in the interpreter, cse tells
 * attributes apart, and running out of memory anywhere in the passes is reported,
 * never a crash. (The text tests check the printed graphs.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/frontend.h"
#include "passes/passes.h"

/* conv + batch_norm in both layouts, a conv_transpose, a chain of known values,
 * repeated expressions and consts. */
static const char model[] = "model passes\n"
                            "input x : f32[2, 3, 5, 5]\n"
                            "input xh : f32[1, 4, 4, 4]\n"
                            "param w : f32[4, 3, 3, 3] = uniform(-1, 1, seed=1)\n"
                            "param s : f32[4] = uniform(0.5, 2, seed=2)\n"
                            "param b : f32[4] = uniform(-1, 1, seed=3)\n"
                            "param m : f32[4] = uniform(-1, 1, seed=4)\n"
                            "param v : f32[4] = uniform(0.1, 2, seed=5)\n"
                            "c = conv(x, w, pads=1, strides=2)\n"
                            "n = batch_norm(c, s, b, m, v)\n"
                            "r1 = relu(n)\n"
                            "r2 = relu(n)\n"
                            "param wh : f32[4, 2, 2, 2] = uniform(-1, 1, seed=6)\n"
                            "ch = conv(xh, wh, groups=2, layout=nhwc)\n"
                            "nh = batch_norm(ch, s, b, m, v, layout=nhwc, epsilon=0.01)\n"
                            "param wt : f32[3, 4, 3, 3] = uniform(-1, 1, seed=7)\n"
                            "ct = conv_transpose(x, wt, strides=2)\n"
                            "nt = batch_norm(ct, s, b, m, v)\n"
                            "const k1 : f32[4] = [1, 2, 3, 4]\n"
                            "const k2 : f32[4] = [1, 2, 3, 4]\n"
                            "k = add(k1, k2)\n"
                            "kr = reshape(k, shape=[4, 1, 1])\n"
                            "y = add(r1, r2)\n"
                            "z = add(y, kr)\n"
                            "output z, nh, nt\n";

/* A deterministic fill in [-2, 2). */
static void fill(Tensor *t, uint32_t seed) {
    int64_t n = type_numel(&t->type);
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        t->data[i] = (float)(seed >> 8) / (float)(1u << 24) * 4.0f - 2.0f;
    }
}

static Graph *parse(const char *text, SrcFile **src) {
    Diag d;
    diag_init(&d, stderr);
    *src = srcfile_from_string("t.kiln", text);
    Graph *g = parse_model(*src, &d);
    assert_non_null(g);
    return g;
}

/* Runs g on the inputs made from seed; outputs into out[] (n of them). */
static void run(Graph *g, const TensorList *weights, uint32_t seed, Tensor **out) {
    Diag d;
    diag_init(&d, stderr);
    int ids[8];
    int n_in = graph_inputs(g, ids, 8);
    Tensor *in[8];
    for (int i = 0; i < n_in; i++) {
        in[i] = tensor_new(&g->values[ids[i]].type);
        fill(in[i], seed + (uint32_t)i);
    }
    assert_int_equal(interp_run(g, weights, (const Tensor *const *)in, out, &d), 0);
    for (int i = 0; i < n_in; i++)
        tensor_free(in[i]);
}

static int count_op(const Graph *g, OpId op) {
    int k = 0;
    for (int i = 0; i < g->n_nodes; i++)
        k += g->nodes[i]->op == op;
    return k;
}

static void test_same_outputs_on_random_inputs(void **state) {
    (void)state;
    SrcFile *src1, *src2;
    Graph *before = parse(model, &src1), *after = parse(model, &src2);
    TensorList none = {0}, made = {0};
    Diag d;
    diag_init(&d, stderr);
    PipelineOptions o = {.level = 2, .only = "cse,fold,dce", .verify = true};
    assert_int_equal(pipeline_run(after, &made, &o, &d), 0);
    assert_int_equal(count_op(after, OP_BATCH_NORM), 0);
    assert_int_equal(count_op(after, OP_RELU), 1);
    assert_int_equal(count_op(after, OP_CONST), 0); /* k folded, and dce took the consts */
    assert_int_equal(count_op(after, OP_RESHAPE), 0);
    assert_true(made.n >= 7); /* three conv weights and biases, kr */
    for (uint32_t seed = 1; seed <= 3; seed++) {
        Tensor *want[3], *got[3];
        run(before, &none, seed, want);
        run(after, &made, seed, got);
        for (int k = 0; k < 3; k++) {
            assert_true(type_equal(&want[k]->type, &got[k]->type));
            int64_t n = type_numel(&want[k]->type);
            for (int64_t i = 0; i < n; i++)
                assert_true(fabs(got[k]->data[i] - want[k]->data[i]) <= 1e-4 + 1e-4 * fabs(want[k]->data[i]));
            tensor_free(want[k]);
            tensor_free(got[k]);
        }
    }
    tensors_free(&made);
    graph_free(before);
    graph_free(after);
    srcfile_free(src1);
    srcfile_free(src2);
}

static void test_cse_tells_attributes_apart(void **state) {
    (void)state;
    SrcFile *src;
    /* the values are read through reshapes so that none is an output itself */
    Graph *g = parse("input x : f32[1, 2, 8, 8]\n"
                     "param w : f32[2, 2, 3, 3] = ones\n"
                     "a = conv(x, w, pads=1)\n"
                     "b = conv(x, w, pads=1, dilations=1)\n"
                     "c = conv(x, w, pads=1, dilations=2)\n"
                     "d = conv(x, w, pads=[1, 1, 1, 1], strides=2)\n"
                     "e = conv(x, w, pads=[1, 1, 0, 1])\n"
                     "f = softmax(x, axis=1)\n"
                     "g = softmax(x, axis=-1)\n"
                     "h = softmax(x)\n"
                     "ra = reshape(a, shape=[-1])\n"
                     "rb = reshape(b, shape=[-1])\n"
                     "rc = reshape(c, shape=[-1])\n"
                     "rd = reshape(d, shape=[-1])\n"
                     "re = reshape(e, shape=[-1])\n"
                     "rf = reshape(f, shape=[-1])\n"
                     "rg = reshape(g, shape=[-1])\n"
                     "rh = reshape(h, shape=[-1])\n"
                     "all = concat(ra, rb, rc, rd, re, rf, rg, rh, axis=0)\n"
                     "output all\n",
                     &src);
    TensorList none = {0};
    Diag d;
    diag_init(&d, stderr);
    PassContext c = {g, &none, 0, &d};
    assert_int_equal(pass_cse(&c), 0);
    assert_int_equal(verify_graph(g, &d), 0);
    assert_int_equal(count_op(g, OP_CONV), 4);    /* b is a */
    assert_int_equal(count_op(g, OP_SOFTMAX), 2); /* h is g */
    assert_int_equal(count_op(g, OP_RESHAPE), 6); /* so rb is ra, rh is rg */
    const Node *all = g->nodes[g->values[graph_find(g, "all")].node];
    static const char *const read[] = {"ra", "ra", "rc", "rd", "re", "rf", "rg", "rg"};
    for (int k = 0; k < all->n_in; k++)
        assert_int_equal(all->in[k], graph_find(g, read[k]));
    assert_true(g->values[graph_find(g, "b")].node < 0);
    assert_true(g->values[graph_find(g, "h")].node < 0);
    graph_free(g);
    srcfile_free(src);
}

/* Every allocation the passes make fails in turn: each failure is an "out of
 * memory" error, never a crash, until the passes succeed. */
static void test_out_of_memory(void **state) {
    (void)state;
    int failures = 0;
    for (long n = 0;; n++) {
        SrcFile *src;
        Graph *g = parse(model, &src);
        TensorList made = {0};
        char *err = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&err, &len);
        Diag d;
        diag_init(&d, f);
        PipelineOptions o = {.level = 2, .only = "cse,fold,dce", .verify = true};
        ir_fail_alloc_after(n);
        int rc = pipeline_run(g, &made, &o, &d);
        ir_fail_alloc_after(-1);
        fclose(f);
        if (rc == 0) {
            assert_string_equal(err, "");
        } else {
            assert_non_null(strstr(err, "out of memory"));
            failures++;
        }
        free(err);
        tensors_free(&made);
        graph_free(g);
        srcfile_free(src);
        if (rc == 0)
            break;
    }
    assert_true(failures >= 10);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_outputs_on_random_inputs),
        cmocka_unit_test(test_cse_tells_attributes_apart),
        cmocka_unit_test(test_out_of_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
