//! Model-based property test: random trees and random edits, a backup after each round,
//! and every snapshot restored and compared with a `cp -a` copy of the state it captured.
//!
//! Each case runs the real binary a dozen times on a few MB, so the case count is small;
//! shrinking is capped for the same reason.

use std::ffi::OsStr;
use std::fmt;
use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use proptest::prelude::*;

use crate::common::*;

/// Total bytes of big files per generated tree, to keep the runtime bounded.
const BIG_BUDGET: usize = 6_000_000;
const MAX_DEPTH: usize = 3;

#[derive(Clone)]
enum Content {
    Empty,
    Small(Vec<u8>),
    Big {
        len: usize,
        compressible: bool,
        seed: u64,
    },
}

// Debug without dumping kilobytes of bytes into a failure report.
impl fmt::Debug for Content {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Content::Empty => write!(f, "Empty"),
            Content::Small(b) => write!(f, "Small({} bytes)", b.len()),
            Content::Big {
                len,
                compressible,
                seed,
            } => {
                write!(
                    f,
                    "Big {{ len: {len}, compressible: {compressible}, seed: {seed} }}"
                )
            }
        }
    }
}

impl Content {
    fn bytes(&self, budget: &mut usize) -> Vec<u8> {
        match self {
            Content::Empty => Vec::new(),
            Content::Small(b) => b.clone(),
            Content::Big {
                len,
                compressible,
                seed,
            } => {
                let len = if *len <= *budget { *len } else { 1000 };
                *budget = budget.saturating_sub(len);
                if *compressible {
                    compressible_bytes(len, *seed)
                } else {
                    random_bytes(len, *seed)
                }
            }
        }
    }
}

#[derive(Clone, Debug)]
enum Kind {
    Dir,
    File {
        content: Content,
        mode: u32,
        mtime: (i64, i64),
        owner: (u32, u32),
        xattr: Option<Vec<u8>>,
    },
    Symlink {
        target: String,
    },
    /// A new name for the n-th existing regular file (mod their count).
    Hardlink {
        to: usize,
    },
    Fifo,
}

#[derive(Clone)]
struct Entry {
    /// Picks the parent among existing directories (mod their count).
    parent: usize,
    name: Vec<u8>,
    kind: Kind,
}

impl fmt::Debug for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Entry {{ parent: {}, name: {:?}, kind: {:?} }}",
            self.parent,
            OsStr::from_bytes(&self.name),
            self.kind
        )
    }
}

#[derive(Clone, Debug)]
enum Edit {
    /// Overwrites bytes at a position given as a fraction of the file's length.
    Modify {
        file: usize,
        at: f64,
        bytes: Vec<u8>,
    },
    Append {
        file: usize,
        bytes: Vec<u8>,
    },
    Delete {
        entry: usize,
    },
    Rename {
        entry: usize,
        name: Vec<u8>,
        to_root: bool,
    },
    Add(Entry),
    /// Metadata-only changes: the mtime stays, only ctime moves.
    Chmod {
        entry: usize,
        mode: u32,
    },
    Chown {
        entry: usize,
        owner: (u32, u32),
    },
    SetXattr {
        file: usize,
        value: Vec<u8>,
    },
}

fn name() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        5 => "[a-z0-9_]{1,10}".prop_map(String::into_bytes),
        1 => "[a-z]{1,5} [a-z ]{0,4}[a-z]".prop_map(String::into_bytes),
        1 => "-[a-z-]{1,8}".prop_map(String::into_bytes),
        1 => (prop::sample::select(vec!["é", "日本語", "✓ ok", "ß", "Ωmega", "emoji-🦀"]), "[a-z]{0,4}")
            .prop_map(|(u, s)| format!("{u}{s}").into_bytes()),
        1 => prop::collection::vec(0x80u8..=0xff, 1..5).prop_map(|b| [b"raw-".to_vec(), b].concat()),
    ]
}

fn content() -> impl Strategy<Value = Content> {
    prop_oneof![
        2 => Just(Content::Empty),
        6 => prop::collection::vec(any::<u8>(), 1..4000).prop_map(Content::Small),
        1 => (100_000usize..3_000_000, any::<bool>(), any::<u64>())
            .prop_map(|(len, compressible, seed)| Content::Big { len, compressible, seed }),
    ]
}

fn mode() -> impl Strategy<Value = u32> {
    prop::sample::select(vec![0o644u32, 0o600, 0o755, 0o444, 0o640, 0o4755])
}

fn owner() -> impl Strategy<Value = (u32, u32)> {
    prop_oneof![3 => Just((0u32, 0u32)), 1 => (1u32..70_000, 1u32..70_000)]
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        3 => Just(Kind::Dir),
        8 => (
            content(),
            mode(),
            (1_000_000_000i64..1_900_000_000, 0i64..1_000_000_000),
            owner(),
            prop::option::weighted(0.2, prop::collection::vec(any::<u8>(), 0..40)),
        )
            .prop_map(|(content, mode, mtime, owner, xattr)| Kind::File { content, mode, mtime, owner, xattr }),
        2 => prop_oneof![
            "[a-z]{1,8}".prop_map(|s| s),
            "\\.\\./[a-z]{1,6}".prop_map(|s| s),
            "/nonexistent/[a-z ]{1,8}".prop_map(|s| s),
        ]
        .prop_map(|target| Kind::Symlink { target }),
        1 => any::<usize>().prop_map(|to| Kind::Hardlink { to }),
        1 => Just(Kind::Fifo),
    ]
}

fn entry() -> impl Strategy<Value = Entry> {
    (any::<usize>(), name(), kind()).prop_map(|(parent, name, kind)| Entry { parent, name, kind })
}

fn edit() -> impl Strategy<Value = Edit> {
    let bytes = prop::collection::vec(any::<u8>(), 1..3000);
    prop_oneof![
        3 => (any::<usize>(), 0.0f64..1.0, bytes.clone()).prop_map(|(file, at, bytes)| Edit::Modify { file, at, bytes }),
        2 => (any::<usize>(), bytes).prop_map(|(file, bytes)| Edit::Append { file, bytes }),
        2 => any::<usize>().prop_map(|entry| Edit::Delete { entry }),
        2 => (any::<usize>(), name(), any::<bool>()).prop_map(|(entry, name, to_root)| Edit::Rename { entry, name, to_root }),
        3 => entry().prop_map(Edit::Add),
        1 => (any::<usize>(), mode()).prop_map(|(entry, mode)| Edit::Chmod { entry, mode }),
        1 => (any::<usize>(), owner()).prop_map(|(entry, owner)| Edit::Chown { entry, owner }),
        1 => (any::<usize>(), prop::collection::vec(any::<u8>(), 0..40)).prop_map(|(file, value)| Edit::SetXattr { file, value }),
    ]
}

/// Applies entries and edits to the tree under `root`.
struct Model {
    root: PathBuf,
    big_budget: usize,
    /// Increases with every file edit, so each edit gets a distinct new mtime.
    clock: i64,
    /// Whether the filesystem takes user.* xattrs.
    xattrs: bool,
}

impl Model {
    /// Directories with their depth (root = 0), sorted.
    fn dirs(&self) -> Vec<(PathBuf, usize)> {
        let mut out = vec![(self.root.clone(), 0)];
        let mut i = 0;
        while i < out.len() {
            let (dir, depth) = out[i].clone();
            for child in sorted_children(&dir) {
                if fs::symlink_metadata(&child).unwrap().is_dir() {
                    out.push((child, depth + 1));
                }
            }
            i += 1;
        }
        out.sort();
        out
    }

    /// Every entry below the root (not the root), sorted.
    fn entries(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for (dir, _) in self.dirs() {
            out.extend(sorted_children(&dir));
        }
        out.sort();
        out
    }

    fn files(&self) -> Vec<PathBuf> {
        self.entries()
            .into_iter()
            .filter(|p| fs::symlink_metadata(p).unwrap().is_file())
            .collect()
    }

    fn add(&mut self, e: &Entry) {
        let dirs: Vec<PathBuf> = self
            .dirs()
            .into_iter()
            .filter(|(_, depth)| !matches!(e.kind, Kind::Dir) || *depth < MAX_DEPTH)
            .map(|(d, _)| d)
            .collect();
        let path = dirs[e.parent % dirs.len()].join(OsStr::from_bytes(&e.name));
        if fs::symlink_metadata(&path).is_ok() {
            return;
        }
        match &e.kind {
            Kind::Dir => fs::create_dir(&path).unwrap(),
            Kind::File {
                content,
                mode,
                mtime,
                owner,
                xattr,
            } => {
                write_file(&path, &content.bytes(&mut self.big_budget));
                if let Some(value) = xattr.as_ref().filter(|_| self.xattrs) {
                    xattr::set(&path, "user.cairn.test", value).unwrap();
                }
                std::os::unix::fs::chown(&path, Some(owner.0), Some(owner.1)).unwrap();
                set_mode(&path, *mode);
                set_mtime(&path, mtime.0, mtime.1);
            }
            Kind::Symlink { target } => std::os::unix::fs::symlink(target, &path).unwrap(),
            Kind::Hardlink { to } => {
                let files = self.files();
                if files.is_empty() {
                    write_file(&path, b"would have been a hardlink\n");
                } else {
                    fs::hard_link(&files[to % files.len()], &path).unwrap();
                }
            }
            Kind::Fifo => mkfifo(&path),
        }
    }

    fn touch(&mut self, path: &Path) {
        self.clock += 1_000;
        set_mtime(path, self.clock, self.clock % 1_000_000_007);
    }

    fn apply(&mut self, edit: &Edit) {
        match edit {
            Edit::Modify { file, at, bytes } => {
                let files = self.files();
                if files.is_empty() {
                    return;
                }
                let path = &files[file % files.len()];
                let len = fs::metadata(path).unwrap().len();
                let pos = (len as f64 * at) as u64;
                let mut f = fs::OpenOptions::new().write(true).open(path).unwrap();
                f.seek(SeekFrom::Start(pos)).unwrap();
                f.write_all(bytes).unwrap();
                drop(f);
                self.touch(path);
            }
            Edit::Append { file, bytes } => {
                let files = self.files();
                if files.is_empty() {
                    return;
                }
                let path = &files[file % files.len()];
                fs::OpenOptions::new()
                    .append(true)
                    .open(path)
                    .unwrap()
                    .write_all(bytes)
                    .unwrap();
                self.touch(path);
            }
            Edit::Delete { entry } => {
                let entries = self.entries();
                if entries.is_empty() {
                    return;
                }
                let path = &entries[entry % entries.len()];
                if fs::symlink_metadata(path).unwrap().is_dir() {
                    fs::remove_dir_all(path).unwrap();
                } else {
                    fs::remove_file(path).unwrap();
                }
            }
            Edit::Rename {
                entry,
                name,
                to_root,
            } => {
                let entries = self.entries();
                if entries.is_empty() {
                    return;
                }
                let from = &entries[entry % entries.len()];
                let dir = if *to_root {
                    self.root.clone()
                } else {
                    from.parent().unwrap().to_path_buf()
                };
                let to = dir.join(OsStr::from_bytes(name));
                // Moving to the root never makes a subtree deeper, so depth stays bounded.
                if fs::symlink_metadata(&to).is_err() {
                    fs::rename(from, &to).unwrap();
                }
            }
            Edit::Add(e) => self.add(e),
            Edit::Chmod { entry, mode } => {
                // Files only: a directory without write or search permission would stop
                // the model (and cp -a) from working in it, which is not what is tested.
                let files = self.files();
                if !files.is_empty() {
                    set_mode(&files[entry % files.len()], *mode);
                }
            }
            Edit::Chown { entry, owner } => {
                let entries = self.entries();
                if !entries.is_empty() {
                    let path = &entries[entry % entries.len()];
                    std::os::unix::fs::lchown(path, Some(owner.0), Some(owner.1)).unwrap();
                }
            }
            Edit::SetXattr { file, value } => {
                let files = self.files();
                if self.xattrs && !files.is_empty() {
                    xattr::set(&files[file % files.len()], "user.cairn.test", value).unwrap();
                }
            }
        }
    }
}

fn sorted_children(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    out.sort();
    out
}

fn run_case(tree: &[Entry], rounds: &[Vec<Edit>]) -> Result<(), String> {
    let env = TestEnv::new();
    env.init(&SMALL_CHUNKS);
    let src = env.path("src");
    fs::create_dir(&src).unwrap();
    let xattrs = user_xattrs_supported(&src);
    let mut model = Model {
        root: src.clone(),
        big_budget: BIG_BUDGET,
        clock: 1_950_000_000,
        xattrs,
    };
    for e in tree {
        model.add(e);
    }

    let mut states: Vec<(String, PathBuf)> = Vec::new();
    let capture = |states: &mut Vec<(String, PathBuf)>| {
        let state = env.path(&format!("state-{}", states.len()));
        copy_tree(&src, &state);
        let id = env.backup_id(&[&src], &[]);
        states.push((id, state));
    };

    capture(&mut states);
    let first = env.path("restore-first");
    env.restore(&states[0].0, &first, &[]);
    compare_trees(&states[0].1, &restored_path(&first, &src), Compare::ALL)
        .map_err(|d| format!("first snapshot, restored right after backup: {d}"))?;

    for round in rounds {
        for e in round {
            model.apply(e);
        }
        capture(&mut states);
    }

    let again = env.backup(&[&src], &[]);
    if json_u64(&again, "files_new") != 0 || json_u64(&again, "files_changed") != 0 {
        return Err(format!(
            "a backup of an unchanged tree saw new or changed files: {again}"
        ));
    }

    for (k, (id, state)) in states.iter().enumerate() {
        let target = env.path(&format!("restore-{k}"));
        env.restore(id, &target, &[]);
        compare_trees(state, &restored_path(&target, &src), Compare::ALL)
            .map_err(|d| format!("snapshot {k} ({id}) after all backups: {d}"))?;
    }
    Ok(())
}

proptest! {
    // CAIRN_PROPTEST_CASES=100 runs a longer hunt; the default keeps the suite quick.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("CAIRN_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(8),
        max_shrink_iters: 16,
        max_shrink_time: 120_000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_snapshot_of_a_randomly_edited_tree_restores_to_the_state_it_captured(
        tree in prop::collection::vec(entry(), 1..30),
        rounds in prop::collection::vec(prop::collection::vec(edit(), 1..8), 1..4),
    ) {
        if let Err(diff) = run_case(&tree, &rounds) {
            prop_assert!(false, "{}", diff);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Checks the model alone (no cairn): generated trees and edits apply cleanly, stay
    /// within the depth bound, and `cp -a` keeps everything the comparison looks at.
    #[test]
    fn the_random_tree_model_applies_and_copies_faithfully(
        tree in prop::collection::vec(entry(), 1..30),
        rounds in prop::collection::vec(prop::collection::vec(edit(), 1..8), 1..4),
    ) {
        let env = TestEnv::new();
        let src = env.path("src");
        fs::create_dir(&src).unwrap();
        let xattrs = user_xattrs_supported(&src);
        let mut model = Model { root: src.clone(), big_budget: 0, clock: 1_950_000_000, xattrs };
        for e in &tree {
            model.add(e);
        }
        for (k, round) in rounds.iter().enumerate() {
            for e in round {
                model.apply(e);
            }
            prop_assert!(model.dirs().iter().all(|(_, d)| *d <= MAX_DEPTH));
            let copy = env.path(&format!("copy-{k}"));
            copy_tree(&src, &copy);
            if let Err(diff) = compare_trees(&src, &copy, Compare::ALL) {
                prop_assert!(false, "{}", diff);
            }
        }
    }
}
