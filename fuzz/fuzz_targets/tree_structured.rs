//! Trees built from structure (names, kinds, content refs) rather than bytes: parsing
//! accepts exactly the trees whose names are safe, sorted and unique, and what consumes a
//! parsed tree (lookups by name, the byte ranges a read at any offset needs) holds up.
#![no_main]

use cairn_core::tree::{is_safe_name, next_named, NodeKind, Tree};
use cairn_fuzz::structured::ArbTree;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (ArbTree, u64, u32)| {
    let (arb, offset, size) = input;
    let tree = arb.tree();
    let well_formed = tree.nodes.iter().all(|n| is_safe_name(&n.name))
        && tree.nodes.windows(2).all(|w| w[0].name < w[1].name);
    let parsed = Tree::from_bytes(&tree.to_bytes());
    assert_eq!(parsed.is_ok(), well_formed, "{parsed:?}");
    let Ok(parsed) = parsed else { return };
    assert_eq!(parsed, tree);
    // Lookups rely on the order parsing now guarantees.
    let mut merged = parsed.nodes.iter().peekable();
    for node in &parsed.nodes {
        assert_eq!(parsed.find(&node.name), Some(node));
        assert_eq!(next_named(&mut merged, &node.name), Some(node));
    }
    for node in &parsed.nodes {
        if let NodeKind::File { content, .. } = &node.kind {
            cairn_fuzz::check_pieces(content, offset, u64::from(size));
        }
    }
});
