//! # pto-simpler
//!
//! Runs programs written for simpler (the PTO runtime's C++ task runtime) on pto chips,
//! unchanged: kernels in C++ over `ChipTensor`/`CommContext` (and the user's pto-isa), and
//! orchestrations over simpler's orchestration API, each compiled against pto's own
//! source-compatible headers ([`include_dir`], `pto include-dir --simpler`).
//!
//! A Worker registers [`chip_program`] (with [`kernel::registry`]'s two kernels) as the chip
//! program [`PROGRAM`]; the Python layer (`python -m pto.simpler`) sends it requests
//! ([`request`]) to allocate communication domains and to run callables. On a chip, a run
//! loads the orchestration and kernel libraries, calls the orchestration's entry inside an
//! implicit scope, turns each submit into a pto task with simpler's dependency rules, and runs
//! each task's `kernel_entry` on a pto core with simpler's argument array; deferred-completion
//! slab entries become pto deferred conditions.
//!
//! ```no_run
//! // A Worker whose chips can run simpler programs (what pto's Python package builds).
//! let w = pto_worker::Worker::builder()
//!     .chips(2)
//!     .program(pto_simpler::PROGRAM, pto_simpler::kernel::registry()?, pto_simpler::chip_program)
//!     .init()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! What maps to what, and what is not supported: `docs/design/simpler.md`.
//!
//! | module | holds |
//! |---|---|
//! | `abi` | the headers' types, `#[repr(C)]`, layouts pinned |
//! | `request` | the host's requests to a chip |
//! | `chip` | the chip program |
//! | `runtime` | a run: submits, dependencies, scopes, in safe Rust |
//! | `kernel` | the registry kernels that call compiled kernels |
//! | `domain` | communication domains and their `CommContext`s |
//! | `device` | chip memory the host allocated (`alloc_child_tensor`) |
//! | `library` | `dlopen` and symbols. **unsafe** (FFI) |
//! | `entry` | the operations table and the calls into C++. **unsafe** (FFI) |

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod abi;
mod chip;
mod device;
mod domain;
mod entry;
pub mod kernel;
mod library;
pub mod request;
mod runtime;

use std::path::{Path, PathBuf};

pub use abi::{dtype_code, ChipTensor, CommContext, ABI_VERSION};
pub use chip::chip_program;
pub use domain::buffer_offsets;

/// The name of the chip program ([`chip_program`]) a Worker registers.
pub const PROGRAM: &str = "simpler";

/// Why a simpler program could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimplerError {
    /// A shared library could not be opened.
    #[error("cannot load {path}: {why}")]
    Open {
        /// Its path.
        path: String,
        /// The loader's message.
        why: String,
    },
    /// A symbol pto needs is missing.
    #[error("{path}: no symbol {symbol}: {why}")]
    Symbol {
        /// The library.
        path: String,
        /// The symbol.
        symbol: String,
        /// What it is for.
        why: String,
    },
    /// An orchestration built against another version of pto's headers.
    #[error("{path} was built against pto's simpler headers of ABI version {library}, this pto has {pto}: rebuild it (pto include-dir --simpler)")]
    Abi {
        /// The library.
        path: String,
        /// Its version.
        library: i32,
        /// pto's.
        pto: i32,
    },
    /// A request that is not one.
    #[error("bad request from the host: {0}")]
    Request(String),
    /// A domain could not be made or freed.
    #[error("domain {name}: {why}")]
    Domain {
        /// Its name.
        name: String,
        /// Why.
        why: String,
    },
    /// Chip memory could not be allocated, found or copied.
    #[error("chip memory #{id}: {why}")]
    Device {
        /// The host's id of the allocation.
        id: u64,
        /// Why.
        why: String,
    },
    /// A callable's run failed on a chip.
    #[error("callable {callable}{} on chip {chip}: {why}", if orchestration.is_empty() { String::new() } else { format!(" ({orchestration})") })]
    Run {
        /// The callable's name.
        callable: String,
        /// Its orchestration's source file.
        orchestration: String,
        /// The chip.
        chip: usize,
        /// What failed.
        why: String,
    },
}

/// The headers, by file name (relative to the include folder), as text.
pub const HEADERS: &[(&str, &str)] = &[
    (
        "aicore_completion_mailbox_types.h",
        include_str!("../include/simpler/aicore_completion_mailbox_types.h"),
    ),
    ("common.h", include_str!("../include/simpler/common.h")),
    (
        "common/dma_workspace.h",
        include_str!("../include/simpler/common/dma_workspace.h"),
    ),
    (
        "data_type.h",
        include_str!("../include/simpler/data_type.h"),
    ),
    (
        "intrinsic.h",
        include_str!("../include/simpler/intrinsic.h"),
    ),
    (
        "pipe_sync.h",
        include_str!("../include/simpler/pipe_sync.h"),
    ),
    (
        "platform_comm/comm_context.h",
        include_str!("../include/simpler/platform_comm/comm_context.h"),
    ),
    (
        "pto_arg_with_deps.h",
        include_str!("../include/simpler/pto_arg_with_deps.h"),
    ),
    (
        "pto_async_kernel_api.h",
        include_str!("../include/simpler/pto_async_kernel_api.h"),
    ),
    (
        "pto_completion_token.h",
        include_str!("../include/simpler/pto_completion_token.h"),
    ),
    (
        "pto_constants.h",
        include_str!("../include/simpler/pto_constants.h"),
    ),
    (
        "pto_orchestration_api.h",
        include_str!("../include/simpler/pto_orchestration_api.h"),
    ),
    (
        "pto_simpler_check.h",
        include_str!("../include/simpler/pto_simpler_check.h"),
    ),
    (
        "pto_submit_types.h",
        include_str!("../include/simpler/pto_submit_types.h"),
    ),
    (
        "pto_task_id.h",
        include_str!("../include/simpler/pto_task_id.h"),
    ),
    (
        "pto_types.h",
        include_str!("../include/simpler/pto_types.h"),
    ),
    (
        "task_args.h",
        include_str!("../include/simpler/task_args.h"),
    ),
    ("tensor.h", include_str!("../include/simpler/tensor.h")),
    (
        "tensor_create_info.h",
        include_str!("../include/simpler/tensor_create_info.h"),
    ),
];

/// The folder of pto's simpler-compatible headers: this source tree's `include/simpler/` when
/// it is there and current, else a copy written under the user's cache folder
/// (`$XDG_CACHE_HOME/pto/simpler-include-<ABI>`, or `~/.cache/...`, or the temporary folder).
///
/// # Errors
///
/// The copy could not be written.
pub fn include_dir() -> std::io::Result<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("include/simpler");
    if HEADERS
        .iter()
        .all(|(name, text)| std::fs::read_to_string(src.join(name)).is_ok_and(|h| h == *text))
    {
        return Ok(std::fs::canonicalize(&src).unwrap_or(src));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    let dir = base
        .join("pto")
        .join(format!("simpler-include-{ABI_VERSION}"));
    for (name, text) in HEADERS {
        let file = dir.join(name);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)?;
        }
        if std::fs::read_to_string(&file).ok().as_deref() != Some(*text) {
            std::fs::write(&file, text)?;
        }
    }
    Ok(dir)
}
