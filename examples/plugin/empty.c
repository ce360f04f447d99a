/* empty.c: a plugin kernel that does nothing, to measure what a task of a C kernel costs
 * beside a built-in one (`pto bench plugin --plugin ./libempty.so`, and
 * python/bench/kernels.py --plugin ./libempty.so).
 *
 *     cc -O2 -shared -fPIC -I"$(pto include-dir)" examples/plugin/empty.c -o libempty.so
 */
#include "pto.h"

static int empty(pto_kernel_ctx *ctx) {
    (void)ctx;
    return PTO_OK;
}

/* t0: an i64 tensor (INOUT): adds 1 to its first element (a chain of these is ordered). */
static int inc(pto_kernel_ctx *ctx) {
    void *p;
    int rc = pto_tensor_ptr(ctx, 0, &p);
    if (rc != PTO_OK) return rc;
    ((int64_t *)p)[0] += 1;
    return PTO_OK;
}

PTO_EXPORT int pto_plugin_register(pto_registry *reg) {
    int rc = pto_register_kernel(reg, "empty", PTO_AIV, empty);
    if (rc == PTO_OK) rc = pto_register_kernel(reg, "plugin_inc", PTO_AIV, inc);
    return rc;
}
