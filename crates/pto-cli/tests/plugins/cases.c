/* A plugin whose programs fail in the ways a user's can (pto_fail, a bad call whose code the
 * kernel returns, a crash, a program that fails, a kernel that checks every call's error code
 * on bad arguments), and one that uses what a program can do besides: host tensors written
 * and read back, SPMD blocks, scalars, explicit dependencies; and `calls`, which uses every
 * call the others leave out (pto_barrier, pto_orch_rank/nranks, the tensor and scalar
 * accessors, NO_DEP and every scalar dtype, AIC and MIX kernels) and checks each result.
 * `stall` never finishes its kernel on rank 1 (for 10 s). The pto-cli tests run it. */
#define _POSIX_C_SOURCE 200809L /* nanosleep under -std=c11 */
#include <stdio.h>
#include <string.h>
#include <time.h>

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

/* Rank 1's kernel does not finish (for 10 s): the stall detector's case. */
static int stall(pto_kernel_ctx *ctx) {
    uint32_t rank;
    pto_rank(ctx, &rank);
    if (rank == 1) {
        struct timespec t = {10, 0};
        nanosleep(&t, NULL);
    }
    return PTO_OK;
}

static int stall_prog(pto_orch *o) { return pto_submit(o, "stall", NULL, 0); }

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

/* ---- every call the programs above leave out, checked where it returns ------------------ */

#define CALLS_U64 0x123456789abcdef1ull /* odd and above 2^53: lost if it went through a double */
#define CALLS_U32 0xdeadbeefu
#define CALLS_MAX_RANKS 8

/* On AIC. t0: IN i32[3][5] holding 0..14; t1: NO_DEP u64[2]; t2: OUT_NEW i32[1];
 * s0: f32 1.5, s1: i32 -7, s2: u32 0xdeadbeef, s3: u64 CALLS_U64, s4: u32 the program's
 * pto_orch_rank, s5: u32 its pto_orch_nranks. Checks the tensor and scalar accessors, then
 * writes {s3, rank} into t1 and 1 into t2. */
static int calls_aic(pto_kernel_ctx *ctx) {
    uint32_t nt, ns, ndim, r, n, orch_r, orch_n, u32v;
    uint64_t count, shape[PTO_MAX_DIMS], u64v;
    pto_dtype dtype;
    float f32v;
    int32_t i32v;
    int64_t i64v;
    double f64v;
    void *p;
    EXPECT(pto_num_args(ctx, &nt, &ns), PTO_OK);
    if (nt != 3 || ns != 6) return pto_fail(ctx, "calls_aic: expects 3 tensors and 6 scalars");
    /* Tensor accessors. */
    EXPECT(pto_tensor_count(ctx, 0, &count), PTO_OK);
    if (count != 15) return pto_fail(ctx, "calls_aic: pto_tensor_count of t0 is not 15");
    EXPECT(pto_tensor_dtype(ctx, 0, &dtype), PTO_OK);
    if (dtype != PTO_I32) return pto_fail(ctx, "calls_aic: pto_tensor_dtype of t0 is not I32");
    EXPECT(pto_tensor_shape(ctx, 0, &ndim, shape), PTO_OK);
    if (ndim != 2 || shape[0] != 3 || shape[1] != 5)
        return pto_fail(ctx, "calls_aic: pto_tensor_shape of t0 is not [3, 5]");
    EXPECT(pto_tensor_ptr(ctx, 0, &p), PTO_OK);
    for (int32_t k = 0; k < 15; k++)
        if (((const int32_t *)p)[k] != k) return pto_fail(ctx, "calls_aic: t0[k] != k");
    EXPECT(pto_tensor_count(ctx, 1, &count), PTO_OK);
    if (count != 2) return pto_fail(ctx, "calls_aic: pto_tensor_count of t1 is not 2");
    EXPECT(pto_tensor_dtype(ctx, 1, &dtype), PTO_OK);
    if (dtype != PTO_U64) return pto_fail(ctx, "calls_aic: pto_tensor_dtype of t1 is not U64");
    EXPECT(pto_tensor_shape(ctx, 2, &ndim, shape), PTO_OK);
    if (ndim != 1 || shape[0] != 1) return pto_fail(ctx, "calls_aic: t2 is not [1]");
    EXPECT(pto_tensor_count(ctx, 3, &count), PTO_ERR_RANGE);
    EXPECT(pto_tensor_dtype(ctx, 3, &dtype), PTO_ERR_RANGE);
    EXPECT(pto_tensor_shape(ctx, 3, &ndim, shape), PTO_ERR_RANGE);
    /* Scalar accessors, each of the right dtype, and reads as another dtype refused. */
    EXPECT(pto_scalar_f32(ctx, 0, &f32v), PTO_OK);
    if (f32v != 1.5f) return pto_fail(ctx, "calls_aic: pto_scalar_f32(0) is not 1.5");
    EXPECT(pto_scalar_i32(ctx, 1, &i32v), PTO_OK);
    if (i32v != -7) return pto_fail(ctx, "calls_aic: pto_scalar_i32(1) is not -7");
    EXPECT(pto_scalar_u32(ctx, 2, &u32v), PTO_OK);
    if (u32v != CALLS_U32) return pto_fail(ctx, "calls_aic: pto_scalar_u32(2) is not 0xdeadbeef");
    EXPECT(pto_scalar_u64(ctx, 3, &u64v), PTO_OK);
    if (u64v != CALLS_U64) return pto_fail(ctx, "calls_aic: pto_scalar_u64(3) lost bits");
    EXPECT(pto_scalar_f64(ctx, 0, &f64v), PTO_ERR_DTYPE);
    EXPECT(pto_scalar_i64(ctx, 1, &i64v), PTO_ERR_DTYPE);
    EXPECT(pto_scalar_u64(ctx, 2, &u64v), PTO_ERR_DTYPE);
    EXPECT(pto_scalar_u32(ctx, 3, &u32v), PTO_ERR_DTYPE);
    EXPECT(pto_scalar_f32(ctx, 6, &f32v), PTO_ERR_RANGE);
    /* The kernel's rank and size are the program's. */
    EXPECT(pto_scalar_u32(ctx, 4, &orch_r), PTO_OK);
    EXPECT(pto_scalar_u32(ctx, 5, &orch_n), PTO_OK);
    EXPECT(pto_rank(ctx, &r), PTO_OK);
    EXPECT(pto_nranks(ctx, &n), PTO_OK);
    if (r != orch_r || n != orch_n) {
        char m[128];
        snprintf(m, sizeof m, "calls_aic: pto_rank/pto_nranks %u/%u, the program had %u/%u", r, n,
                 orch_r, orch_n);
        return pto_fail(ctx, m);
    }
    /* A NO_DEP argument may be written; the program orders its read itself (through t2). */
    EXPECT(pto_tensor_ptr(ctx, 1, &p), PTO_OK);
    ((uint64_t *)p)[0] = u64v;
    ((uint64_t *)p)[1] = r;
    EXPECT(pto_tensor_ptr(ctx, 2, &p), PTO_OK);
    ((int32_t *)p)[0] = 1;
    return PTO_OK;
}

/* On MIX. t0: OUT_NEW u32[1]. Puts 10 * (rank + 1) into slot `rank` of every rank's `seen`,
 * meets every rank in pto_barrier, then checks that its own `seen` holds every rank's value
 * and writes the number of ranks it saw into t0. */
static int calls_mix(pto_kernel_ctx *ctx) {
    uint32_t r, n, v, q, *seen;
    uint64_t bytes;
    void *p;
    EXPECT(pto_rank(ctx, &r), PTO_OK);
    EXPECT(pto_nranks(ctx, &n), PTO_OK);
    if (n > CALLS_MAX_RANKS) return pto_fail(ctx, "calls_mix: at most 8 ranks");
    v = 10 * (r + 1);
    for (q = 0; q < n; q++) EXPECT(pto_put(ctx, q, "seen", 4 * r, &v, sizeof v), PTO_OK);
    EXPECT(pto_barrier(ctx), PTO_OK);
    EXPECT(pto_window_ptr(ctx, "seen", &p, &bytes), PTO_OK);
    if (bytes != 4 * CALLS_MAX_RANKS) return pto_fail(ctx, "calls_mix: seen is not u32[8]");
    seen = (uint32_t *)p;
    for (q = 0; q < n; q++) {
        if (seen[q] != 10 * (q + 1)) {
            char m[128];
            snprintf(m, sizeof m, "rank %u after pto_barrier: seen[%u] = %u, expected %u", r, q,
                     seen[q], 10 * (q + 1));
            return pto_fail(ctx, m);
        }
    }
    /* A second barrier: no rank leaves while another still reads its `seen`. */
    EXPECT(pto_barrier(ctx), PTO_OK);
    EXPECT(pto_tensor_ptr(ctx, 0, &p), PTO_OK);
    ((uint32_t *)p)[0] = n;
    return PTO_OK;
}

/* Runs calls_aic and calls_mix and checks what they wrote; every failure returns its own
 * code (-300 and below) so that the run's error says which check failed. */
static int calls_prog(pto_orch *o) {
    uint32_t r = 99, n = 0, ranks_seen = 0;
    uint64_t shape[2] = {3, 5}, two[1] = {2}, one[1] = {1}, nodep[2] = {0, 0};
    int32_t init[15], done = 0;
    pto_tensor grid, side, token, count;
    pto_task aic, mix;
    pto_arg a[9];
    int rc, k;
    if ((rc = pto_orch_rank(o, &r)) || (rc = pto_orch_nranks(o, &n))) return rc;
    if (n < 1 || r >= n) return -300;
    if (pto_orch_rank(o, NULL) != PTO_ERR_ARG || pto_orch_nranks(o, NULL) != PTO_ERR_ARG)
        return -301;
    for (k = 0; k < 15; k++) init[k] = k;
    if ((rc = pto_tensor_new(o, PTO_I32, 2, shape, &grid))) return rc;
    if ((rc = pto_tensor_write(o, grid, init, sizeof init))) return rc;
    if ((rc = pto_tensor_new(o, PTO_U64, 1, two, &side))) return rc;
    a[0] = pto_arg_in(grid);
    a[1] = pto_arg_no_dep(side);
    a[2] = pto_arg_out_new(PTO_I32, 1, one);
    a[3] = pto_arg_f32(1.5f);
    a[4] = pto_arg_i32(-7);
    a[5] = pto_arg_u32(CALLS_U32);
    a[6] = pto_arg_u64(CALLS_U64);
    a[7] = pto_arg_u32(r);
    a[8] = pto_arg_u32(n);
    if (a[1].kind != PTO_ARG_NO_DEP || a[3].dtype != PTO_F32 || a[4].dtype != PTO_I32 ||
        a[5].dtype != PTO_U32 || a[6].dtype != PTO_U64)
        return -302;
    if ((rc = pto_submit_ex(o, "calls_aic", a, 9, NULL, &aic))) return rc;
    a[0] = pto_arg_out_new(PTO_U32, 1, one);
    if ((rc = pto_submit_ex(o, "calls_mix", a, 1, NULL, &mix))) return rc;
    /* Reading the token waits for calls_aic; only then is the NO_DEP tensor read. */
    if ((rc = pto_task_output(o, aic, 0, &token))) return rc;
    if ((rc = pto_tensor_read(o, token, &done, sizeof done))) return rc;
    if (done != 1) return -303;
    if ((rc = pto_tensor_read(o, side, nodep, sizeof nodep))) return rc;
    if (nodep[0] != CALLS_U64 || nodep[1] != r) return -304;
    if ((rc = pto_task_output(o, mix, 0, &count))) return rc;
    if ((rc = pto_tensor_read(o, count, &ranks_seen, sizeof ranks_seen))) return rc;
    if (ranks_seen != n) return -305;
    return PTO_OK;
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
    rc |= pto_register_kernel(reg, "stall", PTO_AIV, stall);
    rc |= pto_register_program(reg, "stall", stall_prog);
    rc |= pto_register_kernel(reg, "bad_calls", PTO_AIV, bad_calls);
    rc |= pto_register_program(reg, "fail", fail_prog);
    rc |= pto_register_program(reg, "bad_put", bad_put_prog);
    rc |= pto_register_program(reg, "crash", crash_prog);
    rc |= pto_register_program(reg, "bad_calls", bad_calls_prog);
    rc |= pto_register_program(reg, "program_fails", program_fails);
    rc |= pto_register_kernel(reg, "spmd_fill", PTO_AIV, spmd_fill);
    rc |= pto_register_kernel(reg, "spmd_sum", PTO_AIV, spmd_sum);
    rc |= pto_register_program(reg, "spmd", spmd_prog);
    rc |= pto_declare_buffer(reg, "seen", PTO_U32, CALLS_MAX_RANKS);
    rc |= pto_register_kernel(reg, "calls_aic", PTO_AIC, calls_aic);
    rc |= pto_register_kernel(reg, "calls_mix", PTO_MIX, calls_mix);
    rc |= pto_register_program(reg, "calls", calls_prog);
    return rc;
}
