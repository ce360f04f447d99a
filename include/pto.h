/*
 * pto.h: the C ABI of pto plugins (C99; usable from C++).
 *
 * A plugin is a shared library that registers kernels (functions that run on a chip's cores)
 * and programs (orchestrations that every rank's chip runs). Build one with nothing to link:
 *
 *     cc -shared -fPIC -I"$(pto include-dir)" mine.c -o libmine.so
 *     pto run --plugin ./libmine.so my_program --ranks 4
 *
 * Exported symbols:
 *   required  int      pto_plugin_register(pto_registry *reg);   0 on success
 *   optional  uint32_t pto_plugin_abi_version(void);             checked when present
 *   optional  void     pto_plugin_teardown(void);                called before unloading
 * Declare them with PTO_EXPORT (below) so they stay visible under -fvisibility=hidden.
 *
 * Every call below is a static inline function over a table of entry points that the loader
 * hands over inside each handle (the registry, the orchestration, the kernel context), so a
 * plugin links against nothing. Every call returns PTO_OK (0) or a negative error code and
 * never aborts the process; pto_last_error() says what went wrong in words, and a kernel or
 * program that returns non-zero fails its task with that text.
 *
 * Handles are valid only during the call that received them; never keep one.
 * Design notes: docs/design/plugins.md in the pto repository.
 */
#ifndef PTO_H
#define PTO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI version: the loader refuses a plugin whose pto_plugin_abi_version() differs, and a
 * table older than the header (see pto_api.abi_version). */
#define PTO_ABI_VERSION 1u

#if defined(_WIN32)
#define PTO_EXPORT __declspec(dllexport)
#else
#define PTO_EXPORT __attribute__((visibility("default")))
#endif

/* ---- error codes ---------------------------------------------------------------------- */
enum {
    PTO_OK = 0,
    PTO_ERR_ARG = -1,       /* an invalid argument: a NULL pointer, a bad enum value, bad UTF-8 */
    PTO_ERR_NOT_FOUND = -2, /* no kernel, program, buffer, tensor or task by that name or handle */
    PTO_ERR_RANGE = -3,     /* an index, rank, offset or size out of range */
    PTO_ERR_DTYPE = -4,     /* a dtype that does not match */
    PTO_ERR_MODE = -5,      /* a tensor argument used against its access mode */
    PTO_ERR_COMM = -6,      /* a communication call failed (a dead or failed peer, ...) */
    PTO_ERR_TIMEOUT = -7,   /* a wait passed its deadline */
    PTO_ERR_DUPLICATE = -8, /* a name registered twice, a buffer declared twice differently */
    PTO_ERR_STATE = -9,     /* a call not allowed here (for example defer in a non-deferred task) */
    PTO_ERR_FAILED = -10,   /* pto_fail was called: the task fails with its message */
    PTO_ERR_INTERNAL = -11  /* anything else (the message says what) */
};

/* ---- core kinds, dtypes, argument kinds ------------------------------------------------ */
typedef enum { PTO_AIC = 0, PTO_AIV = 1, PTO_MIX = 2 } pto_core_kind;

typedef enum {
    PTO_F32 = 0,
    PTO_F64 = 1,
    PTO_F16 = 2,
    PTO_BF16 = 3,
    PTO_I8 = 4,
    PTO_I16 = 5,
    PTO_I32 = 6,
    PTO_I64 = 7,
    PTO_U8 = 8,
    PTO_U16 = 9,
    PTO_U32 = 10,
    PTO_U64 = 11,
    PTO_BOOL = 12
} pto_dtype;

typedef enum {
    PTO_ARG_IN = 0,         /* read; ordered after earlier writers of its bytes */
    PTO_ARG_OUT = 1,        /* written (an existing tensor: OUTPUT_EXISTING) */
    PTO_ARG_INOUT = 2,      /* read and written */
    PTO_ARG_NO_DEP = 3,     /* not tracked: the program orders it itself */
    PTO_ARG_OUT_NEW = 4,    /* a runtime-allocated output of dtype/ndim/shape */
    PTO_ARG_SCALAR = 5      /* a scalar of dtype (F64, F32, I64, I32, U64 or U32) */
} pto_arg_kind;

#define PTO_MAX_DIMS 8

typedef uint64_t pto_tensor; /* a tensor in a program; 0 is none */
typedef uint64_t pto_task;   /* a submitted task in a program */

/* One argument of pto_submit. Build them with the pto_arg_* helpers below. */
typedef struct pto_arg {
    int32_t kind;  /* pto_arg_kind */
    int32_t dtype; /* PTO_ARG_OUT_NEW and PTO_ARG_SCALAR */
    pto_tensor tensor;
    uint32_t ndim; /* PTO_ARG_OUT_NEW */
    uint32_t reserved;
    uint64_t shape[PTO_MAX_DIMS];
    union {
        double f64;
        int64_t i64;
        uint64_t u64;
    } scalar;
} pto_arg;

/* Options of pto_submit_ex. */
typedef struct pto_task_opts {
    uint32_t blocks;    /* SPMD blocks (0 or 1: one) */
    uint32_t deferred;  /* non-zero: the task completes when the conditions its kernel
                           registers hold (pto_defer_until), not when it returns */
    const pto_task *after; /* explicit dependencies besides the inferred ones */
    uint32_t nafter;
    uint32_t reserved;
} pto_task_opts;

/* What a kernel sees of a tensor argument. strides are in elements. */
typedef struct pto_view {
    void *data;       /* the first element; NULL for an empty tensor */
    int32_t dtype;    /* pto_dtype */
    uint32_t ndim;
    uint64_t shape[PTO_MAX_DIMS];
    uint64_t strides[PTO_MAX_DIMS];
    uint64_t count;   /* elements */
    uint32_t writable;
    uint32_t contiguous;
} pto_view;

/* ---- handles and the table of entry points --------------------------------------------- */
typedef struct pto_api pto_api;
typedef struct pto_registry { const pto_api *api; void *pto_private; } pto_registry;
typedef struct pto_orch { const pto_api *api; void *pto_private; } pto_orch;
typedef struct pto_kernel_ctx { const pto_api *api; void *pto_private; } pto_kernel_ctx;

typedef int (*pto_kernel_fn)(pto_kernel_ctx *ctx);
typedef int (*pto_program_fn)(pto_orch *orch);

/* The loader's table. New entries are only ever appended (abi_version and size tell which a
 * loader has); plugins call through the inline functions below, not the table. */
struct pto_api {
    uint32_t abi_version;
    uint32_t size; /* sizeof(pto_api) of the loader */
    const char *(*last_error)(void);
    /* registration */
    int (*register_kernel)(pto_registry *, const char *, int32_t, pto_kernel_fn);
    int (*register_program)(pto_registry *, const char *, pto_program_fn);
    int (*declare_buffer)(pto_registry *, const char *, int32_t, uint64_t);
    /* programs */
    int (*orch_rank)(pto_orch *, uint32_t *);
    int (*orch_nranks)(pto_orch *, uint32_t *);
    int (*window_tensor)(pto_orch *, const char *, pto_tensor *);
    int (*tensor_new)(pto_orch *, int32_t, uint32_t, const uint64_t *, pto_tensor *);
    int (*tensor_write)(pto_orch *, pto_tensor, const void *, uint64_t);
    int (*tensor_read)(pto_orch *, pto_tensor, void *, uint64_t);
    int (*submit)(pto_orch *, const char *, const pto_arg *, uint32_t, const pto_task_opts *,
                  pto_task *);
    int (*task_output)(pto_orch *, pto_task, uint32_t, pto_tensor *);
    /* kernels */
    int (*rank)(pto_kernel_ctx *, uint32_t *);
    int (*nranks)(pto_kernel_ctx *, uint32_t *);
    int (*block)(pto_kernel_ctx *, uint32_t *, uint32_t *);
    int (*num_args)(pto_kernel_ctx *, uint32_t *, uint32_t *);
    int (*tensor)(pto_kernel_ctx *, uint32_t, int32_t, pto_view *);
    int (*scalar)(pto_kernel_ctx *, uint32_t, int32_t, void *);
    int (*window_ptr)(pto_kernel_ctx *, const char *, void **, uint64_t *);
    int (*put)(pto_kernel_ctx *, uint32_t, const char *, uint64_t, const void *, uint64_t);
    int (*get)(pto_kernel_ctx *, uint32_t, const char *, uint64_t, void *, uint64_t);
    int (*notify)(pto_kernel_ctx *, uint32_t, const char *, uint64_t, uint32_t);
    int (*wait_until)(pto_kernel_ctx *, const char *, uint64_t, uint32_t);
    int (*barrier)(pto_kernel_ctx *);
    int (*fail)(pto_kernel_ctx *, const char *);
    int (*defer_until)(pto_kernel_ctx *, const char *, uint64_t, uint32_t);
};

/* The text of the last error on this thread ("" when none), through any handle:
 * pto_last_error(ctx), pto_last_error(orch), pto_last_error(reg). */
#define pto_last_error(handle) ((handle)->api->last_error())

/* ---- registration (in pto_plugin_register) --------------------------------------------- */

/* A kernel `name` that runs on cores of `kind` (PTO_AIC, PTO_AIV or PTO_MIX). */
static inline int pto_register_kernel(pto_registry *reg, const char *name, pto_core_kind kind,
                                      pto_kernel_fn fn) {
    return reg->api->register_kernel(reg, name, (int32_t)kind, fn);
}
/* A program `name`: an orchestration every rank's chip runs. */
static inline int pto_register_program(pto_registry *reg, const char *name, pto_program_fn fn) {
    return reg->api->register_program(reg, name, fn);
}
/* A named buffer of `count` elements of `dtype` in every rank's window. */
static inline int pto_declare_buffer(pto_registry *reg, const char *name, pto_dtype dtype,
                                     uint64_t count) {
    return reg->api->declare_buffer(reg, name, (int32_t)dtype, count);
}

/* ---- arguments --------------------------------------------------------------------------- */
static inline pto_arg pto__arg(int32_t kind, int32_t dtype, pto_tensor t) {
    pto_arg a;
    uint32_t i;
    a.kind = kind;
    a.dtype = dtype;
    a.tensor = t;
    a.ndim = 0;
    a.reserved = 0;
    for (i = 0; i < PTO_MAX_DIMS; i++) a.shape[i] = 0;
    a.scalar.u64 = 0;
    return a;
}
static inline pto_arg pto_arg_in(pto_tensor t) { return pto__arg(PTO_ARG_IN, 0, t); }
static inline pto_arg pto_arg_out(pto_tensor t) { return pto__arg(PTO_ARG_OUT, 0, t); }
static inline pto_arg pto_arg_inout(pto_tensor t) { return pto__arg(PTO_ARG_INOUT, 0, t); }
static inline pto_arg pto_arg_no_dep(pto_tensor t) { return pto__arg(PTO_ARG_NO_DEP, 0, t); }
/* A runtime-allocated output; read it back with pto_task_output. ndim <= PTO_MAX_DIMS. */
static inline pto_arg pto_arg_out_new(pto_dtype dtype, uint32_t ndim, const uint64_t *shape) {
    pto_arg a = pto__arg(PTO_ARG_OUT_NEW, (int32_t)dtype, 0);
    uint32_t i;
    a.ndim = ndim;
    for (i = 0; i < ndim && i < PTO_MAX_DIMS; i++) a.shape[i] = shape[i];
    return a;
}
static inline pto_arg pto_arg_f64(double v) {
    pto_arg a = pto__arg(PTO_ARG_SCALAR, PTO_F64, 0);
    a.scalar.f64 = v;
    return a;
}
static inline pto_arg pto_arg_f32(float v) {
    pto_arg a = pto__arg(PTO_ARG_SCALAR, PTO_F32, 0);
    a.scalar.f64 = (double)v;
    return a;
}
static inline pto_arg pto_arg_i64(int64_t v) {
    pto_arg a = pto__arg(PTO_ARG_SCALAR, PTO_I64, 0);
    a.scalar.i64 = v;
    return a;
}
static inline pto_arg pto_arg_i32(int32_t v) {
    pto_arg a = pto__arg(PTO_ARG_SCALAR, PTO_I32, 0);
    a.scalar.i64 = v;
    return a;
}
static inline pto_arg pto_arg_u64(uint64_t v) {
    pto_arg a = pto__arg(PTO_ARG_SCALAR, PTO_U64, 0);
    a.scalar.u64 = v;
    return a;
}
static inline pto_arg pto_arg_u32(uint32_t v) {
    pto_arg a = pto__arg(PTO_ARG_SCALAR, PTO_U32, 0);
    a.scalar.u64 = v;
    return a;
}

/* ---- programs (in a pto_program_fn) ------------------------------------------------------ */

static inline int pto_orch_rank(pto_orch *o, uint32_t *rank) { return o->api->orch_rank(o, rank); }
static inline int pto_orch_nranks(pto_orch *o, uint32_t *n) { return o->api->orch_nranks(o, n); }
/* This rank's part of a declared buffer, as a 1-D tensor of its dtype. */
static inline int pto_window_tensor(pto_orch *o, const char *buffer, pto_tensor *out) {
    return o->api->window_tensor(o, buffer, out);
}
/* A new zeroed tensor of `dtype` and `shape` (host memory of this chip). */
static inline int pto_tensor_new(pto_orch *o, pto_dtype dtype, uint32_t ndim,
                                 const uint64_t *shape, pto_tensor *out) {
    return o->api->tensor_new(o, (int32_t)dtype, ndim, shape, out);
}
/* Waits for every task using `t`, then copies `bytes` (exactly the tensor's size) in. */
static inline int pto_tensor_write(pto_orch *o, pto_tensor t, const void *src, uint64_t bytes) {
    return o->api->tensor_write(o, t, src, bytes);
}
/* Waits for the tasks that write `t`, then copies its `bytes` (exactly its size) out. */
static inline int pto_tensor_read(pto_orch *o, pto_tensor t, void *dst, uint64_t bytes) {
    return o->api->tensor_read(o, t, dst, bytes);
}
/* Submits kernel `kernel` with `nargs` arguments (args may be NULL when nargs is 0).
 * Dependencies are inferred from the tensor arguments' access modes. */
static inline int pto_submit(pto_orch *o, const char *kernel, const pto_arg *args, uint32_t nargs) {
    return o->api->submit(o, kernel, args, nargs, (const pto_task_opts *)0, (pto_task *)0);
}
/* pto_submit with options (SPMD blocks, deferred, explicit dependencies); `task` (may be
 * NULL) receives the task for pto_task_output and pto_task_opts.after. */
static inline int pto_submit_ex(pto_orch *o, const char *kernel, const pto_arg *args,
                                uint32_t nargs, const pto_task_opts *opts, pto_task *task) {
    return o->api->submit(o, kernel, args, nargs, opts, task);
}
/* The index-th runtime-allocated output (PTO_ARG_OUT_NEW, in argument order) of `task`. */
static inline int pto_task_output(pto_orch *o, pto_task task, uint32_t index, pto_tensor *out) {
    return o->api->task_output(o, task, index, out);
}

/* ---- kernels (in a pto_kernel_fn) -------------------------------------------------------- */

static inline int pto_rank(pto_kernel_ctx *c, uint32_t *rank) { return c->api->rank(c, rank); }
static inline int pto_nranks(pto_kernel_ctx *c, uint32_t *n) { return c->api->nranks(c, n); }
/* This block's index and the task's block count (SPMD). */
static inline int pto_block(pto_kernel_ctx *c, uint32_t *idx, uint32_t *num) {
    return c->api->block(c, idx, num);
}
/* Numbers of tensor and scalar arguments (either pointer may be NULL). */
static inline int pto_num_args(pto_kernel_ctx *c, uint32_t *tensors, uint32_t *scalars) {
    return c->api->num_args(c, tensors, scalars);
}
/* Tensor argument `index`: the whole tensor (chunk = 0) or this block's rows of dimension 0
 * (chunk = 1; SPMD tasks must use chunks for the tensors they write). */
static inline int pto_tensor_view(pto_kernel_ctx *c, uint32_t index, int chunk, pto_view *out) {
    return c->api->tensor(c, index, (int32_t)chunk, out);
}
static inline int pto_tensor_ptr(pto_kernel_ctx *c, uint32_t index, void **data) {
    pto_view v;
    int rc;
    if (!data) return PTO_ERR_ARG;
    rc = c->api->tensor(c, index, 0, &v);
    if (rc == PTO_OK) *data = v.data;
    return rc;
}
static inline int pto_tensor_count(pto_kernel_ctx *c, uint32_t index, uint64_t *count) {
    pto_view v;
    int rc;
    if (!count) return PTO_ERR_ARG;
    rc = c->api->tensor(c, index, 0, &v);
    if (rc == PTO_OK) *count = v.count;
    return rc;
}
static inline int pto_tensor_dtype(pto_kernel_ctx *c, uint32_t index, pto_dtype *dtype) {
    pto_view v;
    int rc;
    if (!dtype) return PTO_ERR_ARG;
    rc = c->api->tensor(c, index, 0, &v);
    if (rc == PTO_OK) *dtype = (pto_dtype)v.dtype;
    return rc;
}
/* Fills shape[0..*ndim) (shape holds PTO_MAX_DIMS). */
static inline int pto_tensor_shape(pto_kernel_ctx *c, uint32_t index, uint32_t *ndim,
                                   uint64_t *shape) {
    pto_view v;
    uint32_t i;
    int rc;
    if (!ndim || !shape) return PTO_ERR_ARG;
    rc = c->api->tensor(c, index, 0, &v);
    if (rc != PTO_OK) return rc;
    *ndim = v.ndim;
    for (i = 0; i < v.ndim; i++) shape[i] = v.shape[i];
    return rc;
}
/* Scalar argument `index`, read as the given dtype (it must be the scalar's dtype). */
static inline int pto_scalar_f64(pto_kernel_ctx *c, uint32_t index, double *v) {
    return c->api->scalar(c, index, PTO_F64, v);
}
static inline int pto_scalar_f32(pto_kernel_ctx *c, uint32_t index, float *v) {
    return c->api->scalar(c, index, PTO_F32, v);
}
static inline int pto_scalar_i64(pto_kernel_ctx *c, uint32_t index, int64_t *v) {
    return c->api->scalar(c, index, PTO_I64, v);
}
static inline int pto_scalar_i32(pto_kernel_ctx *c, uint32_t index, int32_t *v) {
    return c->api->scalar(c, index, PTO_I32, v);
}
static inline int pto_scalar_u64(pto_kernel_ctx *c, uint32_t index, uint64_t *v) {
    return c->api->scalar(c, index, PTO_U64, v);
}
static inline int pto_scalar_u32(pto_kernel_ctx *c, uint32_t index, uint32_t *v) {
    return c->api->scalar(c, index, PTO_U32, v);
}
/* This rank's part of a declared buffer (`bytes` may be NULL). Under `pto check` taking it counts
 * as a write of the whole buffer by the task, between this call and the kernel's end. */
static inline int pto_window_ptr(pto_kernel_ctx *c, const char *buffer, void **ptr,
                                 uint64_t *bytes) {
    return c->api->window_ptr(c, buffer, ptr, bytes);
}
/* Copies `bytes` from `src` into `rank`'s part of `buffer` at `offset_bytes`. */
static inline int pto_put(pto_kernel_ctx *c, uint32_t rank, const char *buffer,
                          uint64_t offset_bytes, const void *src, uint64_t bytes) {
    return c->api->put(c, rank, buffer, offset_bytes, src, bytes);
}
/* Copies `bytes` from `rank`'s part of `buffer` at `offset_bytes` into `dst`. */
static inline int pto_get(pto_kernel_ctx *c, uint32_t rank, const char *buffer,
                          uint64_t offset_bytes, void *dst, uint64_t bytes) {
    return c->api->get(c, rank, buffer, offset_bytes, dst, bytes);
}
/* Adds `value` to the u32 signal at `offset_bytes` of `rank`'s `buffer`, after every put this
 * kernel made before it is visible there (a release). */
static inline int pto_notify(pto_kernel_ctx *c, uint32_t rank, const char *buffer,
                             uint64_t offset_bytes, uint32_t value) {
    return c->api->notify(c, rank, buffer, offset_bytes, value);
}
/* Waits until this rank's u32 signal at `offset_bytes` of `buffer` is >= `value`, under the
 * run's deadline (PTO_ERR_TIMEOUT) and aborted when a peer fails (PTO_ERR_COMM). */
static inline int pto_wait_until(pto_kernel_ctx *c, const char *buffer, uint64_t offset_bytes,
                                 uint32_t value) {
    return c->api->wait_until(c, buffer, offset_bytes, value);
}
/* A barrier of every rank. */
static inline int pto_barrier(pto_kernel_ctx *c) { return c->api->barrier(c); }
/* Fails the task with `message`; returns PTO_ERR_FAILED, so `return pto_fail(ctx, "...")`. */
static inline int pto_fail(pto_kernel_ctx *c, const char *message) {
    return c->api->fail(c, message);
}
/* In a deferred task (pto_task_opts.deferred): the task completes once this rank's u32 signal
 * at `offset_bytes` of `buffer` is >= `value`, after the kernel returns; the core is free
 * meanwhile. */
static inline int pto_defer_until(pto_kernel_ctx *c, const char *buffer, uint64_t offset_bytes,
                                  uint32_t value) {
    return c->api->defer_until(c, buffer, offset_bytes, value);
}

/* The name of an error code. */
static inline const char *pto_strerror(int code) {
    switch (code) {
    case PTO_OK: return "ok";
    case PTO_ERR_ARG: return "invalid argument";
    case PTO_ERR_NOT_FOUND: return "not found";
    case PTO_ERR_RANGE: return "out of range";
    case PTO_ERR_DTYPE: return "dtype mismatch";
    case PTO_ERR_MODE: return "access mode";
    case PTO_ERR_COMM: return "communication failed";
    case PTO_ERR_TIMEOUT: return "timed out";
    case PTO_ERR_DUPLICATE: return "duplicate";
    case PTO_ERR_STATE: return "not allowed here";
    case PTO_ERR_FAILED: return "failed";
    default: return "internal error";
    }
}

/* ---- what a plugin exports ----------------------------------------------------------------
 * Declared here, inside the header's extern "C", so that a plugin written in C++ exports them
 * with their C names (and visible) without writing extern "C" itself. */
PTO_EXPORT int pto_plugin_register(pto_registry *reg);
PTO_EXPORT uint32_t pto_plugin_abi_version(void);
PTO_EXPORT void pto_plugin_teardown(void);

#ifdef __cplusplus
}
#endif

#endif /* PTO_H */
