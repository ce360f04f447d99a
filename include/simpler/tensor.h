/* pto's simpler-compatible headers: the tensor descriptor kernels and orchestrations share.
 *
 * ChipTensor is 128 bytes, 64-aligned, trivially copyable; its field offsets are the ABI a
 * compiled kernel reads (buffer.addr + start_offset elements, shapes[], strides[]) and are pinned
 * by the static_asserts below. Views rewrite metadata only. See docs/design/simpler.md. */
#ifndef PTO_SIMPLER_TENSOR_H
#define PTO_SIMPLER_TENSOR_H

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "data_type.h"
#include "pto_simpler_check.h"
#include "pto_task_id.h"

/* The allocation a tensor views: its base address and its size in bytes. */
struct PTOBufferHandle {
    uint64_t addr;
    uint64_t size;
};

/* How a task uses a tensor argument. */
enum class TensorArgType : int32_t {
    INPUT = 0,           /* read */
    OUTPUT = 1,          /* written; the runtime allocates it (from a TensorCreateInfo) */
    INOUT = 2,           /* read, then written */
    OUTPUT_EXISTING = 3, /* written; an existing tensor */
    NO_DEP = 4,          /* used without any dependency tracking */
};

struct alignas(64) ChipTensor {
    /* First cache line. */
    PTOBufferHandle buffer;            /* @0 */
    PTO2TaskId owner_task_id;          /* @16: the task that created it, or invalid() */
    uint64_t start_offset;             /* @24: view origin, in elements from buffer.addr */
    int32_t version;                   /* @32 */
    uint32_t ndims;                    /* @36 */
    DataType dtype;                    /* @40 */
    bool manual_dep;                   /* @41: no dependency lookup for this tensor */
    bool is_contiguous;                /* @42: strides are row-major for shapes */
    AddressSpace address_space;        /* @43 */
    uint32_t shapes[MAX_TENSOR_DIMS];  /* @44 */
    /* Second cache line. */
    uint64_t extent_elem_cache;        /* @64: 1 + sum (shape_i - 1) stride_i */
    uint32_t strides[MAX_TENSOR_DIMS]; /* @72: element strides, each > 0 */
    uint8_t reserved_[36];

    ChipTensor() = default;

    uint64_t numel() const {
        uint64_t n = 1;
        for (uint32_t i = 0; i < ndims; i++) n *= shapes[i];
        return n;
    }
    uint64_t extent_elem() const { return is_contiguous ? numel() : extent_elem_cache; }
    uint64_t nbytes() const { return numel() * get_element_size(dtype); }
    bool is_device_memory() const { return address_space == AddressSpace::DEVICE; }

    template <typename T>
    T *data_as() const {
        return reinterpret_cast<T *>(static_cast<uintptr_t>(buffer.addr));
    }

    /* A contiguous row-major tensor of `in_shapes` at `addr`. */
    void init_external(void *addr, uint64_t buffer_size_bytes, const uint32_t in_shapes[], uint32_t in_ndims,
                       DataType in_dtype, int32_t in_version, bool in_manual_dep = false,
                       AddressSpace in_address_space = AddressSpace::HOST) {
        PTO_SIMPLER_CHECK(in_ndims > 0 && in_ndims <= static_cast<uint32_t>(MAX_TENSOR_DIMS));
        buffer.addr = reinterpret_cast<uint64_t>(addr);
        buffer.size = buffer_size_bytes;
        owner_task_id = PTO2TaskId::invalid();
        start_offset = 0;
        version = in_version;
        ndims = in_ndims;
        dtype = in_dtype;
        manual_dep = in_manual_dep;
        address_space = in_address_space;
        for (uint32_t i = 0; i < in_ndims; i++) shapes[i] = in_shapes[i];
        row_major_strides();
    }

    /* A full copy. */
    void init_from(const ChipTensor &other) { std::memcpy(this, &other, sizeof(ChipTensor)); }
    void copy(const ChipTensor &other) { init_from(other); }

    /* The element offset of `indices` from buffer.addr. */
    uint64_t compute_flat_offset(const uint32_t indices[], uint32_t in_ndims) const {
        uint64_t off = start_offset;
        for (uint32_t d = 0; d < in_ndims && d < ndims; d++) off += uint64_t(indices[d]) * strides[d];
        return off;
    }

    /* The sub-view at `view_offsets` of shape `view_shapes` (a zero-size view accepts any
     * offsets). */
    ChipTensor view(const uint32_t view_shapes[], const uint32_t view_offsets[], bool in_manual_dep = false) const {
        ChipTensor r = *this;
        bool empty = false;
        for (uint32_t i = 0; i < ndims; i++) empty = empty || view_shapes[i] == 0;
        for (uint32_t i = 0; i < ndims; i++) {
            if (!empty) {
                PTO_SIMPLER_CHECK(uint64_t(view_offsets[i]) + view_shapes[i] <= shapes[i]);
                r.start_offset += uint64_t(view_offsets[i]) * strides[i];
            }
            r.shapes[i] = view_shapes[i];
        }
        r.manual_dep = in_manual_dep;
        r.refresh_derived();
        if (empty) {
            r.is_contiguous = true;
            r.extent_elem_cache = 0;
        } else {
            r.check_in_buffer();
        }
        return r;
    }

    bool valid_transpose(uint32_t x, uint32_t y) const { return x < ndims && y < ndims; }

    ChipTensor transpose(uint32_t x, uint32_t y, bool in_manual_dep = false) const {
        PTO_SIMPLER_CHECK(valid_transpose(x, y));
        ChipTensor r = *this;
        uint32_t s = r.shapes[x];
        r.shapes[x] = r.shapes[y];
        r.shapes[y] = s;
        s = r.strides[x];
        r.strides[x] = r.strides[y];
        r.strides[y] = s;
        r.manual_dep = in_manual_dep;
        r.refresh_derived();
        return r;
    }

    ChipTensor permute(const uint32_t order[], bool in_manual_dep = false) const {
        ChipTensor r = *this;
        for (uint32_t i = 0; i < ndims; i++) {
            PTO_SIMPLER_CHECK(order[i] < ndims);
            r.shapes[i] = shapes[order[i]];
            r.strides[i] = strides[order[i]];
        }
        r.manual_dep = in_manual_dep;
        r.refresh_derived();
        return r;
    }

    /* Elements [start, end) of dimension `dim`, every `step`-th. */
    ChipTensor slice(uint32_t dim, uint32_t start, uint32_t end, uint32_t step = 1, bool in_manual_dep = false) const {
        PTO_SIMPLER_CHECK(dim < ndims && step >= 1 && end > start && end <= shapes[dim]);
        ChipTensor r = *this;
        r.start_offset += uint64_t(start) * strides[dim];
        r.shapes[dim] = (end - start + step - 1) / step;
        r.strides[dim] = static_cast<uint32_t>(uint64_t(strides[dim]) * step);
        r.manual_dep = in_manual_dep;
        r.refresh_derived();
        r.check_in_buffer();
        return r;
    }

    bool valid_reshape(const uint32_t new_shapes[], uint32_t new_ndims) const {
        uint64_t n = 1;
        for (uint32_t i = 0; i < new_ndims; i++) n *= new_shapes[i];
        return n == numel();
    }

    /* A new shape over the same elements; the tensor must be contiguous. */
    ChipTensor reshape(const uint32_t new_shapes[], uint32_t new_ndims, bool in_manual_dep = false) const {
        PTO_SIMPLER_CHECK(new_ndims > 0 && new_ndims <= static_cast<uint32_t>(MAX_TENSOR_DIMS));
        PTO_SIMPLER_CHECK(valid_reshape(new_shapes, new_ndims));
        PTO_SIMPLER_CHECK(is_contiguous);
        ChipTensor r = *this;
        r.ndims = new_ndims;
        for (uint32_t i = 0; i < new_ndims; i++) r.shapes[i] = new_shapes[i];
        r.manual_dep = in_manual_dep;
        r.row_major_strides();
        return r;
    }

    std::string dump() const {
        std::string s = "{addr " + std::to_string(buffer.addr) + ", size " + std::to_string(buffer.size) +
                        " B, dtype " + get_dtype_name(dtype) + ", offset " + std::to_string(start_offset) +
                        ", shapes [";
        for (uint32_t i = 0; i < ndims; i++) s += (i ? ", " : "") + std::to_string(shapes[i]);
        s += "], strides [";
        for (uint32_t i = 0; i < ndims; i++) s += (i ? ", " : "") + std::to_string(strides[i]);
        return s + "]}";
    }

    /* Strides, contiguity and extent from shapes and strides as they are. */
    void refresh_derived() {
        uint64_t extent = 1, expect = 1;
        bool contig = true;
        for (int32_t i = static_cast<int32_t>(ndims) - 1; i >= 0; --i) {
            if (strides[i] != expect) contig = false;
            if (shapes[i] > 0) extent += uint64_t(shapes[i] - 1) * strides[i];
            expect *= shapes[i];
        }
        extent_elem_cache = extent;
        is_contiguous = contig;
    }

private:
    void row_major_strides() {
        uint64_t s = 1;
        for (int32_t i = static_cast<int32_t>(ndims) - 1; i >= 0; --i) {
            strides[i] = static_cast<uint32_t>(s);
            s *= shapes[i];
        }
        extent_elem_cache = s;
        is_contiguous = true;
    }

    void check_in_buffer() const {
        uint64_t es = get_element_size(dtype);
        PTO_SIMPLER_CHECK(es == 0 || start_offset + extent_elem_cache <= buffer.size / es);
    }
};

static_assert(std::is_trivially_copyable_v<ChipTensor>, "ChipTensor is copied as bytes");
static_assert(sizeof(ChipTensor) == 128, "ChipTensor is two cache lines");
static_assert(alignof(ChipTensor) == 64, "ChipTensor is cache-line aligned");
static_assert(offsetof(ChipTensor, buffer) == 0, "ChipTensor layout");
static_assert(offsetof(ChipTensor, owner_task_id) == 16, "ChipTensor layout");
static_assert(offsetof(ChipTensor, start_offset) == 24, "ChipTensor layout");
static_assert(offsetof(ChipTensor, version) == 32, "ChipTensor layout");
static_assert(offsetof(ChipTensor, ndims) == 36, "ChipTensor layout");
static_assert(offsetof(ChipTensor, dtype) == 40, "ChipTensor layout");
static_assert(offsetof(ChipTensor, manual_dep) == 41, "ChipTensor layout");
static_assert(offsetof(ChipTensor, is_contiguous) == 42, "ChipTensor layout");
static_assert(offsetof(ChipTensor, address_space) == 43, "ChipTensor layout");
static_assert(offsetof(ChipTensor, shapes) == 44, "ChipTensor layout");
static_assert(offsetof(ChipTensor, extent_elem_cache) == 64, "ChipTensor layout");
static_assert(offsetof(ChipTensor, strides) == 72, "ChipTensor layout");

/* A contiguous tensor over memory the caller owns. */
inline ChipTensor make_tensor_external(void *addr, const uint32_t shapes[], uint32_t ndims,
                                       DataType dtype = DataType::FLOAT32, bool manual_dep = false,
                                       int32_t version = 0, AddressSpace address_space = AddressSpace::HOST) {
    uint64_t n = 1;
    for (uint32_t i = 0; i < ndims; i++) n *= shapes[i];
    ChipTensor t{};
    t.init_external(addr, n * get_element_size(dtype), shapes, ndims, dtype, version, manual_dep, address_space);
    return t;
}

/* A strided tensor over memory the caller owns (strides in elements, each > 0). */
inline ChipTensor make_tensor_strided(void *addr, const uint32_t shapes[], const uint32_t strides[], uint32_t ndims,
                                      DataType dtype = DataType::FLOAT32, bool manual_dep = false,
                                      int32_t version = 0, AddressSpace address_space = AddressSpace::HOST) {
    PTO_SIMPLER_CHECK(ndims > 0 && ndims <= static_cast<uint32_t>(MAX_TENSOR_DIMS));
    ChipTensor t{};
    t.buffer.addr = reinterpret_cast<uint64_t>(addr);
    t.owner_task_id = PTO2TaskId::invalid();
    t.ndims = ndims;
    t.dtype = dtype;
    t.version = version;
    t.manual_dep = manual_dep;
    t.address_space = address_space;
    for (uint32_t i = 0; i < ndims; i++) {
        PTO_SIMPLER_CHECK(strides[i] > 0);
        t.shapes[i] = shapes[i];
        t.strides[i] = strides[i];
    }
    t.refresh_derived();
    t.buffer.size = t.extent_elem_cache * get_element_size(dtype);
    return t;
}

#endif /* PTO_SIMPLER_TENSOR_H */
