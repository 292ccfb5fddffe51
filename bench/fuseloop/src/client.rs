//! The client: N threads repeat one operation for a fixed time; every operation is timed.

use std::ffi::CString;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use crate::arg;

#[derive(Clone, Copy, PartialEq)]
enum Op {
    Ioctl,
    Read(usize),
    Lookup,
    Getattr,
}

fn check(rc: libc::c_long, ok_errno: Option<i32>) -> io::Result<()> {
    if rc >= 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error().is_some() && e.raw_os_error() == ok_errno {
        return Ok(());
    }
    Err(e)
}

/// One thread's loop; returns each operation's time in ns.
fn worker(
    file: &CString,
    missing: &CString,
    op: Op,
    t: usize,
    stop: &AtomicBool,
    start: &Barrier,
) -> io::Result<Vec<u32>> {
    let flags = match op {
        Op::Read(_) => libc::O_RDONLY | libc::O_DIRECT,
        _ => libc::O_RDONLY,
    };
    let fd = unsafe { libc::open(file.as_ptr(), flags) };
    check(fd as _, None)?;
    let size = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        check(libc::fstat(fd, &mut st) as _, None)?;
        st.st_size as u64
    };
    let len = match op {
        Op::Read(n) => n,
        _ => 4096,
    };
    let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
    let buf = unsafe { std::alloc::alloc(layout) };
    // Offsets spread over the file, different per thread, aligned for O_DIRECT.
    let slots = (size / len as u64).max(1);
    let mut slot = (t as u64 * 7919) % slots;
    let mut times = Vec::with_capacity(1 << 20);
    start.wait();
    while !stop.load(Ordering::Relaxed) {
        let began = Instant::now();
        match op {
            Op::Ioctl => unsafe {
                let mut tio: libc::termios = std::mem::zeroed();
                check(
                    libc::ioctl(fd, libc::TCGETS, &mut tio) as _,
                    Some(libc::ENOTTY),
                )?;
            },
            Op::Read(n) => unsafe {
                let got = libc::pread(fd, buf.cast(), n, (slot * n as u64) as libc::off_t);
                check(got as _, None)?;
                slot = (slot + 1) % slots;
            },
            Op::Lookup => unsafe {
                let mut st: libc::stat = std::mem::zeroed();
                check(
                    libc::stat(missing.as_ptr(), &mut st) as _,
                    Some(libc::ENOENT),
                )?;
            },
            Op::Getattr => unsafe {
                let mut sx: libc::statx = std::mem::zeroed();
                check(
                    libc::statx(
                        fd,
                        c"".as_ptr(),
                        libc::AT_EMPTY_PATH | libc::AT_STATX_FORCE_SYNC,
                        libc::STATX_BASIC_STATS,
                        &mut sx,
                    ) as _,
                    None,
                )?;
            },
        }
        times.push(began.elapsed().as_nanos().min(u32::MAX as u128) as u32);
    }
    unsafe {
        std::alloc::dealloc(buf, layout);
        libc::close(fd);
    }
    Ok(times)
}

pub fn run(args: &[String]) -> io::Result<()> {
    let file = PathBuf::from(args.first().expect("client FILE"));
    let op_name: String = arg(args, "--op", "ioctl".to_string());
    let threads: usize = arg(args, "--threads", 1);
    let seconds: f64 = arg(args, "--seconds", 3.0);
    let op = match op_name.as_str() {
        "ioctl" => Op::Ioctl,
        "read4k" => Op::Read(4096),
        "read128k" => Op::Read(128 * 1024),
        "lookup" => Op::Lookup,
        "getattr" => Op::Getattr,
        other => return Err(io::Error::other(format!("unknown --op {other}"))),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            // Each thread its own missing name: lookups of one name would wait for each other.
            let dir = file.parent().unwrap_or(std::path::Path::new("."));
            let missing = dir.join(format!("missing-{t}"));
            let missing = CString::new(missing.as_os_str().as_encoded_bytes()).unwrap();
            let file = CString::new(file.as_os_str().as_encoded_bytes()).unwrap();
            let (stop, start) = (stop.clone(), start.clone());
            std::thread::spawn(move || worker(&file, &missing, op, t, &stop, &start))
        })
        .collect();
    start.wait();
    let began = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for h in handles {
        all.extend(
            h.join()
                .map_err(|_| io::Error::other("client thread panicked"))??,
        );
    }
    let elapsed = began.elapsed().as_secs_f64();
    all.sort_unstable();
    let n = all.len().max(1);
    let mean_us = all.iter().map(|&t| t as f64).sum::<f64>() / n as f64 / 1000.0;
    let pct = |p: f64| {
        all.get(((n as f64 * p) as usize).min(n - 1))
            .copied()
            .unwrap_or(0) as f64
            / 1000.0
    };
    println!(
        "{{\"op\":\"{op_name}\",\"threads\":{threads},\"ops\":{},\"ops_per_s\":{:.0},\"mean_us\":{mean_us:.2},\"p50_us\":{:.2},\"p99_us\":{:.2}}}",
        all.len(),
        all.len() as f64 / elapsed,
        pct(0.5),
        pct(0.99)
    );
    Ok(())
}
