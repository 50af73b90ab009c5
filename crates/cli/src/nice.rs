//! `--nice`: the lowest CPU priority and the idle I/O class, for backups that should
//! leave the machine to everything else. Both are per thread on Linux and inherited by
//! threads and processes created afterwards, so this runs before the command starts any.

/// Lowers this thread's CPU and I/O priority; a failure is a warning (the command runs
/// anyway, at the usual priority).
pub fn lower_priority() {
    // SAFETY: setpriority has no memory preconditions; `who` 0 is the calling thread.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 19) } != 0 {
        let e = std::io::Error::last_os_error();
        eprintln!("warning: --nice: the CPU priority was not lowered: {e}");
    }
    // ioprio_set(IOPRIO_WHO_PROCESS, 0, IOPRIO_PRIO_VALUE(IOPRIO_CLASS_IDLE, 0)): no
    // wrapper in libc. The idle class gets the disk only when nobody else wants it (with
    // the CFQ and BFQ schedulers; others ignore classes).
    const IOPRIO_WHO_PROCESS: libc::c_long = 1;
    const IOPRIO_CLASS_IDLE: libc::c_long = 3;
    const IOPRIO_CLASS_SHIFT: libc::c_long = 13;
    let value = IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT;
    // SAFETY: the ioprio_set system call takes three integers and touches no memory.
    if unsafe { libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, value) } != 0 {
        let e = std::io::Error::last_os_error();
        eprintln!("warning: --nice: the I/O priority was not lowered: {e}");
    }
}
