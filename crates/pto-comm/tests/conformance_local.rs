//! The conformance suite on the `local` backend (ranks are threads).

use std::time::Duration;

use pto_comm::conformance::CASES;
use pto_comm::local;

#[test]
fn every_case_on_threads() {
    for case in CASES {
        for &n in case.ranks {
            let comms = local::comms_with_timeout(n, Duration::from_secs(20)).unwrap();
            let results: Vec<Result<(), String>> = std::thread::scope(|s| {
                let hs: Vec<_> = comms
                    .into_iter()
                    .map(|c| s.spawn(move || (case.run)(&c)))
                    .collect();
                hs.into_iter()
                    .map(|h| h.join().unwrap_or_else(|_| Err("rank panicked".into())))
                    .collect()
            });
            for (rank, r) in results.into_iter().enumerate() {
                if let Err(msg) = r {
                    panic!("case {} with {n} ranks, rank {rank}: {msg}", case.name);
                }
            }
        }
    }
}
