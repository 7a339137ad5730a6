/* mstx messages in pages the process has never touched (issue 15): the strings sit in the
 * middle of a 4 MiB read-only array, far from anything else the program reads, so their page
 * is not mapped yet when mstxMarkA / mstxRangeStartA are entered (fault-around maps at most
 * 64 KiB around a faulting address). Prints the messages it passed, one per line, on stdout
 * only after the calls (printing reads them) and half a second of other work. */
#include <stdio.h>
#include <unistd.h>
#include "ms_tools_ext.h"

#define MIB (1024 * 1024)
__attribute__((aligned(65536))) static const char far_strings[4 * MIB] = {
    [2 * MIB] = 's', 't', 'e', 'p', ' ', 's', 't', 'a', 'r', 't', 0,
    [3 * MIB] = 'u', 'n', 't', 'o', 'u', 'c', 'h', 'e', 'd', ' ', 'm', 'a', 'r', 'k', 0,
};

int main(void) {
    const char *range = &far_strings[2 * MIB];
    const char *mark = &far_strings[3 * MIB];
    uint64_t id = mstxRangeStartA(range, NULL);
    mstxMarkA(mark, NULL);
    mstxRangeEnd(id);
    /* A training step goes on after its marks; the tracer reads late strings meanwhile. */
    usleep(500 * 1000);
    printf("%s\n%s\n", range, mark);
    return 0;
}
