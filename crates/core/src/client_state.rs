//! What this client remembers of each repository it opens, kept on this machine (as borg
//! keeps its security directory): the key file that opened it, so the next command tries
//! that one first, and evidence that the storage has not gone back in time.
//!
//! Whoever can write to the storage can put back an older copy of it: snapshots that were
//! forgotten reappear, and prune's trash generations go down (a prune trusting them could
//! delete packs that sessions still need). Only a client that remembers what it saw can
//! tell, so this module keeps, per repository (by config id): the snapshot ids of the last
//! listing, the ids seen and then gone, and the highest trash generation seen, and warns
//! when a gone snapshot is back or the generation is lower.
//!
//! The state is small (ids only, each list bounded), written atomically (temporary file,
//! fsync, rename, fsync of the directory), and never fails a command: a directory that
//! cannot be written is a warning, once, and the command goes on. It never holds a secret.
//!
//! It is written beside the command, on a thread of its own: the listing that finds an
//! unchanged backup's parent changes it (the previous backup's snapshot is new), and its
//! two fsyncs and rename took 0.55 ms here before the walk. Saves run one at a time, in
//! order, and closing the state waits for the last.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use serde::{Deserialize, Serialize};

use crate::id::{KeyId, SnapshotId};

/// Ids of the last listing kept at most (a repository with more keeps some of them:
/// only ids kept can be found gone, so fewer means less evidence, never a false alarm).
const MAX_SEEN: usize = 10_000;
/// Ids seen and then gone kept at most, the most recent.
const MAX_GONE: usize = 1_000;

const VERSION: u32 = 1;

/// Receives warnings meant for the user (the CLI prints them on stderr).
pub type WarningSink = Arc<dyn Fn(&str) + Send + Sync>;

/// Where client state is kept and where its warnings go.
#[derive(Clone)]
pub struct StateOptions {
    /// The base directory, e.g. `$XDG_STATE_HOME/cairn`; each repository gets
    /// `repos/<config id>/` under it.
    pub dir: PathBuf,
    pub warn: WarningSink,
}

impl std::fmt::Debug for StateOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateOptions")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// The stored form: `repos/<config id>/state.json`.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct StateFile {
    version: u32,
    /// The key file that last opened the repository.
    #[serde(default)]
    key_file: Option<KeyId>,
    /// Snapshot ids of the last listing.
    #[serde(default)]
    snapshots_seen: BTreeSet<SnapshotId>,
    /// Snapshot ids seen and then gone, oldest first.
    #[serde(default)]
    snapshots_gone: Vec<SnapshotId>,
    /// The highest trash generation seen.
    #[serde(default)]
    trash_generation: Option<u64>,
}

/// One repository's client state, open.
pub struct ClientState {
    path: PathBuf,
    file: Mutex<StateFile>,
    warnings: Arc<Warnings>,
    /// The save in flight, if any.
    saving: Mutex<Option<JoinHandle<()>>>,
}

/// Where warnings go, each kind once per process.
struct Warnings {
    sink: WarningSink,
    given: Mutex<BTreeSet<&'static str>>,
}

impl Warnings {
    fn once(&self, kind: &'static str, message: &str) {
        let first = self
            .given
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(kind);
        if first {
            (self.sink)(message);
        }
    }
}

impl std::fmt::Debug for ClientState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientState")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl ClientState {
    /// The state of repository `repo_id` (its config id). `None`, with a warning, when
    /// the id cannot name a directory (the config is readable by anyone who can write the
    /// storage, so its id is not trusted with a path).
    pub fn open(options: &StateOptions, repo_id: &str) -> Option<ClientState> {
        let valid = !repo_id.is_empty()
            && repo_id.len() <= 64
            && repo_id.bytes().all(|b| b.is_ascii_alphanumeric());
        if !valid {
            (options.warn)(&format!(
                "the repository id {repo_id:?} cannot name a directory, so this client keeps \
                 no state for it: no rollback detection, and every key file is tried"
            ));
            return None;
        }
        let path = options.dir.join("repos").join(repo_id).join("state.json");
        let state = ClientState {
            file: Mutex::new(StateFile::default()),
            warnings: Arc::new(Warnings {
                sink: Arc::clone(&options.warn),
                given: Mutex::default(),
            }),
            saving: Mutex::default(),
            path,
        };
        match std::fs::read(&state.path) {
            Ok(bytes) => match serde_json::from_slice::<StateFile>(&bytes) {
                Ok(file) if file.version == VERSION => *state.lock() = file,
                Ok(file) => state.warnings.once(
                    "version",
                    &format!(
                        "{} has version {}, which this cairn does not read; it starts afresh",
                        state.path.display(),
                        file.version
                    ),
                ),
                Err(e) => state.warnings.once(
                    "unreadable",
                    &format!(
                        "{} does not parse ({e}); this client's record of the repository \
                         starts afresh",
                        state.path.display()
                    ),
                ),
            },
            // Nothing recorded yet (a file in the way of its directory shows when saving).
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) => {}
            Err(e) => state.warnings.once(
                "unreadable",
                &format!(
                    "cannot read {} ({e}); this client's record of the repository starts afresh",
                    state.path.display()
                ),
            ),
        }
        Some(state)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The key file that last opened the repository.
    pub fn key_file(&self) -> Option<KeyId> {
        self.lock().key_file
    }

    pub fn set_key_file(&self, id: KeyId) {
        self.update(|f| {
            let changed = f.key_file != Some(id);
            f.key_file = Some(id);
            changed
        });
    }

    /// A listing of the repository's snapshots: warns if one seen and then gone is back.
    pub fn saw_snapshots(&self, ids: &[SnapshotId]) {
        let current: BTreeSet<SnapshotId> = ids.iter().copied().collect();
        let back: Vec<String> = {
            let f = self.lock();
            f.snapshots_gone
                .iter()
                .filter(|id| current.contains(id))
                .map(SnapshotId::short)
                .collect()
        };
        if !back.is_empty() {
            self.warnings.once(
                "snapshots back",
                &format!(
                    "the storage may have been rolled back: {} snapshot(s) that this client saw \
                     removed are back in the repository ({}). An older copy of the repository \
                     was put in place of the current one, by someone who can write to its \
                     storage or by a restore from a backup of it. If you put those files back \
                     yourself, delete {} to accept the repository as it is now",
                    back.len(),
                    back.join(", "),
                    self.path.display()
                ),
            );
        }
        self.update(|f| {
            let before = f.clone();
            let newly_gone: Vec<SnapshotId> =
                f.snapshots_seen.difference(&current).copied().collect();
            push_gone(f, newly_gone);
            f.snapshots_seen = current.into_iter().take(MAX_SEEN).collect();
            *f != before
        });
    }

    /// Snapshots this client has just removed: gone, even if no listing sees them missing.
    pub fn removed_snapshots(&self, ids: &[SnapshotId]) {
        self.update(|f| {
            let before = f.clone();
            for id in ids {
                f.snapshots_seen.remove(id);
            }
            push_gone(f, ids.to_vec());
            *f != before
        });
    }

    /// The trash generation a reader observed: warns if it is lower than one seen before.
    pub fn saw_trash_generation(&self, generation: u64) {
        let highest = self.lock().trash_generation;
        match highest {
            Some(highest) if generation < highest => self.warnings.once(
                "trash generation",
                &format!(
                    "the storage may have been rolled back: its trash is at generation \
                     {generation}, but this client saw generation {highest} before. An older \
                     copy of the repository was put in place of the current one (prune's \
                     safety relies on generations only growing), or trash files were deleted \
                     by hand. If you know why, delete {} to accept the repository as it is now",
                    self.path.display()
                ),
            ),
            Some(highest) if generation == highest => {}
            _ => self.update(|f| {
                f.trash_generation = Some(generation);
                true
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, StateFile> {
        self.file.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies `change`; if it says it changed something, saves the result on a thread
    /// after the save in flight (inline if no thread can be started).
    fn update(&self, change: impl FnOnce(&mut StateFile) -> bool) {
        let snapshot = {
            let mut f = self.lock();
            if !change(&mut f) {
                return;
            }
            f.version = VERSION;
            f.clone()
        };
        let mut saving = self.saving.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(previous) = saving.take() {
            let _ = previous.join();
        }
        let (path, warnings) = (self.path.clone(), Arc::clone(&self.warnings));
        match std::thread::Builder::new()
            .name("cairn-state".into())
            .spawn(move || save_or_warn(&path, &snapshot, &warnings))
        {
            Ok(thread) => *saving = Some(thread),
            // The state now is at least as new as the one the thread was to save; copied
            // first, so that the lock is not held while it is written.
            Err(_) => {
                let now = self.lock().clone();
                save_or_warn(&self.path, &now, &self.warnings);
            }
        }
    }
}

impl Drop for ClientState {
    fn drop(&mut self) {
        let saving = self.saving.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(thread) = saving.take() {
            let _ = thread.join();
        }
    }
}

fn save_or_warn(path: &Path, file: &StateFile, warnings: &Warnings) {
    let saved = path
        .parent()
        .map_or(Ok(()), create_private_dirs)
        .and_then(|()| serde_json::to_vec(file).map_err(std::io::Error::other))
        .and_then(|bytes| write_atomic(path, &bytes));
    if let Err(e) = saved {
        warnings.once(
            "unwritable",
            &format!(
                "cannot record this client's view of the repository in {} ({e}); the \
                 command goes on, without rollback detection or a remembered key file",
                path.display()
            ),
        );
    }
}

fn push_gone(f: &mut StateFile, ids: Vec<SnapshotId>) {
    for id in ids {
        if !f.snapshots_gone.contains(&id) {
            f.snapshots_gone.push(id);
        }
    }
    let excess = f.snapshots_gone.len().saturating_sub(MAX_GONE);
    f.snapshots_gone.drain(..excess);
}

/// Creates `dir` and its missing parents, each 0700 and each parent fsynced.
fn create_private_dirs(dir: &Path) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_private_dirs(parent)?;
    }
    let mut builder = std::fs::DirBuilder::new();
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    match builder.create(dir) {
        Ok(()) => sync_dir(dir.parent().unwrap_or(Path::new("."))),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// Writes `path` whole or not at all: a temporary file beside it, fsynced, renamed over
/// it, and the directory fsynced so the rename survives a crash.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let file_name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!(
        ".tmp-{}-{file_name}",
        hex::encode(rand::random::<[u8; 8]>())
    ));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let result = options
        .open(&tmp)
        .and_then(|mut f| f.write_all(bytes).and_then(|_| f.sync_all()))
        .and_then(|_| std::fs::rename(&tmp, path))
        .and_then(|_| sync_dir(dir));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Makes a directory's new or renamed entries durable.
pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    match std::fs::File::open(dir)?.sync_all() {
        // Some file systems cannot sync directories; nothing better can be done there.
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::InvalidInput | std::io::ErrorKind::Unsupported
            ) => {}
        other => return other,
    }
    let _ = dir;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(dir: &Path) -> (StateOptions, Arc<Mutex<Vec<String>>>) {
        let warnings = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&warnings);
        let options = StateOptions {
            dir: dir.to_path_buf(),
            warn: Arc::new(move |w: &str| sink.lock().unwrap().push(w.to_string())),
        };
        (options, warnings)
    }

    fn id(n: u8) -> SnapshotId {
        SnapshotId([n; 32])
    }

    #[test]
    fn a_snapshot_seen_then_gone_that_comes_back_is_warned_of_in_a_later_process() {
        let dir = tempfile::tempdir().unwrap();
        let (opts, warnings) = options(dir.path());
        let state = ClientState::open(&opts, "abc").unwrap();
        state.saw_snapshots(&[id(1), id(2)]);
        state.saw_snapshots(&[id(2), id(3)]);
        assert!(
            warnings.lock().unwrap().is_empty(),
            "new and gone are normal"
        );
        drop(state);

        let state = ClientState::open(&opts, "abc").unwrap();
        state.saw_snapshots(&[id(1), id(2), id(3)]);
        let got = warnings.lock().unwrap().clone();
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(got[0].contains("rolled back") && got[0].contains(&id(1).short()));
        // Once per process, however often the snapshots are listed.
        state.saw_snapshots(&[id(1), id(2), id(3)]);
        assert_eq!(warnings.lock().unwrap().len(), 1);
    }

    #[test]
    fn a_snapshot_this_client_removed_is_gone_without_a_listing() {
        let dir = tempfile::tempdir().unwrap();
        let (opts, warnings) = options(dir.path());
        let state = ClientState::open(&opts, "abc").unwrap();
        state.saw_snapshots(&[id(1), id(2)]);
        state.removed_snapshots(&[id(1)]);
        drop(state);
        let state = ClientState::open(&opts, "abc").unwrap();
        state.saw_snapshots(&[id(1), id(2)]);
        assert_eq!(warnings.lock().unwrap().len(), 1);
    }

    #[test]
    fn a_lower_trash_generation_is_warned_of_and_the_highest_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let (opts, warnings) = options(dir.path());
        let state = ClientState::open(&opts, "abc").unwrap();
        state.saw_trash_generation(3);
        state.saw_trash_generation(5);
        state.saw_trash_generation(5);
        assert!(warnings.lock().unwrap().is_empty());
        drop(state);
        let state = ClientState::open(&opts, "abc").unwrap();
        state.saw_trash_generation(4);
        assert_eq!(warnings.lock().unwrap().len(), 1);
        assert_eq!(state.lock().trash_generation, Some(5));
    }

    #[test]
    fn the_key_file_is_remembered_per_repository() {
        let dir = tempfile::tempdir().unwrap();
        let (opts, _) = options(dir.path());
        ClientState::open(&opts, "abc")
            .unwrap()
            .set_key_file(KeyId([7; 32]));
        assert_eq!(
            ClientState::open(&opts, "abc").unwrap().key_file(),
            Some(KeyId([7; 32]))
        );
        assert_eq!(ClientState::open(&opts, "def").unwrap().key_file(), None);
    }

    #[test]
    fn an_unwritable_state_directory_is_one_warning_and_no_failure() {
        let dir = tempfile::tempdir().unwrap();
        // A file where the directory should be: nothing can be created below it.
        std::fs::write(dir.path().join("repos"), b"").unwrap();
        let (opts, warnings) = options(dir.path());
        let state = ClientState::open(&opts, "abc").unwrap();
        state.saw_snapshots(&[id(1)]);
        state.saw_trash_generation(2);
        state.set_key_file(KeyId([1; 32]));
        drop(state);
        let got = warnings.lock().unwrap().clone();
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(got[0].contains("cannot record"), "{got:?}");
    }

    #[test]
    fn saves_on_their_threads_land_in_order_and_are_done_when_the_state_is_closed() {
        let dir = tempfile::tempdir().unwrap();
        let (opts, warnings) = options(dir.path());
        let state = ClientState::open(&opts, "abc").unwrap();
        for n in 0..50 {
            state.saw_snapshots(&[id(n), id(n + 1)]);
        }
        drop(state);
        let state = ClientState::open(&opts, "abc").unwrap();
        let seen: Vec<SnapshotId> = state.lock().snapshots_seen.iter().copied().collect();
        assert_eq!(seen, [id(50), id(49)].into_iter().rev().collect::<Vec<_>>());
        assert_eq!(state.lock().snapshots_gone.len(), 49);
        assert!(warnings.lock().unwrap().is_empty());
        let names: Vec<_> = std::fs::read_dir(state.path().parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["state.json"], "no temporary file is left");
    }

    #[test]
    fn an_id_that_is_not_a_plain_name_gets_no_state() {
        let dir = tempfile::tempdir().unwrap();
        let (opts, warnings) = options(dir.path());
        for bad in ["", "../x", "a/b", "."] {
            assert!(ClientState::open(&opts, bad).is_none(), "{bad:?}");
        }
        assert_eq!(warnings.lock().unwrap().len(), 4);
    }

    #[test]
    fn the_lists_stay_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let (opts, _) = options(dir.path());
        let state = ClientState::open(&opts, "abc").unwrap();
        let many: Vec<SnapshotId> = (0..MAX_GONE as u32 + 50)
            .map(|n| {
                let mut raw = [0u8; 32];
                raw[..4].copy_from_slice(&n.to_le_bytes());
                SnapshotId(raw)
            })
            .collect();
        state.removed_snapshots(&many);
        assert_eq!(state.lock().snapshots_gone.len(), MAX_GONE);
        assert_eq!(state.lock().snapshots_gone.last(), many.last());
    }
}
