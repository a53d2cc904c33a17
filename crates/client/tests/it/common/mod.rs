//! Test support: a Magnetar standalone broker on free loopback ports.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Bound on every wait in the tests.
pub const WAIT: Duration = Duration::from_secs(30);

pub struct Broker {
    child: Child,
    _dir: tempfile::TempDir,
    pub broker_port: u16,
    pub web_port: u16,
}

impl Broker {
    pub fn url(&self) -> String {
        format!("pulsar://127.0.0.1:{}", self.broker_port)
    }

    /// Creates a partitioned topic in public/default via the admin API.
    pub fn create_partitioned_topic(&self, topic: &str, partitions: u32) {
        let body = partitions.to_string();
        let request = format!(
            "PUT /admin/v2/persistent/public/default/{topic}/partitions HTTP/1.1\r\n\
             Host: 127.0.0.1:{}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.web_port,
            body.len()
        );
        let mut stream = TcpStream::connect(("127.0.0.1", self.web_port)).expect("admin connect");
        stream.set_read_timeout(Some(WAIT)).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).expect("admin response");
        let status = response.lines().next().unwrap_or_default().to_string();
        assert!(
            status.contains(" 200") || status.contains(" 204"),
            "create partitioned topic: {status}\n{response}"
        );
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    magnetar_test_support::free_port().expect("a free loopback port")
}

pub fn magnetar_bin() -> PathBuf {
    let path = std::env::var_os("MAGNETAR_BIN").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/release/magnetar")
    });
    assert!(
        path.exists(),
        "magnetar binary not found at {} — build it first with \
         `cargo build --release -p magnetar` or set MAGNETAR_BIN",
        path.display()
    );
    path
}

/// Spawns magnetar and waits for "ready"; `None` if it exited or hung.
fn spawn(bin: &PathBuf, dir: &std::path::Path, broker_port: u16, web_port: u16) -> Option<Child> {
    let mut child = Command::new(bin)
        .args(["standalone", "--data-dir"])
        .arg(dir)
        .args(["--broker-port", &broker_port.to_string()])
        .args(["--web-port", &web_port.to_string()])
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn magnetar");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if line.contains("magnetar standalone ready") {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(());
                }
            }
        }
    });
    match rx.recv_timeout(WAIT) {
        Ok(()) => Some(child),
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            None
        }
    }
}

/// Starts a broker; retries with other ports if they were taken meanwhile.
pub fn start_broker() -> Broker {
    let bin = magnetar_bin();
    for _ in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let (broker_port, web_port) = (free_port(), free_port());
        if let Some(child) = spawn(&bin, dir.path(), broker_port, web_port) {
            return Broker { child, _dir: dir, broker_port, web_port };
        }
    }
    panic!("magnetar did not start");
}

impl Broker {
    /// Kills the broker process (SIGKILL): connections drop at once.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the broker again on the same ports and data directory.
    pub fn restart(&mut self) {
        self.kill();
        let bin = magnetar_bin();
        for _ in 0..5 {
            if let Some(child) = spawn(&bin, self._dir.path(), self.broker_port, self.web_port) {
                self.child = child;
                return;
            }
        }
        panic!("magnetar did not restart");
    }
}

/// The official Python client, if the project's venv has it.
pub fn python() -> Option<PathBuf> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python");
    if !path.exists() {
        eprintln!(
            "SKIP: {} is missing (no official Python client to check interop)",
            path.display()
        );
        return None;
    }
    let ok = Command::new(&path)
        .args(["-c", "import pulsar"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        eprintln!("SKIP: pulsar-client is not installed in {}", path.display());
        return None;
    }
    Some(path)
}

/// Runs a Python script with a hard timeout, returning its stdout.
pub fn run_python(python: &PathBuf, script: &str, args: &[String]) -> String {
    let mut child = Command::new(python)
        .arg("-c")
        .arg(script)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn python");
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut out = String::new();
        let mut err = String::new();
        let _ = stdout.read_to_string(&mut out);
        let _ = stderr.read_to_string(&mut err);
        let _ = tx.send((out, err));
    });
    let Ok((out, err)) = rx.recv_timeout(Duration::from_secs(60)) else {
        let _ = child.kill();
        panic!("python script timed out");
    };
    let status = child.wait().unwrap();
    assert!(status.success(), "python failed: {status}\nstdout:\n{out}\nstderr:\n{err}");
    out
}
