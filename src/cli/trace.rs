//! `packfs trace summarize`

use std::path::PathBuf;

use crate::fs::trace::summary::{self, Summary};
use anyhow::Context;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// Per-operation counts and latency percentiles, bytes by tier and the busiest paths of a
    /// trace written by `packfs mount --trace FILE`.
    Summarize {
        file: PathBuf,
        /// How many of the paths with the most bytes read to list.
        #[arg(long, default_value_t = 10)]
        top: usize,
        /// The summary as JSON.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let Command::Summarize { file, top, json } = args.command;
    let input =
        std::fs::File::open(&file).with_context(|| format!("cannot open {}", file.display()))?;
    let summary = summary::summarize(std::io::BufReader::new(input), top)
        .with_context(|| format!("cannot read {}", file.display()))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print!("{}", render(&file, &summary));
    }
    Ok(())
}

fn render(file: &std::path::Path, s: &Summary) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let ending = match (s.complete, s.dropped) {
        (false, _) => "cut short (its daemon did not close it)".to_string(),
        (true, Some(0) | None) => "complete".to_string(),
        (true, Some(n)) => format!("{n} request(s) left out (queue full or size limit)"),
    };
    let _ = writeln!(
        out,
        "{}: {} requests over {:.3} s, {ending}",
        file.display(),
        s.requests,
        s.span_s
    );
    if s.unreadable_lines > 0 {
        let _ = writeln!(out, "{} line(s) are not trace events", s.unreadable_lines);
    }
    let _ = writeln!(
        out,
        "{:<12} {:>10} {:>7} {:>12} {:>10} {:>10} {:>10} {:>10} {:>12}",
        "op", "count", "errors", "bytes", "p50 µs", "p90 µs", "p99 µs", "max µs", "total ms"
    );
    for (op, summary) in &s.ops {
        let f = &summary.figures;
        let _ = writeln!(
            out,
            "{:<12} {:>10} {:>7} {:>12} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>12.1}",
            op,
            f.count,
            f.errors,
            f.bytes,
            f.p50_us,
            f.p90_us,
            f.p99_us,
            f.max_us,
            summary.total_ms
        );
    }
    if !s.tiers.is_empty() {
        let tiers: Vec<String> = s.tiers.iter().map(|(t, b)| format!("{t} {b}")).collect();
        let _ = writeln!(out, "bytes read by tier: {}", tiers.join(", "));
    }
    if !s.top_paths.is_empty() {
        let _ = writeln!(out, "paths with the most bytes read:");
        for p in &s.top_paths {
            let _ = writeln!(
                out,
                "  {:>12} bytes {:>8} reads  {}",
                p.bytes, p.reads, p.path
            );
        }
    }
    out
}
