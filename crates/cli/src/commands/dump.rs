//! `dump`: one file of a snapshot to stdout as it is, or a directory (or any entry, with
//! `--archive`) as a tar or zip stream. Contents stream one chunk at a time, so memory does
//! not grow with file size; tar needs no seeking, and zip writes data descriptors when the
//! output cannot seek (a pipe) and a plain archive when it can (`--output FILE`).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, IsTerminal, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use anyhow::{bail, Context, Result};
use cairn_core::ops::browse::{self, Entry, FileReader};
use cairn_core::tree::{Node, NodeKind, Time};
use cairn_core::Repository;

use crate::args::{ArchiveFormat, DumpArgs, GlobalArgs};

pub fn run(g: &GlobalArgs, a: DumpArgs) -> Result<u8> {
    let filter = super::snapshot_filter(&a.filter)?;
    let repo = crate::context::open(g)?;
    let (id, snapshot) = cairn_core::ops::select::find_snapshot(&repo, &a.snapshot, &filter)?;
    let names = browse::path_names(a.path.as_bytes());
    let shown = format!("/{}", String::from_utf8_lossy(&names.join(&b'/')));
    let entry = browse::find(&repo, &snapshot, a.path.as_bytes())
        .map_err(|e| e.naming_snapshot(&id, &snapshot))?;
    let context = || format!("Cannot dump {shown} of snapshot {}", id.short());

    if let (
        Entry::Node(
            node @ Node {
                kind: NodeKind::File { .. },
                ..
            },
        ),
        None,
    ) = (&entry, a.archive)
    {
        let mut out = open_output(a.output.as_deref(), false)?;
        io::copy(&mut FileReader::new(&repo, node, &shown)?, &mut out).with_context(context)?;
        out.flush().with_context(context)?;
        return Ok(0);
    }

    let format = a.archive.unwrap_or(ArchiveFormat::Tar);
    // Entries are named relative to the parent of the dumped path, as `tar -C parent name`
    // would name them, so unpacking makes one directory (or file) of the same name.
    let base: Vec<u8> = names.last().map(|n| n.to_vec()).unwrap_or_default();
    let root = match &entry {
        Entry::Root(tree) => RootEntry::Tree(*tree),
        Entry::Node(node) => RootEntry::Node(node.clone()),
    };
    let out = open_output(a.output.as_deref(), true)?;
    let left_out = match format {
        ArchiveFormat::Tar => write_tar(&repo, &root, &base, out),
        ArchiveFormat::Zip => write_zip(&repo, &root, &base, out, a.output.is_some()),
    }
    .with_context(context)?;
    if left_out > 0 {
        eprintln!(
            "warning: {left_out} entries could not be stored in a {} archive (listed above)",
            if format == ArchiveFormat::Tar {
                "tar"
            } else {
                "zip"
            }
        );
        return Ok(crate::EXIT_PARTIAL);
    }
    Ok(0)
}

enum RootEntry {
    /// The snapshot's root: only its contents are archived.
    Tree(cairn_core::id::BlobId),
    Node(Node),
}

/// Stdout, or a new file. Archives are binary: refuse to send one to a terminal.
fn open_output(path: Option<&Path>, archive: bool) -> Result<Box<dyn WriteSeek>> {
    match path {
        Some(p) => {
            let f = File::create(p).with_context(|| format!("Cannot create {}", p.display()))?;
            Ok(Box::new(f))
        }
        None => {
            if archive && io::stdout().is_terminal() {
                bail!(
                    "Refusing to write an archive to a terminal; redirect standard output \
                     (`> out.tar`) or pass --output FILE"
                );
            }
            Ok(Box::new(NoSeek(io::stdout().lock())))
        }
    }
}

/// A writer that may or may not seek; stdout cannot, so it says so on every seek.
trait WriteSeek: Write + io::Seek {}
impl<T: Write + io::Seek> WriteSeek for T {}

struct NoSeek<W>(W);

impl<W: Write> Write for NoSeek<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

impl<W> io::Seek for NoSeek<W> {
    fn seek(&mut self, _: io::SeekFrom) -> io::Result<u64> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "standard output cannot seek",
        ))
    }
}

/// Calls `visit` for the dumped entry (unless it is the snapshot root) and everything
/// below it, with archive paths (relative, `/`-separated).
fn walk_entries(
    repo: &Repository,
    root: &RootEntry,
    base: &[u8],
    visit: &mut dyn FnMut(&[u8], &Node) -> cairn_core::Result<()>,
) -> cairn_core::Result<()> {
    let mut relative =
        |path: &[u8], node: &Node| visit(path.strip_prefix(b"/").unwrap_or(path), node);
    match root {
        RootEntry::Tree(tree) => browse::walk(repo, tree, b"", &mut relative),
        RootEntry::Node(node) => {
            relative(base, node)?;
            match &node.kind {
                NodeKind::Dir { subtree } => browse::walk(repo, subtree, base, &mut relative),
                _ => Ok(()),
            }
        }
    }
}

fn io_error(path: &[u8], source: io::Error) -> cairn_core::Error {
    cairn_core::Error::Io {
        path: OsStr::from_bytes(path).into(),
        source,
    }
}

fn warn_left_out(path: &[u8], why: &str) {
    eprintln!(
        "warning: left out {}: {}",
        crate::output::name(path),
        crate::output::message(why)
    );
}

// ---------------------------------------------------------------------------------------
// tar
// ---------------------------------------------------------------------------------------

fn write_tar(
    repo: &Repository,
    root: &RootEntry,
    base: &[u8],
    out: Box<dyn WriteSeek>,
) -> cairn_core::Result<u64> {
    let mut tar = tar::Builder::new(out);
    // (device, inode) of a hard-linked file → the archive path it was first stored under.
    let mut first_paths: HashMap<(u64, u64), Vec<u8>> = HashMap::new();
    let mut left_out = 0;
    walk_entries(repo, root, base, &mut |path, node| {
        let stored = tar_entry(repo, &mut tar, path, node, &mut first_paths)
            .map_err(|e| io_error(path, e))?;
        if !stored {
            warn_left_out(path, "tar cannot hold a socket");
            left_out += 1;
        }
        Ok(())
    })?;
    tar.into_inner()
        .and_then(|mut w| w.flush())
        .map_err(|e| io_error(b"<output>", e))?;
    Ok(left_out)
}

/// Appends one entry; false if tar cannot hold it.
fn tar_entry(
    repo: &Repository,
    tar: &mut tar::Builder<Box<dyn WriteSeek>>,
    path: &[u8],
    node: &Node,
    first_paths: &mut HashMap<(u64, u64), Vec<u8>>,
) -> io::Result<bool> {
    let mut h = tar::Header::new_gnu();
    h.set_mode(node.mode);
    h.set_uid(node.uid.into());
    h.set_gid(node.gid.into());
    h.set_mtime(node.mtime.sec.max(0) as u64);
    // Names longer than the header's 32 bytes are left out; the ids are always there.
    if let Some(user) = &node.user {
        let _ = h.set_username(user);
    }
    if let Some(group) = &node.group {
        let _ = h.set_groupname(group);
    }
    h.set_size(0);
    let name = Path::new(OsStr::from_bytes(path));
    let kind = match &node.kind {
        NodeKind::File { size, .. } => {
            if node.links > 1 {
                let key = (node.device, node.inode);
                if let Some(first) = first_paths.get(&key) {
                    append_pax_mtime(tar, node.mtime)?;
                    h.set_entry_type(tar::EntryType::Link);
                    tar.append_link(&mut h, name, Path::new(OsStr::from_bytes(first)))?;
                    return Ok(true);
                }
                first_paths.insert(key, path.to_vec());
            }
            append_pax_mtime(tar, node.mtime)?;
            h.set_entry_type(tar::EntryType::Regular);
            h.set_size(*size);
            let shown = String::from_utf8_lossy(path);
            let reader = FileReader::new(repo, node, &shown).map_err(io::Error::other)?;
            tar.append_data(&mut h, name, reader)?;
            return Ok(true);
        }
        NodeKind::Symlink { target } => {
            append_pax_mtime(tar, node.mtime)?;
            h.set_entry_type(tar::EntryType::Symlink);
            tar.append_link(&mut h, name, Path::new(OsStr::from_bytes(target)))?;
            return Ok(true);
        }
        NodeKind::Dir { .. } => tar::EntryType::Directory,
        NodeKind::Fifo => tar::EntryType::Fifo,
        NodeKind::CharDevice { rdev } | NodeKind::BlockDevice { rdev } => {
            h.set_device_major(libc::major(*rdev))?;
            h.set_device_minor(libc::minor(*rdev))?;
            if matches!(node.kind, NodeKind::CharDevice { .. }) {
                tar::EntryType::Char
            } else {
                tar::EntryType::Block
            }
        }
        NodeKind::Socket => return Ok(false),
    };
    append_pax_mtime(tar, node.mtime)?;
    h.set_entry_type(kind);
    tar.append_data(&mut h, name, io::empty())?;
    Ok(true)
}

/// A PAX extended header carrying the mtime with nanoseconds (and times before 1970),
/// which the plain header's whole seconds cannot hold; GNU tar and bsdtar apply it to the
/// entry that follows.
fn append_pax_mtime(tar: &mut tar::Builder<Box<dyn WriteSeek>>, t: Time) -> io::Result<()> {
    let value = if t.sec >= 0 || t.nsec == 0 {
        format!("{}.{:09}", t.sec, t.nsec)
    } else {
        // -5 s + 1 ns is -4.999999999 s.
        format!("-{}.{:09}", -(t.sec + 1), 1_000_000_000 - t.nsec)
    };
    let record = pax_record("mtime", &value);
    let mut h = tar::Header::new_ustar();
    h.set_path("PaxHeaders/entry")?;
    h.set_entry_type(tar::EntryType::XHeader);
    h.set_size(record.len() as u64);
    h.set_mode(0o644);
    h.set_cksum();
    tar.append(&h, record.as_bytes())
}

/// `LEN key=value\n`, where LEN counts the whole record including its own digits.
fn pax_record(key: &str, value: &str) -> String {
    let rest = key.len() + value.len() + 3; // space, '=', newline
    let mut len = rest + 1;
    while len != rest + len.to_string().len() {
        len = rest + len.to_string().len();
    }
    format!("{len} {key}={value}\n")
}

// ---------------------------------------------------------------------------------------
// zip
// ---------------------------------------------------------------------------------------

fn write_zip(
    repo: &Repository,
    root: &RootEntry,
    base: &[u8],
    out: Box<dyn WriteSeek>,
    seekable: bool,
) -> cairn_core::Result<u64> {
    // A pipe cannot seek back to fill in sizes, so the stream writer puts them in data
    // descriptors after each file's data instead.
    if seekable {
        zip_entries(repo, root, base, zip::ZipWriter::new(out))
    } else {
        zip_entries(repo, root, base, zip::ZipWriter::new_stream(out))
    }
}

fn zip_entries<W: Write + io::Seek>(
    repo: &Repository,
    root: &RootEntry,
    base: &[u8],
    mut zip: zip::ZipWriter<W>,
) -> cairn_core::Result<u64> {
    let mut left_out = 0;
    walk_entries(repo, root, base, &mut |path, node| {
        match zip_entry(repo, &mut zip, path, node).map_err(|e| io_error(path, e))? {
            None => {}
            Some(why) => {
                warn_left_out(path, why);
                left_out += 1;
            }
        }
        Ok(())
    })?;
    zip.finish()
        .map_err(|e| io_error(b"<output>", io::Error::other(e)))?
        .flush()
        .map_err(|e| io_error(b"<output>", e))?;
    Ok(left_out)
}

/// Adds one entry; returns why it was left out, if it was. Zip holds files, directories
/// and symlinks with their permission bits and a local time to 2 seconds; hard links
/// become separate copies, and owners are not kept.
fn zip_entry<W: Write + io::Seek>(
    repo: &Repository,
    zip: &mut zip::ZipWriter<W>,
    path: &[u8],
    node: &Node,
) -> io::Result<Option<&'static str>> {
    let Ok(name) = std::str::from_utf8(path) else {
        return Ok(Some("zip names must be UTF-8"));
    };
    let mut options = zip::write::SimpleFileOptions::default().unix_permissions(node.mode);
    if let Some(time) = zip_time(node.mtime) {
        options = options.last_modified_time(time);
    }
    match &node.kind {
        NodeKind::File { size, .. } => {
            let options = options
                .compression_method(zip::CompressionMethod::Deflated)
                .large_file(*size >= u32::MAX as u64);
            zip.start_file(name, options).map_err(io::Error::other)?;
            let mut reader = FileReader::new(repo, node, name).map_err(io::Error::other)?;
            io::copy(&mut reader, zip)?;
        }
        NodeKind::Dir { .. } => zip.add_directory(name, options).map_err(io::Error::other)?,
        NodeKind::Symlink { target } => {
            let Ok(target) = std::str::from_utf8(target) else {
                return Ok(Some("zip symlink targets must be UTF-8"));
            };
            zip.add_symlink(name, target, options)
                .map_err(io::Error::other)?
        }
        NodeKind::Fifo => return Ok(Some("zip cannot hold a FIFO")),
        NodeKind::Socket => return Ok(Some("zip cannot hold a socket")),
        NodeKind::CharDevice { .. } | NodeKind::BlockDevice { .. } => {
            return Ok(Some("zip cannot hold a device"))
        }
    }
    Ok(None)
}

/// The entry's time in UTC as zip's DOS time (1980 to 2107, even seconds).
fn zip_time(t: Time) -> Option<zip::DateTime> {
    let dt = t
        .to_timestamp()?
        .to_zoned(jiff::tz::TimeZone::UTC)
        .datetime();
    zip::DateTime::from_date_and_time(
        u16::try_from(dt.year()).ok()?,
        dt.month() as u8,
        dt.day() as u8,
        dt.hour() as u8,
        dt.minute() as u8,
        dt.second() as u8,
    )
    .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pax_records_count_their_own_length() {
        assert_eq!(pax_record("mtime", "1.5"), "13 mtime=1.5\n");
        let long = "x".repeat(95);
        let r = pax_record("k", &long);
        assert_eq!(r.len().to_string(), r.split(' ').next().unwrap());
    }
}
