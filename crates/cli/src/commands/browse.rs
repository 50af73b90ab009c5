//! `ls` and `cat`: read trees, and for `cat` the chunks of one file.

use std::io::Write;

use std::os::unix::ffi::OsStrExt;

use anyhow::{Context, Result};
use cairn_core::ops::browse::{self, Entry};
use cairn_core::ops::select;
use cairn_core::tree::{Node, NodeKind};

use crate::args::{CatArgs, GlobalArgs, LsArgs};
use crate::{context, output};

pub fn ls(g: &GlobalArgs, a: LsArgs) -> Result<u8> {
    let filter = super::snapshot_filter(&a.filter)?;
    let repo = context::open(g)?;
    let (id, snapshot) = select::find_snapshot(&repo, &a.snapshot, &filter)?;
    let start = a.path.as_deref().map_or(&b"/"[..], |p| p.as_bytes());
    let mut out = std::io::stdout().lock();
    let mut json = Vec::new();
    let mut show = |path: &[u8], node: &Node| -> cairn_core::Result<()> {
        if g.json {
            json.push(node_json(path, node));
            return Ok(());
        }
        let io = |e| cairn_core::Error::Io {
            path: "<stdout>".into(),
            source: e,
        };
        if a.long {
            let owner = node.user.clone().unwrap_or_else(|| node.uid.to_string());
            let group = node.group.clone().unwrap_or_else(|| node.gid.to_string());
            write!(
                out,
                "{} {:>8} {:>8} {:>12} {} ",
                output::mode_string(node.kind.name(), node.mode),
                owner,
                group,
                size_of(node),
                output::file_time(node.mtime)
            )
            .map_err(io)?;
        }
        // Escaped: names are the snapshot's, and may hold terminal escape sequences.
        write!(out, "{}", output::name(path)).map_err(io)?;
        if let (true, NodeKind::Symlink { target }) = (a.long, &node.kind) {
            write!(out, " -> {}", output::name(target)).map_err(io)?;
        }
        out.write_all(b"\n").map_err(io)
    };
    // Like ls(1): a directory's entries, one level; `--recursive`: the directory named
    // and everything below it.
    let below = if a.recursive {
        browse::walk
    } else {
        browse::list
    };
    match browse::find(&repo, &snapshot, start).map_err(|e| e.naming_snapshot(&id, &snapshot))? {
        Entry::Root(tree) => below(&repo, &tree, b"/", &mut show)?,
        Entry::Node(node) => {
            let path = normalized(start);
            match &node.kind {
                NodeKind::Dir { subtree } => {
                    if a.recursive {
                        show(&path, &node)?;
                    }
                    below(&repo, subtree, &path, &mut show)?;
                }
                _ => show(&path, &node)?,
            }
        }
    }
    if g.json {
        output::json(&serde_json::json!({
            "snapshot_id": id.to_hex(),
            "snapshot_short_id": id.short(),
            "entries": json,
        }))?;
    }
    Ok(0)
}

/// `/a/b` for `a//b/`, `./a/b` and the like.
fn normalized(path: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(path.len() + 1);
    for name in browse::path_names(path) {
        out.push(b'/');
        out.extend_from_slice(name);
    }
    if out.is_empty() {
        out.push(b'/');
    }
    out
}

fn size_of(node: &Node) -> u64 {
    match node.kind {
        NodeKind::File { size, .. } => size,
        _ => 0,
    }
}

fn node_json(path: &[u8], node: &Node) -> serde_json::Value {
    let mut v = serde_json::json!({
        "path": String::from_utf8_lossy(path),
        "name": String::from_utf8_lossy(&node.name),
        "type": node.kind.name(),
        "mode": node.mode,
        "size_bytes": size_of(node),
        "uid": node.uid,
        "gid": node.gid,
        "user": node.user,
        "group": node.group,
        "mtime": node.mtime.to_timestamp(),
        "inode": node.inode,
        "links": node.links,
    });
    v["link_target"] = match &node.kind {
        NodeKind::Symlink { target } => String::from_utf8_lossy(target).into(),
        _ => serde_json::Value::Null,
    };
    v
}

pub fn cat(g: &GlobalArgs, a: CatArgs) -> Result<u8> {
    let filter = super::snapshot_filter(&a.filter)?;
    let repo = context::open(g)?;
    let (id, snapshot) = select::find_snapshot(&repo, &a.snapshot, &filter)?;
    let shown = a.path.to_string_lossy().into_owned();
    let node = match browse::find(&repo, &snapshot, a.path.as_bytes())
        .map_err(|e| e.naming_snapshot(&id, &snapshot))?
    {
        Entry::Node(node) => node,
        Entry::Root(_) => return Err(cairn_core::Error::NotAFile { path: shown }.into()),
    };
    let mut out = std::io::stdout().lock();
    browse::cat(&repo, &node, &shown, &mut out)
        .with_context(|| format!("Cannot print {shown} of snapshot {}", id.short()))?;
    out.flush()?;
    Ok(0)
}
