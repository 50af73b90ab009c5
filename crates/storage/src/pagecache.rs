//! What of a file the page cache holds, and advice to drop it: for data read or written
//! once (a backup's sources, a stored pack), so that it neither pushes out what the
//! machine is using nor takes a fresh page for every page it moves.

use std::fs::File;

/// How many pages of `file` from `offset` for `len` bytes (0: to the end) are in the page
/// cache (`cachestat(2)`, Linux 6.5 and later); `None` where the system cannot tell.
///
/// ```
/// let file = std::fs::File::open("/proc/self/exe")?;
/// if let Some(pages) = cairn_storage::pagecache::cached_pages(&file, 0, 0) {
///     println!("{pages} pages of this program are cached");
/// }
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn cached_pages(file: &File, offset: u64, len: u64) -> Option<u64> {
    #[cfg(all(
        target_os = "linux",
        any(
            target_arch = "x86_64",
            target_arch = "aarch64",
            target_arch = "riscv64"
        )
    ))]
    {
        use std::os::fd::AsRawFd;

        #[repr(C)]
        struct CachestatRange {
            off: u64,
            len: u64,
        }
        #[repr(C)]
        #[derive(Default)]
        struct Cachestat {
            nr_cache: u64,
            nr_dirty: u64,
            nr_writeback: u64,
            nr_evicted: u64,
            nr_recently_evicted: u64,
        }
        // Not in the libc crate for these targets; 451 on x86_64 and in the generic
        // table the others use.
        const SYS_CACHESTAT: libc::c_long = 451;
        let range = CachestatRange { off: offset, len };
        let mut stat = Cachestat::default();
        // SAFETY: cachestat reads `range` and writes `stat`, both live and of the kernel's
        // layout, on a descriptor `file` owns; flags must be 0.
        let r = unsafe {
            libc::syscall(
                SYS_CACHESTAT,
                file.as_raw_fd(),
                &range as *const CachestatRange,
                &mut stat as *mut Cachestat,
                0 as libc::c_uint,
            )
        };
        (r == 0).then_some(stat.nr_cache)
    }
    #[cfg(not(all(
        target_os = "linux",
        any(
            target_arch = "x86_64",
            target_arch = "aarch64",
            target_arch = "riscv64"
        )
    )))]
    {
        let _ = (file, offset, len);
        None
    }
}

/// Asks the kernel to drop the clean pages of `file` from `offset` for `len` bytes (0: to
/// the end); it keeps a page, or a large folio, that the range covers only in part.
/// Advice only: a failure changes nothing but the page cache.
pub fn drop_pages(file: &File, offset: u64, len: u64) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
            return;
        };
        // SAFETY: posix_fadvise on a descriptor `file` owns, with integer arguments only.
        unsafe {
            libc::posix_fadvise(file.as_raw_fd(), offset, len, libc::POSIX_FADV_DONTNEED);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, offset, len);
}
