//! Window arithmetic: which aligned windows of a pack hold a blob, for any offset and
//! length an index file may hold and any pack end, and the blob's bytes read from them.
#![no_main]

use cairn_core::id::PackId;
use cairn_core::window::{span, PackWindows, LOCAL_WINDOW, WINDOW};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (u32, u32, u64, bool)| {
    let (offset, length, pack_end, remote) = input;
    let window = if remote { WINDOW } else { LOCAL_WINDOW };
    let end = u64::from(offset) + u64::from(length);
    let first = u64::from(offset) / window * window;
    match span(offset, length, pack_end, window) {
        Some(blob) => {
            assert_eq!(blob, u64::from(offset)..end);
            assert!(end <= pack_end && end <= first + 2 * window);
        }
        None => assert!(
            end > first + 2 * window || end > pack_end,
            "a blob that fits was refused"
        ),
    }
    // The bytes read through the windows are the pack's bytes at the blob's place, and
    // no window is asked for past the pack's end or off the window grid.
    let byte = |at: u64| (at % 251) as u8;
    let fetch = |start: u64, len: u64| {
        assert!(start.is_multiple_of(window) && len <= window && start + len <= pack_end);
        Some((start..start + len).map(byte).collect())
    };
    let windows = PackWindows::new(remote);
    if let Some(read) = windows.read(PackId([0; 32]), offset, length, pack_end, fetch) {
        assert_eq!(read.len() as u64, u64::from(length));
        assert!(read
            .iter()
            .zip(u64::from(offset)..)
            .all(|(b, at)| *b == byte(at)));
    }
});
