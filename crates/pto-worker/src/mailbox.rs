//! Per-child mailboxes and bootstrap channels in shared memory.
//!
//! One segment holds every child's mailbox, created by the parent before it forks (one mapping
//! to copy per fork, not one per child: with 1,024 chips the forks copied a million mappings).
//! Each mailbox is a slot of [`SLOT`] bytes at `i × SLOT` (slot 0's first 256 bytes are the
//! segment's header, which the layout leaves free); offsets below are within a slot:
//!
//! | offset | what |
//! |---|---|
//! | 256 | `state`: IDLE 0, TASK 1 (parent published a frame), RUNNING 3 (child copied it out), DONE 2 (child published a result) |
//! | 260 | `shutdown`: sticky; 0 until the parent asks the child to leave, then 1 forever |
//! | 264 | `sleepers` (for the futex handshake) |
//! | 272 | frame length, 276 result length |
//! | 280 | frame identity `{run, task, generation}` written by the parent |
//! | 304 | result identity, echoed by the child |
//! | 1024 | bootstrap record: state (IDLE 0, SUCCESS 1, ERROR 2), code, rank, size, window bytes, buffer count, message length, buffer offsets (64), message (1024 bytes) |
//! | 4096 | frame bytes ([`FRAME_CAP`]) |
//! | 4096 + FRAME_CAP | result bytes ([`RESULT_CAP`]) |
//!
//! Writers fill the payload, then release-store the state word; readers acquire-load the state
//! word, then read the payload. Every length read from the segment is bounds-checked. See
//! `docs/design/worker.md`.

#![allow(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pto_shm::wait::{wait_until, wake, WaitError};
use pto_shm::{segment_kind, HeaderInit, Segment};

use crate::error::WorkerError;
use crate::frame::truncate;

/// Bytes for a frame.
pub const FRAME_CAP: usize = 64 << 10;
/// Bytes for a result (message and trace).
pub const RESULT_CAP: usize = 256 << 10;
const DATA: usize = 4096;
const BOOT: usize = 1024;
const BOOT_OFFSETS: usize = BOOT + 32;
const MAX_BUFFERS: usize = 64;
const BOOT_MSG: usize = 2048;
const BOOT_MSG_CAP: usize = 1024;

/// Bytes of the bootstrap record (offsets 1024 to 4096 of the mailbox).
pub const BOOT_RECORD: usize = DATA - BOOT;

/// Decodes a bootstrap record (the bytes from offset 1024 of a mailbox): `None` while its state
/// is IDLE, the facts on SUCCESS, the message on ERROR. Every count and length is checked, so
/// any bytes give a result or an error, never a panic.
///
/// # Errors
///
/// The record says ERROR (its message), or it is corrupt.
pub fn decode_boot(rec: &[u8]) -> Result<Option<BootFacts>, String> {
    let u32_at = |o: usize| -> Result<u32, String> {
        rec.get(o..o + 4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
            .ok_or_else(|| format!("bootstrap record too short for a word at {o}"))
    };
    let u64_at = |o: usize| -> Result<u64, String> {
        rec.get(o..o + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
            .ok_or_else(|| format!("bootstrap record too short for a word at {o}"))
    };
    match u32_at(0)? {
        0 => Ok(None),
        1 => {
            let n = u32_at(24)? as usize;
            if n > MAX_BUFFERS {
                return Err(format!("corrupt bootstrap record: {n} buffers"));
            }
            Ok(Some(BootFacts {
                rank: u32_at(8)?,
                size: u32_at(12)?,
                window_bytes: u64_at(16)?,
                buffer_offsets: (0..n)
                    .map(|i| u64_at(BOOT_OFFSETS - BOOT + 8 * i))
                    .collect::<Result<_, _>>()?,
            }))
        }
        2 => {
            let len = (u32_at(28)? as usize).min(BOOT_MSG_CAP);
            let start = BOOT_MSG - BOOT;
            let b = rec
                .get(start..start + len)
                .ok_or("bootstrap record too short for its message")?;
            Err(String::from_utf8_lossy(b).into_owned())
        }
        s => Err(format!("corrupt bootstrap record: state {s}")),
    }
}

const IDLE: u32 = 0;
const TASK: u32 = 1;
const DONE: u32 = 2;
/// The child copied the frame out and runs it (so the state says IDLE only once the parent
/// took the result, or before the first frame).
const RUNNING: u32 = 3;

/// The facts a chip reports when it is up.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BootFacts {
    /// Its rank.
    pub rank: u32,
    /// Number of ranks.
    pub size: u32,
    /// Window bytes per rank (0 without a window).
    pub window_bytes: u64,
    /// Offsets of the named buffers in the window.
    pub buffer_offsets: Vec<u64>,
}

/// Identity of a frame: which run, which host task, which send to this child.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ident {
    /// Worker run number.
    pub run: u64,
    /// Host task id.
    pub task: u64,
    /// Per-mailbox send counter.
    pub generation: u64,
}

/// Bytes of one mailbox (a multiple of the page size).
pub const SLOT: usize = DATA + FRAME_CAP + RESULT_CAP;

/// A child's mailbox: its slot of the Worker's mailbox segment.
#[derive(Debug)]
pub struct Mailbox {
    seg: Arc<Segment>,
    base: usize,
    /// True once this process reserved the slot's frame and result pages (the parent, before
    /// its first frame into the slot; see [`Mailbox::reserve`]).
    reserved: AtomicBool,
}

impl Mailbox {
    /// Creates one mailbox in a segment of its own (parent, before forking).
    ///
    /// # Errors
    ///
    /// An OS error or no space in `/dev/shm`.
    pub fn create(tag: &str) -> Result<Mailbox, WorkerError> {
        let mut v = Mailbox::create_set(tag, 1)?;
        v.pop()
            .ok_or_else(|| WorkerError::Args("no mailbox was made".into()))
    }

    /// Creates `n` mailboxes in one segment (parent, before forking). Only each slot's first
    /// page (the state words and the bootstrap record, which both sides touch from the start)
    /// is reserved now; its frame and result pages are reserved by [`Mailbox::reserve`] before
    /// the slot's first frame, so that lanes a run never uses cost no memory.
    ///
    /// # Errors
    ///
    /// An OS error or no space in `/dev/shm`.
    pub fn create_set(tag: &str, n: usize) -> Result<Vec<Mailbox>, WorkerError> {
        let name = Segment::fresh_name(tag);
        let len = SLOT
            .checked_mul(n.max(1))
            .ok_or_else(|| WorkerError::Args(format!("{n} mailboxes do not fit in memory")))?;
        let seg = Arc::new(Segment::create_reserving(
            &name,
            len,
            HeaderInit {
                kind: segment_kind::MAILBOX,
                nranks: n as u32,
                ..HeaderInit::default()
            },
            (0..n).map(|i| i * SLOT..i * SLOT + DATA),
        )?);
        Ok((0..n)
            .map(|i| Mailbox {
                seg: seg.clone(),
                base: i * SLOT,
                reserved: AtomicBool::new(false),
            })
            .collect())
    }

    /// The same slot, for the other side of an in-process child (a thread of this process,
    /// [`crate::WorkerBuilder::in_process`]), as a forked child has its own copy of the parent's.
    pub(crate) fn twin(&self) -> Mailbox {
        Mailbox {
            seg: self.seg.clone(),
            base: self.base,
            reserved: AtomicBool::new(false),
        }
    }

    /// Reserves the slot's frame and result pages (once; later calls return at once). The
    /// parent calls it before it writes the slot's first frame: the child writes a result only
    /// into a slot that carried a frame, so neither side then touches an unreserved page.
    ///
    /// # Errors
    ///
    /// No space left in `/dev/shm` for the slot, or an OS error.
    pub fn reserve(&self) -> Result<(), WorkerError> {
        if self.reserved.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.seg.reserve(self.base + DATA..self.base + SLOT)?;
        self.reserved.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// The segment's name.
    pub fn name(&self) -> &str {
        self.seg.name()
    }

    fn w32(&self, off: usize) -> &AtomicU32 {
        self.seg.atomic_u32(self.base + off)
    }

    fn w64(&self, off: usize) -> &AtomicU64 {
        self.seg.atomic_u64(self.base + off)
    }

    fn write_bytes(&self, off: usize, cap: usize, b: &[u8]) -> usize {
        let n = b.len().min(cap);
        // SAFETY: `off + cap` lies inside this mailbox's slot (layout above), which lies inside
        // the segment (`base + SLOT <= len`), and the protocol gives the
        // writer exclusive use of this area until it publishes the state word.
        unsafe {
            std::ptr::copy_nonoverlapping(b.as_ptr(), self.seg.as_ptr().add(self.base + off), n)
        };
        n
    }

    fn read_bytes(&self, off: usize, cap: usize, len: usize) -> Result<Vec<u8>, WorkerError> {
        let mut v = Vec::new();
        self.read_bytes_into(off, cap, len, &mut v)?;
        Ok(v)
    }

    /// Copies `len` bytes at `off` (in an area of `cap`) into `v`, replacing its contents.
    fn read_bytes_into(
        &self,
        off: usize,
        cap: usize,
        len: usize,
        v: &mut Vec<u8>,
    ) -> Result<(), WorkerError> {
        if len > cap {
            return Err(WorkerError::Corrupt(format!(
                "mailbox {} claims {len} bytes in an area of {cap}",
                self.name()
            )));
        }
        v.clear();
        v.reserve(len);
        // Not zeroed first: every byte is copied in below.
        // SAFETY: `off + len <= off + cap`, inside this mailbox's slot and so the segment; the
        // protocol gives the reader this area after it acquired the state word. `v` is empty
        // with room for `len` bytes, all of which the copy initialises before the length is
        // set.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.seg.as_ptr().add(self.base + off),
                v.as_mut_ptr(),
                len,
            );
            v.set_len(len);
        };
        Ok(())
    }

    // ---- parent side ----

    /// Checks that `frame` fits a mailbox (before it is queued to be sent later).
    ///
    /// # Errors
    ///
    /// A frame larger than [`FRAME_CAP`].
    pub fn fits(frame: &[u8]) -> Result<(), WorkerError> {
        if frame.len() > FRAME_CAP {
            return Err(WorkerError::Args(format!(
                "task frame of {} bytes exceeds the mailbox's {FRAME_CAP}",
                frame.len()
            )));
        }
        Ok(())
    }

    /// Publishes a frame to the child.
    ///
    /// # Errors
    ///
    /// A frame larger than [`FRAME_CAP`].
    pub fn send(&self, ident: Ident, frame: &[u8]) -> Result<(), WorkerError> {
        Self::fits(frame)?;
        self.write_bytes(DATA, FRAME_CAP, frame);
        self.w32(272).store(frame.len() as u32, Ordering::Relaxed);
        self.w64(280).store(ident.run, Ordering::Relaxed);
        self.w64(288).store(ident.task, Ordering::Relaxed);
        self.w64(296).store(ident.generation, Ordering::Relaxed);
        self.w32(256).store(TASK, Ordering::SeqCst);
        wake(self.w32(256), self.w32(264));
        Ok(())
    }

    /// True while a frame is published and not yet taken (child side).
    pub fn frame_ready(&self) -> bool {
        self.w32(256).load(Ordering::Acquire) == TASK
    }

    /// True once the child published a result (for a parent that polls several children).
    pub fn result_ready(&self) -> bool {
        self.w32(256).load(Ordering::Acquire) == DONE
    }

    /// Waits until the child publishes a result, the deadline passes, or `check` fails (it runs
    /// every few milliseconds while the wait is parked).
    ///
    /// # Errors
    ///
    /// The deadline ([`WaitError::Timeout`]) or the check's error.
    pub fn wait_ready<E>(
        &self,
        deadline: Instant,
        check: impl FnMut() -> Result<(), E>,
    ) -> Result<(), WaitError<E>> {
        wait_until(self.w32(256), self.w32(264), |v| v == DONE, deadline, check)
    }

    /// Waits until the frame in the mailbox is no longer running: the child published its
    /// result, or another thread of the parent already took it (the mailbox is then idle, or
    /// carries a later frame), or the deadline passes. For a parent thread that waits for one
    /// of several frames whose results any of its threads may take: waiting for the result
    /// alone ([`Mailbox::wait_ready`]) would sleep to its deadline when another thread took
    /// it first.
    pub fn wait_settled(&self, deadline: Instant) {
        let unsettled = |v: u32| v == TASK || v == RUNNING;
        if !unsettled(self.w32(256).load(Ordering::Acquire)) {
            return;
        }
        let _ = wait_until(
            self.w32(256),
            self.w32(264),
            |v| !unsettled(v),
            deadline,
            || Ok::<(), ()>(()),
        );
    }

    /// Takes a published result: checks that it answers `ident`, copies it out and frees the
    /// mailbox for the next frame.
    ///
    /// # Errors
    ///
    /// No result yet, or a result whose identity or length is corrupt.
    pub fn take_result(&self, ident: Ident, who: &str) -> Result<Vec<u8>, WorkerError> {
        if !self.result_ready() {
            return Err(WorkerError::Corrupt(format!(
                "{who} has no result for {ident:?}"
            )));
        }
        let got = Ident {
            run: self.w64(304).load(Ordering::Relaxed),
            task: self.w64(312).load(Ordering::Relaxed),
            generation: self.w64(320).load(Ordering::Relaxed),
        };
        if got != ident {
            return Err(WorkerError::Corrupt(format!(
                "{who} answered {got:?} to frame {ident:?}"
            )));
        }
        let len = self.w32(276).load(Ordering::Relaxed) as usize;
        let out = self.read_bytes(DATA + FRAME_CAP, RESULT_CAP, len)?;
        self.w32(256).store(IDLE, Ordering::Release);
        Ok(out)
    }

    /// Waits for the child's result of `ident` while `running()` says the child runs.
    ///
    /// # Errors
    ///
    /// The child died ([`WorkerError::ChildDied`]), the deadline passed, or the result's identity
    /// or length is corrupt.
    pub fn wait_result(
        &self,
        ident: Ident,
        pid: u32,
        who: &str,
        deadline: Instant,
        mut running: impl FnMut() -> bool,
    ) -> Result<Vec<u8>, WorkerError> {
        match self.wait_ready(deadline, || if running() { Ok(()) } else { Err(()) }) {
            Ok(()) => {}
            // It may have published just before dying.
            Err(WaitError::Check(())) if self.result_ready() => {}
            Err(WaitError::Check(())) => {
                return Err(WorkerError::ChildDied {
                    who: who.to_string(),
                    pid,
                })
            }
            Err(WaitError::Timeout { waited }) => {
                return Err(WorkerError::Timeout(format!(
                    "{who} did not finish task {} within {waited:?}",
                    ident.task
                )))
            }
        }
        self.take_result(ident, who)
    }

    /// Asks the child to leave (sticky: nothing clears it).
    pub fn shutdown(&self) {
        self.w32(260).store(1, Ordering::SeqCst);
        wake(self.w32(256), self.w32(264));
        pto_shm::futex::wake_all(self.w32(256));
    }

    /// Reads the bootstrap record: `None` while the child has not reported.
    ///
    /// # Errors
    ///
    /// The child reported an error (its message), or the record is corrupt.
    pub fn boot_result(&self) -> Result<Option<BootFacts>, String> {
        // The state word is read with acquire first; the rest of the record is plain data the
        // child wrote before it released the state.
        let state = self.w32(BOOT).load(Ordering::Acquire);
        if state == 0 {
            return Ok(None);
        }
        let mut rec = vec![0u8; BOOT_RECORD];
        // SAFETY: the record area lies inside this mailbox's slot, inside the segment; the child finished writing it before
        // it released the state word we acquired.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.seg.as_ptr().add(self.base + BOOT),
                rec.as_mut_ptr(),
                BOOT_RECORD,
            )
        };
        decode_boot(&rec)
    }

    // ---- child side ----

    /// Reports a successful bring-up.
    pub fn boot_success(&self, f: &BootFacts) {
        let n = f.buffer_offsets.len().min(MAX_BUFFERS);
        self.w32(BOOT + 8).store(f.rank, Ordering::Relaxed);
        self.w32(BOOT + 12).store(f.size, Ordering::Relaxed);
        self.w64(BOOT + 16).store(f.window_bytes, Ordering::Relaxed);
        self.w32(BOOT + 24).store(n as u32, Ordering::Relaxed);
        for (i, &o) in f.buffer_offsets.iter().take(n).enumerate() {
            self.w64(BOOT_OFFSETS + 8 * i).store(o, Ordering::Relaxed);
        }
        self.w32(BOOT).store(1, Ordering::Release);
    }

    /// Reports a failed bring-up (the message is truncated to 1024 bytes).
    pub fn boot_error(&self, code: u32, msg: &str) {
        let m = truncate(msg, BOOT_MSG_CAP);
        let n = self.write_bytes(BOOT_MSG, BOOT_MSG_CAP, m.as_bytes());
        self.w32(BOOT + 4).store(code, Ordering::Relaxed);
        self.w32(BOOT + 28).store(n as u32, Ordering::Relaxed);
        self.w32(BOOT).store(2, Ordering::Release);
    }

    /// Waits for the next frame; `Ok(None)` on shutdown or when the parent is gone.
    ///
    /// # Errors
    ///
    /// A frame length past the mailbox.
    #[allow(clippy::type_complexity)]
    pub fn next_frame(
        &self,
        parent: u32,
    ) -> Result<Option<(Ident, Result<Vec<u8>, WorkerError>)>, WorkerError> {
        let mut buf = Vec::new();
        Ok(self
            .next_frame_into(parent, &mut buf)?
            .map(|(ident, r)| (ident, r.map(|()| buf))))
    }

    /// [`Mailbox::next_frame`] into `buf` (its bytes replaced by the frame's): a child that
    /// serves many frames reuses one buffer.
    ///
    /// # Errors
    ///
    /// A frame length past the mailbox.
    #[allow(clippy::type_complexity)]
    pub fn next_frame_into(
        &self,
        parent: u32,
        buf: &mut Vec<u8>,
    ) -> Result<Option<(Ident, Result<(), WorkerError>)>, WorkerError> {
        loop {
            if self.w32(260).load(Ordering::Acquire) != 0 {
                return Ok(None);
            }
            let shutdown = self.w32(260);
            // A frame already published (the host queues several per child) is taken without
            // reading the clock for a deadline.
            let r = if self.w32(256).load(Ordering::Acquire) == TASK {
                Ok(())
            } else {
                wait_until(
                    self.w32(256),
                    self.w32(264),
                    |v| v == TASK || shutdown.load(Ordering::Acquire) != 0,
                    Instant::now() + Duration::from_millis(200),
                    || Ok::<(), ()>(()),
                )
            };
            if self.w32(260).load(Ordering::Acquire) != 0 {
                return Ok(None);
            }
            // An orphan (the parent died and the death signal was not delivered) is noticed
            // when a wait runs out; a frame that arrived is served without a system call.
            if r.is_err() && pto_shm::process::parent_pid() != parent {
                return Ok(None);
            }
            if r.is_ok() {
                let ident = Ident {
                    run: self.w64(280).load(Ordering::Relaxed),
                    task: self.w64(288).load(Ordering::Relaxed),
                    generation: self.w64(296).load(Ordering::Relaxed),
                };
                let len = self.w32(272).load(Ordering::Relaxed) as usize;
                let got = self.read_bytes_into(DATA, FRAME_CAP, len, buf);
                // Consume the publication once it is copied out.
                self.w32(256).store(RUNNING, Ordering::Relaxed);
                return Ok(Some((ident, got)));
            }
        }
    }

    /// Publishes a result for `ident`.
    pub fn reply(&self, ident: Ident, result: &[u8]) {
        let n = self.write_bytes(DATA + FRAME_CAP, RESULT_CAP, result);
        self.w32(276).store(n as u32, Ordering::Relaxed);
        self.w64(304).store(ident.run, Ordering::Relaxed);
        self.w64(312).store(ident.task, Ordering::Relaxed);
        self.w64(320).store(ident.generation, Ordering::Relaxed);
        self.w32(256).store(DONE, Ordering::SeqCst);
        wake(self.w32(256), self.w32(264));
    }

    /// Test hook: overwrites the frame area and publishes garbage, as a corrupted parent or a
    /// stray writer would.
    #[doc(hidden)]
    pub fn inject_garbage(&self, ident: Ident, bytes: &[u8], claimed_len: u32) {
        self.write_bytes(DATA, FRAME_CAP, bytes);
        self.w32(272).store(claimed_len, Ordering::Relaxed);
        self.w64(280).store(ident.run, Ordering::Relaxed);
        self.w64(288).store(ident.task, Ordering::Relaxed);
        self.w64(296).store(ident.generation, Ordering::Relaxed);
        self.w32(256).store(TASK, Ordering::SeqCst);
        wake(self.w32(256), self.w32(264));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn records_round_trip_through_a_mailbox() {
        let mb = Mailbox::create("mbtest").unwrap();
        assert_eq!(mb.boot_result(), Ok(None));
        let facts = BootFacts {
            rank: 2,
            size: 4,
            window_bytes: 4096,
            buffer_offsets: vec![0, 64, 128],
        };
        mb.boot_success(&facts);
        assert_eq!(mb.boot_result(), Ok(Some(facts)));
        let mb = Mailbox::create("mbtest2").unwrap();
        mb.boot_error(1, &"x".repeat(5000));
        let e = mb.boot_result().unwrap_err();
        assert_eq!(e.len(), 1024);
    }

    /// A parent thread waiting for a frame whose result another parent thread takes first
    /// wakes when the result is published, not at its deadline.
    #[test]
    fn a_wait_for_a_frame_ends_when_another_thread_takes_its_result() {
        let mb = std::sync::Arc::new(Mailbox::create("mbsettle").unwrap());
        let ident = Ident {
            run: 1,
            task: 7,
            generation: 1,
        };
        mb.reserve().unwrap();
        mb.send(ident, b"frame").unwrap();
        // The child takes the frame: while it runs, the frame is not settled.
        let mut buf = Vec::new();
        let (got, frame) = mb
            .next_frame_into(std::os::unix::process::parent_id(), &mut buf)
            .unwrap()
            .unwrap();
        assert_eq!(
            (got, frame.is_ok(), buf.as_slice()),
            (ident, true, &b"frame"[..])
        );
        let t = Instant::now();
        mb.wait_settled(t + Duration::from_millis(50));
        assert!(
            t.elapsed() >= Duration::from_millis(50),
            "a running frame counted as settled"
        );
        let other = {
            let mb = mb.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                // The child answers, and at once another parent thread takes the result.
                mb.reply(ident, b"result");
                mb.take_result(ident, "test").unwrap()
            })
        };
        let t = Instant::now();
        mb.wait_settled(Instant::now() + Duration::from_secs(60));
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "woken after {:?}",
            t.elapsed()
        );
        assert_eq!(other.join().unwrap(), b"result");
        assert!(!mb.result_ready());
    }

    /// A set of mailboxes holds the first page of each slot until a slot is reserved.
    #[test]
    fn a_mailbox_slot_holds_its_frame_pages_once_reserved() {
        use std::os::unix::fs::MetadataExt;
        let set = Mailbox::create_set("mbsparse", 4).unwrap();
        let path = format!("/dev/shm{}", set[0].name());
        let held = || std::fs::metadata(&path).unwrap().blocks() * 512;
        let before = held();
        assert!(
            before < SLOT as u64,
            "{before} bytes held by 4 unused slots"
        );
        set[2].reserve().unwrap();
        set[2].reserve().unwrap();
        assert!(held() >= before + (SLOT - DATA) as u64);
    }

    proptest! {
        /// Any bytes decode to a record or an error, never a panic.
        #[test]
        fn decoding_random_records_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..BOOT_RECORD)) {
            let _ = decode_boot(&bytes);
        }
    }
}
