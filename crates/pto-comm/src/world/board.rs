//! The wait board: what each rank waits on now, and the wait-for graph a deadline reports.

use std::sync::atomic::Ordering;

use super::{
    off_waits, Waiting, World, DIED, EXITED, FAILED, NOT_JOINED, WAIT_BARRIER, WAIT_NONE,
    WAIT_SIGNAL, WAIT_SLOT,
};

impl World {
    /// Posts (or with `None` clears) what `rank` waits on, for the wait-for graph.
    pub(crate) fn post_wait(&self, rank: usize, w: Option<Waiting>) {
        if rank >= self.size {
            return;
        }
        let off = off_waits(self.size) + rank * WAIT_SLOT;
        let kind = self.seg.atomic_u32(off);
        let Some(w) = w else {
            kind.store(WAIT_NONE, Ordering::Release);
            return;
        };
        let (k, value, window, offset) = match w {
            Waiting::Signal {
                window,
                offset,
                value,
            } => (WAIT_SIGNAL, value, window, offset),
            Waiting::Barrier { members } => (WAIT_BARRIER, members, 0, 0),
        };
        let since = pto_shm::process::monotonic_coarse_ms();
        self.seg.atomic_u32(off + 4).store(value, Ordering::Relaxed);
        self.seg
            .atomic_u64(off + 8)
            .store(window, Ordering::Relaxed);
        self.seg
            .atomic_u64(off + 16)
            .store(offset, Ordering::Relaxed);
        self.seg
            .atomic_u64(off + 24)
            .store(since, Ordering::Relaxed);
        kind.store(k, Ordering::Release);
    }

    /// What `rank` waits on now, and since when (milliseconds on the monotonic clock).
    pub(crate) fn waiting(&self, rank: usize) -> Option<(Waiting, u64)> {
        if rank >= self.size {
            return None;
        }
        let off = off_waits(self.size) + rank * WAIT_SLOT;
        let k = self.seg.atomic_u32(off).load(Ordering::Acquire);
        let value = self.seg.atomic_u32(off + 4).load(Ordering::Relaxed);
        let window = self.seg.atomic_u64(off + 8).load(Ordering::Relaxed);
        let offset = self.seg.atomic_u64(off + 16).load(Ordering::Relaxed);
        let since = self.seg.atomic_u64(off + 24).load(Ordering::Relaxed);
        let w = match k {
            WAIT_SIGNAL => Waiting::Signal {
                window,
                offset,
                value,
            },
            WAIT_BARRIER => Waiting::Barrier { members: value },
            _ => return None,
        };
        Some((w, since))
    }

    /// The wait-for graph across the world's ranks, in words: what each rank waits on (or
    /// that it runs, left or failed), and whether every live rank is waiting (a deadlock).
    /// Ranks in the same state are named together (`ranks 2-9, 12 wait in a barrier of 16
    /// ranks (since 3-20 ms)`), so that the graph of a thousand ranks stays a few lines.
    pub(crate) fn wait_for_graph(&self) -> String {
        let now = pto_shm::process::monotonic_coarse_ms();
        // (state in words, the ranks in it, the youngest and oldest wait in ms)
        type Group = (String, Vec<usize>, Option<(u64, u64)>);
        let mut groups: Vec<Group> = Vec::new();
        let mut live = 0;
        let mut waiting = 0;
        for r in 0..self.size {
            let state = self.slot(r).1.load(Ordering::Acquire);
            let mut age = None;
            let text = match (state, self.waiting(r)) {
                (EXITED, _) => "has left".to_string(),
                (FAILED, _) => "failed".to_string(),
                (DIED, _) => "died".to_string(),
                (NOT_JOINED, _) => "never joined".to_string(),
                (_, Some((w, since))) => {
                    live += 1;
                    waiting += 1;
                    age = Some(now.saturating_sub(since));
                    match w {
                        Waiting::Signal {
                            window,
                            offset,
                            value,
                        } => format!(
                            "waits on its signal at offset {offset} of window #{window} for >= {value}"
                        ),
                        Waiting::Barrier { members } => {
                            format!("waits in a barrier of {members} ranks")
                        }
                    }
                }
                (_, None) => {
                    live += 1;
                    "is running (not in a wait)".to_string()
                }
            };
            match groups.iter_mut().find(|g| g.0 == text) {
                Some(g) => {
                    g.1.push(r);
                    if let (Some(a), Some((lo, hi))) = (age, &mut g.2) {
                        *lo = (*lo).min(a);
                        *hi = (*hi).max(a);
                    }
                }
                None => groups.push((text, vec![r], age.map(|a| (a, a)))),
            }
        }
        let parts: Vec<String> = groups
            .into_iter()
            .map(|(text, ranks, age)| {
                let age = match age {
                    Some((lo, hi)) if lo == hi => format!(" ({lo} ms)"),
                    Some((lo, hi)) => format!(" ({lo}-{hi} ms)"),
                    None => String::new(),
                };
                match ranks.as_slice() {
                    [r] => format!("rank {r} {text}{age}"),
                    _ => format!("ranks {}: {text}{age}", rank_ranges(&ranks)),
                }
            })
            .collect();
        let verdict = if live > 0 && waiting == live {
            "; every live rank is waiting: a deadlock (or a notify nobody makes)"
        } else {
            ""
        };
        format!("wait-for graph: {}{verdict}", parts.join("; "))
    }
}

/// `[0, 1, 2, 5, 7, 8]` as `0-2, 5, 7-8`.
fn rank_ranges(ranks: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            ranks[i].to_string()
        } else {
            format!("{}-{}", ranks[i], ranks[j])
        });
        i = j + 1;
    }
    out.join(", ")
}

#[cfg(test)]
mod rank_range_tests {
    #[test]
    fn consecutive_ranks_are_written_as_ranges() {
        assert_eq!(super::rank_ranges(&[0, 1, 2, 5, 7, 8]), "0-2, 5, 7-8");
        assert_eq!(super::rank_ranges(&[3]), "3");
        assert_eq!(super::rank_ranges(&[]), "");
    }
}
