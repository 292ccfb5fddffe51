//! Servers the remote tests talk to on 127.0.0.1: the object server (tests/support/objserver.py:
//! a file server, a counting and fault-injecting proxy, and stand-ins for the credential
//! endpoints), Ceph's RADOS Gateway (bench/s3gw.sh: a real S3 store, which checks signatures and
//! keys), and moto's S3 and STS server, from PyPI (a mock that accepts any key: only where the
//! object server checks the keys, or for STS, which the gateway here does not offer).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

use serde_json::Value;

use super::{python, python_with, run, skip};

pub const OBJSERVER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/objserver.py");

/// A server process, killed on drop.
pub struct Server {
    pub child: Child,
    pub url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `cmd` and waits for the line that names its port (`PORT n`, or moto's "Running on
/// http://127.0.0.1:n").
pub fn start(mut cmd: Command, from_stderr: bool) -> Server {
    if from_stderr {
        cmd.stderr(Stdio::piped()).stdout(Stdio::null());
    } else {
        cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
    }
    let mut child = cmd.spawn().expect("start the server");
    let pipe: Box<dyn std::io::Read + Send> = if from_stderr {
        Box::new(child.stderr.take().unwrap())
    } else {
        Box::new(child.stdout.take().unwrap())
    };
    let mut lines = BufReader::new(pipe).lines();
    let port = loop {
        let line = lines
            .next()
            .expect("the server exits before it listens")
            .unwrap();
        if let Some(p) = line.strip_prefix("PORT ") {
            break p.trim().to_string();
        }
        if let Some(at) = line.find("http://127.0.0.1:") {
            let rest = &line[at + "http://127.0.0.1:".len()..];
            break rest
                .chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>();
        }
    };
    // Keep draining, so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Server {
        child,
        url: format!("http://127.0.0.1:{port}"),
    }
}

/// The object server over `root` (or in front of `upstream`).
pub fn objserver(root: Option<&Path>, upstream: Option<&str>) -> Server {
    let mut cmd = Command::new("python3");
    cmd.arg(OBJSERVER);
    if let Some(r) = root {
        cmd.arg("--root").arg(r);
    }
    if let Some(u) = upstream {
        cmd.arg("--upstream").arg(u);
    }
    start(cmd, false)
}

/// moto's S3 server, or `None` (with a message) where moto cannot be imported.
pub fn moto() -> Option<(Server, PathBuf)> {
    let python = python_with("moto.server", "moto[server]")?;
    let mut cmd = Command::new(&python);
    cmd.args(["-m", "moto.server", "-H", "127.0.0.1", "-p", "0"]);
    Some((start(cmd, true), python))
}

/// GETs a control URL of the object server.
pub fn control(server: &Server, what: &str) -> Value {
    let url = format!("{}/{what}", server.url);
    let out = run(Command::new("python3").args([
        "-c",
        "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())",
        &url,
    ]));
    serde_json::from_str(&out).unwrap_or(Value::Null)
}

/// The keys moto takes (it takes any).
pub const MOTO_KEYS: (&str, &str) = ("testing", "testing-secret");

/// Ceph's RADOS Gateway over a one-OSD Ceph (bench/s3gw.sh), with the keys of its one user.
pub struct Rgw {
    pub url: String,
    pub key: String,
    pub secret: String,
    pub python: PathBuf,
    dir: PathBuf,
}

impl Rgw {
    /// Puts `files` (local path, key) into `bucket`, with this store's keys.
    pub fn upload(&self, bucket: &str, files: &[(&Path, &str)]) {
        upload(
            &self.python,
            &self.url,
            (&self.key, &self.secret),
            bucket,
            files,
        );
    }

    /// The gateway's request counters since it came up (`req`, `get`, `failed_req`, ...).
    pub fn ops(&self) -> Value {
        let out = run(Command::new("bash").arg(S3GW).arg("ops").arg(&self.dir));
        serde_json::from_str(&out).expect("the counters are JSON")
    }

    /// Gives the user another access key (`add`, with its secret) or takes one away (`rm`).
    pub fn key(&self, verb: &str, id: &str, secret: &str) {
        run(Command::new("bash")
            .arg(S3GW)
            .args(["key"])
            .arg(&self.dir)
            .args([verb, id, secret]));
    }
}

const S3GW: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/s3gw.sh");

/// The gateway of this test process: started by the first test that asks (about 16 s), shared by
/// the others (each its own bucket), and taken down by the script's watcher once the process has
/// exited. `None` (after `skip`) where this machine cannot run one; a start that fails panics
/// with the script's reason.
pub fn rgw() -> Option<&'static Rgw> {
    static RGW: OnceLock<Result<Rgw, String>> = OnceLock::new();
    if unsafe { libc::geteuid() } != 0 {
        skip("rgw", "starting Ceph in a network namespace needs root");
        return None;
    }
    let missing = ["ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "ceph"]
        .into_iter()
        .find(|tool| {
            !Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .output()
                .is_ok_and(|o| o.status.success())
        });
    if let Some(tool) = missing {
        skip(
            "rgw",
            &format!("{tool} is missing (apt-get install ceph-mon ceph-osd radosgw ceph-common)"),
        );
        return None;
    }
    let python = python_with("boto3", "boto3")?;
    let started = RGW.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("packfs-rgw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        // A free instance number: another test process (or a benchmark, which takes 1) may run
        // its own; the script refuses (exit 3) a number claimed meanwhile.
        let free = |n: &u32| {
            let ns = format!("packfs-rgw-{n}");
            !Path::new("/run/netns").join(&ns).exists()
                && !Path::new("/run/packfs-netns").join(&ns).exists()
        };
        let mut why = String::from("no free instance number 200-250");
        for n in (200..=250).filter(free) {
            let out = Command::new("bash")
                .arg(S3GW)
                .arg("up")
                .arg(&dir)
                .arg(n.to_string())
                .env("S3GW_DOWN_WITH", std::process::id().to_string())
                .output()
                .map_err(|e| e.to_string())?;
            if out.status.code() == Some(3) {
                continue;
            }
            if !out.status.success() {
                why = format!(
                    "bench/s3gw.sh up failed:\n{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            } else {
                why.clear();
            }
            break;
        }
        if !why.is_empty() {
            return Err(why);
        }
        let env = std::fs::read_to_string(dir.join("env")).map_err(|e| e.to_string())?;
        let var = |name: &str| {
            env.lines()
                .find_map(|l| l.strip_prefix(&format!("{name}=")))
                .map(str::to_string)
                .ok_or(format!("{name} missing from {}", dir.join("env").display()))
        };
        Ok(Rgw {
            url: var("PACKFS_S3_ENDPOINT")?,
            key: var("AWS_ACCESS_KEY_ID")?,
            secret: var("AWS_SECRET_ACCESS_KEY")?,
            python,
            dir,
        })
    });
    match started {
        Ok(rgw) => Some(rgw),
        Err(why) => panic!("{why}"),
    }
}

/// Uploads `files` (local path, key) into `bucket` (created) with boto3, signed with `keys`.
pub fn upload(
    interpreter: &Path,
    endpoint: &str,
    keys: (&str, &str),
    bucket: &str,
    files: &[(&Path, &str)],
) {
    let mut args: Vec<std::ffi::OsString> =
        vec![endpoint.into(), keys.0.into(), keys.1.into(), bucket.into()];
    for (path, key) in files {
        args.push(path.as_os_str().into());
        args.push((*key).into());
    }
    let script = "import sys, boto3\n\
        s3 = boto3.client('s3', endpoint_url=sys.argv[1], region_name='us-east-1',\n\
                          aws_access_key_id=sys.argv[2], aws_secret_access_key=sys.argv[3])\n\
        try:\n    s3.create_bucket(Bucket=sys.argv[4])\nexcept s3.exceptions.BucketAlreadyOwnedByYou:\n    pass\n\
        rest = sys.argv[5:]\n\
        for path, key in zip(rest[0::2], rest[1::2]):\n    s3.upload_file(path, sys.argv[4], key)\n";
    let refs: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    python(interpreter, script, &refs);
}
