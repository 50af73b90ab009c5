//! `cairn serve`: run the repository server, or manage its tokens, quotas, deleted
//! objects and scrubs. Everything but argument handling and printing is in
//! `cairn-server`.

use std::io::Write;

use anyhow::{bail, Context, Result};
use cairn_server::access::Access;
use cairn_server::{deleted, scrub, ServeOptions};

use crate::args::{GlobalArgs, ServeArgs, ServeCommand, TokenCommand};
use crate::output;

pub fn run(g: &GlobalArgs, a: ServeArgs) -> Result<u8> {
    if !a.dir.is_dir() {
        bail!(
            "{} is not a directory: create it first; its subdirectories are the repositories",
            a.dir.display()
        );
    }
    let dir = a.dir.clone();
    match a.command {
        None => serve(a),
        Some(ServeCommand::Token(TokenCommand::Add {
            name,
            repo,
            rights,
            quota,
        })) => {
            let mut access = Access::load(&dir)?;
            let token = access.add_token(&name, &repo, rights, quota)?;
            access.save(&dir)?;
            if g.json {
                output::json(&serde_json::json!({
                    "name": name, "repo": repo, "rights": rights, "token": token,
                }))?;
            } else {
                // The token last, alone after a space, so scripts can take the last word.
                println!(
                    "Token {name} for repository {repo} with right {} (shown only now): {token}",
                    rights.as_str()
                );
            }
            Ok(0)
        }
        Some(ServeCommand::Token(TokenCommand::List)) => {
            let access = Access::load(&dir)?;
            if g.json {
                let tokens: Vec<_> = access
                    .tokens
                    .iter()
                    .map(|t| {
                        serde_json::json!({
                            "name": t.name, "repo": t.repo, "rights": t.rights,
                            "created": epoch_time(t.created), "quota_bytes": t.quota_bytes,
                        })
                    })
                    .collect();
                output::json(&serde_json::json!({ "tokens": tokens }))?;
            } else {
                let mut out = std::io::stdout().lock();
                writeln!(
                    out,
                    "{:<20} {:<20} {:<9} quota",
                    "name", "repository", "rights"
                )?;
                for t in &access.tokens {
                    let quota = t.quota_bytes.map_or("-".to_string(), output::size);
                    writeln!(
                        out,
                        "{:<20} {:<20} {:<9} {quota}",
                        t.name,
                        t.repo,
                        t.rights.as_str()
                    )?;
                }
            }
            Ok(0)
        }
        Some(ServeCommand::Token(TokenCommand::Remove { name })) => {
            let mut access = Access::load(&dir)?;
            access.remove_token(&name)?;
            access.save(&dir)?;
            if !g.quiet {
                println!("Removed token {name}");
            }
            Ok(0)
        }
        Some(ServeCommand::Quota { repo, size }) => {
            let size = size.0;
            if !cairn_server::access::valid_repo_name(&repo) {
                bail!("{repo:?} cannot name a repository");
            }
            let mut access = Access::load(&dir)?;
            match size {
                Some(bytes) => access.repo_quotas.insert(repo.clone(), bytes),
                None => access.repo_quotas.remove(&repo),
            };
            access.save(&dir)?;
            if !g.quiet {
                match size {
                    Some(bytes) => println!("Repository {repo} may hold {}", output::size(bytes)),
                    None => println!("Repository {repo} has no quota"),
                }
            }
            Ok(0)
        }
        Some(ServeCommand::Undelete { repo, list }) => {
            if list {
                let held = deleted::list(&dir, &repo)?;
                if g.json {
                    let objects: Vec<_> = held
                        .iter()
                        .map(|h| {
                            serde_json::json!({
                                "name": h.name, "deleted_at": epoch_time(h.deleted_at),
                                "size_bytes": h.size,
                            })
                        })
                        .collect();
                    output::json(&serde_json::json!({ "objects": objects }))?;
                } else {
                    for h in held {
                        println!("{} {} {}", h.deleted_at, output::size(h.size), h.name);
                    }
                }
                return Ok(0);
            }
            let report = deleted::undelete(&dir, &repo)?;
            if g.json {
                output::json(&report)?;
            } else if !g.quiet {
                println!(
                    "Put back {} objects into {repo}; {} had their names taken again and stay held",
                    report.restored.len(),
                    report.present.len()
                );
            }
            Ok(0)
        }
        Some(ServeCommand::Scrub { repo }) => {
            let report = scrub::scrub(&dir, repo.as_deref())?;
            if g.json {
                output::json(&report)?;
            } else {
                for name in &report.damaged {
                    println!("damaged: {name} (its bytes do not hash to its name)");
                }
                println!(
                    "Checked {} objects ({}; {} of them deleted and held) in {} repositories: {} damaged",
                    report.objects_checked,
                    output::size(report.bytes_checked),
                    report.held_checked,
                    report.repositories,
                    report.damaged.len()
                );
            }
            Ok(if report.damaged.is_empty() { 0 } else { 1 })
        }
    }
}

fn serve(a: ServeArgs) -> Result<u8> {
    let listen = a
        .listen
        .context("Give the address to listen on: --listen 127.0.0.1:8000, unix:PATH (behind a reverse proxy), or HOST:PORT with --tls-cert and --tls-key")?;
    let options = ServeOptions {
        tls: a.tls_cert.zip(a.tls_key),
        delete_delay: a.delete_delay,
        max_body: a.max_body,
        max_connections: a.max_connections,
        idle_timeout: a.idle_timeout,
        ..ServeOptions::new(a.dir, listen)
    };
    cairn_server::serve(options, |listening| {
        // Tests and scripts read the address (a port of 0 picks one) from this line.
        println!("cairn serve: listening on {listening}");
        let _ = std::io::stdout().flush();
    })?;
    Ok(0)
}

/// Seconds since the epoch, as the server records them, in RFC 3339 as every `--json`
/// time is.
fn epoch_time(secs: u64) -> Option<jiff::Timestamp> {
    i64::try_from(secs)
        .ok()
        .and_then(|s| jiff::Timestamp::from_second(s).ok())
}
