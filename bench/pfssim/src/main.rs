//! pfssim: a stand-in for a parallel file system (Lustre, GPFS) in benchmarks.
//!
//! It mounts a local directory through FUSE and holds each reply back by the time the same
//! operation would take on a shared file system (a metadata RPC, or a read at a given latency and
//! bandwidth), and counts every operation and byte. See docs/benchmarks.md for the profiles.
//!
//!     pfssim [--profile typical] [--stats FILE] BACKING_DIR MOUNTPOINT

mod delay;
mod fs;
mod model;
mod stats;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use fuser::{Config, MountOption, Session, SessionACL};

use fs::{DataCache, Options, PfsSim};
use model::{Model, Profile};
use stats::Stats;

#[derive(Parser)]
#[command(
    version,
    about = "A passthrough FUSE file system that behaves like a parallel file system: \
    latency per RPC, bandwidth per stream and per client, and a count of every operation"
)]
struct Args {
    /// The directory served.
    backing: PathBuf,
    /// Where to mount it.
    mountpoint: PathBuf,
    /// Latency set: none, fast, typical or loaded.
    #[arg(long, default_value = "typical")]
    profile: String,
    /// Override: one metadata RPC, in microseconds.
    #[arg(long)]
    meta_us: Option<u64>,
    /// Override: metadata RPCs in flight per client (0: no limit).
    #[arg(long)]
    meta_in_flight: Option<usize>,
    /// Override: fixed latency of one read, in microseconds.
    #[arg(long)]
    read_us: Option<u64>,
    /// Override: bandwidth of one read stream, MB/s (0: unlimited).
    #[arg(long)]
    stream_mbps: Option<u64>,
    /// Override: bandwidth of the whole client, MB/s (0: unlimited).
    #[arg(long)]
    total_mbps: Option<u64>,
    /// Whether file data stays in the client's page cache across opens.
    #[arg(long, value_enum, default_value = "none")]
    data_cache: DataCache,
    /// How long names and attributes are cached by the kernel, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    ttl_ms: u64,
    /// FUSE request threads (they never wait for the simulated latency).
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// JSON counters, rewritten every 100 ms and at unmount.
    #[arg(long)]
    stats: Option<PathBuf>,
    /// Let other users (and root's daemons) read the mount.
    #[arg(long)]
    allow_other: bool,
}

fn profile(args: &Args) -> Result<Profile, String> {
    let mut p = Profile::named(&args.profile).ok_or_else(|| {
        format!(
            "unknown profile {:?}: use none, fast, typical or loaded",
            args.profile
        )
    })?;
    if let Some(us) = args.meta_us {
        p.meta = Duration::from_micros(us);
    }
    if let Some(n) = args.meta_in_flight {
        p.meta_in_flight = n;
    }
    if let Some(us) = args.read_us {
        p.read = Duration::from_micros(us);
    }
    if let Some(mb) = args.stream_mbps {
        p.stream_bw = mb * 1_000_000;
    }
    if let Some(mb) = args.total_mbps {
        p.total_bw = mb * 1_000_000;
    }
    Ok(p)
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(args) {
        eprintln!("pfssim: {e}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<(), String> {
    let p = profile(&args)?;
    let backing = std::fs::canonicalize(&args.backing)
        .map_err(|e| format!("cannot use {}: {e}", args.backing.display()))?;
    let described = serde_json::json!({
        "name": args.profile,
        "meta_us": p.meta.as_micros() as u64,
        "meta_in_flight": p.meta_in_flight,
        "read_us": p.read.as_micros() as u64,
        "stream_mbps": p.stream_bw / 1_000_000,
        "total_mbps": p.total_bw / 1_000_000,
        "data_cache": format!("{:?}", args.data_cache).to_lowercase(),
        "ttl_ms": args.ttl_ms,
    });
    let stats = Arc::new(Stats::default());
    let sim = PfsSim::new(
        backing.clone(),
        Options {
            data_cache: args.data_cache,
            ttl: Duration::from_millis(args.ttl_ms),
        },
        Arc::new(Model::new(p)),
        stats.clone(),
    );
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::RO,
        MountOption::NoAtime,
        MountOption::DefaultPermissions,
        MountOption::FSName(format!("pfssim:{}", backing.display()).replace(',', "_")),
        MountOption::CUSTOM("subtype=pfssim".into()),
    ];
    config.acl = if args.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(args.threads.max(1));
    let mut session = Session::new(sim, &args.mountpoint, &config)
        .map_err(|e| format!("cannot mount on {}: {e}", args.mountpoint.display()))?;

    // SIGTERM / SIGINT unmount, which ends the session.
    let mut unmounter = session.unmount_callable();
    let mut signals = signal_hook::iterator::Signals::new([libc::SIGTERM, libc::SIGINT])
        .map_err(|e| e.to_string())?;
    std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            let _ = unmounter.unmount();
        }
    });
    if let Some(path) = args.stats.clone() {
        let (stats, described) = (stats.clone(), described.clone());
        std::thread::spawn(move || {
            loop {
                if let Err(e) = stats.write(&path, &described) {
                    eprintln!("pfssim: cannot write {}: {e}", path.display());
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
    }
    eprintln!(
        "pfssim: {} mounted on {} ({described})",
        backing.display(),
        args.mountpoint.display()
    );
    let ended = session.run();
    if let Some(path) = &args.stats {
        stats
            .write(path, &described)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    ended.map_err(|e| format!("session ended: {e}"))
}
