//! The per-byte steps of a backup on one core, in bytes per second (`cargo bench -p
//! cairn-core`): naming a blob (keyed BLAKE3), compressing it (zstd:3 and lz4, on text and
//! on random data, which takes the store-raw path), sealing it (each cipher), and
//! packing sealed blobs into a 16 MiB pack. The figures in docs/BENCHMARKS.md come from
//! here.

use std::hint::black_box;
use std::time::Duration;

use cairn_core::compress::{Compression, Compressor};
use cairn_core::crypto::{Cipher, MasterKey, Purpose};
use cairn_core::id::BlobId;
use cairn_core::pack::{BlobKind, PackWriter};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};

#[path = "../../chunker/benches/input/mod.rs"]
mod input;

/// Blobs of the default average chunk size, as a backup hands them over.
const BLOB_BYTES: usize = 1 << 20;
/// Per iteration.
const INPUT_BYTES: usize = 8 << 20;
/// The default pack size.
const PACK_BYTES: usize = 16 << 20;

fn blobs(data: &[u8]) -> impl Iterator<Item = &[u8]> {
    data.chunks(BLOB_BYTES)
}

fn blob_id(c: &mut Criterion) {
    let key = MasterKey::generate();
    let data = input::mixed(INPUT_BYTES, 2);
    let mut group = c.benchmark_group("blob_id");
    group.throughput(Throughput::Bytes(data.len() as u64));
    group.bench_function("keyed blake3", |b| {
        b.iter(|| {
            for blob in blobs(&data) {
                black_box(key.blob_id(blob));
            }
        })
    });
    group.finish();
}

fn compress(c: &mut Criterion) {
    let inputs = [
        ("text", input::text(INPUT_BYTES, 3)),
        ("random", input::random(INPUT_BYTES, 4)),
    ];
    let mut group = c.benchmark_group("compress");
    for (kind, data) in &inputs {
        group.throughput(Throughput::Bytes(data.len() as u64));
        for codec in [Compression::Zstd { level: 3 }, Compression::Lz4] {
            let mut compressor = Compressor::new(codec);
            group.bench_function(format!("{codec} {kind}"), |b| {
                b.iter(|| {
                    blobs(data)
                        .map(|blob| compressor.compress(blob).tagged_len())
                        .sum::<usize>()
                })
            });
        }
    }
    group.finish();
}

fn seal(c: &mut Criterion) {
    let data = input::mixed(INPUT_BYTES, 5);
    let mut group = c.benchmark_group("seal");
    group.throughput(Throughput::Bytes(data.len() as u64));
    // Format 2 adds a subkey, associated data and Padmé padding to format 1's seal, and
    // offers AEGIS-256.
    for (format, cipher) in [
        (1, Cipher::XChaCha20Poly1305),
        (2, Cipher::XChaCha20Poly1305),
        (2, Cipher::Aegis256),
    ] {
        let mut key = MasterKey::generate_for(format);
        key.use_cipher(cipher).expect("both ciphers in format 2");
        let name = format!("{} format {format}", cipher.name());
        group.bench_function(name, |b| {
            b.iter(|| {
                blobs(&data)
                    .map(|blob| key.seal(Purpose::DataBlob(BlobId([1; 32])), blob).len())
                    .sum::<usize>()
            })
        });
    }
    // As the writer does: each blob copied after the seal's headroom into a buffer kept
    // from one blob to the next, and sealed there.
    let mut key = MasterKey::generate_for(2);
    key.use_cipher(Cipher::Aegis256)
        .expect("format 2 has both ciphers");
    let head = key.seal_headroom();
    let mut out = Vec::new();
    group.bench_function("aegis-256 format 2 in place in a kept buffer", |b| {
        b.iter(|| {
            blobs(&data)
                .map(|blob| {
                    out.clear();
                    out.resize(head, 0);
                    out.extend_from_slice(blob);
                    key.seal_in_place(Purpose::DataBlob(BlobId([1; 32])), &mut out);
                    out.len()
                })
                .sum::<usize>()
        })
    });
    group.finish();
}

fn pack(c: &mut Criterion) {
    let key = MasterKey::generate();
    let data = input::mixed(PACK_BYTES, 6);
    // Sealed once up front: this measures the pack writer, not the cipher.
    let sealed: Vec<_> = blobs(&data)
        .map(|blob| {
            let id = key.blob_id(blob);
            (id, key.seal(Purpose::DataBlob(id), blob), blob.len() as u32)
        })
        .collect();
    let mut group = c.benchmark_group("pack");
    group.throughput(Throughput::Bytes(data.len() as u64));
    group.bench_function("add and finish 16 MiB", |b| {
        // The writer takes each sealed blob; copying them for it is setup, not measured.
        b.iter_batched(
            || sealed.clone(),
            |sealed| {
                let mut writer = PackWriter::new(PACK_BYTES + (1 << 16));
                for (id, blob, raw_length) in sealed {
                    writer.add(id, BlobKind::Data, blob, raw_length);
                }
                black_box(writer.finish(&key)).1.len()
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

criterion_group! {
    name = benches;
    // A shared 2-core machine: few samples, short runs; the spread is in the output.
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    targets = blob_id, compress, seal, pack
}
criterion_main!(benches);
