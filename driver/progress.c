/* The progress line of a long compile (cli.md): once a command has worked on a
 * model for a second, a line on stderr saying what it is doing and for how long,
 * redrawn in place four times a second and erased when the work is done. Only when
 * stderr is a terminal, and not with --quiet: a log or a pipe gets nothing. A
 * thread of its own draws it, so that the compile itself never waits on it. */
#include "driver.h"

#include <pthread.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static struct {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    pthread_t thread;
    bool running, done, drawn;
    const char *model, *stage;
    struct timespec start;
} progress = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

static double since_start(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - progress.start.tv_sec) +
           1e-9 * (double)(now.tv_nsec - progress.start.tv_nsec);
}

static void *draw(void *unused) {
    (void)unused;
    pthread_mutex_lock(&progress.lock);
    while (!progress.done) {
        double t = since_start();
        if (t >= 1.0) {
            fprintf(stderr, "\r\033[Kkiln: %s: %s (%.1f s)", progress.model, progress.stage, t);
            fflush(stderr);
            progress.drawn = true;
        }
        /* the next quarter of a second, or the end */
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 250 * 1000 * 1000;
        if (until.tv_nsec >= 1000 * 1000 * 1000) {
            until.tv_sec++;
            until.tv_nsec -= 1000 * 1000 * 1000;
        }
        pthread_cond_timedwait(&progress.wake, &progress.lock, &until);
    }
    pthread_mutex_unlock(&progress.lock);
    return NULL;
}

void progress_start(const char *model, bool quiet) {
    if (quiet || progress.running || !isatty(STDERR_FILENO))
        return;
    const char *slash = strrchr(model, '/');
    progress.model = slash ? slash + 1 : model;
    progress.stage = "reading the model";
    progress.done = progress.drawn = false;
    clock_gettime(CLOCK_MONOTONIC, &progress.start);
    progress.running = pthread_create(&progress.thread, NULL, draw, NULL) == 0;
}

void progress_stage(const char *stage) {
    pthread_mutex_lock(&progress.lock);
    progress.stage = stage;
    pthread_mutex_unlock(&progress.lock);
}

void progress_end(void) {
    if (!progress.running)
        return;
    pthread_mutex_lock(&progress.lock);
    progress.done = true;
    pthread_cond_signal(&progress.wake);
    pthread_mutex_unlock(&progress.lock);
    pthread_join(progress.thread, NULL);
    progress.running = false;
    if (progress.drawn)
        fprintf(stderr, "\r\033[K");
}
