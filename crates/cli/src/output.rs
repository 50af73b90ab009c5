//! Formatting for people: sizes, times, names made safe for a terminal, and the monitor
//! that prints problems as they happen.

use std::borrow::Cow;
use std::fmt::Write as _;
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
/// `1 file`, `2 files`, `0 files`.
pub fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

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

/// A `--group-by` group's key in `--json` documents: only the fields grouped by, so that
/// tags are never `null` (an absent `tags` means "not grouped by tags", `[]` "no tags").
pub fn group_json(
    host: &Option<String>,
    paths: &Option<Vec<String>>,
    tags: &Option<Vec<String>>,
) -> serde_json::Value {
    let mut v = serde_json::Map::new();
    if let Some(h) = host {
        v.insert("host".into(), h.clone().into());
    }
    if let Some(p) = paths {
        v.insert("paths".into(), p.clone().into());
    }
    if let Some(t) = tags {
        v.insert("tags".into(), t.clone().into());
    }
    v.into()
}

/// With `--json`, a fatal error as one document on stdout, `{"error": {"kind", "message",
/// "exit_code"}}` (docs/JSON.md), besides the human line on stderr. Nothing to do if stdout
/// is gone: the exit code still tells.
pub fn json_error(kind: &str, message: &str, exit_code: u8) {
    let doc = serde_json::json!({
        "error": {"kind": kind, "message": message, "exit_code": exit_code}
    });
    let _ = json(&doc);
}

/// The stable word for an error (docs/JSON.md lists them): the kind of the first typed
/// error in its chain, below the context the binary adds; `other` for the binary's own
/// errors, which carry only text.
pub fn error_kind(err: &anyhow::Error) -> &'static str {
    for e in err.chain() {
        if let Some(e) = e.downcast_ref::<cairn_core::Error>() {
            return e.kind();
        }
        if let Some(e) = e.downcast_ref::<cairn_core::storage::StorageError>() {
            return e.kind();
        }
        if e.is::<clap::Error>() {
            return "usage";
        }
        if e.is::<std::io::Error>() {
            return "io";
        }
    }
    "other"
}

/// Prints each problem on stderr the moment it happens. Commands that show progress use
/// `progress::Progress`, which prints problems through this one, above its bar.
pub struct StderrMonitor;

impl Monitor for StderrMonitor {
    fn problem(&self, path: &Path, error: &dyn std::fmt::Display) {
        let line = format!("error: {}: {error}", path.display());
        eprintln!("{}", message(&line));
    }

    fn cancelled(&self) -> bool {
        crate::signals::interrupted()
    }
}

/// A name or path from a snapshot or a backed-up tree, made safe to print: a name is
/// whatever bytes its owner chose, and `\e]0;...` or `\e[2J` in one would otherwise
/// retitle or clear the terminal of whoever lists the snapshot, and a newline would
/// forge a line of output.
///
/// Printable UTF-8 is kept as it is (accents, CJK, emoji). Escaped, in the style of
/// Rust's and GNU `ls -b`'s escapes rather than `ls`'s `?` (which loses which byte it
/// was, so two names could print alike): `\n`, `\t`, `\r`; other control characters
/// (C0, DEL) and bytes that are not UTF-8 as `\xNN`; C1 controls and the bidirectional
/// overrides, which reorder what a terminal shows, as `\u{NNNN}`; and the backslash
/// itself as `\\`, so that a name that spells an escape does not print like another
/// name. Output is therefore unambiguous: distinct names print differently.
/// `--json` output needs none of this: JSON strings escape control characters.
pub fn name(bytes: &[u8]) -> Cow<'_, str> {
    match std::str::from_utf8(bytes) {
        Ok(s) if !s.chars().any(|c| c == '\\' || needs_escape(c)) => Cow::Borrowed(s),
        _ => {
            let mut out = String::with_capacity(bytes.len() + 8);
            for chunk in bytes.utf8_chunks() {
                for c in chunk.valid().chars() {
                    match c {
                        '\\' => out.push_str("\\\\"),
                        c if needs_escape(c) => push_escaped(&mut out, c),
                        c => out.push(c),
                    }
                }
                for b in chunk.invalid() {
                    let _ = write!(out, "\\x{b:02x}");
                }
            }
            Cow::Owned(out)
        }
    }
}

/// An error or warning line, made safe to print: messages quote names and paths from
/// snapshots and backed-up trees. Control characters are escaped as in [`name`], but
/// newlines and tabs, which messages use for their own layout, are kept, and so are
/// backslashes, which would otherwise double the escapes that messages quoting with
/// `{:?}` already hold.
pub fn message(text: &str) -> Cow<'_, str> {
    let unsafe_char = |c: char| c != '\n' && c != '\t' && needs_escape(c);
    if !text.chars().any(unsafe_char) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unsafe_char(c) {
            push_escaped(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Characters a terminal acts on rather than shows: C0 and C1 controls, DEL, and the
/// bidirectional embeddings, overrides and isolates (the "Trojan Source" characters),
/// which make a name display as another.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

fn push_escaped(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\t' => out.push_str("\\t"),
        '\r' => out.push_str("\\r"),
        c if (c as u32) < 0x80 => {
            let _ = write!(out, "\\x{:02x}", c as u32);
        }
        c => {
            let _ = write!(out, "\\u{{{:04x}}}", c as u32);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printable_names_are_kept_as_they_are() {
        for n in ["plain.txt", "été ☃ 漢字 🦀", "a b'c\"d", "..."] {
            assert!(matches!(name(n.as_bytes()), Cow::Borrowed(_)), "{n}");
        }
    }

    #[test]
    fn control_characters_in_names_are_escaped() {
        assert_eq!(name(b"x\x1b[31mred\nline"), "x\\x1b[31mred\\nline");
        assert_eq!(name(b"a\tb\rc\x7fd\x07"), "a\\tb\\rc\\x7fd\\x07");
        assert_eq!(name("c1\u{9b}31m".as_bytes()), "c1\\u{009b}31m");
        assert_eq!(
            name("evil\u{202e}txt.exe".as_bytes()),
            "evil\\u{202e}txt.exe"
        );
        assert_eq!(name(b"bad\xff\xfeutf8"), "bad\\xff\\xfeutf8");
    }

    #[test]
    fn escaped_names_are_unambiguous() {
        // A name that spells an escape prints differently from the one it spells.
        assert_eq!(name(b"a\\x1b"), "a\\\\x1b");
        assert_ne!(name(b"a\\x1b"), name(b"a\x1b"));
        assert_ne!(name(b"\\xff"), name(b"\xff"));
    }

    #[test]
    fn messages_keep_their_lines_but_lose_escape_sequences() {
        assert_eq!(
            message("error: /x\x1b]0;owned\x07: gone\n  hint\t1"),
            "error: /x\\x1b]0;owned\\x07: gone\n  hint\t1"
        );
        assert_eq!(message("C:\\dir \"q\\n\""), "C:\\dir \"q\\n\"");
    }

    #[test]
    fn nothing_printed_holds_a_control_byte() {
        let all: Vec<u8> = (0..=255u8).collect();
        let shown = name(&all);
        assert!(!shown.chars().any(needs_escape), "{shown}");
        let text = String::from_utf8_lossy(&all);
        assert!(!message(&text)
            .chars()
            .any(|c| c != '\n' && c != '\t' && needs_escape(c)));
    }
}
