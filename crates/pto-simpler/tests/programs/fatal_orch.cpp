// Orchestrations that fail: rt_report_fatal, a C++ exception, and a submit with a func_id the
// callable does not have.
#include <stdexcept>

#include "pto_orchestration_api.h"

extern "C" {
__attribute__((visibility("default"))) void fatal_entry(const ChipTaskArgs &) {
    rt_report_fatal(PTO2_ERROR_USER, "the program gave up: %d", 42);
}

__attribute__((visibility("default"))) void throw_entry(const ChipTaskArgs &) {
    throw std::runtime_error("a C++ exception from the orchestration");
}

__attribute__((visibility("default"))) void segv_entry(const ChipTaskArgs &a) {
    // A bug in the orchestration: it reads through a null pointer (volatile: the compiler keeps it).
    volatile int *p = a.tensor_count() > 100 ? reinterpret_cast<int *>(8) : nullptr;
    (void)*p;
}

__attribute__((visibility("default"))) void bad_func_entry(const ChipTaskArgs &a) {
    CoreTaskArgs p;
    p.add_input(a.tensor(0).ref());
    p.add_output(a.tensor(1).ref());
    p.add_scalar(1.0f);
    rt_submit_aiv_task(7, p);
}
}
