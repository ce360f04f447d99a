//! Collectives property-tested against a sequential reference: random rank counts, element
//! counts (not multiples of the rank count, zero included), dtypes, operations, algorithms and
//! staging capacities (small ones force data through in pieces), several calls in a row on the
//! same window (epochs).

// Test helpers unwrap: a failure there is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use proptest::prelude::*;
use pto_comm::{local, Algorithm, Collectives, ReduceOp, Reducible};

fn value(r: usize, i: usize, round: usize) -> i64 {
    // Small values: sums and products of up to 5 ranks stay exact in every dtype (even f16).
    ((i * 7 + r * 3 + round) % 5) as i64 - 2
}

trait FromI64: Reducible + PartialEq + std::fmt::Debug {
    fn from_i64(v: i64) -> Self;
}
impl FromI64 for f32 {
    fn from_i64(v: i64) -> Self {
        v as f32
    }
}
impl FromI64 for f64 {
    fn from_i64(v: i64) -> Self {
        v as f64
    }
}
impl FromI64 for i32 {
    fn from_i64(v: i64) -> Self {
        v as i32
    }
}
impl FromI64 for i64 {
    fn from_i64(v: i64) -> Self {
        v
    }
}
impl FromI64 for half::f16 {
    fn from_i64(v: i64) -> Self {
        half::f16::from_f32(v as f32)
    }
}
impl FromI64 for half::bf16 {
    fn from_i64(v: i64) -> Self {
        half::bf16::from_f32(v as f32)
    }
}

fn check<T: FromI64>(
    n: usize,
    count: usize,
    op: ReduceOp,
    algo: Algorithm,
    cap: usize,
) -> Result<(), String> {
    let comms = local::comms_with_timeout(n, Duration::from_secs(20)).map_err(|e| e.to_string())?;
    let results: Vec<Result<(), String>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|c| {
                s.spawn(move || -> Result<(), String> {
                    let me = c.rank();
                    let co = Collectives::new(&c, cap).map_err(|e| e.to_string())?;
                    for round in 0..3 {
                        let input = |r: usize| -> Vec<T> { (0..count).map(|i| T::from_i64(value(r, i, round))).collect() };
                        // Reference: combine in rank order.
                        let mut want = input(0);
                        for r in 1..n {
                            for (w, v) in want.iter_mut().zip(input(r)) {
                                *w = T::combine(*w, v, op);
                            }
                        }
                        let mut data = input(me);
                        co.allreduce_with(&mut data, op, algo).map_err(|e| e.to_string())?;
                        if data != want {
                            return Err(format!("allreduce {op:?} {algo:?} round {round}: rank {me} got {data:?}, want {want:?}"));
                        }
                        let share = co.reduce_scatter(&input(me), op).map_err(|e| e.to_string())?;
                        let range = pto_core::block_range(count, me as u32, n as u32);
                        if share[..] != want[range.clone()] {
                            return Err(format!("reduce_scatter round {round}: rank {me} got {share:?}"));
                        }
                        let mut all = vec![T::from_i64(0); n * count];
                        co.allgather(&input(me), &mut all).map_err(|e| e.to_string())?;
                        let gathered: Vec<T> = (0..n).flat_map(input).collect();
                        if all != gathered {
                            return Err(format!("allgather round {round}: rank {me}"));
                        }
                        let root = round % n;
                        let mut b = if me == root { input(me) } else { vec![T::from_i64(9); count] };
                        co.broadcast(&mut b, root).map_err(|e| e.to_string())?;
                        if b != input(root) {
                            return Err(format!("broadcast from {root} round {round}: rank {me}"));
                        }
                        // all_to_all: block j of rank r holds value(r, j*count + i).
                        let send: Vec<T> = (0..n * count).map(|i| T::from_i64(value(me, i, round))).collect();
                        let mut recv = vec![T::from_i64(0); n * count];
                        co.all_to_all(&send, &mut recv).map_err(|e| e.to_string())?;
                        let want_a2a: Vec<T> = (0..n)
                            .flat_map(|j| (0..count).map(move |i| T::from_i64(value(j, me * count + i, round))))
                            .collect();
                        if recv != want_a2a {
                            return Err(format!("all_to_all round {round}: rank {me}"));
                        }
                    }
                    co.barrier().map_err(|e| e.to_string())
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("rank panicked".into())))
            .collect()
    });
    results.into_iter().collect()
}

fn arb_op() -> impl Strategy<Value = ReduceOp> {
    prop::sample::select(vec![
        ReduceOp::Sum,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Prod,
    ])
}

fn arb_algo() -> impl Strategy<Value = Algorithm> {
    prop::sample::select(vec![
        Algorithm::Auto,
        Algorithm::Mesh,
        Algorithm::TwoPhase,
        Algorithm::Ring,
        Algorithm::SingleCopy,
        Algorithm::Tree,
    ])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn collectives_match_the_reference(
        n in 1usize..=5,
        count in 0usize..300,
        dtype in 0usize..6,
        op in arb_op(),
        algo in arb_algo(),
        cap in prop::sample::select(vec![64usize, 200, 4096]),
    ) {
        let r = match dtype {
            0 => check::<f32>(n, count, op, algo, cap),
            1 => check::<f64>(n, count, op, algo, cap),
            2 => check::<i32>(n, count, op, algo, cap),
            3 => check::<i64>(n, count, op, algo, cap),
            4 => check::<half::f16>(n, count, op, algo, cap),
            _ => check::<half::bf16>(n, count, op, algo, cap),
        };
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }
}

#[test]
fn many_calls_reuse_one_window() {
    // 2000 allreduces on 3 ranks through one window: epochs keep the signals valid.
    check::<i64>(3, 17, ReduceOp::Sum, Algorithm::Mesh, 4096).unwrap();
    let comms = local::comms(3).unwrap();
    std::thread::scope(|s| {
        for c in comms {
            s.spawn(move || {
                let co = Collectives::new(&c, 1024).unwrap();
                for round in 0..2000i64 {
                    let mut v = vec![round + c.rank() as i64; 5];
                    co.allreduce(&mut v, ReduceOp::Sum).unwrap();
                    assert_eq!(v, vec![3 * round + 3; 5]);
                }
            });
        }
    });
}

#[test]
fn allreduce_in_a_window_needs_no_staging() {
    for n in 1..=4usize {
        for count in [0usize, 1, 5, 1000, 4099] {
            let comms = local::comms(n).unwrap();
            std::thread::scope(|s| {
                for c in comms {
                    s.spawn(move || {
                        let me = c.rank();
                        let co = Collectives::new(&c, 256).unwrap();
                        let w = c
                            .alloc_window(&pto_comm::WindowSpec::new(64 + 4 * count.max(1)))
                            .unwrap();
                        for round in 0..3usize {
                            let v: Vec<f32> =
                                (0..count).map(|i| (i + 100 * me + round) as f32).collect();
                            w.put_slice(me, 64, &v).unwrap();
                            co.allreduce_window::<f32>(&w, 64, count, ReduceOp::Sum)
                                .unwrap();
                            let got = w.get_vec::<f32>(me, 64, count).unwrap();
                            let want: Vec<f32> = (0..count)
                                .map(|i| (n * (i + round) + 100 * n * (n - 1) / 2) as f32)
                                .collect();
                            assert_eq!(got, want, "n {n} count {count} round {round} rank {me}");
                            // Nobody rewrites its input before every rank has read its result.
                            co.barrier().unwrap();
                        }
                        // Bad ranges are errors.
                        assert!(co.allreduce_window::<f32>(&w, 3, 1, ReduceOp::Sum).is_err());
                    });
                }
            });
        }
    }
}

#[test]
fn ranks_that_pass_different_lengths_or_ops_to_an_allreduce_all_get_an_error_naming_a_peer() {
    for case in 0..2 {
        let results = pto_comm::local::run(3, |c| {
            let co = pto_comm::Collectives::new(&c, 1 << 12)?;
            let mut v = vec![1.0f32; if case == 0 { 4 + c.rank() } else { 4 }];
            let op = if case == 1 && c.rank() == 2 {
                pto_comm::ReduceOp::Max
            } else {
                pto_comm::ReduceOp::Sum
            };
            co.allreduce(&mut v, op)
        })
        .unwrap();
        for (r, res) in results.into_iter().enumerate() {
            let e = res.unwrap().unwrap_err().to_string();
            let want = if case == 0 {
                "rank 0: 16 bytes of f32, op sum; rank 1: 20 bytes of f32, op sum; rank 2: 24 bytes"
            } else {
                "rank 1: 16 bytes of f32, op sum; rank 2: 16 bytes of f32, op max"
            };
            assert!(
                e.contains("allreduce: the ranks passed different arguments") && e.contains(want),
                "rank {r}: {e}"
            );
        }
    }
}

#[test]
fn ranks_that_run_different_allreduce_algorithms_fail_alike_naming_them() {
    let results = pto_comm::local::run(2, |c| {
        let co = pto_comm::Collectives::new(&c, 1 << 12)?;
        let mut v = vec![1.0f32; 8];
        let algo = if c.rank() == 0 {
            Algorithm::Mesh
        } else {
            Algorithm::SingleCopy
        };
        co.allreduce_with(&mut v, ReduceOp::Sum, algo)
    })
    .unwrap();
    for (r, res) in results.into_iter().enumerate() {
        let e = res.unwrap().unwrap_err().to_string();
        assert!(
            e.contains("rank 0: 32 bytes of f32, op sum, mesh")
                && e.contains("rank 1: 32 bytes of f32, op sum, single-copy"),
            "rank {r}: {e}"
        );
    }
}

#[test]
fn a_large_allreduce_reads_peers_buffers_directly_and_matches_the_mesh() {
    // Above SINGLE_COPY_MIN_BYTES, with an odd count: Auto picks single-copy on threads, and its
    // result is bit-identical to the mesh's (both combine in rank order).
    let count = pto_comm::SINGLE_COPY_MIN_BYTES / 4 + 13;
    let results = pto_comm::local::run(3, move |c| {
        let co = pto_comm::Collectives::new(&c, 1 << 14)?;
        assert_eq!(co.allreduce_algorithm::<f32>(count * 4), "single-copy");
        let input: Vec<f32> = (0..count)
            .map(|i| ((i * 7 + c.rank() * 13) % 101) as f32 * 0.37)
            .collect();
        let mut a = input.clone();
        co.allreduce(&mut a, ReduceOp::Sum)?;
        let mut b = input;
        co.allreduce_with(&mut b, ReduceOp::Sum, Algorithm::Mesh)?;
        Ok::<_, pto_comm::CommError>((a, b))
    })
    .unwrap();
    let first = results[0].as_ref().unwrap().as_ref().unwrap().0.clone();
    for res in results {
        let (a, b) = res.unwrap().unwrap();
        assert!(a == b && a == first);
    }
}

#[test]
fn above_sixteen_ranks_allreduces_and_barriers_go_through_the_tree() {
    // 40 ranks (three levels with fan-out 16): every rank gets the same, exact sums, on
    // repeated calls (epochs) and odd counts, and the collectives' barrier passes.
    let n = 40;
    let results = pto_comm::local::run(n, |c| {
        let co = pto_comm::Collectives::new(&c, 1 << 10)?;
        assert_eq!(co.allreduce_algorithm::<i64>(8), "tree");
        for round in 0..20i64 {
            let mut v: Vec<i64> = (0..301)
                .map(|i| i * (c.rank() as i64 + 1) + round)
                .collect();
            co.allreduce(&mut v, ReduceOp::Sum)?;
            let k = (n * (n + 1) / 2) as i64;
            let want: Vec<i64> = (0..301).map(|i| i * k + round * n as i64).collect();
            assert_eq!(v, want, "round {round}");
            co.barrier()?;
        }
        let mut m = vec![c.rank() as f32; 3];
        co.allreduce(&mut m, ReduceOp::Max)?;
        assert_eq!(m, vec![(n - 1) as f32; 3]);
        Ok::<_, pto_comm::CommError>(())
    })
    .unwrap();
    for r in results {
        r.unwrap().unwrap();
    }
}

#[test]
fn above_sixteen_ranks_different_arguments_fail_every_rank_naming_two() {
    let results = pto_comm::local::run(20, |c| {
        let co = pto_comm::Collectives::new(&c, 1 << 10)?;
        let mut v = vec![1.0f32; if c.rank() == 17 { 5 } else { 4 }];
        co.allreduce(&mut v, ReduceOp::Sum)
    })
    .unwrap();
    for (r, res) in results.into_iter().enumerate() {
        let e = res.unwrap().unwrap_err().to_string();
        assert!(
            e.contains("the ranks passed different arguments")
                && e.contains("rank 17: 20 bytes of f32")
                && e.contains("rank 1: 16 bytes of f32"),
            "rank {r}: {e}"
        );
    }
}
