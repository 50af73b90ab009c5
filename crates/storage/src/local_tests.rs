use std::fs;
use std::io;

use super::*;
use crate::testsuite;
use crate::UnnamedWrite;

fn store() -> (tempfile::TempDir, LocalStorage) {
    let dir = tempfile::tempdir().unwrap();
    let storage = LocalStorage::new(dir.path().join("repo"));
    (dir, storage)
}

/// Every file under `root`, temporary or not.
fn all_files(root: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files
}

#[test]
fn local_storage_passes_the_conformance_suite() {
    let (_dir, storage) = store();
    testsuite::run_all(&storage);
    let leftovers: Vec<_> = all_files(storage.root())
        .into_iter()
        .filter(|p| p.to_string_lossy().contains(TEMP_PREFIX))
        .collect();
    assert!(
        leftovers.is_empty(),
        "temporary files left behind: {leftovers:?}"
    );
}

#[test]
fn new_creates_nothing_and_a_missing_root_is_an_empty_store() {
    let (_dir, storage) = store();
    assert!(!storage.root().exists());
    assert_eq!(storage.list("").unwrap(), Vec::<String>::new());
    assert!(!storage.exists("config").unwrap());
    assert!(matches!(
        storage.read("config"),
        Err(StorageError::NotFound { .. })
    ));
    assert!(!storage.root().exists());
}

#[test]
fn write_creates_the_root_and_parent_directories() {
    let (_dir, storage) = store();
    storage.write("data/ab/ab12", b"chunk").unwrap();
    assert_eq!(
        fs::read(storage.root().join("data/ab/ab12")).unwrap(),
        b"chunk"
    );
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn new_files_are_private_to_their_owner_and_so_are_new_directories() {
    let (_dir, storage) = store();
    storage.write("keys/ab12", b"key").unwrap();
    storage.write("data/ab/ab12", b"chunk").unwrap();
    let root = storage.root();
    assert_eq!(mode(&root.join("keys/ab12")), 0o600);
    assert_eq!(mode(&root.join("data/ab/ab12")), 0o600);
    for dir in ["", "keys", "data", "data/ab"] {
        assert_eq!(mode(&root.join(dir)), 0o700, "directory {dir:?}");
    }
}

#[test]
fn existing_directories_and_files_keep_their_modes() {
    use std::os::unix::fs::PermissionsExt;
    let (_dir, storage) = store();
    let root = storage.root();
    fs::create_dir_all(root.join("data/ab")).unwrap();
    fs::write(root.join("config"), b"{}").unwrap();
    for path in [root.to_path_buf(), root.join("data"), root.join("data/ab")] {
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    }
    fs::set_permissions(root.join("config"), fs::Permissions::from_mode(0o644)).unwrap();
    storage.write("data/ab/ab12", b"chunk").unwrap();
    storage.write("data/cd/cd12", b"chunk").unwrap();
    assert_eq!(mode(&root.join("data/ab")), 0o755);
    assert_eq!(mode(&root.join("config")), 0o644);
    assert_eq!(mode(&root.join("data/ab/ab12")), 0o600);
    assert_eq!(mode(&root.join("data/cd")), 0o700);
    assert_eq!(mode(&root.join("data/cd/cd12")), 0o600);
}

#[test]
fn leftover_temporary_file_from_a_crash_is_not_listed() {
    let (_dir, storage) = store();
    storage.write("data/ab/ab12", b"chunk").unwrap();
    fs::write(storage.root().join("data/ab/.tmp-xyz"), b"half").unwrap();
    fs::create_dir_all(storage.root().join("data/cd")).unwrap();
    fs::write(storage.root().join("data/cd/.tmp-0123456789abcdef"), b"").unwrap();
    assert_eq!(storage.list("data").unwrap(), ["data/ab/ab12"]);
    assert_eq!(storage.list("").unwrap(), ["data/ab/ab12"]);
}

#[test]
fn temporaries_lists_and_deletes_leftover_temporary_files_only() {
    let (_dir, storage) = store();
    storage.write("data/ab/ab12", b"chunk").unwrap();
    fs::write(storage.root().join("data/ab/.tmp-xyz"), b"half").unwrap();
    fs::write(storage.root().join(".tmp-0a"), b"").unwrap();
    let mut names: Vec<String> = storage
        .temporaries()
        .unwrap()
        .into_iter()
        .map(|t| t.0)
        .collect();
    names.sort();
    assert_eq!(names, [".tmp-0a", "data/ab/.tmp-xyz"]);
    storage.delete_temporary("data/ab/.tmp-xyz").unwrap();
    assert!(!storage.root().join("data/ab/.tmp-xyz").exists());
    assert!(matches!(
        storage.delete_temporary("data/ab/ab12"),
        Err(StorageError::InvalidName { .. })
    ));
    assert_eq!(storage.list("").unwrap(), ["data/ab/ab12"]);
}

#[test]
fn files_no_valid_name_could_have_written_are_not_listed() {
    let (_dir, storage) = store();
    storage.write("keys/k1", b"key").unwrap();
    fs::write(storage.root().join("keys/k1 copy"), b"").unwrap();
    assert_eq!(storage.list("keys").unwrap(), ["keys/k1"]);
}

#[cfg(unix)]
#[test]
fn listing_follows_a_symlinked_directory() {
    let (dir, storage) = store();
    let elsewhere = LocalStorage::new(dir.path().join("elsewhere"));
    elsewhere.write("ab/ab12", b"chunk").unwrap();
    fs::create_dir_all(storage.root()).unwrap();
    std::os::unix::fs::symlink(elsewhere.root(), storage.root().join("data")).unwrap();
    assert_eq!(storage.list("").unwrap(), ["data/ab/ab12"]);
    assert_eq!(storage.read("data/ab/ab12").unwrap(), b"chunk");
}

#[test]
fn failed_write_leaves_nothing_behind() {
    let (_dir, storage) = store();
    storage.write("config", b"x").unwrap();
    // "config" is a file, so no directory can be made there.
    let err = storage.write("config/inner", b"y").unwrap_err();
    assert!(matches!(err, StorageError::Io { .. }), "{err:?}");
    assert_eq!(all_files(storage.root()), [storage.root().join("config")]);
}

#[test]
fn error_messages_name_the_object_and_the_location() {
    let (_dir, storage) = store();
    let location = storage.root().display().to_string();
    let err = storage.read("data/ab/ab12").unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("Object data/ab/ab12 not found in {location}")
    );
    storage.write("config", b"x").unwrap();
    let err = storage.write("config/inner", b"y").unwrap_err();
    assert!(err.to_string().starts_with("Cannot "), "{err}");
    assert!(err.to_string().contains(&location), "{err}");
    assert!(std::error::Error::source(&err).is_some());
}

#[test]
fn full_disk_and_quota_errors_become_no_space() {
    assert!(is_no_space(&io::Error::from_raw_os_error(28)));
    #[cfg(target_os = "linux")]
    assert!(is_no_space(&io::Error::from_raw_os_error(122)));
    assert!(!is_no_space(&io::Error::from_raw_os_error(13)));
    let (_dir, storage) = store();
    let err = storage.write_error("write", "data/ab/ab12", io::Error::from_raw_os_error(28));
    assert!(matches!(err, StorageError::NoSpace { .. }));
    assert_eq!(
        err.to_string(),
        format!(
            "The disk holding the repository {} is full: nothing was written for data/ab/ab12",
            storage.location()
        )
    );
}

#[test]
fn ranged_reads_of_a_deleted_and_rewritten_object_see_the_new_one() {
    let (_dir, storage) = store();
    storage.write("data/ab/ab12", b"first version").unwrap();
    assert_eq!(
        storage.read_range("data/ab/ab12", 6, 7).unwrap(),
        b"version"
    );
    storage.delete("data/ab/ab12").unwrap();
    assert!(matches!(
        storage.read_range("data/ab/ab12", 0, 5),
        Err(StorageError::NotFound { .. })
    ));
    storage
        .write("data/ab/ab12", b"second, longer version")
        .unwrap();
    assert_eq!(storage.read_range("data/ab/ab12", 0, 6).unwrap(), b"second");
    assert!(matches!(
        storage.read_range("data/ab/ab12", 20, 5),
        Err(StorageError::Truncated { size: 22, .. })
    ));
}

#[test]
fn more_objects_than_are_kept_open_all_read_back() {
    let (_dir, storage) = store();
    let names: Vec<String> = (0..KEPT_OPEN * 2 + 3)
        .map(|i| format!("data/{:02x}/obj{i}", i % 4))
        .collect();
    for (i, name) in names.iter().enumerate() {
        storage
            .write(name, format!("object {i}").as_bytes())
            .unwrap();
    }
    for _ in 0..2 {
        for (i, name) in names.iter().enumerate() {
            let want = format!("object {i}");
            let got = storage.read_range(name, 0, want.len() as u64).unwrap();
            assert_eq!(got, want.as_bytes(), "{name}");
        }
    }
    assert!(storage.open.lock().unwrap().len() <= KEPT_OPEN);
}

/// The bytes of an unnamed write read back exactly under the name it is committed as,
/// whatever their size (around the 1 MiB steps of writeback) and however
/// they were given; nothing is left beside them.
#[test]
fn an_unnamed_write_reads_back_under_its_name() {
    let (_dir, storage) = store();
    for (i, size) in [0, 1, 4095, 4097, (1 << 20) - 1, 1 << 20, (3 << 20) + 4099]
        .into_iter()
        .enumerate()
    {
        let data: Vec<u8> = (0..size).map(|b| (b * 13 + i) as u8).collect();
        let mut write = storage.begin_unnamed_write("data").unwrap();
        for piece in data.chunks(65_537) {
            write.write_all(piece).unwrap();
        }
        let name = format!("data/{i:02x}/object{i}");
        Box::new(write).commit_as(&name).unwrap();
        assert_eq!(storage.read(&name).unwrap(), data, "size {size}");
    }
    assert!(storage.temporaries().unwrap().is_empty());
    assert_eq!(storage.list("").unwrap().len(), 7);
}

/// Dropped without a commit, an unnamed write leaves no file; until then its temporary
/// file is one that `temporaries` finds (what a crash would leave), never listed.
#[test]
fn an_unnamed_write_not_committed_leaves_only_a_temporary_file_and_that_until_dropped() {
    let (_dir, storage) = store();
    let mut write = storage.begin_unnamed_write("data").unwrap();
    write.write_all(&vec![7; 3 << 20]).unwrap();
    let temporaries = storage.temporaries().unwrap();
    assert_eq!(temporaries.len(), 1, "{temporaries:?}");
    assert!(
        temporaries[0].0.starts_with("data/.tmp-"),
        "{temporaries:?}"
    );
    assert!(storage.list("").unwrap().is_empty());
    drop(write);
    assert!(storage.temporaries().unwrap().is_empty());
    assert_eq!(all_files(storage.root()), Vec::<PathBuf>::new());
}

/// A name taken, or outside the directory the write began in, is refused, and the
/// existing object is untouched.
#[test]
fn an_unnamed_write_commits_only_to_a_free_name_below_its_directory() {
    let (_dir, storage) = store();
    storage.write("data/ab/ab12", b"first").unwrap();
    let mut write = Box::new(storage.begin_unnamed_write("data").unwrap());
    write.write_all(b"second").unwrap();
    let err = write.commit_as("data/ab/ab12").unwrap_err();
    assert!(matches!(err, StorageError::AlreadyExists { .. }), "{err:?}");
    assert_eq!(storage.read("data/ab/ab12").unwrap(), b"first");
    let write = Box::new(storage.begin_unnamed_write("data").unwrap());
    let err = write.commit_as("index/ab12").unwrap_err();
    assert!(matches!(err, StorageError::InvalidName { .. }), "{err:?}");
    assert_eq!(storage.list("").unwrap(), ["data/ab/ab12"]);
    assert!(storage.temporaries().unwrap().is_empty());
}
