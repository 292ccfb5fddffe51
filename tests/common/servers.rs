//! Servers the remote tests talk to on 127.0.0.1: the object server (tests/support/objserver.py:
//! a file server, a counting and fault-injecting proxy, and stand-ins for the credential
//! endpoints) and moto's S3 and STS server, from PyPI.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

use super::{python, python_with, run};

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

/// Uploads `files` (local path, key) into `bucket` (created) with boto3.
pub fn upload(interpreter: &Path, endpoint: &str, bucket: &str, files: &[(&Path, &str)]) {
    let mut args: Vec<std::ffi::OsString> = vec![endpoint.into(), bucket.into()];
    for (path, key) in files {
        args.push(path.as_os_str().into());
        args.push((*key).into());
    }
    let script = "import sys, boto3\n\
        s3 = boto3.client('s3', endpoint_url=sys.argv[1], region_name='us-east-1',\n\
                          aws_access_key_id='testing', aws_secret_access_key='testing-secret')\n\
        try:\n    s3.create_bucket(Bucket=sys.argv[2])\nexcept s3.exceptions.BucketAlreadyOwnedByYou:\n    pass\n\
        rest = sys.argv[3:]\n\
        for path, key in zip(rest[0::2], rest[1::2]):\n    s3.upload_file(path, sys.argv[2], key)\n";
    let refs: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
    python(interpreter, script, &refs);
}
