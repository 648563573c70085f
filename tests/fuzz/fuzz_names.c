/* libFuzzer target: names are data. The input's bytes, split at NUL bytes, name a
 * small fixed model (the model, its inputs, params and values, some of them
 * outputs), written in the language with its escapes; the model runs through the
 * whole pipeline to the generated source (C, with and without profiling, CUDA
 * kernels and host, emulated or not, and the --header file), and that source must be
 * the source of the same model with plain names (n0, n1, ...) but for the text of
 * comments and string literals and the tails of value identifiers (`v3_...`):
 *
 *   - both are cut into C tokens (comments, string and character literals,
 *     identifiers, numbers, punctuation) and compared token by token, so that no
 *     comment or literal ends anywhere but where kiln ends it and no code,
 *     definition or directive is added or lost;
 *   - a comment or literal that differs holds printable ASCII only, no `??` (a
 *     trigraph) and, for a comment, no `/` `*` inside; the source holds as many
 *     backslash-newlines (line splices) as the reference;
 *   - the model prints and reparses to the same text, with every name kept.
 *
 * For one input in 64 (by a hash of it; every input with FUZZ_NAMES_COMPILE=1 in
 * the environment) the C is also compiled by the system compiler (codegen/cc.c):
 * it must compile, define exactly the symbols (nm) of the plain model's, and, once
 * loaded, give the model's and its inputs' and outputs' names byte for byte. */
#include "codegen/codegen.h"
#include "frontend/frontend.h"
#include "passes/passes.h"
#include "kiln/model.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { N_NAMES = 14, N_SOURCES = 7 };

/* The checker's own branches are no coverage to steer by, and instrumenting them
 * would make every run several times slower. */
#if defined(__clang__) && __clang_major__ >= 13
#define CHECKER __attribute__((no_sanitize("coverage")))
#else
#define CHECKER
#endif

/* The model, with %A for the first name, %B for the second, ...: a chain of
 * elementwise ops the passes fuse, a reduction, a matmul, and a conv with a relu
 * fused into its epilogue, through the NHWC layout's transposes. */
static const char *const model_text[] = {
    "model %A\n",
    "input %B : f32[2, 3]\n",
    "input %K : f32[1, 1, 4, 4]\n",
    "param %C : f32[3] = fill(0.5)\n",
    "param %G : f32[3, 4] = fill(0.25)\n",
    "param %L : f32[2, 1, 3, 3] = fill(0.125)\n",
    "%D = mul(%B, %C)\n",
    "%E = relu(%D)\n",
    "%F = sum(%D)\n",
    "%H = matmul(%E, %G)\n",
    "%I = tanh(%H)\n",
    "%J = add(%I, %I)\n",
    "%M = conv(%K, %L, pads=1)\n",
    "%N = relu(%M)\n",
    "output %E, %F, %J, %N\n",
};
static const int inputs[] = {'B' - 'A', 'K' - 'A'}, outputs[] = {'E' - 'A', 'F' - 'A', 'J' - 'A', 'N' - 'A'};

static bool ready;

static void fail(const char *what, const char *detail) {
    fprintf(stderr, "fuzz_names: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    abort();
}

/* ---- The model's text ---- */

static void put_quoted(Str *out, const char *s) {
    str_printf(out, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            str_printf(out, "\\%c", c);
        else if (c == '\n')
            str_printf(out, "\\n");
        else if (c < 32 || c == 127)
            str_printf(out, "\\x%02x", c);
        else
            str_printf(out, "%c", c);
    }
    str_printf(out, "\"");
}

static void write_model(char *const *names, Str *out) {
    for (size_t l = 0; l < sizeof model_text / sizeof *model_text; l++)
        for (const char *p = model_text[l]; *p; p++)
            if (*p == '%')
                put_quoted(out, names[*++p - 'A']);
            else
                str_printf(out, "%c", *p);
}

/* ---- C tokens ---- */

typedef struct {
    char kind; /* i identifier, n number, c comment, s string, h character, p punctuation, E unterminated */
    const char *s;
    int len;
} Tok;

typedef struct {
    Tok *t;
    int n, cap;
    int splices; /* backslash-newlines */
} Toks;

CHECKER static bool is_ident(int c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

CHECKER static void push(Toks *ts, char kind, const char *s, const char *e) {
    if (ts->n == ts->cap) {
        ts->cap = ts->cap ? 2 * ts->cap : 4096;
        ts->t = realloc(ts->t, sizeof *ts->t * (size_t)ts->cap);
        if (!ts->t)
            fail("out of memory", NULL);
    }
    ts->t[ts->n++] = (Tok){kind, s, (int)(e - s)};
}

/* A literal from its opening quote q to the closing one, escapes skipped; a line
 * break or the end before it leaves it unterminated. */
CHECKER static const char *literal_end(const char *p, char q) {
    for (p++; *p && *p != q && *p != '\n'; p++)
        if (*p == '\\' && p[1])
            p++;
    return *p == q ? p + 1 : NULL;
}

CHECKER static void tokenize(const char *s, Toks *ts) {
    ts->n = ts->splices = 0;
    for (const char *p = s; *p;) {
        const char *b = p;
        if (*p == '\\' && p[1] == '\n') {
            ts->splices++;
            p += 2;
        } else if (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == '\f' || *p == '\v') {
            p++;
        } else if (p[0] == '/' && p[1] == '/') {
            p += strcspn(p, "\n");
            push(ts, 'c', b, p);
        } else if (p[0] == '/' && p[1] == '*') {
            const char *e = strstr(p + 2, "*/");
            p = e ? e + 2 : p + strlen(p);
            push(ts, e ? 'c' : 'E', b, p);
        } else if (*p == '"' || *p == '\'') {
            const char *e = literal_end(p, *p);
            p = e ? e : p + strcspn(p, "\n");
            push(ts, !e ? 'E' : *b == '"' ? 's' : 'h', b, p);
        } else if (is_ident((unsigned char)*p) && !(*p >= '0' && *p <= '9')) {
            while (is_ident((unsigned char)*p))
                p++;
            push(ts, 'i', b, p);
        } else if ((*p >= '0' && *p <= '9') || (*p == '.' && p[1] >= '0' && p[1] <= '9')) {
            for (p++; is_ident((unsigned char)*p) || *p == '.' ||
                      ((*p == '+' || *p == '-') && strchr("eEpP", p[-1]));
                 p++)
                ;
            push(ts, 'n', b, p);
        } else {
            push(ts, 'p', b, p + 1);
            p++;
        }
    }
}

/* The length of an identifier's part that must match: `v12_` of `v12_layer1`. */
CHECKER static int ident_key(const Tok *t) {
    int k = 1;
    if (t->len < 3 || t->s[0] != 'v' || !(t->s[1] >= '0' && t->s[1] <= '9'))
        return t->len;
    while (k < t->len && t->s[k] >= '0' && t->s[k] <= '9')
        k++;
    return k < t->len && t->s[k] == '_' ? k + 1 : t->len;
}

/* A comment or literal that differs from the plain model's: printable ASCII, no
 * trigraph, and no comment opened or closed inside a comment. */
CHECKER static void check_text(const Tok *t, const char *where) {
    char shown[200];
    snprintf(shown, sizeof shown, "%s: %.*s", where, t->len < 150 ? t->len : 150, t->s);
    for (int i = 0; i < t->len; i++)
        if ((unsigned char)t->s[i] < 32 || (unsigned char)t->s[i] > 126)
            fail("a byte outside printable ASCII in a comment or literal", shown);
    for (int i = 0; i + 1 < t->len; i++)
        if (t->s[i] == '?' && t->s[i + 1] == '?')
            fail("a trigraph in a comment or literal", shown);
    if (t->kind == 'c' && t->s[1] == '*')
        for (int i = 2; i + 3 < t->len; i++)
            if ((t->s[i] == '/' && t->s[i + 1] == '*') || (t->s[i] == '*' && t->s[i + 1] == '/'))
                fail("a comment opened or closed inside a comment", shown);
}

CHECKER static void compare(const Toks *got, const Toks *want, const char *where) {
    char shown[400];
    if (got->splices != want->splices)
        fail("a line splice (backslash-newline) that kiln did not write", where);
    for (int i = 0; i < got->n && i < want->n; i++) {
        const Tok *a = &got->t[i], *b = &want->t[i];
        snprintf(shown, sizeof shown, "%s, token %d: got `%.*s`, want `%.*s`", where, i,
                 a->len < 150 ? a->len : 150, a->s, b->len < 150 ? b->len : 150, b->s);
        if (a->kind == 'E')
            fail("an unterminated comment or literal", shown);
        if (a->kind != b->kind)
            fail("the source's tokens differ from the plain model's", shown);
        bool text = a->kind == 'c' || a->kind == 's' || a->kind == 'h';
        if (text && (a->len != b->len || memcmp(a->s, b->s, (size_t)a->len) != 0))
            check_text(a, where);
        if (!text &&
            (a->kind != 'i' || ident_key(a) != ident_key(b) || memcmp(a->s, b->s, (size_t)ident_key(a))) &&
            (a->len != b->len || memcmp(a->s, b->s, (size_t)a->len) != 0))
            fail("the source's tokens differ from the plain model's", shown);
    }
    if (got->n != want->n)
        fail("the source has a different number of tokens than the plain model's", where);
}

/* ---- The pipeline ---- */

typedef struct {
    Str src[N_SOURCES]; /* C; CUDA kernels and host; emulated CUDA kernels and host; C
                           with profiling; the header */
    Program *c;         /* the C program, for a real compile */
    Graph *g;
    TensorList weights;
    SrcFile *file;
} Generated;

static const char *const source_names[N_SOURCES] = {
    "C",     "CUDA kernels", "CUDA host", "emulated CUDA kernels", "emulated CUDA host", "C with profiling",
    "header"};

static void generated_free(Generated *gen) {
    for (int i = 0; i < N_SOURCES; i++)
        str_free(&gen->src[i]);
    program_free(gen->c);
    graph_free(gen->g);
    tensors_free(&gen->weights);
    srcfile_free(gen->file);
    *gen = (Generated){0};
}

/* The printed model reparses and prints the same, with every name kept. */
static void check_printed(const Graph *g, char *const *names) {
    char *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    FILE *f = open_memstream(&a, &na);
    print_graph(g, f);
    fclose(f);
    Diag d;
    diag_init(&d, stderr);
    SrcFile *src = srcfile_from_string("printed.kiln", a);
    Graph *h = src ? parse_model(src, &d) : NULL;
    if (!h)
        fail("the printed model does not parse", a);
    f = open_memstream(&b, &nb);
    print_graph(h, f);
    fclose(f);
    if (na != nb || memcmp(a, b, na) != 0)
        fail("printing the printed model changes it", a);
    if (strcmp(h->name, names[0]) != 0)
        fail("the model's name changed in print", h->name);
    for (int i = 1; i < N_NAMES; i++)
        if (graph_find(h, names[i]) < 0)
            fail("a name was lost in print", a);
    free(a), free(b);
    graph_free(h);
    srcfile_free(src);
}

static void generate(char *const *names, Generated *gen, bool check_print) {
    Str text = {0};
    write_model(names, &text);
    Diag d;
    diag_init(&d, stderr);
    gen->file = srcfile_from_string("names.kiln", text.s);
    str_free(&text);
    if (!gen->file || !(gen->g = parse_model(gen->file, &d)) || verify_graph(gen->g, &d))
        fail("the model does not parse", gen->file ? gen->file->text : NULL);
    if (check_print)
        check_printed(gen->g, names);
    PipelineOptions po = {.level = 2, .verify = true, .lower = true};
    if (pipeline_run(gen->g, &gen->weights, &po, &d))
        fail("the passes fail", NULL);
    if (!(gen->c = program_lower(gen->g, &gen->weights, &(LowerOptions){TARGET_C, true, true, NULL}, &d)) ||
        emit_c_model(gen->c, &gen->src[0], &d))
        fail("C generation fails", NULL);
    gen->c->profile = true;
    if (emit_c_model(gen->c, &gen->src[5], &d))
        fail("C generation with profiling fails", NULL);
    gen->c->profile = false;
    emit_header(gen->g, &gen->src[6]);
    Program *cuda = program_lower(gen->g, &gen->weights, &(LowerOptions){TARGET_CUDA, true, true, NULL}, &d);
    for (int emulated = 0; emulated < 2; emulated++) {
        Str *kernels = &gen->src[1 + 2 * emulated], *host = &gen->src[2 + 2 * emulated];
        if (!cuda || emit_cuda_kernels(cuda, emulated, kernels, &d) ||
            emit_cuda_model(cuda, kernels, emulated, host, &d))
            fail("CUDA generation fails", NULL);
    }
    program_free(cuda);
}

/* ---- Compiling for real ---- */

static char work_dir[64];

/* The compiled model's defined symbols, sorted, one a line (malloc'ed). */
static char *compile_symbols(Generated *gen, const char *so) {
    Diag d;
    diag_init(&d, stderr);
    Source src = {.host = gen->src[0]};
    if (cc_compile_so(&src, gen->c, so, &(Toolchain){0}, &d))
        fail("the generated C does not compile", NULL);
    char cmd[256], *out = NULL;
    size_t n = 0;
    snprintf(cmd, sizeof cmd, "nm --defined-only '%s' | awk '{print $3}' | sort", so);
    FILE *p = popen(cmd, "r"), *f = open_memstream(&out, &n);
    char line[512];
    while (p && fgets(line, sizeof line, p))
        fputs(line, f);
    fclose(f);
    if (!p || pclose(p) != 0)
        fail("nm fails", cmd);
    return out;
}

static void check_loaded(const char *so, char *const *names) {
    void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    const kiln_model_def *(*model)(void) = h ? (const kiln_model_def *(*)(void))dlsym(h, "kiln_model") : NULL;
    if (!model)
        fail("the compiled model does not load", dlerror());
    const kiln_model_def *def = model();
    if (strcmp(def->name, names[0]) != 0)
        fail("the compiled model's name differs", def->name);
    for (size_t i = 0; i < sizeof inputs / sizeof *inputs; i++)
        if (strcmp(def->inputs[i].name, names[inputs[i]]) != 0)
            fail("an input's name differs", def->inputs[i].name);
    for (size_t k = 0; k < sizeof outputs / sizeof *outputs; k++)
        if (strcmp(def->outputs[k].name, names[outputs[k]]) != 0)
            fail("an output's name differs", def->outputs[k].name);
    dlclose(h);
}

/* ---- The target ---- */

static char *plain[N_NAMES];
static Generated reference;
static Toks reference_toks[N_SOURCES], toks;
static char *reference_symbols;

static void remove_work_dir(void) {
    rmdir(work_dir);
}

static void setup(void) {
    ready = true;
    for (int i = 0; i < N_NAMES; i++) {
        char buf[8];
        snprintf(buf, sizeof buf, "n%d", i);
        plain[i] = strdup(buf);
    }
    generate(plain, &reference, false);
    for (int i = 0; i < N_SOURCES; i++)
        tokenize(reference.src[i].s, &reference_toks[i]);
    snprintf(work_dir, sizeof work_dir, "/tmp/fuzz_names-XXXXXX");
    if (!mkdtemp(work_dir))
        fail("cannot make a temporary directory", NULL);
    atexit(remove_work_dir);
}

/* names[i]: the i-th NUL-separated part of the input; an empty or missing one, or
 * one that repeats an earlier name, gets a suffix of its own. */
static void split_names(const uint8_t *data, size_t size, char **names) {
    size_t at = 0;
    for (int i = 0; i < N_NAMES; i++) {
        size_t len = 0;
        while (at + len < size && data[at + len])
            len++;
        char *s = malloc(len + 16);
        if (!s)
            fail("out of memory", NULL);
        memcpy(s, data + at, len);
        s[len] = 0;
        at = at + len < size ? at + len + 1 : size;
        for (int k = 0; len == 0 || k < i;) {
            if (len == 0 || (k < i && strcmp(names[k], s) == 0)) {
                snprintf(s + len, 16, "#%d", i);
                len = strlen(s);
                k = 0;
            } else {
                k++;
            }
        }
        names[i] = s;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!ready)
        setup();
    char *names[N_NAMES];
    split_names(data, size, names);
    Generated gen = {0};
    generate(names, &gen, true);
    for (int i = 0; i < N_SOURCES; i++) {
        tokenize(gen.src[i].s, &toks);
        compare(&toks, &reference_toks[i], source_names[i]);
    }
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < size; i++)
        h = (h ^ data[i]) * 0x100000001b3ull;
    const char *always = getenv("FUZZ_NAMES_COMPILE");
    if ((always && *always == '1') || h % 64 == 0) {
        char so[128];
        snprintf(so, sizeof so, "%s/plain.so", work_dir);
        if (!reference_symbols)
            reference_symbols = compile_symbols(&reference, so);
        unlink(so);
        snprintf(so, sizeof so, "%s/model.so", work_dir);
        char *symbols = compile_symbols(&gen, so);
        if (strcmp(symbols, reference_symbols) != 0)
            fail("the compiled model defines other symbols than the plain model's", symbols);
        check_loaded(so, names);
        free(symbols);
        unlink(so);
    }
    generated_free(&gen);
    for (int i = 0; i < N_NAMES; i++)
        free(names[i]);
    return 0;
}
