//! The exact test: do two regions of one buffer share a byte?
//!
//! [`super::overlap`] is conservative (layouts it cannot compare count as overlapping), which is
//! right for the dependency engine: an extra edge costs time, never correctness. But the engine
//! also drops an entry from its TensorMap when a later write covers it, relying on "whatever
//! really touches the covered bytes touches the covering write". A conservative answer breaks
//! that chain: a reader can be told "maybe overlapping" about the covered task and "disjoint"
//! (exactly) about the covering one, so the engine lets it run beside the covered task while a
//! conservative borrow table would call it a race. The borrow table, and the check that a task's
//! own arguments do not collide, therefore ask this exact question instead.

use smallvec::SmallVec;

use super::{overlap, Overlap, Region};

/// Layouts with more runs than this are not enumerated: the answer is then "overlapping".
const ENUMERATION_LIMIT: usize = 1 << 20;

/// A region as runs of contiguous bytes: `base + Σ i_k · stride_k` for `i_k < count_k`, each run
/// `run` bytes long. Dimensions are sorted by stride, largest first; dimensions of size one are
/// dropped and contiguous innermost ones merged into the run.
struct Runs {
    base: usize,
    dims: SmallVec<[(usize, usize); 5]>,
    run: usize,
}

impl Runs {
    fn of(r: &Region) -> Runs {
        let sz = r.dtype.size();
        let mut dims: SmallVec<[(usize, usize); 5]> = r
            .dims()
            .filter(|&(n, _)| n > 1)
            .map(|(n, s)| (n, s * sz))
            .collect();
        dims.sort_by_key(|d| std::cmp::Reverse(d.1));
        let mut run = sz;
        while let Some(&(n, s)) = dims.last() {
            if s != run {
                break;
            }
            run *= n;
            dims.pop();
        }
        Runs {
            base: r.offset * sz,
            dims,
            run,
        }
    }

    fn count(&self) -> usize {
        self.dims
            .iter()
            .try_fold(1usize, |a, d| a.checked_mul(d.0))
            .unwrap_or(usize::MAX)
    }

    /// True when runs are ordered by their index and never overlap: every dimension's whole
    /// tail (the inner dimensions plus one run) fits inside its stride.
    fn nested(&self) -> bool {
        let mut tail = self.run;
        for &(n, s) in self.dims.iter().rev() {
            if tail > s {
                return false;
            }
            tail += (n - 1) * s;
        }
        true
    }

    /// Every run's start, in no particular order.
    fn starts(&self, mut f: impl FnMut(usize) -> bool) -> bool {
        let mut idx: SmallVec<[usize; 5]> = SmallVec::from_elem(0, self.dims.len());
        loop {
            let at = self.base
                + idx
                    .iter()
                    .zip(&self.dims)
                    .map(|(i, d)| i * d.1)
                    .sum::<usize>();
            if f(at) {
                return true;
            }
            let mut k = self.dims.len();
            loop {
                if k == 0 {
                    return false;
                }
                k -= 1;
                idx[k] += 1;
                if idx[k] < self.dims[k].0 {
                    break;
                }
                idx[k] = 0;
            }
        }
    }

    /// The smallest offset `v = Σ i_k · stride_k` (dimensions `from..`) with `v >= want`, for a
    /// nested layout.
    fn successor(&self, from: usize, want: isize) -> Option<usize> {
        let Some(&(n, s)) = self.dims.get(from) else {
            return (want <= 0).then_some(0);
        };
        let d = if want <= 0 { 0 } else { want as usize / s };
        if d >= n {
            return None;
        }
        if let Some(v) = self.successor(from + 1, want - (d * s) as isize) {
            return Some(d * s + v);
        }
        // Every offset with digit `d` here is too small; the next digit with zeros below is the
        // smallest larger one.
        (d + 1 < n).then_some((d + 1) * s)
    }

    /// True when some run has a byte in `[lo, hi)` (needs a nested layout).
    fn touches(&self, lo: usize, hi: usize) -> bool {
        // A run starting at `p` touches `[lo, hi)` when `p + run > lo` and `p < hi`.
        let want = lo as isize - self.base as isize - self.run as isize + 1;
        self.successor(0, want).is_some_and(|v| self.base + v < hi)
    }
}

/// True when `a` and `b` share at least one byte. Exact for every layout whose runs can be
/// enumerated within a fixed budget (about a million runs); beyond it, "true".
pub fn intersects(a: &Region, b: &Region) -> bool {
    match overlap(a, b) {
        Overlap::Disjoint => return false,
        // Covers is exact, and both regions have elements (empty ones are disjoint).
        Overlap::Covers => return true,
        Overlap::Partial => {}
    }
    if (a.is_contiguous() && b.is_contiguous()) || overlap(b, a) == Overlap::Covers {
        return true;
    }
    let (ra, rb) = (Runs::of(a), Runs::of(b));
    // Enumerate the region with fewer runs; query the other when it is nested.
    let (few, many) = if ra.count() <= rb.count() {
        (ra, rb)
    } else {
        (rb, ra)
    };
    let (walk, query) = if many.nested() {
        (few, many)
    } else if few.nested() {
        (many, few)
    } else {
        return brute(&few, &many);
    };
    if walk.count() > ENUMERATION_LIMIT {
        return true;
    }
    let len = walk.run;
    walk.starts(|p| query.touches(p, p + len))
}

/// Neither layout is nested: compare their sorted runs.
fn brute(a: &Runs, b: &Runs) -> bool {
    if a.count().saturating_add(b.count()) > ENUMERATION_LIMIT {
        return true;
    }
    let spans = |r: &Runs| {
        let mut v = Vec::with_capacity(r.count());
        r.starts(|p| {
            v.push(p);
            false
        });
        v.sort_unstable();
        v
    };
    let (sa, sb) = (spans(a), spans(b));
    let (mut i, mut j) = (0, 0);
    while i < sa.len() && j < sb.len() {
        let (a0, b0) = (sa[i], sb[j]);
        if a0 < b0 + b.run && b0 < a0 + a.run {
            return true;
        }
        if a0 + a.run <= b0 + b.run {
            i += 1;
        } else {
            j += 1;
        }
    }
    false
}
