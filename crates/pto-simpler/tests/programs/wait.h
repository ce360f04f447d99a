// Test helper for kernels written without pto-isa: a bounded wait on a u32 signal.
#pragma once
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cstdint>

static inline double test_now() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Waits until *sig >= want; after 20 s the kernel gives up loudly (the chip dies, and pto names
// it), as a wait that can never complete must not return with wrong data.
static inline void test_wait_ge(volatile int32_t *sig, int32_t want) {
    double until = test_now() + 20.0;
    while (__atomic_load_n(sig, __ATOMIC_ACQUIRE) < want) {
        if (test_now() > until) {
            fprintf(stderr, "test kernel: signal at %p stayed below %d for 20 s\n", (void *)sig, want);
            abort();
        }
        sched_yield();
    }
}
