//! The loader itself, without the CLI: `Plugin::load` of plugins built here with `cc` against
//! `include_dir()` (the example ring plugin, the pto-cli tests' bad and teardown plugins), what
//! a loaded plugin reports, its program run on threads, every load error by its variant, and
//! `pto_plugin_teardown` called once, when the last clone of the plugin drops.

// Test helpers unwrap: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use pto_core::{CoreKind, DType};
use pto_plugin::{Plugin, PluginError};

/// A folder of this test, removed when it drops.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "pto-plugin-load-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Builds `src` (relative to the repository root) into `dir/lib<name>.so` with `cc -shared
/// -fPIC -I<include_dir()>` and the extra `flags`, as a user would.
fn build(dir: &TempDir, src: &str, name: &str, flags: &[&str]) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let inc = pto_plugin::include_dir().unwrap();
    assert!(inc.join("pto.h").is_file(), "{}", inc.display());
    let lib = dir.0.join(format!("lib{name}.so"));
    let out = Command::new("cc")
        .args(["-std=c99", "-Wall", "-Werror", "-shared", "-fPIC"])
        .arg(format!("-I{}", inc.display()))
        .args(flags)
        .arg(root.join(src))
        .arg("-o")
        .arg(&lib)
        .output()
        .expect("cannot run cc");
    assert!(
        out.status.success(),
        "cc {src}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    lib
}

#[test]
fn a_built_plugin_loads_reports_what_it_registered_and_runs_on_threads() {
    let dir = TempDir::new();
    let lib = build(&dir, "examples/plugin/ring.c", "ring", &[]);
    let p = Plugin::load(&lib).unwrap();
    assert_eq!(p.path(), lib.display().to_string());
    let kernels: Vec<(&str, CoreKind)> = p.kernels().collect();
    assert_eq!(
        kernels,
        [
            ("ring_fill", CoreKind::Aiv),
            ("ring_send", CoreKind::Aiv),
            ("ring_wait", CoreKind::Aiv),
            ("ring_send_wait", CoreKind::Aiv),
            ("ring_check", CoreKind::Aiv),
            ("ring_check_noarg", CoreKind::Aiv),
        ]
    );
    assert_eq!(p.programs().collect::<Vec<_>>(), ["ring", "ring_blocking"]);
    assert!(p.has_program("ring") && !p.has_program("nope"));
    let b: Vec<(&str, DType, usize)> = p
        .buffers()
        .iter()
        .map(|b| (b.name.as_str(), b.dtype, b.count))
        .collect();
    assert_eq!(b, [("inbox", DType::F32, 256), ("flag", DType::U32, 1)]);
    assert!(p.window_spec().is_some());
    assert!(format!("{p:?}").contains("kernels: 6"), "{p:?}");
    // Its kernels join the built-ins.
    let reg = p.registry().unwrap();
    assert!(reg.lookup("ring_fill").is_ok() && reg.lookup("vector_add").is_ok());
    // An unknown program names the plugin's.
    let e = p.program("nope").err().unwrap();
    assert!(matches!(e, PluginError::UnknownProgram { .. }), "{e:?}");
    assert!(e.to_string().contains("ring, ring_blocking"), "{e}");
    // Its programs on 1, 2 and 4 ranks of threads.
    for program in ["ring", "ring_blocking"] {
        for n in [1, 2, 4] {
            let results = pto_comm::local::run(n, |comm| {
                p.run_on(program, &comm, (1, 2), false)
                    .map(|r| r.stats.tasks)
                    .map_err(|e| e.to_string())
            })
            .unwrap();
            assert_eq!(results.len(), n);
            for r in results {
                let tasks = r.unwrap().unwrap();
                assert!(tasks >= 3, "{program} on {n}: {tasks} tasks");
            }
        }
    }
}

#[test]
fn a_missing_file_a_folder_and_a_non_library_are_refused_naming_the_path() {
    let dir = TempDir::new();
    let missing = dir.0.join("libmissing.so");
    let e = Plugin::load(&missing).unwrap_err();
    assert!(matches!(e, PluginError::NotFound { .. }), "{e:?}");
    let m = e.to_string();
    assert!(
        m.contains(&missing.display().to_string()) && m.contains("No such file"),
        "{m}"
    );
    assert_eq!(e.fault(), pto_core::Fault::Usage);
    let e = Plugin::load(&dir.0).unwrap_err();
    assert!(matches!(e, PluginError::NotFound { .. }), "{e:?}");
    assert!(e.to_string().contains("not a file"), "{e}");
    let junk = dir.0.join("libjunk.so");
    std::fs::write(&junk, "not a library").unwrap();
    let e = Plugin::load(&junk).unwrap_err();
    assert!(matches!(e, PluginError::Open { .. }), "{e:?}");
    assert!(
        e.to_string().contains(&junk.display().to_string())
            && e.to_string().contains("cannot load it"),
        "{e}"
    );
}

#[test]
fn bad_plugins_are_refused_by_the_loader_with_their_variant() {
    let dir = TempDir::new();
    let bad = "crates/pto-cli/tests/plugins/bad.c";
    let e = Plugin::load(build(&dir, bad, "noreg", &["-DNO_REGISTER"])).unwrap_err();
    assert!(
        matches!(
            e,
            PluginError::MissingSymbol {
                symbol: "pto_plugin_register",
                ..
            }
        ),
        "{e:?}"
    );
    let e = Plugin::load(build(&dir, bad, "abi", &["-DABI_MISMATCH"])).unwrap_err();
    assert!(
        matches!(e, PluginError::AbiMismatch { plugin: 999, loader, .. } if loader == pto_plugin::ABI_VERSION),
        "{e:?}"
    );
    for (define, code, want) in [
        (
            "-DDUPLICATE_KERNEL",
            0,
            "kernel \"twice\" is registered twice",
        ),
        ("-DBUFFER_TWICE", 0, "buffer \"b\" is declared twice"),
        ("-DREGISTER_FAILS", 7, "no pto_* call failed"),
    ] {
        let e = Plugin::load(build(&dir, bad, &define[3..], &[define])).unwrap_err();
        match &e {
            PluginError::Register {
                code: c, message, ..
            } => {
                assert_eq!(*c, code, "{define}: {e}");
                assert!(message.contains(want), "{define}: {e}");
            }
            _ => panic!("{define}: {e:?}"),
        }
    }
    // A kernel named like a built-in loads, and is refused when it joins their registry.
    let p = Plugin::load(build(&dir, bad, "builtin", &["-DBUILTIN_NAME"])).unwrap();
    let e = p.registry().unwrap_err();
    assert!(
        matches!(&e, PluginError::Duplicate { kernel, .. } if kernel == "vector_add"),
        "{e:?}"
    );
}

/// The marker files of `teardown.c` in `dir`: file names, sorted, and the teardown lines.
fn markers(dir: &Path) -> (Vec<String>, usize) {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let teardown = dir.join(format!("teardown.{}", std::process::id()));
    let lines = std::fs::read_to_string(teardown).map_or(0, |s| s.lines().count());
    (names, lines)
}

#[test]
fn teardown_runs_once_when_the_last_clone_and_kernel_of_the_plugin_drop() {
    let dir = TempDir::new();
    let marks = dir.0.join("markers");
    std::fs::create_dir_all(&marks).unwrap();
    // The marker folder is built in: the environment is this process's, shared by its tests.
    let def = format!("-DPTO_TEST_MARKER_DIR=\"{}\"", marks.display());
    let lib = build(
        &dir,
        "crates/pto-cli/tests/plugins/teardown.c",
        "teardown",
        &[&def],
    );
    let pid = std::process::id();
    let p = Plugin::load(&lib).unwrap();
    let clone = p.clone();
    let results = pto_comm::local::run(2, |comm| {
        p.run_on("touch", &comm, (1, 1), false)
            .map(|r| r.stats.tasks)
            .map_err(|e| e.to_string())
    })
    .unwrap();
    for r in results {
        assert_eq!(r.unwrap().unwrap(), 1);
    }
    assert_eq!(markers(&marks), (vec![format!("kernel.{pid}")], 0));
    // A registry holding its kernels keeps it loaded, as a clone does.
    let reg = p.registry().unwrap();
    drop(p);
    drop(clone);
    assert_eq!(markers(&marks).1, 0, "torn down while its kernels live");
    drop(reg);
    assert_eq!(
        markers(&marks),
        (vec![format!("kernel.{pid}"), format!("teardown.{pid}")], 1)
    );
}
