//! `packfs status`

use std::path::PathBuf;
use std::time::Duration;

use crate::daemon::status::{self, MountState, MountStatus};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Mount points to show (default: every packfs mount of this user; root sees all).
    mountpoints: Vec<PathBuf>,
    /// One JSON array of mounts, for scripts (the counters as docs/metrics.md describes them).
    #[arg(long)]
    json: bool,
    /// Redraw every SECONDS (default 2) until interrupted.
    #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = "2")]
    watch: Option<f64>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let Some(period) = args.watch else {
        return show(&args);
    };
    let period = Duration::from_secs_f64(period.max(0.2));
    loop {
        // Clear the screen and go home, as watch(1) does.
        print!("\x1b[H\x1b[2J");
        if let Err(e) = show(&args) {
            println!("{e:#}");
        }
        std::thread::sleep(period);
    }
}

fn show(args: &Args) -> anyhow::Result<()> {
    let mounts = status::list(&args.mountpoints)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&mounts)?);
        return stale_is_an_error(&mounts);
    }
    if mounts.is_empty() {
        println!(
            "no packfs mounts{}",
            if nix::unistd::getuid().is_root() {
                ""
            } else {
                " of this user"
            }
        );
        return Ok(());
    }
    for (i, m) in mounts.iter().enumerate() {
        if i > 0 {
            println!();
        }
        print!("{}", render(m));
    }
    stale_is_an_error(&mounts)
}

/// A health check (`packfs status MNT || alert`) fails on a stale mount.
fn stale_is_an_error(mounts: &[MountStatus]) -> anyhow::Result<()> {
    let stale = mounts
        .iter()
        .filter(|m| m.state == MountState::Stale)
        .count();
    if stale > 0 {
        anyhow::bail!("{stale} stale mount(s): clean with `packfs umount MOUNTPOINT`");
    }
    Ok(())
}

/// One mount as text.
fn render(m: &MountStatus) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let owner = m
        .owner_uid
        .map(|uid| format!(", user {}", crate::daemon::user_name(uid)))
        .unwrap_or_default();
    let Some(c) = &m.counters else {
        let state = match m.state {
            MountState::Live => "LIVE",
            MountState::Stale => "STALE",
            MountState::Unknown => "UNKNOWN",
        };
        let _ = writeln!(out, "{}  {state}{owner}", m.mountpoint.display());
        let _ = writeln!(out, "  source    {}", m.source);
        if let Some(problem) = &m.problem {
            let _ = writeln!(out, "  problem   {problem}");
        }
        return out;
    };
    let about = &c.about;
    let _ = writeln!(
        out,
        "{}  live, pid {}, up {}{owner}{}{}",
        m.mountpoint.display(),
        c.pid,
        duration(c.uptime_s),
        match about.transport.as_str() {
            "uring" => ", FUSE over io_uring",
            _ => "",
        },
        // The daemon rewrites its counters every second: say how old these are.
        m.counters_age_s
            .map(|age| format!("; counters as of {age:.1} s ago"))
            .unwrap_or_default()
    );
    let dataset = match about.dataset.as_str() {
        "" => m.source.as_str(),
        named => named,
    };
    let _ = writeln!(
        out,
        "  dataset   {dataset}: {} image(s){}, {} files, {}",
        about.images,
        about.inside(),
        about.files,
        human(about.bytes)
    );
    let _ = writeln!(
        out,
        "  checksums {}",
        match about
            .checksummed_files
            .map(|c| (c, about.files.saturating_sub(c)))
        {
            None => "being counted (the daemon walks its catalog once mounted)".to_string(),
            Some((_, 0)) => {
                "every file's reads are checked against the index's checksums".to_string()
            }
            Some((0, _)) => "none: files are served as their images hold them now (`packfs index \
                       --checksums` records them)"
                .to_string(),
            Some((checked, unchecked)) => format!(
                "{checked} files checked against the index's checksums, {unchecked} served as \
                 their images hold them now (`packfs index --checksums` records the rest)"
            ),
        }
    );
    if about.skipped_members > 0 {
        let damaged = match about.damaged_headers {
            0 => String::new(),
            n => format!(", {n} of them behind a damaged tar header"),
        };
        let _ = writeln!(
            out,
            "  skipped   {} member(s) left out at scan{damaged}: the scan's warnings \
             (`packfs ls IMAGE`) name each",
            about.skipped_members
        );
    }
    let served = &c.served;
    let (ram, staged, source) = (served.ram_bytes, served.staged_bytes, served.source_bytes);
    let ahead = served.ahead_bytes;
    let _ = writeln!(
        out,
        "  served    {} (page-cache misses): {} from RAM{}, {} staged, {} from the images ({} reads{}, \
         {} checks for a rewrite)",
        human(ram + ahead + staged + source),
        human(ram + ahead),
        match ahead {
            0 => String::new(),
            n => format!(" ({} of it fetched ahead on hints)", human(n)),
        },
        human(staged),
        human(source),
        c.source.reads,
        match served.spliced_bytes {
            0 => String::new(),
            n => format!(", {} spliced without a copy", human(n)),
        },
        c.source.checks
    );
    let _ = writeln!(
        out,
        "  waited    {} on storage with some reader waiting; {} summed over readers (their \
         reads of the images, and fetches in flight they waited for){}",
        duration(served.storage_stall_ns as f64 / 1e9),
        duration(served.storage_wait_ns as f64 / 1e9),
        match c.readers_waiting.first() {
            Some(r) if r.pid != 0 => format!(
                "; longest pid {} ({})",
                r.pid,
                duration(r.wait_ns as f64 / 1e9)
            ),
            _ => String::new(),
        }
    );
    if let Some(h) = &c.lookahead {
        let _ = writeln!(out, "  hints     {}", hints_line(h, about.hints.as_deref()));
    }
    if served.streams > 0 {
        let _ = writeln!(
            out,
            "  in order  {} reader(s) walking an image in order, read in chunks with read-ahead: \
             {}, {} chunks fetched ahead",
            served.streams,
            human(served.streamed_bytes),
            served.read_ahead_chunks
        );
    }
    let cache = &c.ram;
    let _ = writeln!(
        out,
        "  cache     {} of {} (peak {}), {} hits, {} loads",
        human(cache.held),
        human(cache.budget),
        human(cache.peak),
        cache.hits,
        cache.loads
    );
    let memory = &cache.memory;
    let _ = writeln!(
        out,
        "  memory    {} of {} held (peak {}), {} waits for room",
        human(memory.held),
        human(memory.total),
        human(memory.peak),
        memory.waits
    );
    if let Some(st) = &c.stage {
        let _ = writeln!(
            out,
            "  staging   {} in {}: {}% ({} of {}), {} checked chunks, {} failed checks",
            st.status,
            st.dir,
            st.present_bytes * 100 / st.total_bytes.max(1),
            human(st.present_bytes),
            human(st.total_bytes),
            st.verified_chunks,
            st.failed_checks
        );
    }
    if let Some(p) = &c.peers {
        let fell: Vec<String> = p
            .fallbacks
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(why, n)| format!("{n} {}", why.replace('_', " ")))
            .collect();
        let _ = writeln!(
            out,
            "  peers     {} of other shares from their nodes ({} requests), {} from the source; \
             fell back: {}; served {} to them, refused {}",
            human(p.fetched_bytes),
            p.fetched_chunks,
            human(p.source_bytes),
            if fell.is_empty() {
                "never".into()
            } else {
                fell.join(", ")
            },
            human(p.served_bytes),
            p.refused
        );
        if let Some(why) = &p.not_serving {
            let _ = writeln!(out, "    not serving this node's share: {why}");
        }
        let refused: Vec<String> = p
            .refusals
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(why, n)| format!("{n} {why}"))
            .collect();
        if !refused.is_empty() || p.evicted_connections > 0 {
            let _ = writeln!(
                out,
                "    refused: {}; {} connections closed before a signed request",
                if refused.is_empty() {
                    "none".into()
                } else {
                    refused.join(", ")
                },
                p.evicted_connections
            );
        }
        for one in p.peers.iter().filter(|o| o.requests > 0) {
            let _ = writeln!(
                out,
                "    node {}: {} requests, {}, {} failed, p50 {}, p99 {}, max {}",
                one.share,
                one.requests,
                human(one.bytes),
                one.failures,
                micros(one.p50_us),
                micros(one.p99_us),
                micros(one.max_us)
            );
        }
    }
    for store in &c.remote {
        let _ = writeln!(
            out,
            "  store     {}: {} requests, {}, {} retries, {} failed",
            store.store,
            store.requests,
            human(store.bytes),
            store.retries,
            store.errors
        );
    }
    if let Some(cred) = &c.credentials {
        let _ = writeln!(
            out,
            "  creds     {}{}: renewed {} times, {} failed fetches",
            cred.from,
            cred.expires
                .as_deref()
                .map_or(String::new(), |t| format!(", valid until {t}")),
            cred.renewals,
            cred.failures
        );
    }
    let _ = writeln!(
        out,
        "  errors    {}{}",
        c.errors,
        if c.errors > 0 {
            " (the log says which files and why)"
        } else {
            ""
        }
    );
    if !c.requests.is_empty() {
        let _ = writeln!(
            out,
            "  requests  {:<12} {:>10} {:>7} {:>10} {:>10} {:>10} {:>10}",
            "", "count", "errors", "p50", "p90", "p99", "max"
        );
        for (op, f) in &c.requests {
            let _ = writeln!(
                out,
                "            {:<12} {:>10} {:>7} {:>10} {:>10} {:>10} {:>10}",
                op,
                f.count,
                f.errors,
                micros(f.p50_us),
                micros(f.p90_us),
                micros(f.p99_us),
                micros(f.max_us)
            );
        }
    }
    let _ = writeln!(out, "  log       {}", about.log);
    if let Some(trace) = &about.trace {
        let _ = writeln!(out, "  trace     {trace}");
    }
    if let Some(path) = &m.stats_file {
        let _ = writeln!(out, "  counters  {}", path.display());
    }
    out
}

/// What samplers' hints did: lists, how many first reads found their sample fetched in time.
fn hints_line(h: &crate::tiers::lookahead::HintStats, socket: Option<&str>) -> String {
    if h.lists == 0 {
        return format!(
            "none received yet (samplers send them to {})",
            socket.unwrap_or("the mount's hints socket")
        );
    }
    let pct = |n: u64| n as f64 * 100.0 / h.first_reads.max(1) as f64;
    let in_time = h.first_reads.saturating_sub(h.missed + h.late);
    let unknown = match h.unknown_paths {
        0 => String::new(),
        n => format!(", {n} paths named no file"),
    };
    format!(
        "{} list(s) held of {} received (epoch {}), {} samples{unknown}; {:.1}% of {} first reads \
         fetched in time, {:.1}% waited for the fetch, {:.1}% missed; {} samples ({}) fetched \
         ahead in {} requests ({:.2} per sample), window {} of {} (peak {}), {} extents dropped unread",
        h.active_lists,
        h.lists,
        h.epoch,
        h.samples,
        pct(in_time),
        h.first_reads,
        pct(h.late),
        pct(h.missed),
        h.fetched,
        human(h.fetched_bytes),
        h.requests,
        h.requests as f64 / h.fetched.max(1) as f64,
        human(h.window_held),
        human(h.window),
        human(h.window_peak),
        h.dropped_unread
    )
}

fn duration(secs: f64) -> String {
    let s = secs as u64;
    match s {
        0..60 => format!("{secs:.1}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

fn micros(us: f64) -> String {
    if us >= 1_000_000.0 {
        format!("{:.2}s", us / 1e6)
    } else if us >= 1000.0 {
        format!("{:.2}ms", us / 1000.0)
    } else {
        format!("{us:.1}µs")
    }
}

fn human(bytes: u64) -> String {
    indicatif::HumanBytes(bytes).to_string()
}
