//! packfs in containers, as docs/operations.md's recipes run it: a real container runtime
//! (Podman, which takes Docker's `run` flags) on an image holding only the packfs binary, busybox
//! and their libraries; and a host mount bound into a user namespace, as Apptainer binds one.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use common::*;

const IMAGE: &str = "localhost/packfs-test:tests";

/// The test image, built once per run from this build's binary: `None` (after `skip`) where
/// there is no podman.
fn image() -> Option<&'static str> {
    static BUILT: OnceLock<bool> = OnceLock::new();
    let built = *BUILT.get_or_init(|| {
        if Command::new("podman").arg("--version").output().is_err() {
            skip(
                "podman",
                "podman is not installed (apt-get install podman runc; .ci/run installs it)",
            );
            return false;
        }
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("rootfs");
        for d in ["bin", "mnt", "data", "dev", "proc", "sys", "etc", "run"] {
            fs::create_dir_all(root.join(d)).unwrap();
        }
        fs::create_dir_all(root.join("tmp")).unwrap();
        sh("chmod 1777 rootfs/tmp", dir.path());
        let packfs = env!("CARGO_BIN_EXE_packfs");
        let busybox = run(Command::new("sh").args(["-c", "command -v busybox"]));
        for program in [packfs, busybox.trim()] {
            fs::copy(
                program,
                root.join("bin")
                    .join(Path::new(program).file_name().unwrap()),
            )
            .unwrap();
            // The libraries each links, at the paths the loader looks for them.
            for line in run(Command::new("ldd").arg(program)).lines() {
                let lib = line
                    .split_whitespace()
                    .find(|w| w.starts_with('/'))
                    .map(PathBuf::from);
                if let Some(lib) = lib {
                    let to = root.join(lib.strip_prefix("/").unwrap());
                    fs::create_dir_all(to.parent().unwrap()).unwrap();
                    fs::copy(&lib, &to).unwrap();
                }
            }
        }
        for tool in ["sh", "cat", "sha256sum", "mkdir", "grep", "id"] {
            std::os::unix::fs::symlink("busybox", root.join("bin").join(tool)).unwrap();
        }
        fs::write(root.join("etc/passwd"), "root:x:0:0::/root:/bin/sh\n").unwrap();
        let _ = Command::new("podman").args(["rmi", "-f", IMAGE]).output();
        sh(
            &format!("tar -C rootfs -c . | podman import - {IMAGE} >/dev/null"),
            dir.path(),
        );
        true
    });
    built.then_some(IMAGE)
}

/// `podman run --rm` with `flags` (Docker's), the data directory at /data, running `script`.
/// The first flags suit this kind of machine, not the recipes: its cgroups are v1 in hybrid
/// mode, which crun refuses, and it forbids a container to raise RLIMIT_NPROC and NOFILE.
fn container(data: &Path, flags: &[&str], script: &str) -> Option<Output> {
    let image = image()?;
    let mut cmd = Command::new("podman");
    cmd.args([
        "--runtime",
        "runc",
        "--cgroup-manager",
        "cgroupfs",
        "run",
        "--rm",
    ])
    .args([
        "--ulimit",
        "nofile=4096:4096",
        "--ulimit",
        "nproc=4096:4096",
    ])
    .args(["--network", "none", "-v"])
    .arg(format!("{}:/data:ro", data.display()))
    .args(flags)
    .args([image, "sh", "-c", script]);
    Some(cmd.output().unwrap())
}

/// A dataset in `dir/data/d.tar`, and the checksum lines `sha256sum` prints for its files under
/// `prefix`.
fn dataset(dir: &Path, prefix: &str) -> (PathBuf, String) {
    let files: Vec<(String, Vec<u8>)> = (0..4)
        .map(|i| (format!("train/c{i}/{i}.jpg"), bytes(i, 20_000 + i as usize)))
        .collect();
    let data = dir.join("data");
    fs::create_dir_all(&data).unwrap();
    let (src, tar) = tar_of(dir, "d", &files);
    fs::rename(&tar, data.join("d.tar")).unwrap();
    let names: Vec<String> = files.iter().map(|(n, _)| n.clone()).collect();
    let sums = run(Command::new("sha256sum").args(&names).current_dir(&src));
    let sums = sums
        .lines()
        .map(|l| l.replacen("  ", &format!("  {prefix}/"), 1) + "\n")
        .collect();
    (data, sums)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The Docker recipe: with `--device /dev/fuse --cap-add SYS_ADMIN` packfs mounts inside the
/// container and serves the files byte for byte; without the device or the capability the
/// mount fails at once, saying which flag to add.
#[test]
fn docker_flags_mount_inside_a_container_and_without_them_the_error_names_them() {
    let dir = tempfile::tempdir().unwrap();
    let (data, sums) = dataset(dir.path(), "/mnt");
    let names = "/mnt/train/c0/0.jpg /mnt/train/c1/1.jpg /mnt/train/c2/2.jpg /mnt/train/c3/3.jpg";
    let script = format!(
        "packfs mount /data/d.tar /mnt && sha256sum {names} && packfs umount /mnt && \
         ! grep -q fuse /proc/mounts"
    );
    let Some(out) = container(
        &data,
        &["--device", "/dev/fuse", "--cap-add", "SYS_ADMIN"],
        &script,
    ) else {
        return;
    };
    assert_ok(&out);
    assert_eq!(String::from_utf8_lossy(&out.stdout), sums);
    // Nothing to warn of: the read-only /sys of a container keeps the kernel's readahead.
    assert!(!stderr(&out).contains("WARN"), "{}", stderr(&out));

    let no_cap = container(&data, &["--device", "/dev/fuse"], &script).unwrap();
    assert!(!no_cap.status.success());
    let text = stderr(&no_cap);
    assert!(
        text.contains("lacks CAP_SYS_ADMIN") && text.contains("--cap-add SYS_ADMIN"),
        "{text}"
    );
    assert_eq!(text.matches("error").count(), 1, "one error line: {text}");

    // The capability, but a security profile that forbids mount(2) (as Docker's AppArmor
    // profile does): fuser falls back to a fusermount3 the image lacks.
    let profile = dir.path().join("no-mount.json");
    fs::write(
        &profile,
        r#"{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["mount"], "action": "SCMP_ACT_ERRNO"}]}"#,
    )
    .unwrap();
    let seccomp = format!("seccomp={}", profile.display());
    let confined = container(
        &data,
        &[
            "--device",
            "/dev/fuse",
            "--cap-add",
            "SYS_ADMIN",
            "--security-opt",
            &seccomp,
        ],
        &script,
    )
    .unwrap();
    assert!(!confined.status.success());
    let text = stderr(&confined);
    assert!(
        text.contains("cannot mount at /mnt: the kernel refused the mount")
            && text.contains("apparmor=unconfined"),
        "{text}"
    );

    let no_device = container(&data, &["--cap-add", "SYS_ADMIN"], &script).unwrap();
    assert!(!no_device.status.success());
    assert!(
        stderr(&no_device).contains("/dev/fuse does not exist"),
        "{}",
        stderr(&no_device)
    );
}

/// The bind recipe (Apptainer's `--bind`, Docker's `-v`): a mount made on the host is read in a
/// container by a user other than the mounter only with `--allow-other`; without it the kernel
/// refuses that user, as the docs say.
#[test]
fn a_host_mount_bound_into_a_container_is_read_by_another_user_with_allow_other() {
    let dir = tempfile::tempdir().unwrap();
    // User 1000 walks to the mountpoints.
    sh("chmod 755 .", dir.path());
    let (data, sums) = dataset(dir.path(), "/data");
    let names =
        "/data/train/c0/0.jpg /data/train/c1/1.jpg /data/train/c2/2.jpg /data/train/c3/3.jpg";
    let read = format!("sha256sum {names}");
    for allow_other in [true, false] {
        let mnt = dir.path().join(format!("mnt-{allow_other}"));
        let extra: &[&str] = if allow_other { &["--allow-other"] } else { &[] };
        let _mounted = Mount::new(&[&data.join("d.tar")], &mnt, extra);
        // Podman's `-v` and Apptainer's `--bind` both bind the host's mount in.
        let Some(out) = container(&mnt, &["--user", "1000:1000"], &read) else {
            return;
        };
        if allow_other {
            assert_ok(&out);
            assert_eq!(String::from_utf8_lossy(&out.stdout), sums);
        } else {
            assert!(!out.status.success());
            assert!(
                stderr(&out).contains("Permission denied"),
                "{}",
                stderr(&out)
            );
        }
        // Apptainer without a runtime: the user's own user and mount namespaces.
        let unshared = as_user(
            1000,
            "unshare",
            &[
                "-Urm",
                "sh",
                "-c",
                &format!(
                    "mkdir -p /tmp/bound-$$ && mount --bind {} /tmp/bound-$$ && cd /tmp/bound-$$ \
                     && sha256sum train/c0/0.jpg",
                    mnt.display()
                ),
            ],
        );
        assert_eq!(
            unshared.status.success(),
            allow_other,
            "{}",
            String::from_utf8_lossy(&unshared.stderr)
        );
    }
}
