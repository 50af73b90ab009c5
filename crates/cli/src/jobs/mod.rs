//! Backups that run themselves: jobs in the config file (`config`), when they run
//! (`schedule`), one run of a job (`runner`), its hooks' processes (`child`), who hears
//! about it (`notify`), what is
//! remembered between runs (`state`) and what machines can read of it (`metrics`, and
//! the daemon's endpoint `http`). `cairn run`, `cairn daemon` and `cairn config check`
//! are built on these; none of it is in cairn-core, which knows nothing of jobs.

pub mod child;
pub mod config;
pub mod http;
pub mod metrics;
pub mod notify;
pub mod runner;
pub mod schedule;
pub mod state;

use anyhow::{bail, Result};

use crate::args::GlobalArgs;

/// Runs a job now, unless it is running already (in a daemon, or another `cairn run`).
pub fn run_now(name: &str, job: &config::Job, g: &GlobalArgs) -> Result<runner::Outcome> {
    let Some(_lock) = state::Lock::job(name)? else {
        let path = state::state_dir()?
            .join("jobs")
            .join(format!("{name}.lock"));
        bail!(
            "The job {name:?} is running already ({} holds {})",
            state::holder(&path),
            path.display()
        );
    };
    Ok(runner::run(name, job, g))
}
