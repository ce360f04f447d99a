//! The engine's hot path allocates nothing per task: task nodes, argument vectors, edge lists
//! and scope lists are recycled, so a run of many more tasks makes only a few more allocations.
//! Counted by a global allocator, so this is its own test binary.

#![allow(clippy::unwrap_used)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use pto_core::{Chip, CoreKind, DType, KernelRegistry, Program, TaskArgs, Tensor};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded contract.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded contract.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded contract.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations made by one run of `n` tasks: a chain on one tensor and a fan over a second's
/// elements, in scopes of 256, each task with one scalar.
fn allocations(chip: &Chip, k: &Arc<KernelRegistry>, n: usize) -> u64 {
    let cell = Tensor::zeros(&[1], DType::I64).unwrap();
    let fan = Tensor::zeros(&[256], DType::I64).unwrap();
    let views: Vec<Tensor> = (0..256).map(|i| fan.view(&[1], &[i]).unwrap()).collect();
    let (c, v) = (cell.clone(), views.clone());
    let program = Program::new("alloc", k.clone(), move |o| {
        let mut i = 0;
        while i < n {
            o.scope(|o| {
                for e in &v {
                    o.submit("inc", TaskArgs::new().inout(&c).scalar(1i64))?;
                    o.submit("inc", TaskArgs::new().inout(e).scalar(1i64))?;
                }
                Ok(())
            })?;
            i += 512;
        }
        Ok(())
    });
    let before = ALLOCS.load(Ordering::Relaxed);
    chip.run(&program).unwrap();
    let made = ALLOCS.load(Ordering::Relaxed) - before;
    assert_eq!(cell.read::<i64>().unwrap(), vec![(n / 2) as i64]);
    made
}

#[test]
fn a_long_run_makes_no_allocation_per_task() {
    let mut k = KernelRegistry::new();
    k.register("inc", CoreKind::Aiv, |ctx| {
        let by = ctx.scalar::<i64>(0)?;
        ctx.output::<i64>(0)?.for_each_mut(|x| *x += by);
        Ok(())
    })
    .unwrap();
    let k = Arc::new(k);
    let chip = Chip::builder()
        .aic_cores(1)
        .aiv_cores(2)
        .threads(2)
        .build()
        .unwrap();
    // Warm up: the slab, the rings and the pools reach their steady size. That size is the
    // most tasks live at once, which depends on how far the orchestrating thread ran ahead of
    // the cores (a loaded machine, a chip that keeps a core thread for it): a later run that
    // goes further ahead grows the pools once more. So each figure is the least of a few runs:
    // an allocation per task would show in every run.
    allocations(&chip, &k, 20_480);
    let short = (0..2).map(|_| allocations(&chip, &k, 1_024)).min().unwrap();
    let long = (0..3)
        .map(|_| allocations(&chip, &k, 20_480))
        .min()
        .unwrap();
    eprintln!("{short} allocations for 1,024 tasks, {long} for 20,480");
    // 19,456 more tasks: a per-task allocation would add at least that many. What is left is
    // amortized over many tasks (the ready queues' blocks of 63 entries, a buffer's TensorMap
    // index made again after all its entries retired): about one per 30 tasks.
    assert!(
        long <= short + 19_456 / 8,
        "{short} allocations for 1,024 tasks, {long} for 20,480"
    );
}
