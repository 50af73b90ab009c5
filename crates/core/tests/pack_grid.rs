//! Format 4 seals blobs at their exact size and hides them in the pack instead: every
//! pack is a multiple of 64 KiB, and every read of a pack (a restore's, one blob's, a
//! pack header's) starts and ends on that grid, so what a storage sees gives no blob's
//! boundaries closer than that.

mod common;

use std::sync::{Arc, Mutex};

use cairn_core::monitor::NullMonitor;
use cairn_core::ops::restore::{restore, RestoreOptions};
use cairn_core::pack::{BlobKind, GRID};
use cairn_core::storage::{LocalStorage, StorageError};
use cairn_core::Repository;
use common::{repo, snapshot, store_files, OnRead, Watched};

/// Incompressible bytes unlike any other file's.
fn data(i: usize, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    blake3::Hasher::new()
        .update(&i.to_le_bytes())
        .finalize_xof()
        .fill(&mut out);
    out
}

/// Every ranged read: (object, offset, length).
#[derive(Debug, Default)]
struct Recording(Mutex<Vec<(String, u64, u64)>>);

impl OnRead for Recording {
    fn read(&self, name: &str, range: Option<(u64, u64)>) -> cairn_core::storage::Result<()> {
        if let Some((offset, len)) = range {
            (self.0.lock().unwrap()).push((name.to_string(), offset, len));
        }
        Ok(())
    }
}

#[test]
fn packs_are_on_the_grid_and_so_is_every_read_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let repo_dir = dir.path().join("repo");
    let mut repo = repo(&repo_dir, Some(1 << 20));
    let sizes = [1, 3000, 70_000, 300_000, 900_000];
    let files: Vec<Vec<u8>> = (0..40).map(|i| data(i, sizes[i % sizes.len()])).collect();
    let (tree, blobs) = store_files(&mut repo, &files);
    let packs = repo.list_packs().unwrap();
    assert!(packs.len() > 5, "{} packs", packs.len());
    for pack in &packs {
        let size = repo.storage().size(&pack.storage_name()).unwrap();
        assert_eq!(size % GRID, 0, "{pack} is {size} bytes");
    }

    let storage = Arc::new(Watched {
        inner: LocalStorage::new(&repo_dir),
        hook: Recording::default(),
    });
    let repo = Repository::open(storage.clone(), b"pw".as_slice()).unwrap();
    let target = dir.path().join("target");
    let opts = RestoreOptions {
        target: target.clone(),
        verify: true,
        ..RestoreOptions::default()
    };
    let stats = restore(&repo, &snapshot(tree), &opts, &NullMonitor).unwrap();
    assert!(stats.errors.is_empty(), "{:?}", stats.errors);
    for (i, bytes) in files.iter().enumerate() {
        assert_eq!(
            &std::fs::read(target.join(format!("f{i:04}"))).unwrap(),
            bytes
        );
        assert_eq!(&repo.read_blob(&blobs[i]).unwrap(), bytes);
    }
    for pack in &packs {
        assert!(!repo.read_pack_header(pack).unwrap().is_empty());
    }

    let reads = storage.hook.0.lock().unwrap();
    let of_packs: Vec<_> = reads.iter().filter(|r| r.0.starts_with("data/")).collect();
    assert!(of_packs.len() > files.len(), "{} reads", of_packs.len());
    for (name, offset, len) in of_packs {
        assert!(
            offset % GRID == 0 && len % GRID == 0 && *len > 0,
            "{name}: {len} bytes at {offset}"
        );
    }
}

/// A pack cut short off the grid (damaged) still gives the blobs wholly before the cut,
/// and only those.
#[test]
fn a_pack_cut_off_the_grid_still_gives_the_blobs_before_the_cut() {
    let dir = tempfile::tempdir().unwrap();
    let repo_dir = dir.path().join("repo");
    let mut repo = repo(&repo_dir, Some(1 << 20));
    let files: Vec<Vec<u8>> = (0..8).map(|i| data(i, 100_000)).collect();
    let writer = repo.blob_writer();
    let blobs: Vec<_> = (files.iter())
        .map(|bytes| writer.add(BlobKind::Data, bytes).unwrap().0)
        .collect();
    let mut report = writer.finish().unwrap();
    repo.index_written(&mut report).unwrap();
    let pack = repo.index().get(&blobs[0]).unwrap().pack;
    let path = repo_dir.join(pack.storage_name());
    // Right after the end of a blob in the middle, inside the grid cell it ends in: a
    // read of it widened to the grid would go past the cut.
    let mut ends: Vec<u64> = (blobs.iter())
        .map(|b| repo.index().get(b).unwrap())
        .filter(|loc| loc.pack == pack)
        .map(|loc| u64::from(loc.offset) + u64::from(loc.length))
        .collect();
    ends.sort();
    let end = ends[ends.len() / 2];
    let cut = end + 1;
    assert!(!cut.is_multiple_of(GRID) && end.next_multiple_of(GRID) > cut);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(cut)
        .unwrap();
    let repo = Repository::open(Arc::new(LocalStorage::new(&repo_dir)), b"pw".as_slice()).unwrap();
    let (mut before, mut after) = (0, 0);
    for (blob, bytes) in blobs.iter().zip(&files) {
        let loc = repo.index().get(blob).unwrap();
        if loc.pack != pack {
            continue;
        }
        let read = repo.read_blob(blob);
        if u64::from(loc.offset) + u64::from(loc.length) <= cut {
            assert_eq!(&read.unwrap(), bytes);
            before += 1;
        } else {
            assert!(read.is_err());
            after += 1;
        }
    }
    assert!(
        before >= 2 && after >= 1,
        "{before} before the cut, {after} after"
    );
}

/// A store that says every read of a pack ran past the end of a pack of `claimed` bytes.
#[derive(Debug)]
struct Lying {
    claimed: u64,
    asked: Mutex<Vec<u64>>,
}

impl OnRead for Lying {
    fn read(&self, name: &str, range: Option<(u64, u64)>) -> cairn_core::storage::Result<()> {
        match range {
            Some((offset, len)) if name.starts_with("data/") => {
                self.asked.lock().unwrap().push(len);
                Err(StorageError::Truncated {
                    name: name.to_string(),
                    location: "a lying store".to_string(),
                    offset,
                    len,
                    size: self.claimed,
                })
            }
            _ => Ok(()),
        }
    }
}

/// A read that runs past a pack's end is read again only up to a size inside the range
/// asked for: a store that claims a huge one is not asked for it (nor is the memory
/// allocated), and the blob is an error.
#[test]
fn a_store_that_claims_a_larger_pack_is_not_read_further() {
    let dir = tempfile::tempdir().unwrap();
    let repo_dir = dir.path().join("repo");
    let mut repo = repo(&repo_dir, None);
    let (_, blobs) = store_files(&mut repo, &[data(1, 3000), data(2, 3000)]);
    let storage = Arc::new(Watched {
        inner: LocalStorage::new(&repo_dir),
        hook: Lying {
            claimed: 1 << 40,
            asked: Mutex::new(Vec::new()),
        },
    });
    let repo = Repository::open(storage.clone(), b"pw".as_slice()).unwrap();
    assert!(repo.read_blob(&blobs[1]).is_err());
    let asked = storage.hook.asked.lock().unwrap();
    assert!(!asked.is_empty());
    assert!(asked.iter().all(|&len| len <= 2 * GRID), "{asked:?}");
}

/// Small blobs read one at a time, in the order they were written (a restore's walk
/// reading trees), read each cell of their pack once, not once per blob: the last few
/// windows read are kept, on a local store too.
#[test]
fn small_blobs_read_one_at_a_time_read_each_cell_once() {
    let dir = tempfile::tempdir().unwrap();
    let repo_dir = dir.path().join("repo");
    let mut repo = repo(&repo_dir, None);
    let files: Vec<Vec<u8>> = (0..300).map(|i| data(i, 1000)).collect();
    let writer = repo.blob_writer();
    let blobs: Vec<_> = (files.iter())
        .map(|bytes| writer.add(BlobKind::Tree, bytes).unwrap().0)
        .collect();
    let mut report = writer.finish().unwrap();
    repo.index_written(&mut report).unwrap();
    let storage = Arc::new(Watched {
        inner: LocalStorage::new(&repo_dir),
        hook: Recording::default(),
    });
    let repo = Repository::open(storage.clone(), b"pw".as_slice()).unwrap();
    for (blob, bytes) in blobs.iter().zip(&files) {
        assert_eq!(&repo.read_blob(blob).unwrap(), bytes);
    }
    let reads = storage.hook.0.lock().unwrap();
    let of_packs: Vec<_> = reads.iter().filter(|r| r.0.starts_with("data/")).collect();
    let read: u64 = of_packs.iter().map(|r| r.2).sum();
    let stored: u64 = (repo.list_packs().unwrap().iter())
        .map(|p| repo.storage().size(&p.storage_name()).unwrap())
        .sum();
    assert!(
        read <= stored && of_packs.len() as u64 <= stored / GRID,
        "{} reads of {read} bytes from packs of {stored}",
        of_packs.len()
    );
}
