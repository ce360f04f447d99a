/* pto's simpler-compatible headers: task argument builders and submit results.
 *
 * CoreTaskArgs (what an orchestration submits), ChipTaskArgs (what it receives), TensorRef,
 * TaskOutputTensors, DepFlags and scopes, with the builder methods orchestrations call. The
 * builders store pointers to the caller's tensors (they must outlive the submit) and latch the
 * first misuse in has_error/error_msg, which fails the submit. */
#ifndef PTO_SIMPLER_TYPES_H
#define PTO_SIMPLER_TYPES_H

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "data_type.h"
#include "pto_simpler_check.h"
#include "pto_submit_types.h"
#include "pto_task_id.h"
#include "tensor.h"
#include "tensor_create_info.h"

inline constexpr int CORE_MAX_TENSOR_ARGS = 32;
inline constexpr int CORE_MAX_SCALAR_ARGS = 16;
inline constexpr int CHIP_MAX_TENSOR_ARGS = 256;
inline constexpr int CHIP_MAX_SCALAR_ARGS = 128;
#ifndef MAX_TENSOR_ARGS
#define MAX_TENSOR_ARGS CORE_MAX_TENSOR_ARGS
#endif
#ifndef MAX_SCALAR_ARGS
#define MAX_SCALAR_ARGS CORE_MAX_SCALAR_ARGS
#endif

inline constexpr int NUM_TASK_TIMING_SLOTS = 16;
inline constexpr int32_t TASK_TIMING_SLOT_NONE = -1;

enum class PTO2ScopeMode : uint8_t {
    AUTO = 0,
    MANUAL = 1,
};

enum DepFlags : uint8_t {
    DEP_NONE = 0,
    DEP_WAIT = 1u << 0,
    DEP_RETAIN = 1u << 1,
};
constexpr DepFlags operator|(DepFlags a, DepFlags b) { return static_cast<DepFlags>(uint8_t(a) | uint8_t(b)); }
constexpr DepFlags operator&(DepFlags a, DepFlags b) { return static_cast<DepFlags>(uint8_t(a) & uint8_t(b)); }
constexpr DepFlags &operator|=(DepFlags &a, DepFlags b) { return a = a | b; }
constexpr bool dep_has_wait(DepFlags f) { return (f & DEP_WAIT) != DEP_NONE; }
constexpr bool dep_has_retain(DepFlags f) { return (f & DEP_RETAIN) != DEP_NONE; }

/* What a submit returns: the task id and its runtime-allocated outputs, in argument order. The
 * descriptors stay valid until the scope that submitted the task ends. Layout is pto's (the
 * runtime fills it): task id, count, pointers. */
class TaskOutputTensors {
public:
    TaskOutputTensors() : task_id_(PTO2TaskId::invalid()), output_count_(0), reserved_(0), tensors_{} {}

    bool empty() const { return output_count_ == 0; }
    uint32_t size() const { return output_count_; }
    const ChipTensor &get_ref(uint32_t index) const & {
        PTO_SIMPLER_CHECK(index < output_count_);
        return *tensors_[index];
    }
    const ChipTensor &get_ref(uint32_t index) const && = delete;
    void materialize_output(const ChipTensor &t) {
        PTO_SIMPLER_CHECK(output_count_ < static_cast<uint32_t>(MAX_TENSOR_ARGS));
        tensors_[output_count_++] = &t;
    }
    void set_task_id(PTO2TaskId id) { task_id_ = id; }
    PTO2TaskId task_id() const { return task_id_; }

    PTO2TaskId task_id_;
    uint32_t output_count_;
    uint32_t reserved_;
    const ChipTensor *tensors_[MAX_TENSOR_ARGS];
};
static_assert(offsetof(TaskOutputTensors, tensors_) == 16, "TaskOutputTensors layout (pto's)");

/* A tensor argument slot: an existing tensor or, for OUTPUT, a TensorCreateInfo. */
class TensorRef {
    const void *p_;

public:
    TensorRef() : p_(nullptr) {}
    TensorRef(const TensorRef &) = delete;
    TensorRef &operator=(const TensorRef &) = delete;
    TensorRef &operator=(const ChipTensor *t) {
        p_ = t;
        return *this;
    }
    TensorRef &operator=(const TensorCreateInfo *ci) {
        p_ = ci;
        return *this;
    }
    const ChipTensor &ref() const { return *static_cast<const ChipTensor *>(p_); }
    const TensorCreateInfo &create_info() const { return *static_cast<const TensorCreateInfo *>(p_); }
    const void *raw() const { return p_; }
    bool refers_to(const ChipTensor *t) const { return p_ == t; }
    bool refers_to(const TensorCreateInfo *ci) const { return p_ == ci; }
};

struct CorePredicateOperand {
    const ChipTensor *tensor{nullptr};
    uint32_t ndims{0};
    uint32_t indices[MAX_TENSOR_DIMS]{};
};

struct CoreTaskPredicate {
    CorePredicateOperand operand;
    PredicateOp op{PredicateOp::NONE};
    int64_t target{0};
};

/* Fixed-capacity tensors and scalars (all tensors before any scalar). */
template <typename T, typename S, size_t MaxT, size_t MaxS>
struct TaskArgsTpl {
    T tensors_[MaxT];
    S scalars_[MaxS];
    int32_t tensor_count_{0};
    int32_t scalar_count_{0};

    const T &tensor(int32_t i) const { return tensors_[i]; }
    T &tensor(int32_t i) { return tensors_[i]; }
    S scalar(int32_t i) const { return scalars_[i]; }
    S &scalar(int32_t i) { return scalars_[i]; }
    const S *scalars() const { return scalars_; }
    const T *tensor_data() const { return tensors_; }
    const S *scalar_data() const { return scalars_; }
    int32_t tensor_count() const { return tensor_count_; }
    int32_t scalar_count() const { return scalar_count_; }
    void clear() {
        tensor_count_ = 0;
        scalar_count_ = 0;
    }
};

/* Storage-form chip arguments (descriptors by value). */
struct ChipStorageTaskArgs : TaskArgsTpl<ChipTensor, uint64_t, CHIP_MAX_TENSOR_ARGS, CHIP_MAX_SCALAR_ARGS> {
    void add_tensor(const ChipTensor &t) {
        PTO_SIMPLER_CHECK(scalar_count_ == 0 && tensor_count_ < CHIP_MAX_TENSOR_ARGS);
        tensors_[tensor_count_++] = t;
    }
    void add_scalar(uint64_t s) {
        PTO_SIMPLER_CHECK(scalar_count_ < CHIP_MAX_SCALAR_ARGS);
        scalars_[scalar_count_++] = s;
    }
};

template <size_t MaxT, size_t MaxS>
struct Arg {
    TensorRef tensors_[MaxT];
    TensorArgType tags_[MaxT]{};
    uint64_t scalars_[MaxS]{};
    int32_t tensor_count_{0};
    int32_t scalar_count_{0};

    bool has_error{false};
    const char *error_msg{nullptr};
    PTO2LaunchSpec launch_spec;

    Arg() = default;
    Arg(const Arg &) = delete;
    Arg &operator=(const Arg &) = delete;

    const TensorRef &tensor(int32_t i) const { return tensors_[i]; }
    uint64_t scalar(int32_t i) const { return scalars_[i]; }
    const uint64_t *scalars() const { return scalars_; }
    const uint64_t *scalar_data() const { return scalars_; }
    const TensorArgType &tag(int32_t i) const { return tags_[i]; }
    const TensorArgType *tag_data() const { return tags_; }
    int32_t tensor_count() const { return tensor_count_; }
    int32_t scalar_count() const { return scalar_count_; }

    void set_allow_early_resolve(bool v = true) { allow_early_resolve_ = v; }
    bool allow_early_resolve() const { return allow_early_resolve_; }
    void set_predicate(const CoreTaskPredicate &p) { predicate_ = p; }
    const CoreTaskPredicate &predicate() const { return predicate_; }
    void set_task_timing_slot(int32_t slot) {
        if (slot < 0 || slot >= NUM_TASK_TIMING_SLOTS) {
            set_error("task_timing_slot out of range (valid: 0..15)");
            return;
        }
        task_timing_slot_ = slot;
    }
    int32_t task_timing_slot() const { return task_timing_slot_; }

    void clear() {
        tensor_count_ = 0;
        scalar_count_ = 0;
        deps_ = nullptr;
        dep_kinds_ = nullptr;
        dep_count_ = 0;
        allow_early_resolve_ = false;
        predicate_ = CoreTaskPredicate{};
        task_timing_slot_ = TASK_TIMING_SLOT_NONE;
        launch_spec = PTO2LaunchSpec{};
    }
    void reset() {
        clear();
        has_error = false;
        error_msg = nullptr;
    }
    void set_error(const char *msg) {
        if (!has_error) {
            has_error = true;
            error_msg = msg;
        }
    }

    /* Accepted for source compatibility; pto's traces record every argument. */
    template <typename... Args>
    void dump(Args &&...) {}

    template <typename... Args>
    void add_input(Args &&...args) {
        check_tensors<false, Args...>();
        if (room(sizeof...(Args))) ((push(&args, TensorArgType::INPUT)), ...);
    }

    /* ChipTensors are OUTPUT_EXISTING; TensorCreateInfos are OUTPUT (allocated by the runtime). */
    template <typename... Args>
    void add_output(Args &&...args) {
        check_tensors<true, Args...>();
        if (!room(sizeof...(Args))) return;
        if constexpr ((std::is_same_v<std::decay_t<Args>, TensorCreateInfo> && ...)) {
            ((push(&args, TensorArgType::OUTPUT)), ...);
        } else {
            ((push(&args, TensorArgType::OUTPUT_EXISTING)), ...);
        }
    }

    template <typename... Args>
    void add_inout(Args &&...args) {
        check_tensors<false, Args...>();
        if (room(sizeof...(Args))) ((push(&args, TensorArgType::INOUT)), ...);
    }

    template <typename... Args>
    void add_no_dep(Args &&...args) {
        check_tensors<false, Args...>();
        if (room(sizeof...(Args))) ((push(&args, TensorArgType::NO_DEP)), ...);
    }

    /* Explicit dependencies (stored by pointer: the array must outlive the submit). count 0
     * clears them; a second non-empty call is an error. */
    void set_dependencies(const PTO2TaskId *deps, uint32_t count) { set_deps(deps, nullptr, count, false); }
    void set_dependencies_with_kinds(const PTO2TaskId *deps, const DepFlags *kinds, uint32_t count) {
        set_deps(deps, kinds, count, true);
    }
    uint32_t explicit_dep_count() const { return dep_count_; }
    PTO2TaskId explicit_dep(uint32_t i) const {
        PTO_SIMPLER_CHECK(i < dep_count_);
        return deps_[i];
    }
    DepFlags explicit_dep_kind(uint32_t i) const {
        PTO_SIMPLER_CHECK(i < dep_count_);
        return dep_kinds_ ? dep_kinds_[i] : (DEP_WAIT | DEP_RETAIN);
    }
    const PTO2TaskId *explicit_deps_data() const { return deps_; }
    const DepFlags *explicit_dep_kinds_data() const { return dep_kinds_; }

    /* Scalars: any arithmetic or enum values, each bit-cast into a 64-bit slot. */
    template <typename... Args>
    void add_scalar(Args &&...args) {
        static_assert(sizeof...(Args) >= 1, "add_scalar: at least one argument");
        static_assert((is_supported_scalar_arg_v<Args> && ...), "add_scalar: arithmetic or enum types only");
        if (size_t(scalar_count_) + sizeof...(Args) > MaxS) {
            set_error("too many scalar arguments");
            return;
        }
        ((scalars_[scalar_count_++] = to_u64(std::forward<Args>(args))), ...);
    }
    void add_scalars(const uint64_t *values, int count) {
        if (count < 0 || size_t(scalar_count_) + size_t(count) > MaxS) {
            set_error("too many scalar arguments");
            return;
        }
        std::memcpy(&scalars_[scalar_count_], values, size_t(count) * sizeof(uint64_t));
        scalar_count_ += count;
    }
    /* int32 bit patterns, zero-extended (-1 becomes 0x00000000ffffffff). */
    void add_scalars_i32(const int32_t *values, int count) {
        if (count < 0 || size_t(scalar_count_) + size_t(count) > MaxS) {
            set_error("too many scalar arguments");
            return;
        }
        for (int i = 0; i < count; i++) scalars_[scalar_count_++] = uint64_t(uint32_t(values[i]));
    }
    void copy_scalars_from(const Arg &src, int src_offset, int count) {
        if (src_offset < 0 || count < 0 || src_offset + count > src.scalar_count_) {
            set_error("copy_scalars_from: source range out of bounds");
            return;
        }
        add_scalars(&src.scalars_[src_offset], count);
    }

protected:
    bool allow_early_resolve_{false};
    CoreTaskPredicate predicate_{};
    int32_t task_timing_slot_{TASK_TIMING_SLOT_NONE};
    const PTO2TaskId *deps_{nullptr};
    const DepFlags *dep_kinds_{nullptr};
    uint32_t dep_count_{0};

    void push(const ChipTensor *t, TensorArgType tag) {
        tensors_[tensor_count_] = t;
        tags_[tensor_count_++] = tag;
    }
    void push(const TensorCreateInfo *ci, TensorArgType tag) {
        tensors_[tensor_count_] = ci;
        tags_[tensor_count_++] = tag;
    }
    bool room(size_t n) {
        if (scalar_count_ != 0) {
            set_error("a tensor was added after a scalar: add every tensor before the scalars");
            return false;
        }
        if (size_t(tensor_count_) + n > MaxT) {
            set_error("too many tensor arguments");
            return false;
        }
        return true;
    }
    template <bool output, typename... Args>
    static void check_tensors() {
        static_assert(sizeof...(Args) >= 1, "at least one tensor");
        static_assert((std::is_lvalue_reference_v<Args> && ...),
                      "tensor arguments are stored by address: temporaries would dangle");
        if constexpr (output) {
            static_assert((std::is_same_v<std::decay_t<Args>, ChipTensor> && ...) ||
                              (std::is_same_v<std::decay_t<Args>, TensorCreateInfo> && ...),
                          "add_output: all ChipTensor or all TensorCreateInfo");
        } else {
            static_assert((std::is_same_v<std::decay_t<Args>, ChipTensor> && ...), "ChipTensor arguments only");
        }
    }
    void set_deps(const PTO2TaskId *deps, const DepFlags *kinds, uint32_t count, bool need_kinds) {
        if (count == 0) {
            deps_ = nullptr;
            dep_kinds_ = nullptr;
            dep_count_ = 0;
            return;
        }
        if (deps == nullptr || (need_kinds && kinds == nullptr)) {
            set_error("set_dependencies: null array with a non-zero count");
            return;
        }
        if (deps_ != nullptr) {
            set_error("set_dependencies: at most once per argument set");
            return;
        }
        deps_ = deps;
        dep_kinds_ = kinds;
        dep_count_ = count;
    }
};

using CoreTaskArgs = Arg<MAX_TENSOR_ARGS, MAX_SCALAR_ARGS>;

/* What an orchestration entry receives: the chip task's tensors (as inputs) and scalars. */
struct ChipTaskArgs : Arg<CHIP_MAX_TENSOR_ARGS, CHIP_MAX_SCALAR_ARGS> {
    void create_from_chip_args(const ChipStorageTaskArgs &src) {
        reset();
        for (int32_t i = 0; i < src.tensor_count(); ++i) add_input(src.tensor(i));
        for (int32_t i = 0; i < src.scalar_count(); ++i) add_scalar(src.scalar(i));
    }
};

#endif /* PTO_SIMPLER_TYPES_H */
