//! `--json` progress: one JSON object per line on stderr, so that a script can follow a
//! long command while stdout stays the single report document it parses at the end.
//!
//! An event every interval (1 s, or `CAIRN_PROGRESS_INTERVAL_MS`), the first after one
//! interval, and a last one with `"final": true` when the command ends, if it ran for at
//! least one interval: a quick command prints none.

use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::{json, Value};

use super::{Kind, Shared, TOTALS_COMPLETE};

const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);

pub struct Events {
    shared: Arc<Shared>,
    interval: Duration,
    /// Dropped to stop the thread at once rather than at its next tick.
    stop: mpsc::Sender<()>,
    thread: Option<JoinHandle<()>>,
}

impl Events {
    pub fn start(shared: Arc<Shared>) -> Events {
        let interval = interval();
        let (stop, stopped) = mpsc::channel::<()>();
        let ticking = shared.clone();
        let thread = std::thread::Builder::new()
            .name("progress-events".into())
            .spawn(move || {
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
                    emit(&ticking, false);
                }
            })
            // Without the thread there are only no periodic events; the command goes on.
            .ok();
        Events {
            shared,
            interval,
            stop,
            thread,
        }
    }

    pub fn finish(self) {
        let Events {
            shared,
            interval,
            stop,
            thread,
        } = self;
        drop(stop);
        if let Some(thread) = thread {
            let _ = thread.join();
        }
        if shared.started.elapsed() >= interval {
            emit(&shared, true);
        }
    }
}

/// `CAIRN_PROGRESS_INTERVAL_MS`, mainly for tests that want to see events from a short
/// command; at least 1 ms, and the default when unset or not a number.
fn interval() -> Duration {
    std::env::var("CAIRN_PROGRESS_INTERVAL_MS")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|ms| Duration::from_millis(ms.max(1)))
        .unwrap_or(DEFAULT_INTERVAL)
}

fn emit(shared: &Shared, last: bool) {
    let mut line = event(shared, last).to_string();
    line.push('\n');
    // Whole lines in one write, so that they never interleave with a problem's line. A
    // closed stderr is no reason to stop the command.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

fn event(shared: &Shared, last: bool) -> Value {
    let elapsed_ms = shared.started.elapsed().as_millis() as u64;
    match shared.kind {
        Kind::Files => {
            let totals = shared.totals();
            let current = shared
                .current
                .lock()
                .ok()
                .filter(|c| !c.is_empty())
                .map(|c| c.clone());
            json!({
                "event": "progress",
                "command": shared.command,
                "files_done": shared.files_done.load(Ordering::Relaxed),
                "bytes_done": shared.bytes_done.load(Ordering::Relaxed),
                "files_total": totals.map(|t| t.0),
                "bytes_total": totals.map(|t| t.1),
                "totals_complete": shared.totals.load(Ordering::Acquire) == TOTALS_COMPLETE,
                "elapsed_ms": elapsed_ms,
                "current": current,
                "final": last,
            })
        }
        Kind::Phases => {
            let phase = shared.phase.lock().ok().and_then(|p| p.clone());
            json!({
                "event": "progress",
                "command": shared.command,
                "phase": phase.as_ref().map(|p| p.what.clone()),
                "done": phase.as_ref().map_or(0, |p| p.done),
                "total": phase.as_ref().map_or(0, |p| p.total),
                "elapsed_ms": elapsed_ms,
                "final": last,
            })
        }
    }
}
