//! `cairn chunk`: content-defined chunk boundaries of a file, without a repository, and
//! `--sizes`: the same files cut with several chunk sizes, compared.

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
        length: json_u64(c, "size_bytes"),
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

/// `cairn chunk --json --sizes SIZES PATHS...`, which must exit 0; returns the rows.
fn size_rows(env: &TestEnv, sizes: &str, paths: &[&Path]) -> Vec<Value> {
    let out = env
        .bare_cmd()
        .args(["chunk", "--json", "--sizes", sizes])
        .args(paths)
        .output()
        .unwrap();
    assert_success(&out, &format!("cairn chunk --sizes {sizes}"));
    match parse_json(&out.stdout, "cairn chunk --sizes --json") {
        Value::Object(mut doc) => match doc.remove("sizes") {
            Some(Value::Array(rows)) => rows,
            other => panic!("cairn chunk --sizes --json has a sizes array, got {other:?}"),
        },
        other => panic!("cairn chunk --sizes --json prints an array, got {other}"),
    }
}

#[test]
fn chunk_sizes_prints_one_row_per_size_in_the_order_given() {
    let env = TestEnv::new();
    let file = env.path("data.bin");
    write_file(&file, &random_bytes(3_000_000, 35));
    let rows = size_rows(&env, "64K,16K,256K", &[&file]);
    let avgs: Vec<u64> = rows.iter().map(|r| json_u64(r, "average_bytes")).collect();
    assert_eq!(avgs, [64 << 10, 16 << 10, 256 << 10]);
    for r in &rows {
        let avg = json_u64(r, "average_bytes");
        assert_eq!(json_u64(r, "min_bytes"), avg / 2, "{r}");
        assert_eq!(json_u64(r, "max_bytes"), avg * 8, "{r}");
        assert_eq!(json_u64(r, "total_bytes"), 3_000_000, "{r}");
        assert_eq!(json_u64(r, "unique_bytes"), 3_000_000, "random data: {r}");
        assert!(
            json_u64(r, "compressed_bytes") >= 3_000_000,
            "random data does not compress: {r}"
        );
    }
    let counts: Vec<u64> = rows.iter().map(|r| json_u64(r, "chunks")).collect();
    assert!(
        counts[1] > counts[0] && counts[0] > counts[2],
        "smaller chunks, more of them: {counts:?}"
    );

    // The same rows for people: a header, then one line per size, in order.
    let out = env
        .bare_cmd()
        .args(["chunk", "--sizes", "64K,16K,256K"])
        .arg(&file)
        .output()
        .unwrap();
    assert_success(&out, "cairn chunk --sizes");
    let text = stdout(&out);
    let firsts: Vec<String> = text
        .lines()
        .filter(|l| l.contains("KiB"))
        .map(|l| l.split_whitespace().take(2).collect::<Vec<_>>().join(" "))
        .collect();
    assert_eq!(firsts, ["64.0 KiB", "16.0 KiB", "256.0 KiB"], "{text}");
}

#[test]
fn chunk_sizes_finds_repeated_content_in_a_directory_tree() {
    let env = TestEnv::new();
    let dir = env.path("tree");
    let data = compressible_bytes(1_500_000, 36);
    write_file(&dir.join("a.log"), &data);
    write_file(&dir.join("deeper/down/copy.log"), &data);
    let rows = size_rows(&env, "16K,64K", &[&dir]);
    assert_eq!(rows.len(), 2);
    for r in &rows {
        assert_eq!(json_u64(r, "total_bytes"), 3_000_000, "both files: {r}");
        assert_eq!(json_u64(r, "unique_bytes"), 1_500_000, "one copy: {r}");
        assert_eq!(json_u64(r, "unique_chunks") * 2, json_u64(r, "chunks"));
        assert_eq!(r["dedup_ratio"].as_f64(), Some(2.0), "{r}");
        assert!(
            json_u64(r, "compressed_bytes") < 1_500_000 / 3,
            "text compresses: {r}"
        );
        assert!(
            r["chunk_mib_per_s"].as_f64().is_some_and(|v| v > 0.0),
            "{r}"
        );
    }
}

#[test]
fn chunk_sizes_refuses_a_bad_size_naming_it() {
    let env = TestEnv::new();
    let file = env.path("data.bin");
    write_file(&file, b"x");
    for bad in ["9M", "100", "lots"] {
        let out = env
            .bare_cmd()
            .args(["chunk", "--sizes", &format!("64K,{bad}")])
            .arg(&file)
            .output()
            .unwrap();
        assert!(!out.status.success(), "--sizes 64K,{bad} is refused");
        assert!(stderr(&out).contains(bad), "{}", stderr(&out));
        assert!(out.stdout.is_empty(), "no rows: {}", stdout(&out));
    }
}

/// r21.13: `init --chunk-avg 64K` and `chunk FILE --avg 64K` failed because the minimum
/// and maximum stayed at the defaults; they follow the average, as `--sizes` has them.
#[test]
fn an_average_alone_sets_the_chunk_limits() {
    let env = TestEnv::new();
    let file = env.path("f");
    write_file(&file, &random_bytes(1 << 20, 5));
    let out = env
        .cmd()
        .args(["chunk", "--json", "--avg", "64K"])
        .arg(&file)
        .output()
        .unwrap();
    assert_success(&out, "chunk --avg 64K");
    let out = env
        .cmd()
        .args(["init", "--chunk-avg", "64K"])
        .output()
        .unwrap();
    assert_success(&out, "init --chunk-avg 64K");
    let out = env
        .bare_cmd()
        .arg("-r")
        .arg(env.path("other"))
        .args(["init", "--chunk-avg", "64K", "--chunk-max", "1K"])
        .output()
        .unwrap();
    assert_exit(&out, 1, "a maximum below the average");
}
