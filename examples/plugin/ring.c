/*
 * ring.c: a pto plugin with a distributed program.
 *
 * Every rank fills a vector (data[i] = 1000 * rank + i), puts it into the next rank's `inbox`
 * and notifies that rank's `flag`; a deferred task completes when this rank's own flag has
 * been notified; then `ring_check` reads the inbox and fails the task unless it holds the
 * previous rank's vector. `ring_blocking` does the same with a wait inside a kernel.
 *
 *     cc -shared -fPIC -I"$(pto include-dir)" examples/plugin/ring.c -o libring.so
 *     pto run --plugin ./libring.so ring --ranks 4
 */
#include <stdio.h>

#include "pto.h"

#define N 256

/* t0: data (OUT_NEW f32[N]). data[i] = 1000 * rank + i. */
static int ring_fill(pto_kernel_ctx *ctx) {
    uint32_t rank;
    pto_view v;
    int rc = pto_rank(ctx, &rank);
    if (rc != PTO_OK) return rc;
    rc = pto_tensor_view(ctx, 0, 0, &v);
    if (rc != PTO_OK) return rc;
    if (v.dtype != PTO_F32 || v.count != N || !v.contiguous) return pto_fail(ctx, "ring_fill: expects f32[256]");
    for (uint32_t i = 0; i < N; i++) ((float *)v.data)[i] = (float)(1000u * rank + i);
    return PTO_OK;
}

/* t0: data (IN f32[N]). Puts it into the next rank's inbox, then notifies its flag. */
static int ring_send(pto_kernel_ctx *ctx) {
    uint32_t rank, n;
    void *data;
    int rc;
    if ((rc = pto_rank(ctx, &rank)) != PTO_OK) return rc;
    if ((rc = pto_nranks(ctx, &n)) != PTO_OK) return rc;
    if ((rc = pto_tensor_ptr(ctx, 0, &data)) != PTO_OK) return rc;
    uint32_t next = (rank + 1) % n;
    if ((rc = pto_put(ctx, next, "inbox", 0, data, N * sizeof(float))) != PTO_OK) return rc;
    return pto_notify(ctx, next, "flag", 0, 1);
}

/* Deferred. t0: token (OUT_NEW i32[1]). Completes when this rank's flag is >= 1. */
static int ring_wait(pto_kernel_ctx *ctx) {
    return pto_defer_until(ctx, "flag", 0, 1);
}

/* t0: data (IN): puts and notifies like ring_send, then waits for this rank's own flag. */
static int ring_send_wait(pto_kernel_ctx *ctx) {
    int rc = ring_send(ctx);
    if (rc != PTO_OK) return rc;
    return pto_wait_until(ctx, "flag", 0, 1);
}

/* t0: token (IN, for the order only). Checks inbox[i] == 1000 * prev + i. */
static int ring_check(pto_kernel_ctx *ctx) {
    uint32_t rank, n;
    float *inbox;
    uint64_t bytes;
    int rc;
    if ((rc = pto_rank(ctx, &rank)) != PTO_OK) return rc;
    if ((rc = pto_nranks(ctx, &n)) != PTO_OK) return rc;
    if ((rc = pto_window_ptr(ctx, "inbox", (void **)&inbox, &bytes)) != PTO_OK) return rc;
    uint32_t prev = (rank + n - 1) % n;
    for (uint32_t i = 0; i < N; i++) {
        float want = (float)(1000u * prev + i);
        if (inbox[i] != want) {
            char msg[128];
            snprintf(msg, sizeof msg, "rank %u: inbox[%u] = %g, expected %g (from rank %u)",
                     rank, i, (double)inbox[i], (double)want, prev);
            return pto_fail(ctx, msg);
        }
    }
    return PTO_OK;
}

static int ring(pto_orch *o) {
    uint64_t shape[1] = {N};
    uint64_t one[1] = {1};
    pto_task fill, wait;
    pto_tensor data, token;
    int rc;
    pto_arg a[1];
    a[0] = pto_arg_out_new(PTO_F32, 1, shape);
    if ((rc = pto_submit_ex(o, "ring_fill", a, 1, NULL, &fill)) != PTO_OK) return rc;
    if ((rc = pto_task_output(o, fill, 0, &data)) != PTO_OK) return rc;
    a[0] = pto_arg_in(data);
    if ((rc = pto_submit(o, "ring_send", a, 1)) != PTO_OK) return rc;
    pto_task_opts deferred = {0};
    deferred.deferred = 1;
    a[0] = pto_arg_out_new(PTO_I32, 1, one);
    if ((rc = pto_submit_ex(o, "ring_wait", a, 1, &deferred, &wait)) != PTO_OK) return rc;
    if ((rc = pto_task_output(o, wait, 0, &token)) != PTO_OK) return rc;
    a[0] = pto_arg_in(token);
    return pto_submit(o, "ring_check", a, 1);
}

static int ring_blocking(pto_orch *o) {
    uint64_t shape[1] = {N};
    pto_task fill, send;
    pto_tensor data;
    int rc;
    pto_arg a[1];
    a[0] = pto_arg_out_new(PTO_F32, 1, shape);
    if ((rc = pto_submit_ex(o, "ring_fill", a, 1, NULL, &fill)) != PTO_OK) return rc;
    if ((rc = pto_task_output(o, fill, 0, &data)) != PTO_OK) return rc;
    a[0] = pto_arg_in(data);
    if ((rc = pto_submit_ex(o, "ring_send_wait", a, 1, NULL, &send)) != PTO_OK) return rc;
    pto_task_opts after = {0};
    after.after = &send;
    after.nafter = 1;
    return pto_submit_ex(o, "ring_check_noarg", NULL, 0, &after, NULL);
}

static int ring_check_noarg(pto_kernel_ctx *ctx) { return ring_check(ctx); }

PTO_EXPORT uint32_t pto_plugin_abi_version(void) { return PTO_ABI_VERSION; }

PTO_EXPORT int pto_plugin_register(pto_registry *reg) {
    int rc = 0;
    rc |= pto_declare_buffer(reg, "inbox", PTO_F32, N);
    rc |= pto_declare_buffer(reg, "flag", PTO_U32, 1);
    rc |= pto_register_kernel(reg, "ring_fill", PTO_AIV, ring_fill);
    rc |= pto_register_kernel(reg, "ring_send", PTO_AIV, ring_send);
    rc |= pto_register_kernel(reg, "ring_wait", PTO_AIV, ring_wait);
    rc |= pto_register_kernel(reg, "ring_send_wait", PTO_AIV, ring_send_wait);
    rc |= pto_register_kernel(reg, "ring_check", PTO_AIV, ring_check);
    rc |= pto_register_kernel(reg, "ring_check_noarg", PTO_AIV, ring_check_noarg);
    rc |= pto_register_program(reg, "ring", ring);
    rc |= pto_register_program(reg, "ring_blocking", ring_blocking);
    return rc == 0 ? 0 : -1;
}
