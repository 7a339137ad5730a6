/* LD_PRELOAD helper for the --pid-of-a-thread test (issue 15): before main, starts a thread
 * that only sleeps and writes its thread id to $EXTRA_THREAD_TID_FILE, so a single-threaded
 * workload gets a thread id that is not its pid. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void *sleeper(void *arg) {
    const char *path = arg;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (f) {
        fprintf(f, "%d\n", (int)gettid());
        fclose(f);
        rename(tmp, path);
    }
    for (;;)
        pause();
    return NULL;
}

__attribute__((constructor)) static void start(void) {
    const char *path = getenv("EXTRA_THREAD_TID_FILE");
    if (!path)
        return;
    pthread_t t;
    pthread_create(&t, NULL, sleeper, (void *)path);
    pthread_detach(t);
}
