//! `packfs status`

use std::path::PathBuf;
use std::time::Duration;

use packfs::daemon::status::{self, MountStatus};
use serde_json::Value;

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
    let stale = mounts.iter().filter(|m| m.state == "stale").count();
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
        .map(|uid| format!(", user {}", packfs::daemon::user_name(uid)))
        .unwrap_or_default();
    let Some(c) = &m.counters else {
        let _ = writeln!(
            out,
            "{}  {}{owner}",
            m.mountpoint.display(),
            m.state.to_uppercase()
        );
        let _ = writeln!(out, "  source    {}", m.source);
        if let Some(problem) = &m.problem {
            let _ = writeln!(out, "  problem   {problem}");
        }
        return out;
    };
    let num = |v: &Value, key: &str| v.get(key).and_then(Value::as_f64).unwrap_or(0.0);
    let int = |v: &Value, key: &str| num(v, key) as u64;
    let _ = writeln!(
        out,
        "{}  live, pid {}, up {}{owner}{}{}",
        m.mountpoint.display(),
        int(c, "pid"),
        duration(num(c, "uptime_s")),
        match c.get("transport").and_then(Value::as_str) {
            Some("uring") => ", FUSE over io_uring",
            _ => "",
        },
        // The daemon rewrites its counters every second: say how old these are.
        m.counters_age_s
            .map(|age| format!("; counters as of {age:.1} s ago"))
            .unwrap_or_default()
    );
    let _ = writeln!(
        out,
        "  dataset   {}: {} image(s), {} files, {}",
        c["dataset"].as_str().unwrap_or(&m.source),
        int(c, "images"),
        int(c, "files"),
        human(int(c, "bytes"))
    );
    let skipped = int(c, "skipped_members");
    if skipped > 0 {
        let damaged = match int(c, "damaged_headers") {
            0 => String::new(),
            n => format!(", {n} of them behind a damaged tar header"),
        };
        let _ = writeln!(
            out,
            "  skipped   {skipped} member(s) left out at scan{damaged}: the scan's warnings \
             (`packfs ls IMAGE`) name each"
        );
    }
    let served = &c["served"];
    let (ram, staged, source) = (
        int(served, "ram_bytes"),
        int(served, "staged_bytes"),
        int(served, "source_bytes"),
    );
    let _ = writeln!(
        out,
        "  served    {} (page-cache misses): {} from RAM, {} staged, {} from the images ({} reads)",
        human(ram + staged + source),
        human(ram),
        human(staged),
        human(source),
        int(&c["source"], "reads")
    );
    if int(served, "streams") > 0 {
        let _ = writeln!(
            out,
            "  in order  {} reader(s) walking an image in order, read in chunks with read-ahead: \
             {}, {} chunks fetched ahead",
            int(served, "streams"),
            human(int(served, "streamed_bytes")),
            int(served, "read_ahead_chunks")
        );
    }
    let ram_c = &c["ram"];
    let (hits, loads) = (int(ram_c, "hits"), int(ram_c, "loads"));
    let _ = writeln!(
        out,
        "  cache     {} of {} (peak {}), {} hits, {} loads",
        human(int(ram_c, "held")),
        human(int(ram_c, "budget")),
        human(int(ram_c, "peak")),
        hits,
        loads
    );
    let memory = &ram_c["memory"];
    let _ = writeln!(
        out,
        "  memory    {} of {} held (peak {}), {} waits for room",
        human(int(memory, "held")),
        human(int(memory, "total")),
        human(int(memory, "peak")),
        int(memory, "waits")
    );
    if let Some(st) = c.get("stage").filter(|s| !s.is_null()) {
        let total = int(st, "total_bytes").max(1);
        let present = int(st, "present_bytes");
        let _ = writeln!(
            out,
            "  staging   {} in {}: {}% ({} of {}), {} checked chunks, {} failed checks",
            st["status"].as_str().unwrap_or("?"),
            st["dir"].as_str().unwrap_or("?"),
            present * 100 / total,
            human(present),
            human(int(st, "total_bytes")),
            int(st, "verified_chunks"),
            int(st, "failed_checks")
        );
    }
    for store in c["remote"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "  store     {}: {} requests, {}, {} retries, {} failed",
            store["store"].as_str().unwrap_or("?"),
            int(store, "requests"),
            human(int(store, "bytes")),
            int(store, "retries"),
            int(store, "errors")
        );
    }
    if let Some(cred) = c["credentials"].as_object() {
        let _ = writeln!(
            out,
            "  creds     {}{}: renewed {} times, {} failed fetches",
            cred["from"].as_str().unwrap_or("?"),
            cred["expires"]
                .as_str()
                .map_or(String::new(), |t| format!(", valid until {t}")),
            cred["renewals"].as_u64().unwrap_or(0),
            cred["failures"].as_u64().unwrap_or(0)
        );
    }
    let errors = int(c, "errors");
    let _ = writeln!(
        out,
        "  errors    {errors}{}",
        if errors > 0 {
            " (the log says which files and why)"
        } else {
            ""
        }
    );
    if let Some(reqs) = c["requests"].as_object().filter(|r| !r.is_empty()) {
        let _ = writeln!(
            out,
            "  requests  {:<12} {:>10} {:>7} {:>10} {:>10} {:>10} {:>10}",
            "", "count", "errors", "p50", "p90", "p99", "max"
        );
        for (op, f) in reqs {
            let _ = writeln!(
                out,
                "            {:<12} {:>10} {:>7} {:>10} {:>10} {:>10} {:>10}",
                op,
                int(f, "count"),
                int(f, "errors"),
                micros(num(f, "p50_us")),
                micros(num(f, "p90_us")),
                micros(num(f, "p99_us")),
                micros(num(f, "max_us"))
            );
        }
    }
    let _ = writeln!(out, "  log       {}", c["log"].as_str().unwrap_or("?"));
    if let Some(trace) = c["trace"].as_str() {
        let _ = writeln!(out, "  trace     {trace}");
    }
    if let Some(path) = &m.stats_file {
        let _ = writeln!(out, "  counters  {}", path.display());
    }
    out
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
