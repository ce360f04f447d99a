//! Joining points (barriers and collectives) as the checker sees them.

use std::sync::Arc;

use super::{active, stalled, Checker, QUIET};

/// A joining point of a communicator's members (a barrier or a collective), for the checker:
/// entered when made, left when dropped. Inside a collective (`quiet`) the runtime's own
/// accesses are not recorded.
pub(crate) struct Join(Option<(Arc<Checker>, usize, String, u64, bool)>);

impl Join {
    /// A barrier (of a window or a communicator) named by `name`.
    pub(crate) fn enter(comm: &crate::comm::Comm, name: &str, what: &str) -> Join {
        Join::make(comm, name, what, false)
    }

    /// A collective of `comm`: one joining point, its internals not recorded.
    pub(crate) fn collective(comm: &crate::comm::Comm, what: &str) -> Join {
        Join::make(comm, &comm.inner.key, what, true)
    }

    fn make(comm: &crate::comm::Comm, name: &str, what: &str, quiet: bool) -> Join {
        let Some(c) = active() else {
            return Join(None);
        };
        let rank = comm.world_rank();
        let key = format!("{what} of {name}");
        let members: Vec<usize> = (0..comm.size())
            .map(|i| comm.world_rank_of(i).unwrap_or(i))
            .collect();
        let seq = c.enter(rank, &key, &members, comm.rank());
        if quiet {
            QUIET.with(|q| *q.borrow_mut() += 1);
        }
        Join(Some((c, rank, key, seq, quiet)))
    }
}

impl Join {
    /// Runs the joining point's body `f` and leaves it; a stall in it (see [`Join::failed`])
    /// takes the wait-for graph first, while this rank still shows as inside.
    pub(crate) fn run<R>(
        self,
        f: impl FnOnce() -> Result<R, crate::error::CommError>,
    ) -> Result<R, crate::error::CommError> {
        f().inspect_err(|e| self.failed(e))
    }

    /// The joining point failed with `e`: a deadline, or a member that left or died, takes
    /// the wait-for graph.
    pub(crate) fn failed(&self, e: &crate::error::CommError) {
        if let Some((c, ..)) = &self.0 {
            if stalled(e) {
                c.snapshot();
            }
        }
    }
}

impl Drop for Join {
    fn drop(&mut self) {
        if let Some((c, rank, key, seq, quiet)) = self.0.take() {
            if quiet {
                QUIET.with(|q| *q.borrow_mut() -= 1);
            }
            c.leave(rank, &key, seq);
        }
    }
}
