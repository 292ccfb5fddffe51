//! `packfs man DIR` and `packfs completions SHELL`: the man pages and shell completions the
//! packages ship, generated from the same clap definitions as the parser, so they never drift.

use std::path::PathBuf;

use anyhow::Context;
use clap::CommandFactory;

#[derive(clap::Args, Debug)]
pub struct ManArgs {
    /// Directory to write packfs.1 and packfs-SUBCOMMAND.1 into (created if needed).
    dir: PathBuf,
}

#[derive(clap::Args, Debug)]
pub struct CompletionsArgs {
    shell: clap_complete::Shell,
}

/// Writes one page for `packfs` and one for every subcommand (`man packfs-mount`).
pub fn man(args: ManArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("cannot create {}", args.dir.display()))?;
    let cmd = super::Cli::command();
    let mut written = 0;
    write_pages(&cmd, "packfs", &args.dir, &mut written)?;
    eprintln!("packfs: {written} man pages in {}", args.dir.display());
    Ok(())
}

fn write_pages(
    cmd: &clap::Command,
    name: &str,
    dir: &std::path::Path,
    written: &mut usize,
) -> anyhow::Result<()> {
    let page = cmd
        .clone()
        .name(name.to_string())
        .display_name(name.to_string());
    let mut bytes = Vec::new();
    clap_mangen::Man::new(page).render(&mut bytes)?;
    let path = dir.join(format!("{name}.1"));
    std::fs::write(&path, bytes).with_context(|| format!("cannot write {}", path.display()))?;
    *written += 1;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_pages(sub, &format!("{name}-{}", sub.get_name()), dir, written)?;
    }
    Ok(())
}

pub fn completions(args: CompletionsArgs) -> anyhow::Result<()> {
    let mut cmd = super::Cli::command();
    clap_complete::generate(args.shell, &mut cmd, "packfs", &mut std::io::stdout());
    Ok(())
}
