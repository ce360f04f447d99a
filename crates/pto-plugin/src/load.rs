//! Loading a plugin: `dlopen`, its symbols (optional ones are absent exactly when `dlsym`
//! returns NULL: no `dlerror` query), the ABI check and the registration.

#![allow(unsafe_code)]

use std::ffi::{c_void, CString};
use std::path::{Path, PathBuf};

use crate::abi::{AbiVersionFn, RegisterFn, TeardownFn, ABI_VERSION};
use crate::entry;
use crate::PluginError;

/// The library's handle, kept open while anything of the plugin lives.
pub(crate) struct Library {
    /// libloading's library (it closes the handle when dropped).
    lib: Option<libloading::os::unix::Library>,
    raw: *mut c_void,
    teardown: Option<TeardownFn>,
}

// SAFETY: a `dlopen` handle may be used and closed from any thread (dlsym and dlclose are
// thread-safe); the teardown function pointer is plain data.
unsafe impl Send for Library {}
// SAFETY: as above; `&Library` only reads the handle.
unsafe impl Sync for Library {}

impl Drop for Library {
    fn drop(&mut self) {
        if let Some(t) = self.teardown {
            entry::call_teardown(t);
        }
        drop(self.lib.take());
    }
}

impl Library {
    /// The address of `symbol`, or `None` when `dlsym` returns NULL.
    fn symbol(&self, symbol: &str) -> Option<*mut c_void> {
        let name = CString::new(symbol).ok()?;
        // SAFETY: `raw` is a live handle from dlopen (closed only when `self` drops) and
        // `name` a NUL-terminated string.
        let p = unsafe { libc::dlsym(self.raw, name.as_ptr()) };
        (!p.is_null()).then_some(p)
    }
}

/// Opens `path` and registers the plugin: the library, and what it registered.
pub(crate) fn open(path: &Path) -> Result<(Library, crate::call::Registration), PluginError> {
    let shown = path.display().to_string();
    let meta = std::fs::metadata(path).map_err(|e| PluginError::NotFound {
        path: shown.clone(),
        reason: e.to_string(),
    })?;
    if !meta.is_file() {
        return Err(PluginError::NotFound {
            path: shown,
            reason: "not a file".into(),
        });
    }
    // A name without a slash would be searched for in the library path: always open the file.
    let full: PathBuf = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    // SAFETY: opening a library runs its initialisers: loading a plugin is running its code,
    // which the user asked for (documented on `Plugin::load`). RTLD_NOW reports unresolved
    // symbols here rather than at a first call; RTLD_LOCAL keeps its symbols to itself.
    let lib = unsafe {
        libloading::os::unix::Library::open(Some(&full), libc::RTLD_NOW | libc::RTLD_LOCAL)
    }
    .map_err(|e| PluginError::Open {
        path: shown.clone(),
        reason: e.to_string(),
    })?;
    let raw = lib.into_raw();
    // SAFETY: `raw` came from `into_raw` just above; the new owner closes it once.
    let lib = unsafe { libloading::os::unix::Library::from_raw(raw) };
    let mut lib = Library {
        lib: Some(lib),
        raw,
        teardown: None,
    };
    let Some(register) = lib.symbol("pto_plugin_register") else {
        return Err(PluginError::MissingSymbol {
            path: shown,
            symbol: "pto_plugin_register",
        });
    };
    if let Some(v) = lib.symbol("pto_plugin_abi_version") {
        // SAFETY: the header declares `uint32_t pto_plugin_abi_version(void)`.
        let f: AbiVersionFn = unsafe { std::mem::transmute::<*mut c_void, AbiVersionFn>(v) };
        let got = entry::call_abi_version(f);
        if got != ABI_VERSION {
            return Err(PluginError::AbiMismatch {
                path: shown,
                plugin: got,
                loader: ABI_VERSION,
            });
        }
    }
    // SAFETY: the header declares `int pto_plugin_register(pto_registry *)`.
    let register: RegisterFn = unsafe { std::mem::transmute::<*mut c_void, RegisterFn>(register) };
    let (rc, reg) = entry::call_register(register);
    if rc != 0 || reg.first_error.is_some() {
        let message = reg
            .first_error
            .clone()
            .unwrap_or_else(|| "(it gave no reason: no pto_* call failed)".into());
        return Err(PluginError::Register {
            path: shown,
            code: rc,
            message,
        });
    }
    if let Some(t) = lib.symbol("pto_plugin_teardown") {
        // SAFETY: the header declares `void pto_plugin_teardown(void)`.
        lib.teardown = Some(unsafe { std::mem::transmute::<*mut c_void, TeardownFn>(t) });
    }
    Ok((lib, reg))
}
