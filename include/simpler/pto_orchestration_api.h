/* pto's simpler-compatible headers: the orchestration API.
 *
 * An orchestration is a shared library with a config function and an entry function, both
 * taking `const ChipTaskArgs &`; pto calls the entry inside an implicit scope on a chip's
 * orchestrator. Every runtime call goes through pto's table of operations (PtoSimplerOps,
 * versioned by PTO_SIMPLER_ABI_VERSION); this header gives the calls their simpler names:
 * rt_submit_task/aic/aiv, rt_submit_dummy_task, alloc_tensors, PTO2_SCOPE, rt_scope_begin/end,
 * get/set_tensor_data, rt_report_fatal, rt_is_fatal, LOG_*, rt_available_*_count.
 *
 * Binding: pto calls the exported pto_simpler_bind_runtime() (defined here, weak) on the thread
 * that runs the entry. See docs/design/simpler.md. */
#ifndef PTO_SIMPLER_ORCHESTRATION_API_H
#define PTO_SIMPLER_ORCHESTRATION_API_H

#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <type_traits>

#include "pto_types.h"
#include "tensor.h"
#include "tensor_create_info.h"

/* Bump on any change of the structures below. */
#define PTO_SIMPLER_ABI_VERSION 1

/* Error codes of rt_report_fatal (the names orchestrations use). */
inline constexpr int32_t PTO2_ERROR_NONE = 0;
inline constexpr int32_t PTO2_ERROR_INVALID_ARGS = 1;
inline constexpr int32_t PTO2_ERROR_SCOPE_DEADLOCK = 2;
inline constexpr int32_t PTO2_ERROR_OUT_OF_MEMORY = 3;
inline constexpr int32_t PTO2_ERROR_TENSOR_WAIT_TIMEOUT = 4;
inline constexpr int32_t PTO2_ERROR_USER = 100;

/* One tensor argument of a submit, flattened for the runtime. */
struct PtoSimplerTensorArg {
    const void *desc; /* a ChipTensor, or for OUTPUT a TensorCreateInfo */
    int32_t tag;      /* TensorArgType */
    int32_t reserved;
};

enum PtoSimplerSubmitKind : int32_t {
    PTO_SIMPLER_SUBMIT_TASK = 0,
    PTO_SIMPLER_SUBMIT_DUMMY = 1,
    PTO_SIMPLER_SUBMIT_ALLOC = 2,
};

/* A submit, flattened from CoreTaskArgs (pto's own layout). */
struct PtoSimplerSubmit {
    int32_t kind;
    int32_t kernel_ids[3]; /* aic, aiv0, aiv1; -1 unused */
    int32_t tensor_count;
    int32_t scalar_count;
    const PtoSimplerTensorArg *tensors;
    const uint64_t *scalars;
    const PTO2TaskId *deps;
    const uint8_t *dep_kinds; /* DepFlags per dep, or null: WAIT|RETAIN */
    uint32_t dep_count;
    int32_t block_num;
    uint8_t require_sync_start;
    uint8_t allow_early_resolve;
    uint8_t predicate_op; /* PredicateOp; 0 none */
    uint8_t reserved;
    int32_t timing_slot;
    const ChipTensor *predicate_tensor;
    uint32_t predicate_ndims;
    uint32_t predicate_indices[MAX_TENSOR_DIMS];
    int64_t predicate_target;
};

struct PTO2Runtime;

enum PtoSimplerLogLevel : int32_t {
    PTO_SIMPLER_LOG_ERROR = 0,
    PTO_SIMPLER_LOG_WARN = 1,
    PTO_SIMPLER_LOG_INFO = 2,
    PTO_SIMPLER_LOG_DEBUG = 3,
    PTO_SIMPLER_LOG_TIMING = 4,
};

/* pto's runtime operations. `size` is sizeof(PtoSimplerOps) as the runtime knows it. */
struct PtoSimplerOps {
    uint32_t abi_version;
    uint32_t size;
    /* 0 on success; on failure the run is fatal already and `out` is empty. */
    int32_t (*submit)(PTO2Runtime *rt, const PtoSimplerSubmit *s, TaskOutputTensors *out);
    void (*scope_begin)(PTO2Runtime *rt, uint8_t mode, const char *file, int32_t line);
    void (*scope_end)(PTO2Runtime *rt);
    void (*orchestration_done)(PTO2Runtime *rt);
    bool (*is_fatal)(PTO2Runtime *rt);
    void (*report_fatal)(PTO2Runtime *rt, int32_t code, const char *func, const char *message);
    void (*log)(PTO2Runtime *rt, int32_t level, const char *func, const char *message);
    uint64_t (*get_tensor_data)(PTO2Runtime *rt, const ChipTensor *t, uint32_t ndims, const uint32_t *indices);
    void (*set_tensor_data)(PTO2Runtime *rt, const ChipTensor *t, uint32_t ndims, const uint32_t *indices,
                            uint64_t value);
    int32_t (*available_cluster_count)(PTO2Runtime *rt);
    int32_t (*available_aiv_count)(PTO2Runtime *rt);
};

struct PTO2Runtime {
    const PtoSimplerOps *ops;
    PTO2ScopeMode pending_scope_mode;
    void *impl;
};

namespace pto_simpler_detail {
inline thread_local PTO2Runtime *current = nullptr;
}

/* Exported by every orchestration library: pto binds its runtime to the calling thread. */
extern "C" __attribute__((weak, visibility("default"))) void pto_simpler_bind_runtime(PTO2Runtime *rt) {
    pto_simpler_detail::current = rt;
}
extern "C" __attribute__((weak, visibility("default"))) int32_t pto_simpler_abi_version(void) {
    return PTO_SIMPLER_ABI_VERSION;
}

static inline PTO2Runtime *current_runtime() { return pto_simpler_detail::current; }
static inline PTO2Runtime *framework_current_runtime() { return pto_simpler_detail::current; }

/* printf-style formatting for the runtime (which takes finished text). */
static inline void pto_simpler_vformat(char *buf, size_t n, const char *fmt, va_list ap) {
    if (fmt == nullptr) {
        buf[0] = 0;
        return;
    }
    std::vsnprintf(buf, n, fmt, ap);
}

static inline void pto_simpler_log(int32_t level, const char *func, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    pto_simpler_vformat(buf, sizeof buf, fmt, ap);
    va_end(ap);
    PTO2Runtime *rt = current_runtime();
    if (rt != nullptr) {
        rt->ops->log(rt, level, func, buf);
    } else {
        std::fprintf(stderr, "[%s] %s\n", func, buf);
    }
}

static inline void pto_simpler_report_fatal(int32_t code, const char *func, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    pto_simpler_vformat(buf, sizeof buf, fmt, ap);
    va_end(ap);
    PTO2Runtime *rt = current_runtime();
    if (rt != nullptr) {
        rt->ops->report_fatal(rt, code, func, buf);
    } else {
        std::fprintf(stderr, "pto simpler: fatal %d in %s: %s\n", code, func, buf);
    }
}

#define LOG_ERROR(fmt, ...) pto_simpler_log(PTO_SIMPLER_LOG_ERROR, __FUNCTION__, fmt, ##__VA_ARGS__)
#define LOG_WARN(fmt, ...) pto_simpler_log(PTO_SIMPLER_LOG_WARN, __FUNCTION__, fmt, ##__VA_ARGS__)
#define LOG_INFO(fmt, ...) pto_simpler_log(PTO_SIMPLER_LOG_INFO, __FUNCTION__, fmt, ##__VA_ARGS__)
#define LOG_DEBUG(fmt, ...) pto_simpler_log(PTO_SIMPLER_LOG_DEBUG, __FUNCTION__, fmt, ##__VA_ARGS__)
#define LOG_TIMING(fmt, ...) pto_simpler_log(PTO_SIMPLER_LOG_TIMING, __FUNCTION__, fmt, ##__VA_ARGS__)

#define rt_report_fatal(code, fmt, ...) pto_simpler_report_fatal((code), __FUNCTION__, (fmt), ##__VA_ARGS__)

static inline bool rt_is_fatal() {
    PTO2Runtime *rt = current_runtime();
    return rt == nullptr || rt->ops->is_fatal(rt);
}

/* Flattens `args` and submits it; a latched argument error is fatal (INVALID_ARGS). */
template <size_t MaxT, size_t MaxS>
static inline TaskOutputTensors pto_simpler_submit(int32_t kind, const MixedKernels &mk, const Arg<MaxT, MaxS> &args) {
    TaskOutputTensors out;
    PTO2Runtime *rt = current_runtime();
    if (rt == nullptr || rt->ops->is_fatal(rt)) return out;
    if (args.has_error) {
        rt->ops->report_fatal(rt, PTO2_ERROR_INVALID_ARGS, "submit",
                              args.error_msg ? args.error_msg : "invalid task arguments");
        return out;
    }
    PtoSimplerTensorArg tensors[MaxT > 0 ? MaxT : 1];
    for (int32_t i = 0; i < args.tensor_count(); i++) {
        tensors[i].desc = args.tensor(i).raw();
        tensors[i].tag = static_cast<int32_t>(args.tag(i));
        tensors[i].reserved = 0;
    }
    PtoSimplerSubmit s{};
    s.kind = kind;
    s.kernel_ids[0] = mk.aic_kernel_id;
    s.kernel_ids[1] = mk.aiv0_kernel_id;
    s.kernel_ids[2] = mk.aiv1_kernel_id;
    s.tensor_count = args.tensor_count();
    s.scalar_count = args.scalar_count();
    s.tensors = tensors;
    s.scalars = args.scalar_data();
    s.deps = args.explicit_deps_data();
    s.dep_kinds = reinterpret_cast<const uint8_t *>(args.explicit_dep_kinds_data());
    s.dep_count = args.explicit_dep_count();
    s.block_num = args.launch_spec.block_num();
    s.require_sync_start = args.launch_spec.require_sync_start() ? 1 : 0;
    s.allow_early_resolve = args.allow_early_resolve() ? 1 : 0;
    s.timing_slot = args.task_timing_slot();
    const CoreTaskPredicate &p = args.predicate();
    s.predicate_op = static_cast<uint8_t>(p.op);
    s.predicate_tensor = p.operand.tensor;
    s.predicate_ndims = p.operand.ndims;
    for (int i = 0; i < MAX_TENSOR_DIMS; i++) s.predicate_indices[i] = p.operand.indices[i];
    s.predicate_target = p.target;
    rt->ops->submit(rt, &s, &out);
    return out;
}

static inline TaskOutputTensors rt_submit_task(const MixedKernels &mixed_kernels, const CoreTaskArgs &args) {
    return pto_simpler_submit(PTO_SIMPLER_SUBMIT_TASK, mixed_kernels, args);
}

static inline TaskOutputTensors rt_submit_aic_task(int32_t kernel_id, const CoreTaskArgs &args) {
    MixedKernels mk;
    mk.aic_kernel_id = kernel_id;
    return rt_submit_task(mk, args);
}

static inline TaskOutputTensors rt_submit_aiv_task(int32_t kernel_id, const CoreTaskArgs &args) {
    MixedKernels mk;
    mk.aiv0_kernel_id = kernel_id;
    return rt_submit_task(mk, args);
}

/* Joins the graph (dependencies, outputs) but runs no kernel. */
static inline TaskOutputTensors rt_submit_dummy_task(const CoreTaskArgs &args) {
    return pto_simpler_submit(PTO_SIMPLER_SUBMIT_DUMMY, MixedKernels{}, args);
}

/* Output-only allocation: the tensors exist at once, with no kernel to wait for. */
static inline TaskOutputTensors alloc_tensors(const CoreTaskArgs &args) {
    return pto_simpler_submit(PTO_SIMPLER_SUBMIT_ALLOC, MixedKernels{}, args);
}

static inline TaskOutputTensors alloc_tensors(const TensorCreateInfo create_infos[], uint32_t count) {
    CoreTaskArgs args;
    for (uint32_t i = 0; i < count; i++) args.add_output(create_infos[i]);
    return alloc_tensors(args);
}

template <typename... CIs>
static inline TaskOutputTensors alloc_tensors(const CIs &...cis) {
    static_assert(sizeof...(cis) > 0, "alloc_tensors: at least one TensorCreateInfo");
    static_assert((std::is_same_v<std::decay_t<CIs>, TensorCreateInfo> && ...),
                  "alloc_tensors: TensorCreateInfo arguments only");
    CoreTaskArgs args;
    (args.add_output(cis), ...);
    return alloc_tensors(args);
}

static inline void pto_simpler_scope_begin(PTO2ScopeMode mode, const char *file, int line) {
    PTO2Runtime *rt = current_runtime();
    if (rt == nullptr || rt->ops->is_fatal(rt)) return;
    rt->pending_scope_mode = mode;
    rt->ops->scope_begin(rt, static_cast<uint8_t>(mode), file, line);
}

static inline void rt_scope_begin(PTO2ScopeMode mode = PTO2ScopeMode::AUTO) {
    pto_simpler_scope_begin(mode, nullptr, 0);
}

static inline void rt_scope_end() {
    PTO2Runtime *rt = current_runtime();
    if (rt == nullptr || rt->ops->is_fatal(rt)) return;
    rt->ops->scope_end(rt);
}

static inline void rt_orchestration_done() {
    PTO2Runtime *rt = current_runtime();
    if (rt != nullptr) rt->ops->orchestration_done(rt);
}

static inline int32_t rt_available_cluster_count() {
    PTO2Runtime *rt = current_runtime();
    return rt == nullptr ? 0 : rt->ops->available_cluster_count(rt);
}

static inline int32_t rt_available_aiv_count() {
    PTO2Runtime *rt = current_runtime();
    return rt == nullptr ? 0 : rt->ops->available_aiv_count(rt);
}

/* Reads one element (waits until every task that writes it has finished). */
template <typename T = uint64_t>
static inline T get_tensor_data(const ChipTensor &tensor, uint32_t ndims, const uint32_t indices[]) {
    PTO2Runtime *rt = current_runtime();
    if (rt == nullptr || rt->ops->is_fatal(rt)) return from_u64<T>(0);
    return from_u64<T>(rt->ops->get_tensor_data(rt, &tensor, ndims, indices));
}

/* Writes one element (waits until every task that uses it has finished). */
template <typename T = uint64_t>
static inline void set_tensor_data(const ChipTensor &tensor, uint32_t ndims, const uint32_t indices[], T value) {
    PTO2Runtime *rt = current_runtime();
    if (rt == nullptr || rt->ops->is_fatal(rt)) return;
    rt->ops->set_tensor_data(rt, &tensor, ndims, indices, to_u64(value));
}

/* A scope for as long as the guard lives. */
class PTO2ScopeGuard {
public:
    explicit PTO2ScopeGuard(PTO2ScopeMode mode = PTO2ScopeMode::AUTO, const char *file = __builtin_FILE(),
                            int line = __builtin_LINE()) {
        pto_simpler_scope_begin(mode, file, line);
    }
    ~PTO2ScopeGuard() { rt_scope_end(); }
    PTO2ScopeGuard(const PTO2ScopeGuard &) = delete;
    PTO2ScopeGuard &operator=(const PTO2ScopeGuard &) = delete;
};

#define PTO2_SCOPE_CAT_(x, y) x##y
#define PTO2_SCOPE_CAT(x, y) PTO2_SCOPE_CAT_(x, y)
#define PTO2_SCOPE_GUARD(...) [[maybe_unused]] PTO2ScopeGuard PTO2_SCOPE_CAT(pto2_scope_guard_, __COUNTER__){__VA_ARGS__}
#define PTO2_SCOPE(...) if (PTO2ScopeGuard PTO2_SCOPE_CAT(pto2_scope_guard_, __COUNTER__){__VA_ARGS__}; true)

#ifndef PTO2_ORCHESTRATION_CONFIG_DEFINED
#define PTO2_ORCHESTRATION_CONFIG_DEFINED
/* What the config function returns: how many arguments (tensors + scalars) the entry expects. */
struct PTO2OrchestrationConfig {
    int expected_arg_count;
};
#endif

/* pto calls an orchestration's config and entry functions through this (exported by every
 * orchestration library): it builds their ChipTaskArgs from plain arrays and keeps C++
 * exceptions on this side of the boundary. Returns 0, or -1 with `error` filled when the
 * function threw. */
extern "C" __attribute__((weak, visibility("default"))) int32_t pto_simpler_call_orchestration(
    void *fn, int32_t is_config, const ChipTensor *tensors, int32_t tensor_count, const uint64_t *scalars,
    int32_t scalar_count, int32_t *expected_arg_count, char *error, uint32_t error_len) {
    static thread_local ChipTaskArgs args;
    args.reset();
    for (int32_t i = 0; i < tensor_count; i++) args.add_input(tensors[i]);
    if (scalar_count > 0) args.add_scalars(scalars, scalar_count);
    try {
        if (is_config) {
            PTO2OrchestrationConfig cfg =
                reinterpret_cast<PTO2OrchestrationConfig (*)(const ChipTaskArgs &)>(fn)(args);
            *expected_arg_count = cfg.expected_arg_count;
        } else {
            reinterpret_cast<void (*)(const ChipTaskArgs &)>(fn)(args);
        }
        return 0;
    } catch (const std::exception &e) {
        std::snprintf(error, error_len, "%s", e.what());
    } catch (...) {
        std::snprintf(error, error_len, "a C++ exception that is not a std::exception");
    }
    return -1;
}

#include "pto_arg_with_deps.h"

#endif /* PTO_SIMPLER_ORCHESTRATION_API_H */
