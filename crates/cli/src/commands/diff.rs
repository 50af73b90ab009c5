//! `diff`: what changed between two snapshots, or a snapshot and a live directory.

use std::ffi::OsStr;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use cairn_core::ops::diff::{self, Change, ChangeKind, ContentDiff, DiffOptions, DiffSide};
use cairn_core::ops::select;
use cairn_core::snapshot::SnapshotFilter;
use cairn_core::Repository;

use crate::args::{DiffArgs, GlobalArgs};
use crate::{context, output};

pub fn run(g: &GlobalArgs, a: DiffArgs) -> Result<u8> {
    // Validate before opening the repository: which sides are directories.
    let (old_live, new_live) = (live_dir(&a.old)?, live_dir(&a.new)?);
    if old_live.is_some() && new_live.is_some() {
        anyhow::bail!(
            "Both {} and {} are directories; diff compares a snapshot with a snapshot or with a directory",
            Path::new(&a.old).display(),
            Path::new(&a.new).display()
        );
    }
    let live = old_live.as_ref().or(new_live.as_ref());
    let path = a.path.as_ref().map(|p| match live {
        Some(_) if !p.as_bytes().starts_with(b"/") => {
            absolute(Path::new(p)).as_os_str().as_bytes().to_vec()
        }
        _ => p.as_bytes().to_vec(),
    });
    let filter = super::snapshot_filter(&a.filter)?;
    let repo = context::open(g)?;
    let old = side(&repo, &a.old, old_live, &filter)?;
    let new = side(&repo, &a.new, new_live, &filter)?;
    let opts = DiffOptions {
        path,
        content: a.content,
        exclude: super::exclude_options(&a.exclude)?,
        ..DiffOptions::default()
    };
    let monitor = output::StderrMonitor;
    let report = diff::diff(&repo, &old, &new, &opts, &monitor).with_context(|| {
        format!(
            "Cannot compare {} with {}",
            Path::new(&a.old).display(),
            Path::new(&a.new).display()
        )
    })?;
    if g.json {
        let changes: Vec<_> = report.changes.iter().map(change_json).collect();
        output::json(&serde_json::json!({
            "changes": changes,
            "summary": report.summary,
            "problems": report.problems,
        }))?;
    } else {
        let mut out = std::io::stdout().lock();
        for c in &report.changes {
            print_change(&mut out, c)?;
        }
        let s = &report.summary;
        writeln!(
            out,
            "{} added, {} removed, {} modified, {} metadata only, {} type changed; {} added, {} removed",
            s.added,
            s.removed,
            s.modified,
            s.metadata_only,
            s.type_changed,
            output::size(s.bytes_added),
            output::size(s.bytes_removed)
        )?;
    }
    if !report.problems.is_empty() {
        eprintln!(
            "error: {} paths of the live directory could not be read (listed above) and are \
             left out",
            report.problems.len()
        );
        return Ok(1);
    }
    Ok(0)
}

/// Whether a side names a live directory: a path with a '/', `.` or `..`, or (when it
/// could not be a snapshot id) an existing directory. Returns it absolute and cleaned.
fn live_dir(arg: &OsStr) -> Result<Option<PathBuf>> {
    let bytes = arg.as_bytes();
    let looks_like_path = bytes.contains(&b'/') || bytes == b"." || bytes == b"..";
    let could_be_snapshot = bytes == b"latest" || bytes.iter().all(u8::is_ascii_hexdigit);
    let path = Path::new(arg);
    if !looks_like_path && (could_be_snapshot || !path.is_dir()) {
        return Ok(None);
    }
    let abs = absolute(path);
    let md = std::fs::symlink_metadata(&abs)
        .with_context(|| format!("Cannot compare with directory {}", abs.display()))?;
    if !md.is_dir() {
        anyhow::bail!(
            "{} is not a directory; diff compares a snapshot with a directory",
            abs.display()
        );
    }
    Ok(Some(abs))
}

/// Absolute and lexically cleaned, as backup records source paths (symlinks are kept).
fn absolute(path: &Path) -> PathBuf {
    cairn_core::ops::backup::lexical_absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

fn side(
    repo: &Repository,
    arg: &OsStr,
    live: Option<PathBuf>,
    filter: &SnapshotFilter,
) -> Result<DiffSide> {
    if let Some(dir) = live {
        return Ok(DiffSide::Live(dir));
    }
    let spec = arg.to_string_lossy();
    let (id, snapshot) = select::find_snapshot(repo, &spec, filter)?;
    Ok(DiffSide::Snapshot { id, snapshot })
}

fn print_change(out: &mut dyn Write, c: &Change) -> Result<()> {
    let size = |s: Option<u64>| s.map(output::size);
    let detail = match c.kind {
        ChangeKind::Added | ChangeKind::Removed => {
            let ty = c.new_type.or(c.old_type).unwrap_or("");
            size(c.new_size.or(c.old_size)).unwrap_or_else(|| ty.to_string())
        }
        ChangeKind::Modified => {
            let (old, new) = (
                size(c.old_size).unwrap_or_default(),
                size(c.new_size).unwrap_or_default(),
            );
            let mut d = format!("{old} → {new}");
            // Rounding would hide a small change (38.6 KiB → 38.6 KiB): give it exactly.
            if let (Some(a), Some(b)) = (c.old_size, c.new_size) {
                if old == new && a != b {
                    let sign = if b > a { '+' } else { '-' };
                    d.push_str(&format!(", {sign}{} B", a.abs_diff(b)));
                }
            }
            if !c.metadata.is_empty() {
                d.push_str("; also ");
                d.push_str(&c.metadata.join(", "));
            }
            d
        }
        ChangeKind::Metadata => c.metadata.join(", "),
        ChangeKind::TypeChanged => format!(
            "{} → {}",
            c.old_type.unwrap_or(""),
            c.new_type.unwrap_or("")
        ),
    };
    writeln!(
        out,
        "{}  {}  ({detail})",
        c.kind.letter(),
        output::name(&c.path)
    )?;
    match &c.content {
        Some(ContentDiff::Unified(text)) => out.write_all(text.as_bytes())?,
        Some(ContentDiff::Binary) => writeln!(out, "   binary file; no content diff")?,
        Some(ContentDiff::TooLarge) => writeln!(out, "   file too large; no content diff")?,
        None => {}
    }
    Ok(())
}

fn change_json(c: &Change) -> serde_json::Value {
    let (content_diff, content_note) = match &c.content {
        Some(ContentDiff::Unified(text)) => (Some(text.as_str()), None),
        Some(ContentDiff::Binary) => (None, Some("binary")),
        Some(ContentDiff::TooLarge) => (None, Some("too large")),
        None => (None, None),
    };
    serde_json::json!({
        "path": String::from_utf8_lossy(&c.path),
        "change": c.kind,
        "letter": c.kind.letter().to_string(),
        "old_type": c.old_type,
        "new_type": c.new_type,
        "old_size_bytes": c.old_size,
        "new_size_bytes": c.new_size,
        "metadata": c.metadata,
        "content_diff": content_diff,
        "content_note": content_note,
    })
}
