//! Finding the repository and its password: `-r`/`CAIRN_REPOSITORY` (an address, or
//! `@NAME` from the config file), else the config file's default, else the built-in
//! default repository; and the password from a file, a command, `CAIRN_PASSWORD`, the
//! named repository's entry, the default repository's key file, or a prompt on a
//! terminal, in that order.
//!
//! `resolve` and `open_other` do the same for a second repository (the source of a
//! copy), which never takes the password options or `CAIRN_PASSWORD` meant for `-r`.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context, Result};
use cairn_core::cache::Cache;
use cairn_core::client_state::StateOptions;
use cairn_core::keyfile::RandomSecret;
use cairn_core::keys::{Credentials, Secret};
use cairn_core::repo::{InitOptions, Repository};
use cairn_core::storage::{RequestCounts, Storage};

use crate::args::GlobalArgs;
use crate::config::{ConfigFile, PasswordSource, RepoEntry};

/// Where the repository is and, for the default one, where its key file is.
pub struct Location {
    /// The repository's address: a local path, `s3:...` or `sftp:...`.
    pub path: PathBuf,
    /// Set when no repository was named: the default one, keyed by this file.
    pub default_key: Option<PathBuf>,
    /// The password source of the config file's entry, used when none is given explicitly.
    pub password: Option<PasswordSource>,
    /// The config file entry's token file for a `rest:` address.
    pub rest_token_file: Option<PathBuf>,
}

impl Location {
    fn at(address: &str) -> Location {
        Location {
            path: PathBuf::from(address),
            default_key: None,
            password: None,
            rest_token_file: None,
        }
    }

    fn named(entry: &RepoEntry) -> Location {
        Location {
            password: entry.password.clone(),
            rest_token_file: entry.rest_token_file.clone(),
            ..Location::at(&entry.address)
        }
    }
}

/// The repository the global options name, or the default one.
pub fn locate(global: &GlobalArgs) -> Result<Location> {
    if let Some(repo) = &global.repo {
        if repo.is_empty() {
            bail!("The repository given with -r/--repo or CAIRN_REPOSITORY is empty");
        }
        return resolve(repo);
    }
    // Without a config directory there is no config file, and the built-in default
    // below says what is missing.
    if let Ok(path) = crate::config::default_path() {
        if let Some(entry) = ConfigFile::load(&path)?.default_repo()? {
            return Ok(Location::named(entry));
        }
    }
    let data = dirs::data_dir().context(
        "No repository given and no data directory for the default one: pass -r/--repo or set XDG_DATA_HOME",
    )?;
    let config = dirs::config_dir().context(
        "No repository given and no config directory for the default key: pass -r/--repo or set XDG_CONFIG_HOME",
    )?;
    Ok(Location {
        path: data.join("cairn").join("default"),
        default_key: Some(config.join("cairn").join("default.key")),
        password: None,
        rest_token_file: None,
    })
}

/// A repository given by the user: `@NAME`, an entry of the config file (with its
/// password source), or an address. Reads the config file only for `@NAME`.
pub fn resolve(spec: &str) -> Result<Location> {
    if let Some(name) = spec.strip_prefix('@') {
        let config = ConfigFile::load_default()?;
        return Ok(Location::named(config.repo(name)?));
    }
    if spec.is_empty() {
        bail!("The repository address is empty");
    }
    Ok(Location::at(spec))
}

/// Opens a second repository and reads its index, e.g. the source of a copy. `spec` is
/// `@NAME` or an address; the password comes from `password_file` or
/// `password_command` if given, else from the named entry, else from a prompt on a
/// terminal. The global password options and `CAIRN_PASSWORD` are not used: they belong
/// to the repository of `-r`.
pub fn open_other(
    spec: &str,
    password_file: Option<&Path>,
    password_command: Option<&str>,
) -> Result<Repository> {
    let mut repo = open_other_without_index(spec, password_file, password_command)?;
    repo.load_index()?;
    for problem in repo.index_problems() {
        eprintln!(
            "warning: {}",
            crate::output::message(&cairn_core::error::chain(problem))
        );
    }
    Ok(repo)
}

/// `open_other` without reading the index (enough to read the repository's config).
pub fn open_other_without_index(
    spec: &str,
    password_file: Option<&Path>,
    password_command: Option<&str>,
) -> Result<Repository> {
    let loc = resolve(spec)?;
    let password = match explicit_password(password_file, password_command)? {
        Some(pw) => pw,
        None => match entry_password(&loc)? {
            Some(pw) => pw,
            None if !std::io::stdin().is_terminal() => bail!(
                "No password for the repository {spec}: give its password file or command, \
                 or name it with @NAME from the config file with a password source \
                 (`cairn config repo add NAME ADDRESS --password-file FILE`)"
            ),
            None => prompt(
                &format!("Password of the repository {}: ", loc.path.display()),
                false,
            )?,
        },
    };
    let mut repo = Repository::open_without_index(storage_at(&loc)?, credentials(&password))
        .with_context(|| format!("Cannot open the repository {spec}"))?;
    warn_when_read_around(&mut repo, spec);
    Ok(repo)
}

/// Where this client keeps what it remembers of each repository (the key file that opened
/// it, evidence against rollback): `$XDG_STATE_HOME/cairn`, else `~/.local/state/cairn`.
pub fn state_options() -> Option<StateOptions> {
    let dir = dirs::state_dir().or_else(|| dirs::home_dir().map(|h| h.join(".local/state")))?;
    Some(StateOptions {
        dir: dir.join("cairn"),
        warn: Arc::new(|w: &str| crate::progress::eprint_above_bar(&format!("warning: {w}"))),
    })
}

/// A secret given as text (see [`Secret::from_text`]) with this client's state options.
fn credentials(text: &str) -> Credentials {
    Credentials {
        secret: Secret::from_text(text),
        state: state_options(),
    }
}

/// The password given explicitly for the repository of `-r`, if any, and where it came
/// from (for errors: a wrong password should say which source gave it).
fn given_password(global: &GlobalArgs) -> Result<Option<(String, String)>> {
    if let Some(pw) = explicit_password(
        global.password_file.as_deref(),
        global.password_command.as_deref(),
    )? {
        let source = match &global.password_file {
            Some(f) => format!("the password file {}", f.display()),
            None => "the password command".to_string(),
        };
        return Ok(Some((pw, source)));
    }
    Ok(std::env::var("CAIRN_PASSWORD")
        .ok()
        .map(|pw| (pw, "CAIRN_PASSWORD".to_string())))
}

fn explicit_password(file: Option<&Path>, command: Option<&str>) -> Result<Option<String>> {
    if let Some(file) = file {
        return read_password(&PasswordSource::File(file.to_path_buf())).map(Some);
    }
    if let Some(cmd) = command {
        return read_password(&PasswordSource::Command(cmd.to_string())).map(Some);
    }
    Ok(None)
}

/// The password from the config file's entry, if the repository was named by one.
fn entry_password(loc: &Location) -> Result<Option<String>> {
    loc.password.as_ref().map(read_password).transpose()
}

fn read_password(source: &PasswordSource) -> Result<String> {
    match source {
        PasswordSource::File(file) => {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("Cannot read the password file {}", file.display()))?;
            Ok(first_line(&text))
        }
        PasswordSource::Command(cmd) => {
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(cmd)
                .stderr(std::process::Stdio::inherit())
                .output()
                .with_context(|| format!("Cannot run the password command {cmd:?}"))?;
            if !out.status.success() {
                bail!("The password command {cmd:?} failed ({})", out.status);
            }
            Ok(first_line(&String::from_utf8_lossy(&out.stdout)))
        }
    }
}

/// The password given explicitly, else the one of the named repository's entry, with
/// where it came from. An explicit one that overrides the entry's is said on stderr: a
/// `CAIRN_PASSWORD` left in the environment silently beat an `@NAME`'s password file.
fn password_of(global: &GlobalArgs, loc: &Location) -> Result<Option<(String, String)>> {
    match given_password(global)? {
        Some((pw, source)) => {
            if let Some(entry) = &loc.password {
                eprintln!(
                    "note: using {source}, not the config file's {} of this repository",
                    match entry {
                        PasswordSource::File(_) => "password file",
                        PasswordSource::Command(_) => "password command",
                    }
                );
            }
            Ok(Some((pw, source)))
        }
        None => Ok(entry_password(loc)?.map(|pw| {
            let source = match &loc.password {
                Some(PasswordSource::File(f)) => {
                    format!("the config file's password file {}", f.display())
                }
                _ => "the config file's password command".to_string(),
            };
            (pw, source)
        })),
    }
}

/// A new password: from the first line of `file`, else asked twice on a terminal.
pub fn new_password(file: Option<&Path>) -> Result<String> {
    let password = match file {
        Some(file) => read_password(&PasswordSource::File(file.to_path_buf()))?,
        None if !std::io::stdin().is_terminal() => bail!(
            "No new password: pass --new-password-file FILE, or run this on a terminal to type it"
        ),
        None => prompt("New password: ", true)?,
    };
    if password.is_empty() {
        bail!("An empty password is not allowed");
    }
    Ok(password)
}

fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or("").to_string()
}

fn prompt(label: &str, confirm: bool) -> Result<String> {
    if !std::io::stdin().is_terminal() {
        bail!(
            "No password given: set CAIRN_PASSWORD, or pass --password-file or --password-command"
        );
    }
    let pw = rpassword::prompt_password(label)?;
    if confirm && rpassword::prompt_password("Repeat the password: ")? != pw {
        bail!("The passwords do not match");
    }
    if pw.is_empty() {
        bail!("An empty password is not allowed");
    }
    Ok(pw)
}

/// Request counters of every remote store this process opened, for `--stats`. Only the
/// counters are kept: the stores themselves must be dropped (closing SFTP sessions)
/// before the process exits.
static OPENED: Mutex<Vec<(String, Arc<RequestCounts>)>> = Mutex::new(Vec::new());

/// `(location, counters)` of every remote store opened so far.
pub fn request_counts() -> Vec<(String, Arc<RequestCounts>)> {
    OPENED.lock().map(|v| v.clone()).unwrap_or_default()
}

/// `--cacert`, for every store the command opens (`copy` opens two).
static CA_CERT: Mutex<Option<PathBuf>> = Mutex::new(None);

pub fn set_ca_cert(path: Option<PathBuf>) {
    if let Ok(mut ca) = CA_CERT.lock() {
        *ca = path;
    }
}

/// `--limit-upload` / `--limit-download`, for every store the command opens.
static LIMITS: Mutex<cairn_core::storage::RateLimits> =
    Mutex::new(cairn_core::storage::RateLimits {
        upload: None,
        download: None,
    });

thread_local! {
    /// A job's own limits (`limits = { upload, download }` in the config file), for the
    /// stores its thread opens: the daemon runs jobs side by side, each on a thread.
    static JOB_LIMITS: std::cell::Cell<cairn_core::storage::RateLimits> =
        const { std::cell::Cell::new(cairn_core::storage::RateLimits { upload: None, download: None }) };
}

/// Runs `f` with `limits` (bytes per second) for the stores this thread opens, each
/// direction over the global options' one.
pub fn with_job_rate_limits<T>(
    limits: cairn_core::storage::RateLimits,
    f: impl FnOnce() -> T,
) -> T {
    let before = JOB_LIMITS.with(|l| l.replace(limits));
    let out = f();
    JOB_LIMITS.with(|l| l.set(before));
    out
}

/// The global options' rate limits, in KiB/s, for the stores opened from now on.
pub fn set_rate_limits(upload_kib: Option<u64>, download_kib: Option<u64>) {
    if let Ok(mut limits) = LIMITS.lock() {
        limits.upload = upload_kib.map(|k| k.saturating_mul(1024));
        limits.download = download_kib.map(|k| k.saturating_mul(1024));
    }
}

/// The store at the repository's address: a local path, `s3:...`, `sftp:...` or
/// `rest:...` (with the token from `CAIRN_REST_TOKEN`, else the entry's token file).
fn storage_at(loc: &Location) -> Result<Arc<dyn Storage>> {
    let address = loc
        .path
        .to_str()
        .context("The repository address is not valid UTF-8")?;
    let mut options = cairn_core::storage::OpenOptions::from_env();
    if let Some(file) = &loc.rest_token_file {
        match &options.rest_token {
            Some(_) => eprintln!(
                "note: using CAIRN_REST_TOKEN, not the config file's token file {}",
                file.display()
            ),
            None => {
                let text = std::fs::read_to_string(file).with_context(|| {
                    format!(
                        "Cannot read the server token file {} that the config file names for \
                         {address}",
                        file.display()
                    )
                })?;
                options.rest_token = Some(first_line(&text).trim().to_string());
            }
        }
    }
    if let Some(ca) = CA_CERT.lock().ok().and_then(|ca| ca.clone()) {
        options.ca_cert = Some(ca);
    }
    if let Ok(limits) = LIMITS.lock() {
        options.limits = *limits;
    }
    let job = JOB_LIMITS.with(|l| l.get());
    options.limits.upload = job.upload.or(options.limits.upload);
    options.limits.download = job.download.or(options.limits.download);
    let storage = cairn_core::storage::open_with(address, &options)?;
    if let (Some(counts), Ok(mut opened)) = (storage.request_counts(), OPENED.lock()) {
        opened.push((storage.location(), counts));
    }
    Ok(storage)
}

/// Keeps a remote repository's index, snapshots and trees in the local cache, unless
/// `--no-cache`. A cache that cannot be created is a warning: the command still runs.
fn attach_cache(repo: &mut Repository, global: &GlobalArgs) {
    if global.no_cache {
        return;
    }
    let Some(base) = global
        .cache_dir
        .clone()
        .or_else(|| dirs::cache_dir().map(|d| d.join("cairn")))
    else {
        return;
    };
    if repo.key().is_write_only() {
        // What it stored before, local or remote: it cannot read the repository's index.
        match cairn_core::writer_cache::WriterCache::open(&base, &repo.config().id) {
            Ok(cache) => repo.set_writer_cache(cache),
            Err(e) => eprintln!(
                "warning: no local memory of earlier backups ({}: {e}); this write-only key \
                 reads and uploads everything",
                base.display()
            ),
        }
        return;
    }
    if !repo.storage().is_remote() {
        return;
    }
    match Cache::open(&base, &repo.config().id) {
        Ok(cache) => repo.set_cache(cache),
        Err(e) => eprintln!(
            "warning: no local cache ({}: {e}); every command downloads index and trees",
            base.display()
        ),
    }
}

/// Opens the repository named by the global options and reads its index: for commands
/// that read what it holds, which a write-only key cannot.
pub fn open(global: &GlobalArgs) -> Result<Repository> {
    let mut repo = open_without_index(global)?;
    refuse_write_only(&repo, "read its snapshots, trees or data")?;
    load_index(&mut repo)?;
    Ok(repo)
}

/// Opens the repository and reads its index, without the local cache: for commands
/// that must judge the repository itself (check, repair), not local copies of it.
pub fn open_uncached(global: &GlobalArgs) -> Result<Repository> {
    let mut repo = open_repository(global)?;
    refuse_write_only(
        &repo,
        "read the index, snapshots or trees that check and repair judge",
    )?;
    load_index(&mut repo)?;
    Ok(repo)
}

/// [`open_uncached`] for `check`, which a write-only key may run on what it can judge
/// without reading (then the index is not read).
pub fn open_for_check(global: &GlobalArgs) -> Result<Repository> {
    let mut repo = open_repository(global)?;
    if !repo.key().is_write_only() {
        load_index(&mut repo)?;
    }
    Ok(repo)
}

/// A write-only key backs up (and checks files against their names) and nothing else; every other command says so before it
/// starts, rather than failing on the first object it cannot open.
fn refuse_write_only(repo: &Repository, action: &str) -> Result<()> {
    if repo.key().is_write_only() {
        return Err(cairn_core::Error::WriteOnlyKey {
            action: action.to_string(),
        }
        .into());
    }
    Ok(())
}

fn load_index(repo: &mut Repository) -> Result<()> {
    repo.load_index()?;
    for problem in repo.index_problems() {
        eprintln!(
            "warning: {}",
            crate::output::message(&cairn_core::error::chain(problem))
        );
    }
    Ok(())
}

/// Opens the repository without reading its index (a backup reads it itself).
pub fn open_without_index(global: &GlobalArgs) -> Result<Repository> {
    let mut repo = open_repository(global)?;
    attach_cache(&mut repo, global);
    Ok(repo)
}

fn open_repository(global: &GlobalArgs) -> Result<Repository> {
    open_repository_keyed(global).map(|(repo, _)| repo)
}

/// Opens the repository without its index, for key management: also says whether it was
/// opened with the default repository's key file, and which.
pub fn open_for_keys(global: &GlobalArgs) -> Result<(Repository, Option<PathBuf>)> {
    open_repository_keyed(global)
}

fn open_repository_keyed(global: &GlobalArgs) -> Result<(Repository, Option<PathBuf>)> {
    let loc = locate(global)?;
    let mut by_default_key = None;
    let mut source = String::from("the password typed");
    let storage = storage_at(&loc)?;
    let password = match (password_of(global, &loc)?, &loc.default_key) {
        (Some((pw, from)), _) => {
            source = from;
            pw
        }
        (None, Some(key)) => {
            source = format!("the default key file {}", key.display());
            by_default_key = Some(key.clone());
            if !loc.path.join("config").exists() {
                bail!(
                    "No repository given, and the default repository {} does not exist yet: \
                     `cairn backup PATH` creates it, or pass -r/--repo",
                    loc.path.display()
                );
            }
            read_default_key(key, &loc.path)?
        }
        (None, None) => {
            // Not a repository: say so before asking for a password it cannot use.
            Repository::check_config(storage.as_ref())?;
            prompt("Repository password: ", false)?
        }
    };
    let mut repo = match Repository::open_without_index(storage, credentials(&password)) {
        Err(e @ cairn_core::Error::WrongPassword { .. }) => {
            return Err(anyhow::Error::new(e).context(format!("The password came from {source}")))
        }
        other => other?,
    };
    warn_when_read_around(&mut repo, &loc.path.display().to_string());
    Ok((repo, by_default_key))
}

/// Warns on standard error, once per pack, when a blob of `repo` is read from another
/// copy than its place in the index: the command goes on with a whole copy, and the user
/// learns that the repository needs a check.
fn warn_when_read_around(repo: &mut Repository, name: &str) {
    let warned = Mutex::new(std::collections::HashSet::new());
    let name = name.to_string();
    repo.on_read_around(Box::new(move |id, pack, error| {
        let first = warned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(pack);
        if first {
            crate::progress::eprint_above_bar(&format!(
                "warning: {}",
                crate::output::message(&format!(
                    "blob {id} was read from another copy: its copy in pack {pack} of the \
                     repository {name} is missing or damaged ({}). What was read is whole. \
                     Run `cairn check --read-data` to see what is damaged and what mends it",
                    cairn_core::error::chain(error)
                ))
            ));
        }
    }));
}

fn read_default_key(key: &Path, repo: &Path) -> Result<String> {
    let text = std::fs::read_to_string(key).with_context(|| {
        format!(
            "The default repository {} is locked by the key file {}, which cannot be read; \
             restore that file, or give the password with CAIRN_PASSWORD",
            repo.display(),
            key.display()
        )
    })?;
    Ok(first_line(&text))
}

/// Creates a repository at the location named by the global options.
pub fn init(global: &GlobalArgs, opts: &InitOptions) -> Result<Repository> {
    let loc = locate(global)?;
    let given = password_of(global, &loc)?;
    let given_none = given.is_none();
    let secret = match (given, &loc.default_key) {
        // A password the user gave is one a person chose, whatever it looks like.
        (Some((pw, _)), _) => Secret::Password(pw.into_bytes().into()),
        (None, Some(key)) => create_default_key(key)?,
        (None, None) => {
            Secret::Password(prompt("Repository password: ", true)?.into_bytes().into())
        }
    };
    if matches!(&secret, Secret::Password(pw) if pw.is_empty()) {
        bail!("An empty password is not allowed");
    }
    let credentials = Credentials {
        secret,
        state: state_options(),
    };
    let mut repo = Repository::init(storage_at(&loc)?, credentials, opts)?;
    attach_cache(&mut repo, global);
    if let Some(key) = &loc.default_key {
        // Said every time, whatever the password source: a cron job that lost its
        // CAIRN_REPOSITORY but kept CAIRN_PASSWORD would otherwise back up to this disk.
        if given_none {
            eprintln!(
                "Created the default repository {} (no -r/--repo or CAIRN_REPOSITORY given).\n\
                 Its key is in {} - without that file these backups cannot be restored.\n\
                 Keep a copy of it somewhere other than this machine.",
                loc.path.display(),
                key.display()
            );
        } else {
            eprintln!(
                "Created the default repository {} (no -r/--repo or CAIRN_REPOSITORY given), \
                 locked with the password given; pass -r/--repo to back up elsewhere.",
                loc.path.display()
            );
        }
    }
    Ok(repo)
}

/// Opens the repository without its index, creating the default one on first use.
pub fn open_or_create_default(global: &GlobalArgs) -> Result<Repository> {
    let loc = locate(global)?;
    if loc.default_key.is_some() && !loc.path.join("config").exists() {
        let opts = InitOptions {
            host: gethostname::gethostname().to_string_lossy().into_owned(),
            ..InitOptions::default()
        };
        return init(global, &opts);
    }
    open_without_index(global)
}

/// The default repository's secret: the key file left by an earlier attempt, else a new
/// random secret in a new key file (cairn generated it, so its key file in the repository
/// needs no password stretching).
fn create_default_key(key: &Path) -> Result<Secret> {
    if key.exists() {
        // A key left by an earlier attempt: reuse it rather than lock anything out.
        return Ok(Secret::from_text(&read_default_key(key, key)?));
    }
    let secret = RandomSecret::generate();
    write_key_file(key, &secret)?;
    Ok(Secret::Random(secret))
}

/// Creates `path` holding `secret`, 0600, and makes it durable: the file, its directory
/// and any directory created for it are fsynced, as it may be the only copy of the key.
pub fn write_key_file(path: &Path, secret: &RandomSecret) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        create_dirs_durably(dir).with_context(|| format!("Cannot create {}", dir.display()))?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("Cannot create the key file {}", path.display()))?;
    f.write_all(format!("{}\n", secret.as_text()).as_bytes())
        .and_then(|_| f.sync_all())
        .and_then(|_| sync_dir(path.parent().unwrap_or(Path::new("."))))
        .with_context(|| format!("Cannot write the key file {}", path.display()))
}

/// `create_dir_all`, fsyncing the parent of each directory it creates.
fn create_dirs_durably(dir: &Path) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_dirs_durably(parent)?;
    }
    match std::fs::create_dir(dir) {
        Ok(()) => sync_dir(dir.parent().unwrap_or(Path::new("."))),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// Makes a directory's new or renamed entries durable (where the file system can).
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    match std::fs::File::open(dir)?.sync_all() {
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::InvalidInput | std::io::ErrorKind::Unsupported
            ) =>
        {
            Ok(())
        }
        other => other,
    }
}

/// Opens the repository of `--from-repo`, with or without its index.
pub fn open_from(from: &crate::args::FromRepoArgs, with_index: bool) -> Result<Repository> {
    let spec = from
        .from_repo
        .as_deref()
        .context("Name the other repository with --from-repo (an address or @NAME)")?;
    let (file, cmd) = (
        from.from_password_file.as_deref(),
        from.from_password_command.as_deref(),
    );
    if with_index {
        open_other(spec, file, cmd)
    } else {
        open_other_without_index(spec, file, cmd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_repository_opens_with_its_own_password_source() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        let address = repo.to_str().unwrap();
        Repository::init(
            storage_at(&Location::at(address)).unwrap(),
            b"second secret",
            &InitOptions::default(),
        )
        .unwrap();
        let pw = dir.path().join("pw");
        std::fs::write(&pw, "second secret\n").unwrap();

        assert!(open_other_without_index(address, Some(&pw), None).is_ok());
        assert!(open_other(address, None, Some("echo second secret")).is_ok());
        // The password file wins over the command, as on the command line.
        assert!(open_other_without_index(address, Some(&pw), Some("echo wrong")).is_ok());
        assert!(open_other_without_index(address, None, Some("echo wrong")).is_err());
    }

    #[test]
    fn a_spec_without_at_is_an_address() {
        let loc = resolve("sftp://nas/x").unwrap();
        assert_eq!(loc.path, PathBuf::from("sftp://nas/x"));
        assert!(loc.password.is_none() && loc.default_key.is_none());
        assert!(resolve("").is_err());
    }
}
