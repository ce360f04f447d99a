//! Joining points (barriers and collectives) as the checker sees them.

use std::sync::Arc;

use super::{active, stalled, Checker, QUIET};

/// A joining point of a communicator's members (a barrier or a collective), for the checker:
/// entered when made, left when dropped. Inside a collective (`quiet`) the runtime's own
/// accesses are not recorded.
pub(crate) struct Join(Option<(Arc<Checker>, usize, String, u64, bool)>);

impl Join {
    /// A joining point `what` (`barrier`, `allreduce`...) of `name`, entered by world rank
    /// `rank` (rank `local` of the communicator whose members are the world ranks `members`).
    /// `quiet`: a collective, whose internals are not recorded. Made by
    /// `Comm::join_point` and `Comm::collective_join`.
    pub(crate) fn make(
        rank: usize,
        local: usize,
        members: impl FnOnce() -> Vec<usize>,
        name: &str,
        what: &str,
        quiet: bool,
    ) -> Join {
        let Some(c) = active() else {
            return Join(None);
        };
        let key = format!("{what} of {name}");
        let seq = c.enter(rank, &key, &members(), local);
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
