/* The checks a shared object passes before dlopen may map it.
 *
 * dlopen maps a file's segments and runs its constructors; a file cut short maps
 * pages past its end, and touching them raises SIGBUS, which no error path can
 * catch. So the file is read here with pread first, never mapped: it must be a
 * regular file holding an ELF shared object for this machine (class, byte order,
 * e_machine), and every program header's and section header's bytes must lie inside
 * it, the tables themselves included. Then the dynamic symbol table must define
 * kiln_model, so that a file that is not a kiln model is refused before any of its
 * code (constructors included) runs. What is checked is the file as it stands: one
 * truncated between this check and dlopen still faults, which only the writer's
 * atomic rename prevents (kiln compile writes its .so that way). */
#include "module.h"

#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__x86_64__)
#define HOST_MACHINE EM_X86_64
#elif defined(__aarch64__)
#define HOST_MACHINE EM_AARCH64
#elif defined(__powerpc64__)
#define HOST_MACHINE EM_PPC64
#elif defined(__riscv) && __riscv_xlen == 64
#define HOST_MACHINE EM_RISCV
#endif

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define HOST_DATA ELFDATA2MSB
#else
#define HOST_DATA ELFDATA2LSB
#endif

/* The symbol table kiln_model is looked for in is read whole; a model's is tiny. */
enum { MAX_DYNSYM_BYTES = 64 << 20 };

typedef struct {
    int fd;
    uint64_t size;
    const char *name;
    kiln_error *err;
} File;

/* off + len within the file, without overflow. */
static bool inside(const File *f, uint64_t off, uint64_t len) {
    return off <= f->size && len <= f->size - off;
}

static int truncated(const File *f, const char *what, uint64_t off, uint64_t len) {
    return kiln_set_error(f->err,
                          "cannot load '%s': the file is truncated or corrupt: its %s (bytes %llu to %llu) "
                          "lies past its end (%llu bytes)",
                          f->name, what, (unsigned long long)off, (unsigned long long)(off + len),
                          (unsigned long long)f->size);
}

static int read_at(const File *f, void *buf, size_t len, uint64_t off) {
    for (size_t got = 0; got < len;) {
        ssize_t r = pread(f->fd, (char *)buf + got, len - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return kiln_set_error(f->err, "cannot load '%s': %s", f->name,
                                  r < 0 ? strerror(errno) : "the file shrank while it was read");
        got += (size_t)r;
    }
    return 0;
}

static int check_header(const File *f, const Elf64_Ehdr *h) {
    if (f->size < EI_NIDENT || memcmp(h->e_ident, ELFMAG, SELFMAG) != 0)
        return kiln_set_error(f->err, "cannot load '%s': it is not an ELF shared object (no ELF magic)",
                              f->name);
    if (f->size < sizeof *h)
        return truncated(f, "ELF header", 0, sizeof *h);
    if (h->e_ident[EI_CLASS] != ELFCLASS64 || h->e_ident[EI_DATA] != HOST_DATA)
        return kiln_set_error(f->err, "cannot load '%s': it is an ELF file for another machine (%s, %s)",
                              f->name, h->e_ident[EI_CLASS] == ELFCLASS64 ? "64-bit" : "not 64-bit",
                              h->e_ident[EI_DATA] == ELFDATA2LSB ? "little-endian" : "not little-endian");
#ifdef HOST_MACHINE
    if (h->e_machine != HOST_MACHINE)
        return kiln_set_error(f->err,
                              "cannot load '%s': it is an ELF file for another machine (e_machine %u)",
                              f->name, (unsigned)h->e_machine);
#endif
    if (h->e_type != ET_DYN)
        return kiln_set_error(f->err,
                              "cannot load '%s': it is an ELF file but not a shared object (e_type %u)",
                              f->name, (unsigned)h->e_type);
    if ((h->e_phnum && h->e_phentsize != sizeof(Elf64_Phdr)) ||
        (h->e_shnum && h->e_shentsize != sizeof(Elf64_Shdr)))
        return kiln_set_error(f->err, "cannot load '%s': its ELF header gives a wrong header entry size",
                              f->name);
    return 0;
}

/* Every segment inside the file. */
static int check_segments(const File *f, const Elf64_Ehdr *h) {
    uint64_t table = (uint64_t)h->e_phnum * sizeof(Elf64_Phdr);
    if (!inside(f, h->e_phoff, table))
        return truncated(f, "program header table", h->e_phoff, table);
    if (h->e_phnum == 0)
        return kiln_set_error(f->err, "cannot load '%s': it has no program headers", f->name);
    Elf64_Phdr *ph = malloc(table);
    if (!ph)
        return kiln_set_error(f->err, "out of memory");
    int rc = read_at(f, ph, table, h->e_phoff);
    for (int i = 0; !rc && i < h->e_phnum; i++)
        if (!inside(f, ph[i].p_offset, ph[i].p_filesz))
            rc = truncated(f, "segment", ph[i].p_offset, ph[i].p_filesz);
    free(ph);
    return rc;
}

/* Whether the dynamic symbol table (table, with its string table strs) defines kiln_model. */
static int find_kiln_model(const File *f, const Elf64_Shdr *table, const Elf64_Shdr *strs, bool *found) {
    if (table->sh_entsize != sizeof(Elf64_Sym) || table->sh_size > MAX_DYNSYM_BYTES ||
        strs->sh_size > MAX_DYNSYM_BYTES)
        return kiln_set_error(f->err, "cannot load '%s': its dynamic symbol table is malformed", f->name);
    Elf64_Sym *syms = malloc(table->sh_size ? table->sh_size : 1);
    char *names = malloc(strs->sh_size + 1);
    int rc = !syms || !names ? kiln_set_error(f->err, "out of memory") : 0;
    if (!rc)
        rc = read_at(f, syms, table->sh_size, table->sh_offset);
    if (!rc)
        rc = read_at(f, names, strs->sh_size, strs->sh_offset);
    if (!rc) {
        names[strs->sh_size] = 0;
        for (size_t i = 0; i < table->sh_size / sizeof *syms && !*found; i++)
            *found = syms[i].st_name < strs->sh_size && syms[i].st_shndx != SHN_UNDEF &&
                     ELF64_ST_TYPE(syms[i].st_info) == STT_FUNC &&
                     strcmp(names + syms[i].st_name, "kiln_model") == 0;
    }
    free(syms);
    free(names);
    return rc;
}

/* Every section inside the file, and kiln_model among the dynamic symbols. */
static int check_sections(const File *f, const Elf64_Ehdr *h) {
    uint64_t table = (uint64_t)h->e_shnum * sizeof(Elf64_Shdr);
    if (!inside(f, h->e_shoff, table))
        return truncated(f, "section header table", h->e_shoff, table);
    Elf64_Shdr *sh = malloc(table ? table : 1);
    if (!sh)
        return kiln_set_error(f->err, "out of memory");
    int rc = read_at(f, sh, table, h->e_shoff);
    const Elf64_Shdr *dynsym = NULL;
    for (int i = 0; !rc && i < h->e_shnum; i++) {
        if (sh[i].sh_type != SHT_NOBITS && !inside(f, sh[i].sh_offset, sh[i].sh_size))
            rc = truncated(f, "section", sh[i].sh_offset, sh[i].sh_size);
        if (sh[i].sh_type == SHT_DYNSYM)
            dynsym = &sh[i];
    }
    bool found = false;
    if (!rc && dynsym && dynsym->sh_link < h->e_shnum)
        rc = find_kiln_model(f, dynsym, &sh[dynsym->sh_link], &found);
    /* a file with no section headers at all (sstrip) is left to dlsym after loading */
    if (!rc && !found && h->e_shnum > 0)
        rc = kiln_set_error(f->err, "'%s' is not a kiln model (it has no kiln_model symbol)", f->name);
    free(sh);
    return rc;
}

int kiln_check_elf_fd(int fd, const char *shown_as, kiln_error *err) {
    struct stat st;
    File f = {fd, 0, shown_as, err};
    Elf64_Ehdr h = {0};
    if (fstat(fd, &st) != 0)
        return kiln_set_error(err, "cannot load '%s': %s", shown_as, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return kiln_set_error(err, "cannot load '%s': it is not a regular file", shown_as);
    f.size = (uint64_t)st.st_size;
    int rc = read_at(&f, &h, f.size < sizeof h ? (size_t)f.size : sizeof h, 0);
    if (!rc)
        rc = check_header(&f, &h);
    if (!rc)
        rc = check_segments(&f, &h);
    if (!rc)
        rc = check_sections(&f, &h);
    return rc;
}

int kiln_check_shared_object(const char *path, const char *shown_as, kiln_error *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return kiln_set_error(err, "cannot load '%s': %s", shown_as, strerror(errno));
    int rc = kiln_check_elf_fd(fd, shown_as, err);
    close(fd);
    return rc;
}
