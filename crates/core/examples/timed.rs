//! Times one command as the benchmarks report it: runs CMD with its standard output to
//! OUT and its standard error to ERR, and prints "WALL CPU RSS": wall seconds to a tenth
//! of a millisecond, user+system CPU seconds, and the peak RSS in KiB (the kernel's
//! `ru_maxrss` for the child, as GNU time's `%M`). Exits with CMD's status (128+N if
//! signal N ended it) and prints nothing then.
//!
//! GNU time's `%e` has two decimals, and an unchanged backup of the mixed corpus takes
//! 10-30 ms: its ratio to another tool's was rounding. So it was to the millisecond: a
//! backup of 11.5-12.5 ms printed 0.012 beside another's 0.024 for 23.5-24.5 ms, ratios
//! from 0.47 to 0.53 printed as 0.50. Not a Python script: a child spawned from Python
//! starts with Python's peak RSS (13 MiB) as its own, since the kernel carries the
//! pre-exec peak over; this binary's is about 2 MiB, as GNU time's.
//!
//! usage: cargo run --release -p cairn-core --example timed -- OUT ERR CMD...

use std::fs::File;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, ExitCode, ExitStatus};
use std::time::{Duration, Instant};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [out, err, program, rest @ ..] = args.as_slice() else {
        eprintln!("usage: timed OUT ERR CMD...");
        return ExitCode::from(2);
    };
    let (out, err) = match (File::create(out), File::create(err)) {
        (Ok(out), Ok(err)) => (out, err),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("timed: cannot create {out} or {err}: {e}");
            return ExitCode::from(2);
        }
    };
    let start = Instant::now();
    let child = match Command::new(program)
        .args(rest)
        .stdout(out)
        .stderr(err)
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            eprintln!("timed: cannot run {program}: {e}");
            return ExitCode::from(127);
        }
    };
    // std's `wait` gives no resource usage, so wait4 reaps the child here.
    let mut status = 0;
    // SAFETY: wait4 writes only the status and the rusage it is given.
    let usage = unsafe {
        let mut usage = std::mem::zeroed::<libc::rusage>();
        let pid = libc::pid_t::try_from(child.id()).unwrap_or(-1);
        if libc::wait4(pid, &mut status, 0, &mut usage) != pid {
            eprintln!("timed: wait4: {}", std::io::Error::last_os_error());
            return ExitCode::from(2);
        }
        usage
    };
    let wall = start.elapsed();
    let status = ExitStatus::from_raw(status);
    if !status.success() {
        let code = status
            .code()
            .or_else(|| status.signal().map(|s| 128 + s))
            .unwrap_or(1);
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    let cpu = time(usage.ru_utime) + time(usage.ru_stime);
    println!(
        "{:.4} {:.2} {}",
        wall.as_secs_f64(),
        cpu.as_secs_f64(),
        usage.ru_maxrss
    );
    ExitCode::SUCCESS
}
