//! Trash files after decryption: JSON, and what a reader makes of several of them (the
//! highest generation, each pack with the highest generation that condemned it).
#![no_main]

use cairn_core::trash::{Trash, TrashFile};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = TrashFile::from_json(data) else {
        return;
    };
    let json = serde_json::to_vec(&file).expect("a trash file serializes");
    let again = TrashFile::from_json(&json).expect("a parsed trash file reparses");
    assert_eq!(again.packs.len(), file.packs.len());
    let mut trash = Trash::default();
    let (generation, packs) = (file.generation, file.packs.clone());
    trash.add("a".into(), file);
    trash.add("b".into(), again);
    assert_eq!(trash.generation, generation);
    assert_eq!(trash.observed(), Some(generation));
    for c in &packs {
        assert!(trash.is_condemned(&c.id));
        assert!(trash.packs[&c.id].generation >= c.generation);
    }
});
