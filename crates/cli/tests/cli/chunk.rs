//! `cairn chunk`: content-defined chunk boundaries of a file, without a repository.

use std::path::Path;

use serde_json::Value;

use crate::common::*;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Chunk {
    offset: u64,
    length: u64,
    id: String,
}

/// Runs `cairn chunk FILE ARGS...`; returns the chunk lines and the "total" line.
fn chunk_text(env: &TestEnv, file: &Path, args: &[&str]) -> (Vec<Chunk>, String) {
    let out = env
        .bare_cmd()
        .arg("chunk")
        .arg(file)
        .args(args)
        .output()
        .unwrap();
    assert_success(&out, "cairn chunk");
    let text = stdout(&out);
    let mut chunks = Vec::new();
    let mut total = None;
    for line in text.lines() {
        if line.starts_with("total") {
            total = Some(line.to_string());
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f.len(), 3, "a chunk line is OFFSET LENGTH ID: {line:?}");
        chunks.push(Chunk {
            offset: f[0]
                .parse()
                .unwrap_or_else(|_| panic!("decimal offset in {line:?}")),
            length: f[1]
                .parse()
                .unwrap_or_else(|_| panic!("decimal length in {line:?}")),
            id: f[2].to_string(),
        });
    }
    let total = total.unwrap_or_else(|| panic!("a line starting with \"total\": {text}"));
    (chunks, total)
}

/// Accepts a flat array of chunks, an array of per-file objects with "chunks", or one
/// such object.
fn chunks_from_json(v: &Value) -> Vec<Chunk> {
    let one = |c: &Value| Chunk {
        offset: json_u64(c, "offset"),
        length: json_u64(c, "length"),
        id: c["id"]
            .as_str()
            .unwrap_or_else(|| panic!("string id in {c}"))
            .to_string(),
    };
    match v {
        Value::Array(items) if items.iter().all(|i| i.get("offset").is_some()) => {
            items.iter().map(one).collect()
        }
        Value::Array(items) => items.iter().flat_map(chunks_from_json).collect(),
        Value::Object(o) if o.contains_key("chunks") => chunks_from_json(&o["chunks"]),
        other => panic!("unexpected cairn chunk --json shape: {other}"),
    }
}

fn assert_chunks_cover(chunks: &[Chunk], size: u64, min: u64, max: u64) {
    let mut next = 0;
    for (i, c) in chunks.iter().enumerate() {
        assert_eq!(
            c.offset, next,
            "chunk {i} starts where the previous one ended: {c:?}"
        );
        assert!(is_hex(&c.id, 64), "chunk {i} has a 64-hex id: {c:?}");
        assert!(c.length <= max, "chunk {i} is at most {max} bytes: {c:?}");
        if i + 1 < chunks.len() {
            assert!(
                c.length >= min,
                "chunk {i} (not the last) is at least {min} bytes: {c:?}"
            );
        }
        next += c.length;
    }
    assert_eq!(next, size, "chunk lengths sum to the file size");
}

#[test]
fn chunk_lines_cover_the_file_contiguously_within_the_size_bounds() {
    let env = TestEnv::new();
    let file = env.path("data.bin");
    write_file(&file, &random_bytes(3_000_000, 31));
    let (chunks, total) = chunk_text(
        &env,
        &file,
        &["--min", "16K", "--avg", "64K", "--max", "256K"],
    );
    assert_chunks_cover(&chunks, 3_000_000, 16 * 1024, 256 * 1024);
    assert!(
        chunks.len() >= 12,
        "3 MB in chunks of at most 256K: {} chunks",
        chunks.len()
    );
    assert!(
        total
            .split(|c: char| !c.is_ascii_digit())
            .any(|n| n == chunks.len().to_string()),
        "summary {total:?} includes the count {}",
        chunks.len()
    );
}

#[test]
fn chunk_with_default_sizes_stays_between_512k_and_8m() {
    let env = TestEnv::new();
    let file = env.path("data.bin");
    write_file(&file, &random_bytes(12_000_000, 32));
    let (chunks, _) = chunk_text(&env, &file, &[]);
    assert_chunks_cover(&chunks, 12_000_000, 512 * 1024, 8 * 1024 * 1024);
    assert!(
        chunks.len() >= 3,
        "12 MB at avg 1M gives several chunks: {chunks:?}"
    );
}

#[test]
fn chunk_json_agrees_with_the_text_output() {
    let env = TestEnv::new();
    let file = env.path("data.bin");
    write_file(&file, &random_bytes(1_000_000, 33));
    let args = ["--min", "16K", "--avg", "64K", "--max", "256K"];
    let (text_chunks, _) = chunk_text(&env, &file, &args);
    let out = env
        .bare_cmd()
        .arg("--json")
        .arg("chunk")
        .arg(&file)
        .args(args)
        .output()
        .unwrap();
    assert_success(&out, "cairn --json chunk");
    let json_chunks = chunks_from_json(&parse_json(&out.stdout, "cairn chunk --json"));
    assert_eq!(json_chunks, text_chunks);
}

#[test]
fn chunk_boundaries_resynchronise_after_an_insertion_at_the_start() {
    let env = TestEnv::new();
    let data = random_bytes(2_000_000, 34);
    let a = env.path("a.bin");
    let b = env.path("b.bin");
    write_file(&a, &data);
    let mut shifted = b"a few inserted bytes at the very beginning".to_vec();
    shifted.extend_from_slice(&data);
    write_file(&b, &shifted);
    let args = ["--min", "16K", "--avg", "64K", "--max", "256K"];
    let (ca, _) = chunk_text(&env, &a, &args);
    let (ca_again, _) = chunk_text(&env, &a, &args);
    assert_eq!(ca, ca_again, "chunking is deterministic");
    let (cb, _) = chunk_text(&env, &b, &args);
    let ids_b: std::collections::BTreeSet<&str> = cb.iter().map(|c| c.id.as_str()).collect();
    let shared = ca.iter().filter(|c| ids_b.contains(c.id.as_str())).count();
    assert!(
        shared + 2 >= ca.len(),
        "only the first chunk or two change after an insertion: {shared} of {} shared",
        ca.len()
    );
}

#[test]
fn chunk_rejects_invalid_sizes_with_a_message() {
    let env = TestEnv::new();
    let file = env.path("data.bin");
    write_file(&file, b"x");
    let out = env
        .bare_cmd()
        .arg("chunk")
        .arg(&file)
        .args(["--min", "64K", "--avg", "16K", "--max", "256K"])
        .output()
        .unwrap();
    assert_exit(&out, 1, "cairn chunk with min > avg");
    let err = stderr(&out).to_lowercase();
    assert!(err.contains("min") && err.contains("avg"), "{err}");
}
