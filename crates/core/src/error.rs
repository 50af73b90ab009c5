//! The one error type of cairn-core. Every variant names the object or path involved,
//! so that the binary can print it as it is and a user knows what to look at.

use std::path::PathBuf;

use cairn_storage::StorageError;

use crate::id::{BlobId, PackId, SnapshotId};

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Storage(#[from] StorageError),

    #[error("Wrong password for the repository at {location}: no key file there opens with it")]
    WrongPassword { location: String },

    #[error(
        "Stopped trying the key files of {location}: the password opened none of the {tried} \
         tried, and the {} left ({}) would cost more work than one command may spend on key \
         files (someone may have put expensive ones in keys/). Check the password; if it is \
         right, remove the key files you do not know from keys/",
        untried.len(),
        untried.join(", ")
    )]
    KeySearchStopped {
        location: String,
        tried: usize,
        untried: Vec<String>,
    },

    #[error(
        "Key {id} opened the repository for this command, so it is not removed; to replace \
         it use `cairn key passwd`, or remove it while opening with another key's password"
    )]
    KeyInUse { id: String },

    #[error(
        "Key {id} is the last key of {location}: without it nothing can be decrypted; add \
         another first (`cairn key add`)"
    )]
    LastKey { id: String, location: String },

    #[error("No key file of {location} matches {spec:?}; `cairn key list` shows them")]
    KeyNotFound { location: String, spec: String },

    #[error("Key id {spec:?} is ambiguous: it matches {}; give more digits", candidates.join(", "))]
    KeyAmbiguous {
        spec: String,
        candidates: Vec<String>,
    },

    #[error(
        "The command of {name} ({command}) {status}; no snapshot was written. Its output \
         is backed up only when it succeeds"
    )]
    CommandFailed {
        name: String,
        command: String,
        status: String,
    },

    #[error("{location} is not a cairn repository (no config file); create one with `cairn init`")]
    NotARepository { location: String },

    #[error("{location} already holds a repository; use another directory")]
    RepositoryExists { location: String },

    #[error(
        "The repository at {location} has format version {found}, but this cairn reads only \
         versions up to {supported}; upgrade cairn to use it"
    )]
    UnsupportedVersion {
        location: String,
        found: u32,
        supported: u32,
    },

    #[error(
        "The config of {location} is not the one this repository was created with: {reason}. \
         Do not write to it; restore the config from a copy of the repository"
    )]
    ConfigNotAuthentic { location: String, reason: String },

    #[error("{name} in {location} is damaged: {reason}")]
    CorruptObject {
        location: String,
        name: String,
        reason: String,
    },

    #[error("Blob {id} is not in the repository's index (an index file is missing or damaged)")]
    BlobNotInIndex { id: BlobId },

    /// A write-only key can back up, but not read what the repository holds.
    #[error(
        "This is a write-only key: it can back up (and check files against their names), \
         but cannot {action}, nor list, restore, forget or prune; use a full key of the \
         repository for that"
    )]
    WriteOnlyKey { action: String },

    #[error("Blob {id} in pack {} is damaged: {reason}", pack.storage_name())]
    BlobDamaged {
        id: BlobId,
        pack: PackId,
        reason: String,
    },

    #[error("No snapshot matches {spec:?}; `cairn snapshots` lists them")]
    SnapshotNotFound { spec: String },

    /// `latest` with `--host`/`--tag`/`--path` that no snapshot matches.
    #[error("No snapshot matches {filter}; `cairn snapshots` lists them all")]
    NoSnapshotMatches { filter: String },

    #[error("Snapshot id {spec:?} is ambiguous: it matches {}; give more digits", candidates.join(", "))]
    SnapshotAmbiguous {
        spec: String,
        candidates: Vec<String>,
    },

    #[error(
        "Path {path} is not in snapshot {snapshot}{}",
        did_you_mean(suggestions)
    )]
    PathNotFound {
        path: String,
        snapshot: String,
        /// Paths in the snapshot whose names are nearest to the missing one.
        suggestions: Vec<String>,
    },

    /// A snapshot the user named is missing; `existing` describes the closest ones.
    #[error("No snapshot matches {spec:?}; {}", existing_snapshots(existing))]
    SnapshotNotFoundAmong { spec: String, existing: Vec<String> },

    /// A glob pattern the user typed does not parse.
    #[error("Pattern {pattern:?} does not parse: {reason}")]
    BadPattern { pattern: String, reason: String },

    #[error("{path} in the snapshot is not a regular file")]
    NotAFile { path: String },

    #[error(
        "Target directory {} is not empty; restore into an empty directory, or pass \
         --overwrite always (replace existing files) or --overwrite never (keep them)",
        target.display()
    )]
    TargetNotEmpty { target: PathBuf },

    /// `--delete` into a target none of whose entries the snapshot holds: most likely a
    /// mistyped `--target`, which would be emptied.
    #[error(
        "Target directory {} holds nothing that the restored snapshot holds, so --delete \
         would remove everything in it; check --target (restore --dry-run -v lists what \
         would happen), or pass --force to delete anyway",
        target.display()
    )]
    TargetUnrelated { target: PathBuf },

    #[error(
        "Pattern {pattern:?} on line {line} of {} does not parse: {reason}; fix or remove it",
        file.display()
    )]
    IgnorePattern {
        file: PathBuf,
        line: u64,
        pattern: String,
        reason: String,
    },

    #[error("{}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("Invalid chunker parameters: {0}")]
    ChunkerParams(#[from] cairn_chunker::ParamsError),

    #[error("{0}")]
    InvalidInput(String),

    #[error("Interrupted; nothing was committed")]
    Interrupted,

    /// The blob writer stopped on an error of its own; `BlobWriter::cause` returns it.
    #[error("the blob writer stopped")]
    WriterStopped,
}

/// An error and all its sources on one line, `outer: inner: innermost`, for messages
/// that are stored as text (problem lists in reports).
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

fn existing_snapshots(existing: &[String]) -> String {
    if existing.is_empty() {
        "the repository has no snapshots yet".into()
    } else {
        format!("existing snapshots: {}", existing.join(", "))
    }
}

fn did_you_mean(suggestions: &[String]) -> String {
    if suggestions.is_empty() {
        String::new()
    } else {
        format!("; did you mean {}?", suggestions.join(", "))
    }
}

impl Error {
    /// Names the snapshot of a `PathNotFound` by its id (`browse::find`, given only the
    /// snapshot, names it by time and paths); other errors are returned as they are.
    pub fn naming_snapshot(self, id: &SnapshotId, snapshot: &crate::snapshot::Snapshot) -> Self {
        match self {
            Error::PathNotFound {
                path, suggestions, ..
            } => Error::PathNotFound {
                path,
                snapshot: format!("{} ({})", id.short(), snapshot.paths.join(", ")),
                suggestions,
            },
            e => e,
        }
    }

    /// A stable word for what went wrong, for programs (`--json` error documents; the
    /// list is in docs/JSON.md). Storage errors give [`StorageError::kind`]'s words.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Storage(e) => e.kind(),
            Error::WrongPassword { .. } | Error::KeySearchStopped { .. } => "wrong_password",
            Error::NotARepository { .. } => "not_a_repository",
            Error::RepositoryExists { .. } => "already_exists",
            Error::UnsupportedVersion { .. } => "unsupported_version",
            Error::ConfigNotAuthentic { .. }
            | Error::CorruptObject { .. }
            | Error::BlobNotInIndex { .. }
            | Error::BlobDamaged { .. } => "corrupt",
            Error::WriteOnlyKey { .. } => "write_only_key",
            Error::SnapshotNotFound { .. }
            | Error::NoSnapshotMatches { .. }
            | Error::SnapshotNotFoundAmong { .. }
            | Error::PathNotFound { .. }
            | Error::KeyNotFound { .. }
            | Error::NotAFile { .. } => "not_found",
            Error::SnapshotAmbiguous { .. } | Error::KeyAmbiguous { .. } => "ambiguous",
            Error::KeyInUse { .. }
            | Error::LastKey { .. }
            | Error::TargetNotEmpty { .. }
            | Error::TargetUnrelated { .. } => "refused",
            Error::CommandFailed { .. } => "command_failed",
            Error::BadPattern { .. }
            | Error::IgnorePattern { .. }
            | Error::ChunkerParams(_)
            | Error::InvalidInput(_) => "usage",
            Error::Io { .. } => "io",
            Error::Interrupted => "interrupted",
            Error::WriterStopped => "other",
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}
