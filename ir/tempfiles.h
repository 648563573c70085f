/* The temporary files and directories kiln is making, removed if a signal ends it.
 *
 * A compile makes a directory of intermediate files (codegen/cc.c) and every output
 * is first written to a temporary beside its target (driver/outputs.c). Each path
 * is registered while it exists; the driver's SIGINT/SIGTERM handler calls
 * tempfiles_remove_all, which uses only async-signal-safe calls (unlink, rmdir), so
 * an interrupted command leaves nothing behind. Registration is lock-free, so any
 * thread may register while a signal arrives. */
#ifndef KILN_TEMPFILES_H
#define KILN_TEMPFILES_H

/* The directory temporaries go in: $TMPDIR, else /tmp. Temporaries are no setting
 * of the compile (kiln_options), so this is the one place kiln reads $TMPDIR. */
const char *tempfiles_dir(void);
/* Registers path (copied); returns a slot for tempfiles_forget, or -1 when the path
 * is too long or the table is full (the file is then simply not removed on a signal). */
int tempfiles_add(const char *path);
/* The path no longer needs removing on a signal (it was renamed or removed). */
void tempfiles_forget(int slot);
/* Removes every registered path, newest first: unlink, and rmdir for a directory
 * (whose registered files, newer, are gone by then). Async-signal-safe. */
void tempfiles_remove_all(void);

#endif
