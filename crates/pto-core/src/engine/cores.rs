//! Logical core occupancy without a lock: a bitmap of free cores per kind.
//!
//! Cluster `c` is AIC core `c` with AIV cores `2c` and `2c + 1`; a MIX task takes a whole
//! cluster. Claims are compare-and-swaps on the bitmap words; a MIX claim takes the AIC bit
//! first and gives it back if an AIV bit of the cluster is taken.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::kernel::{CoreId, CoreKind};

#[derive(Debug)]
pub(crate) struct Cores {
    aic: Box<[AtomicU64]>,
    aiv: Box<[AtomicU64]>,
    n_aic: u32,
    n_aiv: u32,
}

fn bitmap(n: u32) -> Box<[AtomicU64]> {
    (0..(n as usize).div_ceil(64))
        .map(|w| {
            let bits = (n as usize - w * 64).min(64);
            AtomicU64::new(if bits == 64 {
                u64::MAX
            } else {
                (1u64 << bits) - 1
            })
        })
        .collect()
}

/// Claims one set bit of `words`.
fn claim_any(words: &[AtomicU64]) -> Option<u32> {
    for (w, word) in words.iter().enumerate() {
        let mut v = word.load(Ordering::Relaxed);
        while v != 0 {
            let bit = v.trailing_zeros();
            match word.compare_exchange_weak(
                v,
                v & !(1 << bit),
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(w as u32 * 64 + bit),
                Err(now) => v = now,
            }
        }
    }
    None
}

/// Claims bit `i` of `words` if it is set.
fn claim_bit(words: &[AtomicU64], i: u32) -> bool {
    let word = &words[i as usize / 64];
    let mask = 1u64 << (i % 64);
    word.fetch_and(!mask, Ordering::Acquire) & mask != 0
}

fn release_bit(words: &[AtomicU64], i: u32) {
    words[i as usize / 64].fetch_or(1 << (i % 64), Ordering::Release);
}

impl Cores {
    pub(crate) fn new(aic: u32, aiv: u32) -> Cores {
        Cores {
            aic: bitmap(aic),
            aiv: bitmap(aiv),
            n_aic: aic,
            n_aiv: aiv,
        }
    }

    /// How many logical cores of this kind the chip has (clusters for MIX).
    pub(crate) fn count(&self, kind: CoreKind) -> u32 {
        match kind {
            CoreKind::Aic | CoreKind::Mix => self.n_aic,
            CoreKind::Aiv => self.n_aiv,
        }
    }

    /// True when the chip has a core of this kind at all.
    pub(crate) fn has(&self, kind: CoreKind) -> bool {
        match kind {
            CoreKind::Aic | CoreKind::Mix => self.n_aic > 0,
            CoreKind::Aiv => self.n_aiv > 0,
        }
    }

    /// Claims a free core (a cluster for MIX).
    pub(crate) fn claim(&self, kind: CoreKind) -> Option<CoreId> {
        match kind {
            CoreKind::Aic => claim_any(&self.aic).map(|index| CoreId { kind, index }),
            CoreKind::Aiv => claim_any(&self.aiv).map(|index| CoreId { kind, index }),
            CoreKind::Mix => {
                for c in 0..self.n_aic {
                    if !claim_bit(&self.aic, c) {
                        continue;
                    }
                    let vs: Vec<u32> = (2 * c..2 * c + 2).filter(|&v| v < self.n_aiv).collect();
                    let mut got = Vec::with_capacity(2);
                    for &v in &vs {
                        if claim_bit(&self.aiv, v) {
                            got.push(v);
                        }
                    }
                    if got.len() == vs.len() {
                        return Some(CoreId { kind, index: c });
                    }
                    for v in got {
                        release_bit(&self.aiv, v);
                    }
                    release_bit(&self.aic, c);
                }
                None
            }
        }
    }

    pub(crate) fn release(&self, core: CoreId) {
        match core.kind {
            CoreKind::Aic => release_bit(&self.aic, core.index),
            CoreKind::Aiv => release_bit(&self.aiv, core.index),
            CoreKind::Mix => {
                for v in 2 * core.index..2 * core.index + 2 {
                    if v < self.n_aiv {
                        release_bit(&self.aiv, v);
                    }
                }
                release_bit(&self.aic, core.index);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_respect_counts_and_clusters() {
        let c = Cores::new(2, 3);
        let a0 = c.claim(CoreKind::Aic).unwrap();
        let a1 = c.claim(CoreKind::Aic).unwrap();
        assert!(c.claim(CoreKind::Aic).is_none());
        c.release(a0);
        // Cluster 0: AIC 0, AIV 0 and 1.
        let m = c.claim(CoreKind::Mix).unwrap();
        assert_eq!(m.index, 0);
        let v = c.claim(CoreKind::Aiv).unwrap();
        assert_eq!(v.index, 2);
        assert!(c.claim(CoreKind::Aiv).is_none());
        c.release(m);
        c.release(a1);
        // Cluster 1 has AIV 2 (taken) and 3 (missing): MIX fits cluster 0 only.
        assert_eq!(c.claim(CoreKind::Mix).unwrap().index, 0);
        assert!(c.claim(CoreKind::Mix).is_none());
        c.release(v);
        assert_eq!(c.claim(CoreKind::Mix).unwrap().index, 1);
        let big = Cores::new(0, 130);
        let all: Vec<_> = (0..130)
            .map(|_| big.claim(CoreKind::Aiv).unwrap().index)
            .collect();
        assert_eq!(all.len(), 130);
        assert!(big.claim(CoreKind::Aiv).is_none());
    }
}
