/* A C library the fixture calls through; the tests strip it and keep its debug info in a
 * separate file (.gnu_debuglink and build-id). */
volatile int mid_sink;

__attribute__((noinline)) static int mid_inner(int (*cb)(int), int n) {
    int r = cb(n);
    mid_sink = r;
    return r;
}

__attribute__((noinline)) int mid_call(int (*cb)(int), int n) {
    int r = mid_inner(cb, n);
    mid_sink = r;
    return r;
}
