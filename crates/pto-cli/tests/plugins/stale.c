/* A signal reused across two barriers: each rank notifies the next rank's flag and waits for
 * it, twice, with a barrier after each round. `stale` waits for 1 both times, so its second
 * wait passes on the first round's notify (a stale signal, which pto check warns about);
 * `raised` notifies again and waits for 2. The pto-cli tests run it. */
#include "pto.h"

static int rounds(pto_kernel_ctx *ctx) {
    uint32_t r, n;
    int64_t raised;
    int rc;
    if ((rc = pto_rank(ctx, &r)) || (rc = pto_nranks(ctx, &n))) return rc;
    if ((rc = pto_scalar_i64(ctx, 0, &raised))) return rc;
    for (uint32_t round = 1; round <= 2; round++) {
        if ((round == 1 || raised) && (rc = pto_notify(ctx, (r + 1) % n, "flag", 0, 1))) return rc;
        if ((rc = pto_wait_until(ctx, "flag", 0, raised ? round : 1))) return rc;
        if ((rc = pto_barrier(ctx))) return rc;
    }
    return PTO_OK;
}

static int stale_prog(pto_orch *o) {
    pto_arg a = pto_arg_i64(0);
    return pto_submit(o, "rounds", &a, 1);
}

static int raised_prog(pto_orch *o) {
    pto_arg a = pto_arg_i64(1);
    return pto_submit(o, "rounds", &a, 1);
}

PTO_EXPORT int pto_plugin_register(pto_registry *reg) {
    int rc = 0;
    rc |= pto_declare_buffer(reg, "flag", PTO_U32, 4);
    rc |= pto_register_kernel(reg, "rounds", PTO_AIV, rounds);
    rc |= pto_register_program(reg, "stale", stale_prog);
    rc |= pto_register_program(reg, "raised", raised_prog);
    return rc;
}
