/* Plugins that must be refused, one per -D flag; the pto-cli tests build each. */
#include "pto.h"

int bad_k(pto_kernel_ctx *ctx);
int bad_prog(pto_orch *o);
int bad_k(pto_kernel_ctx *ctx) { (void)ctx; return PTO_OK; }
int bad_prog(pto_orch *o) { (void)o; return PTO_OK; }

#if defined(ABI_MISMATCH)
PTO_EXPORT uint32_t pto_plugin_abi_version(void) { return 999; }
#endif

#if !defined(NO_REGISTER)
PTO_EXPORT int pto_plugin_register(pto_registry *reg) {
#if defined(DUPLICATE_KERNEL)
    pto_register_kernel(reg, "twice", PTO_AIV, bad_k);
    pto_register_kernel(reg, "twice", PTO_AIV, bad_k); /* its error ignored: still refused */
#elif defined(BUILTIN_NAME)
    pto_register_kernel(reg, "vector_add", PTO_AIV, bad_k);
#elif defined(BUFFER_TWICE)
    pto_declare_buffer(reg, "b", PTO_F32, 16);
    pto_declare_buffer(reg, "b", PTO_F32, 32);
#elif defined(REGISTER_FAILS)
    return 7;
#endif
    pto_register_program(reg, "prog", bad_prog);
    return 0;
}
#else
PTO_EXPORT void pto_plugin_teardown(void) {}
#endif
