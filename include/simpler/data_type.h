/* pto's simpler-compatible headers: element types.
 *
 * Source-compatible with the names simpler's kernels and orchestrations use (DataType,
 * AddressSpace, MAX_TENSOR_DIMS, get_element_size, to_u64/from_u64, ...). Written for pto from
 * the interface's documented facts; the enum values are the wire values a tensor descriptor
 * carries. See docs/design/simpler.md. Licence: MIT OR Apache-2.0, as pto.
 */
#ifndef PTO_SIMPLER_DATA_TYPE_H
#define PTO_SIMPLER_DATA_TYPE_H

#include <cstdint>
#include <cstring>
#include <type_traits>

/* Tensor views have at most this many dimensions. */
constexpr int MAX_TENSOR_DIMS = 5;

/* Where a tensor's bytes live: HOST for memory the host handed in, DEVICE for memory a chip
 * allocated itself. pto keeps both in memory every chip of the run can reach. */
enum class AddressSpace : uint8_t {
    HOST = 0,
    DEVICE = 1,
};

/* One byte on the wire. The numbering is part of the descriptor layout: do not reorder. */
enum class DataType : uint8_t {
    FLOAT32 = 0,
    FLOAT16 = 1,
    INT32 = 2,
    INT16 = 3,
    INT8 = 4,
    UINT8 = 5,
    BFLOAT16 = 6,
    INT64 = 7,
    UINT64 = 8,
    UINT16 = 9,
    UINT32 = 10,
    BOOL = 11,
    FP8E4M3FN = 12,
    FP8E8M0 = 13,
    FP4E2M1 = 14,
    DATA_TYPE_NUM = 15,
};
static_assert(sizeof(DataType) == 1, "DataType is one byte in a tensor descriptor");

/* Bytes per element; 0 for a value outside the enum. */
inline uint64_t get_element_size(DataType dtype) {
    switch (dtype) {
    case DataType::FLOAT32:
    case DataType::INT32:
    case DataType::UINT32:
        return 4;
    case DataType::FLOAT16:
    case DataType::INT16:
    case DataType::UINT16:
    case DataType::BFLOAT16:
        return 2;
    case DataType::INT64:
    case DataType::UINT64:
        return 8;
    case DataType::INT8:
    case DataType::UINT8:
    case DataType::BOOL:
    case DataType::FP8E4M3FN:
    case DataType::FP8E8M0:
    case DataType::FP4E2M1:
        return 1;
    default:
        return 0;
    }
}

inline const char *get_dtype_name(DataType dtype) {
    static const char *const names[] = {
        "FLOAT32", "FLOAT16", "INT32",  "INT16", "INT8",      "UINT8",   "BFLOAT16", "INT64",
        "UINT64",  "UINT16",  "UINT32", "BOOL",  "FP8E4M3FN", "FP8E8M0", "FP4E2M1",
    };
    unsigned i = static_cast<unsigned>(dtype);
    return i < sizeof(names) / sizeof(names[0]) ? names[i] : "UNKNOWN";
}

/* A type a scalar argument may have: any arithmetic or enum type. */
template <typename T>
inline constexpr bool is_supported_scalar_arg_v =
    std::is_arithmetic_v<std::remove_cv_t<std::remove_reference_t<T>>> ||
    std::is_enum_v<std::remove_cv_t<std::remove_reference_t<T>>>;

/* The DataType (as its byte) a scalar of type T is recorded with; UINT64 for anything else. */
template <typename T>
inline constexpr uint8_t dtype_of() {
    using U = std::remove_cv_t<std::remove_reference_t<T>>;
    static_assert(is_supported_scalar_arg_v<U>, "dtype_of: arithmetic or enum types only");
    if constexpr (std::is_same_v<U, float> || std::is_same_v<U, double>) {
        return static_cast<uint8_t>(DataType::FLOAT32);
    } else if constexpr (std::is_same_v<U, bool>) {
        return static_cast<uint8_t>(DataType::BOOL);
    } else if constexpr (std::is_integral_v<U> && std::is_signed_v<U>) {
        return sizeof(U) == 8   ? static_cast<uint8_t>(DataType::INT64)
               : sizeof(U) == 4 ? static_cast<uint8_t>(DataType::INT32)
               : sizeof(U) == 2 ? static_cast<uint8_t>(DataType::INT16)
                                : static_cast<uint8_t>(DataType::INT8);
    } else if constexpr (std::is_integral_v<U>) {
        return sizeof(U) == 8   ? static_cast<uint8_t>(DataType::UINT64)
               : sizeof(U) == 4 ? static_cast<uint8_t>(DataType::UINT32)
               : sizeof(U) == 2 ? static_cast<uint8_t>(DataType::UINT16)
                                : static_cast<uint8_t>(DataType::UINT8);
    } else {
        return static_cast<uint8_t>(DataType::UINT64);
    }
}

/* Kernels on pto are host code: device-function markers expand to nothing. */
#ifndef PTO_DEVICE_FUNC
#define PTO_DEVICE_FUNC
#endif

/* A scalar's bits in a 64-bit argument slot, zero-extended. */
template <typename T>
PTO_DEVICE_FUNC inline uint64_t to_u64(T value) {
    static_assert(sizeof(T) <= sizeof(uint64_t), "to_u64: at most 8 bytes");
    static_assert(std::is_trivially_copyable_v<T>, "to_u64: trivially copyable types only");
    uint64_t bits = 0;
    std::memcpy(&bits, &value, sizeof(T));
    return bits;
}

/* The inverse of to_u64. */
template <typename T>
PTO_DEVICE_FUNC inline T from_u64(uint64_t bits) {
    static_assert(sizeof(T) <= sizeof(uint64_t), "from_u64: at most 8 bytes");
    static_assert(std::is_trivially_copyable_v<T>, "from_u64: trivially copyable types only");
    T value;
    std::memcpy(&value, &bits, sizeof(T));
    return value;
}

#endif /* PTO_SIMPLER_DATA_TYPE_H */
