//! The conformance suite every [`Storage`] backend must pass, so that core code can rely
//! on the trait's promises whatever the backend.
//!
//! A backend's tests build a store over an empty location and call [`run_all`]; a broken
//! promise panics with a message naming the store and the check. The suite only goes
//! through the trait, so backend-specific matters (such as leftover temporary files from a
//! crash) belong in the backend's own tests.

use std::collections::BTreeSet;

use crate::{Storage, StorageError};

/// Runs every check on `storage`, which must start empty. Panics on the first failure.
pub fn run_all(storage: &dyn Storage) {
    let mut suite = Suite {
        storage,
        written: BTreeSet::new(),
    };
    suite.round_trip();
    suite.read_range();
    suite.existing_name_is_not_overwritten();
    suite.concurrent_writes_of_one_name_have_one_winner();
    suite.list();
    suite.size_and_exists();
    suite.delete();
    suite.invalid_names_are_rejected();
    suite.listing_holds_exactly_what_was_written();
    suite.modification_times_follow_the_order_of_writes();
    suite.temporaries_are_only_temporary_names();
}

struct Suite<'a> {
    storage: &'a dyn Storage,
    /// Names that should exist now.
    written: BTreeSet<String>,
}

macro_rules! ensure {
    ($suite:expr, $cond:expr, $($msg:tt)+) => {
        if !$cond {
            $suite.fail(&format!($($msg)+));
        }
    };
}

impl Suite<'_> {
    fn fail(&self, message: &str) -> ! {
        panic!(
            "Storage conformance failure on {:?} at {}: {message}",
            self.storage,
            self.storage.location()
        )
    }

    fn ok<T>(&self, what: &str, result: crate::Result<T>) -> T {
        result.unwrap_or_else(|err| self.fail(&format!("{what} failed: {err}")))
    }

    fn write(&mut self, name: &str, data: &[u8]) {
        self.ok(&format!("write {name}"), self.storage.write(name, data));
        self.written.insert(name.to_owned());
    }

    fn expect_not_found<T: std::fmt::Debug>(
        &self,
        what: &str,
        name: &str,
        result: crate::Result<T>,
    ) {
        match result {
            Err(err @ StorageError::NotFound { .. }) => self.expect_message_names(&err, name),
            other => self.fail(&format!(
                "{what} of missing {name}: expected NotFound, got {other:?}"
            )),
        }
    }

    fn expect_message_names(&self, err: &StorageError, name: &str) {
        let message = err.to_string();
        let location = self.storage.location();
        ensure!(
            self,
            message.contains(name) && message.contains(&location),
            "message {message:?} should name the object {name} and the location {location}"
        );
    }

    fn round_trip(&mut self) {
        let big: Vec<u8> = (0..1_048_579u32).map(|i| (i % 251) as u8).collect();
        for (name, data) in [
            ("config", &b"hello"[..]),
            ("suite/round/empty", &[][..]),
            ("suite/round/big", &big[..]),
        ] {
            self.write(name, data);
            let read = self.ok(&format!("read {name}"), self.storage.read(name));
            ensure!(
                self,
                read == data,
                "read {name} gave {} bytes, not the {} written",
                read.len(),
                data.len()
            );
        }
        let missing = "suite/round/missing";
        self.expect_not_found("read", missing, self.storage.read(missing));
        self.expect_not_found(
            "read",
            "missing/deeper",
            self.storage.read("missing/deeper"),
        );
    }

    fn read_range(&mut self) {
        let name = "suite/range/object";
        let data: Vec<u8> = (0..1000u32).map(|i| (i % 256) as u8).collect();
        self.write(name, &data);
        let size = data.len() as u64;
        for (offset, len) in [(10, 20), (0, size), (size - 5, 5), (size, 0), (0, 0)] {
            let got = self.ok(
                &format!("read_range {name} {offset}+{len}"),
                self.storage.read_range(name, offset, len),
            );
            let want = &data[offset as usize..(offset + len) as usize];
            ensure!(
                self,
                got == want,
                "read_range {name} {offset}+{len} returned the wrong bytes"
            );
        }
        for (offset, len) in [(size - 5, 6), (size + 1, 0), (size, 1), (u64::MAX, 2)] {
            match self.storage.read_range(name, offset, len) {
                Err(StorageError::Truncated { offset: o, len: l, size: s, .. })
                    if (o, l, s) == (offset, len, size) => {}
                other => self.fail(&format!(
                    "read_range {name} {offset}+{len} past the end at {size}: expected Truncated, got {other:?}"
                )),
            }
        }
        // Into a reused buffer, longer or shorter than the range and holding other
        // bytes: it ends up holding exactly the range.
        let mut buf = vec![0xaa; 2000];
        for (offset, len) in [(10, 20), (0, size), (size - 5, 5), (3, 0), (0, size)] {
            let read = self
                .storage
                .read_range_into(name, offset, len, &mut buf)
                .map(|()| buf.clone());
            let got = self.ok(&format!("read_range_into {name} {offset}+{len}"), read);
            let want = &data[offset as usize..(offset + len) as usize];
            ensure!(
                self,
                got == want,
                "read_range_into {name} {offset}+{len} left the wrong bytes in the buffer"
            );
        }
        match self.storage.read_range_into(name, size - 5, 6, &mut buf) {
            Err(StorageError::Truncated { .. }) => {}
            other => self.fail(&format!(
                "read_range_into {name} past the end: expected Truncated, got {other:?}"
            )),
        }
        let missing = "suite/range/missing";
        self.expect_not_found(
            "read_range",
            missing,
            self.storage.read_range(missing, 0, 1),
        );
    }

    fn existing_name_is_not_overwritten(&mut self) {
        let name = "suite/exists/object";
        self.write(name, b"first");
        for data in [&b"second"[..], b"first"] {
            match self.storage.write(name, data) {
                Err(err @ StorageError::AlreadyExists { .. }) => {
                    self.expect_message_names(&err, name)
                }
                other => self.fail(&format!(
                    "second write of {name}: expected AlreadyExists, got {other:?}"
                )),
            }
        }
        let read = self.ok("read after a refused write", self.storage.read(name));
        ensure!(
            self,
            read == b"first",
            "a refused write changed {name} to {read:?}"
        );
    }

    fn concurrent_writes_of_one_name_have_one_winner(&mut self) {
        let name = "suite/race/object";
        let results: Vec<_> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8u8)
                .map(|i| {
                    let storage = self.storage;
                    scope.spawn(move || (i, storage.write(name, &vec![i; 100_000])))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("writer thread panicked"))
                .collect()
        });
        let winners: Vec<u8> = results
            .iter()
            .filter(|(_, r)| r.is_ok())
            .map(|(i, _)| *i)
            .collect();
        if self.storage.create_is_exclusive() {
            ensure!(
                self,
                winners.len() == 1,
                "{} of 8 racing writes of {name} succeeded",
                winners.len()
            );
        } else {
            ensure!(
                self,
                !winners.is_empty(),
                "none of 8 racing writes of {name} succeeded"
            );
        }
        for (i, result) in &results {
            ensure!(
                self,
                result.is_ok() || matches!(result, Err(StorageError::AlreadyExists { .. })),
                "racing write {i} of {name}: expected success or AlreadyExists, got {result:?}"
            );
        }
        self.written.insert(name.to_owned());
        let read = self.ok("read after racing writes", self.storage.read(name));
        // Whole, and one of the winners': never a mix or a partial file.
        ensure!(
            self,
            winners.iter().any(|&w| read == vec![w; 100_000]),
            "{name} does not hold a winning write whole"
        );
    }

    fn list(&mut self) {
        for name in [
            "suite/list/b/2",
            "suite/list/a/1",
            "suite/list/c",
            "suite/list/a/0",
            "suite/list2/x",
        ] {
            self.write(name, name.as_bytes());
        }
        let cases: [(&str, &[&str]); 4] = [
            (
                "suite/list",
                &[
                    "suite/list/a/0",
                    "suite/list/a/1",
                    "suite/list/b/2",
                    "suite/list/c",
                ],
            ),
            ("suite/list/a", &["suite/list/a/0", "suite/list/a/1"]),
            ("suite/nothing", &[]),
            ("suite/list/a/0/none", &[]),
        ];
        for (dir, want) in cases {
            let got = self.ok(&format!("list {dir}"), self.storage.list(dir));
            ensure!(
                self,
                got == want,
                "list {dir} gave {got:?}, expected {want:?}"
            );
        }
    }

    fn size_and_exists(&mut self) {
        let name = "suite/size/object";
        self.write(name, &[7; 4321]);
        let size = self.ok("size", self.storage.size(name));
        ensure!(
            self,
            size == 4321,
            "size of {name} is {size}, expected 4321"
        );
        ensure!(
            self,
            self.ok("exists", self.storage.exists(name)),
            "{name} should exist"
        );
        for missing in [
            "suite/size/missing",
            "suite/size/object/below",
            "suite/size",
        ] {
            self.expect_not_found("size", missing, self.storage.size(missing));
            let exists = self.ok("exists", self.storage.exists(missing));
            ensure!(self, !exists, "{missing} should not exist");
        }
    }

    fn delete(&mut self) {
        let name = "suite/delete/object";
        self.write(name, b"doomed");
        self.ok("delete", self.storage.delete(name));
        self.written.remove(name);
        ensure!(
            self,
            !self.ok("exists", self.storage.exists(name)),
            "{name} exists after delete"
        );
        self.expect_gone(name, "suite/delete");
        self.expect_not_found("size", name, self.storage.size(name));
        self.expect_not_found("delete", name, self.storage.delete(name));
        // A deleted name can be written again.
        self.write(name, b"reborn");
        let read = self.ok("read after rewrite", self.storage.read(name));
        ensure!(self, read == b"reborn", "rewritten {name} reads {read:?}");
        // Removed without waiting for durability: gone for every reader at once all the
        // same.
        self.ok("delete_unsynced", self.storage.delete_unsynced(name));
        self.written.remove(name);
        self.expect_gone(name, "suite/delete");
        self.expect_not_found("delete_unsynced", name, self.storage.delete_unsynced(name));
    }

    /// `name`, just deleted, can be neither read nor found by listing `dir`, which held
    /// only it.
    fn expect_gone(&mut self, name: &str, dir: &str) {
        self.expect_not_found("read", name, self.storage.read(name));
        let listed = self.ok("list", self.storage.list(dir));
        ensure!(
            self,
            listed.is_empty(),
            "deleted {name} is still listed: {listed:?}"
        );
    }

    fn invalid_names_are_rejected(&mut self) {
        let bad_names = [
            "",
            ".",
            "..",
            "/abs",
            "a//b",
            "a/../b",
            "../escape",
            "a/./b",
            "trailing/",
            "with space",
            "tab\tname",
            "back\\slash",
            "non-ascii-\u{e9}",
            ".tmp-0123",
            "data/.tmp-x",
        ];
        for name in bad_names {
            let s = self.storage;
            let results: [(&str, crate::Result<()>); 7] = [
                ("write", s.write(name, b"x")),
                ("read", s.read(name).map(drop)),
                ("read_range", s.read_range(name, 0, 0).map(drop)),
                ("size", s.size(name).map(drop)),
                ("exists", s.exists(name).map(drop)),
                ("delete", s.delete(name)),
                ("delete_unsynced", s.delete_unsynced(name)),
            ];
            for (op, result) in results {
                match result {
                    Err(StorageError::InvalidName { name: n, .. }) if n == name => {}
                    other => self.fail(&format!(
                        "{op} {name:?}: expected InvalidName, got {other:?}"
                    )),
                }
            }
            // The empty directory lists the whole store.
            if !name.is_empty() {
                match s.list(name) {
                    Err(StorageError::InvalidName { .. }) => {}
                    other => self.fail(&format!(
                        "list {name:?}: expected InvalidName, got {other:?}"
                    )),
                }
            }
        }
    }

    fn listing_holds_exactly_what_was_written(&mut self) {
        let listed = self.ok("list of the whole store", self.storage.list(""));
        let want: Vec<&String> = self.written.iter().collect();
        ensure!(
            self,
            listed.iter().collect::<Vec<_>>() == want,
            "list \"\" gave {listed:?}, expected {want:?}"
        );
    }

    /// Session heartbeats are judged by these times, compared with each other: a file
    /// written later must not look older, and every listed file has one.
    fn modification_times_follow_the_order_of_writes(&mut self) {
        self.write("times/first", b"1");
        // Past S3's one-second resolution of Last-Modified.
        std::thread::sleep(std::time::Duration::from_millis(1100));
        self.write("times/second", b"2");
        let listed = self.ok("list_modified times", self.storage.list_modified("times"));
        let names: Vec<&str> = listed.iter().map(|(n, _)| n.as_str()).collect();
        ensure!(
            self,
            names == ["times/first", "times/second"],
            "list_modified gave {names:?}"
        );
        ensure!(
            self,
            listed[1].1 > listed[0].1,
            "a file written 1.1 s later has time {:?}, the earlier one {:?}",
            listed[1].1,
            listed[0].1
        );
        let empty = self.ok(
            "list_modified of a missing dir",
            self.storage.list_modified("no-such-dir"),
        );
        ensure!(
            self,
            empty.is_empty(),
            "a missing directory listed {empty:?}"
        );
    }

    fn temporaries_are_only_temporary_names(&mut self) {
        let temps = self.ok("temporaries", self.storage.temporaries());
        ensure!(
            self,
            temps.is_empty(),
            "finished writes left temporary files {temps:?}"
        );
        for name in ["times/first", "../x", "data/.tmp-", ".tmp-a/b"] {
            ensure!(
                self,
                matches!(
                    self.storage.delete_temporary(name),
                    Err(StorageError::InvalidName { .. })
                ),
                "delete_temporary accepted {name:?}"
            );
        }
        ensure!(
            self,
            self.storage.exists("times/first").unwrap_or(false),
            "delete_temporary removed an object"
        );
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;
    use crate::LocalStorage;

    /// A store that breaks the create-only promise by replacing existing files.
    #[derive(Debug)]
    struct Overwriting(LocalStorage);

    impl Storage for Overwriting {
        fn location(&self) -> String {
            self.0.location()
        }
        fn read(&self, name: &str) -> crate::Result<Vec<u8>> {
            self.0.read(name)
        }
        fn read_range(&self, name: &str, offset: u64, len: u64) -> crate::Result<Vec<u8>> {
            self.0.read_range(name, offset, len)
        }
        fn write(&self, name: &str, data: &[u8]) -> crate::Result<()> {
            let _ = self.0.delete(name);
            self.0.write(name, data)
        }
        fn list(&self, dir: &str) -> crate::Result<Vec<String>> {
            self.0.list(dir)
        }
        fn list_modified(&self, dir: &str) -> crate::Result<Vec<(String, SystemTime)>> {
            self.0.list_modified(dir)
        }
        fn temporaries(&self) -> crate::Result<Vec<(String, SystemTime)>> {
            self.0.temporaries()
        }
        fn delete_temporary(&self, name: &str) -> crate::Result<()> {
            self.0.delete_temporary(name)
        }
        fn size(&self, name: &str) -> crate::Result<u64> {
            self.0.size(name)
        }
        fn exists(&self, name: &str) -> crate::Result<bool> {
            self.0.exists(name)
        }
        fn delete(&self, name: &str) -> crate::Result<()> {
            self.0.delete(name)
        }
    }

    #[test]
    #[should_panic(expected = "expected AlreadyExists")]
    fn suite_catches_a_store_that_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        run_all(&Overwriting(LocalStorage::new(dir.path())));
    }
}
