//! The local-directory backend, also used for repositories on mounted network shares.
//!
//! A write goes to a temporary file beside its target, is fsynced, then hard-linked into
//! place: `link` fails if the target exists, which makes creation atomic and create-only
//! without a separate check that could race. The directory is fsynced afterwards so the
//! new name survives a crash. Temporary files start with `.tmp-`, a prefix object names
//! may not use, so a crash can leave one behind but [`Storage::list`] never shows it.
//! An object whose name is known only at its end (a pack, [`Storage::begin_unnamed_write`])
//! is written to a temporary file in a directory above its target, then linked the same way.
//!
//! Files are created 0600 and directories 0700 (less if the umask says so): a repository
//! holds key files, which anyone who can read them can attack offline, password guess
//! after password guess. Files and directories that already exist keep their modes.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use std::time::SystemTime;

use crate::name::{is_temporary_name, valid_component, validate_name, TEMP_PREFIX};
use crate::pagecache;
use crate::writeback::{Writeback, EARLY_FROM};
use crate::{Result, Storage, StorageError, UnnamedWrite};

/// A store in a directory of the local file system.
#[derive(Debug, Clone)]
pub struct LocalStorage {
    root: PathBuf,
    open: Arc<Mutex<VecDeque<OpenFile>>>,
}

/// Files kept open for ranged reads, at most.
const KEPT_OPEN: usize = 16;

/// An object recently read by range, kept open with its size; the oldest is closed when
/// more are. An incremental backup reads thousands of trees from a few packs: opening,
/// sizing, seeking and closing the pack each time made five system calls of every
/// one-call read. Objects do not change once written (their names are create-only), so
/// a kept file is still the object until `delete` forgets it; one deleted by another
/// process still reads as it was.
#[derive(Debug)]
struct OpenFile {
    name: String,
    file: Arc<File>,
    size: u64,
}

impl LocalStorage {
    /// Wraps an existing or not-yet-existing directory; creates nothing. The first write
    /// creates the directory and any missing parents.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        LocalStorage {
            root: root.into(),
            open: Arc::default(),
        }
    }

    /// Object `name` open for reading, and its size.
    fn open_for_range(&self, name: &str) -> Result<(Arc<File>, u64)> {
        let lock = || self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(kept) = lock().iter().find(|o| o.name == name) {
            return Ok((Arc::clone(&kept.file), kept.size));
        }
        let (file, size) = self.open_object(name)?;
        let file = Arc::new(file);
        let mut open = lock();
        // Another reader may have kept it meanwhile.
        if open.iter().any(|o| o.name == name) {
            return Ok((file, size));
        }
        if open.len() >= KEPT_OPEN {
            open.pop_front();
        }
        open.push_back(OpenFile {
            name: name.to_owned(),
            file: Arc::clone(&file),
            size,
        });
        Ok((file, size))
    }

    /// Object `name` open for reading on its own (not shared with other readers), and its
    /// size: for serving it a piece at a time.
    pub fn open_object(&self, name: &str) -> Result<(File, u64)> {
        let path = self.path(name)?;
        let file = File::open(path).map_err(|err| self.read_error("open", name, err))?;
        let size = file
            .metadata()
            .map_err(|err| self.io_error("read the size of", name, err))?
            .len();
        Ok((file, size))
    }

    /// The error for a range of `name` past its end, as [`Storage::read_range`] gives.
    pub fn range_past_end(&self, name: &str, offset: u64, len: u64, size: u64) -> StorageError {
        self.truncated(name, offset, len, size)
    }

    /// The directory holding the store.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The path of a valid name.
    fn path(&self, name: &str) -> Result<PathBuf> {
        if !validate_name(name) {
            return Err(StorageError::InvalidName {
                name: name.to_owned(),
                location: self.location(),
            });
        }
        Ok(name
            .split('/')
            .fold(self.root.clone(), |path, c| path.join(c)))
    }

    fn io_error(&self, op: &'static str, name: &str, source: io::Error) -> StorageError {
        StorageError::Io {
            op,
            name: name.to_owned(),
            location: self.location(),
            source,
        }
    }

    /// For operations on an existing object: a missing file is `NotFound`.
    fn read_error(&self, op: &'static str, name: &str, source: io::Error) -> StorageError {
        if is_not_found(&source) {
            StorageError::NotFound {
                name: name.to_owned(),
                location: self.location(),
            }
        } else {
            self.io_error(op, name, source)
        }
    }

    /// For operations that create: a full disk or quota is `NoSpace`.
    fn write_error(&self, op: &'static str, name: &str, source: io::Error) -> StorageError {
        if is_no_space(&source) {
            StorageError::NoSpace {
                name: name.to_owned(),
                location: self.location(),
            }
        } else {
            self.io_error(op, name, source)
        }
    }

    fn truncated(&self, name: &str, offset: u64, len: u64, size: u64) -> StorageError {
        StorageError::Truncated {
            name: name.to_owned(),
            location: self.location(),
            offset,
            len,
            size,
        }
    }

    /// Creates `dir` and its missing ancestors, fsyncing each parent so the new
    /// directories survive a crash along with the file about to be linked into them.
    fn create_dirs(&self, dir: &Path, name: &str) -> Result<()> {
        let mut missing = Vec::new();
        let mut current = dir;
        loop {
            match fs::metadata(current) {
                Ok(_) => break,
                Err(err) if err.kind() == io::ErrorKind::NotFound => {
                    missing.push(current);
                    match current.parent() {
                        Some(parent) if !parent.as_os_str().is_empty() => current = parent,
                        _ => break,
                    }
                }
                Err(err) => return Err(self.write_error("create directory for", name, err)),
            }
        }
        for dir in missing.into_iter().rev() {
            match create_private_dir(dir) {
                Ok(()) => {}
                // Another writer got there first.
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
                Err(err) => return Err(self.write_error("create directory for", name, err)),
            }
            sync_dir(parent_dir(dir)).map_err(|err| self.write_error("sync", name, err))?;
        }
        Ok(())
    }

    /// Starts writing object `name`: its bytes go to a new temporary file beside it,
    /// given in pieces with [`PendingWrite::write_all`], and
    /// [`PendingWrite::commit`] makes it appear under its name, as [`Storage::write`]
    /// does. For bodies too large to hold in memory at once (the repository server
    /// streams uploads this way); dropped without `commit`, nothing is left behind.
    /// `len` is the size the object will have, if known (0 if not): objects of at least
    /// [`EARLY_FROM`] bytes have their writeback started as they are written (see
    /// [`crate::writeback`]).
    pub fn begin_write(&self, name: &str, len: u64) -> Result<PendingWrite> {
        let path = self.path(name)?;
        // Not needed for correctness (the link in `commit` decides), but spares writing
        // and syncing the data in the common case of a duplicate.
        if fs::symlink_metadata(&path).is_ok() {
            return Err(self.already_exists(name));
        }
        let dir = parent_dir(&path).to_owned();
        let temp = self.start_temp(&dir, name, len >= EARLY_FROM)?;
        Ok(PendingWrite {
            name: name.to_owned(),
            path,
            temp,
        })
    }

    /// A new temporary file in `dir` (created if missing) for object `name`; `large`: its
    /// writeback is started as it is written.
    fn start_temp(&self, dir: &Path, name: &str, large: bool) -> Result<TempWrite> {
        self.create_dirs(dir, name)?;
        let temp = dir.join(format!(
            "{TEMP_PREFIX}{}",
            hex::encode(rand::random::<[u8; 8]>())
        ));
        let mut options = OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, FILE_MODE);
        let file = options
            .open(&temp)
            .map_err(|err| self.write_error("create temporary file for", name, err))?;
        Ok(TempWrite {
            storage: self.clone(),
            file,
            writeback: large.then(Writeback::default),
            // From here on the guard removes the file on every error path.
            temp: TempFile { path: temp },
        })
    }

    /// Starts writing an object whose name is known only once its bytes are (a pack,
    /// named by the hash of its bytes): a temporary file in `dir`, its writeback
    /// started as it is written, which [`UnnamedWrite::commit_as`] links
    /// under its name. A crash leaves the temporary file where
    /// [`Storage::temporaries`] finds it.
    pub fn begin_unnamed_write(&self, dir: &str) -> Result<LocalUnnamedWrite> {
        let path = self.path(dir)?;
        let temp = self.start_temp(&path, dir, true)?;
        let temp_name = match temp.temp.path.file_name().and_then(|n| n.to_str()) {
            Some(file) => format!("{dir}/{file}"),
            None => dir.to_owned(),
        };
        Ok(LocalUnnamedWrite {
            dir: dir.to_owned(),
            temp_name,
            temp,
        })
    }

    fn already_exists(&self, name: &str) -> StorageError {
        StorageError::AlreadyExists {
            name: name.to_owned(),
            location: self.location(),
        }
    }
}

/// An object being written by [`LocalStorage::begin_write`].
#[derive(Debug)]
pub struct PendingWrite {
    name: String,
    path: PathBuf,
    temp: TempWrite,
}

impl PendingWrite {
    /// Appends `data` to the object's bytes.
    pub fn write_all(&mut self, data: &[u8]) -> Result<()> {
        self.temp.write_all(&self.name, data)
    }

    /// Makes the object durable under its name; [`StorageError::AlreadyExists`] if the
    /// name was taken meanwhile (the existing file is untouched).
    pub fn commit(self) -> Result<()> {
        self.temp.commit(&self.name, &self.path)
    }
}

/// An object being written by [`LocalStorage::begin_unnamed_write`].
#[derive(Debug)]
pub struct LocalUnnamedWrite {
    /// Where the object's name must lie: a hard link does not cross file systems, and a
    /// directory of the store may be a link to another disk.
    dir: String,
    /// The temporary file's name, for errors before the object has a name.
    temp_name: String,
    temp: TempWrite,
}

impl UnnamedWrite for LocalUnnamedWrite {
    fn write_all(&mut self, data: &[u8]) -> Result<()> {
        self.temp.write_all(&self.temp_name, data)
    }

    fn commit_as(self: Box<Self>, name: &str) -> Result<()> {
        let storage = &self.temp.storage;
        let path = storage.path(name)?;
        if !name
            .strip_prefix(self.dir.as_str())
            .is_some_and(|rest| rest.starts_with('/'))
        {
            return Err(StorageError::InvalidName {
                name: name.to_owned(),
                location: storage.location(),
            });
        }
        storage.create_dirs(parent_dir(&path), name)?;
        self.temp.commit(name, &path)
    }
}

/// The temporary file of an object being written.
#[derive(Debug)]
struct TempWrite {
    storage: LocalStorage,
    file: File,
    /// For a large object: how much of it is on its way to the device.
    writeback: Option<Writeback>,
    temp: TempFile,
}

impl TempWrite {
    /// Appends `data` to the bytes of object `name`.
    fn write_all(&mut self, name: &str, data: &[u8]) -> Result<()> {
        self.file
            .write_all(data)
            .map_err(|err| self.storage.write_error("write", name, err))?;
        if let Some(writeback) = &mut self.writeback {
            writeback.wrote(&self.file, data.len());
        }
        Ok(())
    }

    /// Makes the bytes durable as object `name` at `path`: fsync, link, fsync of the
    /// directory. [`StorageError::AlreadyExists`] if the name was taken meanwhile (the
    /// existing file is untouched).
    fn commit(self, name: &str, path: &Path) -> Result<()> {
        let TempWrite {
            storage,
            file,
            writeback,
            temp,
        } = self;
        file.sync_all()
            .map_err(|err| storage.write_error("sync", name, err))?;
        if writeback.is_some() {
            // Durable, and not read back soon.
            pagecache::drop_pages(&file, 0, 0);
        }
        drop(file);
        match fs::hard_link(&temp.path, path) {
            Ok(()) => {}
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {
                return Err(storage.already_exists(name))
            }
            Err(err) => return Err(storage.write_error("link", name, err)),
        }
        drop(temp);
        if let Err(err) = sync_dir(parent_dir(path)) {
            // The name may not survive a crash, so do not report it as written; removing
            // it keeps the promise that a failed write leaves nothing behind.
            let _ = fs::remove_file(path);
            return Err(storage.write_error("sync", name, err));
        }
        Ok(())
    }
}

/// Removes the temporary file when dropped, after success as on failure.
#[derive(Debug)]
struct TempFile {
    path: PathBuf,
}

impl Drop for TempFile {
    fn drop(&mut self) {
        // Best effort: if this fails too, `list` still never shows the file.
        let _ = fs::remove_file(&self.path);
    }
}

impl Storage for LocalStorage {
    fn location(&self) -> String {
        self.root.display().to_string()
    }

    fn read(&self, name: &str) -> Result<Vec<u8>> {
        let path = self.path(name)?;
        fs::read(path).map_err(|err| self.read_error("read", name, err))
    }

    fn read_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        let mut buf = Vec::new();
        self.read_range_into(name, offset, len, &mut buf)?;
        Ok(buf)
    }

    fn read_range_into(&self, name: &str, offset: u64, len: u64, buf: &mut Vec<u8>) -> Result<()> {
        let (file, size) = self.open_for_range(name)?;
        if len > size || offset > size - len {
            return Err(self.truncated(name, offset, len, size));
        }
        let len_in_memory = usize::try_from(len).map_err(|_| {
            self.io_error(
                "read",
                name,
                io::Error::other("Range does not fit in memory"),
            )
        })?;
        // A reused buffer costs neither an allocation nor a memset (only bytes beyond what
        // it held are zeroed); a new one comes zeroed from the allocator (calloc: fresh
        // pages need no memset).
        if buf.capacity() == 0 {
            *buf = vec![0; len_in_memory];
        } else {
            buf.resize(len_in_memory, 0);
        }
        match read_exact_at(&file, buf, offset) {
            Ok(()) => Ok(()),
            // The file shrank after we looked at its size.
            Err(err) if err.kind() == io::ErrorKind::UnexpectedEof => {
                Err(self.truncated(name, offset, len, size))
            }
            Err(err) => Err(self.io_error("read", name, err)),
        }
    }

    fn uncache(&self, name: &str, offset: u64, len: u64) {
        if let Ok((file, _)) = self.open_for_range(name) {
            pagecache::drop_pages(&file, offset, len);
        }
    }

    fn write(&self, name: &str, data: &[u8]) -> Result<()> {
        let mut pending = self.begin_write(name, data.len() as u64)?;
        pending.write_all(data)?;
        pending.commit()
    }

    fn begin_unnamed_write(&self, dir: &str) -> Option<Result<Box<dyn UnnamedWrite>>> {
        Some(
            LocalStorage::begin_unnamed_write(self, dir)
                .map(|w| Box::new(w) as Box<dyn UnnamedWrite>),
        )
    }

    fn list(&self, dir: &str) -> Result<Vec<String>> {
        let path = if dir.is_empty() {
            self.root.clone()
        } else {
            self.path(dir)?
        };
        let mut names = Vec::new();
        self.walk(&path, dir, Wanted::Objects, &mut names)?;
        names.sort_unstable();
        Ok(names)
    }

    fn list_modified(&self, dir: &str) -> Result<Vec<(String, SystemTime)>> {
        let mut out = Vec::new();
        for name in self.list(dir)? {
            match fs::metadata(self.path(&name)?).and_then(|m| m.modified()) {
                Ok(time) => out.push((name, time)),
                // Deleted since it was listed.
                Err(err) if is_not_found(&err) => {}
                Err(err) => return Err(self.io_error("stat", &name, err)),
            }
        }
        Ok(out)
    }

    fn temporaries(&self) -> Result<Vec<(String, SystemTime)>> {
        let mut names = Vec::new();
        self.walk(&self.root, "", Wanted::Temporaries, &mut names)?;
        let mut out = Vec::new();
        for name in names {
            match fs::symlink_metadata(self.root.join(&name)).and_then(|m| m.modified()) {
                Ok(time) => out.push((name, time)),
                Err(err) if is_not_found(&err) => {}
                Err(err) => return Err(self.io_error("stat", &name, err)),
            }
        }
        Ok(out)
    }

    fn delete_temporary(&self, name: &str) -> Result<()> {
        if !is_temporary_name(name) {
            return Err(StorageError::InvalidName {
                name: name.to_owned(),
                location: self.location(),
            });
        }
        fs::remove_file(self.root.join(name)).map_err(|err| self.read_error("delete", name, err))
    }

    fn size(&self, name: &str) -> Result<u64> {
        let path = self.path(name)?;
        let metadata = fs::metadata(path).map_err(|err| self.read_error("stat", name, err))?;
        if !metadata.is_file() {
            // A directory is not an object.
            return Err(self.read_error("stat", name, io::ErrorKind::NotFound.into()));
        }
        Ok(metadata.len())
    }

    fn exists(&self, name: &str) -> Result<bool> {
        let path = self.path(name)?;
        match fs::metadata(path) {
            Ok(metadata) => Ok(metadata.is_file()),
            Err(err) if is_not_found(&err) => Ok(false),
            Err(err) => Err(self.io_error("stat", name, err)),
        }
    }

    fn delete(&self, name: &str) -> Result<()> {
        self.delete_unsynced(name)?;
        let path = self.path(name)?;
        sync_dir(parent_dir(&path)).map_err(|err| self.io_error("sync", name, err))
    }

    fn delete_unsynced(&self, name: &str) -> Result<()> {
        let path = self.path(name)?;
        self.open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|o| o.name != name);
        fs::remove_file(&path).map_err(|err| self.read_error("delete", name, err))
    }
}

impl LocalStorage {
    /// Appends the names of the files below `path` (whose name is `prefix`) to `names`:
    /// objects, or temporary files.
    fn walk(
        &self,
        path: &Path,
        prefix: &str,
        wanted: Wanted,
        names: &mut Vec<String>,
    ) -> Result<()> {
        let list_error = |err: io::Error| self.io_error("list", prefix, err);
        let entries = match fs::read_dir(path) {
            Ok(entries) => entries,
            // A missing directory (or a file where one was expected) holds no objects.
            Err(err) if is_not_found(&err) => return Ok(()),
            Err(err) => return Err(list_error(err)),
        };
        for entry in entries {
            let entry = entry.map_err(list_error)?;
            let file_name = entry.file_name();
            let Some(file_name) = file_name.to_str() else {
                continue;
            };
            if wanted == Wanted::Temporaries && file_name.starts_with(TEMP_PREFIX) {
                let name = match prefix.is_empty() {
                    true => file_name.to_owned(),
                    false => format!("{prefix}/{file_name}"),
                };
                if is_temporary_name(&name) {
                    names.push(name);
                }
                continue;
            }
            // Skips temporary files, and anything else no valid name could have written
            // (non-UTF-8 names, editor backups with spaces, ...).
            if !valid_component(file_name) {
                continue;
            }
            let name = if prefix.is_empty() {
                file_name.to_owned()
            } else {
                format!("{prefix}/{file_name}")
            };
            let mut file_type = entry.file_type().map_err(list_error)?;
            if file_type.is_symlink() {
                // Follow links, e.g. a data directory moved to another disk.
                match fs::metadata(entry.path()) {
                    Ok(metadata) => file_type = metadata.file_type(),
                    Err(err) if is_not_found(&err) => continue,
                    Err(err) => return Err(self.io_error("list", &name, err)),
                }
            }
            if file_type.is_dir() {
                self.walk(&entry.path(), &name, wanted, names)?;
            } else if file_type.is_file() && wanted == Wanted::Objects {
                names.push(name);
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wanted {
    Objects,
    Temporaries,
}

#[cfg(unix)]
fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
}

#[cfg(windows)]
fn read_exact_at(file: &File, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
    use std::os::windows::fs::FileExt;
    while !buf.is_empty() {
        match file.seek_read(buf, offset)? {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
        }
    }
    Ok(())
}

/// The mode of new object files: readable and writable by their owner only.
#[cfg(unix)]
const FILE_MODE: u32 = 0o600;
/// The mode of new directories: their owner's only.
#[cfg(unix)]
const DIR_MODE: u32 = 0o700;

fn create_private_dir(dir: &Path) -> io::Result<()> {
    let mut builder = fs::DirBuilder::new();
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, DIR_MODE);
    builder.create(dir)
}

fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

/// Makes the directory's entries (new, renamed or removed names) durable.
#[cfg(unix)]
fn sync_dir(dir: &Path) -> io::Result<()> {
    match File::open(dir)?.sync_all() {
        // Some file systems (certain FUSE and network ones) cannot sync directories;
        // restic ignores these errors too, as there is nothing better to do.
        Err(err)
            if matches!(
                err.kind(),
                io::ErrorKind::InvalidInput | io::ErrorKind::Unsupported
            ) =>
        {
            Ok(())
        }
        result => result,
    }
}

/// Windows cannot open directories as files; NTFS journals its directory updates.
#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> io::Result<()> {
    Ok(())
}

/// A missing file, or a path through a file as if it were a directory (ENOTDIR).
fn is_not_found(err: &io::Error) -> bool {
    const ENOTDIR: i32 = 20;
    err.kind() == io::ErrorKind::NotFound || (cfg!(unix) && err.raw_os_error() == Some(ENOTDIR))
}

/// ENOSPC, or EDQUOT (122 on Linux, 69 on macOS and the BSDs).
fn is_no_space(err: &io::Error) -> bool {
    const ENOSPC: i32 = 28;
    const EDQUOT: i32 = if cfg!(any(target_os = "linux", target_os = "android")) {
        122
    } else {
        69
    };
    cfg!(unix) && matches!(err.raw_os_error(), Some(ENOSPC | EDQUOT))
}

#[cfg(test)]
#[path = "local_tests.rs"]
mod tests;
