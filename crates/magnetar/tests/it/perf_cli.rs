//! `magnetar perf produce|consume|e2e` against a standalone broker: the commands run, stop at
//! the message count, and report what they measured as JSON.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_magnetar");
const WAIT: Duration = Duration::from_secs(60);

struct Standalone {
    child: Child,
    _dir: tempfile::TempDir,
    url: String,
    admin: String,
}

impl Drop for Standalone {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    magnetar_test_support::free_port().expect("a free loopback port")
}

fn standalone() -> Standalone {
    let dir = tempfile::tempdir().unwrap();
    let (broker_port, web_port) = (free_port(), free_port());
    let mut child = Command::new(BIN)
        .args(["standalone", "--data-dir"])
        .arg(dir.path())
        .args(["--broker-port", &broker_port.to_string(), "--web-port", &web_port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("magnetar standalone ready") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(WAIT).expect("standalone did not get ready");
    Standalone {
        child,
        _dir: dir,
        url: format!("pulsar://127.0.0.1:{broker_port}"),
        admin: format!("http://127.0.0.1:{web_port}"),
    }
}

/// Runs `magnetar perf <args> --json` (bounded): its exit status, stdout and stderr.
fn perf_output(server: &Standalone, args: &[&str]) -> (std::process::ExitStatus, String, String) {
    let mut child = Command::new(BIN)
        .arg("perf")
        .args(args)
        .args(["-u", &server.url, "--admin-url", &server.admin, "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let (stdout, stderr) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut text);
        text
    });
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut BufReader::new(stdout), &mut text);
        let _ = tx.send(text);
    });
    let Ok(text) = rx.recv_timeout(WAIT) else {
        let _ = child.kill();
        panic!("perf {args:?} did not finish within {WAIT:?}");
    };
    let status = child.wait().unwrap();
    (status, text, errors.join().unwrap_or_default())
}

/// Runs `magnetar perf <args> --json` (bounded) and returns the named stream of its report.
fn perf(server: &Standalone, args: &[&str], stream: &str) -> serde_json::Value {
    let (status, text, errors) = perf_output(server, args);
    assert!(status.success(), "perf {args:?} failed: {status}\n{errors}");
    stream_of(&text, stream)
}

fn stream_of(text: &str, stream: &str) -> serde_json::Value {
    let report: serde_json::Value = serde_json::from_str(text).expect("JSON report");
    report["streams"]
        .as_array()
        .and_then(|streams| streams.iter().find(|s| s["name"] == stream))
        .cloned()
        .unwrap_or_else(|| panic!("no stream {stream} in {report}"))
}

#[test]
fn produce_consume_and_e2e_report_what_they_did() {
    let server = standalone();
    let produced = perf(&server, &["produce", "t", "-m", "5000", "-s", "200"], "publish");
    assert_eq!(produced["messages"], 5000);
    assert_eq!(produced["bytes"], 5000 * 200);
    assert_eq!(produced["errors"], 0);
    assert!(produced["latency"]["p50_us"].as_u64().unwrap() > 0);

    let consumed = perf(
        &server,
        &["consume", "t", "-m", "5000", "--subscription-position", "Earliest"],
        "consume",
    );
    assert_eq!(consumed["messages"], 5000, "the whole backlog is read");
    assert_eq!(consumed["bytes"], 5000 * 200);

    // Fewer messages than -m asks for: the run gives up once none arrived for the idle limit,
    // prints its figures and fails, rather than waiting for ever.
    let started = std::time::Instant::now();
    let args = ["consume", "t", "-m", "10", "--subscriptions", "late", "--idle-timeout", "1"];
    let (status, text, errors) = perf_output(&server, &args);
    assert_eq!(status.code(), Some(1), "an idle run fails: {errors}");
    assert!(errors.contains("no message arrived for 1 s: 0 of 10 received"), "{errors}");
    assert_eq!(stream_of(&text, "consume")["messages"], 0, "the figures are printed");
    assert!(started.elapsed() < Duration::from_secs(30), "gave up late: {:?}", started.elapsed());

    let synced = perf(&server, &["produce", "t-sync", "--sync", "-m", "50"], "publish");
    assert_eq!(synced["messages"], 50);

    let e2e = perf(&server, &["e2e", "t-e2e", "-m", "2000", "-r", "20000", "-s", "64"], "e2e");
    assert_eq!(e2e["messages"], 2000, "every message sent is received");
    let latency = &e2e["latency"];
    assert!(latency["p50_us"].as_u64().unwrap() <= latency["max_us"].as_u64().unwrap());

    // Partitioned topics are created through the admin API and spread over.
    let partitioned =
        perf(&server, &["produce", "p", "--partitions", "3", "-m", "3000"], "publish");
    assert_eq!(partitioned["messages"], 3000);
}

#[test]
fn bad_arguments_are_refused_before_connecting() {
    for args in [
        &["perf", "produce", "--num-producers", "0"][..],
        &["perf", "produce", "-u", "http://x"][..],
        &["perf", "e2e", "-s", "4"][..],
        &["perf", "consume", "--subscription-type", "Queue"][..],
    ] {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?} must be refused: {out:?}");
    }
}
