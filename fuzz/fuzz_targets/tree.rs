//! Trees: postcard blobs (the blob layer is the `object` target's codec path).
#![no_main]

use cairn_core::tree::{is_safe_name, Tree};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(tree) = Tree::from_bytes(data) {
        assert_eq!(Tree::from_bytes(&tree.to_bytes()).unwrap(), tree);
        // What `ls` and restore do first with each node.
        for node in &tree.nodes {
            let _ = is_safe_name(&node.name);
            let _ = node.mtime.to_timestamp();
            let _ = node.ctime.to_timestamp();
        }
    }
});
