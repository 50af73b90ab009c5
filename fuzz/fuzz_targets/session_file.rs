//! Session files after decryption: JSON, and how prune judges the session it describes
//! (its heartbeat interval, its process, storage times far apart).
#![no_main]

use std::time::{Duration, SystemTime};

use cairn_core::session::{judge, Host, SessionInfo};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(info) = SessionInfo::from_json(data) else {
        return;
    };
    let json = serde_json::to_vec(&info).expect("a session serializes");
    SessionInfo::from_json(&json).expect("a parsed session reparses");
    let _ = info.describe();
    let _ = info.stale_after();
    let here = Host {
        boot_id: info.boot_id.clone(),
        pid_ns: info.pid_ns.clone(),
    };
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1 << 30);
    for (beat, now) in [(0, 0), (0, 1 << 20), (1 << 20, 0), (0, u32::MAX as u64)] {
        let (beat, now) = (
            t0 + Duration::from_secs(beat),
            t0 + Duration::from_secs(now),
        );
        let _ = judge(Some(&info), beat, now, &here, |_, _| true);
        let _ = judge(Some(&info), beat, now, &here, |_, _| false);
    }
});
