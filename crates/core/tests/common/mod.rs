//! What the core's integration tests share: a repository that opens fast, plain nodes,
//! and a snapshot of a stored tree.

// Each test binary compiles this module and uses part of it.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use cairn_core::id::BlobId;
use cairn_core::keyfile::KdfParams;
use cairn_core::pack::BlobKind;
use cairn_core::snapshot::{Snapshot, SnapshotSummary};
use cairn_core::storage::{LocalStorage, Storage};
use cairn_core::tree::{Node, NodeKind, Tree};
use cairn_core::{InitOptions, Repository};

/// A new repository in `dir` with the cheapest key derivation, and packs of `pack_size`
/// bytes (the default if `None`).
pub fn repo(dir: &Path, pack_size: Option<u64>) -> Repository {
    let defaults = InitOptions::default();
    let opts = InitOptions {
        kdf: KdfParams {
            memory_kib: 64,
            iterations: 1,
            parallelism: 1,
        },
        pack_size: pack_size.unwrap_or(defaults.pack_size),
        ..defaults
    };
    Repository::init(Arc::new(LocalStorage::new(dir)), b"pw", &opts).unwrap()
}

/// A node owned by root, mode 0644, with no times or links to speak of.
pub fn node(name: &[u8], kind: NodeKind) -> Node {
    Node {
        name: name.to_vec(),
        kind,
        mode: 0o644,
        uid: 0,
        gid: 0,
        user: None,
        group: None,
        mtime: Default::default(),
        ctime: Default::default(),
        inode: 0,
        device: 0,
        links: 1,
        xattrs: vec![],
    }
}

/// A file `len` bytes long, made of the whole of blob `blob`.
pub fn one_blob_file(blob: BlobId, len: usize) -> NodeKind {
    NodeKind::File {
        size: len as u64,
        content: vec![cairn_core::tree::ContentRef {
            blob,
            offset: 0,
            len: len as u32,
        }],
    }
}

/// Stores each of `files` as one blob, and a tree of files `f0000`, `f0001`... holding
/// them in that order; indexes them and returns the tree and the blobs.
pub fn store_files(repo: &mut Repository, files: &[Vec<u8>]) -> (BlobId, Vec<BlobId>) {
    let writer = repo.blob_writer();
    let mut nodes = Vec::new();
    let mut blobs = Vec::new();
    for (i, bytes) in files.iter().enumerate() {
        let (blob, _) = writer.add(BlobKind::Data, bytes).unwrap();
        blobs.push(blob);
        nodes.push(node(
            format!("f{i:04}").as_bytes(),
            one_blob_file(blob, bytes.len()),
        ));
    }
    let (tree, _) = writer
        .add(BlobKind::Tree, &Tree { nodes }.to_bytes())
        .unwrap();
    let mut report = writer.finish().unwrap();
    repo.index_written(&mut report).unwrap();
    (tree, blobs)
}

/// A snapshot of the stored tree `tree`, taken now.
pub fn snapshot(tree: BlobId) -> Snapshot {
    Snapshot {
        time: jiff::Timestamp::now(),
        host: "h".into(),
        username: "u".into(),
        paths: vec!["/".into()],
        tags: vec![],
        tree,
        parent: None,
        original: None,
        program_version: "test".into(),
        summary: SnapshotSummary::default(),
    }
}

/// Restores `snap` into a new directory, which it returns; every file must be restored.
pub fn restore_whole(repo: &Repository, snap: &Snapshot) -> tempfile::TempDir {
    let target = tempfile::tempdir().unwrap();
    let opts = cairn_core::ops::restore::RestoreOptions {
        target: target.path().to_path_buf(),
        ..Default::default()
    };
    let stats =
        cairn_core::ops::restore::restore(repo, snap, &opts, &cairn_core::monitor::NullMonitor)
            .unwrap();
    assert!(stats.errors.is_empty(), "{:?}", stats.errors);
    target
}

/// What a test does on each read of a [`Watched`] storage, before the read is made.
pub trait OnRead: Send + Sync + std::fmt::Debug {
    /// A read of `name`: `len` bytes at `offset` as `Some((offset, len))`, or the whole
    /// object as `None`. An error is the read's outcome instead of the storage's.
    fn read(&self, name: &str, range: Option<(u64, u64)>) -> StorageResult<()>;
}

/// A local repository's storage that tells `hook` of each read, and does everything as
/// the local storage does.
#[derive(Debug)]
pub struct Watched<H> {
    pub inner: LocalStorage,
    pub hook: H,
}

type StorageResult<T> = cairn_core::storage::Result<T>;

impl<H: OnRead> Storage for Watched<H> {
    fn location(&self) -> String {
        self.inner.location()
    }
    fn read(&self, name: &str) -> StorageResult<Vec<u8>> {
        self.hook.read(name, None)?;
        self.inner.read(name)
    }
    fn read_range(&self, name: &str, offset: u64, len: u64) -> StorageResult<Vec<u8>> {
        self.hook.read(name, Some((offset, len)))?;
        self.inner.read_range(name, offset, len)
    }
    fn read_range_into(
        &self,
        name: &str,
        offset: u64,
        len: u64,
        buf: &mut Vec<u8>,
    ) -> StorageResult<()> {
        self.hook.read(name, Some((offset, len)))?;
        self.inner.read_range_into(name, offset, len, buf)
    }
    fn write(&self, name: &str, data: &[u8]) -> StorageResult<()> {
        self.inner.write(name, data)
    }
    fn list(&self, dir: &str) -> StorageResult<Vec<String>> {
        self.inner.list(dir)
    }
    fn list_modified(&self, dir: &str) -> StorageResult<Vec<(String, std::time::SystemTime)>> {
        self.inner.list_modified(dir)
    }
    fn temporaries(&self) -> StorageResult<Vec<(String, std::time::SystemTime)>> {
        self.inner.temporaries()
    }
    fn delete_temporary(&self, name: &str) -> StorageResult<()> {
        self.inner.delete_temporary(name)
    }
    fn size(&self, name: &str) -> StorageResult<u64> {
        self.inner.size(name)
    }
    fn exists(&self, name: &str) -> StorageResult<bool> {
        self.inner.exists(name)
    }
    fn delete(&self, name: &str) -> StorageResult<()> {
        self.inner.delete(name)
    }
}
