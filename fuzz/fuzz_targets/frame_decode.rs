//! Task frames and results are decoded from shared memory that another process wrote: any
//! bytes must give a value or an error, never a panic, and a decoded frame must re-encode to
//! the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pto_worker::frame::{Frame, Outcome};

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = Frame::decode(data) {
        assert_eq!(f.encode(), data, "a decoded frame re-encodes to its bytes");
    }
    let _ = Outcome::decode(data);
});
