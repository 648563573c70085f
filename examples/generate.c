/* generate: greedy token-by-token generation with a decoder step compiled by kiln.
 *
 *   generate MODEL.so STEPS PROMPT... [--expect TOKENS.txt]
 *
 * MODEL.so is a decoder step compiled by `kiln compile` (examples/gpt2_step.kiln): two
 * inputs, the token and its position (i64[1] each), and as its first output the next
 * token (i64[1]; other outputs are computed and ignored). The model keeps its
 * key/value cache in params that its `update` statements extend in every run, so one
 * instance, run once per token, carries the whole sequence.
 *
 * The prompt's tokens are run at positions 0, 1, ...; the step of the last one gives
 * the first new token, which is run next, and so on until STEPS tokens are generated.
 * Each run prints
 *   pos P token T next N time_us U
 * and the end prints the generated tokens on one line. With --expect, TOKENS.txt holds
 * the prompt on its first line and the expected tokens on its second (as
 * examples/gen_gpt2.py writes PyTorch's): the prompt must be the same and the first
 * STEPS tokens must match, or it is an error naming the first that does not.
 *
 * Needs only libc and libdl:
 *   cc -std=c11 -O2 -I runtime examples/generate.c -o generate -ldl
 * Exit status: 0 success, 1 a failure (bad model, failed run, tokens that differ),
 * 2 a malformed command line. */
#define _POSIX_C_SOURCE 200809L
#include <kiln/model.h>

#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char usage[] = "usage: generate MODEL.so STEPS PROMPT... [--expect TOKENS.txt]\n";

enum { MAX_TOKENS = 1 << 16 };

static int fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("generate: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

/* A decimal integer in [lo, hi], the whole of text. */
static int parse_int(const char *text, long long lo, long long hi, long long *v) {
    char *end;
    errno = 0;
    *v = strtoll(text, &end, 10);
    return errno || end == text || *end || *v < lo || *v > hi ? -1 : 0;
}

/* Reads line `line` (0 or 1) of a tokens file into t; -1 after an error. */
static int read_tokens(const char *path, int line, int64_t *t, int cap, int *n) {
    FILE *f = fopen(path, "r");
    if (!f)
        return fail("cannot open %s: %s", path, strerror(errno));
    char buf[1 << 16];
    int rc = 0;
    for (int k = 0; k <= line; k++)
        if (!fgets(buf, sizeof buf, f)) {
            rc = fail("%s: no line %d", path, line + 1);
            break;
        }
    fclose(f);
    if (rc)
        return rc;
    *n = 0;
    for (char *tok = strtok(buf, " \t\r\n"); tok; tok = strtok(NULL, " \t\r\n")) {
        long long v;
        if (*n == cap)
            return fail("%s: more than %d tokens on line %d", path, cap, line + 1);
        if (parse_int(tok, 0, INT64_MAX, &v))
            return fail("%s: line %d: '%s' is not a token id", path, line + 1, tok);
        t[(*n)++] = v;
    }
    return 0;
}

static int64_t numel(const kiln_tensor_info *t) {
    int64_t n = 1;
    for (int k = 0; k < t->rank; k++)
        n *= t->shape[k];
    return n;
}

static size_t dtype_size(int32_t dtype) {
    return dtype == KILN_I64 ? 8 : dtype == KILN_BOOL ? 1 : dtype == KILN_F16 || dtype == KILN_BF16 ? 2 : 4;
}

static int is_scalar_i64(const kiln_tensor_info *t) {
    return t->dtype == KILN_I64 && numel(t) == 1;
}

static int check_model(const char *path, const kiln_model_def *m) {
    if (m->abi_version != KILN_ABI_VERSION)
        return fail("%s: ABI version %u, this program knows %d", path, m->abi_version, KILN_ABI_VERSION);
    if (m->n_inputs != 2 || !is_scalar_i64(&m->inputs[0]) || !is_scalar_i64(&m->inputs[1]))
        return fail("%s: a decoder step takes two inputs, the token and its position (i64[1] each)", path);
    if (m->n_outputs < 1 || !is_scalar_i64(&m->outputs[0]))
        return fail("%s: a decoder step's first output is the next token (i64[1])", path);
    return 0;
}

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

int main(int argc, char **argv) {
    const char *model = NULL, *expect = NULL;
    long long steps = -1;
    static int64_t prompt[MAX_TOKENS], want[MAX_TOKENS], got[MAX_TOKENS];
    int n_prompt = 0, n_want = 0;
    for (int i = 1; i < argc; i++) {
        long long v;
        bool ok = true;
        if (strcmp(argv[i], "--expect") == 0 && i + 1 < argc)
            expect = argv[++i];
        else if (!model)
            model = argv[i];
        else if (steps < 0)
            ok = parse_int(argv[i], 1, MAX_TOKENS, &steps) == 0;
        else if ((ok = n_prompt < MAX_TOKENS && parse_int(argv[i], 0, INT64_MAX, &v) == 0))
            prompt[n_prompt++] = v;
        if (!ok) {
            fprintf(stderr, "generate: bad argument '%s'\n%s", argv[i], usage);
            return 2;
        }
    }
    if (!model || steps < 0 || n_prompt == 0) {
        fputs(usage, stderr);
        return 2;
    }
    if (expect) {
        int64_t expect_prompt[MAX_TOKENS];
        int n;
        if (read_tokens(expect, 0, expect_prompt, MAX_TOKENS, &n) ||
            read_tokens(expect, 1, want, MAX_TOKENS, &n_want))
            return 1;
        if (n != n_prompt || memcmp(expect_prompt, prompt, sizeof *prompt * (size_t)n))
            return fail("%s: the prompt on its first line is not the one given", expect);
        if (n_want < steps)
            return fail("%s: %d tokens, fewer than the %lld steps asked for", expect, n_want, steps);
    }

    int rc = 1;
    void *lib = NULL, *inst = NULL, **outs = NULL;
    const kiln_model_def *m = NULL;
    /* a path without a slash would make dlopen search the library path */
    char *so = malloc(strlen(model) + 3);
    if (!so)
        return fail("out of memory");
    sprintf(so, "%s%s", strchr(model, '/') ? "" : "./", model);
    lib = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    free(so);
    if (!lib)
        return fail("cannot load %s: %s", model, dlerror());
    const kiln_model_def *(*get)(void);
    void *sym = dlsym(lib, "kiln_model");
    if (!sym) {
        fail("%s: no kiln_model symbol; not a model compiled by kiln", model);
        goto done;
    }
    memcpy(&get, &sym, sizeof get); /* object pointer to function pointer, as POSIX allows */
    if (!(m = get()) || check_model(model, m))
        goto done;
    if (!(outs = calloc((size_t)m->n_outputs, sizeof *outs))) {
        fail("out of memory");
        goto done;
    }
    for (int k = 0; k < m->n_outputs; k++)
        if (!(outs[k] = malloc((size_t)numel(&m->outputs[k]) * dtype_size(m->outputs[k].dtype)))) {
            fail("out of memory");
            goto done;
        }
    char err[512] = "";
    if (m->create(&inst, err, sizeof err) != 0) {
        inst = NULL;
        fail("%s: create failed: %s", model, err[0] ? err : "(no message)");
        goto done;
    }

    int64_t token = prompt[0], pos = 0;
    const void *const in[2] = {&token, &pos};
    int n_got = 0;
    for (; n_got < steps; pos++) {
        token = pos < n_prompt ? prompt[pos] : got[n_got - 1];
        double t0 = now_us();
        int status = m->run(inst, in, outs);
        double t1 = now_us();
        if (status != 0) {
            fail("%s: run failed at position %lld (status %d; past the model's context?)", model,
                 (long long)pos, status);
            goto done;
        }
        int64_t next;
        memcpy(&next, outs[0], sizeof next);
        printf("pos %lld token %lld next %lld time_us %.1f\n", (long long)pos, (long long)token,
               (long long)next, t1 - t0);
        if (pos >= n_prompt - 1)
            got[n_got++] = next;
    }
    printf("generated");
    for (int k = 0; k < n_got; k++)
        printf(" %lld", (long long)got[k]);
    printf("\n");
    rc = 0;
    if (expect)
        for (int k = 0; k < n_got; k++)
            if (got[k] != want[k]) {
                rc = fail("token %d is %lld, %s expects %lld", k, (long long)got[k], expect,
                          (long long)want[k]);
                break;
            }
    if (expect && rc == 0)
        printf("all %d tokens match %s\n", n_got, expect);
done:
    if (inst)
        m->destroy(inst);
    if (outs)
        for (int k = 0; k < m->n_outputs; k++)
            free(outs[k]);
    free(outs);
    if (lib)
        dlclose(lib);
    return rc;
}
