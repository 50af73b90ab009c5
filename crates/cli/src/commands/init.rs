use anyhow::{Context, Result};
use cairn_core::chunker::ChunkerParams;
use cairn_core::repo::InitOptions;

use crate::args::{GlobalArgs, InitArgs};
use crate::context;

pub fn run(g: &GlobalArgs, a: InitArgs) -> Result<u8> {
    let d = ChunkerParams::DEFAULT;
    let chunker = ChunkerParams::new(
        a.chunk_min.unwrap_or(d.min_size),
        a.chunk_avg.unwrap_or(d.avg_size),
        a.chunk_max.unwrap_or(d.max_size),
    )
    .context("Invalid --chunk-min/--chunk-avg/--chunk-max")?;
    let pack_size = match a.pack_size {
        Some(size) if !(1 << 20..=1 << 30).contains(&size) => {
            anyhow::bail!("--pack-size must be between 1M and 1G")
        }
        Some(size) => size as u64,
        None => InitOptions::default().pack_size,
    };
    let opts = InitOptions {
        chunker,
        pack_size,
        compression: a.compression.parse().map_err(anyhow::Error::msg)?,
        host: gethostname::gethostname().to_string_lossy().into_owned(),
        ..InitOptions::default()
    };
    let repo = context::init(g, &opts)?;
    let location = repo.storage().location();
    if g.json {
        crate::output::json(&serde_json::json!({
            "id": repo.config().id,
            "repository": location,
        }))?;
    } else if !g.quiet {
        println!(
            "Created cairn repository {} at {location}",
            repo.config().id
        );
    }
    Ok(0)
}
