//! Ctrl-C and SIGTERM: the first asks the running operation to stop, so it can remove
//! its temporary files and its backup session on the way out (a session left behind
//! would postpone prune's deletions for a day); the second ends the process at once.
//! SIGHUP, for the daemon only, asks it to read its config file again.

use std::sync::atomic::{AtomicBool, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(signal: libc::c_int) {
    if INTERRUPTED.swap(true, Ordering::SeqCst) {
        // Second signal: the default action, now. Both calls are async-signal-safe.
        unsafe {
            libc::signal(signal, libc::SIG_DFL);
            libc::raise(signal);
        }
    }
}

pub fn install() {
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only touches an atomic and calls async-signal-safe functions.
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
}

/// Whether a stop was asked for.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

static RELOAD: AtomicBool = AtomicBool::new(false);

extern "C" fn on_hangup(_: libc::c_int) {
    RELOAD.store(true, Ordering::SeqCst);
}

/// SIGHUP sets a flag that `take_reload` reads, instead of ending the process.
pub fn install_reload() {
    let handler = on_hangup as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only touches an atomic.
    unsafe {
        libc::signal(libc::SIGHUP, handler);
    }
}

/// Whether SIGHUP came since the last call.
pub fn take_reload() -> bool {
    RELOAD.swap(false, Ordering::SeqCst)
}
