// A C++ library with a namespace, a class template and a function template.
namespace memscope_fixture {

volatile int cxx_sink;

template <typename T>
__attribute__((noinline)) T call_through(int (*cb)(int), T n) {
    T r = static_cast<T>(cb(static_cast<int>(n)));
    cxx_sink = static_cast<int>(r);
    return r;
}

template <typename T>
struct Walker {
    __attribute__((noinline)) static T run(int (*cb)(int), T n) {
        T r = call_through<T>(cb, n);
        cxx_sink = static_cast<int>(r);
        return r;
    }
};

}  // namespace memscope_fixture

extern "C" __attribute__((noinline)) int cxx_entry(int (*cb)(int), int n) {
    int r = memscope_fixture::Walker<int>::run(cb, n);
    memscope_fixture::cxx_sink = r;
    return r;
}
