use std::io::{Read, Write};

use super::*;

/// A file of `len` patterned bytes, durable, so that its pages are clean and can be
/// dropped.
fn durable_file(dir: &std::path::Path, len: usize) -> (std::path::PathBuf, Vec<u8>) {
    let path = dir.join("source");
    let data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
    let mut file = File::create(&path).unwrap();
    file.write_all(&data).unwrap();
    file.sync_all().unwrap();
    (path, data)
}

/// Reads all of `reader` in reads of an odd size, as the chunker's refills do not align.
fn read_all(reader: &mut ReadOnce) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = vec![0; 999_983];
    loop {
        let n = reader.read(&mut buf).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&buf[..n]);
    }
}

/// A file none of which was cached is read whole, its pages are dropped behind the
/// reader while it reads, and none are left once it is done.
#[test]
fn a_file_not_cached_is_read_whole_and_leaves_no_pages_behind() {
    let dir = tempfile::tempdir().unwrap();
    let (path, data) = durable_file(dir.path(), 5 * STEP as usize + 12_345);
    let file = File::open(&path).unwrap();
    drop_pages(&file, 0, 0);
    if cached_pages(&file, 0, 0) != Some(0) {
        eprintln!("skipped: cachestat(2) is not available here, or the pages stayed");
        return;
    }
    let mut reader = ReadOnce::new(file);
    assert!(reader.behind.is_some());
    let mut read = Vec::new();
    let mut buf = vec![0; 999_983];
    while read.len() < 3 * STEP as usize {
        let n = reader.read(&mut buf).unwrap();
        read.extend_from_slice(&buf[..n]);
    }
    let dropped = reader.behind.as_ref().unwrap().dropped;
    assert!(
        dropped >= 2 * STEP,
        "dropped up to {dropped} after reading {}",
        read.len()
    );
    assert_eq!(cached_pages(&reader.file, 0, dropped), Some(0));
    read.extend(read_all(&mut reader));
    assert!(read == data, "the bytes read differ from the file's");
    drop(reader);
    let file = File::open(&path).unwrap();
    assert_eq!(cached_pages(&file, 0, 0), Some(0));
}

/// A file that was cached when opened (someone's working set, a file just written)
/// keeps its pages.
#[test]
fn a_cached_file_keeps_its_pages() {
    let dir = tempfile::tempdir().unwrap();
    let (path, data) = durable_file(dir.path(), 2 * STEP as usize + 4096);
    let file = File::open(&path).unwrap();
    let Some(pages) = cached_pages(&file, 0, 0).filter(|&p| p > 0) else {
        eprintln!("skipped: cachestat(2) is not available here, or the file is not cached");
        return;
    };
    let mut reader = ReadOnce::new(file);
    assert!(reader.behind.is_none());
    assert!(
        read_all(&mut reader) == data,
        "the bytes read differ from the file's"
    );
    drop(reader);
    let file = File::open(&path).unwrap();
    assert_eq!(cached_pages(&file, 0, 0), Some(pages));
}
