/* Whole binary files in and out, for the tensor file formats and model text.
 *
 * read_file_bytes reads a regular file into one buffer sized from fstat, and refuses
 * anything else before reading a byte: a device such as /dev/zero never ends, a
 * FIFO blocks, and neither has a size to check a header against (the file is opened
 * O_NONBLOCK so that opening a FIFO cannot hang either). There is no "read from
 * standard input": every input is a named regular file. open_beneath opens a
 * path relative to a directory one component at a time with O_NOFOLLOW, so that
 * a path taken from a model file (ONNX external data) can name only a regular file
 * under that directory: no absolute path, no "..", no symbolic link anywhere.
 * write_file_atomic writes to a temporary file made with mkstemp beside the target
 * (so the rename stays within one file system) and renames it over the target only
 * once every byte is written and the file closed; on any failure it removes the
 * temporary, so a failed write leaves neither a partial target nor a stray file. */
#define _GNU_SOURCE /* O_PATH */
#include "frontend.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Larger than any model's weights, small enough that a size this big is a mistake. */
static const uint64_t MAX_FILE_BYTES = (uint64_t)1 << 40;

static int too_large(const char *path, uint64_t size, uint64_t limit, Diag *d) {
    return diag_error(d, (Loc){0},
                      "cannot read '%s': the file is too large (%llu bytes; the limit, this machine's "
                      "memory or 1 TiB, is %llu)",
                      path, (unsigned long long)size, (unsigned long long)limit);
}

const char *file_kind(unsigned mode) {
    return S_ISDIR(mode)    ? "a directory"
           : S_ISCHR(mode)  ? "a character device"
           : S_ISBLK(mode)  ? "a block device"
           : S_ISFIFO(mode) ? "a FIFO"
           : S_ISSOCK(mode) ? "a socket"
           : S_ISLNK(mode)  ? "a symbolic link"
                            : "not a regular file";
}

/* Reads exactly the size fstat gave; a file that shrinks meanwhile reads short, one that
 * grows is cut at that size, so the buffer never outgrows what was checked. */
static int read_fd(int fd, const char *path, size_t size, unsigned char **buf, size_t *len, Diag *d) {
    unsigned char *data = ir_malloc(size ? size : 1);
    if (!data)
        return diag_error(d, (Loc){0}, "out of memory reading '%s' (%zu bytes)", path, size);
    size_t n = 0;
    while (n < size) {
        ssize_t r = read(fd, data + n, size - n);
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

/* A file is read whole into memory, so one larger than the machine's memory can only
 * end with the OOM killer. */
uint64_t file_size_limit(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    uint64_t phys = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : MAX_FILE_BYTES;
    return phys < MAX_FILE_BYTES ? phys : MAX_FILE_BYTES;
}

int read_file_bytes(const char *path, unsigned char **buf, size_t *len, Diag *d) {
    *buf = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return diag_error(d, (Loc){0}, "cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    int rc;
    if (fstat(fd, &st) != 0)
        rc = diag_error(d, (Loc){0}, "cannot read '%s': %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        rc = diag_error(d, (Loc){0}, "cannot read '%s': it is %s, not a regular file", path,
                        file_kind(st.st_mode));
    else if (st.st_size < 0 || (uint64_t)st.st_size > file_size_limit() || (uint64_t)st.st_size > SIZE_MAX)
        rc = too_large(path, (uint64_t)st.st_size, file_size_limit(), d);
    else
        rc = read_fd(fd, path, (size_t)st.st_size, buf, len, d);
    close(fd);
    return rc;
}

#ifdef O_PATH
#define DIR_FLAGS (O_PATH | O_DIRECTORY)
#else
#define DIR_FLAGS (O_RDONLY | O_DIRECTORY)
#endif

/* The refusals that need no file system: empty, absolute, a ".." anywhere. */
static const char *path_refusal(const char *rel) {
    if (!*rel)
        return "it is empty";
    if (rel[0] == '/')
        return "it is an absolute path";
    for (const char *p = rel; *p;) {
        size_t n = strcspn(p, "/");
        if (n == 2 && p[0] == '.' && p[1] == '.')
            return "it has a '..' component";
        p += n + (p[n] == '/');
    }
    return NULL;
}

int open_beneath(const char *dir, const char *rel, const char **why) {
    if ((*why = path_refusal(rel)) != NULL) {
        errno = EINVAL;
        return -1;
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return -1;
    for (const char *p = rel;;) {
        size_t n = strcspn(p, "/");
        bool last = p[n] == 0;
        if (n == 0 && last) {
            close(dfd);
            *why = "it names a directory";
            errno = EISDIR;
            return -1;
        }
        if (n == 0 || (n == 1 && p[0] == '.' && !last)) {
            p += n + 1; /* "a//b" and "./a" name what "a/b" and "a" do */
            continue;
        }
        char part[NAME_MAX + 1];
        if (n > NAME_MAX) {
            close(dfd);
            errno = ENAMETOOLONG;
            return -1;
        }
        memcpy(part, p, n);
        part[n] = 0;
        /* O_NOFOLLOW refuses a link as the last component of a path, which each one is in
         * turn; a directory on the way needs only search permission, as in a plain open */
        int fd =
            openat(dfd, part, O_CLOEXEC | O_NOFOLLOW | (last ? O_RDONLY | O_NONBLOCK | O_NOCTTY : DIR_FLAGS));
        int err = errno;
        struct stat st;
        if (fd < 0 && fstatat(dfd, part, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
            *why = "a component of it is a symbolic link";
        close(dfd);
        if (fd < 0) {
            errno = err;
            return -1;
        }
        if (last) {
            if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
                *why = "it is not a regular file";
                close(fd);
                errno = EINVAL;
                return -1;
            }
            return fd;
        }
        dfd = fd;
        p += n + 1;
    }
}

int write_fully(int fd, const void *buf, size_t len) {
    const char *p = buf;
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

/* Writes the parts to a new temporary file beside path; its name in *tmp (freed by
 * the caller). */
static int write_temp(const char *path, int n, const void *const *bufs, const size_t *lens, char **tmp,
                      Diag *d) {
    size_t len = strlen(path);
    *tmp = ir_malloc(len + sizeof ".XXXXXX");
    if (!*tmp)
        return diag_error(d, (Loc){0}, "out of memory writing '%s'", path);
    memcpy(*tmp, path, len);
    memcpy(*tmp + len, ".XXXXXX", sizeof ".XXXXXX");
    int fd = mkstemp(*tmp);
    if (fd < 0) {
        int err = errno;
        ir_free(*tmp);
        *tmp = NULL;
        return diag_error(d, (Loc){0}, "cannot write '%s': %s", path, strerror(err));
    }
    int err = 0;
    for (int i = 0; i < n && !err; i++)
        if (write_fully(fd, bufs[i], lens[i]) != 0)
            err = errno;
    if (!err && fchmod(fd, new_file_mode()) != 0)
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

int write_parts_atomic(const char *path, int n, const void *const *bufs, const size_t *lens, Diag *d) {
    char *tmp = NULL;
    int rc = write_temp(path, n, bufs, lens, &tmp, d);
    if (!rc && rename(tmp, path) != 0) {
        rc = diag_error(d, (Loc){0}, "cannot write '%s': %s", path, strerror(errno));
        unlink(tmp);
    }
    ir_free(tmp);
    return rc;
}

int write_file_atomic(const char *path, const void *buf, size_t len, Diag *d) {
    return write_parts_atomic(path, 1, &buf, &len, d);
}
