/* libkiln_mpi: a communicator (kiln_comm, kiln/model.h) over MPI, for models whose
 * steps allreduce across the processes of an MPI job.
 *
 * In data-parallel training each process runs the same training step on its own
 * shard of the batch, and the step's allreduce ops (docs/language.md) average the
 * gradients over the processes before the update, so every process keeps the same
 * weights:
 *
 *   MPI_Init(&argc, &argv);
 *   kiln_mpi *mpi = kiln_mpi_new(MPI_COMM_WORLD, 60, &err);
 *   kiln_set_comm(m, kiln_mpi_comm(mpi), &err);  // or def->create_comm(&instance, kiln_mpi_comm(mpi), ...)
 *   ... kiln_run, as often as wanted ...
 *   kiln_free(m);
 *   kiln_mpi_free(mpi);
 *   MPI_Finalize();
 *
 * Link with -lkiln_mpi and MPI (mpicc). A compiled model links no MPI itself: it
 * reaches the other processes only through the kiln_comm it was created with. */
#ifndef KILN_MPI_H
#define KILN_MPI_H

#include <mpi.h>

#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_mpi kiln_mpi;

/* A communicator over a duplicate of comm (so that its messages never meet the
 * program's own), which every process of comm creates together, after MPI_Init.
 * Each allreduce waits at most timeout_s seconds for the other processes (0: for
 * as long as it takes), then fails saying so: a process that stalled or died makes
 * the others fail with a message instead of hanging. NULL with err set on failure. */
KILN_API kiln_mpi *kiln_mpi_new(MPI_Comm comm, double timeout_s, kiln_error *err);
/* Its kiln_comm, valid until kiln_mpi_free. */
KILN_API const kiln_comm *kiln_mpi_comm(const kiln_mpi *mpi);
KILN_API void kiln_mpi_free(kiln_mpi *mpi);

#ifdef __cplusplus
}
#endif

#endif
