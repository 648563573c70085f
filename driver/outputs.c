/* The files a command writes: checked first, written to temporaries, put in place
 * together at the end.
 *
 * A command registers every output path before it does any work (outputs_add), and
 * outputs_check compares each with every file the command reads (the model, weights,
 * --input and --bind files) and with the other outputs, by name (the path with its
 * directory resolved, symlinks followed) and by identity (st_dev and st_ino, which
 * also catches hard links), so that no command overwrites what it reads or writes
 * one file twice; nor may a file it reads lie in the --dump-dir under a name the
 * dumps use. What an output path names decides how it is written:
 *
 *   - a regular file, or nothing yet: a temporary beside it (same directory, so the
 *     rename stays within one file system), renamed over it at the end;
 *   - a symlink: the file it points at, as above (the link itself stays); a link to
 *     nothing is refused;
 *   - a FIFO, a character device (/dev/null, a terminal), or /dev/stdout,
 *     /dev/stderr, /dev/fd/N: written through (opened and written, never replaced),
 *     from a temporary in $TMPDIR, after every temporary was written;
 *   - a directory, a block device or a socket: refused.
 *
 * outputs_commit writes the written-through outputs, then renames every temporary,
 * unless an internal assertion failed on the way (the work is not trusted);
 * outputs_abort removes the temporaries. So a failure before the commit leaves no
 * output at all. Every temporary is registered (ir/tempfiles.h) while it exists, so
 * SIGINT or SIGTERM removes it too. */
#include "driver.h"
#include "../ir/tempfiles.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void outputs_init(Outputs *s) {
    memset(s, 0, sizeof *s);
}

int outputs_add(Outputs *s, const char *path, const char *what) {
    if (s->n == MAX_OUTPUTS)
        return -1;
    Output *o = &s->items[s->n];
    memset(o, 0, sizeof *o);
    o->path = path;
    o->what = what;
    o->fd = -1;
    o->slot = -1;
    return s->n++;
}

/* /dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N: a descriptor this process
 * holds, written as it is. -1 for any other path. */
static int fd_path(const char *path) {
    if (strcmp(path, "/dev/stdout") == 0)
        return 1;
    if (strcmp(path, "/dev/stderr") == 0)
        return 2;
    const char *n = strncmp(path, "/dev/fd/", 8) == 0          ? path + 8
                    : strncmp(path, "/proc/self/fd/", 14) == 0 ? path + 14
                                                               : NULL;
    if (!n || !*n)
        return -1;
    char *end;
    long fd = strtol(n, &end, 10);
    return *end || fd < 0 || fd > INT_MAX ? -1 : (int)fd;
}

/* The path with its directory resolved: the name two paths to one file share even
 * when the file does not exist yet. For a path whose directory does not exist, the
 * path itself (writing it fails later, naming it). */
static void canonical(const char *path, char *out, size_t n) {
    char resolved[PATH_MAX];
    if (realpath(path, resolved)) {
        snprintf(out, n, "%s", resolved);
        return;
    }
    const char *slash = strrchr(path, '/');
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    if (slash == path)
        strcpy(dir, "/");
    if (!realpath(dir, resolved) || snprintf(out, n, "%s/%s", strcmp(resolved, "/") == 0 ? "" : resolved,
                                             slash ? slash + 1 : path) >= (int)n)
        snprintf(out, n, "%s", path);
}

/* How an output is written, from what its path names now. */
static int classify(Output *o, Diag *d) {
    o->fd = fd_path(o->path);
    canonical(o->path, o->name, sizeof o->name);
    struct stat st, lst;
    if (o->fd >= 0) {
        o->through = true;
        o->exists = fstat(o->fd, &st) == 0;
    } else if (stat(o->path, &st) == 0) {
        o->exists = true;
        if (S_ISDIR(st.st_mode))
            return diag_error(d, (Loc){0}, "%s '%s' is a directory", o->what, o->path);
        if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode))
            o->through = true;
        else if (!S_ISREG(st.st_mode))
            return diag_error(d, (Loc){0},
                              "%s '%s' is not a regular file, a FIFO or a character device; kiln does not "
                              "write to it",
                              o->what, o->path);
    } else if (lstat(o->path, &lst) == 0 && S_ISLNK(lst.st_mode)) {
        return diag_error(d, (Loc){0}, "%s '%s' is a symlink to a file that does not exist", o->what,
                          o->path);
    }
    if (o->exists) {
        o->dev = st.st_dev;
        o->ino = st.st_ino;
        o->mode = st.st_mode & 07777;
    }
    return 0;
}

/* Whether the file at path (read by the command) is the output o. */
static bool same_file(const Output *o, const char *path) {
    char name[PATH_MAX];
    canonical(path, name, sizeof name);
    struct stat st;
    if (strcmp(name, o->name) == 0)
        return true;
    return o->exists && stat(path, &st) == 0 && st.st_dev == o->dev && st.st_ino == o->ino;
}

static int check_input(const Output *o, const char *path, const char *role, Diag *d) {
    if (!path || !same_file(o, path))
        return 0;
    return diag_error(d, (Loc){0}, "%s '%s' is %s '%s'; kiln does not overwrite what it reads", o->what,
                      o->path, role, path);
}

/* --dump-dir writes DIR/NN-STAGE.kiln and .safetensors as the passes run (and
 * DIR/model.c and DIR/model.kir): a file read from there under such a name, as when a dumped stage is
 * re-run, would be overwritten. */
static int check_dump_dir(const char *dir, const char *path, const char *role, Diag *d) {
    if (!dir || !path)
        return 0;
    char in_name[PATH_MAX], dir_name[PATH_MAX];
    canonical(path, in_name, sizeof in_name);
    if (!realpath(dir, dir_name))
        return 0; /* not there yet: nothing in it is read */
    size_t n = strlen(dir_name);
    if (strncmp(in_name, dir_name, n) != 0 || in_name[n] != '/' || strchr(in_name + n + 1, '/'))
        return 0;
    const char *base = in_name + n + 1;
    bool stage = base[0] >= '0' && base[0] <= '9' && base[1] >= '0' && base[1] <= '9' && base[2] == '-';
    if (!stage && strcmp(base, "model.c") != 0 && strcmp(base, "model.cu") != 0 &&
        strcmp(base, "model.kir") != 0)
        return 0;
    return diag_error(d, (Loc){0},
                      "--dump-dir '%s' would overwrite %s '%s' (the dumps are written there); choose another "
                      "directory",
                      dir, role, path);
}

typedef int (*InputCheck)(const void *arg, const char *path, const char *role, Diag *d);

/* fn on every file the options name for reading, with what it is. */
static int for_each_input(const Options *opt, InputCheck fn, const void *arg, Diag *d) {
    if (fn(arg, opt->model, "the model", d))
        return -1;
    for (int k = 0; k < opt->n_weights; k++)
        if (fn(arg, opt->weights[k], "the weights file", d))
            return -1;
    for (int k = 0; k < opt->n_inputs; k++)
        if (fn(arg, opt->inputs[k].file, "the --input file", d))
            return -1;
    for (int k = 0; k < opt->n_binds; k++)
        if (fn(arg, opt->binds[k].file, "the --bind file", d))
            return -1;
    return 0;
}

static int input_is_output(const void *o, const char *path, const char *role, Diag *d) {
    return check_input(o, path, role, d);
}

static int input_in_dump_dir(const void *dir, const char *path, const char *role, Diag *d) {
    return check_dump_dir(dir, path, role, d);
}

int outputs_check(Outputs *s, const Options *opt, Diag *d) {
    for (int i = 0; i < s->n; i++) {
        Output *o = &s->items[i];
        if (classify(o, d))
            return -1;
        /* a character device such as /dev/null may take several outputs; a file not */
        bool shareable = strcmp(o->name, "/dev/null") == 0;
        for (int k = 0; k < i; k++) {
            const Output *p = &s->items[k];
            bool same = strcmp(p->name, o->name) == 0 ||
                        (p->exists && o->exists && p->dev == o->dev && p->ino == o->ino) ||
                        (p->fd >= 0 && p->fd == o->fd);
            if (same && !shareable)
                return diag_error(d, (Loc){0},
                                  "%s '%s' and %s '%s' are the same file; each output needs its own", p->what,
                                  p->path, o->what, o->path);
        }
        if (for_each_input(opt, input_is_output, o, d))
            return -1;
    }
    return for_each_input(opt, input_in_dump_dir, opt->pipeline.dump_dir, d);
}

/* mkstemp creates the file 0600; give it the mode fopen would have, 0666 less the
 * umask. umask can only be read by setting it, so it is set back at once. */
static mode_t new_file_mode(void) {
    mode_t mask = umask(0);
    umask(mask);
    return 0666 & ~mask;
}

const char *outputs_temp(Outputs *s, int i, Diag *d) {
    Output *o = &s->items[i];
    if (o->tmp[0])
        return o->tmp;
    /* beside the file it replaces; from $TMPDIR for one written through */
    const char *base = o->through ? tempfiles_dir() : o->name;
    const char *suffix = o->through ? "/kiln-out-XXXXXX" : ".XXXXXX";
    size_t n = strlen(base);
    if (n + strlen(suffix) >= sizeof o->tmp) {
        o->tmp[0] = 0;
        diag_error(d, (Loc){0}, "cannot write '%s': the path is too long", o->path);
        return NULL;
    }
    memcpy(o->tmp, base, n);
    strcpy(o->tmp + n, suffix);
    int fd = mkstemp(o->tmp);
    if (fd < 0) {
        int err = errno;
        o->tmp[0] = 0;
        diag_error(d, (Loc){0}, "cannot write '%s': %s", o->path, strerror(err));
        return NULL;
    }
    o->slot = tempfiles_add(o->tmp);
    /* a file replaced keeps its permissions */
    mode_t mode = o->exists && !o->through ? o->mode : new_file_mode();
    int err = fchmod(fd, mode) != 0 ? errno : 0;
    close(fd);
    if (err) {
        diag_error(d, (Loc){0}, "cannot write '%s': %s", o->path, strerror(err));
        return NULL;
    }
    return o->tmp;
}

int outputs_write(Outputs *s, int i, const void *buf, size_t len, Diag *d) {
    const char *tmp = outputs_temp(s, i, d);
    if (!tmp)
        return -1;
    int fd = open(tmp, O_WRONLY | O_TRUNC);
    int err = fd < 0 || write_fully(fd, buf, len) != 0 ? errno : 0;
    if (fd >= 0 && close(fd) != 0 && !err)
        err = errno;
    if (err)
        return diag_error(d, (Loc){0}, "cannot write '%s': %s", s->items[i].path, strerror(err));
    return 0;
}

static void forget(Output *o) {
    tempfiles_forget(o->slot);
    o->slot = -1;
    o->tmp[0] = 0;
}

/* Copies an output's temporary into the FIFO, device or descriptor it names. */
static int write_through(Output *o, Diag *d) {
    unsigned char *buf = NULL;
    size_t len = 0;
    if (read_file_bytes(o->tmp, &buf, &len, d))
        return -1;
    int fd = o->fd >= 0 ? o->fd : open(o->path, O_WRONLY | O_NOCTTY);
    int err = fd < 0 || write_fully(fd, buf, len) != 0 ? errno : 0;
    if (fd >= 0 && o->fd < 0 && close(fd) != 0 && !err)
        err = errno;
    ir_free(buf);
    if (err)
        return diag_error(d, (Loc){0}, "cannot write '%s': %s", o->path, strerror(err));
    return 0;
}

int outputs_commit(Outputs *s, Diag *d) {
    /* nothing is written from work done past a failed internal assertion */
    if (diag_take_assert(d))
        return -1;
    for (int i = 0; i < s->n; i++)
        if (!s->items[i].tmp[0])
            return diag_internal(d, (Loc){0}, "cannot write '%s': nothing was written to it (a bug in kiln)",
                                 s->items[i].path);
    for (int i = 0; i < s->n; i++)
        if (s->items[i].through && write_through(&s->items[i], d)) {
            outputs_abort(s);
            return -1;
        }
    int rc = 0;
    for (int i = 0; i < s->n; i++) {
        Output *o = &s->items[i];
        if (o->through)
            unlink(o->tmp);
        else if (!rc && rename(o->tmp, o->name) != 0)
            rc = diag_error(d, (Loc){0}, "cannot write '%s': %s", o->path, strerror(errno));
        else if (rc)
            unlink(o->tmp);
        forget(o);
    }
    return rc;
}

void outputs_abort(Outputs *s) {
    for (int i = 0; i < s->n; i++)
        if (s->items[i].tmp[0]) {
            unlink(s->items[i].tmp);
            forget(&s->items[i]);
        }
}
