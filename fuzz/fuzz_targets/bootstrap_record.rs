//! Bootstrap records are read from a child's mailbox: any bytes must give facts, an error
//! message or "not yet", never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = pto_worker::mailbox::decode_boot(data);
});
