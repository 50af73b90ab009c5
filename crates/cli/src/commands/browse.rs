//! `ls` and `cat`: read trees, and for `cat` the chunks of one file.

use std::io::Write;

use anyhow::Result;
use cairn_core::ops::browse::{self, Entry};
use cairn_core::tree::{Node, NodeKind};

use crate::args::{CatArgs, GlobalArgs, LsArgs};
use crate::{context, output};

pub fn ls(g: &GlobalArgs, a: LsArgs) -> Result<u8> {
    let repo = context::open(g)?;
    let (_, snapshot) = repo.find_snapshot(&a.snapshot)?;
    let start = a.path.as_deref().unwrap_or("/");
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
                output::local_time_ns(node.mtime_ns)
            )
            .map_err(io)?;
        }
        out.write_all(path).map_err(io)?;
        if let (true, NodeKind::Symlink { target }) = (a.long, &node.kind) {
            out.write_all(b" -> ").map_err(io)?;
            out.write_all(target).map_err(io)?;
        }
        out.write_all(b"\n").map_err(io)
    };
    match browse::find(&repo, &snapshot, start.as_bytes())? {
        Entry::Root(tree) => browse::walk(&repo, &tree, b"/", &mut show)?,
        Entry::Node(node) => {
            let path = normalized(start);
            show(path.as_bytes(), &node)?;
            if let NodeKind::Dir { subtree } = &node.kind {
                browse::walk(&repo, subtree, path.as_bytes(), &mut show)?;
            }
        }
    }
    if g.json {
        output::json(&json)?;
    }
    Ok(0)
}

fn normalized(path: &str) -> String {
    let names: Vec<String> = browse::path_names(path.as_bytes())
        .into_iter()
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect();
    format!("/{}", names.join("/"))
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
        "size": size_of(node),
        "uid": node.uid,
        "gid": node.gid,
        "user": node.user,
        "group": node.group,
        "mtime": jiff::Timestamp::from_nanosecond(node.mtime_ns as i128).ok(),
        "inode": node.inode,
        "links": node.links,
    });
    if let NodeKind::Symlink { target } = &node.kind {
        v["link_target"] = String::from_utf8_lossy(target).into();
    }
    v
}

pub fn cat(g: &GlobalArgs, a: CatArgs) -> Result<u8> {
    let repo = context::open(g)?;
    let (_, snapshot) = repo.find_snapshot(&a.snapshot)?;
    let node = match browse::find(&repo, &snapshot, a.path.as_bytes())? {
        Entry::Node(node) => node,
        Entry::Root(_) => return Err(cairn_core::Error::NotAFile { path: a.path }.into()),
    };
    let mut out = std::io::stdout().lock();
    browse::cat(&repo, &node, &a.path, &mut out)?;
    out.flush()?;
    Ok(0)
}
