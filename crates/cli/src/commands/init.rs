use std::sync::Arc;

use anyhow::{Context, Result};
use cairn_core::repo::InitOptions;

use crate::args::{GlobalArgs, InitArgs};
use crate::context;

pub fn run(g: &GlobalArgs, a: InitArgs) -> Result<u8> {
    let (chunker, ids_from) = if a.copy_chunker_params {
        let other = context::open_from(&a.from, false)?;
        (other.chunker_params()?, Some(Arc::clone(other.key())))
    } else {
        if a.from.from_repo.is_some() {
            anyhow::bail!("--from-repo is used with --copy-chunker-params");
        }
        let chunker = crate::args::chunker_params(a.chunk_min, a.chunk_avg, a.chunk_max)
            .context("Invalid --chunk-min/--chunk-avg/--chunk-max")?;
        (chunker, None)
    };
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
        ids_from,
        cipher: a.cipher,
        ..InitOptions::default()
    };
    let repo = context::init(g, &opts)?;
    let location = repo.storage().location();
    if g.json {
        crate::output::json(&serde_json::json!({
            "repository": location,
            "repository_id": repo.config().id,
            "cipher": repo.config().cipher().name(),
        }))?;
    } else if !g.quiet {
        println!(
            "Created cairn repository {} at {location} (encrypted with {})",
            repo.config().id,
            repo.config().cipher().name()
        );
    }
    Ok(0)
}
