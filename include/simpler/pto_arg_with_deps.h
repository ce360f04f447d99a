/* pto's simpler-compatible headers: CoreTaskArgs with its explicit dependencies bundled. */
#ifndef PTO_SIMPLER_ARG_WITH_DEPS_H
#define PTO_SIMPLER_ARG_WITH_DEPS_H

#include <cstddef>
#include <cstdint>

#include "pto_orchestration_api.h"

template <size_t MAX_DEP_COUNT = 16>
class CoreTaskArgsWithDeps : private CoreTaskArgs {
public:
    using CoreTaskArgs::add_inout;
    using CoreTaskArgs::add_input;
    using CoreTaskArgs::add_no_dep;
    using CoreTaskArgs::add_output;
    using CoreTaskArgs::add_scalar;
    using CoreTaskArgs::add_scalars;
    using CoreTaskArgs::add_scalars_i32;
    using CoreTaskArgs::allow_early_resolve;
    using CoreTaskArgs::copy_scalars_from;
    using CoreTaskArgs::error_msg;
    using CoreTaskArgs::has_error;
    using CoreTaskArgs::launch_spec;
    using CoreTaskArgs::set_allow_early_resolve;
    using CoreTaskArgs::set_error;
    using CoreTaskArgs::set_task_timing_slot;
    using CoreTaskArgs::task_timing_slot;

    /* Dependencies that keep the producer (and its outputs) alive until this task finishes. */
    template <typename... Ids>
    void add_dep(Ids... ids) {
        (push_dep(ids, DEP_WAIT | DEP_RETAIN), ...);
    }
    /* Ordering-only dependencies. */
    template <typename... Ids>
    void add_dep_wait(Ids... ids) {
        (push_dep(ids, DEP_WAIT), ...);
    }

    void reset() {
        CoreTaskArgs::reset();
        n_ = 0;
    }
    uint32_t dep_count() const { return n_; }

    /* The bundled arguments, dependencies attached, for the submit calls. */
    const CoreTaskArgs &args() {
        CoreTaskArgs::set_dependencies_with_kinds(nullptr, nullptr, 0);
        CoreTaskArgs::set_dependencies_with_kinds(ids_, kinds_, n_);
        return *this;
    }

private:
    void push_dep(PTO2TaskId id, DepFlags kind) {
        if (n_ >= MAX_DEP_COUNT) {
            CoreTaskArgs::set_error("CoreTaskArgsWithDeps: too many dependencies");
            return;
        }
        ids_[n_] = id;
        kinds_[n_] = kind;
        n_++;
    }
    PTO2TaskId ids_[MAX_DEP_COUNT]{};
    DepFlags kinds_[MAX_DEP_COUNT]{};
    uint32_t n_ = 0;
};

template <size_t N>
static inline TaskOutputTensors rt_submit_task(const MixedKernels &mk, CoreTaskArgsWithDeps<N> &args) {
    return rt_submit_task(mk, args.args());
}
template <size_t N>
static inline TaskOutputTensors rt_submit_aic_task(int32_t kernel_id, CoreTaskArgsWithDeps<N> &args) {
    return rt_submit_aic_task(kernel_id, args.args());
}
template <size_t N>
static inline TaskOutputTensors rt_submit_aiv_task(int32_t kernel_id, CoreTaskArgsWithDeps<N> &args) {
    return rt_submit_aiv_task(kernel_id, args.args());
}

#endif /* PTO_SIMPLER_ARG_WITH_DEPS_H */
