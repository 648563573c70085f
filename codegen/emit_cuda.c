/* The CUDA emitter: a lowered Program as CUDA C++ kernels and the host code that
 * loads and launches them.
 *
 * Kernel bodies come from lowering unchanged, as for C; only the language
 * description differs: a LOOP kernel gives each iteration a thread (256 a block),
 * a CALL kernel runs as one thread, and the arguments are one KilnArgs by value.
 * A K_GEMM kernel (lower.c's kernel_gemm) becomes a tiled GEMM: each block of 256
 * threads computes a 64 x 64 tile of one batch item's product, staging 16-deep
 * slices of A and B in shared memory (A(r, kk) for 64 rows, B(kk, q) for 64
 * columns, loaded along whichever index is contiguous in memory), each thread
 * accumulating a 4 x 4 grid of elements 16 apart in registers, then storing each
 * element through the lowering's body (bias, epilogue). Grid: x the row tiles, y
 * the column tiles, z the batch.
 *
 * The host code is C: the CUDA runtime (cuda/cuda_rt.c) and the model's tables,
 * with the kernel source as a string that NVRTC compiles when an instance is
 * created. Emulated, the kernels are C++ compiled beside the host code and linked
 * into the model, and cuda/emulate.h runs them. */
#include "codegen.h"

#include <stdlib.h>
#include <string.h>

extern const char kiln_cuda_runtime_text[];
extern const char kiln_cuda_emulate_text[];

enum { BLOCK = 256, TILE = 64, TILE_DEPTH = 16, MAX_GRID_YZ = 65535 };
static const int64_t MAX_GRID_X = 2147483647;

const Lang lang_cuda = {
    .name = "cuda",
    .kernel_decl = "extern \"C\" __global__ void",
    .params = "(KilnArgs args, int64_t count)",
    .args = "args.",
    .restrict_kw = "__restrict__ ",
    .loop_open = "int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < count) {",
    .loop_close = "}",
    .call_open = "(void)count;",
};

static const char *const args_struct = "typedef struct {\n"
                                       "    const float *const *in;\n"
                                       "    float *const *out;\n"
                                       "    float *ws;\n"
                                       "    const float *wt;\n"
                                       "    float *st;\n"
                                       "} KilnArgs;\n\n";

/* The loop staging one 16-deep slice of an operand in shared memory: `tile` gets
 * element (index, kk) at [kk - tile_k][index - base], zero outside the matrix. */
static void emit_stage(Str *out, const char *tile, const char *index, const char *base, int64_t extent,
                       int64_t depth, bool depth_inner, const Str *load) {
    str_printf(out, "        for (int l = threadIdx.x; l < %d; l += %d) {\n", TILE * TILE_DEPTH, BLOCK);
    if (depth_inner) /* consecutive threads read consecutive kk */
        str_printf(out, "            int kl = l %% %d, il = l / %d;\n", TILE_DEPTH, TILE_DEPTH);
    else
        str_printf(out, "            int kl = l / %d, il = l %% %d;\n", TILE, TILE);
    str_printf(out, "            int64_t %s = %s + il, kk = tile_k + kl;\n", index, base);
    str_printf(out, "            float v = 0.0f;\n");
    str_printf(out, "            if (%s < %lld && kk < %lld) {\n", index, (long long)extent,
               (long long)depth);
    indent_lines(out, load->s ? load->s : "", 16);
    str_printf(out, "            }\n            %s[kl][il] = v;\n        }\n", tile);
}

static void emit_gemm(const Program *p, const Kernel *k, Str *out) {
    c_comment(out, "%s", k->comment);
    str_printf(out, "\n%s __launch_bounds__(%d) %s%s {\n", lang_cuda.kernel_decl, BLOCK, k->name,
               lang_cuda.params);
    emit_kernel_decls(p, &lang_cuda, k, out);
    /* a row of 65: staging along kk writes a column without bank conflicts */
    str_printf(out,
               "    __shared__ float tile_a[%d][%d], tile_b[%d][%d];\n"
               "    (void)count;\n"
               "    const int64_t bi = blockIdx.z, tile_r = (int64_t)blockIdx.x * %d, tile_q = "
               "(int64_t)blockIdx.y * %d;\n"
               "    const int tx = threadIdx.x %% 16, ty = threadIdx.x / 16;\n"
               "    float sums[4][4] = {{0.0f}};\n"
               "    (void)bi;\n",
               TILE_DEPTH, TILE + 1, TILE_DEPTH, TILE + 1, TILE, TILE);
    str_printf(out, "    for (int64_t tile_k = 0; tile_k < %lld; tile_k += %d) {\n", (long long)k->depth,
               TILE_DEPTH);
    emit_stage(out, "tile_a", "r", "tile_r", k->m, k->depth, k->a_depth_inner, &k->load_a);
    emit_stage(out, "tile_b", "q", "tile_q", k->n, k->depth, k->b_depth_inner, &k->load_b);
    str_printf(out,
               "        __syncthreads();\n"
               "        for (int kl = 0; kl < %d; kl++) {\n"
               "            float a[4], b[4];\n"
               "            for (int u = 0; u < 4; u++) {\n"
               "                a[u] = tile_a[kl][ty + 16 * u];\n"
               "                b[u] = tile_b[kl][tx + 16 * u];\n"
               "            }\n"
               "            for (int u = 0; u < 4; u++)\n"
               "                for (int w = 0; w < 4; w++)\n"
               "                    sums[u][w] += a[u] * b[w];\n"
               "        }\n"
               "        __syncthreads();\n"
               "    }\n"
               "    for (int u = 0; u < 4; u++)\n"
               "        for (int w = 0; w < 4; w++) {\n"
               "            int64_t r = tile_r + ty + 16 * u, q = tile_q + tx + 16 * w;\n"
               "            if (r < %lld && q < %lld) {\n"
               "                float acc = sums[u][w];\n",
               TILE_DEPTH, (long long)k->m, (long long)k->n);
    indent_lines(out, k->body.s ? k->body.s : "", 16);
    str_printf(out, "            }\n        }\n}\n\n");
}

int emit_cuda_kernels(const Program *p, bool emulated, Str *out, Diag *d) {
    c_comment(out, "Generated by kiln from model '%s': its kernels for the CUDA target.", p->g->name);
    str_printf(out, "\n\n");
    if (emulated)
        str_printf(out, "#include <stdint.h>\n\n");
    else /* index arithmetic declares every dim of a multi-index, and a kernel uses
            those it needs: the compiler drops the others without a word */
        str_printf(out,
                   "typedef long long int64_t;\ntypedef int int32_t;\n"
                   "#define INFINITY __int_as_float(0x7f800000)\n#define NAN __int_as_float(0x7fffffff)\n\n"
                   "#pragma nv_diag_suppress 177 /* declared but never referenced */\n"
                   "#pragma nv_diag_suppress 550 /* set but never used */\n\n");
    str_printf(out, "%s", args_struct);
    if (emulated)
        str_printf(out, "%s\n", kiln_cuda_emulate_text);
    for (int k = 0; k < p->n_kernels; k++) {
        if (p->kernels[k].kind == K_GEMM)
            emit_gemm(p, &p->kernels[k], out);
        else
            emit_kernel(p, &lang_cuda, &p->kernels[k], out);
    }
    if (out->oom)
        return diag_error(d, (Loc){0}, "out of memory generating CUDA");
    return 0;
}

/* ---- The host side ---- */

/* A kernel's launch: grid and block; -1 after a diagnostic when the grid is larger
 * than CUDA allows. */
static int launch_of(const Kernel *k, int64_t grid[3], int *block, Diag *d) {
    grid[0] = grid[1] = grid[2] = 1;
    *block = 1;
    if (k->kind == K_LOOP) {
        grid[0] = (k->count + BLOCK - 1) / BLOCK;
        *block = BLOCK;
    } else if (k->kind == K_GEMM) {
        grid[0] = (k->m + TILE - 1) / TILE;
        grid[1] = (k->n + TILE - 1) / TILE;
        grid[2] = k->batch;
        *block = BLOCK;
    }
    if (grid[0] > MAX_GRID_X || grid[1] > MAX_GRID_YZ || grid[2] > MAX_GRID_YZ)
        return diag_error(d, k->node->loc,
                          "%s: its grid of %lld x %lld x %lld blocks is more than CUDA launches", k->comment,
                          (long long)grid[0], (long long)grid[1], (long long)grid[2]);
    return 0;
}

/* text as a C string literal, a line of source per line of the literal. */
static void string_literal(Str *out, const char *text) {
    for (const char *line = text; *line;) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line + 1) : strlen(line);
        char buf[4096];
        while (len > 0) { /* long lines in pieces */
            size_t part = len < sizeof buf - 1 ? len : sizeof buf - 1;
            memcpy(buf, line, part);
            buf[part] = 0;
            str_printf(out, "    \"");
            c_string(out, buf);
            str_printf(out, "\"\n");
            line += part;
            len -= part;
        }
    }
}

static void emit_byte_sizes(Str *out, const Program *p, const char *what, const int *ids, int n) {
    str_printf(out, "static const int64_t kiln_%s_bytes[] = {", what);
    for (int i = 0; i < n; i++)
        str_printf(out, "%s%lld", i ? ", " : "", (long long)(type_numel(&p->g->values[ids[i]].type) * 4));
    str_printf(out, "%s};\n", n ? "" : "0");
}

int emit_cuda_model(const Program *p, const Str *kernels, bool emulated, Str *out, Diag *d) {
    c_comment(out, "Generated by kiln from model '%s' for the CUDA target%s.", p->g->name,
              emulated ? ", emulated on the CPU" : "");
    str_printf(out, "\n\n");
    if (emulated)
        str_printf(out, "#define KILN_CUDA_EMULATE 1\n");
    emit_runtime(out, kiln_cuda_runtime_text);
    emit_weights_blob(p, out);
    if (emulated) {
        str_printf(out,
                   "/* The kernels, compiled beside this file from cuda/emulate.h and their source. */\n");
        for (int k = 0; k < p->n_kernels; k++)
            str_printf(out, "void %s(KilnArgs args, int64_t count);\n", p->kernels[k].name);
        str_printf(out, "static const KilnCudaKernelFn kiln_emulated[] = {");
        for (int k = 0; k < p->n_kernels; k++)
            str_printf(out, "%s%s", k ? ", " : "", p->kernels[k].name);
        str_printf(out, "%s};\nstatic const char kiln_cuda_source[] = \"\";\n\n", p->n_kernels ? "" : "0");
    } else {
        str_printf(out, "/* The kernels, compiled by NVRTC when an instance is created. */\n"
                        "static const char kiln_cuda_source[] =\n");
        string_literal(out, kernels->s ? kernels->s : "");
        str_printf(out, "    \"\";\n\n");
    }
    str_printf(out, "static const KilnCudaLaunch kiln_launches[] = {\n");
    for (int k = 0; k < p->n_kernels; k++) {
        int64_t grid[3];
        int block;
        if (launch_of(&p->kernels[k], grid, &block, d))
            return -1;
        str_printf(out, "    {\"");
        c_string(out, p->kernels[k].name);
        str_printf(out, "\", %lld, {%lld, %lld, %lld}, %d, %d},\n", (long long)p->kernels[k].count,
                   (long long)grid[0], (long long)grid[1], (long long)grid[2], block,
                   p->kernels[k].kind == K_GEMM);
    }
    str_printf(out, "%s};\n", p->n_kernels ? "" : "    {0}\n");
    if (p->profile)
        emit_profile_tables(p, out);
    emit_byte_sizes(out, p, "input", p->inputs, p->n_inputs);
    emit_byte_sizes(out, p, "output", p->g->outputs, p->g->n_outputs);
    str_printf(out,
               "\nstatic const KilnCudaProgram program = {\n"
               "    kiln_cuda_source, %d, kiln_launches, %s,\n"
               "    %lld, %lld, %lld, kiln_weights_blob,\n"
               "    %d, %d, kiln_input_bytes, kiln_output_bytes, %s,\n"
               "};\n\n"
               "static int model_create(void **instance, char *err, size_t errlen) {\n"
               "    return kiln_cuda_create(&program, instance, err, errlen);\n"
               "}\n",
               p->n_kernels, emulated ? "kiln_emulated" : "NULL", (long long)p->workspace_bytes,
               (long long)p->state_bytes, (long long)p->weights_bytes, p->n_inputs, p->g->n_outputs,
               p->profile ? "kiln_prof_seconds" : "NULL");
    emit_model_def(p, out, "kiln_cuda_run", "kiln_cuda_destroy");
    if (out->oom)
        return diag_error(d, (Loc){0}, "out of memory generating the CUDA model");
    return 0;
}

/* ---- Either target ---- */

int program_source(const Program *p, bool cuda_emulated, Source *src, Diag *d) {
    *src = (Source){0};
    if (p->target == TARGET_C)
        return emit_c_model(p, &src->host, d);
    src->emulated = cuda_emulated;
    return emit_cuda_kernels(p, src->emulated, &src->kernels, d) ||
                   emit_cuda_model(p, &src->kernels, src->emulated, &src->host, d)
               ? -1
               : 0;
}

void source_free(Source *src) {
    str_free(&src->host);
    str_free(&src->kernels);
}
