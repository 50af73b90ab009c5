//! The command line, as clap sees it. Only syntax and validation that needs no I/O lives
//! here; `commands/` turns these into core options.

use std::ffi::OsString;
use std::path::PathBuf;

use cairn_core::chunker::ChunkerParams;
use cairn_core::ops::find::SizeFilter;
use clap::{Args, Parser, Subcommand};

/// Shown after every command's help: what the options do not say.
pub(crate) const AFTER_HELP: &str = "\
Environment:
  CAIRN_REPOSITORY          the repository, as -r/--repo
  CAIRN_PASSWORD            the repository password
  CAIRN_PASSWORD_FILE       as --password-file
  CAIRN_PASSWORD_COMMAND    as --password-command
  CAIRN_CACHE_DIR           as --cache-dir
  CAIRN_FROM_REPOSITORY, CAIRN_FROM_PASSWORD_FILE, CAIRN_FROM_PASSWORD_COMMAND
                            the other repository of copy and init --copy-chunker-params
  CAIRN_RETRIES             retries of a failed S3/SFTP request (default 6)
  CAIRN_S3_ALLOW_HTTP=1     allow s3:http:// to a host that is not a loopback address
  AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION   S3 credentials

Exit codes: 0 success; 1 error; 2 usage error (bad options); 3 backup done but some
files could not be read (listed); 130 interrupted (Ctrl-C).";

#[derive(Debug, Parser)]
#[command(
    name = "cairn",
    version,
    about = "Fast, deduplicating, compressed, encrypted backups",
    propagate_version = true,
    after_help = AFTER_HELP
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Options every command takes, before or after its name.
#[derive(Debug, Args, Clone)]
#[command(next_help_heading = "Global options")]
pub struct GlobalArgs {
    /// Repository address, or @NAME from the config file (default: the config file's
    /// default, else $XDG_DATA_HOME/cairn/default, created on first backup)
    #[arg(short = 'r', long = "repo", env = "CAIRN_REPOSITORY", global = true)]
    pub repo: Option<String>,
    /// Read the repository password from the first line of this file
    #[arg(long, env = "CAIRN_PASSWORD_FILE", global = true)]
    pub password_file: Option<PathBuf>,
    /// Run this shell command and use the first line it prints as the password
    #[arg(long, env = "CAIRN_PASSWORD_COMMAND", global = true)]
    pub password_command: Option<String>,
    /// Print machine-readable JSON on standard output
    #[arg(long, global = true)]
    pub json: bool,
    /// Print nothing but errors
    #[arg(short, long, global = true)]
    pub quiet: bool,
    /// At the end, print the requests sent to each remote repository (on standard error)
    #[arg(long, global = true)]
    pub stats: bool,
    /// Keep no local copies of a remote repository's index, snapshots and trees
    #[arg(long, global = true)]
    pub no_cache: bool,
    /// Where to keep those copies (default: $XDG_CACHE_HOME/cairn)
    #[arg(long, env = "CAIRN_CACHE_DIR", global = true, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Trust the certificate authorities in this PEM file, instead of the system's, for a
    /// rest:https:// repository server
    #[arg(long, env = "CAIRN_CACERT", global = true, value_name = "FILE")]
    pub cacert: Option<PathBuf>,
    /// Send to the repository at most this many KiB a second (averaged; whole objects are
    /// sent, after waiting their turn)
    #[arg(long, global = true, value_name = "KIB", value_parser = clap::value_parser!(u64).range(1..))]
    pub limit_upload: Option<u64>,
    /// Read from the repository at most this many KiB a second
    #[arg(long, global = true, value_name = "KIB", value_parser = clap::value_parser!(u64).range(1..))]
    pub limit_download: Option<u64>,
    /// Run at the lowest CPU priority (nice 19) and idle I/O priority, so that a backup
    /// leaves the machine to everything else
    #[arg(long, global = true)]
    pub nice: bool,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create a repository
    Init(InitArgs),
    /// Back up files and directories
    Backup(BackupArgs),
    /// List snapshots
    Snapshots(SnapshotsArgs),
    /// List the files in a snapshot
    Ls(LsArgs),
    /// Print a file from a snapshot to standard output
    Cat(CatArgs),
    /// Write a file from a snapshot to standard output, or a directory as a tar or zip archive
    Dump(DumpArgs),
    /// Mount the repository read-only (FUSE) to browse its snapshots as files
    Mount(MountArgs),
    /// Restore a snapshot, or part of one, into a directory
    Restore(RestoreArgs),
    /// Show what changed between two snapshots, or a snapshot and a live directory
    Diff(DiffArgs),
    /// Find files by name or path, with size, time and type filters, in all snapshots
    Find(FindArgs),
    /// Show how much the repository stores, and how well it deduplicates and compresses
    Stats(StatsArgs),
    /// Show how files are cut into chunks (offset, length, id of each)
    Chunk(ChunkArgs),
    /// Check that every snapshot can be restored; --read-data also verifies the data
    Check(CheckArgs),
    /// Remove snapshots by id or by a retention policy
    Forget(ForgetArgs),
    /// Add, remove or replace the tags of existing snapshots
    Tag(TagArgs),
    /// Remove paths from existing snapshots (an accidentally backed-up secret); with
    /// --forget and a prune afterwards, their data is gone from the repository
    Rewrite(RewriteArgs),
    /// Delete data no snapshot needs, safely while other backups run
    Prune(PruneArgs),
    /// Repair a damaged repository
    #[command(subcommand)]
    Repair(RepairCommand),
    /// Copy snapshots from another repository, sending only the data this one lacks
    Copy(CopyArgs),
    /// Edit the config file ($XDG_CONFIG_HOME/cairn/config.toml)
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Manage the repository's keys: several passwords, rotation after a leak
    #[command(subcommand)]
    Key(KeyCommand),
    /// Serve the repositories in a directory over HTTPS, to clients with tokens
    Serve(ServeArgs),
    /// Write shell completions or man pages
    Generate(GenerateArgs),
    /// Run jobs of the config file now: backup, forget, and prune and check when due
    Run(RunArgs),
    /// Run the config file's jobs on their schedules, until stopped
    Daemon(DaemonArgs),
    /// Run the jobs from systemd timers instead of `cairn daemon`
    #[command(subcommand)]
    Schedule(ScheduleCommand),
}

#[derive(Debug, Subcommand)]
pub enum ScheduleCommand {
    /// Write and enable a service and a timer for each job with a schedule
    Install(ScheduleArgs),
    /// Disable and remove the units `install` wrote
    Remove(ScheduleArgs),
    /// List the units `install` wrote, and their timers' next runs
    Status(ScheduleArgs),
}

#[derive(Debug, Args)]
pub struct ScheduleArgs {
    /// User units, run as you while you are logged in (or lingering) [default]
    #[arg(long, conflicts_with = "system")]
    pub user: bool,
    /// System units in /etc/systemd/system (run as root)
    #[arg(long)]
    pub system: bool,
    /// Write the units into DIR and do nothing else (no systemctl)
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// `cairn run [JOB...]`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The jobs to run (default: all of them), as named by [jobs.NAME]
    pub jobs: Vec<String>,
    /// Then write every job's metrics to FILE in the Prometheus text format, for
    /// node_exporter's textfile collector (e.g. /var/lib/node_exporter/cairn.prom)
    #[arg(long, value_name = "FILE")]
    pub metrics_file: Option<PathBuf>,
}

/// `cairn daemon`.
#[derive(Debug, Args)]
pub struct DaemonArgs {
    /// How to log: `text` lines, or `json`, one object per event (on standard output)
    #[arg(long, value_name = "FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
    /// Serve the jobs' status (GET /status, JSON) and metrics (GET /metrics, Prometheus)
    /// on this loopback address, e.g. 127.0.0.1:9898
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// The token the status endpoint asks for (`Authorization: Bearer TOKEN`): the first
    /// line of FILE, made (random, 0600) if FILE does not exist [default:
    /// $XDG_STATE_HOME/cairn/daemon.token]
    #[arg(long, value_name = "FILE", requires = "listen")]
    pub token_file: Option<PathBuf>,
}

/// `cairn generate --completions SHELL` or `--man DIR`.
#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("what").required(true))]
pub struct GenerateArgs {
    /// Print completions for this shell to standard output (e.g. `cairn generate
    /// --completions bash > /etc/bash_completion.d/cairn`)
    #[arg(long, value_name = "SHELL", group = "what")]
    pub completions: Option<clap_complete::Shell>,
    /// Write a man page for cairn and each of its commands into DIR (cairn.1,
    /// cairn-backup.1, ...)
    #[arg(long, value_name = "DIR", group = "what")]
    pub man: Option<PathBuf>,
}

/// `cairn serve --dir DIR --listen ADDR`, or one of the management commands on DIR.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The directory whose subdirectories are the repositories
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
    /// Listen on HOST:PORT (plain HTTP only on a loopback address; else give --tls-cert
    /// and --tls-key), or on unix:PATH, a unix socket for a reverse proxy on this machine
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// The server's certificate chain (PEM)
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM)
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// How long deleted objects are kept (and `serve undelete` can put them back) before
    /// they are freed: 30s, 10m, 12h, 7d
    #[arg(long, value_name = "TIME", default_value = "7d", value_parser = parse_duration)]
    pub delete_delay: std::time::Duration,
    /// The largest upload accepted
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = parse_size_u64)]
    pub max_body: u64,
    /// Connections served at once; more wait their turn. One address (but loopback, a
    /// local proxy's) may hold at most half of them
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub max_connections: usize,
    /// How long a request may wait for its headers, or between two pieces of its body
    #[arg(long, value_name = "TIME", default_value = "60s", value_parser = parse_duration)]
    pub idle_timeout: std::time::Duration,
    #[command(subcommand)]
    pub command: Option<ServeCommand>,
}

#[derive(Debug, Subcommand)]
pub enum ServeCommand {
    /// Make, list and remove the tokens clients present
    #[command(subcommand)]
    Token(TokenCommand),
    /// Limit the bytes a repository may hold (deleted objects still held count), or
    /// `none`
    Quota {
        repo: String,
        #[arg(value_parser = parse_quota)]
        size: Quota,
    },
    /// Put back the objects deleted within the deletion delay
    Undelete {
        repo: String,
        /// Only list them
        #[arg(long)]
        list: bool,
    },
    /// Re-hash the stored objects against their names (no key needed) and report damage
    Scrub {
        /// One repository (default: all)
        repo: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Make a token; it is printed once, as the last word on standard output
    Add {
        /// A name for the token (for `token list`, `token remove` and the access log)
        name: String,
        /// The repository it opens
        #[arg(long)]
        repo: String,
        /// read, append (back up; never overwrite or delete), maintain (also init and key
        /// add, and delete, for forget and prune: held for the deletion delay), admin
        #[arg(long)]
        rights: cairn_server::access::Rights,
        /// The most bytes it may upload in all
        #[arg(long, value_name = "SIZE", value_parser = parse_size_u64)]
        quota: Option<u64>,
    },
    /// List the tokens (never the tokens themselves: only their hashes are stored)
    List,
    /// Remove a token; clients using it are refused from then on
    Remove { name: String },
}

/// A quota in bytes, or none.
#[derive(Debug, Clone, Copy)]
pub struct Quota(pub Option<u64>);

/// A size, or `none` for no limit.
fn parse_quota(s: &str) -> Result<Quota, String> {
    if s == "none" {
        return Ok(Quota(None));
    }
    parse_size_u64(s).map(|n| Quota(Some(n)))
}

/// `30s`, `10m`, `12h`, `7d`; a bare number is seconds.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a time like 30s, 10m, 12h or 7d"))?;
    let secs = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => return Err(format!("{s:?} is not a time like 30s, 10m, 12h or 7d")),
    };
    Ok(std::time::Duration::from_secs(n.saturating_mul(secs)))
}

/// `--host`, `--tag`, `--path`: which snapshots a command considers, and so which one
/// `latest` is (the newest of those selected).
#[derive(Debug, Args, Clone, Default)]
#[command(next_help_heading = "Snapshot filters")]
pub struct FilterArgs {
    /// Only snapshots of this host (repeatable: any of them)
    #[arg(long = "host", value_name = "HOST")]
    pub hosts: Vec<String>,
    /// Only snapshots with this tag; `a,b` means both (repeatable: any of them)
    #[arg(long = "tag", value_name = "TAG[,TAG...]")]
    pub tags: Vec<String>,
    /// Only snapshots that include this path (repeatable: all of them)
    #[arg(long = "path", value_name = "PATH")]
    pub paths: Vec<PathBuf>,
}

#[derive(Debug, Args)]
pub struct SnapshotsArgs {
    /// Show only the newest N snapshots of each group (by default of each host and paths)
    #[arg(long, value_name = "N")]
    pub latest: Option<usize>,
    /// Group snapshots by these fields: host, paths, tags (comma-separated)
    #[arg(long, value_name = "FIELDS")]
    pub group_by: Option<String>,
    /// One short line per snapshot: id, time, host, tags
    #[arg(long, short = 'c')]
    pub compact: bool,
    #[command(flatten)]
    pub filter: FilterArgs,
}

#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// List the key files: id, the one in use (*), host, creation time, key derivation
    #[command(visible_alias = "ls")]
    List,
    /// Add a password that opens the repository (with --write-only: a key that can back
    /// up but cannot read, list, restore or delete anything)
    Add(KeyAddArgs),
    /// Remove a key file (never the one in use, never the last)
    #[command(visible_alias = "rm")]
    Remove(KeyRemoveArgs),
    /// Replace the key in use with a new password (on the default repository without
    /// --new-password-file: with a new random key in its key file)
    Passwd(NewKeyArgs),
}

#[derive(Debug, Args)]
pub struct NewKeyArgs {
    /// Read the new password from the first line of this file (else it is asked for)
    #[arg(long, value_name = "FILE")]
    pub new_password_file: Option<PathBuf>,
    /// Host name recorded in the new key file (default: this host's)
    #[arg(long)]
    pub host: Option<String>,
}

#[derive(Debug, Args)]
pub struct KeyAddArgs {
    #[command(flatten)]
    pub new: NewKeyArgs,
    /// A key that writes but cannot read: for a machine that backs up, so that whoever
    /// takes it cannot read or remove the backups (format 3 repositories)
    #[arg(long)]
    pub write_only: bool,
}

#[derive(Debug, Args)]
pub struct KeyRemoveArgs {
    /// The key file's id, or a unique prefix of it (`cairn key list` shows them)
    pub id: String,
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Named repositories, used as `-r @NAME` or as the default
    #[command(subcommand)]
    Repo(RepoCommand),
    /// Check the config file: every error is given with its line and key
    Check,
}

#[derive(Debug, Subcommand)]
pub enum RepoCommand {
    /// Name a repository (it is not contacted)
    Add(RepoAddArgs),
    /// List the named repositories
    #[command(visible_alias = "ls")]
    List,
    /// Forget a name (the repository itself is untouched)
    #[command(visible_alias = "rm")]
    Remove(RepoRemoveArgs),
    /// Show, set or clear the repository used when no -r is given
    Default(RepoDefaultArgs),
}

#[derive(Debug, Args)]
pub struct RepoAddArgs {
    /// The name, used as `-r @NAME`: letters, digits, '-' and '_'
    pub name: String,
    /// The repository's address: a path, s3:... or sftp:...
    pub address: String,
    // These two share their ids with the global options, so that clap lets them take the
    // same names; `parse::command_line` drops the values the environment gave them.
    /// Run this shell command for the password whenever the repository is used
    #[arg(long, conflicts_with = "password_file")]
    pub password_command: Option<String>,
    /// Read the password from the first line of this file whenever the repository is used
    #[arg(long)]
    pub password_file: Option<PathBuf>,
    /// For a rest: address, read the server's token from the first line of this file
    /// (when CAIRN_REST_TOKEN is not set)
    #[arg(long, value_name = "FILE")]
    pub rest_token_file: Option<PathBuf>,
    /// Also make it the default repository
    #[arg(long)]
    pub default: bool,
    /// Replace an entry of the same name
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Args)]
pub struct RepoRemoveArgs {
    pub name: String,
}

#[derive(Debug, Args)]
pub struct RepoDefaultArgs {
    /// The name to make the default; without it, print the current default
    #[arg(conflicts_with = "unset")]
    pub name: Option<String>,
    /// Clear the default: commands without -r use the built-in default repository again
    #[arg(long)]
    pub unset: bool,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Also decrypt and verify every blob of every pack
    #[arg(long, conflicts_with = "read_data_subset")]
    pub read_data: bool,
    /// Verify a part of the packs: N/M (e.g. 1/7, one part a night) or P% (e.g. 10%)
    #[arg(long, value_name = "SUBSET")]
    pub read_data_subset: Option<String>,
}

#[derive(Debug, Args)]
pub struct ForgetArgs {
    /// Snapshots to remove (ids or unique prefixes); or give a policy instead
    pub snapshots: Vec<String>,
    /// Keep the newest N snapshots
    #[arg(long, value_name = "N")]
    pub keep_last: Option<u32>,
    /// Keep the newest snapshot of each of the last N hours
    #[arg(long, value_name = "N")]
    pub keep_hourly: Option<u32>,
    /// Keep the newest snapshot of each of the last N days
    #[arg(long, value_name = "N")]
    pub keep_daily: Option<u32>,
    /// Keep the newest snapshot of each of the last N weeks
    #[arg(long, value_name = "N")]
    pub keep_weekly: Option<u32>,
    /// Keep the newest snapshot of each of the last N months
    #[arg(long, value_name = "N")]
    pub keep_monthly: Option<u32>,
    /// Keep the newest snapshot of each of the last N years
    #[arg(long, value_name = "N")]
    pub keep_yearly: Option<u32>,
    /// Keep snapshots taken within this long of the newest one, e.g. 1y2m3d4h
    #[arg(long, value_name = "DURATION")]
    pub keep_within: Option<String>,
    /// Keep the newest snapshot of each hour within DURATION of the newest one
    #[arg(long, value_name = "DURATION")]
    pub keep_within_hourly: Option<String>,
    /// Keep the newest snapshot of each day within DURATION of the newest one
    #[arg(long, value_name = "DURATION")]
    pub keep_within_daily: Option<String>,
    /// Keep the newest snapshot of each week within DURATION of the newest one
    #[arg(long, value_name = "DURATION")]
    pub keep_within_weekly: Option<String>,
    /// Keep the newest snapshot of each month within DURATION of the newest one
    #[arg(long, value_name = "DURATION")]
    pub keep_within_monthly: Option<String>,
    /// Keep the newest snapshot of each year within DURATION of the newest one
    #[arg(long, value_name = "DURATION")]
    pub keep_within_yearly: Option<String>,
    /// Keep snapshots that carry this tag (repeatable)
    #[arg(long = "keep-tag", value_name = "TAG")]
    pub keep_tags: Vec<String>,
    /// Group snapshots by these fields: host, paths, tags (comma-separated; empty: one group)
    #[arg(long, default_value = "host,paths")]
    pub group_by: String,
    /// Show what would be removed, and why the rest is kept, without removing anything
    #[arg(short = 'n', long)]
    pub dry_run: bool,
    /// Run prune afterwards
    #[arg(long)]
    pub prune: bool,
    /// With --prune: repack packs with more unused space than this percentage
    #[arg(long, default_value_t = 5.0, value_name = "PERCENT")]
    pub max_unused: f64,
    #[command(flatten)]
    pub filter: FilterArgs,
}

/// `cairn tag [SNAPSHOT...] --add/--remove/--set TAG[,TAG]`.
#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("change").required(true).multiple(true))]
pub struct TagArgs {
    /// Snapshots to change (ids, unique prefixes, `latest`); without any, every snapshot
    /// the --host/--tag/--path filters select
    #[arg(value_name = "SNAPSHOT")]
    pub snapshots: Vec<String>,
    /// Add these tags (comma-separated, or repeat the option)
    #[arg(
        long,
        value_name = "TAG[,TAG]",
        value_delimiter = ',',
        group = "change"
    )]
    pub add: Vec<String>,
    /// Remove these tags
    #[arg(
        long,
        value_name = "TAG[,TAG]",
        value_delimiter = ',',
        group = "change"
    )]
    pub remove: Vec<String>,
    /// Replace all tags with these (`--set ''` removes every tag)
    #[arg(
        long,
        value_name = "TAG[,TAG]",
        value_delimiter = ',',
        group = "change"
    )]
    pub set: Option<Vec<String>>,
    /// Say which snapshots would change, without changing them
    #[arg(short = 'n', long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub filter: FilterArgs,
}

/// `cairn rewrite [SNAPSHOT...] --exclude GLOB [--forget]`.
#[derive(Debug, Args)]
pub struct RewriteArgs {
    /// Snapshots to rewrite (ids, unique prefixes, `latest`); without any, every snapshot
    /// the --host/--tag/--path filters select
    #[arg(value_name = "SNAPSHOT")]
    pub snapshots: Vec<String>,
    /// Leave out what matches GLOB, with backup's --exclude meaning, on the absolute paths
    /// in the snapshot (repeatable)
    #[arg(short = 'e', long = "exclude", value_name = "GLOB")]
    pub excludes: Vec<String>,
    /// Read exclude patterns from FILE, one per line
    #[arg(long = "exclude-file", value_name = "FILE")]
    pub exclude_files: Vec<PathBuf>,
    /// Remove each original once its new version is written (otherwise both stay); then
    /// `cairn prune` frees what only the originals held
    #[arg(long)]
    pub forget: bool,
    /// List what would be removed from each snapshot, without writing anything
    #[arg(short = 'n', long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub filter: FilterArgs,
}

#[derive(Debug, Args)]
pub struct PruneArgs {
    /// Repack packs with more unused space than this percentage
    #[arg(long, default_value_t = 5.0, value_name = "PERCENT")]
    pub max_unused: f64,
    /// Show what would be done without changing anything
    #[arg(short = 'n', long)]
    pub dry_run: bool,
}

#[derive(Debug, Subcommand)]
pub enum RepairCommand {
    /// Rebuild the index from the pack headers
    Index(RepairIndexArgs),
    /// Rewrite snapshots that need lost data: damaged files are kept as NAME.damaged
    Snapshots(RepairSnapshotsArgs),
}

#[derive(Debug, Args)]
pub struct RepairIndexArgs {
    /// Read every pack and leave damaged blobs out, so the next backup stores them again
    #[arg(long)]
    pub read_data: bool,
}

#[derive(Debug, Args)]
pub struct RepairSnapshotsArgs {
    /// Remove the damaged originals once their repaired versions are written
    #[arg(long)]
    pub forget: bool,
    /// Show what would be repaired without writing anything
    #[arg(short = 'n', long)]
    pub dry_run: bool,
}

/// The other repository of `copy` and `init --copy-chunker-params`.
#[derive(Debug, Args)]
pub struct FromRepoArgs {
    /// The other repository: an address or @NAME from the config file
    #[arg(long, value_name = "REPO", env = "CAIRN_FROM_REPOSITORY")]
    pub from_repo: Option<String>,
    /// Read the other repository's password from the first line of this file
    #[arg(long, value_name = "FILE", env = "CAIRN_FROM_PASSWORD_FILE")]
    pub from_password_file: Option<PathBuf>,
    /// Run this shell command and use the first line it prints as the other password
    #[arg(long, value_name = "CMD", env = "CAIRN_FROM_PASSWORD_COMMAND")]
    pub from_password_command: Option<String>,
}

#[derive(Debug, Args)]
pub struct CopyArgs {
    /// Snapshots of the other repository to copy (ids, unique prefixes or `latest`;
    /// default: all that are not here yet)
    pub snapshots: Vec<String>,
    #[command(flatten)]
    pub from: FromRepoArgs,
    /// Which snapshots of the other repository to copy, and which is `latest`
    #[command(flatten)]
    pub filter: FilterArgs,
}

#[derive(Debug, Args)]
pub struct InitArgs {
    /// Chunk and name data as the repository of --from-repo does, so that the two
    /// deduplicate together and `copy` between them sends only what is missing
    #[arg(long, conflicts_with_all = ["chunk_min", "chunk_avg", "chunk_max"])]
    pub copy_chunker_params: bool,
    #[command(flatten)]
    pub from: FromRepoArgs,
    /// Smallest chunk (default: half the average, e.g. 512K)
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub chunk_min: Option<u32>,
    /// Average chunk (default 1M; e.g. 64K for small, often edited files)
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub chunk_avg: Option<u32>,
    /// Largest chunk (default: eight times the average, e.g. 8M)
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub chunk_max: Option<u32>,
    /// zstd, zstd:LEVEL (1-22), lz4 or none
    #[arg(long, default_value = "zstd:3")]
    pub compression: String,
    /// Target size of pack files (1M to 1G; default 16M)
    #[arg(long, value_parser = parse_size)]
    pub pack_size: Option<u32>,
    /// aegis-256 or xchacha20-poly1305 (default: aegis-256 where the processor has AES
    /// instructions, xchacha20-poly1305 elsewhere; both read anywhere)
    #[arg(long, value_name = "CIPHER")]
    pub cipher: Option<cairn_core::crypto::Cipher>,
}

/// What backup leaves out; `diff` with a live directory takes the same options.
#[derive(Debug, Args)]
pub struct ExcludeArgs {
    /// Leave out what matches GLOB: without '/', a name anywhere; with '/', the end of
    /// the path (`py/test` leaves out /data/py/test), or from the root if it starts with
    /// '/'; `*` stays within a name, `**` spans directories (repeatable)
    #[arg(short = 'e', long = "exclude", value_name = "GLOB")]
    pub excludes: Vec<String>,
    /// Read exclude patterns from FILE, one per line
    #[arg(long = "exclude-file", value_name = "FILE")]
    pub exclude_files: Vec<PathBuf>,
    /// As --exclude, but matching names and paths without regard to case (repeatable)
    #[arg(long = "iexclude", value_name = "GLOB")]
    pub iexcludes: Vec<String>,
    /// Read case-insensitive exclude patterns from FILE, one per line
    #[arg(long = "iexclude-file", value_name = "FILE")]
    pub iexclude_files: Vec<PathBuf>,
    /// Also honour .gitignore files (.cairnignore files are always honoured)
    #[arg(long)]
    pub git_ignore: bool,
    /// Leave out a directory that holds a file named FILE (repeatable)
    #[arg(long = "exclude-if-present", value_name = "FILE")]
    pub exclude_if_present: Vec<OsString>,
    /// Leave out directories holding a CACHEDIR.TAG with the standard signature
    #[arg(long)]
    pub exclude_caches: bool,
    /// Leave out files larger than SIZE (e.g. 100M)
    #[arg(long, value_name = "SIZE", value_parser = parse_size_u64)]
    pub exclude_larger_than: Option<u64>,
}

#[derive(Debug, Args)]
pub struct BackupArgs {
    /// Files and directories to back up (with --stdin-from-command: the command and its
    /// arguments)
    #[arg(required_unless_present_any = ["stdin", "files_from", "files_from_verbatim", "files_from_raw"])]
    pub paths: Vec<PathBuf>,
    /// Also back up the paths listed in FILE, one a line; blank lines and lines starting
    /// with '#' are skipped, spaces around a path trimmed (repeatable; `-` reads standard
    /// input). A listed path that does not exist is an error
    #[arg(long, value_name = "FILE")]
    pub files_from: Vec<PathBuf>,
    /// As --files-from, but each line is a path exactly as written ('#' and spaces
    /// included; only empty lines are skipped)
    #[arg(long, value_name = "FILE")]
    pub files_from_verbatim: Vec<PathBuf>,
    /// As --files-from, but the paths are separated by NUL bytes (`find -print0`), so
    /// they may hold newlines
    #[arg(long, value_name = "FILE")]
    pub files_from_raw: Vec<PathBuf>,
    #[command(flatten)]
    pub exclude: ExcludeArgs,
    /// Tag the snapshot (repeatable, or comma-separated: `--tag a,b` gives two tags)
    #[arg(long = "tag", value_delimiter = ',')]
    pub tags: Vec<String>,
    /// Host name to record (default: this machine's)
    #[arg(long)]
    pub host: Option<String>,
    /// Do not cross into other filesystems
    #[arg(short = 'x', long)]
    pub one_file_system: bool,
    /// Back up standard input as one file
    #[arg(long, conflicts_with = "paths", requires = "stdin_filename")]
    pub stdin: bool,
    /// Run the command given after `--` and back up its standard output as one file
    /// (`cairn backup --stdin-from-command --stdin-filename db.sql -- pg_dump db`). If the
    /// command fails (exit status other than 0), so does the backup, and no snapshot is
    /// written
    #[arg(long, conflicts_with = "stdin", requires = "stdin_filename")]
    pub stdin_from_command: bool,
    /// Name of the file that --stdin or --stdin-from-command creates
    #[arg(long, value_name = "NAME")]
    pub stdin_filename: Option<String>,
    /// Compare with this snapshot instead of the latest one of the same host and paths
    #[arg(long, value_name = "SNAPSHOT")]
    pub parent: Option<String>,
    /// Read every file, even those whose metadata is unchanged
    #[arg(long)]
    pub force: bool,
    /// Threads reading files (default: the number of cores, at least 2). Each holds at
    /// most one chunk or one bundle of small files, so this bounds the working set.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub read_threads: Option<u16>,
    /// Do not count the files first: the progress display then shows counts and rate
    /// but no total or ETA
    #[arg(long)]
    pub no_scan: bool,
    /// Do everything but write: read, compress and pack the files, then say what a
    /// backup would add. Nothing is written to the repository
    #[arg(short = 'n', long)]
    pub dry_run: bool,
    /// List new and changed files on standard output (-v); also unchanged files, and
    /// each path left out with the pattern, ignore file, tag or limit that left it out
    /// (-vv). With --json, in the summary's `entries`
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// The snapshot's time instead of now: "2026-03-01 12:00:00" (local time) or RFC 3339
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub time: Option<jiff::Timestamp>,
}

#[derive(Debug, Args)]
pub struct LsArgs {
    /// Snapshot id, unique prefix, or `latest`
    pub snapshot: String,
    /// The directory to list (default `/`), or a file
    pub path: Option<OsString>,
    /// Long format: mode, owner, group, size, time
    #[arg(short, long)]
    pub long: bool,
    /// List everything below the path, not just its entries
    #[arg(short = 'R', long)]
    pub recursive: bool,
    #[command(flatten)]
    pub filter: FilterArgs,
}

#[derive(Debug, Args)]
pub struct CatArgs {
    /// Snapshot id, unique prefix, or `latest`
    pub snapshot: String,
    /// Absolute path of a file in the snapshot
    pub path: OsString,
    #[command(flatten)]
    pub filter: FilterArgs,
}

#[derive(Debug, Args)]
pub struct StatsArgs {
    /// Count only these snapshots (id, unique prefix or `latest`), reading their trees;
    /// without any, the whole repository from its index
    #[arg(value_name = "SNAPSHOT")]
    pub snapshots: Vec<String>,
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The old side: a snapshot (id, unique prefix, `latest`) or a live directory
    /// (a path with a '/', `.`, or an existing directory that is not a snapshot id)
    pub old: OsString,
    /// The new side, as the old one
    pub new: OsString,
    /// Compare only below this absolute path (relative: below the current directory
    /// when a side is a live directory)
    pub path: Option<OsString>,
    /// Also print a unified diff of each modified text file (reads both versions)
    #[arg(long)]
    pub content: bool,
    #[command(flatten)]
    pub filter: FilterArgs,
    // On the live side, leave out what backup would with these options (.cairnignore
    // files are always honoured), so that the diff shows what the next backup changes.
    #[command(flatten)]
    pub exclude: ExcludeArgs,
}

#[derive(Debug, Args)]
pub struct FindArgs {
    /// Globs: with a '/', matched against the absolute path (a relative one may start in
    /// any directory); without, against the name. An entry matches if any glob does
    #[arg(required = true, value_name = "PATTERN")]
    pub patterns: Vec<String>,
    /// Search only this snapshot (id, unique prefix or `latest`; repeatable)
    #[arg(short, long = "snapshot", value_name = "SNAPSHOT")]
    pub snapshots: Vec<String>,
    /// Files larger (+1M), smaller (-10K) or exactly (=4096 or 4096) this size
    #[arg(long, allow_hyphen_values = true, value_parser = parse_size_filter)]
    pub size: Option<SizeFilter>,
    /// Modified after DATE: 2026-03-01, 2026-03-01T12:00:00 (local time), RFC 3339, or
    /// an age like 7d, 12h, 30m, 2w
    #[arg(long, value_name = "DATE", value_parser = parse_when)]
    pub newer: Option<jiff::Timestamp>,
    /// Modified before DATE (same forms as --newer)
    #[arg(long, value_name = "DATE", value_parser = parse_when)]
    pub older: Option<jiff::Timestamp>,
    /// Only entries of this type: f (file), d (dir), l (symlink), p (fifo), s (socket),
    /// c (char device), b (block device); repeatable
    #[arg(short = 't', long = "type", value_name = "TYPE", value_parser = parse_type)]
    pub types: Vec<&'static str>,
    #[command(flatten)]
    pub filter: FilterArgs,
}

#[derive(Debug, Args)]
pub struct DumpArgs {
    /// Snapshot id, unique prefix, or `latest`
    pub snapshot: String,
    /// Absolute path in the snapshot (`/` for all of it)
    pub path: OsString,
    /// Archive format; directories are written as tar unless zip is asked for, and a file
    /// is written as it is unless a format is given
    #[arg(long, value_enum)]
    pub archive: Option<ArchiveFormat>,
    /// Write to this file instead of standard output
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub filter: FilterArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ArchiveFormat {
    Tar,
    Zip,
}

#[derive(Debug, Args)]
pub struct MountArgs {
    /// An empty directory to mount on
    pub mountpoint: PathBuf,
    #[command(flatten)]
    pub filter: FilterArgs,
}

#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// SNAPSHOT or SNAPSHOT:SUBPATH (then SUBPATH's contents land in the target)
    pub snapshot: OsString,
    /// Directory to restore into (created if missing)
    #[arg(short, long)]
    pub target: PathBuf,
    /// Re-read every restored file and check it, and hash every blob against its id (without
    /// it, a blob's authenticated seal vouches for its id)
    #[arg(long)]
    pub verify: bool,
    /// Restore into a non-empty target: `always` replaces existing files, `if-changed`
    /// those whose size or mtime differ (with --verify: or contents; use it to resume an
    /// interrupted restore), `if-newer` those older than the snapshot's, `never` none
    #[arg(long, value_name = "MODE")]
    pub overwrite: Option<OverwriteArg>,
    /// Restore only what matches GLOB (a name anywhere, or an absolute path in the
    /// snapshot if it has a '/'), with the directories above it (repeatable)
    #[arg(short = 'i', long = "include", value_name = "GLOB")]
    pub includes: Vec<String>,
    /// Do not restore what matches GLOB; an excluded directory is skipped whole (repeatable)
    #[arg(short = 'e', long = "exclude", value_name = "GLOB")]
    pub excludes: Vec<String>,
    /// Make the target match: remove what the snapshot (as filtered) does not hold, in
    /// the directories restored; implies --overwrite if-changed unless one is given.
    /// Refuses a target that holds nothing the snapshot holds, unless --force
    #[arg(long)]
    pub delete: bool,
    /// With --delete: delete even in a target that shares nothing with the snapshot
    #[arg(long, requires = "delete")]
    pub force: bool,
    /// Change nothing: say what would be written, kept and deleted (each path with -v)
    #[arg(short = 'n', long)]
    pub dry_run: bool,
    /// List every path written (with --dry-run: written, kept, unchanged) or deleted
    #[arg(short, long)]
    pub verbose: bool,
    /// Make no FIFOs or device nodes (sockets are never made); each one left out is
    /// listed. Without root, device nodes cannot be made anyway: each is an error
    #[arg(long)]
    pub no_special_files: bool,
    /// Clear setuid and setgid bits of restored files (directories keep setgid) and
    /// leave out their capabilities (security.capability); each file changed is listed. Root restores them by default, as a system restore needs;
    /// use this for a snapshot you do not trust or a tree another user owns
    #[arg(long)]
    pub no_setuid: bool,
    #[command(flatten)]
    pub filter: FilterArgs,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum OverwriteArg {
    Always,
    IfChanged,
    IfNewer,
    Never,
}

#[derive(Debug, Args)]
pub struct ChunkArgs {
    /// Files to chunk (with --sizes, directories too, walked recursively)
    #[arg(required = true, value_name = "PATH")]
    pub files: Vec<PathBuf>,
    /// Compare average chunk sizes on these files (e.g. 16K,64K,256K,1M,4M; minimum
    /// avg/2, maximum avg*8): one row per size with chunk counts, dedup, compressed size
    /// and chunking speed
    #[arg(
        long,
        value_delimiter = ',',
        value_parser = parse_chunk_average,
        conflicts_with_all = ["min", "avg", "max"],
    )]
    pub sizes: Vec<ChunkerParams>,
    /// Smallest chunk (default: half the average)
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub min: Option<u32>,
    /// Average chunk (default: the repository default, 1M)
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub avg: Option<u32>,
    /// Largest chunk (default: eight times the average)
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub max: Option<u32>,
}

/// Chunk sizes from `--min/--avg/--max` (or `--chunk-*`): limits not given follow the
/// average as `--sizes` derives them (avg/2, avg*8), or are the defaults without one, so
/// `--avg 64K` alone is valid.
pub fn chunker_params(
    min: Option<u32>,
    avg: Option<u32>,
    max: Option<u32>,
) -> Result<ChunkerParams, cairn_core::chunker::ParamsError> {
    let base = match avg {
        Some(avg) => ChunkerParams::for_average(avg).unwrap_or(ChunkerParams {
            avg_size: avg,
            ..ChunkerParams::DEFAULT
        }),
        None => ChunkerParams::DEFAULT,
    };
    ChunkerParams::new(
        min.unwrap_or(base.min_size),
        base.avg_size,
        max.unwrap_or(base.max_size),
    )
}

/// An average chunk size for `chunk --sizes`, with the limits derived from it.
fn parse_chunk_average(s: &str) -> Result<ChunkerParams, String> {
    ChunkerParams::for_average(parse_size(s)?)
        .map_err(|e| format!("{s:?} cannot be an average chunk size: {e}"))
}

/// `4096`, `64K`, `1M`, `1MiB`, `2G`: binary units, up to 4 GiB - 1.
pub fn parse_size(s: &str) -> Result<u32, String> {
    u32::try_from(parse_size_u64(s)?).map_err(|_| format!("{s:?} is too large"))
}

/// Like `parse_size`, with `T` too, for sizes of files rather than of chunks.
pub fn parse_size_u64(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size like 4096, 64K or 1M"))?;
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use K, M, G or T)")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// `+1M` (larger), `-10K` (smaller), `=4096` or `4096` (exactly), binary units.
pub fn parse_size_filter(s: &str) -> Result<SizeFilter, String> {
    let (make, rest): (fn(u64) -> SizeFilter, &str) = match s.as_bytes().first() {
        Some(b'+') => (SizeFilter::Larger, &s[1..]),
        Some(b'-') => (SizeFilter::Smaller, &s[1..]),
        Some(b'=') => (SizeFilter::Exactly, &s[1..]),
        _ => (SizeFilter::Exactly, s),
    };
    parse_size_u64(rest)
        .map(make)
        .map_err(|_| format!("{s:?} is not a size like +1M, -10K or =4096 (units K, M, G, T)"))
}

/// A point in time: a date or date and time in the local time zone, an RFC 3339
/// timestamp, or an age before now (`7d`, `12h`, `30m`, `45s`, `2w`).
pub fn parse_when(s: &str) -> Result<jiff::Timestamp, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if !num.is_empty() && matches!(unit, "s" | "m" | "h" | "d" | "w") {
        let n: i64 = num.parse().map_err(|_| format!("{s:?}: age too large"))?;
        let unit_secs = match unit {
            "s" => 1,
            "m" => 60,
            "h" => 3600,
            "d" => 86_400,
            _ => 7 * 86_400,
        };
        let secs = n
            .checked_mul(unit_secs)
            .ok_or_else(|| format!("{s:?}: age too large"))?;
        return jiff::Timestamp::now()
            .checked_sub(jiff::SignedDuration::from_secs(secs))
            .map_err(|e| format!("{s:?}: {e}"));
    }
    if let Ok(ts) = t.parse::<jiff::Timestamp>() {
        return Ok(ts);
    }
    let local = jiff::tz::TimeZone::system();
    if let Ok(dt) = t.parse::<jiff::civil::DateTime>() {
        return dt
            .to_zoned(local)
            .map(|z| z.timestamp())
            .map_err(|e| format!("{s:?}: {e}"));
    }
    Err(format!(
        "{s:?} is not a date like 2026-03-01, 2026-03-01T12:00:00 or an age like 7d"
    ))
}

/// A point in time as a snapshot records it: RFC 3339, or a local date and time
/// (`2026-03-01 12:00:00`, `2026-03-01T12:00:00`).
pub fn parse_time(s: &str) -> Result<jiff::Timestamp, String> {
    let t = s.trim();
    if let Ok(ts) = t.parse::<jiff::Timestamp>() {
        return Ok(ts);
    }
    match t.parse::<jiff::civil::DateTime>() {
        Ok(dt) => dt
            .to_zoned(jiff::tz::TimeZone::system())
            .map(|z| z.timestamp())
            .map_err(|e| format!("{s:?}: {e}")),
        Err(_) => Err(format!(
            "{s:?} is not a time like \"2026-03-01 12:00:00\" or 2026-03-01T12:00:00Z"
        )),
    }
}

/// find(1)'s type letters, or cairn's type names, to cairn's type names.
pub fn parse_type(s: &str) -> Result<&'static str, String> {
    Ok(match s {
        "f" | "file" => "file",
        "d" | "dir" => "dir",
        "l" | "symlink" => "symlink",
        "p" | "fifo" => "fifo",
        "s" | "socket" => "socket",
        "c" | "chardev" => "chardev",
        "b" | "blockdev" => "blockdev",
        _ => return Err(format!("{s:?} is not a type: use f, d, l, p, s, c or b")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_filters_parse_like_find() {
        assert_eq!(parse_size_filter("+1M"), Ok(SizeFilter::Larger(1 << 20)));
        assert_eq!(parse_size_filter("-10K"), Ok(SizeFilter::Smaller(10 << 10)));
        assert_eq!(parse_size_filter("=5"), Ok(SizeFilter::Exactly(5)));
        assert_eq!(parse_size_filter("5"), Ok(SizeFilter::Exactly(5)));
        assert!(parse_size_filter("+1X").is_err());
        assert!(parse_size_filter("+").is_err());
    }

    #[test]
    fn times_parse_as_dates_timestamps_and_ages() {
        let day = parse_when("2026-03-01").unwrap();
        let noon = parse_when("2026-03-01T12:00:00").unwrap();
        assert_eq!(noon.as_second() - day.as_second(), 12 * 3600);
        assert_eq!(
            parse_when("2026-03-01T00:00:00Z").unwrap().as_second(),
            1_772_323_200
        );
        let week = parse_when("7d").unwrap();
        let age = jiff::Timestamp::now().as_second() - week.as_second();
        assert!((7 * 86_400..7 * 86_400 + 60).contains(&age), "{age}");
        assert!(parse_when("yesterday").is_err());
    }

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert!(parse_size("1X").is_err());
        assert!(parse_size("8G").is_err());
    }

    #[test]
    fn config_repo_add_takes_its_own_password_options() {
        let cli = Cli::try_parse_from([
            "cairn",
            "config",
            "repo",
            "add",
            "nas",
            "sftp://nas/x",
            "--password-command",
            "pass show cairn",
        ])
        .unwrap();
        let Command::Config(ConfigCommand::Repo(RepoCommand::Add(a))) = cli.command else {
            panic!("parsed as config repo add: {:?}", cli.command);
        };
        assert_eq!(a.password_command.as_deref(), Some("pass show cairn"));
        assert_eq!(a.password_file, None);
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn global_flags_work_after_the_command() {
        let cli = Cli::try_parse_from(["cairn", "snapshots", "--json", "-r", "/x"]).unwrap();
        assert!(cli.global.json);
        assert_eq!(cli.global.repo.as_deref(), Some("/x"));
    }
}
