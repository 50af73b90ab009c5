//! The repository layout as the server enforces it: which names an upload may have and
//! what is checked of each (docs/FORMAT.md has the files; `cairn-core` writes them).
//!
//! | name | written by | the server checks |
//! | --- | --- | --- |
//! | `data/<h[0..2]>/<h>` | backup, copy, prune's repacking | BLAKE3 of the body is `h` |
//! | `index/<h>`, `snapshots/<h>`, `trash/<h>` | backup, prune, forget | the same |
//! | `keys/<h>` | init, key add (a maintain token at least) | the same |
//! | `sessions/<h>` | every running backup and prune (heartbeats) | the same, and it records which token wrote it |
//! | `config` | init (a maintain token at least) | at most [`MAX_CONFIG`] bytes (not hash-named: it carries its own MAC, which only a key can check) |
//!
//! Every name is create-only: an existing object is never replaced, whatever the token.
//! A hash-named object whose body does not hash to its name is refused, so no upload
//! can plant bytes under a name a client will trust for other bytes, and `serve scrub`
//! can check every stored object without a key.

/// The largest `config` accepted: a real one is a few hundred bytes.
pub const MAX_CONFIG: u64 = 64 * 1024;

/// What a name is in the layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind<'a> {
    /// `config`.
    Config,
    /// An object named by the BLAKE3 hash of its bytes (lowercase hex).
    Hashed { dir: &'a str, hash: &'a str },
}

/// Directories of hash-named objects (packs aside, which are fanned out).
const HASHED_DIRS: [&str; 5] = ["index", "snapshots", "trash", "keys", "sessions"];

/// Where `name` belongs in the layout; `None` outside it.
pub fn classify(name: &str) -> Option<Kind<'_>> {
    if name == "config" {
        return Some(Kind::Config);
    }
    let parts: Vec<&str> = name.split('/').collect();
    match parts.as_slice() {
        [dir, hash] if HASHED_DIRS.contains(dir) && is_hash(hash) => {
            Some(Kind::Hashed { dir, hash })
        }
        ["data", fan, hash] if is_hash(hash) && hash.starts_with(fan) && fan.len() == 2 => {
            Some(Kind::Hashed { dir: "data", hash })
        }
        _ => None,
    }
}

fn is_hash(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_repository_layout_is_in_it() {
        let h = blake3::hash(b"x").to_hex().to_string();
        assert_eq!(classify("config"), Some(Kind::Config));
        for dir in HASHED_DIRS {
            assert!(classify(&format!("{dir}/{h}")).is_some(), "{dir}");
        }
        assert!(classify(&format!("data/{}/{h}", &h[..2])).is_some());
        for outside in [
            format!("data/{h}"),
            format!("data/zz/{h}"),
            format!("data/{}/{h}", &h[..3]),
            format!("index/{}", h.to_uppercase()),
            format!("index/{}", &h[..63]),
            format!("other/{h}"),
            format!("index/{h}/x"),
            "configs".to_string(),
            "locks/x".to_string(),
        ] {
            assert_eq!(classify(&outside), None, "{outside}");
        }
    }
}
