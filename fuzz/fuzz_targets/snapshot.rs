//! Snapshots: JSON inside a sealed object.
#![no_main]

use cairn_core::snapshot::Snapshot;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(snapshot) = Snapshot::from_json(data) {
        Snapshot::from_json(&snapshot.to_json()).expect("a parsed snapshot reparses");
    }
});
