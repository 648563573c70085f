/* Whole binary files in and out, for the tensor file formats.
 *
 * read_file_bytes reads a file into one buffer: it sizes the buffer from fstat for a
 * regular file and grows it by doubling otherwise (a pipe, /dev/stdin), and refuses
 * anything over a sanity limit rather than trying to allocate it. write_file_atomic
 * writes to a temporary file made with mkstemp beside the target (so the rename
 * stays within one file system) and renames it over the target only once every
 * byte is written and the file closed; on any failure it removes the temporary, so
 * a failed write leaves neither a partial target nor a stray file. */
#include "frontend.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Larger than any model's weights, small enough that a size this big is a mistake. */
static const uint64_t MAX_FILE_BYTES = (uint64_t)1 << 40;

static int too_large(const char *path, uint64_t size, Diag *d) {
    return diag_error(d, (Loc){0}, "cannot read '%s': the file is too large (%llu bytes; the limit is %llu)",
                      path, (unsigned long long)size, (unsigned long long)MAX_FILE_BYTES);
}

static int read_fd(int fd, const char *path, const struct stat *st, unsigned char **buf, size_t *len,
                   Diag *d) {
    /* One byte of slack, so a regular file is read to EOF without growing the buffer. */
    size_t cap = S_ISREG(st->st_mode) && st->st_size > 0 ? (size_t)st->st_size + 1 : 64 * 1024, n = 0;
    unsigned char *data = ir_malloc(cap);
    if (!data)
        return diag_error(d, (Loc){0}, "out of memory reading '%s' (%zu bytes)", path, cap);
    for (;;) {
        if (n == cap) {
            if (cap >= MAX_FILE_BYTES) {
                ir_free(data);
                return too_large(path, n, d);
            }
            unsigned char *bigger = ir_realloc(data, cap * 2);
            if (!bigger) {
                ir_free(data);
                return diag_error(d, (Loc){0}, "out of memory reading '%s' (%zu bytes)", path, cap * 2);
            }
            data = bigger;
            cap *= 2;
        }
        ssize_t r = read(fd, data + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int err = errno;
            ir_free(data);
            return diag_error(d, (Loc){0}, "cannot read '%s': %s", path, strerror(err));
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    *buf = data;
    *len = n;
    return 0;
}

int read_file_bytes(const char *path, unsigned char **buf, size_t *len, Diag *d) {
    *buf = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return diag_error(d, (Loc){0}, "cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    int rc;
    if (fstat(fd, &st) != 0)
        rc = diag_error(d, (Loc){0}, "cannot read '%s': %s", path, strerror(errno));
    else if (S_ISDIR(st.st_mode))
        rc = diag_error(d, (Loc){0}, "cannot read '%s': %s", path, strerror(EISDIR));
    else if (S_ISREG(st.st_mode) && (uint64_t)st.st_size > MAX_FILE_BYTES)
        rc = too_large(path, (uint64_t)st.st_size, d);
    else
        rc = read_fd(fd, path, &st, buf, len, d);
    close(fd);
    return rc;
}

static int write_all(int fd, const unsigned char *p, size_t len) {
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -1;
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

/* The umask where the kernel shows it (Linux 4.7 on), else -1. */
static long proc_umask(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long mask = -1;
    while (f && mask < 0 && fgets(line, sizeof line, f))
        if (strncmp(line, "Umask:", 6) == 0)
            mask = strtol(line + 6, NULL, 8);
    if (f)
        fclose(f);
    return mask;
}

/* Elsewhere umask can only be read by setting it, which for that moment gives files
 * other threads create mode 0666: it is done once, and the process's umask taken to
 * stay what it was then. */
static pthread_once_t umask_once = PTHREAD_ONCE_INIT;
static mode_t umask_at_start;

static void read_umask_once(void) {
    umask_at_start = umask(0);
    umask(umask_at_start);
}

/* mkstemp creates the file 0600; give it the mode fopen would have, 0666 less the
 * umask, read without changing it where the kernel allows (never umask(0) while
 * another thread may be creating a file). */
static mode_t new_file_mode(void) {
    long mask = proc_umask();
    if (mask < 0) {
        pthread_once(&umask_once, read_umask_once);
        mask = umask_at_start;
    }
    return 0666 & ~(mode_t)mask;
}

/* Writes buf to a new temporary file beside path; its name in *tmp (freed by the caller). */
static int write_temp(const char *path, const void *buf, size_t len, char **tmp, Diag *d) {
    size_t n = strlen(path);
    *tmp = ir_malloc(n + sizeof ".XXXXXX");
    if (!*tmp)
        return diag_error(d, (Loc){0}, "out of memory writing '%s'", path);
    memcpy(*tmp, path, n);
    memcpy(*tmp + n, ".XXXXXX", sizeof ".XXXXXX");
    int fd = mkstemp(*tmp);
    if (fd < 0) {
        int err = errno;
        ir_free(*tmp);
        *tmp = NULL;
        return diag_error(d, (Loc){0}, "cannot write '%s': %s", path, strerror(err));
    }
    int err = 0;
    if (write_all(fd, buf, len) != 0 || fchmod(fd, new_file_mode()) != 0)
        err = errno;
    if (close(fd) != 0 && !err)
        err = errno;
    if (err) {
        unlink(*tmp);
        ir_free(*tmp);
        *tmp = NULL;
        return diag_error(d, (Loc){0}, "cannot write '%s': %s", path, strerror(err));
    }
    return 0;
}

int write_files_atomic(int n, const char *const *paths, const void *const *bufs, const size_t *lens, Diag *d) {
    char **tmp = ir_calloc((size_t)n, sizeof *tmp);
    if (!tmp)
        return diag_error(d, (Loc){0}, "out of memory writing '%s'", paths[0]);
    int rc = 0;
    for (int i = 0; i < n && !rc; i++)
        rc = write_temp(paths[i], bufs[i], lens[i], &tmp[i], d);
    for (int i = 0; i < n && !rc; i++)
        if (rename(tmp[i], paths[i]) != 0)
            rc = diag_error(d, (Loc){0}, "cannot write '%s': %s", paths[i], strerror(errno));
        else {
            ir_free(tmp[i]);
            tmp[i] = NULL;
        }
    for (int i = 0; i < n; i++)
        if (tmp[i]) {
            unlink(tmp[i]);
            ir_free(tmp[i]);
        }
    ir_free(tmp);
    return rc;
}

int write_file_atomic(const char *path, const void *buf, size_t len, Diag *d) {
    return write_files_atomic(1, &path, &buf, &len, d);
}
