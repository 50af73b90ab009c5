//! Formatting for people: sizes, times, and the monitor that prints problems as they happen.

use std::io::Write;
use std::path::Path;

use cairn_core::monitor::Monitor;

/// `1.5 MiB`.
pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// A timestamp in the local time zone, to the second.
pub fn local_time(t: jiff::Timestamp) -> String {
    t.to_zoned(jiff::tz::TimeZone::system())
        .strftime("%Y-%m-%d %H:%M:%S")
        .to_string()
}

/// A file time in the local time zone.
pub fn file_time(t: cairn_core::tree::Time) -> String {
    t.to_timestamp()
        .map(local_time)
        .unwrap_or_else(|| format!("@{}", t.sec))
}

pub fn seconds(ms: u64) -> String {
    format!("{:.2} s", ms as f64 / 1000.0)
}

/// Prints JSON on stdout, one document. Serialized first, so that a closed pipe shows up
/// as the `io::Error` that `main` treats as success.
pub fn json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    let mut text = serde_json::to_vec_pretty(value)?;
    text.push(b'\n');
    std::io::stdout().lock().write_all(&text)?;
    Ok(())
}

/// Prints each problem on stderr the moment it happens. Commands that show progress use
/// `progress::Progress`, which prints problems through this one, above its bar.
pub struct StderrMonitor;

impl Monitor for StderrMonitor {
    fn problem(&self, path: &Path, error: &dyn std::fmt::Display) {
        eprintln!("error: {}: {error}", path.display());
    }

    fn cancelled(&self) -> bool {
        crate::signals::interrupted()
    }
}

/// `rwxr-xr-x` with the type letter in front.
pub fn mode_string(kind: &str, mode: u32) -> String {
    let t = match kind {
        "dir" => 'd',
        "symlink" => 'l',
        "fifo" => 'p',
        "socket" => 's',
        "chardev" => 'c',
        "blockdev" => 'b',
        _ => '-',
    };
    let mut s = String::with_capacity(10);
    s.push(t);
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

/// `--stats`: the requests this process sent to each remote repository, on standard error
/// (standard output stays the command's own report). With `--json`, one JSON object per
/// line: `{"repository": .., "requests": {"get": N, ..}, "bytes_received": N, "bytes_sent": N}`.
pub fn print_request_counts(
    stores: &[(String, std::sync::Arc<cairn_core::storage::RequestCounts>)],
    json: bool,
) {
    if stores.is_empty() && !json {
        eprintln!("stats: a local repository; no requests to count");
    }
    for (location, counts) in stores {
        let kinds = counts.snapshot();
        let (received, sent) = counts.bytes();
        if json {
            let requests: serde_json::Map<String, serde_json::Value> = kinds
                .iter()
                .map(|(k, n)| (k.to_string(), (*n).into()))
                .collect();
            let line = serde_json::json!({
                "repository": location,
                "requests": requests,
                "bytes_received": received,
                "bytes_sent": sent,
            });
            eprintln!("{line}");
        } else {
            let total: u64 = kinds.iter().map(|(_, n)| n).sum();
            let each: Vec<String> = kinds
                .iter()
                .filter(|(_, n)| *n > 0)
                .map(|(k, n)| format!("{n} {}", k.to_uppercase()))
                .collect();
            eprintln!(
                "requests to {location}: {total} ({}); received {}, sent {}",
                if each.is_empty() {
                    "none".to_string()
                } else {
                    each.join(", ")
                },
                size(received),
                size(sent)
            );
        }
    }
}
