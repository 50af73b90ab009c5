//! Chunking speed on one core, in bytes per second (`cargo bench -p cairn-chunker`).
//! The figures in docs/BENCHMARKS.md come from here.

use std::hint::black_box;
use std::time::Duration;

use cairn_chunker::{chunk_slice, Chunker, ChunkerParams};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

mod input;

/// Per iteration: large enough for many default-sized (1 MiB) chunks.
const INPUT_BYTES: usize = 16 << 20;

fn chunker(c: &mut Criterion) {
    let data = input::mixed(INPUT_BYTES, 1);
    let mut group = c.benchmark_group("chunker");
    group.throughput(Throughput::Bytes(data.len() as u64));
    let sizes = [
        ("default 512K/1M/8M", ChunkerParams::DEFAULT),
        ("64K", ChunkerParams::for_average(64 << 10).expect("valid")),
    ];
    for (name, params) in sizes {
        // As a backup runs it: streaming from a reader through the reusable buffer.
        group.bench_function(format!("stream {name}"), |b| {
            let mut buffer = Vec::new();
            b.iter(|| {
                let mut chunker = Chunker::with_buffer(
                    &data[..],
                    params,
                    0x5eed_u64,
                    std::mem::take(&mut buffer),
                );
                let mut count = 0u32;
                while let Some(chunk) = chunker.next_chunk().expect("reading a slice") {
                    black_box(chunk.data);
                    count += 1;
                }
                buffer = chunker.into_buffer();
                count
            })
        });
        // The cut-point function alone, over memory.
        group.bench_function(format!("slice {name}"), |b| {
            b.iter(|| chunk_slice(black_box(&data), params, 0x5eed_u64).len())
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    // A shared 2-core machine: few samples, short runs; the spread is in the output.
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    targets = chunker
}
criterion_main!(benches);
