/* A plugin whose programs fail in the ways a user's can (pto_fail, a bad call whose code the
 * kernel returns, a crash, a program that fails, a kernel that checks every call's error code
 * on bad arguments), and one that uses what a program can do besides: host tensors written
 * and read back, SPMD blocks, scalars, explicit dependencies. The pto-cli tests run it. */
#include <stdio.h>
#include <string.h>

#include "pto.h"

static int boom(pto_kernel_ctx *ctx) { return pto_fail(ctx, "boom: value 42 is wrong"); }

static int after_boom(pto_kernel_ctx *ctx) {
    (void)ctx;
    fprintf(stderr, "after_boom ran\n");
    return PTO_OK;
}

static int bad_put(pto_kernel_ctx *ctx) {
    float x = 1.0f;
    return pto_put(ctx, 99, "buf", 0, &x, sizeof x);
}

static int crash(pto_kernel_ctx *ctx) {
    uint32_t rank;
    pto_rank(ctx, &rank);
    /* A real fault: raise(SIGSEGV) alone returns after Rust's own SIGSEGV handler. */
    if (rank == 1) *(volatile int *)0 = 1;
    return PTO_OK;
}

#define EXPECT(call, code)                                                                   \
    do {                                                                                     \
        int rc_ = (call);                                                                    \
        if (rc_ != (code)) {                                                                 \
            char m_[256];                                                                    \
            snprintf(m_, sizeof m_, "%s returned %d, expected %d (%s)", #call, rc_, (code), \
                     pto_last_error(ctx));                                                   \
            return pto_fail(ctx, m_);                                                        \
        }                                                                                    \
    } while (0)

/* t0: IN f32[4] (a window tensor), s0: f64 2.5. Every bad call returns its code. */
static int bad_calls(pto_kernel_ctx *ctx) {
    float x[4] = {0};
    void *p;
    uint64_t n;
    double d;
    int32_t i;
    pto_view v;
    uint32_t nt, ns;
    EXPECT(pto_num_args(ctx, &nt, &ns), PTO_OK);
    if (nt != 1 || ns != 1) return pto_fail(ctx, "bad_calls: expects one tensor and one scalar");
    EXPECT(pto_put(ctx, 99, "buf", 0, x, 4), PTO_ERR_RANGE);
    EXPECT(pto_put(ctx, 0, "nope", 0, x, 4), PTO_ERR_NOT_FOUND);
    EXPECT(pto_put(ctx, 0, "buf", 12, x, 8), PTO_ERR_RANGE);
    EXPECT(pto_put(ctx, 0, "buf", UINT64_MAX, x, 8), PTO_ERR_RANGE);
    EXPECT(pto_put(ctx, 0, NULL, 0, x, 4), PTO_ERR_ARG);
    EXPECT(pto_put(ctx, 0, "buf", 0, NULL, 4), PTO_ERR_ARG);
    EXPECT(pto_get(ctx, 0, "buf", 0, NULL, 4), PTO_ERR_ARG);
    EXPECT(pto_notify(ctx, 0, "buf", 2, 1), PTO_ERR_ARG);
    EXPECT(pto_wait_until(ctx, "nope", 0, 1), PTO_ERR_NOT_FOUND);
    EXPECT(pto_window_ptr(ctx, "nope", &p, &n), PTO_ERR_NOT_FOUND);
    EXPECT(pto_window_ptr(ctx, "buf", NULL, &n), PTO_ERR_ARG);
    EXPECT(pto_tensor_view(ctx, 5, 0, &v), PTO_ERR_RANGE);
    EXPECT(pto_tensor_view(ctx, 0, 0, NULL), PTO_ERR_ARG);
    EXPECT(pto_scalar_i32(ctx, 0, &i), PTO_ERR_DTYPE);
    EXPECT(pto_scalar_f64(ctx, 3, &d), PTO_ERR_RANGE);
    EXPECT(pto_scalar_f64(ctx, 0, &d), PTO_OK);
    if (d != 2.5) return pto_fail(ctx, "bad_calls: scalar 0 is not 2.5");
    EXPECT(pto_defer_until(ctx, "buf", 0, 1), PTO_ERR_STATE);
    EXPECT(pto_rank(ctx, NULL), PTO_ERR_ARG);
    EXPECT(pto_tensor_view(ctx, 0, 0, &v), PTO_OK);
    if (v.writable || v.count != 4 || v.dtype != PTO_F32) return pto_fail(ctx, "bad_calls: view");
    /* A read-only argument cannot also be taken for writing elsewhere: the view stays. */
    EXPECT(pto_window_ptr(ctx, "buf", &p, &n), PTO_OK);
    if (n != 16) return pto_fail(ctx, "bad_calls: buf is not 16 bytes");
    if (strlen(pto_strerror(PTO_ERR_RANGE)) == 0) return pto_fail(ctx, "strerror");
    return PTO_OK;
}

static int fail_prog(pto_orch *o) {
    uint64_t one[1] = {1};
    pto_task t;
    pto_tensor tok;
    pto_arg a = pto_arg_out_new(PTO_I32, 1, one);
    int rc = pto_submit_ex(o, "boom", &a, 1, NULL, &t);
    if (rc) return rc;
    if ((rc = pto_task_output(o, t, 0, &tok))) return rc;
    a = pto_arg_in(tok);
    return pto_submit(o, "after_boom", &a, 1);
}

static int bad_put_prog(pto_orch *o) { return pto_submit(o, "bad_put", NULL, 0); }

static int crash_prog(pto_orch *o) { return pto_submit(o, "crash", NULL, 0); }

static int bad_calls_prog(pto_orch *o) {
    pto_tensor buf;
    pto_arg a[2];
    int rc = pto_window_tensor(o, "buf", &buf);
    if (rc) return rc;
    a[0] = pto_arg_in(buf);
    a[1] = pto_arg_f64(2.5);
    if (pto_submit(o, "no_such_kernel", NULL, 0) != PTO_ERR_NOT_FOUND) return -100;
    if (pto_window_tensor(o, "nope", &buf) != PTO_ERR_NOT_FOUND) return -101;
    if (pto_submit(o, "bad_calls", NULL, 3) != PTO_ERR_ARG) return -102;
    return pto_submit(o, "bad_calls", a, 2);
}

static int program_fails(pto_orch *o) {
    pto_arg a = pto_arg_in(12345);
    return pto_submit(o, "boom", &a, 1);
}

/* SPMD: t0 (OUT f32[64]) taken in chunks; each block writes s0 * (block + 1) into its rows. */
static int spmd_fill(pto_kernel_ctx *ctx) {
    uint32_t b, nb;
    double s;
    pto_view v;
    int rc;
    if ((rc = pto_block(ctx, &b, &nb))) return rc;
    if ((rc = pto_scalar_f64(ctx, 0, &s))) return rc;
    /* The whole tensor is refused to a block of an SPMD task that writes it. */
    if (nb > 1 && pto_tensor_view(ctx, 0, 0, &v) != PTO_ERR_MODE) return pto_fail(ctx, "whole view of an SPMD output");
    if ((rc = pto_tensor_view(ctx, 0, 1, &v))) return rc;
    if (!v.writable) return pto_fail(ctx, "spmd_fill: the chunk is not writable");
    for (uint64_t i = 0; i < v.count; i++) ((float *)v.data)[i * v.strides[0]] = (float)(s * (b + 1));
    return PTO_OK;
}

/* t0: IN f32[64], t1: INOUT i32[1]: adds t0[0] + t0[63] to t1[0]. */
static int spmd_sum(pto_kernel_ctx *ctx) {
    void *in, *acc;
    int rc;
    if ((rc = pto_tensor_ptr(ctx, 0, &in))) return rc;
    if ((rc = pto_tensor_ptr(ctx, 1, &acc))) return rc;
    ((int32_t *)acc)[0] += (int32_t)(((float *)in)[0] + ((float *)in)[63]);
    return PTO_OK;
}

static int spmd_prog(pto_orch *o) {
    uint64_t n64[1] = {64}, one[1] = {1};
    pto_tensor data, acc;
    pto_task fill;
    int32_t start = 5, got = 0;
    int rc;
    if ((rc = pto_tensor_new(o, PTO_F32, 1, n64, &data))) return rc;
    if ((rc = pto_tensor_new(o, PTO_I32, 1, one, &acc))) return rc;
    if ((rc = pto_tensor_write(o, acc, &start, sizeof start))) return rc;
    if (pto_tensor_write(o, acc, &start, 3) != PTO_ERR_RANGE) return -200;
    pto_arg a[2];
    a[0] = pto_arg_out(data);
    a[1] = pto_arg_f64(10.0);
    pto_task_opts spmd = {0};
    spmd.blocks = 4;
    if ((rc = pto_submit_ex(o, "spmd_fill", a, 2, &spmd, &fill))) return rc;
    /* No tensor in common: ordered by the explicit dependency. */
    pto_task_opts after = {0};
    after.after = &fill;
    after.nafter = 1;
    if ((rc = pto_submit_ex(o, "noop", NULL, 0, &after, NULL))) return rc;
    a[0] = pto_arg_in(data);
    a[1] = pto_arg_inout(acc);
    if ((rc = pto_submit(o, "spmd_sum", a, 2))) return rc;
    if ((rc = pto_tensor_read(o, acc, &got, sizeof got))) return rc;
    /* Block 0 wrote 10 into row 0, block 3 wrote 40 into row 63: 5 + 10 + 40. */
    return got == 55 ? PTO_OK : -201;
}

/* Puts into the next rank's buf and notifies its flag; with `wait` set (scalar 0), reads its
 * own buf only after its flag says the previous rank's put arrived, else at once (a race
 * that pto check reports). */
static int exchange(pto_kernel_ctx *ctx) {
    uint32_t r, n;
    int64_t wait;
    float mine[4] = {1, 2, 3, 4}, got[4];
    int rc;
    if ((rc = pto_rank(ctx, &r)) || (rc = pto_nranks(ctx, &n))) return rc;
    if ((rc = pto_scalar_i64(ctx, 0, &wait))) return rc;
    if ((rc = pto_put(ctx, (r + 1) % n, "buf", 0, mine, sizeof mine))) return rc;
    if ((rc = pto_notify(ctx, (r + 1) % n, "flag", 0, 1))) return rc;
    if (wait && (rc = pto_wait_until(ctx, "flag", 0, 1))) return rc;
    if ((rc = pto_get(ctx, r, "buf", 0, got, sizeof got))) return rc;
    if (!wait && (rc = pto_wait_until(ctx, "flag", 0, 1))) return rc;
    return PTO_OK;
}

static int racy_prog(pto_orch *o) {
    pto_arg a = pto_arg_i64(0);
    return pto_submit(o, "exchange", &a, 1);
}

static int ordered_prog(pto_orch *o) {
    pto_arg a = pto_arg_i64(1);
    return pto_submit(o, "exchange", &a, 1);
}

PTO_EXPORT int pto_plugin_register(pto_registry *reg) {
    int rc = 0;
    rc |= pto_declare_buffer(reg, "buf", PTO_F32, 4);
    rc |= pto_declare_buffer(reg, "flag", PTO_U32, 4);
    rc |= pto_register_kernel(reg, "exchange", PTO_AIV, exchange);
    rc |= pto_register_program(reg, "racy", racy_prog);
    rc |= pto_register_program(reg, "ordered", ordered_prog);
    rc |= pto_register_kernel(reg, "boom", PTO_AIV, boom);
    rc |= pto_register_kernel(reg, "after_boom", PTO_AIV, after_boom);
    rc |= pto_register_kernel(reg, "bad_put", PTO_AIV, bad_put);
    rc |= pto_register_kernel(reg, "crash", PTO_AIV, crash);
    rc |= pto_register_kernel(reg, "bad_calls", PTO_AIV, bad_calls);
    rc |= pto_register_program(reg, "fail", fail_prog);
    rc |= pto_register_program(reg, "bad_put", bad_put_prog);
    rc |= pto_register_program(reg, "crash", crash_prog);
    rc |= pto_register_program(reg, "bad_calls", bad_calls_prog);
    rc |= pto_register_program(reg, "program_fails", program_fails);
    rc |= pto_register_kernel(reg, "spmd_fill", PTO_AIV, spmd_fill);
    rc |= pto_register_kernel(reg, "spmd_sum", PTO_AIV, spmd_sum);
    rc |= pto_register_program(reg, "spmd", spmd_prog);
    return rc;
}
