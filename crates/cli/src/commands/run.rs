//! `cairn run [JOB...]`: runs jobs of the config file now, one after the other, and
//! prints how each went. For cron, or to try a job before the daemon runs it.

use anyhow::Result;

use crate::args::{GlobalArgs, RunArgs};
use crate::jobs::config::Jobs;
use crate::jobs::metrics;
use crate::jobs::runner::Outcome;
use crate::jobs::state::Status;
use crate::{output, EXIT_INTERRUPTED, EXIT_PARTIAL};

pub fn run(g: &GlobalArgs, a: RunArgs) -> Result<u8> {
    let config = crate::config::ConfigFile::load_default()?;
    let jobs = Jobs::load(config.path())?;
    let names: Vec<String> = if a.jobs.is_empty() {
        jobs.jobs.keys().cloned().collect()
    } else {
        a.jobs.clone()
    };
    if names.is_empty() {
        anyhow::bail!(
            "The config file {} has no jobs: add a [jobs.NAME] table (see the README)",
            config.path().display()
        );
    }
    // Every name is checked before anything runs.
    let selected = names
        .iter()
        .map(|n| jobs.get(n).map(|j| (n.clone(), j.clone())))
        .collect::<Result<Vec<_>>>()?;
    crate::signals::install();
    let mut outcomes = Vec::new();
    for (name, job) in selected {
        if crate::signals::interrupted() {
            break;
        }
        // A thread of its own, so that `limits.nice` lowers this job alone.
        let g2 = g.clone();
        let outcome = std::thread::scope(|s| {
            s.spawn(|| crate::jobs::run_now(&name, &job, &g2))
                .join()
                .map_err(|_| anyhow::anyhow!("The job {name:?} panicked"))?
        });
        match outcome {
            Ok(o) => outcomes.push(o),
            Err(e) => {
                eprintln!("error: {}", output::message(&format!("{e:#}")));
                return Ok(1);
            }
        }
    }
    print(g, &outcomes)?;
    if let Some(file) = &a.metrics_file {
        let all = jobs
            .jobs
            .keys()
            .map(|n| (n.clone(), Default::default()))
            .collect();
        metrics::write_file(file, &metrics::prometheus(&metrics::views(&all)))?;
    }
    let worst = |s: Status| outcomes.iter().any(|o| o.status == s);
    Ok(if worst(Status::Interrupted) {
        EXIT_INTERRUPTED
    } else if worst(Status::Failure) {
        1
    } else if worst(Status::Partial) {
        EXIT_PARTIAL
    } else {
        0
    })
}

fn print(g: &GlobalArgs, outcomes: &[Outcome]) -> Result<()> {
    if g.json {
        let reports: Vec<_> = outcomes.iter().map(|o| &o.report).collect();
        return output::json(&serde_json::json!({ "runs": reports }));
    }
    for o in outcomes {
        let r = &o.report;
        if g.quiet && o.status == Status::Success {
            continue;
        }
        println!(
            "{}: {} in {}{}; {} files, {} read, {} added",
            r.job,
            r.status,
            output::seconds(r.duration_ms),
            r.snapshot
                .as_deref()
                .map(|s| format!(", snapshot {}", &s[..s.len().min(8)]))
                .unwrap_or_default(),
            r.files,
            output::size(r.bytes_read),
            output::size(r.bytes_added),
        );
        for repo in &r.repositories {
            match &repo.error {
                None => println!(
                    "  {}: {}, {} added",
                    repo.repository,
                    repo.method,
                    output::size(repo.bytes_added)
                ),
                Some(e) => println!("  {}: failed: {}", repo.repository, output::message(e)),
            }
        }
        if let Some(e) = r.error.as_deref().filter(|_| r.repositories.is_empty()) {
            println!("  {}", output::message(e));
        }
        if o.status != Status::Success {
            println!("  log: {}", crate::jobs::state::log_path(&r.job)?.display());
        }
    }
    Ok(())
}
