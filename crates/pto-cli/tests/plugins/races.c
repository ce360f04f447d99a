/* Deliberately wrong distributed programs for `pto check`, each next to its fixed twin (run on
 * 2 ranks; rank 0 and rank 1 play the two sides, further ranks only meet the barriers). Every
 * kernel takes one i64 scalar: 0 = the wrong program, 1 = the fixed one (2 = a variant).
 *
 *   ptr_racy / ptr_ordered / ptr_early: rank 0 writes its `box` through pto_window_ptr and rank
 *       1 pto_get's it, with no ordering / after a notify -> wait; ptr_early: rank 1 puts into
 *       rank 0's `box` and notifies, rank 0 takes the pointer before waiting and reads after.
 *   mailbox_racy / mailbox_fixed: every rank puts into slot 0 of rank 0's `mailbox` / into its
 *       own slot (a write-write race of two puts into one slot).
 *   wrong_signal / right_signal: rank 0 notifies flag[1] early, then puts into rank 1's `inbox`
 *       and notifies flag[0]; rank 1 reads its inbox after waiting on flag[1] / on flag[0].
 *   staging_racy / staging_fixed: two rounds through rank 1's `stage` (round r notifies
 *       flag[r]); rank 0 reuses the staging buffer with no barrier / after a barrier.
 *
 * The pto-cli tests (tests/check.rs) run them. */
#include "pto.h"

#define CHECK(call)                  \
    do {                             \
        int rc_ = (call);            \
        if (rc_ != PTO_OK) return rc_; \
    } while (0)

static int mode_of(pto_kernel_ctx *ctx, uint32_t *rank, uint32_t *n, int64_t *mode) {
    CHECK(pto_rank(ctx, rank));
    CHECK(pto_nranks(ctx, n));
    CHECK(pto_scalar_i64(ctx, 0, mode));
    if (*n < 2) return pto_fail(ctx, "races.c: run on at least 2 ranks");
    return PTO_OK;
}

static int through_ptr(pto_kernel_ctx *ctx) {
    uint32_t r, n;
    int64_t mode;
    float got[4] = {0}, mine[4] = {5, 6, 7, 8};
    float *box;
    CHECK(mode_of(ctx, &r, &n, &mode));
    if (mode == 2) {
        /* The pointer is taken before the wait; the reads through it come after. */
        if (r == 1) {
            CHECK(pto_put(ctx, 0, "box", 0, mine, sizeof mine));
            CHECK(pto_notify(ctx, 0, "flag", 0, 1));
        } else if (r == 0) {
            CHECK(pto_window_ptr(ctx, "box", (void **)&box, NULL));
            CHECK(pto_wait_until(ctx, "flag", 0, 1));
            if (box[3] != 8.0f) return pto_fail(ctx, "ptr_early: box[3] != 8 after the wait");
        }
        return PTO_OK;
    }
    if (r == 0) {
        CHECK(pto_window_ptr(ctx, "box", (void **)&box, NULL));
        for (int i = 0; i < 4; i++) box[i] = (float)(i + 1);
        if (mode == 1) CHECK(pto_notify(ctx, 1, "flag", 0, 1));
    } else if (r == 1) {
        if (mode == 1) CHECK(pto_wait_until(ctx, "flag", 0, 1));
        CHECK(pto_get(ctx, 0, "box", 0, got, sizeof got));
        if (mode == 1 && got[3] != 4.0f) return pto_fail(ctx, "ptr_ordered: box[3] != 4");
    }
    return PTO_OK;
}

static int mailbox(pto_kernel_ctx *ctx) {
    uint32_t r, n;
    int64_t mode;
    float mine[2], got[2];
    CHECK(mode_of(ctx, &r, &n, &mode));
    if (r > 1) return PTO_OK;
    mine[0] = mine[1] = (float)(r + 1);
    /* Slot 0 for everybody (wrong), or slot r. */
    CHECK(pto_put(ctx, 0, "mailbox", mode ? r * sizeof mine : 0, mine, sizeof mine));
    CHECK(pto_notify(ctx, 0, "flag", 0, 1));
    if (r == 0) {
        CHECK(pto_wait_until(ctx, "flag", 0, 2));
        CHECK(pto_get(ctx, 0, "mailbox", 0, got, sizeof got));
    }
    return PTO_OK;
}

static int signals(pto_kernel_ctx *ctx) {
    uint32_t r, n;
    int64_t mode;
    float data[4] = {2, 2, 2, 2}, got[4];
    CHECK(mode_of(ctx, &r, &n, &mode));
    if (r == 0) {
        CHECK(pto_notify(ctx, 1, "flag", 4, 1));
        CHECK(pto_put(ctx, 1, "inbox", 0, data, sizeof data));
        CHECK(pto_notify(ctx, 1, "flag", 0, 1));
    } else if (r == 1) {
        /* flag[1] says nothing about the put; flag[0] does. */
        CHECK(pto_wait_until(ctx, "flag", mode ? 0 : 4, 1));
        CHECK(pto_get(ctx, 1, "inbox", 0, got, sizeof got));
        CHECK(pto_wait_until(ctx, "flag", mode ? 4 : 0, 1));
        if (mode && got[0] != 2.0f) return pto_fail(ctx, "right_signal: inbox[0] != 2");
    }
    return PTO_OK;
}

static int staging(pto_kernel_ctx *ctx) {
    uint32_t r, n;
    int64_t mode;
    float data[4], got[4];
    CHECK(mode_of(ctx, &r, &n, &mode));
    for (uint32_t round = 0; round < 2; round++) {
        if (r == 0) {
            for (int i = 0; i < 4; i++) data[i] = (float)(round + 1);
            CHECK(pto_put(ctx, 1, "stage", 0, data, sizeof data));
            CHECK(pto_notify(ctx, 1, "flag", 4 * round, 1));
        } else if (r == 1) {
            CHECK(pto_wait_until(ctx, "flag", 4 * round, 1));
            CHECK(pto_get(ctx, 1, "stage", 0, got, sizeof got));
            if (mode && got[0] != (float)(round + 1)) return pto_fail(ctx, "staging_fixed: a round's data was overwritten");
        }
        /* The barrier that says rank 1 is done with the staging buffer. */
        if (mode) CHECK(pto_barrier(ctx));
    }
    return PTO_OK;
}

static int submit(pto_orch *o, const char *kernel, int64_t mode) {
    pto_arg a = pto_arg_i64(mode);
    return pto_submit(o, kernel, &a, 1);
}

static int ptr_racy(pto_orch *o) { return submit(o, "through_ptr", 0); }
static int ptr_ordered(pto_orch *o) { return submit(o, "through_ptr", 1); }
static int ptr_early(pto_orch *o) { return submit(o, "through_ptr", 2); }
static int mailbox_racy(pto_orch *o) { return submit(o, "mailbox", 0); }
static int mailbox_fixed(pto_orch *o) { return submit(o, "mailbox", 1); }
static int wrong_signal(pto_orch *o) { return submit(o, "signals", 0); }
static int right_signal(pto_orch *o) { return submit(o, "signals", 1); }
static int staging_racy(pto_orch *o) { return submit(o, "staging", 0); }
static int staging_fixed(pto_orch *o) { return submit(o, "staging", 1); }

PTO_EXPORT int pto_plugin_register(pto_registry *reg) {
    int rc = 0;
    rc |= pto_declare_buffer(reg, "box", PTO_F32, 4);
    rc |= pto_declare_buffer(reg, "mailbox", PTO_F32, 4);
    rc |= pto_declare_buffer(reg, "inbox", PTO_F32, 4);
    rc |= pto_declare_buffer(reg, "stage", PTO_F32, 4);
    rc |= pto_declare_buffer(reg, "flag", PTO_U32, 4);
    rc |= pto_register_kernel(reg, "through_ptr", PTO_AIV, through_ptr);
    rc |= pto_register_kernel(reg, "mailbox", PTO_AIV, mailbox);
    rc |= pto_register_kernel(reg, "signals", PTO_AIV, signals);
    rc |= pto_register_kernel(reg, "staging", PTO_AIV, staging);
    rc |= pto_register_program(reg, "ptr_racy", ptr_racy);
    rc |= pto_register_program(reg, "ptr_ordered", ptr_ordered);
    rc |= pto_register_program(reg, "ptr_early", ptr_early);
    rc |= pto_register_program(reg, "mailbox_racy", mailbox_racy);
    rc |= pto_register_program(reg, "mailbox_fixed", mailbox_fixed);
    rc |= pto_register_program(reg, "wrong_signal", wrong_signal);
    rc |= pto_register_program(reg, "right_signal", right_signal);
    rc |= pto_register_program(reg, "staging_racy", staging_racy);
    rc |= pto_register_program(reg, "staging_fixed", staging_fixed);
    return rc;
}
