//! Helpers shared by the fuzz targets: a fixed master key, so the targets can seal the
//! fuzzer's bytes and reach the parsers that sit behind authentication.

use std::sync::OnceLock;

use cairn_core::crypto::MasterKey;
use cairn_core::keyfile::KdfParams;

/// One key for the whole process. Built from its serialized form so that it is the same in
/// every run; nothing here depends on its value, only on holding one.
pub fn key() -> &'static MasterKey {
    static KEY: OnceLock<MasterKey> = OnceLock::new();
    KEY.get_or_init(|| {
        let zeros = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
        let json = format!(r#"{{"data_key":"{zeros}","id_key":"{zeros}","chunker_seed":0}}"#);
        serde_json::from_str(&json).expect("the fixed key parses")
    })
}

/// Argon2 costs small enough to run on every fuzz input. `KeyFile::open` takes a key file's
/// costs as they are (up to 4 TiB of memory and 2^32 passes), so the targets must not
/// hand it anything bigger.
pub fn cheap_kdf(p: KdfParams) -> bool {
    p.memory_kib <= 256 && p.iterations <= 2 && p.parallelism <= 4
}

pub mod structured {
    //! Structure-aware inputs: trees and content refs built from the fuzzer's bytes
    //! through `arbitrary`, so that mutations change names, kinds and offsets rather than
    //! postcard framing (which the `tree` target covers byte by byte).

    use arbitrary::Arbitrary;
    use cairn_core::id::BlobId;
    use cairn_core::tree::{ContentRef, Node, NodeKind, Time, Tree, Xattr};

    /// A name as an attacker would pick one: mostly plain, sometimes one that restore,
    /// `dump` or mount must never join to a path.
    #[derive(Debug, Arbitrary)]
    pub enum ArbName {
        Plain(u8),
        Empty,
        Dot,
        DotDot,
        Climbing(u8),
        Absolute(u8),
        WithNul(u8),
        Control(u8),
        Bytes(Vec<u8>),
    }

    impl ArbName {
        pub fn bytes(&self) -> Vec<u8> {
            match self {
                ArbName::Plain(n) => format!("n{n}").into_bytes(),
                ArbName::Empty => Vec::new(),
                ArbName::Dot => b".".to_vec(),
                ArbName::DotDot => b"..".to_vec(),
                ArbName::Climbing(n) => format!("../n{n}").into_bytes(),
                ArbName::Absolute(n) => format!("/n{n}").into_bytes(),
                ArbName::WithNul(n) => format!("n{n}\0x").into_bytes(),
                ArbName::Control(n) => format!("\x1b[{n}m\n").into_bytes(),
                ArbName::Bytes(b) => b.clone(),
            }
        }
    }

    #[derive(Debug, Clone, Copy, Arbitrary)]
    pub struct ArbRef {
        pub blob: u8,
        pub offset: u32,
        pub len: u32,
    }

    impl ArbRef {
        pub fn content_ref(self) -> ContentRef {
            ContentRef {
                blob: BlobId([self.blob; 32]),
                offset: self.offset,
                len: self.len,
            }
        }
    }

    #[derive(Debug, Arbitrary)]
    pub enum ArbKind {
        File { size: u64, refs: Vec<ArbRef> },
        Dir(u8),
        Symlink(Vec<u8>),
        Fifo,
        Socket,
        CharDevice(u64),
        BlockDevice(u64),
    }

    #[derive(Debug, Arbitrary)]
    pub struct ArbNode {
        pub name: ArbName,
        pub kind: ArbKind,
        pub mode: u32,
        pub ids: (u32, u32),
        pub owner: Option<(String, String)>,
        pub times: ((i64, u32), (i64, u32)),
        pub inode: (u64, u64, u64),
        pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    }

    /// A tree: nodes, and whether to sort them by name first (as every writer does).
    #[derive(Debug, Arbitrary)]
    pub struct ArbTree {
        pub nodes: Vec<ArbNode>,
        pub sorted: bool,
    }

    impl ArbTree {
        pub fn tree(&self) -> Tree {
            let mut nodes: Vec<Node> = self.nodes.iter().map(node).collect();
            if self.sorted {
                nodes.sort_by(|a, b| a.name.cmp(&b.name));
            }
            Tree { nodes }
        }
    }

    fn node(n: &ArbNode) -> Node {
        let kind = match &n.kind {
            ArbKind::File { size, refs } => NodeKind::File {
                size: *size,
                content: refs.iter().map(|r| r.content_ref()).collect(),
            },
            ArbKind::Dir(b) => NodeKind::Dir {
                subtree: BlobId([*b; 32]),
            },
            ArbKind::Symlink(t) => NodeKind::Symlink { target: t.clone() },
            ArbKind::Fifo => NodeKind::Fifo,
            ArbKind::Socket => NodeKind::Socket,
            ArbKind::CharDevice(r) => NodeKind::CharDevice { rdev: *r },
            ArbKind::BlockDevice(r) => NodeKind::BlockDevice { rdev: *r },
        };
        let time = |(sec, nsec): (i64, u32)| Time { sec, nsec };
        Node {
            name: n.name.bytes(),
            kind,
            mode: n.mode,
            uid: n.ids.0,
            gid: n.ids.1,
            user: n.owner.as_ref().map(|o| o.0.clone()),
            group: n.owner.as_ref().map(|o| o.1.clone()),
            mtime: time(n.times.0),
            ctime: time(n.times.1),
            inode: n.inode.0,
            device: n.inode.1,
            links: n.inode.2,
            xattrs: n
                .xattrs
                .iter()
                .map(|(name, value)| Xattr {
                    name: name.clone(),
                    value: value.clone(),
                })
                .collect(),
        }
    }
}

/// Checks [`ContentIndex::pieces`](cairn_core::tree::ContentIndex::pieces) for a read of
/// `size` bytes at `offset` against a model that walks the file byte by byte (for small
/// files) and against its own invariants (for any).
pub fn check_pieces(content: &[cairn_core::tree::ContentRef], offset: u64, size: u64) {
    use cairn_core::tree::ContentIndex;
    let index = ContentIndex::new(content);
    let total: u64 = content.iter().map(|c| u64::from(c.len)).sum();
    assert_eq!(index.len(), total);
    let pieces = index.pieces(content, offset, size);
    let want = total
        .min(offset.saturating_add(size))
        .saturating_sub(offset);
    let got: u64 = pieces.iter().map(|p| p.blob_range.len() as u64).sum();
    assert_eq!(got, want, "bytes returned for {offset}+{size} of {total}");
    let mut last_part = None;
    for p in &pieces {
        let c = content[p.part];
        assert!(!p.blob_range.is_empty(), "an empty piece");
        assert!(last_part < Some(p.part), "pieces out of order");
        last_part = Some(p.part);
        let (lo, hi) = (c.offset as u64, c.offset as u64 + u64::from(c.len));
        assert!(
            p.blob_range.start as u64 >= lo && p.blob_range.end as u64 <= hi,
            "piece outside its ref"
        );
    }
    // The model: byte k of the file is byte (ref offset + k - ref start) of the ref's
    // blob; each byte of the read must come from there.
    if total <= 1 << 16 && want <= 1 << 12 {
        let mut model = Vec::new();
        let mut start = 0u64;
        for (i, c) in content.iter().enumerate() {
            for k in 0..u64::from(c.len) {
                let at = start + k;
                if at >= offset && at < offset + want {
                    model.push((i, c.offset as u64 + k));
                }
            }
            start += u64::from(c.len);
        }
        let read: Vec<(usize, u64)> = pieces
            .iter()
            .flat_map(|p| p.blob_range.clone().map(move |b| (p.part, b as u64)))
            .collect();
        assert_eq!(read, model);
    }
}
