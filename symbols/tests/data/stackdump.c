/* Test fixture for memscope-symbols: captures its own registers and a copy of its stack at a
 * known point, the way the BPF side does for an event, and writes them with /proc/self/maps.
 *
 *   stackdump OUT DEPTH   writes OUT.regs (pc sp fp len, then the maps text) and OUT.stack
 *   stackdump wait        prints "ready <address of mid_call>" and waits for stdin to close
 *
 * Call chain at the capture point (innermost first):
 *   capture <- [inlined] helper <- leaf <- recurse x (DEPTH+1) <- mid_inner <- mid_call (libmid.so)
 *   <- after_cxx <- memscope_fixture::call_through<int> <- memscope_fixture::Walker<int>::run
 *   (libcxx.so) <- cxx_entry <- main <- libc
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern int mid_call(int (*cb)(int), int n);
extern int cxx_entry(int (*cb)(int), int n);

#define STACK_COPY 16384

volatile int sink;
static const char *out_path;
static uint64_t stack_end;
static unsigned char stack_copy[STACK_COPY];

__attribute__((noinline)) static void capture(void) {
    uint64_t pc, sp, fp;
    /* One asm block: pc is the address of the mov that reads sp, so the CFI row for pc
     * describes exactly this sp. */
    __asm__ volatile("lea 0(%%rip), %0\n\t"
                     "mov %%rsp, %1\n\t"
                     "mov %%rbp, %2"
                     : "=r"(pc), "=r"(sp), "=r"(fp));
    size_t len = STACK_COPY;
    if (stack_end > sp && stack_end - sp < len)
        len = stack_end - sp;
    memcpy(stack_copy, (const void *)sp, len);

    static char path[4096]; /* static: keep this frame small */
    snprintf(path, sizeof path, "%s.stack", out_path);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(stack_copy, 1, len, f) != len)
        exit(2);
    fclose(f);
    snprintf(path, sizeof path, "%s.regs", out_path);
    f = fopen(path, "w");
    if (!f)
        exit(2);
    fprintf(f, "%llx %llx %llx %zu\n", (unsigned long long)pc, (unsigned long long)sp,
            (unsigned long long)fp, len);
    FILE *maps = fopen("/proc/self/maps", "r");
    static char line[8192];
    while (maps && fgets(line, sizeof line, maps))
        fputs(line, f);
    fclose(f);
}

static inline __attribute__((always_inline)) int helper(int x) {
    capture();
    sink = x;
    return x + 1;
}

__attribute__((noinline)) int leaf(int n) {
    int r = helper(n);
    sink = r;
    return r;
}

__attribute__((noinline)) int recurse(int n) {
    if (n > 0) {
        int r = recurse(n - 1);
        sink = r; /* not a tail call: every level keeps its frame */
        return r + 1;
    }
    int r = leaf(n);
    sink = r;
    return r;
}

__attribute__((noinline)) int after_cxx(int n) {
    int r = mid_call(recurse, n);
    sink = r;
    return r;
}

static void find_stack_end(void) {
    FILE *maps = fopen("/proc/self/maps", "r");
    char line[8192];
    while (maps && fgets(line, sizeof line, maps)) {
        unsigned long long start, end;
        if (strstr(line, "[stack]") && sscanf(line, "%llx-%llx", &start, &end) == 2)
            stack_end = end;
    }
    if (maps)
        fclose(maps);
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "wait") == 0) {
        printf("ready %llx\n", (unsigned long long)(uintptr_t)mid_call);
        fflush(stdout);
        while (getchar() != EOF) {
        }
        return 0;
    }
    if (argc != 3)
        return 1;
    out_path = argv[1];
    find_stack_end();
    int r = cxx_entry(after_cxx, atoi(argv[2]));
    sink = r;
    return 0;
}
