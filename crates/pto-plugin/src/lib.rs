//! # pto-plugin
//!
//! Kernels and programs from C: a plugin is a shared library built against `include/pto.h`
//! that registers kernels (functions run on a chip's cores), programs (orchestrations every
//! rank's chip runs) and the named buffers of the window its kernels share. [`Plugin::load`]
//! opens one; its kernels join the same [`KernelRegistry`] as the built-in kernels, and its
//! programs run on any backend ([`Plugin::run_on`] for one rank of a communicator; the CLI's
//! `pto run --plugin`, the Python package's `pto.load_plugin` and the Worker for the rest).
//!
//! ```no_run
//! let plugin = pto_plugin::Plugin::load("./libring.so")?;
//! for (name, kind) in plugin.kernels() {
//!     println!("kernel {name} on {kind}");
//! }
//! // Run its program `ring` on 4 ranks (threads of this process).
//! let results = pto_comm::local::run(4, |comm| {
//!     plugin.run_on("ring", &comm, (1, 2), false).map(|r| r.stats.tasks).map_err(|e| e.to_string())
//! })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The ABI, its versioning and what each call does: `docs/design/plugins.md`.
//!
//! | module | holds |
//! |---|---|
//! | `abi` | the header's types, `#[repr(C)]` |
//! | `entry` | the table of entry points plugins call, and the calls into plugins. **unsafe** (FFI) |
//! | `load` | `dlopen`, symbols, the ABI check, registration. **unsafe** (FFI) |
//! | `call` | what each entry point does, in safe Rust |

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod abi;
mod call;
mod entry;
mod load;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use pto_comm::{BufferSpec, Comm, CommContext, CommError, WindowSpec};
use pto_core::{
    Chip, CoreKind, KernelRegistry, Orch, OrchError, Program, RegistryError, RunError, RunOptions,
    RunReport,
};

pub use abi::ABI_VERSION;

/// The header, `include/pto.h`, as text.
pub const HEADER: &str = include_str!("../include/pto.h");

/// Why a plugin could not be loaded or run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PluginError {
    /// The file is not there (or not a file).
    #[error("plugin {path}: {reason}")]
    NotFound {
        /// The path given.
        path: String,
        /// What the file system said.
        reason: String,
    },
    /// `dlopen` refused it (not a shared library, an unresolved symbol, ...).
    #[error("plugin {path}: cannot load it: {reason}")]
    Open {
        /// The path given.
        path: String,
        /// What `dlopen` said.
        reason: String,
    },
    /// A required symbol is not exported.
    #[error("plugin {path}: the required symbol {symbol} is missing (export it with PTO_EXPORT)")]
    MissingSymbol {
        /// The path given.
        path: String,
        /// The symbol.
        symbol: &'static str,
    },
    /// `pto_plugin_abi_version` returned another version.
    #[error("plugin {path}: pto_plugin_abi_version returns {plugin}, this pto has ABI version {loader}: rebuild it against this pto's header (pto include-dir)")]
    AbiMismatch {
        /// The path given.
        path: String,
        /// What the plugin says.
        plugin: u32,
        /// What this loader implements.
        loader: u32,
    },
    /// `pto_plugin_register` failed, or a registration call in it did.
    #[error("plugin {path}: pto_plugin_register failed (returned {code}): {message}")]
    Register {
        /// The path given.
        path: String,
        /// What it returned.
        code: i32,
        /// The first registration call that failed, or that none did.
        message: String,
    },
    /// A kernel of the plugin has the name of a built-in kernel or of another plugin's.
    #[error("plugin {path}: kernel {kernel:?} is already registered (a built-in kernel or another plugin's has that name)")]
    Duplicate {
        /// The path given.
        path: String,
        /// The kernel.
        kernel: String,
    },
    /// No program by that name.
    #[error("plugin {path} has no program {name:?}; its programs are: {available}")]
    UnknownProgram {
        /// The path given.
        path: String,
        /// The name asked for.
        name: String,
        /// Its programs.
        available: String,
    },
    /// Communication (the window, the exchange) failed.
    #[error(transparent)]
    Comm(#[from] CommError),
    /// The run failed (a task of the program, the program itself).
    #[error(transparent)]
    Run(#[from] RunError),
    /// A registry error.
    #[error(transparent)]
    Registry(#[from] RegistryError),
}

impl PluginError {
    /// The kind of failure (what `pto run`'s exit code says): a plugin that cannot be loaded
    /// is the user's input, so a usage error; a failed run is a runtime failure.
    pub fn fault(&self) -> pto_core::Fault {
        match self {
            PluginError::Comm(e) => e.fault(),
            PluginError::Run(e) => e.fault(),
            _ => pto_core::Fault::Usage,
        }
    }
}

struct Loaded {
    path: String,
    reg: call::Registration,
    // Dropped last: the registration's function pointers point into it.
    _lib: load::Library,
}

/// A loaded plugin. Cloning is cheap; the library stays loaded while any clone, or any kernel
/// or program made from it, lives.
#[derive(Clone)]
pub struct Plugin {
    inner: Arc<Loaded>,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("path", &self.inner.path)
            .field("kernels", &self.inner.reg.kernels.len())
            .field("programs", &self.inner.reg.programs.len())
            .field("buffers", &self.inner.reg.buffers.len())
            .finish()
    }
}

impl Plugin {
    /// Loads the shared library at `path` and registers it.
    ///
    /// Loading a plugin runs its code (its initialisers and `pto_plugin_register`) in this
    /// process, as running a program would: load only libraries you trust.
    ///
    /// # Errors
    ///
    /// A missing file, a file `dlopen` refuses, a missing `pto_plugin_register`, an ABI
    /// version other than [`ABI_VERSION`], or a registration that failed (a duplicate name, a
    /// buffer declared twice with different sizes, an invalid argument, a non-zero return):
    /// each names the file and the symbol or call.
    pub fn load(path: impl AsRef<Path>) -> Result<Plugin, PluginError> {
        let path = path.as_ref();
        let (lib, reg) = load::open(path)?;
        tracing::debug!(
            plugin = %path.display(),
            kernels = reg.kernels.len(),
            programs = reg.programs.len(),
            buffers = reg.buffers.len(),
            "plugin loaded"
        );
        Ok(Plugin {
            inner: Arc::new(Loaded {
                path: path.display().to_string(),
                reg,
                _lib: lib,
            }),
        })
    }

    /// The path it was loaded from.
    pub fn path(&self) -> &str {
        &self.inner.path
    }

    /// Its kernels: name and core kind, in registration order.
    pub fn kernels(&self) -> impl Iterator<Item = (&str, CoreKind)> {
        self.inner.reg.kernels.iter().map(|k| (k.0.as_str(), k.1))
    }

    /// True when it registered a program named `name`.
    pub fn has_program(&self, name: &str) -> bool {
        self.inner.reg.programs.iter().any(|p| p.0 == name)
    }

    /// Its programs' names, in registration order.
    pub fn programs(&self) -> impl Iterator<Item = &str> {
        self.inner.reg.programs.iter().map(|p| p.0.as_str())
    }

    /// The window buffers it declared.
    pub fn buffers(&self) -> &[BufferSpec] {
        &self.inner.reg.buffers
    }

    /// The window its programs need (`None` when it declared no buffer).
    pub fn window_spec(&self) -> Option<WindowSpec> {
        let b = self.buffers();
        (!b.is_empty()).then(|| WindowSpec::for_buffers(b.to_vec()))
    }

    /// Adds its kernels to `reg`.
    ///
    /// # Errors
    ///
    /// [`PluginError::Duplicate`] when `reg` has a kernel of the same name (nothing is added).
    pub fn add_kernels(&self, reg: &mut KernelRegistry) -> Result<(), PluginError> {
        for (name, _, _) in &self.inner.reg.kernels {
            if reg.lookup(name).is_ok() {
                return Err(PluginError::Duplicate {
                    path: self.inner.path.clone(),
                    kernel: name.clone(),
                });
            }
        }
        for (name, kind, f) in &self.inner.reg.kernels {
            let (f, keep) = (*f, self.clone());
            reg.register(name, *kind, move |ctx| {
                let _loaded = &keep;
                entry::call_kernel(f, ctx)
            })?;
        }
        Ok(())
    }

    /// The built-in kernels (`pto-kernels`) and this plugin's.
    ///
    /// # Errors
    ///
    /// As [`Plugin::add_kernels`].
    pub fn registry(&self) -> Result<KernelRegistry, PluginError> {
        let mut reg = pto_kernels::registry()?;
        self.add_kernels(&mut reg)?;
        Ok(reg)
    }

    /// Program `name`'s orchestration, for a chip whose kernels include this plugin's.
    ///
    /// # Errors
    ///
    /// [`PluginError::UnknownProgram`].
    pub fn orchestration(
        &self,
        name: &str,
    ) -> Result<impl Fn(&mut Orch<'_>) -> Result<(), OrchError> + Send + Sync + 'static, PluginError>
    {
        let Some((_, f)) = self.inner.reg.programs.iter().find(|p| p.0 == name) else {
            return Err(PluginError::UnknownProgram {
                path: self.inner.path.clone(),
                name: name.to_string(),
                available: self.programs().collect::<Vec<_>>().join(", "),
            });
        };
        let (f, keep, name) = (*f, self.clone(), name.to_string());
        Ok(move |o: &mut Orch<'_>| {
            let _loaded = &keep;
            entry::call_program(f, &name, o)
        })
    }

    /// Program `name` with the built-in kernels and this plugin's.
    ///
    /// # Errors
    ///
    /// As [`Plugin::orchestration`] and [`Plugin::registry`].
    pub fn program(&self, name: &str) -> Result<Program, PluginError> {
        let orch = self.orchestration(name)?;
        Ok(Program::new(name, self.registry()?, orch))
    }

    /// Runs program `name` as this rank of `comm`: allocates the window of the declared buffers
    /// (collective), builds a chip with `cores` (AIC, AIV) whose kernels reach the window, runs
    /// the program, and releases the window.
    ///
    /// # Collective
    ///
    /// Every rank of `comm` calls it with the same program.
    ///
    /// # Errors
    ///
    /// An unknown program, a window that cannot be allocated, a failed task or program (the
    /// error names the task, kernel and message), a peer's failure.
    pub fn run_on(
        &self,
        name: &str,
        comm: &Comm,
        cores: (u32, u32),
        trace: bool,
    ) -> Result<RunReport, PluginError> {
        let program = self.program(name)?;
        let window = match self.window_spec() {
            Some(spec) => Some(comm.alloc_window(&spec)?),
            None => None,
        };
        let mut ctx = CommContext::new(comm.clone());
        if let Some(w) = &window {
            ctx = ctx.with_window(w.clone());
        }
        let chip = Chip::builder()
            .chip_id(comm.rank() as u32)
            .aic_cores(cores.0)
            .aiv_cores(cores.1)
            .extension(Arc::new(ctx))
            .build()?;
        let report = chip.run_with(&program, RunOptions { trace })?;
        if let Some(w) = window {
            // Nobody may still be writing into a window when it goes away.
            w.release()?;
        }
        Ok(report)
    }
}

/// The folder that holds `pto.h`: this source tree's `include/` when it is there, else a copy
/// of the header written under the user's cache folder (`$XDG_CACHE_HOME/pto/include-<ABI>`,
/// or `~/.cache/...`, or the temporary folder).
///
/// # Errors
///
/// The copy could not be written.
pub fn include_dir() -> std::io::Result<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("include");
    if std::fs::read_to_string(src.join("pto.h")).is_ok_and(|h| h == HEADER) {
        return Ok(std::fs::canonicalize(&src).unwrap_or(src));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    let dir = base.join("pto").join(format!("include-{ABI_VERSION}"));
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("pto.h");
    if std::fs::read_to_string(&file).ok().as_deref() != Some(HEADER) {
        std::fs::write(&file, HEADER)?;
    }
    Ok(dir)
}
