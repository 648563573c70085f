/* libFuzzer target for the checks a shared object passes before dlopen
 * (runtime/elf_check.c): any bytes must be accepted or refused with a message,
 * never a crash, an out-of-bounds read or a leak. The bytes are written to a
 * memfd, since the checks read a file; nothing is ever dlopened. The seed is a
 * 1.5 KB stripped shared object that defines kiln_model. */
#define _GNU_SOURCE
#include "runtime/module.h"

#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int fd = -1;
    if (fd < 0 && (fd = memfd_create("fuzz_elf", MFD_CLOEXEC)) < 0)
        return 0;
    if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size)
        return 0;
    kiln_error err;
    kiln_check_elf_fd(fd, "fuzz.so", &err);
    return 0;
}
