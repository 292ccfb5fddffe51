//! fuseloop: how much one FUSE round trip costs, and how much a transport can take off it.
//!
//!   fuseloop serve MNT [--transport classic|uring|fuser] [--threads N] [--depth N]
//!       mounts the in-memory file system (root only) and serves it until unmounted; prints
//!       `ready <transport>` once the handshake is done.
//!   fuseloop client FILE --op ioctl|read4k|read128k|lookup|getattr [--threads N] [--seconds S]
//!       times one operation on FILE (or a missing name next to it, for lookup) from N threads
//!       and prints one JSON line: ops/s, mean µs per operation, p50 and p99.
//!
//! bench/roundtrip.sh runs it against the floor, packfs and tmpfs.

mod client;
mod floor;
mod fuser_floor;
mod proto;
mod session;
mod uring;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}: cannot parse {v:?}"))
        })
        .unwrap_or(default)
}

fn serve(args: &[String]) -> std::io::Result<()> {
    let mnt = PathBuf::from(args.first().expect("serve MNT"));
    let transport: String = arg(args, "--transport", "classic".to_string());
    let threads: usize = arg(args, "--threads", 4);
    let depth: usize = arg(args, "--depth", 16);
    if transport == "fuser" {
        return fuser_floor::serve(&mnt, threads, || {
            println!("ready fuser");
            let _ = std::io::stdout().flush();
        });
    }
    let want_uring = transport == "uring";
    if want_uring && !uring::enabled() {
        eprintln!(
            "fuseloop: FUSE over io_uring is off (/sys/module/fuse/parameters/enable_uring is not Y): serving with the classic loop"
        );
    }
    let fd = session::mount(&mnt)?;
    let agreed = session::init(fd, want_uring && uring::enabled())?;
    let mut handles = Vec::new();
    if agreed.uring {
        for qid in 0..uring::queues() {
            handles.push(std::thread::spawn(move || {
                if let Err(e) = uring::queue_loop(fd, qid as u16, depth) {
                    eprintln!("fuseloop: queue {qid}: {e}");
                }
            }));
        }
        // FORGET and INTERRUPT still come through /dev/fuse.
        handles.push(std::thread::spawn(move || session::classic_loop(fd)));
    } else {
        for _ in 0..threads.max(1) {
            handles.push(std::thread::spawn(move || session::classic_loop(fd)));
        }
    }
    println!("ready {}", if agreed.uring { "uring" } else { "classic" });
    std::io::stdout().flush()?;
    for h in handles {
        let _ = h.join();
    }
    use std::sync::atomic::Ordering::Relaxed;
    eprintln!(
        "fuseloop: unmounted; requests answered: {} through /dev/fuse, {} through the rings",
        session::CLASSIC_REQUESTS.load(Relaxed),
        uring::RING_REQUESTS.load(Relaxed)
    );
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("serve") => serve(&args[1..]),
        Some("client") => client::run(&args[1..]),
        _ => {
            eprintln!("usage: fuseloop serve MNT ... | fuseloop client FILE --op OP ...");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fuseloop: {e}");
            ExitCode::FAILURE
        }
    }
}
