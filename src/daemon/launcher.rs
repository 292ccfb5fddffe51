//! The background mode: `packfs mount` re-executes itself as a detached daemon and relays the
//! daemon's messages until the daemon says it is ready (the mount answers) or dies; so the
//! command returns 0 only when the mount answers, and otherwise prints why it failed.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};

use super::MountError;

/// The line a daemon writes to its launcher once the mount answers; the launcher does not print it.
const READY_MARKER: &[u8] = b"\x01packfs-ready";

/// Re-executes this program with `child_args` as a detached daemon, relays its messages, and
/// returns once it reports the mount ready (with the line that says what is mounted where), or an
/// error if it exits first.
pub fn spawn_background(child_args: &[OsString], mountpoint: &Path) -> Result<String, MountError> {
    let exe = std::env::current_exe().map_err(MountError::NoExecutable)?;
    let mut cmd = Command::new(exe);
    cmd.args(child_args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // The daemon's progress lines come through here: on a terminal, often enough to watch.
    if std::env::var_os("PACKFS_PROGRESS_EVERY").is_none() && std::io::stderr().is_terminal() {
        cmd.env("PACKFS_PROGRESS_EVERY", "2");
    }
    // SAFETY: setsid is async-signal-safe; it detaches the daemon from the job's terminal and
    // process group, so a Ctrl-C aimed at the launching shell does not reach it.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            Ok(())
        });
    }
    // Watching before the daemon exists: a signal between its spawn and the watch killed this
    // process alone, and the daemon, in its own session, went on to mount.
    let cancel = CancelOnSignal::watch();
    if let Some(signal) = cancel.as_ref().and_then(CancelOnSignal::stop_if_caught) {
        return Err(MountError::Cancelled {
            signal,
            mountpoint: mountpoint.to_path_buf(),
        });
    }
    let mut child = cmd.spawn().map_err(MountError::Spawn)?;
    if let Some(cancel) = &cancel {
        cancel.started(child.id());
    }
    let stderr = child.stderr.take().expect("piped");
    let mut out = std::io::stderr().lock();
    let mut ready = None;
    let mut said_why = false;
    for line in BufReader::new(stderr).split(b'\n') {
        let Ok(line) = line else { break };
        said_why |= line.starts_with(b"packfs: error: ");
        if let Some(said) = line.strip_prefix(READY_MARKER) {
            ready = Some(
                String::from_utf8_lossy(said.strip_prefix(b"\t").unwrap_or(said)).into_owned(),
            );
            break;
        }
        let _ = out.write_all(&line);
        let _ = out.write_all(b"\n");
    }
    drop(out);
    if let Some(signal) = cancel.as_ref().and_then(CancelOnSignal::stop) {
        // The daemon was told to stop: scanning, it just exits; mounted, it unmounts first.
        let _ = child.wait();
        return Err(MountError::Cancelled {
            signal,
            mountpoint: mountpoint.to_path_buf(),
        });
    }
    let Some(ready) = ready else {
        let status = child.wait().map_err(MountError::Spawn)?;
        // The daemon's own error line says what failed: a second one about its exit would only
        // bury it. Without one (killed, crashed), say that it exited and how.
        if said_why && !status.success() {
            return Err(MountError::Reported(status));
        }
        return Err(MountError::DaemonExited {
            mountpoint: super::mounts::absolute(mountpoint)
                .unwrap_or_else(|_| mountpoint.to_path_buf()),
            status,
        });
    };
    Ok(ready)
}

/// Ctrl-C, or SIGTERM/SIGHUP (a job cancelled), while the launcher waits: the daemon is detached
/// from the terminal (setsid), so the launcher stops it, waits for it, and exits as the signal
/// would. Without this, a mount still scanning appeared after the user had given up on it.
struct CancelOnSignal {
    handle: signal_hook::iterator::Handle,
    caught: Arc<AtomicI32>,
    /// The daemon's pid once spawned (0 before).
    daemon: Arc<AtomicI32>,
}

impl CancelOnSignal {
    fn watch() -> Option<CancelOnSignal> {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]).ok()?;
        let handle = signals.handle();
        let caught = Arc::new(AtomicI32::new(0));
        let daemon = Arc::new(AtomicI32::new(0));
        let (seen, pid) = (caught.clone(), daemon.clone());
        std::thread::Builder::new()
            .name("packfs-launcher-signals".into())
            .spawn(move || {
                if let Some(signal) = signals.forever().next() {
                    seen.store(signal, Ordering::SeqCst);
                    stop_daemon(pid.load(Ordering::SeqCst));
                }
            })
            .ok()?;
        Some(CancelOnSignal {
            handle,
            caught,
            daemon,
        })
    }

    /// The daemon is spawned: a signal caught before this stops it now (the signal thread saw
    /// no pid yet). Both sides store, then load, so one of them sends the SIGTERM.
    fn started(&self, pid: u32) {
        self.daemon.store(pid as i32, Ordering::SeqCst);
        if self.caught.load(Ordering::SeqCst) != 0 {
            stop_daemon(pid as i32);
        }
    }

    fn caught(&self) -> Option<i32> {
        Some(self.caught.load(Ordering::SeqCst)).filter(|&s| s != 0)
    }

    /// Before the spawn: stops watching if a signal already came (nothing to stop yet).
    fn stop_if_caught(&self) -> Option<i32> {
        self.caught().and_then(|_| self.stop())
    }

    /// Stops watching; the signal caught, if one was.
    fn stop(&self) -> Option<i32> {
        self.handle.close();
        self.caught()
    }
}

fn stop_daemon(pid: i32) {
    if pid > 0 {
        let daemon = nix::unistd::Pid::from_raw(pid);
        let _ = nix::sys::signal::kill(daemon, nix::sys::signal::Signal::SIGTERM);
    }
}

/// Called in the daemon once the mount is ready: tell the launcher (with the line it prints),
/// then stop writing to its pipe. Logs continue in the daemon's log.
pub fn detach_from_launcher(line: String) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(READY_MARKER);
    let _ = err.write_all(b"\t");
    let _ = err.write_all(line.replace('\n', " ").as_bytes());
    let _ = err.write_all(b"\n");
    let _ = err.flush();
    drop(err);
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        let _ = nix::unistd::dup2_stderr(&null);
        let _ = nix::unistd::dup2_stdout(&null);
    }
}
