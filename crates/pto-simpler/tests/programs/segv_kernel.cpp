// A kernel with a bug: it writes through a null pointer. Its chip dies of SIGSEGV; the error must
// name this file.
#include <cstdint>

extern "C" void kernel_entry(int64_t *args) {
    volatile int32_t *p = args[47] == 12345 ? reinterpret_cast<int32_t *>(8) : nullptr;
    *p = 1;
}
