/* libkiln_mpi (kiln/mpi.h): kiln_comm's allreduce as MPI_Iallreduce on a duplicate
 * of the program's communicator, polled with MPI_Test until it completes or the
 * timeout passes. MPI cannot cancel a collective, so after a timeout the
 * communicator is broken: every later call fails at once, and kiln_mpi_free leaves
 * the duplicate to MPI_Finalize or the job's end. Its errors return codes
 * (MPI_ERRORS_RETURN), turned into messages, instead of aborting the job. */
#define _POSIX_C_SOURCE 200809L
#include "kiln/mpi.h"

#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

struct kiln_mpi {
    kiln_comm comm;
    MPI_Comm mpi;
    double timeout_s;
    bool broken;
    char error[512];
};

static int failed(kiln_mpi *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int failed(kiln_mpi *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->error, sizeof c->error, fmt, ap);
    va_end(ap);
    return 1;
}

static int mpi_failed(kiln_mpi *c, const char *call, int rc) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "error %d", rc);
    c->broken = true;
    return failed(c, "%s failed: %.*s", call, len, text);
}

static const char *comm_error(void *ctx) {
    const kiln_mpi *c = ctx;
    return c->error[0] ? c->error : NULL;
}

/* Waits for req: spinning on MPI_Test for the first millisecond (a step's
   collectives meet within microseconds when the processes keep pace), then
   sleeping 50 us between tests so that a process running ahead leaves the cores to
   those it waits for. */
static int wait_for(kiln_mpi *c, MPI_Request *req) {
    double start = MPI_Wtime();
    for (;;) {
        int done = 0, rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS)
            return mpi_failed(c, "MPI_Test", rc);
        if (done)
            return 0;
        double waited = MPI_Wtime() - start;
        if (c->timeout_s > 0 && waited > c->timeout_s) {
            c->broken = true;
            return failed(
                c,
                "process %d of %d had no answer from the others within %g s: one of them has stalled "
                "or died",
                (int)c->comm.rank, (int)c->comm.size, c->timeout_s);
        }
        if (waited > 1e-3)
            nanosleep(&(struct timespec){0, 50000}, NULL);
    }
}

static int allreduce_sum(void *ctx, const void *src, void *dst, int64_t count, int32_t dtype) {
    kiln_mpi *c = ctx;
    if (c->broken)
        return 1; /* the message of the failure that broke it stays */
    if (dtype != KILN_F32)
        return failed(c, "allreduce of dtype %d; libkiln_mpi sums f32 only", (int)dtype);
    /* MPI counts in int: a larger tensor goes in pieces */
    for (int64_t at = 0; at < count; at += INT_MAX) {
        int n = count - at < INT_MAX ? (int)(count - at) : INT_MAX;
        MPI_Request req;
        int rc = MPI_Iallreduce(src == dst ? MPI_IN_PLACE : (const float *)src + at, (float *)dst + at, n,
                                MPI_FLOAT, MPI_SUM, c->mpi, &req);
        if (rc != MPI_SUCCESS)
            return mpi_failed(c, "MPI_Iallreduce", rc);
        if (wait_for(c, &req))
            return 1;
    }
    return 0;
}

static void set_error(kiln_error *err, kiln_error_kind kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_error(kiln_error *err, kiln_error_kind kind, const char *fmt, ...) {
    if (!err)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    err->kind = kind;
}

kiln_mpi *kiln_mpi_new(MPI_Comm comm, double timeout_s, kiln_error *err) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
        set_error(err, KILN_ERROR_USER, "kiln_mpi_new: MPI is not initialized (call MPI_Init first)");
        return NULL;
    }
    if (!(timeout_s >= 0)) {
        set_error(err, KILN_ERROR_USER, "kiln_mpi_new: the timeout %g s is not a number >= 0", timeout_s);
        return NULL;
    }
    kiln_mpi *c = calloc(1, sizeof *c);
    if (!c) {
        set_error(err, KILN_ERROR_NO_MEMORY, "kiln_mpi_new: out of memory");
        return NULL;
    }
    int rank = 0, size = 0, rc = MPI_Comm_dup(comm, &c->mpi);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_set_errhandler(c->mpi, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_rank(c->mpi, &rank);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_size(c->mpi, &size);
    if (rc != MPI_SUCCESS) {
        mpi_failed(c, "kiln_mpi_new: duplicating the communicator", rc);
        set_error(err, KILN_ERROR_USER, "%s", c->error);
        free(c);
        return NULL;
    }
    c->comm = (kiln_comm){rank, size, c, allreduce_sum, comm_error};
    c->timeout_s = timeout_s;
    return c;
}

const kiln_comm *kiln_mpi_comm(const kiln_mpi *mpi) {
    return mpi ? &mpi->comm : NULL;
}

void kiln_mpi_free(kiln_mpi *mpi) {
    if (!mpi)
        return;
    if (!mpi->broken)
        MPI_Comm_free(&mpi->mpi);
    free(mpi);
}
