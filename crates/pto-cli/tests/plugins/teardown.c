/* A plugin that exports pto_plugin_teardown and leaves marker files saying which process did
 * what, in the folder named by the environment variable PTO_TEST_MARKER_DIR (or, when that is
 * unset, by the string literal PTO_TEST_MARKER_DIR defined at build time,
 * -DPTO_TEST_MARKER_DIR='"/some/dir"'; no marker without either):
 *
 *     teardown.<pid>   pto_plugin_teardown ran in process <pid> (one line per call)
 *     kernel.<pid>     the kernel `touch` ran in process <pid>
 *
 * Its program `touch` runs the kernel once per rank; `touch_fails` fails it. The pto-cli
 * plugin tests and the pto-plugin loader tests use it. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "pto.h"

static void mark(const char *what) {
    const char *dir = getenv("PTO_TEST_MARKER_DIR");
    char path[4096];
    FILE *f;
#ifdef PTO_TEST_MARKER_DIR
    if (dir == NULL) dir = PTO_TEST_MARKER_DIR;
#endif
    if (dir == NULL) return;
    snprintf(path, sizeof path, "%s/%s.%ld", dir, what, (long)getpid());
    f = fopen(path, "a");
    if (f == NULL) return;
    fprintf(f, "%s\n", what);
    fclose(f);
}

static int touch(pto_kernel_ctx *ctx) {
    (void)ctx;
    mark("kernel");
    return PTO_OK;
}

static int touch_fails(pto_kernel_ctx *ctx) {
    mark("kernel");
    return pto_fail(ctx, "touch_fails: as asked");
}

static int touch_prog(pto_orch *o) { return pto_submit(o, "touch", NULL, 0); }

static int touch_fails_prog(pto_orch *o) { return pto_submit(o, "touch_fails", NULL, 0); }

PTO_EXPORT uint32_t pto_plugin_abi_version(void) { return PTO_ABI_VERSION; }

PTO_EXPORT int pto_plugin_register(pto_registry *reg) {
    int rc = 0;
    rc |= pto_register_kernel(reg, "touch", PTO_AIV, touch);
    rc |= pto_register_kernel(reg, "touch_fails", PTO_AIV, touch_fails);
    rc |= pto_register_program(reg, "touch", touch_prog);
    rc |= pto_register_program(reg, "touch_fails", touch_fails_prog);
    return rc;
}

PTO_EXPORT void pto_plugin_teardown(void) { mark("teardown"); }
