// A kernel that crashes its process (a failed check, as a buggy kernel would).
#include <cstdint>
#include <cstdlib>

extern "C" void kernel_entry(int64_t *) { abort(); }
