/* The memory plan (codegen/plan.c), checked on its own terms for every example, every
 * reference battery and a few models made to stress sharing, with memory planning
 * on and off:
 *   - the plan is well formed: offsets and sizes are multiples of 64, inside the
 *     workspace; buffers whose lifetimes overlap never overlap in memory; every value
 *     a kernel uses in the workspace is in a buffer live at that kernel, at its
 *     offset; the peak is the workspace and is at least the lower bound;
 *   - a replay of the kernels over a shadow workspace, one tag per float, finds what
 *     each read expects: every write tags its elements with the value written (the
 *     scratch's first kernel with the scratch), and every read requires its value's
 *     tag (a view's, its input's), so that a buffer overwritten while still needed
 *     fails;
 *   - a kernel reading and writing the same memory is an in-place kernel over
 *     the one input its result took the place of.
 * Every allocation failing in turn leaves a clean diagnostic. The cases check what
 * the plan must find: a chain of non-elementwise kernels fits
 * in two buffers, an elementwise chain in one, an input still needed is not
 * overwritten, a view of an input is the input. The numerical checks are the
 * examples' and test_target_c's, which compile with the plan.
 *
 * Usage: test_plan (models found through KILN_SOURCE_DIR). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <dirent.h>

#include "codegen/codegen.h"
#include "frontend/frontend.h"
#include "passes/passes.h"

/* The value whose data v is: a view's is its input's. */
static int data_of(const Program *p, int v) {
    while (p->plan.share[v] == MEM_VIEW)
        v = p->plan.from[v];
    return v;
}

static int64_t numel(const Program *p, int v) {
    return type_numel(&p->g->values[v].type);
}

static void check_well_formed(const Program *p) {
    const MemPlan *m = &p->plan;
    assert_int_equal(m->peak, p->workspace_bytes);
    assert_true(m->peak >= m->bound);
    for (int b = 0; b < m->n_bufs; b++) {
        const MemBuffer *x = &m->bufs[b];
        assert_int_equal(x->offset % 64, 0);
        assert_int_equal(x->bytes % 64, 0);
        assert_true(x->first <= x->last && x->offset + x->bytes <= m->peak);
        for (int c = 0; c < b; c++) {
            const MemBuffer *y = &m->bufs[c];
            bool live_together = x->first <= y->last && y->first <= x->last;
            bool apart = x->offset + x->bytes <= y->offset || y->offset + y->bytes <= x->offset;
            if (live_together && !apart)
                fail_msg("buffers b%d and b%d are live together and overlap", c, b);
        }
    }
    for (int k = 0; k < p->n_kernels; k++) {
        const Kernel *kn = &p->kernels[k];
        for (int i = 0; i < kn->n_reads + kn->n_writes; i++) {
            int v = i < kn->n_reads ? kn->reads[i] : kn->writes[i - kn->n_reads];
            if (v < 0 || p->buf[v].kind != BUF_WORK)
                continue;
            int b = m->buffer[v];
            assert_true(b >= 0);
            assert_true(m->bufs[b].first <= k && k <= m->bufs[b].last);
            assert_int_equal(p->buf[v].offset, m->bufs[b].offset);
            assert_true(numel(p, v) * 4 <= m->bufs[b].bytes);
        }
    }
}

/* A read and a write of one kernel in the same memory: in place, over from[w]. */
static void check_sharing(const Program *p) {
    for (int k = 0; k < p->n_kernels; k++) {
        const Kernel *kn = &p->kernels[k];
        for (int w = 0; w < kn->n_writes; w++)
            for (int r = 0; r < kn->n_reads; r++) {
                int wv = kn->writes[w], rv = kn->reads[r];
                if (wv < 0 || rv < 0 || wv == rv || p->buf[wv].kind != BUF_WORK ||
                    p->buf[rv].kind != BUF_WORK || p->buf[wv].offset != p->buf[rv].offset)
                    continue;
                assert_true(kn->in_place);
                assert_int_equal(p->plan.share[wv], MEM_IN_PLACE);
                assert_int_equal(p->plan.from[wv], rv);
            }
    }
}

static void set_tags(int *tag, int64_t from, int64_t n, int t) {
    for (int64_t i = 0; i < n; i++)
        tag[from + i] = t;
}

static void expect_tags(const Program *p, const int *tag, int64_t from, int64_t n, int t, int k) {
    for (int64_t i = 0; i < n; i++)
        if (tag[from + i] != t)
            fail_msg("kernel %d (%s) reads float %lld of the workspace expecting tag %d, found %d", k,
                     p->kernels[k].comment, (long long)(from + i), t, tag[from + i]);
}

static void replay(const Program *p) {
    int64_t n = p->workspace_bytes / 4;
    int *tag = malloc(sizeof *tag * (size_t)(n + 1));
    assert_non_null(tag);
    set_tags(tag, 0, n, -1);
    for (int k = 0; k < p->n_kernels; k++) {
        const Kernel *kn = &p->kernels[k];
        for (int r = 0; r < kn->n_reads; r++) {
            int v = kn->reads[r];
            if (v >= 0 && p->buf[v].kind == BUF_WORK)
                expect_tags(p, tag, p->buf[v].offset / 4, numel(p, v), data_of(p, v), k);
        }
        if (kn->scratch_bytes > 0) {
            int t = -2 - kn->node->out[0];
            bool fills = k == 0 || p->kernels[k - 1].node != kn->node || p->kernels[k - 1].scratch_bytes == 0;
            if (fills)
                set_tags(tag, kn->scratch / 4, kn->scratch_bytes / 4, t);
            else
                expect_tags(p, tag, kn->scratch / 4, kn->scratch_bytes / 4, t, k);
        }
        for (int w = 0; w < kn->n_writes; w++) {
            int v = kn->writes[w];
            if (v >= 0 && p->buf[v].kind == BUF_WORK)
                set_tags(tag, p->buf[v].offset / 4, numel(p, v), v);
        }
    }
    free(tag);
}

/* Lowers g (optimized at -O2) with the plan on or off and checks it; the peak,
 * or -1 when the model does not lower (an op with no lowering yet). */
static int64_t check_plan(Graph *g, const TensorList *w, bool memplan, int64_t *bound) {
    Diag d;
    diag_init(&d, stdout);
    Program *p = program_lower(g, w, &(LowerOptions){TARGET_C, memplan, true, NULL}, &d);
    if (!p)
        return -1;
    assert_int_equal(p->plan.reuse, memplan);
    check_well_formed(p);
    check_sharing(p);
    replay(p);
    int64_t peak = p->plan.peak;
    if (bound)
        *bound = p->plan.bound;
    program_free(p);
    return peak;
}

typedef struct {
    int64_t peak, bound, simple_peak;
} Peaks;

/* Parses text (or the file path when text is NULL) with the weights in
 * weights_path (if it exists), runs the -O2 pipeline (without elementwise fusion
 * and the layout pass unless `fuse`: kernel by kernel as written) and checks both
 * plans. */
static Peaks check_model(const char *name, const char *text, const char *path, const char *weights_path,
                         bool fuse) {
    Diag d;
    diag_init(&d, stdout);
    SrcFile *src = text ? srcfile_from_string(name, text) : srcfile_read(path, &d);
    assert_non_null(src);
    Graph *g = parse_model(src, &d);
    assert_non_null(g);
    assert_int_equal(verify_graph(g, &d), 0);
    TensorList w = {0};
    FILE *f = weights_path ? fopen(weights_path, "rb") : NULL;
    if (f) {
        fclose(f);
        assert_int_equal(safetensors_read(weights_path, &w, &d), 0);
    }
    static const char *as_written[] = {"fuse_elementwise", "layout"};
    PipelineOptions po = {.level = 2, .verify = true, .disabled = as_written, .n_disabled = fuse ? 0 : 2};
    assert_int_equal(pipeline_run(g, &w, &po, &d), 0);
    Peaks r = {0};
    r.peak = check_plan(g, &w, true, &r.bound);
    r.simple_peak = check_plan(g, &w, false, NULL);
    if (r.peak >= 0)
        assert_true(r.peak <= r.simple_peak);
    tensors_free(&w);
    graph_free(g);
    srcfile_free(src);
    return r;
}

static void test_examples(void **state) {
    (void)state;
    static const char *const names[] = {"small_cnn", "resnet18", "mobilenetv2"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/examples/%s.kiln", KILN_SOURCE_DIR, names[i]);
        Peaks r = check_model(names[i], NULL, path, NULL, true);
        assert_true(r.peak > 0);
        printf("%s: peak %lld bytes, lower bound %lld (%.3f), one buffer per value %lld\n", names[i],
               (long long)r.peak, (long long)r.bound, (double)r.peak / (double)r.bound,
               (long long)r.simple_peak);
        assert_true((double)r.peak <= 1.10 * (double)r.bound); /* the planner's aim */
    }
}

static void test_batteries(void **state) {
    (void)state;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tests/ref", KILN_SOURCE_DIR);
    DIR *dp = opendir(dir);
    assert_non_null(dp);
    int planned = 0;
    for (struct dirent *e; (e = readdir(dp));) {
        size_t len = strlen(e->d_name);
        if (len < 6 || strcmp(e->d_name + len - 5, ".kiln") != 0)
            continue;
        char path[1024], weights[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        snprintf(weights, sizeof weights, "%s/%.*s.safetensors", dir, (int)(len - 5), e->d_name);
        planned += check_model(e->d_name, NULL, path, weights, true).peak >= 0;
    }
    closedir(dp);
    assert_true(planned >= 10);
}

static Peaks case_peaks(const char *text) {
    return check_model("<case>", text, NULL, NULL, false); /* kernel by kernel, as written */
}

static void test_cases(void **state) {
    (void)state;
    /* four transposes of 1 KiB: two buffers; negations: one, each in place */
    const char *chain = "input x : f32[16, 16]\na = transpose(x)\nb = transpose(a)\nc = transpose(b)\n"
                        "d = transpose(c)\ny = transpose(d)\noutput y\n";
    assert_int_equal(case_peaks(chain).peak, 2048);
    const char *negs = "input x : f32[16, 16]\na = neg(x)\nb = neg(a)\nc = neg(b)\nd = neg(c)\ny = neg(d)\n"
                       "output y\n";
    assert_int_equal(case_peaks(negs).peak, 1024);
    /* a still needed later: b cannot take its place */
    const char *kept = "input x : f32[256]\na = neg(x)\nb = exp(a)\nc = add(a, b)\noutput c\n";
    assert_int_equal(case_peaks(kept).peak, 2048);
    /* x + x in place over a, a view of a read twice, a view of the input, an output
       that is a view, a value output twice, broadcasting over a view of a */
    const char *views =
        "input x : f32[4, 8]\na = exp(x)\nv = reshape(a, shape=[32])\nw = reshape(x, shape=[32])\n"
        "s = add(a, a)\nf = flatten(s)\nr = relu(f)\nq = reshape(r, shape=[4, 8])\n"
        "m = mul(q, a)\ng = add(v, w)\nu = unsqueeze(g, axes=[0])\n"
        "h = squeeze(u, axes=[0])\nhh = reshape(h, shape=[4, 8])\nk = sub(m, hh)\nio = identity(x)\noutput "
        "k, u, io, k\n";
    Peaks r = case_peaks(views);
    assert_true(r.peak > 0 && r.peak <= r.simple_peak);
}

/* Lowering and planning when the N-th allocation fails, for every N until it
 * succeeds: NULL with a diagnostic each time, and nothing leaked (under ASan). */
static void test_out_of_memory(void **state) {
    (void)state;
    const char *text = "input x : f32[1, 2, 6, 6]\nparam w : f32[4, 2, 3, 3] = normal(0, 0.5, seed=1)\n"
                       "c = conv(x, w, pads=1)\nr = relu(c)\nf = flatten(r)\ns = sigmoid(f)\noutput s, f\n";
    FILE *quiet = fopen("/dev/null", "w");
    assert_non_null(quiet);
    Diag d;
    diag_init(&d, quiet);
    SrcFile *src = srcfile_from_string("<oom>", text);
    Graph *g = src ? parse_model(src, &d) : NULL;
    assert_non_null(g);
    TensorList w = {0};
    Program *p = NULL;
    long n = 0;
    for (; !p && n < 100000; n++) {
        int errors = d.errors;
        ir_fail_alloc_after(n);
        p = program_lower(g, &w, &(LowerOptions){TARGET_C, true, true, NULL}, &d);
        ir_fail_alloc_after(-1);
        if (!p)
            assert_true(d.errors > errors);
    }
    assert_non_null(p);
    assert_true(n > 5);
    check_well_formed(p);
    replay(p);
    program_free(p);
    graph_free(g);
    srcfile_free(src);
    fclose(quiet);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_out_of_memory),
        cmocka_unit_test(test_batteries),
        cmocka_unit_test(test_examples),
    };
    return cmocka_run_group_tests_name("plan", tests, NULL, NULL);
}
