//! What the packages ship, exercised as an admin uses it: the Slurm prolog/epilog run as slurmd
//! runs them (no PATH, only Slurm's variables), the mount helper through mount(8) and an fstab,
//! the man pages through man(1), the bash completion through bash.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

const BIN: &str = env!("CARGO_BIN_EXE_packfs");

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// A world-traversable temporary directory (the job's user must reach the mounts in it).
fn open_tempdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// A tar of three files and its index.
fn dataset(dir: &Path) -> (PathBuf, PathBuf) {
    let files: Vec<_> = ["d/a.bin", "d/b.bin", "d/c.bin"]
        .iter()
        .enumerate()
        .map(|(i, name)| (name.to_string(), bytes(i as u64, 5000 + i * 100)))
        .collect();
    let made = indexed_tar(dir, "a", &files);
    (made.src, made.index)
}

/// Runs a Slurm script as slurmd does: no PATH, Slurm's variables, the config in `conf`.
fn slurm_script(script: &str, conf: &Path, vars: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new("/usr/bin/env");
    cmd.arg("-i");
    for (k, v) in vars {
        cmd.arg(format!("{k}={v}"));
    }
    cmd.arg(format!("PACKFS_SLURM_CONF={}", conf.display()))
        .arg(repo(&format!("packaging/slurm/{script}")));
    cmd.output().unwrap()
}

/// Runs a bash `script` in a mount namespace of its own (what it mounts, the machine does not
/// see); its stdout and stderr, once it succeeded.
fn in_private_mount_namespace(script: &str) -> (String, String) {
    let out = Command::new("unshare")
        .args(["--mount", "bash", "-c", script])
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    (stdout, stderr)
}

#[test]
fn slurm_prolog_mounts_for_the_job_user_and_the_epilog_cleans_up_twice() {
    let dir = open_tempdir();
    let (src, index) = dataset(dir.path());
    let (mounts, stages) = (dir.path().join("mnt"), dir.path().join("stage"));
    let conf = dir.path().join("slurm.conf");
    let index = index.display();
    std::fs::write(
        &conf,
        format!(
            "PACKFS={BIN}\nMOUNT_ROOT={}\nSTAGE_ROOT={}\n\
             dataset always always {index} eager\n\
             dataset gpu partition=cpu,gpu {index} no --cache-size 16M\n\
             dataset other partition=cpu {index} no\n\
             dataset asked request {index} lazy\n\
             dataset unasked request {index} no\n\
             dataset broken always {}/missing.packfs-index no\n",
            mounts.display(),
            stages.display(),
            dir.path().display()
        ),
    )
    .unwrap();
    let vars = [
        ("SLURM_JOB_ID", "4242"),
        ("SLURM_JOB_UID", "65534"),
        ("SLURM_JOB_GID", "65534"),
        ("SLURM_JOB_USER", "nobody"),
        ("SLURM_JOB_PARTITION", "gpu"),
        ("SLURM_JOB_EXTRA", "packfs=asked"),
        ("SLURMD_NODENAME", "node1"),
        ("SLURM_SCRIPT_CONTEXT", "prolog_slurmd"),
    ];
    let out = slurm_script("prolog.sh", &conf, &vars);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "prolog failed: {said}");
    let job = mounts.join("4242");
    for name in ["always", "gpu", "asked"] {
        assert!(is_mounted(&job.join(name)), "{name} not mounted: {said}");
    }
    for name in ["other", "unasked", "broken"] {
        assert!(!is_mounted(&job.join(name)), "{name} mounted");
    }
    let error = std::fs::read_to_string(job.join("broken.error")).unwrap();
    assert!(error.contains("missing.packfs-index"), "{error}");
    assert!(stages.join("4242/always").is_dir());

    // The job's user reads the files (and owns them); another user cannot even list the job.
    let file = job.join("always/d/b.bin");
    let read = as_user(65534, "cat", &[file.to_str().unwrap()]);
    assert!(
        read.status.success(),
        "{}",
        String::from_utf8_lossy(&read.stderr)
    );
    assert_eq!(read.stdout, std::fs::read(src.join("d/b.bin")).unwrap());
    let owner = as_user(65534, "stat", &["-c", "%u", file.to_str().unwrap()]);
    assert_eq!(String::from_utf8_lossy(&owner.stdout).trim(), "65534");
    let other = as_user(65533, "ls", &[job.to_str().unwrap()]);
    assert!(
        !other.status.success(),
        "another user listed the job's mounts"
    );

    // The task prolog, as the user, exports where each dataset is.
    let task = Command::new("setpriv")
        .args([
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            "/usr/bin/env",
            "-i",
        ])
        .args(vars.iter().map(|(k, v)| format!("{k}={v}")))
        .arg(format!("PACKFS_SLURM_CONF={}", conf.display()))
        .arg(repo("packaging/slurm/task_prolog.sh"))
        .output()
        .unwrap();
    let exports = String::from_utf8_lossy(&task.stdout);
    assert!(
        exports.contains(&format!(
            "export PACKFS_ALWAYS={}",
            job.join("always").display()
        )),
        "{exports}"
    );
    // The one that failed is not exported (it pointed at an empty directory): named in
    // PACKFS_FAILED, and why, printed on the task's output.
    assert!(!exports.contains("export PACKFS_BROKEN="), "{exports}");
    assert!(exports.contains("unset PACKFS_BROKEN"), "{exports}");
    assert!(
        exports.contains("export PACKFS_FAILED=\"broken\""),
        "{exports}"
    );
    assert!(
        exports
            .lines()
            .any(|l| l.starts_with("print packfs: ") && l.contains("missing.packfs-index")),
        "{exports}"
    );

    // A daemon that died leaves a stale mount: the epilog cleans it too.
    let stats = packfs()
        .args(["status", "--json"])
        .arg(job.join("gpu"))
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    let pid = status[0]["counters"]["pid"].as_i64().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    for round in 1..=2 {
        let out = slurm_script("epilog.sh", &conf, &vars);
        assert!(
            out.status.success(),
            "epilog round {round} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for name in ["always", "gpu", "asked"] {
            assert!(
                !is_mounted(&job.join(name)),
                "round {round}: {name} still mounted"
            );
        }
        assert!(!job.exists(), "round {round}: the job's directory is left");
        assert!(
            !stages.join("4242").exists(),
            "round {round}: staged data is left"
        );
    }
}

/// STAGE `peers`: two "nodes" of one job (here one machine, each with its own config, roots and
/// listening address; Slurm's node list expanded by a stand-in for scontrol) stage their shares
/// and read the other share from each other, with one secret the prolog derived on each from the
/// site's key; the epilog removes what the prolog made. Two datasets of the job serve on ports
/// of their own, and each node's prolog asks Slurm for the node list once.
#[test]
fn slurm_prolog_with_peers_stages_shares_that_the_nodes_read_from_each_other() {
    let dir = open_tempdir();
    let mut files = Vec::new();
    let mut images = Vec::new();
    for s in 0..4u64 {
        let members: Vec<(String, Vec<u8>)> = (0..6u64)
            .map(|n| {
                (
                    format!("s{s}/f{n}.bin"),
                    bytes(s * 10 + n, 30_000 + n as usize * 999),
                )
            })
            .collect();
        files.extend(members.clone());
        images.push(
            tar_of(
                &dir.path().join(format!("t{s}")),
                &format!("s{s}"),
                &members,
            )
            .1,
        );
    }
    let index = dir.path().join("data.packfs-index");
    run(packfs()
        .arg("index")
        .arg("-q")
        .arg("-o")
        .arg(&index)
        .args(&images));
    // The second dataset: the same shards in another order, so another dataset to the peers
    // (its node asking the first dataset's server would be refused and read the source).
    let other = dir.path().join("more.packfs-index");
    run(packfs()
        .arg("index")
        .arg("-q")
        .arg("-o")
        .arg(&other)
        .args(images.iter().rev()));
    let scontrol = dir.path().join("scontrol");
    let calls = dir.path().join("scontrol.calls");
    std::fs::write(
        &scontrol,
        format!(
            "#!/bin/sh\necho \"$*\" >> {}\nprintf '127.0.0.1\\n127.0.0.2\\n'\n",
            calls.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&scontrol, std::fs::Permissions::from_mode(0o755)).unwrap();
    let key = dir.path().join("peer.key");
    std::fs::write(&key, bytes(7, 32)).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let job = 30_000 + std::process::id() % 9_000;
    let port = 11_000 + job % 5_440 * 4;
    let job = job.to_string();
    let node = |k: usize| -> (PathBuf, Vec<(String, String)>) {
        let conf = dir.path().join(format!("slurm{k}.conf"));
        std::fs::write(
            &conf,
            format!(
                "PACKFS={BIN}\nMOUNT_ROOT={}/mnt{k}\nSTAGE_ROOT={}/stage{k}\nPEER_KEY={}\n\
                 SCONTROL={}\ndataset data always {index} peers --peer-listen 127.0.0.{n}:{port}\n\
                 dataset more always {} peers --peer-listen 127.0.0.{n}:{}\n",
                dir.path().display(),
                dir.path().display(),
                key.display(),
                scontrol.display(),
                other.display(),
                port + 1,
                index = index.display(),
                n = k + 1
            ),
        )
        .unwrap();
        let vars = vec![
            ("SLURM_JOB_ID".into(), job.clone()),
            ("SLURM_JOB_UID".into(), "65534".into()),
            ("SLURM_JOB_GID".into(), "65534".into()),
            ("SLURM_JOB_NODELIST".into(), "n[1-2]".into()),
            ("SLURMD_NODENAME".into(), format!("127.0.0.{}", k + 1)),
        ];
        (conf, vars)
    };
    let nodes = [node(0), node(1)];
    let vars_of = |k: usize| -> Vec<(&str, &str)> {
        nodes[k]
            .1
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect()
    };
    let datasets = ["data", "more"];
    let mnt = |k: usize, name: &str| dir.path().join(format!("mnt{k}/{job}/{name}"));
    for (k, (conf, _)) in nodes.iter().enumerate() {
        let out = slurm_script("prolog.sh", conf, &vars_of(k));
        let said = String::from_utf8_lossy(&out.stderr);
        for name in datasets {
            assert!(
                out.status.success() && is_mounted(&mnt(k, name)),
                "node {k}, {name}: {said}"
            );
        }
        assert!(!said.contains("without"), "node {k}: {said}");
    }
    let asked = std::fs::read_to_string(&calls).unwrap();
    assert_eq!(asked.lines().count(), 2, "once per node: {asked}");
    let secrets: Vec<Vec<u8>> = (0..2)
        .map(|k| {
            let path = dir.path().join(format!("stage{k}/{job}/peer-secret"));
            assert_eq!(
                std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
                0o600
            );
            std::fs::read(path).unwrap()
        })
        .collect();
    assert_eq!(secrets[0], secrets[1], "one secret per job");
    let counters = |k: usize, name: &str| -> serde_json::Value {
        let out = packfs()
            .args(["status", "--json"])
            .arg(mnt(k, name))
            .output()
            .unwrap();
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()[0]["counters"].clone()
    };
    let start = std::time::Instant::now();
    for name in datasets {
        while (0..2).any(|k| counters(k, name)["stage"]["state"] != "complete") {
            assert!(start.elapsed().as_secs() < 60, "{}", counters(0, name));
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        for (file, data) in &files {
            assert!(
                std::fs::read(mnt(0, name).join(file)).unwrap() == *data,
                "{name}/{file}"
            );
        }
    }
    std::thread::sleep(std::time::Duration::from_millis(1200));
    for name in datasets {
        let c = counters(0, name);
        assert_eq!(c["stage"]["images"], 2, "its share, 2 images of 4: {c}");
        assert!(c["peers"]["fetched_bytes"].as_u64().unwrap() > 0, "{c}");
        assert_eq!(c["peers"]["source_bytes"], 0, "{name}: {c}");
    }
    for (k, (conf, _)) in nodes.iter().enumerate() {
        assert_ok(&slurm_script("epilog.sh", conf, &vars_of(k)));
        assert!(datasets.iter().all(|name| !is_mounted(&mnt(k, name))));
        assert!(!dir.path().join(format!("stage{k}/{job}")).exists());
    }
}

/// Another user made STAGE_ROOT before the first job (/dev/shm is world-writable): the prolog
/// mounts without staging and says why; nothing of root's is staged in that user's directory.
#[test]
fn slurm_prolog_stages_nothing_in_a_stage_root_another_user_made() {
    let dir = open_tempdir();
    let (src, index) = dataset(dir.path());
    let shm = dir.path().join("shm");
    std::fs::create_dir(&shm).unwrap();
    std::fs::set_permissions(&shm, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let (mounts, stages) = (dir.path().join("mnt"), shm.join("packfs"));
    let made = as_user(65534, "mkdir", &["-m", "0777", stages.to_str().unwrap()]);
    assert_ok(&made);
    let conf = dir.path().join("slurm.conf");
    std::fs::write(
        &conf,
        format!(
            "PACKFS={BIN}\nMOUNT_ROOT={}\nSTAGE_ROOT={}\ndataset always always {} eager\n",
            mounts.display(),
            stages.display(),
            index.display()
        ),
    )
    .unwrap();
    let vars = [
        ("SLURM_JOB_ID", "77"),
        ("SLURM_JOB_UID", "65534"),
        ("SLURM_JOB_GID", "65534"),
    ];
    let out = slurm_script("prolog.sh", &conf, &vars);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "prolog failed: {said}");
    assert!(
        said.contains("belongs to uid 65534") && said.contains("without staging"),
        "{said}"
    );
    let mnt = mounts.join("77/always");
    assert!(is_mounted(&mnt), "not mounted: {said}");
    assert_eq!(
        std::fs::read(mnt.join("d/a.bin")).unwrap(),
        std::fs::read(src.join("d/a.bin")).unwrap()
    );
    assert!(std::fs::read_dir(&stages).unwrap().next().is_none());
    let out = slurm_script("epilog.sh", &conf, &vars);
    assert_ok(&out);
    assert!(!is_mounted(&mnt));
}

#[test]
fn fstab_lines_mount_through_mount_8_and_the_helper() {
    let dir = open_tempdir();
    let (src, index) = dataset(dir.path());
    // mount(8) runs /sbin/mount.fuse.packfs; in a private mount namespace, a directory holding
    // only that link stands in for /usr/sbin, so the test installs nothing on the machine.
    let helpers = dir.path().join("sbin");
    std::fs::create_dir(&helpers).unwrap();
    std::os::unix::fs::symlink(BIN, helpers.join("mount.fuse.packfs")).unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    let fstab = dir.path().join("fstab");
    std::fs::write(
        &fstab,
        format!(
            "# a test fstab\n\
             {} {} fuse.packfs ro,nofail,_netdev,allow_other,uid=65534,gid=65534,cache_size=32M,pid_file={} 0 0\n",
            index.display(),
            a.display(),
            dir.path().join("a.pid").display()
        ),
    )
    .unwrap();
    let script = format!(
        r#"set -eu
mount --make-rprivate /
sbin=$(readlink -f /sbin)
mount --bind {helpers} "$sbin"
mount -a -T {fstab} -t fuse.packfs
mount -t fuse.packfs -o ro,cache_size=16M {index} {b}
umount "$sbin"
cat {pid}
grep -E ' ({a}|{b}) fuse.packfs ' /proc/self/mounts | wc -l
stat -c '%u %a' {a}/d/a.bin
cmp {a}/d/a.bin {src}/d/a.bin
cmp {b}/d/c.bin {src}/d/c.bin
umount {a}
umount {b}
# Only this test's mounts: the namespace also holds copies of other tests' mounts.
grep -cE ' ({a}|{b}) fuse.packfs ' /proc/self/mounts || true
"#,
        helpers = helpers.display(),
        fstab = fstab.display(),
        index = index.display(),
        a = a.display(),
        b = b.display(),
        src = src.display(),
        pid = dir.path().join("a.pid").display(),
    );
    let (stdout, stderr) = in_private_mount_namespace(&script);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[1..], ["2", "65534 644", "0"], "{stderr}");
    // The daemons end with their mounts.
    let pid: u32 = lines[0].trim().parse().unwrap();
    let gone = (0..100).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(50));
        !Path::new(&format!("/proc/{pid}")).exists()
    });
    assert!(gone, "the daemon of the fstab mount still runs");
}

#[test]
fn man_pages_render_and_bash_completes_subcommands() {
    let dir = tempfile::tempdir().unwrap();
    run(packfs().arg("man").arg(dir.path()));
    for page in [
        "packfs",
        "packfs-mount",
        "packfs-status",
        "packfs-pack",
        "packfs-trace",
    ] {
        let path = dir.path().join(format!("{page}.1"));
        assert!(path.is_file(), "{page}.1 missing");
    }
    let rendered = Command::new("man")
        .args(["-l", "-P", "cat"])
        .arg(dir.path().join("packfs-mount.1"))
        .env("MANWIDTH", "100")
        .output();
    match rendered {
        Ok(out) if out.status.success() => {
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                text.contains("--stage") && text.contains("--idle-timeout"),
                "{text}"
            );
        }
        _ => skip(
            "man",
            "man(1) is not installed: the man page is not rendered",
        ),
    }

    let script = dir.path().join("packfs.bash");
    std::fs::write(&script, run(packfs().args(["completions", "bash"]))).unwrap();
    let words = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source {}; COMP_WORDS=(packfs st); COMP_CWORD=1; COMP_LINE='packfs st'; \
             COMP_POINT=9; _packfs packfs st packfs; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            script.display()
        ))
        .output()
        .unwrap();
    let got = String::from_utf8_lossy(&words.stdout);
    assert!(
        got.lines().any(|w| w == "status") && got.lines().any(|w| w == "stage"),
        "{got}"
    );
    for shell in ["zsh", "fish"] {
        let text = run(packfs().args(["completions", shell]));
        assert!(
            text.contains("status"),
            "{shell} completion lacks subcommands"
        );
    }
}

/// An fstab `user` entry, mounted by an ordinary user through mount(8), which runs the helper
/// with an empty environment (no PATH: fusermount3 must still be found); an option repeated in
/// the entry counts once, with its last value. In a private mount namespace whose /etc/fstab is
/// the test's, so nothing on the machine changes.
#[test]
fn an_fstab_user_entry_mounts_for_an_ordinary_user_with_an_empty_environment() {
    let dir = open_tempdir();
    let (src, index) = dataset(dir.path());
    let helpers = dir.path().join("sbin");
    std::fs::create_dir(&helpers).unwrap();
    std::os::unix::fs::symlink(BIN, helpers.join("mount.fuse.packfs")).unwrap();
    let mnt = dir.path().join("user-mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    std::os::unix::fs::chown(&mnt, Some(65534), Some(65534)).unwrap();
    let fstab = dir.path().join("fstab");
    std::fs::write(
        &fstab,
        format!(
            "{} {} fuse.packfs ro,user,noauto,cache_size=16M,cache_size=32M 0 0\n",
            index.display(),
            mnt.display(),
        ),
    )
    .unwrap();
    let script = format!(
        r#"set -eu
mount --make-rprivate /
mount --bind {fstab} /etc/fstab
sbin=$(readlink -f /sbin)
mount --bind {helpers} "$sbin"
# Ordinary users need /dev/fuse 0666 (the fuse3 package's udev rule): a node of that mode over
# it in this namespace only, the machine's left as it is.
mknod -m 0666 {dev} c 10 229
mount --bind {dev} /dev/fuse
as_user() {{ setpriv --reuid 65534 --regid 65534 --clear-groups /usr/bin/env -i "$@"; }}
as_user /usr/bin/mount {mnt}
as_user /usr/bin/cmp {mnt}/d/b.bin {src}/d/b.bin
grep -cE ' {mnt} fuse' /proc/self/mounts
as_user {bin} umount {mnt}
grep -cE ' {mnt} fuse' /proc/self/mounts || true
"#,
        fstab = fstab.display(),
        helpers = helpers.display(),
        mnt = mnt.display(),
        src = src.display(),
        bin = BIN,
        dev = dir.path().join("fuse").display(),
    );
    let (stdout, stderr) = in_private_mount_namespace(&script);
    assert_eq!(stdout.lines().collect::<Vec<_>>(), ["1", "0"], "{stderr}");
}
