//! `magnetar metadata init` and `magnetar broker` against real etcd processes on loopback (the
//! `testing` module of magnetar-metadata-etcd), running the real binary:
//! * `metadata init` creates the cluster's keys, and a second run changes nothing;
//! * a broker refuses a cluster that was never initialized, and an etcd nobody listens on,
//!   with one clear line and a non-zero exit, in bounded time;
//! * a broker's registration key appears when it starts (and `GET /admin/v2/brokers/{c}`
//!   lists it) and disappears when it stops;
//! * a broker cut off from etcd past its session TTL reports not ready (503 with the reason),
//!   refuses new topics with ServiceNotReady while a loaded topic keeps taking messages, and
//!   once etcd is reachable again registers anew and is ready;
//! * in process, the registration shell on `EtcdStore::expire_session`: key deleted, then
//!   written again in the new session, ready again.
//!
//! Every wait is bounded; the broker's key is followed through an etcd watch, and the admin
//! endpoints of the broker (another process, no events to wait on) are polled with a deadline.
//! Only processes this test started are signalled, by PID. Skipped with a notice without etcd,
//! unless MAGNETAR_REQUIRE_ETCD=1.

use std::future::Future;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use magnetar_etcd_testing::{etcd_or_skip, EtcdCluster, FaultProxy};
use magnetar_metadata::{Event, EventKind, MetadataStore, WatchEvent, WatchStream};
use magnetar_metadata_etcd::{EtcdStore, EtcdStoreConfig};
use magnetar_model::keys;

const WAIT: Duration = Duration::from_secs(30);

async fn within<T>(what: &str, bound: Duration, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(bound, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {bound:?}: {what}"),
    }
}

fn magnetar() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_magnetar"));
    command.env("NO_COLOR", "1").env("RUST_LOG", "info").stdin(Stdio::null());
    command
}

/// Runs a magnetar command to its end, at most `bound` (killed past it).
fn run_bounded(command: &mut Command, bound: Duration) -> Output {
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + bound;
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("{command:?} still running after {bound:?}: {}", text(&out.stderr));
        }
        // Polling another process's exit: there is no event to wait on in std.
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn etcd_url(cluster: &EtcdCluster) -> String {
    format!("etcd://{}", cluster.endpoint(0).trim_start_matches("http://"))
}

fn init(url: &str, name: &str) -> Output {
    let out = run_bounded(
        magnetar().args([
            "metadata",
            "init",
            "--metadata",
            url,
            "--cluster",
            name,
            "--web-service-url",
            "http://127.0.0.1:8080",
            "--broker-service-url",
            "pulsar://127.0.0.1:6650",
            "--broker-service-url-tls",
            "pulsar+ssl://127.0.0.1:6651",
        ]),
        WAIT,
    );
    assert!(
        out.status.success(),
        "metadata init failed: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    out
}

async fn store_for(endpoints: Vec<String>, name: &str) -> EtcdStore {
    within("connect", WAIT, EtcdStore::connect(EtcdStoreConfig::new(endpoints, name)))
        .await
        .expect("connect to etcd")
}

fn free_port() -> u16 {
    magnetar_etcd_testing::free_port().expect("a free loopback port")
}

/// A `magnetar broker` child, killed (by PID) when dropped.
struct Broker {
    child: Child,
    broker_port: u16,
    web_port: u16,
    log: std::path::PathBuf,
}

impl Broker {
    fn start(url: &str, name: &str, dir: &Path, ttl_secs: u64) -> Broker {
        let config = dir.join("magnetar.toml");
        std::fs::write(
            &config,
            format!(
                "[storage]\nsegment_size_bytes = 4194304\nmax_group_bytes = 1048576\n\
                 sync_mode = \"none\"\n[metadata]\nsession_ttl_seconds = {ttl_secs}\n\
                 request_timeout_seconds = 2\n"
            ),
        )
        .unwrap();
        let (broker_port, web_port) = (free_port(), free_port());
        let log = dir.join("broker.log");
        let child = magnetar()
            .args(["broker", "--metadata", url, "--cluster", name])
            .arg("--config")
            .arg(&config)
            .arg("--data-dir")
            .arg(dir.join("data"))
            .args(["--broker-port", &broker_port.to_string()])
            .args(["--web-port", &web_port.to_string()])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Broker { child, broker_port, web_port, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn key(&self) -> String {
        keys::broker("127.0.0.1", self.web_port)
    }

    /// GET on the broker's admin API: (status, body). `None` while nothing answers.
    fn get(&self, path: &str) -> Option<(u16, String)> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.web_port)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        let status = response.split_whitespace().nth(1)?.parse().ok()?;
        let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        Some((status, body))
    }

    /// Polls `path` until it answers `status` (bounded): the broker is another process.
    async fn wait_status(&self, path: &str, status: u16) -> String {
        let deadline = Instant::now() + WAIT;
        let mut last = None;
        while Instant::now() < deadline {
            let got = self.get(path);
            if let Some((s, body)) = &got {
                if *s == status {
                    return body.clone();
                }
            }
            last = got;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{path} did not answer {status} within {WAIT:?} (last {last:?})\n{}", self.log());
    }

    /// SIGTERM, then waits (bounded) for a clean exit.
    fn stop(mut self) {
        // SAFETY: plain syscall on the PID of a child this test spawned and has not reaped.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "broker exit {status}\n{}", self.log());
                return;
            }
            assert!(Instant::now() < deadline, "broker ignored SIGTERM\n{}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

async fn next_change(watch: &mut WatchStream, key: &str) -> EventKind {
    loop {
        match within("a watch event", WAIT, watch.recv()).await.expect("watch ended") {
            WatchEvent::Changed(Event { key: k, kind }) if k == key => return kind,
            WatchEvent::Changed(_) => {}
            other => panic!("unexpected watch event {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_init_is_idempotent_and_brokers_need_it() {
    let Some(binary) = etcd_or_skip("metadata init") else { return };
    let etcd = EtcdCluster::start(&binary, 1).await.expect("start etcd");
    let url = etcd_url(&etcd);

    let first = text(&init(&url, "c1").stdout);
    assert_eq!(first.matches("\n  created ").count(), 5, "{first}");
    let store = store_for(etcd.endpoints(), "c1").await;
    let expected = [
        keys::tenant("public"),
        keys::namespace("public", "default"),
        keys::tenant("pulsar"),
        keys::namespace("pulsar", "system"),
        keys::cluster("c1"),
    ];
    let mut versions = Vec::new();
    for key in &expected {
        let found = store.get(key).await.unwrap().unwrap_or_else(|| panic!("{key} missing"));
        versions.push(found.version);
    }
    let record = store.get(&keys::cluster("c1")).await.unwrap().unwrap();
    let record: serde_json::Value = serde_json::from_slice(&record.value).unwrap();
    assert_eq!(record["brokerServiceUrl"], "pulsar://127.0.0.1:6650");
    assert_eq!(record["brokerServiceUrlTls"], "pulsar+ssl://127.0.0.1:6651");
    assert!(record.get("serviceUrlTls").is_none(), "not given, not stored: {record}");

    let second = text(&init(&url, "c1").stdout);
    assert!(second.contains("nothing changed"), "{second}");
    assert_eq!(second.matches("\n  exists ").count(), 5, "{second}");
    for (key, version) in expected.iter().zip(&versions) {
        assert_eq!(store.get(key).await.unwrap().unwrap().version, *version, "{key} rewritten");
    }

    // A cluster nobody initialized: the broker says what to run, and exits non-zero.
    let dir = tempfile::tempdir().unwrap();
    let out = run_bounded(
        magnetar()
            .args(["broker", "--metadata", &url, "--cluster", "never-initialized"])
            .arg("--data-dir")
            .arg(dir.path().join("data")),
        WAIT,
    );
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("magnetar metadata init"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!dir.path().join("data").exists(), "no data opened for a refused cluster");
    store.close().await.unwrap();
}

#[test]
fn bad_metadata_urls_and_unreachable_etcd_exit_with_one_line() {
    for (args, expect) in [
        (vec!["--metadata", "etcd://", "--cluster", "c"], "empty endpoint"),
        (vec!["--metadata", "zk://h:2181", "--cluster", "c"], "must start with etcd://"),
        (vec!["--metadata", "etcd://127.0.0.1:2379", "--cluster", ""], "cluster name"),
    ] {
        let out = run_bounded(magnetar().arg("broker").args(&args), WAIT);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(expect), "{args:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    }
    // Cluster URLs with the wrong scheme are refused before anything is contacted.
    for (flag, url, expect) in [
        ("--web-service-url", "ftp://h", "must start with http:// or https://"),
        ("--web-service-url-tls", "http://h:8080", "must start with https://"),
        ("--broker-service-url-tls", "pulsar://h:6650", "must start with pulsar+ssl://"),
    ] {
        let out = run_bounded(
            magnetar().args(["metadata", "init", "--metadata", "etcd://127.0.0.1:1"]).args([
                "--cluster",
                "c",
                flag,
                url,
            ]),
            WAIT,
        );
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "a usage error, as clap's: {flag}: {stderr}");
        assert!(stderr.contains(&format!("{flag} \"{url}\" {expect}")), "{flag}: {stderr}");
    }
    // Nothing listens on port 1: bounded by connect_timeout_seconds (1 here).
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("m.toml");
    std::fs::write(&config, "[metadata]\nconnect_timeout_seconds = 1\n").unwrap();
    let started = Instant::now();
    let out = run_bounded(
        magnetar()
            .args(["broker", "--metadata", "etcd://127.0.0.1:1", "--cluster", "c"])
            .arg("--config")
            .arg(&config)
            .arg("--data-dir")
            .arg(dir.path().join("data")),
        WAIT,
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot reach etcd at http://127.0.0.1:1"), "{stderr}");
    assert!(!stderr.contains("panicked") && !stderr.contains("backtrace"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(20), "took {:?}", started.elapsed());
    assert!(!dir.path().join("data").exists(), "no data opened without etcd");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_registers_while_it_runs() {
    let Some(binary) = etcd_or_skip("broker registration") else { return };
    let etcd = EtcdCluster::start(&binary, 1).await.expect("start etcd");
    let url = etcd_url(&etcd);
    init(&url, "reg");
    let observer = store_for(etcd.endpoints(), "reg").await;
    let mut watch = observer.watch(keys::BROKERS_ROOT).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&url, "reg", dir.path(), 10);
    let key = broker.key();
    assert!(
        matches!(next_change(&mut watch, &key).await, EventKind::Put { .. }),
        "{}",
        broker.log()
    );
    let value = observer.get(&key).await.unwrap().expect("registered");
    let value: serde_json::Value = serde_json::from_slice(&value.value).unwrap();
    assert_eq!(value["pulsarServiceUrl"], format!("pulsar://127.0.0.1:{}", broker.broker_port));
    assert_eq!(value["webServiceUrl"], format!("http://127.0.0.1:{}", broker.web_port));
    assert!(value["startTimestamp"].as_u64().unwrap() > 0);
    let listed = broker.wait_status("/admin/v2/brokers/reg", 200).await;
    assert_eq!(listed, format!("[\"127.0.0.1:{}\"]", broker.web_port));
    let cluster = broker.wait_status("/admin/v2/clusters/reg", 200).await;
    assert!(cluster.contains("pulsar://127.0.0.1:6650"), "the stored record: {cluster}");
    broker.wait_status("/admin/v2/brokers/ready", 200).await;

    broker.stop();
    assert_eq!(next_change(&mut watch, &key).await, EventKind::Delete, "key gone on stop");
    observer.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_cut_off_from_etcd_is_not_ready_until_it_registers_again() {
    let Some(binary) = etcd_or_skip("broker session loss") else { return };
    let etcd = EtcdCluster::start(&binary, 1).await.expect("start etcd");
    init(&etcd_url(&etcd), "lost");
    let proxy = FaultProxy::start(etcd.client_addr(0)).await.expect("proxy");
    let through_proxy = format!("etcd://{}", proxy.endpoint().trim_start_matches("http://"));
    let observer = store_for(etcd.endpoints(), "lost").await;
    let mut watch = observer.watch(keys::BROKERS_ROOT).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    const TTL: u64 = 3;
    let broker = Broker::start(&through_proxy, "lost", dir.path(), TTL);
    let key = broker.key();
    assert!(
        matches!(next_change(&mut watch, &key).await, EventKind::Put { .. }),
        "{}",
        broker.log()
    );
    let first = observer.get(&key).await.unwrap().unwrap();
    broker.wait_status("/admin/v2/brokers/ready", 200).await;

    // Creating a producer retries ServiceNotReady until the operation timeout (as the
    // official clients do): short here, so the refusal below is seen.
    let options = magnetar_client::ClientOptions {
        operation_timeout: Some(Duration::from_secs(1)),
        ..Default::default()
    };
    let url = format!("pulsar://127.0.0.1:{}", broker.broker_port);
    let client =
        magnetar_client::Client::connect_with_options(url, options).await.expect("connect");
    let loaded =
        within("producer", WAIT, client.producer("loaded").create()).await.expect("producer");
    within("send", WAIT, loaded.send("before")).await.expect("send before");

    // Cut off past the TTL: etcd drops the key, the broker reports not ready.
    proxy.pause();
    assert_eq!(next_change(&mut watch, &key).await, EventKind::Delete, "{}", broker.log());
    let reason = broker.wait_status("/admin/v2/brokers/ready", 503).await;
    assert!(reason.contains("session lost"), "{reason}");
    let health = broker.wait_status("/admin/v2/brokers/health", 503).await;
    assert!(health.contains("session lost"), "{health}");
    // A loaded topic keeps taking messages; a new one is refused with a retryable error.
    within("send", WAIT, loaded.send("during")).await.expect("send to a loaded topic");
    match within("producer", WAIT, client.producer("new-topic").create()).await {
        Err(e) => assert!(e.to_string().contains("ServiceNotReady"), "{e}"),
        Ok(_) => panic!("a new topic loaded while the session was lost"),
    }

    // Healed: a new session, the key again (another lease), ready again, new topics load.
    proxy.resume();
    assert!(
        matches!(next_change(&mut watch, &key).await, EventKind::Put { .. }),
        "{}",
        broker.log()
    );
    broker.wait_status("/admin/v2/brokers/ready", 200).await;
    assert_eq!(observer.get(&key).await.unwrap().unwrap().value, first.value);
    let fresh = within("producer", WAIT, client.producer("new-topic").create()).await.expect("new");
    within("send", WAIT, fresh.send("after")).await.expect("send after");
    let log = broker.log();
    assert!(log.contains("WARN") && log.contains("lost"), "a warning was logged:\n{log}");
    drop((fresh, loaded));
    client.close().await;
    broker.stop();
    observer.close().await.unwrap();
}

/// The registration shell in process, on etcd: `EtcdStore::expire_session` revokes the lease
/// (etcd deletes the key), the broker goes not ready, and the new session gets the key back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_follows_an_expired_etcd_session() {
    use magnetar_broker::registration::{Readiness, ReadinessState, Registration};
    use std::sync::Arc;

    let Some(binary) = etcd_or_skip("registration on etcd") else { return };
    let etcd = EtcdCluster::start(&binary, 1).await.expect("start etcd");
    let store = Arc::new(store_for(etcd.endpoints(), "expire").await);
    let observer = store_for(etcd.endpoints(), "expire").await;
    let key = keys::broker("10.1.2.3", 8080);
    let mut watch = observer.watch(keys::BROKERS_ROOT).await.unwrap();
    let readiness = Arc::new(Readiness::not_ready("starting"));
    let mut changes = readiness.subscribe();
    let registration =
        Registration::start(store.clone(), key.clone(), "{}".into(), readiness.clone())
            .await
            .expect("register");
    assert!(readiness.check().is_ok());
    assert!(matches!(next_change(&mut watch, &key).await, EventKind::Put { .. }));

    store.expire_session().await.expect("expire");
    assert_eq!(next_change(&mut watch, &key).await, EventKind::Delete, "the lease took the key");
    assert!(matches!(next_change(&mut watch, &key).await, EventKind::Put { .. }), "back");
    let back = |s: &ReadinessState| s.sessions_lost == 1 && s.registrations == 2;
    // `is_ok` drops the watch's read guard at once (holding it would block the shell).
    let reregistered = tokio::time::timeout(WAIT, changes.wait_for(back)).await.is_ok();
    assert!(reregistered, "{:?}", readiness.state());
    assert!(readiness.check().is_ok(), "ready again");

    registration.stop().await;
    assert!(readiness.check().is_err(), "not ready once stopped");
    store.close().await.unwrap();
    assert_eq!(next_change(&mut watch, &key).await, EventKind::Delete, "closing ends the session");
    observer.close().await.unwrap();
}
