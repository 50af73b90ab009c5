//! `cairn key list | add | remove | passwd`: restic's shapes, over `cairn_core::keys`.

use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context, Result};
use cairn_core::keyfile::{KdfParams, RandomSecret};
use cairn_core::keys::{self, Secret};
use cairn_core::repo::Repository;

use crate::args::{GlobalArgs, KeyCommand, NewKeyArgs};
use crate::{context, output};

pub fn run(g: &GlobalArgs, command: KeyCommand) -> Result<u8> {
    let (repo, default_key) = context::open_for_keys(g)?;
    match command {
        KeyCommand::List => list(g, &repo),
        KeyCommand::Add(a) => {
            let secret = typed(&context::new_password(a.new.new_password_file.as_deref())?);
            if a.write_only {
                let id = keys::add_write_only(&repo, &secret, KdfParams::default(), &host(&a.new))?;
                report(g, "Added write-only key", &id.to_hex(), None)
            } else {
                let id = keys::add(&repo, &secret, KdfParams::default(), &host(&a.new))?;
                report(g, "Added key", &id.to_hex(), None)
            }
        }
        KeyCommand::Remove(a) => {
            let id = keys::resolve(&repo, &a.id)?;
            keys::remove(&repo, id)?;
            report(g, "Removed key", &id.to_hex(), None)
        }
        KeyCommand::Passwd(a) => match default_key {
            Some(file) if a.new_password_file.is_none() => rotate_default(g, &repo, &file, &a),
            Some(file) => bail!(
                "The default repository is opened by its key file {}: a password in its place \
                 would leave that file opening nothing. Add a password with `cairn key add \
                 --new-password-file FILE`, or run `cairn key passwd` alone for a new random key",
                file.display()
            ),
            None => {
                let secret = typed(&context::new_password(a.new_password_file.as_deref())?);
                let (new, old) = keys::change(&repo, &secret, KdfParams::default(), &host(&a))?;
                report(g, "Changed the password: new key", &new.to_hex(), Some(old))
            }
        },
    }
}

/// A password a person chose: always stretched, whatever it looks like.
fn typed(password: &str) -> Secret {
    Secret::Password(password.as_bytes().to_vec().into())
}

fn host(a: &NewKeyArgs) -> String {
    a.host
        .clone()
        .unwrap_or_else(|| gethostname::gethostname().to_string_lossy().into_owned())
}

/// Replaces the default repository's random key: a new secret in `<key file>.new`
/// (durable), a key file for it in the repository, the new file renamed over the old
/// (durable), and only then the old key file removed. A crash at any step leaves a key
/// file on this machine that opens the repository.
fn rotate_default(g: &GlobalArgs, repo: &Repository, file: &Path, a: &NewKeyArgs) -> Result<u8> {
    let secret = RandomSecret::generate();
    let mut staged = file.as_os_str().to_owned();
    staged.push(".new");
    let staged = std::path::PathBuf::from(staged);
    // Left by an interrupted rotation: the key file it opens, if any, is unused.
    let _ = std::fs::remove_file(&staged);
    context::write_key_file(&staged, &secret)?;
    let new = keys::add(
        repo,
        &Secret::Random(secret),
        KdfParams::default(),
        &host(a),
    )?;
    std::fs::rename(&staged, file)
        .and_then(|_| context::sync_dir(file.parent().unwrap_or(Path::new("."))))
        .with_context(|| {
            format!(
                "Cannot put the new key file {} in place of {}; the repository opens with either",
                staged.display(),
                file.display()
            )
        })?;
    let old = keys::switch_to(repo, new)?;
    if !g.json && !g.quiet {
        eprintln!(
            "The default repository has a new random key, in {}. Copies of the old key file \
             no longer open it: keep a copy of the new one somewhere other than this machine.",
            file.display()
        );
    }
    report(g, "Changed the key: new key", &new.to_hex(), Some(old))
}

fn report(
    g: &GlobalArgs,
    what: &str,
    id: &str,
    removed: Option<cairn_core::id::KeyId>,
) -> Result<u8> {
    if g.json {
        output::json(&serde_json::json!({
            "id": id,
            "removed_id": removed.map(|old| old.to_hex()),
        }))?;
    } else if !g.quiet {
        match removed {
            Some(old) => println!("{what} {}, removed key {}", &id[..8], old.short()),
            None => println!("{what} {}", &id[..8]),
        }
    }
    Ok(0)
}

fn list(g: &GlobalArgs, repo: &Repository) -> Result<u8> {
    let keys = keys::list(repo)?;
    if g.json {
        output::json(&serde_json::json!({ "keys": keys }))?;
        return Ok(0);
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        " {:<8}  {:<16}  {:<19}  Key derivation",
        "ID", "Host", "Created"
    )?;
    for k in &keys {
        let created = k.created.map(output::local_time).unwrap_or_default();
        let mut kdf = match &k.problem {
            Some(p) => format!("{} (unusable: {p})", k.kdf),
            None => k.kdf.clone(),
        };
        if k.write_only {
            kdf.push_str(", write-only");
        }
        writeln!(
            out,
            "{}{:<8}  {:<16}  {:<19}  {kdf}",
            if k.current { '*' } else { ' ' },
            k.id.short(),
            k.host,
            created,
        )?;
    }
    Ok(0)
}
