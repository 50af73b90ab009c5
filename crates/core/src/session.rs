//! Sessions: how prune learns which backups, copies, repairs and other prunes are running,
//! without a lock and without trusting any host's clock.
//!
//! A session is a small sealed file in `sessions/` that its process writes again every
//! heartbeat interval (a new file; the one before the last is then deleted, so a listing
//! that takes less than an interval always sees one of the last two). Whether a session
//! is alive is judged by the **storage's** timestamps: the age of its newest file,
//! measured against the judge's own newest file. No host's clock is compared with
//! another's. A session also records the trash generation it has observed (see
//! [`crate::trash`]): prune deletes a pack condemned in generation `g` only when every
//! live session has observed `g`. The argument is in `docs/ARCHITECTURE.md`.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use cairn_storage::{Storage, StorageError};
use serde::{Deserialize, Serialize};

use crate::crypto::{MasterKey, Purpose};
use crate::error::{Error, Result};
use crate::repo::Repository;

/// How often a session writes its file, unless `CAIRN_HEARTBEAT_SECS` says otherwise.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(300);

/// How long after [`Session::observe`] the file saying what the session observed is
/// written. An unchanged backup takes 10-300 ms here: its file would be removed moments
/// after being made durable, a durable write (two fsyncs on a local disk, a request on
/// S3) and a removal for nothing. Prunes that list sessions meanwhile defer deletions,
/// as they would until any session's observe file is stored.
pub const OBSERVE_DELAY: Duration = Duration::from_secs(1);

/// A session whose newest file is this many of its own intervals old (storage time) is
/// taken for crashed.
pub const MISSED_BEATS: u32 = 4;

/// Session files without a heartbeat (unreadable ones, or written by cairn before
/// heartbeats) end after this much storage time.
const UNKNOWN_STALE_AFTER: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SessionKind {
    /// Adds data and snapshots: backup, copy.
    Backup,
    /// Condemns or deletes: prune, repair. One at a time.
    Maintenance,
}

/// What a session file says.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionInfo {
    /// Random, the same in every file of one session.
    pub id: String,
    pub kind: SessionKind,
    pub host: String,
    /// `/proc/sys/kernel/random/boot_id` and the pid namespace (`/proc/self/ns/pid`):
    /// together they tell whether `pid` is a process a judge on this machine, in this
    /// boot and container, can look up.
    pub boot_id: Option<String>,
    #[serde(default)]
    pub pid_ns: Option<String>,
    pub pid: u32,
    /// The process's start time in clock ticks since boot (`/proc/PID/stat`), so a reused
    /// pid is not taken for the session's process.
    pub process_start: Option<u64>,
    /// By the host's clock: shown to people, never compared.
    pub started: jiff::Timestamp,
    pub seq: u64,
    pub heartbeat_secs: u64,
    /// The trash generation this session has read and honours; `None` until it has.
    pub observed: Option<u64>,
    /// Written when the session stopped without finishing (an error, Ctrl-C): it has
    /// ended, and it may have left packs in no index for the next backup to adopt.
    #[serde(default)]
    pub stopped: bool,
}

impl SessionInfo {
    /// Parses a session file's plaintext (what `object::open` returns).
    pub fn from_json(json: &[u8]) -> std::result::Result<SessionInfo, serde_json::Error> {
        serde_json::from_slice(json)
    }

    /// Storage time after which a silent session is taken for crashed. The interval is
    /// the file's, so it may be anything: an absurd one saturates (the session then
    /// never goes stale by silence) rather than overflow, which panicked every prune.
    pub fn stale_after(&self) -> Duration {
        Duration::from_secs(self.heartbeat_secs.max(1))
            .checked_mul(MISSED_BEATS)
            .unwrap_or(Duration::MAX)
    }

    pub fn describe(&self) -> String {
        let what = match self.kind {
            SessionKind::Backup => "backup",
            SessionKind::Maintenance => "prune or repair",
        };
        format!(
            "{what} on {} (pid {}, started {})",
            self.host,
            self.pid,
            self.started.strftime("%Y-%m-%d %H:%M:%S UTC")
        )
    }
}

/// One session as a listing shows it: its files and the newest one's content and time.
#[derive(Debug, Clone)]
pub struct SessionView {
    pub files: Vec<String>,
    /// `None` when no file of it could be read (damaged, or another key's).
    pub info: Option<SessionInfo>,
    /// The newest file's time, by the storage's clock.
    pub beat: SystemTime,
}

/// Whether a session counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    Live,
    /// It ended without removing its files; why.
    Ended(String),
}

/// The machine (boot and pid namespace) a judge runs on, to recognise its own dead
/// processes. Host names are not used: `--host` may name another machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    pub boot_id: Option<String>,
    pub pid_ns: Option<String>,
}

impl Host {
    pub fn this() -> Host {
        Host {
            boot_id: boot_id(),
            pid_ns: pid_namespace(),
        }
    }
}

impl SessionView {
    /// Live, or ended and why: stopped, a dead process of this very machine, or no new
    /// file for [`MISSED_BEATS`] intervals by the storage's clock (`now` is the time the
    /// storage gave the judge's own newest file).
    pub fn standing(&self, now: SystemTime, here: &Host) -> Standing {
        judge(self.info.as_ref(), self.beat, now, here, process_alive)
    }
}

/// [`SessionView::standing`] with the process check passed in (the simulation has no
/// processes).
pub fn judge(
    info: Option<&SessionInfo>,
    beat: SystemTime,
    now: SystemTime,
    here: &Host,
    alive: impl Fn(u32, Option<u64>) -> bool,
) -> Standing {
    // A newest file younger than the judge's own counts as fresh.
    let age = now.duration_since(beat).unwrap_or_default();
    let Some(info) = info else {
        if age > UNKNOWN_STALE_AFTER {
            return Standing::Ended(format!("unreadable, and untouched for {}", human(age)));
        }
        return Standing::Live;
    };
    if info.stopped {
        return Standing::Ended("it stopped before finishing".into());
    }
    let same_machine = info.boot_id.is_some()
        && info.pid_ns.is_some()
        && info.boot_id == here.boot_id
        && info.pid_ns == here.pid_ns;
    if same_machine && !alive(info.pid, info.process_start) {
        return Standing::Ended(format!("its process {} is gone", info.pid));
    }
    if age > info.stale_after() {
        return Standing::Ended(format!(
            "no heartbeat for {} by the storage's clock",
            human(age)
        ));
    }
    Standing::Live
}

fn human(d: Duration) -> String {
    let d = jiff::SignedDuration::from_secs(d.as_secs() as i64);
    format!("{d:#}")
}

/// Every session in the repository, its files grouped by session id. Files deleted
/// while being read (a heartbeat replacing them) are skipped.
pub fn list(repo: &Repository) -> Result<Vec<SessionView>> {
    list_in(repo.storage().as_ref(), repo.key())
}

/// Reads every session file listed. A file that vanished between the listing and its
/// read sends the reader to list again (a session whose reads were slow enough could
/// otherwise lose every file it had listed, and go unseen); after a few tries it counts
/// as unreadable, which blocks deletions like any session whose word is unknown.
fn list_in(storage: &dyn Storage, key: &MasterKey) -> Result<Vec<SessionView>> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let (views, vanished) = list_once(storage, key)?;
        if !vanished || attempt == 4 {
            return Ok(views);
        }
    }
}

/// One listing and its reads, and whether a listed file vanished (it is among the views
/// as unreadable).
fn list_once(storage: &dyn Storage, key: &MasterKey) -> Result<(Vec<SessionView>, bool)> {
    let mut vanished = false;
    let mut by_id: BTreeMap<String, (SessionView, u64)> = BTreeMap::new();
    let mut unreadable = Vec::new();
    for (name, time) in storage.list_modified("sessions")? {
        let info = match storage.read(&name) {
            Ok(bytes) => crate::object::open(key, Purpose::Session, &bytes)
                .ok()
                .and_then(|j| SessionInfo::from_json(&j).ok())
                .map(|mut info| {
                    // A writer cannot read the trash: its word on what it observed is
                    // none (a planted one could otherwise raise the generation floor).
                    if key.sealed_by_writer(&bytes) {
                        info.observed = None;
                    }
                    info
                }),
            Err(StorageError::NotFound { .. }) => {
                vanished = true;
                None
            }
            Err(e) => return Err(e.into()),
        };
        let Some(info) = info else {
            unreadable.push(SessionView {
                files: vec![name],
                info: None,
                beat: time,
            });
            continue;
        };
        let seq = info.seq;
        let entry = by_id.entry(info.id.clone()).or_insert_with(|| {
            (
                SessionView {
                    files: Vec::new(),
                    info: None,
                    beat: time,
                },
                0,
            )
        });
        entry.0.files.push(name);
        if entry.0.info.is_none() || seq >= entry.1 || info.stopped {
            entry.0.info = Some(info);
            entry.1 = seq;
        }
        entry.0.beat = entry.0.beat.max(time);
    }
    let mut out: Vec<SessionView> = by_id.into_values().map(|(v, _)| v).collect();
    out.extend(unreadable);
    Ok((out, vanished))
}

/// The other sessions and how they stand, judged against this session's newest file.
pub struct Survey {
    /// The storage's time of this session's newest file: "now" by the storage's clock.
    pub now: SystemTime,
    pub others: Vec<(SessionView, Standing)>,
}

impl Survey {
    pub fn live(&self) -> impl Iterator<Item = &SessionView> {
        self.others
            .iter()
            .filter(|(_, s)| *s == Standing::Live)
            .map(|(v, _)| v)
    }

    pub fn ended(&self) -> impl Iterator<Item = (&SessionView, &str)> {
        self.others.iter().filter_map(|(v, s)| match s {
            Standing::Ended(why) => Some((v, why.as_str())),
            Standing::Live => None,
        })
    }
}

/// A registered session of this process: it keeps writing its file until finished.
pub struct Session {
    shared: Arc<Shared>,
    beater: Option<JoinHandle<()>>,
}

struct Shared {
    storage: Arc<dyn Storage>,
    key: Arc<MasterKey>,
    interval: Duration,
    state: Mutex<State>,
    wake: Condvar,
}

struct State {
    info: SessionInfo,
    /// This session's files, oldest first; at most the last two are kept.
    files: Vec<String>,
    /// Boot time (which counts suspend, unlike a monotonic clock) when the last
    /// successful write began.
    last_ok: Duration,
    /// Whether this session ever went silent long enough that a prune may have taken it
    /// for crashed: from then on it cannot rely on its observed generation.
    lost: bool,
    /// When a file is to be written before the next interval ([`Session::observe`]).
    beat_at: Option<Instant>,
    stop: bool,
}

impl Session {
    /// Writes the first file and starts the heartbeat.
    pub fn start(repo: &Repository, kind: SessionKind, host: &str) -> Result<Session> {
        let interval = heartbeat_interval();
        let info = SessionInfo {
            id: hex::encode(rand::random::<[u8; 16]>()),
            kind,
            host: host.to_string(),
            boot_id: boot_id(),
            pid_ns: pid_namespace(),
            pid: std::process::id(),
            process_start: process_start(std::process::id()),
            started: jiff::Timestamp::now(),
            seq: 0,
            heartbeat_secs: interval.as_secs().max(1),
            observed: None,
            stopped: false,
        };
        let shared = Arc::new(Shared {
            storage: Arc::clone(repo.storage()),
            key: Arc::clone(repo.key()),
            interval,
            state: Mutex::new(State {
                info,
                files: Vec::new(),
                last_ok: boot_time(),
                lost: false,
                beat_at: None,
                stop: false,
            }),
            wake: Condvar::new(),
        });
        shared.beat()?;
        let beater = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("cairn-heartbeat".into())
                .spawn(move || shared.run())
                .map_err(|e| Error::io("a thread for the session's heartbeat", e))?
        };
        Ok(Session {
            shared,
            beater: Some(beater),
        })
    }

    /// A prune's or repair's session: refused, with the other one named, while another
    /// maintenance session is live, so that trash generations only grow.
    pub fn start_maintenance(repo: &Repository, host: &str, here: &Host) -> Result<Session> {
        let session = Session::start(repo, SessionKind::Maintenance, host)?;
        let survey = session.survey(repo, here)?;
        let other = survey
            .live()
            .filter_map(|v| v.info.as_ref())
            .find(|i| i.kind == SessionKind::Maintenance)
            .cloned();
        if let Some(other) = other {
            session.finish();
            return Err(Error::InvalidInput(format!(
                "another prune is running: {}. Only one prune or repair runs at a time; run \
                 this one when that has finished (if it crashed, its session ends after {} \
                 without a heartbeat, or at once on its own machine)",
                other.describe(),
                human(other.stale_after())
            )));
        }
        Ok(session)
    }

    pub fn info(&self) -> SessionInfo {
        self.shared.lock().info.clone()
    }

    /// Records that this session has read trash generation `observed` (`None`: it could
    /// not read every trash file), and has the heartbeat thread write a file saying so
    /// [`OBSERVE_DELAY`] later (or at the next interval, or when an earlier call's file is
    /// due, if sooner), while the caller goes on.
    ///
    /// Until that file is stored, the session's newest file says it observed nothing,
    /// which holds back every deletion (`prune::may_delete`): waiting for the write would
    /// only make prunes defer less, and it cost an unchanged backup a durable write
    /// (file and directory fsynced; on S3 a request) before its walk. A session that
    /// ends sooner writes no such file at all. A failed write is retried at the next
    /// interval, as a heartbeat's is.
    pub fn observe(&self, observed: Option<u64>) {
        let mut state = self.shared.lock();
        state.info.observed = observed;
        // A write already due keeps its time: calls in turn must not put it off forever.
        let at = Instant::now() + OBSERVE_DELAY.min(self.shared.interval);
        state.beat_at = Some(state.beat_at.map_or(at, |due| due.min(at)));
        drop(state);
        self.shared.wake.notify_all();
    }

    /// Writes a file now: afterwards the session is fresh for a while.
    pub fn beat(&self) -> Result<()> {
        self.shared.beat()
    }

    /// Whether, since it started, this session was ever silent long enough
    /// ([`lost_after`](Self::lost_after)) that a prune may have judged it ended. A lost session re-checks everything it relies on before it commits.
    pub fn lost(&self) -> bool {
        let mut state = self.shared.lock();
        if boot_time().saturating_sub(state.last_ok) >= self.shared.lost_after() {
            state.lost = true;
        }
        state.lost
    }

    /// Silence after which this session counts as lost: well inside the
    /// [`MISSED_BEATS`] intervals of storage time after which others judge it ended.
    pub fn lost_after(&self) -> Duration {
        self.shared.lost_after()
    }

    /// Sessions other than this one, judged by the storage's time of this session's
    /// newest file: write a file first ([`beat`](Self::beat)) for an up-to-date judge.
    pub fn survey(&self, repo: &Repository, here: &Host) -> Result<Survey> {
        let mine = self.info().id;
        // A listing may miss a file being replaced; ours is among the last two, so a
        // second listing finds it.
        for _ in 0..3 {
            let views = list(repo)?;
            let own = views
                .iter()
                .find(|v| v.info.as_ref().is_some_and(|i| i.id == mine))
                .map(|v| v.beat);
            if let Some(now) = own {
                let others = views
                    .into_iter()
                    .filter(|v| v.info.as_ref().is_none_or(|i| i.id != mine))
                    .map(|v| {
                        let standing = v.standing(now, here);
                        (v, standing)
                    })
                    .collect();
                return Ok(Survey { now, others });
            }
            self.beat()?;
        }
        Err(Error::InvalidInput(format!(
            "This process's own session file is missing from {}/sessions: another process \
             may be deleting session files. Run the command again",
            repo.storage().location()
        )))
    }

    /// Ends the session: stops the heartbeat and deletes its files. It comes after the
    /// work is committed, so it does not fail: if a file cannot be deleted, a last file
    /// saying the session stopped is tried, and others remove the rest.
    ///
    /// The removals are not waited for to be durable (a local repository's directory
    /// fsyncs, 0.2-0.3 ms each here, of a 12-16 ms unchanged backup): files that a crash
    /// brings back name a process that has ended, with its work durable before they
    /// went, and such a session only holds prunes back until judged ended
    /// (`docs/ARCHITECTURE.md`).
    pub fn finish(mut self) {
        self.stop();
        let files = std::mem::take(&mut self.shared.lock().files);
        let mut left = Vec::new();
        for name in files {
            if cairn_storage::removed(self.shared.storage.delete_unsynced(&name)).is_err() {
                left.push(name);
            }
        }
        if !left.is_empty() {
            let mut state = self.shared.lock();
            state.files = left;
            state.info.stopped = true;
            drop(state);
            let _ = self.shared.beat();
        }
    }

    fn stop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.beater.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Session {
    /// Stopped without [`finish`](Session::finish) (an error, Ctrl-C): a last file says
    /// so, so that others need not wait for the session to go stale, and the next
    /// backup knows to adopt the packs it may have left in no index.
    fn drop(&mut self) {
        if self.beater.is_none() {
            return;
        }
        self.stop();
        self.shared.lock().info.stopped = true;
        let _ = self.shared.beat();
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One and a half intervals: a listing sees one of the last two files, so a judge
    /// sees a file at most two intervals older than the newest, and three and a half
    /// stay below the [`MISSED_BEATS`] after which it judges the session ended.
    fn lost_after(&self) -> Duration {
        self.interval.max(Duration::from_secs(1)) * 3 / 2
    }

    fn run(&self) {
        let mut state = self.lock();
        let mut due = Instant::now() + self.interval;
        loop {
            // Checked under the lock before waiting: a stop requested before this thread
            // first waited would otherwise go unseen for a whole interval.
            if state.stop {
                return;
            }
            let now = Instant::now();
            let wanted = state.beat_at.map_or(due, |at| at.min(due));
            if now >= wanted {
                state.beat_at = None;
                drop(state);
                // A failed write is retried at the next interval; `lost` tells whether
                // the silence grew too long.
                let _ = self.beat();
                due = Instant::now() + self.interval;
                state = self.lock();
                continue;
            }
            state = self
                .wake
                .wait_timeout(state, wanted - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Writes the next file, then deletes the one before the previous.
    fn beat(&self) -> Result<()> {
        let (bytes, began) = {
            let mut state = self.lock();
            state.info.seq += 1;
            let json = serde_json::to_vec(&state.info).expect("a session serializes");
            (
                crate::object::seal(&self.key, Purpose::Session, &json),
                boot_time(),
            )
        };
        let name = format!("sessions/{}", blake3::hash(&bytes).to_hex());
        self.storage.write(&name, &bytes)?;
        let old = {
            let mut state = self.lock();
            if began.saturating_sub(state.last_ok) >= self.lost_after() {
                state.lost = true;
            }
            // A beat from the main thread and one from the heartbeat may overlap.
            state.last_ok = state.last_ok.max(began);
            state.files.push(name);
            // A stopped session's last file stands alone: it need not be found among
            // later ones.
            let keep = if state.info.stopped { 1 } else { 2 };
            let excess = state.files.len().saturating_sub(keep);
            state.files.drain(..excess).collect::<Vec<_>>()
        };
        for name in old {
            cairn_storage::delete_if_present(self.storage.as_ref(), &name)?;
        }
        Ok(())
    }
}

/// Deletes the files of sessions that ended without doing so.
pub fn remove(repo: &Repository, view: &SessionView) -> Result<()> {
    for name in &view.files {
        cairn_storage::delete_if_present(repo.storage().as_ref(), name)?;
    }
    Ok(())
}

fn heartbeat_interval() -> Duration {
    std::env::var("CAIRN_HEARTBEAT_SECS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&s| s > 0)
        .map_or(DEFAULT_HEARTBEAT, Duration::from_secs)
}

/// Time since boot, suspend included.
pub fn boot_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec to the valid pointer it is given.
    let ok = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) } == 0;
    if !ok {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// This machine's host name, for session files of commands that take no `--host`.
pub fn local_host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

fn pid_namespace() -> Option<String> {
    std::fs::read_link("/proc/self/ns/pid")
        .ok()
        .map(|p| p.to_string_lossy().into_owned())
}

fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Field 22 of `/proc/PID/stat`: the process's start time in ticks since boot.
fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

/// Whether process `pid` of this boot still runs and is the one that started at `start`.
/// Only the kernel's "no such process" counts as dead: another user's process may be
/// hidden from `/proc` (`hidepid`) or refuse signals, and is then taken as alive.
pub fn process_alive(pid: u32, start: Option<u64>) -> bool {
    let Ok(pid_t) = libc::pid_t::try_from(pid) else {
        return true;
    };
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    let exists = unsafe { libc::kill(pid_t, 0) } == 0
        || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH);
    if !exists {
        return false;
    }
    match (process_start(pid), start) {
        (Some(now), Some(then)) => now == then,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer cannot read the trash, so a session file a writer sealed observed nothing,
    /// whatever it says: a planted one claiming the last generation there is must not
    /// raise the floor prune condemns above (see `trash::condemn`).
    #[test]
    fn a_writers_session_file_observed_nothing_whatever_it_says() {
        let dir = tempfile::tempdir().unwrap();
        let repo = crate::repo::test_repository(dir.path());
        let writer = repo.config().write_only_key(repo.key()).unwrap();
        writer.bind_repository(&repo.config().id).unwrap();
        let claims = SessionInfo {
            observed: Some(u64::MAX),
            ..info("h", "b", 1, 60)
        };
        for (key, observed) in [(&writer, None), (repo.key().as_ref(), Some(u64::MAX))] {
            let json = serde_json::to_vec(&claims).unwrap();
            let bytes = crate::object::seal(key, Purpose::Session, &json);
            let name = format!("sessions/{}", blake3::hash(&bytes).to_hex());
            repo.storage().write(&name, &bytes).unwrap();
            let views = list(&repo).unwrap();
            let view = views.iter().find(|v| v.files.contains(&name)).unwrap();
            assert_eq!(view.info.as_ref().unwrap().observed, observed);
            repo.storage().delete(&name).unwrap();
        }
    }

    type Hook = Box<dyn Fn(&dyn Storage, &str) -> cairn_storage::Result<()> + Send + Sync>;

    /// A storage that calls `before_read` before each read and `before_write` before
    /// each write, with the storage beneath and the name.
    struct Hooked {
        inner: Arc<dyn Storage>,
        before_read: Hook,
        before_write: Hook,
    }

    fn no_hook() -> Hook {
        Box::new(|_, _| Ok(()))
    }

    /// A new repository in `dir`, opened through storage that calls `before_write`
    /// before each write.
    fn hooked_on_writes(dir: &std::path::Path, before_write: Hook) -> Repository {
        drop(crate::repo::test_repository(dir));
        let storage = Hooked {
            inner: Arc::new(cairn_storage::LocalStorage::new(dir)),
            before_read: no_hook(),
            before_write,
        };
        Repository::open(Arc::new(storage), b"pw".as_slice()).unwrap()
    }

    impl std::fmt::Debug for Hooked {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Hooked").finish_non_exhaustive()
        }
    }

    impl Storage for Hooked {
        fn location(&self) -> String {
            self.inner.location()
        }
        fn read(&self, name: &str) -> cairn_storage::Result<Vec<u8>> {
            (self.before_read)(self.inner.as_ref(), name)?;
            self.inner.read(name)
        }
        fn read_range(&self, name: &str, offset: u64, len: u64) -> cairn_storage::Result<Vec<u8>> {
            self.inner.read_range(name, offset, len)
        }
        fn write(&self, name: &str, data: &[u8]) -> cairn_storage::Result<()> {
            (self.before_write)(self.inner.as_ref(), name)?;
            self.inner.write(name, data)
        }
        fn list(&self, dir: &str) -> cairn_storage::Result<Vec<String>> {
            self.inner.list(dir)
        }
        fn list_modified(&self, dir: &str) -> cairn_storage::Result<Vec<(String, SystemTime)>> {
            self.inner.list_modified(dir)
        }
        fn temporaries(&self) -> cairn_storage::Result<Vec<(String, SystemTime)>> {
            self.inner.temporaries()
        }
        fn delete_temporary(&self, name: &str) -> cairn_storage::Result<()> {
            self.inner.delete_temporary(name)
        }
        fn size(&self, name: &str) -> cairn_storage::Result<u64> {
            self.inner.size(name)
        }
        fn exists(&self, name: &str) -> cairn_storage::Result<bool> {
            self.inner.exists(name)
        }
        fn delete(&self, name: &str) -> cairn_storage::Result<()> {
            self.inner.delete(name)
        }
    }

    /// A session that finishes within [`OBSERVE_DELAY`] of `observe` writes one file in
    /// all; one that lives on writes the observe file too, and removes both.
    #[test]
    fn a_session_over_before_the_observe_delay_writes_no_observe_file() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let dir = tempfile::tempdir().unwrap();
        let writes = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&writes);
        let repo = hooked_on_writes(
            dir.path(),
            Box::new(move |_, name| {
                if name.starts_with("sessions/") {
                    counted.fetch_add(1, Ordering::SeqCst);
                }
                Ok(())
            }),
        );
        let session = Session::start(&repo, SessionKind::Backup, "h").unwrap();
        session.observe(Some(2));
        std::thread::sleep(OBSERVE_DELAY / 5);
        session.finish();
        assert_eq!(writes.load(Ordering::SeqCst), 1, "only the first file");

        let session = Session::start(&repo, SessionKind::Backup, "h").unwrap();
        session.observe(Some(2));
        // The hook counts a write before it lands, and the file it replaces goes after
        // it: wait for the listing itself.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let observed: Vec<_> = list(&repo)
                .unwrap()
                .iter()
                .filter_map(|v| v.info.as_ref().map(|i| i.observed))
                .collect();
            if observed == [Some(2)] {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no observe file alone within 10 s: {observed:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(writes.load(Ordering::SeqCst), 3, "the first file, then two");
        session.finish();
        assert!(repo.storage().list("sessions").unwrap().is_empty());
    }

    /// A second `observe` before the first one's file is written does not put that
    /// write off: the file comes when the first was due, with the newest generation.
    #[test]
    fn observing_again_does_not_put_off_the_pending_observe_file() {
        let dir = tempfile::tempdir().unwrap();
        let repo = repository(dir.path());
        let session = Session::start(&repo, SessionKind::Backup, "h").unwrap();
        session.observe(Some(2));
        let due = session.shared.lock().beat_at.expect("a write is due");
        // Long enough for a later time, far shorter than the 1 s delay before the write.
        std::thread::sleep(Duration::from_millis(2));
        session.observe(Some(3));
        let state = session.shared.lock();
        assert_eq!(state.beat_at, Some(due));
        assert_eq!(state.info.observed, Some(3));
        drop(state);
        session.finish();
    }

    /// A session whose only listed file was replaced by its next heartbeat before it was
    /// read is still seen, live, through the file that replaced it: skipping the
    /// vanished file left the session out of the listing, and a prune could delete what
    /// it was building on.
    #[test]
    fn a_session_file_replaced_while_listing_is_seen_through_its_next_one() {
        let dir = tempfile::tempdir().unwrap();
        let repo = crate::repo::test_repository(dir.path());
        let sealed = |seq| {
            let json = serde_json::to_vec(&SessionInfo {
                seq,
                ..info("h", "b", 1, 60)
            })
            .unwrap();
            let bytes = crate::object::seal(repo.key(), Purpose::Session, &json);
            (format!("sessions/{}", blake3::hash(&bytes).to_hex()), bytes)
        };
        let (first, bytes) = sealed(1);
        repo.storage().write(&first, &bytes).unwrap();
        let next = sealed(2);
        // The first read of a session file finds it replaced, as a heartbeat replaces
        // it: the next file is written and the listed one deleted between the listing
        // and the read.
        let replacement = Mutex::new(Some(next.clone()));
        let storage = Hooked {
            inner: Arc::clone(repo.storage()),
            before_read: Box::new(move |inner, name| {
                if name.starts_with("sessions/") {
                    if let Some((next, bytes)) = replacement.lock().unwrap().take() {
                        inner.write(&next, &bytes)?;
                        inner.delete(name)?;
                    }
                }
                Ok(())
            }),
            before_write: no_hook(),
        };
        let views = list_in(&storage, repo.key()).unwrap();
        assert_eq!(views.len(), 1, "one session, seen once");
        let view = &views[0];
        assert_eq!(view.files, vec![next.0]);
        assert_eq!(view.info.as_ref().map(|i| i.seq), Some(2));
    }

    fn info(host: &str, boot: &str, pid: u32, beat_secs: u64) -> SessionInfo {
        SessionInfo {
            id: "a".into(),
            kind: SessionKind::Backup,
            host: host.into(),
            boot_id: Some(boot.into()),
            pid_ns: Some("ns".into()),
            pid,
            process_start: Some(7),
            started: jiff::Timestamp::UNIX_EPOCH,
            seq: 1,
            heartbeat_secs: beat_secs,
            observed: None,
            stopped: false,
        }
    }

    #[test]
    fn a_session_is_judged_by_storage_time_and_by_its_process_on_this_machine() {
        let here = Host {
            boot_id: Some("b".into()),
            pid_ns: Some("ns".into()),
        };
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let at = |s| t0 + Duration::from_secs(s);
        let alive = |_: u32, _: Option<u64>| true;
        let dead = |_: u32, _: Option<u64>| false;
        let s = info("h", "other-boot", 5, 10);
        assert_eq!(judge(Some(&s), t0, at(40), &here, dead), Standing::Live);
        assert!(matches!(
            judge(Some(&s), t0, at(41), &here, alive),
            Standing::Ended(_)
        ));
        // Newer than the judge's own file: fresh, not an error.
        assert_eq!(judge(Some(&s), at(50), t0, &here, alive), Standing::Live);
        let mine = info("h", "b", 5, 10);
        assert_eq!(judge(Some(&mine), t0, t0, &here, alive), Standing::Live);
        assert!(matches!(
            judge(Some(&mine), t0, t0, &here, dead),
            Standing::Ended(why) if why.contains("process 5")
        ));
        // Another container of the same boot: its pids are not ours to look up.
        let mut container = info("h", "b", 5, 10);
        container.pid_ns = Some("other-ns".into());
        assert_eq!(judge(Some(&container), t0, t0, &here, dead), Standing::Live);
        let mut stopped = info("h", "other-boot", 5, 10);
        stopped.stopped = true;
        assert!(matches!(
            judge(Some(&stopped), t0, t0, &here, alive),
            Standing::Ended(_)
        ));
        assert_eq!(judge(None, t0, at(3600), &here, dead), Standing::Live);
        assert!(matches!(
            judge(None, t0, at(25 * 3600), &here, dead),
            Standing::Ended(_)
        ));
    }

    #[test]
    fn an_absurd_heartbeat_interval_in_a_session_file_does_not_panic_the_judge() {
        // Found while writing the fuzz target `session_file`: `Duration * 4` overflowed and
        // panicked, so one crafted session file stopped every prune.
        let here = Host::this();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let s = info("h", "other-boot", 5, u64::MAX);
        assert_eq!(s.stale_after(), Duration::MAX);
        let far = t0 + Duration::from_secs(10 * 365 * 24 * 3600);
        assert_eq!(judge(Some(&s), t0, far, &here, |_, _| true), Standing::Live);
    }

    use crate::repo::test_repository as repository;

    #[test]
    fn a_session_finished_at_once_ends_at_once_and_leaves_no_file() {
        // The heartbeat thread may not have waited yet when finish asks it to stop; it
        // must not sleep through a whole interval (300 s) first.
        let dir = tempfile::tempdir().unwrap();
        let repo = repository(dir.path());
        for _ in 0..20 {
            let session = Session::start(&repo, SessionKind::Maintenance, "h").unwrap();
            let (done, finished) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                session.finish();
                done.send(true)
            });
            let ended = finished.recv_timeout(Duration::from_secs(10));
            assert_eq!(ended, Ok(true), "finish returned within 10 s");
        }
        assert!(repo.storage().list("sessions").unwrap().is_empty());
    }

    /// `observe` does not wait for the file that records it (a durable write before an
    /// unchanged backup's walk), and that file follows [`OBSERVE_DELAY`] later, not a
    /// heartbeat interval (300 s) later.
    #[test]
    fn observe_returns_at_once_and_its_file_follows_without_waiting_for_a_heartbeat() {
        let dir = tempfile::tempdir().unwrap();
        // Writes of session files wait while the gate is closed.
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let held = Arc::clone(&gate);
        let repo = hooked_on_writes(
            dir.path(),
            Box::new(move |_, name| {
                if name.starts_with("sessions/") {
                    let (closed, opened) = &*held;
                    drop(opened.wait_while(closed.lock().unwrap(), |c| *c).unwrap());
                }
                Ok(())
            }),
        );
        let session = Session::start(&repo, SessionKind::Backup, "h").unwrap();
        *gate.0.lock().unwrap() = true;
        let (done, returned) = std::sync::mpsc::channel();
        let session = std::thread::spawn(move || {
            session.observe(Some(4));
            done.send(()).unwrap();
            session
        });
        let observed = returned.recv_timeout(Duration::from_secs(10));
        *gate.0.lock().unwrap() = false;
        gate.1.notify_all();
        assert_eq!(
            observed,
            Ok(()),
            "observe returned while its write was held"
        );
        let session = session.join().unwrap();
        let says = || {
            list(&repo)
                .unwrap()
                .iter()
                .filter_map(|v| v.info.as_ref().map(|i| i.observed))
                .collect::<Vec<_>>()
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while says() != [Some(4)] {
            assert!(
                Instant::now() < deadline,
                "no file says observed 4: {:?}",
                says()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        session.finish();
        assert!(repo.storage().list("sessions").unwrap().is_empty());
    }

    #[test]
    fn a_dropped_session_leaves_one_file_that_says_it_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let repo = repository(dir.path());
        let session = Session::start(&repo, SessionKind::Backup, "h").unwrap();
        session.observe(Some(3));
        session.beat().unwrap();
        drop(session);
        let views = list(&repo).unwrap();
        assert_eq!(views.len(), 1);
        assert_eq!(views[0].files.len(), 1);
        let info = views[0].info.as_ref().unwrap();
        assert!(info.stopped && info.observed == Some(3));
        let standing = views[0].standing(views[0].beat, &Host::this());
        assert!(matches!(standing, Standing::Ended(_)), "{standing:?}");
    }

    #[test]
    fn this_process_is_alive_and_a_reused_pid_is_not() {
        let me = std::process::id();
        let start = process_start(me);
        assert!(start.is_some());
        assert!(process_alive(me, start));
        assert!(!process_alive(me, start.map(|s| s + 1)));
        // A child that has exited and been reaped: no such process.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(!process_alive(pid, None));
    }
}
