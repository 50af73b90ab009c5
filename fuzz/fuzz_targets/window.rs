//! Window arithmetic: which aligned window of a pack holds a blob, for any offset and
//! length an index file may hold and any pack end.
#![no_main]

use cairn_core::window::{span, WINDOW};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (u32, u32, u64)| {
    let (offset, length, pack_end) = input;
    let end = u64::from(offset) + u64::from(length);
    match span(offset, length, pack_end) {
        Some(s) => {
            assert_eq!(s.start % WINDOW, 0);
            assert!(s.len <= WINDOW && s.start + s.len <= pack_end);
            assert!(s.within.end as u64 <= s.len, "blob past the window read");
            assert_eq!(s.start + s.within.start as u64, u64::from(offset));
            assert_eq!(s.within.len() as u64, u64::from(length));
        }
        None => {
            let start = u64::from(offset) / WINDOW * WINDOW;
            assert!(
                end > start + WINDOW || end > pack_end,
                "a blob that fits was refused"
            );
        }
    }
});
