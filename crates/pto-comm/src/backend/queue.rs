//! A completion queue in a shared-memory segment, so that other processes (peers, backends,
//! a host) can post completions of a chip's deferred tasks by token.

#![allow(unsafe_code)]

use std::time::Instant;

use pto_core::{CompletionQueue, QueueHost};
use pto_shm::{segment_kind, HeaderInit, Segment, HEADER_LEN};

use crate::error::CommError;

/// Where the queue starts in its segment (after the header, 64-aligned).
const OFFSET: usize = HEADER_LEN;

/// A [`CompletionQueue`] in a named segment. The creator owns the name; others open it by name.
#[derive(Debug)]
pub struct SharedQueue {
    seg: Segment,
}

impl SharedQueue {
    /// Creates a queue of `capacity` entries (rounded up to a power of two, at least 2).
    ///
    /// # Errors
    ///
    /// An OS error or no space in `/dev/shm`.
    pub fn create(capacity: usize) -> Result<SharedQueue, CommError> {
        let cap = capacity.max(2).next_power_of_two();
        let name = Segment::fresh_name("cq");
        let seg = Segment::create(
            &name,
            OFFSET + CompletionQueue::bytes(cap),
            HeaderInit {
                kind: segment_kind::MAILBOX,
                per_rank: cap as u64,
                ..HeaderInit::default()
            },
        )?;
        // SAFETY: the segment was just created with room for the queue after the header, the
        // offset is 64-aligned within a page-aligned mapping, and no one else maps it yet
        // (joiners wait for the header's ready flag, which `create` already set, but they only
        // touch the queue through `attach`, which validates the capacity written here).
        unsafe { CompletionQueue::init(seg.as_ptr().add(OFFSET), cap) };
        Ok(SharedQueue { seg })
    }

    /// Opens a queue another process created.
    ///
    /// # Errors
    ///
    /// A missing, stale or foreign segment, or one whose queue header is invalid.
    pub fn open(name: &str, deadline: Instant) -> Result<SharedQueue, CommError> {
        let seg = Segment::open(name, deadline)?;
        if seg.header().kind != segment_kind::MAILBOX {
            return Err(CommError::Mismatch {
                what: "segment kind (completion queue)",
                theirs: u64::from(seg.header().kind),
                source_desc: name.to_string(),
                ours: u64::from(segment_kind::MAILBOX),
            });
        }
        // SAFETY: the queue lies after the header inside the mapping; `attach` validates its
        // capacity against the bytes available.
        let ok = unsafe { CompletionQueue::attach(seg.as_ptr().add(OFFSET), seg.len() - OFFSET) };
        if ok.is_none() {
            return Err(CommError::Mismatch {
                what: "completion queue capacity",
                theirs: 0,
                source_desc: name.to_string(),
                ours: seg.header().per_rank,
            });
        }
        Ok(SharedQueue { seg })
    }

    /// The segment's name (to hand to other processes).
    pub fn name(&self) -> &str {
        self.seg.name()
    }
}

impl QueueHost for SharedQueue {
    fn queue(&self) -> &CompletionQueue {
        // SAFETY: initialised by `create` or validated by `open`; the mapping lives as long as
        // `self`.
        unsafe { &*self.seg.as_ptr().add(OFFSET).cast::<CompletionQueue>() }
    }
}
