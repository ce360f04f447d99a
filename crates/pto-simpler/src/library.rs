//! Loading compiled kernels and orchestrations: `dlopen`, the symbols pto calls, and a cache so
//! that a chip loads each file once.

#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use crate::abi::{AbiVersion, BindRuntime, CallOrchestration, KernelEntry, ABI_VERSION};
use crate::SimplerError;

/// An open shared library, closed when the last user drops it.
pub(crate) struct Library {
    path: PathBuf,
    raw: *mut c_void,
    lib: Option<libloading::os::unix::Library>,
}

impl std::fmt::Debug for Library {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Library").field("path", &self.path).finish()
    }
}

// SAFETY: a dlopen handle may be used and closed from any thread (dlsym and dlclose are
// thread-safe); the path is plain data.
unsafe impl Send for Library {}
// SAFETY: as above; `&Library` only reads the handle.
unsafe impl Sync for Library {}

impl Drop for Library {
    fn drop(&mut self) {
        drop(self.lib.take());
    }
}

impl Library {
    /// The file it was opened from.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The address of `symbol`, or `None` when `dlsym` returns NULL.
    fn symbol(&self, symbol: &str) -> Option<*mut c_void> {
        let name = CString::new(symbol).ok()?;
        // SAFETY: `raw` is a live handle from dlopen (closed only when `self` drops) and
        // `name` a NUL-terminated string.
        let p = unsafe { libc::dlsym(self.raw, name.as_ptr()) };
        (!p.is_null()).then_some(p)
    }

    /// `kernel_entry`, the one symbol a kernel library must export.
    pub(crate) fn kernel_entry(&self) -> Result<KernelEntry, SimplerError> {
        let p = self
            .symbol("kernel_entry")
            .ok_or_else(|| SimplerError::Symbol {
                path: self.path.display().to_string(),
                symbol: "kernel_entry".into(),
                why: "a kernel must define extern \"C\" void kernel_entry(int64_t *args)".into(),
            })?;
        // SAFETY: the symbol is the kernel's entry, declared `extern "C" void
        // kernel_entry(int64_t *)` by simpler's kernel ABI; a library whose symbol of that name
        // has another type is a broken kernel, as it would be on the device.
        Ok(unsafe { std::mem::transmute::<*mut c_void, KernelEntry>(p) })
    }

    /// An orchestration function (the entry or the config function) by name, as an address.
    pub(crate) fn function(&self, name: &str, what: &str) -> Result<*mut c_void, SimplerError> {
        self.symbol(name).ok_or_else(|| SimplerError::Symbol {
            path: self.path.display().to_string(),
            symbol: name.into(),
            why: format!(
                "the callable names it as its {what} function: export it with extern \"C\""
            ),
        })
    }

    /// The binding and calling helpers every orchestration built against pto's
    /// `pto_orchestration_api.h` exports, after checking its ABI version.
    pub(crate) fn orchestration_glue(
        &self,
    ) -> Result<(BindRuntime, CallOrchestration), SimplerError> {
        let glue = |symbol: &str| {
            self.symbol(symbol).ok_or_else(|| SimplerError::Symbol {
                path: self.path.display().to_string(),
                symbol: symbol.into(),
                why: "the orchestration was not built against pto's pto_orchestration_api.h \
                      (pto include-dir --simpler)"
                    .into(),
            })
        };
        let version = glue("pto_simpler_abi_version")?;
        // SAFETY: pto's header defines `pto_simpler_abi_version` as `int32_t (void)`.
        let version = unsafe { std::mem::transmute::<*mut c_void, AbiVersion>(version) };
        let v = crate::entry::call_abi_version(version);
        if v != ABI_VERSION {
            return Err(SimplerError::Abi {
                path: self.path.display().to_string(),
                library: v,
                pto: ABI_VERSION,
            });
        }
        let bind = glue("pto_simpler_bind_runtime")?;
        let call = glue("pto_simpler_call_orchestration")?;
        // SAFETY: both are defined by pto's header (of the ABI version checked above) with
        // exactly these signatures.
        unsafe {
            Ok((
                std::mem::transmute::<*mut c_void, BindRuntime>(bind),
                std::mem::transmute::<*mut c_void, CallOrchestration>(call),
            ))
        }
    }
}

/// Every library this process opened, by path: a chip opens each file once (paths of the build
/// cache name their content, so a rebuilt source is a new path).
fn cache() -> &'static Mutex<HashMap<PathBuf, Arc<Library>>> {
    static CACHE: OnceLock<Mutex<HashMap<PathBuf, Arc<Library>>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Opens `path` (or returns the copy opened before).
pub(crate) fn open(path: &str) -> Result<Arc<Library>, SimplerError> {
    let key = PathBuf::from(path);
    if let Some(l) = cache().lock().get(&key) {
        return Ok(l.clone());
    }
    let meta = std::fs::metadata(&key).map_err(|e| SimplerError::Open {
        path: path.into(),
        why: e.to_string(),
    })?;
    if !meta.is_file() {
        return Err(SimplerError::Open {
            path: path.into(),
            why: "not a file".into(),
        });
    }
    let full = std::fs::canonicalize(&key).unwrap_or_else(|_| key.clone());
    // SAFETY: opening a library runs its initialisers: loading a user's compiled kernel or
    // orchestration is running the user's code, which is what was asked. RTLD_NOW reports
    // unresolved symbols here; RTLD_LOCAL keeps each library's symbols (the weak binding
    // helpers every orchestration defines) to itself.
    let lib = unsafe {
        libloading::os::unix::Library::open(Some(&full), libc::RTLD_NOW | libc::RTLD_LOCAL)
    }
    .map_err(|e| SimplerError::Open {
        path: path.into(),
        why: e.to_string(),
    })?;
    let raw = lib.into_raw();
    // SAFETY: `raw` came from `into_raw` just above; the new owner closes it once.
    let lib = unsafe { libloading::os::unix::Library::from_raw(raw) };
    let l = Arc::new(Library {
        path: key.clone(),
        raw,
        lib: Some(lib),
    });
    cache().lock().insert(key, l.clone());
    Ok(l)
}
