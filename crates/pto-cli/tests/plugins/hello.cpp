// A plugin in C++ (built with `c++ -std=c++11`): pto.h's calls from C++ code, with C++'s
// types and a captureless lambda as a kernel. The entry points need no `extern "C"`: pto.h
// declares them inside its own, so they keep their C names.
// The pto-cli plugin tests build and run it.
#include <cstdio>
#include <cstring>
#include <vector>

#include "pto.h"

namespace {

// t0: OUT_NEW f64[n]; s0: f64. Writes s0 * (i + 1) into t0[i], then puts rank + 1 into the
// next rank's `inbox`.
int scale(pto_kernel_ctx *ctx) {
    pto_view v;
    double s = 0;
    uint32_t r = 0, n = 0;
    int rc;
    if ((rc = pto_tensor_view(ctx, 0, 0, &v)) != PTO_OK) return rc;
    if ((rc = pto_scalar_f64(ctx, 0, &s)) != PTO_OK) return rc;
    if (v.dtype != PTO_F64 || !v.writable) return pto_fail(ctx, "scale: expects a writable f64 tensor");
    double *out = static_cast<double *>(v.data);
    for (uint64_t i = 0; i < v.count; i++) out[i] = s * static_cast<double>(i + 1);
    if ((rc = pto_rank(ctx, &r)) != PTO_OK || (rc = pto_nranks(ctx, &n)) != PTO_OK) return rc;
    const uint32_t mine = r + 1;
    if ((rc = pto_put(ctx, (r + 1) % n, "inbox", 0, &mine, sizeof mine)) != PTO_OK) return rc;
    return pto_notify(ctx, (r + 1) % n, "inbox", 4, 1);
}

int hello(pto_orch *o) {
    const uint64_t shape[1] = {8};
    pto_arg args[2] = {pto_arg_out_new(PTO_F64, 1, shape), pto_arg_f64(0.5)};
    pto_task t = 0;
    pto_tensor out = 0;
    int rc;
    if ((rc = pto_submit_ex(o, "cpp_scale", args, 2, nullptr, &t)) != PTO_OK) return rc;
    if ((rc = pto_task_output(o, t, 0, &out)) != PTO_OK) return rc;
    std::vector<double> got(8);
    if ((rc = pto_tensor_read(o, out, got.data(), got.size() * sizeof(double))) != PTO_OK) return rc;
    for (std::size_t i = 0; i < got.size(); i++)
        if (got[i] != 0.5 * static_cast<double>(i + 1)) return -400;
    // A captureless lambda is a kernel too: it waits for the previous rank's put.
    pto_task_opts after = {};
    after.after = &t;
    after.nafter = 1;
    return pto_submit_ex(o, "cpp_check", nullptr, 0, &after, nullptr);
}

}  // namespace

PTO_EXPORT uint32_t pto_plugin_abi_version(void) { return PTO_ABI_VERSION; }

PTO_EXPORT int pto_plugin_register(pto_registry *reg) {
    pto_kernel_fn check = [](pto_kernel_ctx *ctx) -> int {
        uint32_t r = 0, n = 0, *inbox = nullptr;
        int rc;
        if ((rc = pto_wait_until(ctx, "inbox", 4, 1)) != PTO_OK) return rc;
        if ((rc = pto_rank(ctx, &r)) != PTO_OK || (rc = pto_nranks(ctx, &n)) != PTO_OK) return rc;
        void *p = nullptr;
        if ((rc = pto_window_ptr(ctx, "inbox", &p, nullptr)) != PTO_OK) return rc;
        inbox = static_cast<uint32_t *>(p);
        const uint32_t want = (r + n - 1) % n + 1;
        if (inbox[0] != want) {
            char m[96];
            std::snprintf(m, sizeof m, "cpp_check: rank %u got %u, expected %u", r, inbox[0], want);
            return pto_fail(ctx, m);
        }
        return PTO_OK;
    };
    int rc = 0;
    rc |= pto_declare_buffer(reg, "inbox", PTO_U32, 2);
    rc |= pto_register_kernel(reg, "cpp_scale", PTO_AIV, scale);
    rc |= pto_register_kernel(reg, "cpp_check", PTO_AIV, check);
    rc |= pto_register_program(reg, "hello", hello);
    return rc;
}
