/* nvrtc_check FILE.cu...: compiles each file of CUDA kernels with NVRTC, as a
 * CUDA model's create does (cuda/cuda_rt.c), for sm_90 (or $KILN_NVRTC_ARCH), and
 * fails on any error or warning. Exit status: 0 all clean, 1 a file failed or
 * warned, 77 (CTest's skip) when NVRTC is not installed. */
#include "../../cuda/cuda_rt.c"

int main(int argc, char **argv) {
    KilnCudaApi api = {0};
    char err[2048];
    if (kiln_cuda_load_nvrtc(&api, err, sizeof err)) {
        printf("skipped: %s\n", err);
        return 77;
    }
    const char *arch_env = getenv("KILN_NVRTC_ARCH");
    int arch = arch_env && *arch_env ? atoi(arch_env) : 90, failed = 0;
    for (int i = 1; i < argc; i++) {
        size_t len = 0;
        unsigned char *text = kiln_cuda_read(argv[i], &len), *cubin = NULL;
        char *source = text ? realloc(text, len + 1) : NULL;
        if (!source) {
            printf("%s: cannot read it\n", argv[i]);
            free(text);
            failed = 1;
            continue;
        }
        source[len] = 0;
        if (kiln_cuda_nvrtc_compile(&api, source, arch, 1, &cubin, &len, err, sizeof err)) {
            printf("%s: %s\n", argv[i], err);
            failed = 1;
        } else {
            printf("%s: %zu bytes of sm_%d code, no warning\n", argv[i], len, arch);
        }
        free(cubin);
        free(source);
    }
    return failed;
}
