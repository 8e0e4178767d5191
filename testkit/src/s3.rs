//! A real S3-compatible server on loopback for object-store tests: `scripts/s3-server.sh` (moto's
//! S3 behind `scripts/s3_server.py`, which makes conditional writes atomic), in the venv
//! `scripts/s3-env.sh` makes.

use std::{path::PathBuf, process::Command};

use crate::files::workspace_root;

/// A running server, stopped when dropped (and by itself when the test process is gone).
#[derive(Debug)]
pub struct S3Server {
    env: Vec<(String, String)>,
    pid: u32,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl S3Server {
    /// Starts a server with one bucket, `lake`.
    ///
    /// # Panics
    /// When the server cannot start: the message is the script's (it names `scripts/s3-env.sh`
    /// when the venv is missing).
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// [`S3Server::start`] with settings of `scripts/s3-server.sh` (faults: `LAKE_S3_FAIL_EVERY`,
    /// `LAKE_S3_DELAY_MS`; writes refused: `LAKE_S3_DENY_WRITES`). [`S3Server::fail_under`] makes
    /// faults while it runs.
    ///
    /// # Panics
    /// As [`S3Server::start`].
    pub fn start_with(settings: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().expect("tmp");
        let out = Command::new(workspace_root().join("scripts/s3-server.sh"))
            .envs(settings.iter().copied())
            .env("LAKE_S3_DIR", dir.path())
            .env("LAKE_S3_WATCH_PID", std::process::id().to_string())
            .output()
            .expect("run scripts/s3-server.sh");
        assert!(out.status.success(), "the S3 test server did not start: {}", String::from_utf8_lossy(&out.stderr));
        let mut env = Vec::new();
        let mut pid = None;
        let mut log = None;
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let Some((key, value)) = line.split_once('=') else { continue };
            match key {
                "LAKE_S3_PID" => pid = value.parse().ok(),
                "LAKE_S3_LOG" => log = Some(PathBuf::from(value)),
                _ => env.push((key.to_string(), value.to_string())),
            }
        }
        let pid = pid.expect("scripts/s3-server.sh prints LAKE_S3_PID");
        let log = log.expect("scripts/s3-server.sh prints LAKE_S3_LOG");
        Self { env, pid, log, _dir: dir }
    }

    /// The variables that point a client at this server (endpoint, region, credentials, plain
    /// HTTP allowed).
    pub fn env(&self) -> &[(String, String)] {
        &self.env
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> &str {
        self.env.iter().find(|(k, _)| k == "AWS_ENDPOINT_URL").map(|(_, v)| v.as_str()).expect("an endpoint")
    }

    /// The 503 answers the server injected so far (`LAKE_S3_FAIL_EVERY`).
    pub fn injected_failures(&self) -> usize {
        std::fs::read_to_string(&self.log).unwrap_or_default().lines().filter(|l| l.starts_with("injected 503")).count()
    }

    /// Requests logged so far whose log line holds every one of `words` (with
    /// `LAKE_S3_VERBOSE=1`: `"GET /BUCKET/KEY HTTP/1.1" STATUS`).
    pub fn requests(&self, words: &[&str]) -> usize {
        std::fs::read_to_string(&self.log).unwrap_or_default().lines().filter(|l| words.iter().all(|w| l.contains(w))).count()
    }

    /// Stops the server at once (SIGKILL): its objects are gone with it.
    pub fn kill(&self) {
        // SAFETY: a signal to the pid of the server this handle started.
        unsafe {
            libc::kill(self.pid as i32, libc::SIGKILL);
        }
    }

    /// Answers every request for a key under one of `prefixes` (`BUCKET/PREFIX`) with `503
    /// SlowDown` from now on, until the next call (an empty list ends it): the store stops
    /// answering for that part of the lake.
    ///
    /// # Panics
    /// When the server does not take the setting.
    pub fn fail_under(&self, prefixes: &[&str]) {
        use std::io::{Read, Write};
        let address = self.endpoint().trim_start_matches("http://");
        let body = serde_json::json!({ "fail_under": prefixes }).to_string();
        let mut stream = std::net::TcpStream::connect(address).expect("connect to the S3 test server");
        let head = format!("POST /_lake/faults HTTP/1.1\r\nHost: {address}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
        stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(body.as_bytes())).expect("send the faults");
        let mut answer = String::new();
        stream.read_to_string(&mut answer).expect("the server's answer");
        assert!(answer.starts_with("HTTP/1.1 204") || answer.starts_with("HTTP/1.0 204"), "setting faults: {answer}");
    }

    /// The keys under `prefix` in bucket `lake`, listed with the server's own client (boto3).
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        self.objects(prefix).into_iter().map(|(key, _)| key).collect()
    }

    /// Writes `body` as the object `key` of bucket `lake` with the server's own client (boto3),
    /// as another host's writer would.
    ///
    /// # Panics
    /// When the write fails.
    pub fn put(&self, key: &str, body: &[u8]) {
        let script = "import boto3, sys\n\
            boto3.client('s3').put_object(Bucket='lake', Key=sys.argv[1], Body=sys.stdin.buffer.read())\n";
        let mut child = Command::new(python())
            .arg("-c")
            .arg(script)
            .arg(key)
            .envs(self.env.iter().cloned())
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run python");
        std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), body).expect("write the body");
        let out = child.wait_with_output().expect("wait");
        assert!(out.status.success(), "writing {key} failed: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// The keys under `prefix` in bucket `lake` with their sizes.
    pub fn objects(&self, prefix: &str) -> Vec<(String, u64)> {
        let script = "import boto3, sys\n\
            s3 = boto3.client('s3')\n\
            for page in s3.get_paginator('list_objects_v2').paginate(Bucket='lake', Prefix=sys.argv[1]):\n\
            \x20   for o in page.get('Contents', []): print(o['Size'], o['Key'])\n";
        let out = Command::new(python()).arg("-c").arg(script).arg(prefix).envs(self.env.iter().cloned()).output().expect("run python");
        assert!(out.status.success(), "listing the bucket failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once(' ').and_then(|(size, key)| Some((key.to_string(), size.parse().ok()?))))
            .collect()
    }
}

/// The Python of the venv `scripts/s3-env.sh` makes (`LAKE_S3_PYTHON` overrides it).
fn python() -> PathBuf {
    std::env::var_os("LAKE_S3_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/lake/s3-venv/bin/python"))
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.kill();
    }
}
