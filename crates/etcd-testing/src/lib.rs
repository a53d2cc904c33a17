//! Test support: throw-away etcd clusters on loopback, and a TCP fault proxy to cut or
//! black-hole a client's connections. A crate of its own (a dev-dependency only), so the
//! shipped etcd store builds the same in the test build and the binary's.
//!
//! [`EtcdCluster`] runs `etcd` processes on free 127.0.0.1 ports with their data in a
//! temporary directory on `/dev/shm` (etcd 3.4 cannot skip fsync; tmpfs makes it cheap). It
//! only ever signals the processes it started, and kills them when dropped; they are also
//! started with `PR_SET_PDEATHSIG`, from a helper thread that lives as long as the test
//! process, so none outlives a crashed or aborted test run.
//!
//! Tests call [`etcd_or_skip`] first: without an `etcd` binary it prints why and returns
//! `None` (the test passes as skipped), unless [`REQUIRE_ETCD_ENV`]`=1`, which makes it
//! panic instead (CI sets it).

use std::io;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Mutex, OnceLock};
use std::time::Duration;

use etcd_client::{Client, CompactionOptions, ConnectOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener as TokioListener, TcpStream};
use tokio::sync::watch;
use tokio::time::{sleep, timeout, Instant};

use magnetar_metadata_etcd::REQUIRED_MAX_REQUEST_BYTES;

/// Set to `1` to make etcd tests fail, rather than skip, when etcd is not installed.
pub const REQUIRE_ETCD_ENV: &str = "MAGNETAR_REQUIRE_ETCD";
/// Path of the etcd binary to use (default: `etcd` on `PATH`).
pub const ETCD_BIN_ENV: &str = "MAGNETAR_ETCD_BIN";

/// Raft heartbeat and election timeout of test clusters (etcd's defaults; smaller values
/// cause spurious elections on a loaded 2-core machine).
const HEARTBEAT_MS: u64 = 100;
const ELECTION_MS: u64 = 1000;
/// Bound on a cluster becoming ready (a leader elected, every member answering).
const READY_TIMEOUT: Duration = Duration::from_secs(30);
const START_ATTEMPTS: usize = 3;

/// The etcd binary, if one is installed.
pub fn etcd_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(ETCD_BIN_ENV) {
        return Some(PathBuf::from(path)).filter(|p| p.is_file());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join("etcd")).find(|p| p.is_file())
}

/// The etcd binary, or `None` after printing a skip notice for `test`. Panics when etcd is
/// missing and [`REQUIRE_ETCD_ENV`] is `1`.
pub fn etcd_or_skip(test: &str) -> Option<PathBuf> {
    if let Some(path) = etcd_binary() {
        return Some(path);
    }
    let required = std::env::var(REQUIRE_ETCD_ENV).is_ok_and(|v| v == "1");
    assert!(
        !required,
        "{test}: {REQUIRE_ETCD_ENV}=1 but no etcd binary was found (apt-get install etcd-server, \
         or set {ETCD_BIN_ENV})"
    );
    // Straight to the process's stderr (libtest captures `eprintln!` of passing tests),
    // once per test binary.
    static NOTICE: OnceLock<()> = OnceLock::new();
    NOTICE.get_or_init(|| {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED etcd tests (first: {test}): etcd is not installed (apt-get install \
             etcd-server); set {REQUIRE_ETCD_ENV}=1 to fail instead"
        );
    });
    None
}

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

/// Spawns through one long-lived thread, so `PR_SET_PDEATHSIG` (which fires when the
/// *thread* that forked exits) only fires when the whole test process ends.
fn spawn(command: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("etcd-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("start the etcd spawner thread");
        Mutex::new(tx)
    });
    let (reply, result) = mpsc::channel();
    spawner
        .lock()
        .map_err(|_| io::Error::other("etcd spawner poisoned"))?
        .send((command, reply))
        .map_err(|_| io::Error::other("etcd spawner gone"))?;
    result.recv().map_err(|_| io::Error::other("etcd spawner gone"))?
}

/// A loopback TCP port nobody listens on, below the kernel's ephemeral range when it can
/// (see [`magnetar_test_support::free_port`]).
pub fn free_port() -> io::Result<u16> {
    magnetar_test_support::free_port()
}

fn scratch_dir() -> io::Result<tempfile::TempDir> {
    let shm = Path::new("/dev/shm");
    let builder = {
        let mut b = tempfile::Builder::new();
        b.prefix("magnetar-etcd-");
        b
    };
    if shm.is_dir() {
        builder.tempdir_in(shm)
    } else {
        builder.tempdir()
    }
}

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    process: Option<Child>,
}

/// A throw-away etcd cluster on loopback (see the module docs).
pub struct EtcdCluster {
    binary: PathBuf,
    members: Vec<Member>,
    token: String,
    dir: tempfile::TempDir,
}

impl EtcdCluster {
    /// Starts a `size`-member cluster and waits until it has a leader and every member
    /// answers (retrying with fresh ports if a member could not start).
    pub async fn start(binary: &Path, size: usize) -> io::Result<EtcdCluster> {
        assert!(size >= 1);
        let mut last_error = None;
        for _ in 0..START_ATTEMPTS {
            let mut cluster = Self::spawn_members(binary, size)?;
            match cluster.wait_ready(READY_TIMEOUT).await {
                Ok(()) => return Ok(cluster),
                Err(e) => {
                    cluster.kill_all();
                    last_error = Some(e);
                }
            }
        }
        Err(last_error.unwrap_or_else(|| io::Error::other("etcd did not start")))
    }

    fn spawn_members(binary: &Path, size: usize) -> io::Result<EtcdCluster> {
        static CLUSTERS: AtomicU64 = AtomicU64::new(0);
        let n = CLUSTERS.fetch_add(1, Ordering::Relaxed);
        let mut members = Vec::with_capacity(size);
        for i in 0..size {
            let member = Member {
                name: format!("m{i}"),
                client_port: free_port()?,
                peer_port: free_port()?,
                process: None,
            };
            members.push(member);
        }
        let mut cluster = EtcdCluster {
            binary: binary.to_path_buf(),
            members,
            token: format!("magnetar-test-{}-{n}", std::process::id()),
            dir: scratch_dir()?,
        };
        for i in 0..size {
            cluster.launch(i, "new")?;
        }
        Ok(cluster)
    }

    fn launch(&mut self, i: usize, state: &str) -> io::Result<()> {
        let initial_cluster = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let m = &self.members[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{}.log", m.name)))?;
        let mut command = Command::new(&self.binary);
        let client_url = format!("http://127.0.0.1:{}", m.client_port);
        let peer_url = format!("http://127.0.0.1:{}", m.peer_port);
        command
            .arg(format!("--name={}", m.name))
            .arg(format!("--data-dir={}", self.dir.path().join(&m.name).display()))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster={initial_cluster}"))
            .arg(format!("--initial-cluster-state={state}"))
            .arg(format!("--initial-cluster-token={}", self.token))
            .arg(format!("--max-request-bytes={REQUIRED_MAX_REQUEST_BYTES}"))
            .arg(format!("--heartbeat-interval={HEARTBEAT_MS}"))
            .arg(format!("--election-timeout={ELECTION_MS}"))
            .arg("--logger=zap")
            .arg("--log-outputs=stderr")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        self.members[i].process = Some(spawn(command)?);
        Ok(())
    }

    /// Client endpoints of every member, in member order.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    /// Client endpoint of member `i`.
    pub fn endpoint(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.members[i].client_port)
    }

    /// Client address of member `i`.
    pub fn client_addr(&self, i: usize) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.members[i].client_port))
    }

    /// Number of members.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// Process id of member `i`, while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].process.as_ref().map(Child::id)
    }

    async fn client(endpoints: &[String]) -> io::Result<Client> {
        let options = ConnectOptions::new().with_connect_timeout(Duration::from_secs(2));
        Client::connect(endpoints, Some(options)).await.map_err(io::Error::other)
    }

    /// Waits until a linearizable read succeeds and every running member answers `status`.
    pub async fn wait_ready(&mut self, bound: Duration) -> io::Result<()> {
        let deadline = Instant::now() + bound;
        loop {
            for (i, m) in self.members.iter_mut().enumerate() {
                if let Some(child) = m.process.as_mut() {
                    if let Some(status) = child.try_wait()? {
                        m.process = None;
                        return Err(io::Error::other(format!("etcd member {i} exited: {status}")));
                    }
                }
            }
            if self.ready().await {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "etcd cluster not ready"));
            }
            sleep(Duration::from_millis(50)).await;
        }
    }

    async fn ready(&self) -> bool {
        let running: Vec<usize> =
            (0..self.members.len()).filter(|i| self.members[*i].process.is_some()).collect();
        for i in &running {
            let Ok(mut client) = Self::client(&[self.endpoint(*i)]).await else { return false };
            let status = timeout(Duration::from_secs(2), client.status()).await;
            if !matches!(status, Ok(Ok(ref s)) if s.leader() != 0) {
                return false;
            }
            // A linearizable read through this member needs a working leader.
            let read = timeout(Duration::from_secs(2), client.get("/readiness", None)).await;
            if !matches!(read, Ok(Ok(_))) {
                return false;
            }
        }
        true
    }

    /// Index of the current leader, asking the running members.
    pub async fn leader(&self) -> Option<usize> {
        let mut ids = Vec::new();
        let mut leader = None;
        for i in 0..self.members.len() {
            if self.members[i].process.is_none() {
                ids.push(None);
                continue;
            }
            let Ok(mut client) = Self::client(&[self.endpoint(i)]).await else {
                ids.push(None);
                continue;
            };
            match timeout(Duration::from_secs(2), client.status()).await {
                Ok(Ok(status)) => {
                    ids.push(status.header().map(|h| h.member_id()));
                    if status.leader() != 0 {
                        leader = Some(status.leader());
                    }
                }
                _ => ids.push(None),
            }
        }
        let leader = leader?;
        ids.iter().position(|id| *id == Some(leader))
    }

    /// Kills member `i` with SIGKILL and reaps it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].process.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn signal(&self, i: usize, signal: libc::c_int) {
        if let Some(pid) = self.pid(i) {
            // SAFETY: plain syscall on a process this cluster started and has not reaped.
            unsafe {
                libc::kill(pid as libc::pid_t, signal);
            }
        }
    }

    /// Stops member `i` with SIGSTOP (a frozen process: connections stay open, nothing
    /// answers).
    pub fn pause(&self, i: usize) {
        self.signal(i, libc::SIGSTOP);
    }

    /// Resumes member `i` with SIGCONT.
    pub fn resume(&self, i: usize) {
        self.signal(i, libc::SIGCONT);
    }

    /// Restarts a killed member `i` on its old data and ports.
    pub fn restart(&mut self, i: usize) -> io::Result<()> {
        self.kill(i);
        self.launch(i, "existing")
    }

    /// Endpoints of the members that run (not killed).
    pub fn running_endpoints(&self) -> Vec<String> {
        (0..self.members.len())
            .filter(|i| self.members[*i].process.is_some())
            .map(|i| self.endpoint(i))
            .collect()
    }

    /// Compacts the history up to the current revision (physically); returns it.
    pub async fn compact(&self) -> io::Result<i64> {
        let mut client = Self::client(&self.running_endpoints()).await?;
        let revision = client
            .get("/", None)
            .await
            .map_err(io::Error::other)?
            .header()
            .map_or(0, |h| h.revision());
        client
            .compact(revision, Some(CompactionOptions::new().with_physical()))
            .await
            .map_err(io::Error::other)?;
        Ok(revision)
    }

    /// A raw etcd client on every running member (for checks that bypass the store).
    pub async fn raw_client(&self) -> io::Result<Client> {
        Self::client(&self.running_endpoints()).await
    }

    fn kill_all(&mut self) {
        for i in 0..self.members.len() {
            self.resume(i);
            self.kill(i);
        }
    }

    /// Keeps the cluster for the rest of the test process (one cluster shared by many
    /// tests): at exit its processes are killed and its directory removed.
    pub fn into_static(self) -> &'static EtcdCluster {
        static REGISTERED: OnceLock<()> = OnceLock::new();
        REGISTERED.get_or_init(|| {
            // SAFETY: registers a plain extern "C" fn; it only touches `SHARED` under its lock.
            unsafe {
                libc::atexit(clean_up_shared);
            }
        });
        let cluster: &'static EtcdCluster = Box::leak(Box::new(self));
        if let Ok(mut shared) = SHARED.lock() {
            shared.push(cluster);
        }
        cluster
    }

    /// Directory holding the members' data and logs (`m<i>.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// Clusters kept until the process exits (see `EtcdCluster::into_static`).
static SHARED: Mutex<Vec<&'static EtcdCluster>> = Mutex::new(Vec::new());

extern "C" fn clean_up_shared() {
    let Ok(shared) = SHARED.lock() else { return };
    for cluster in shared.iter() {
        for i in 0..cluster.members.len() {
            cluster.signal(i, libc::SIGKILL);
        }
        let _ = std::fs::remove_dir_all(cluster.dir.path());
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// Freezes a process this test started with SIGSTOP (as a long GC pause or a stopped VM
/// would).
pub fn freeze_process(pid: u32) {
    // SAFETY: plain syscall; callers pass the id of a child they have not reaped.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGSTOP);
    }
}

/// Resumes a process frozen by [`freeze_process`] (SIGCONT).
pub fn thaw_process(pid: u32) {
    // SAFETY: as in `freeze_process`.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGCONT);
    }
}

/// A TCP proxy in front of one address that can black-hole or cut the connections passing
/// through it. Runs on the current tokio runtime; stops when dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    paused: watch::Sender<bool>,
    /// Bumped by `cut`; a connection ends when it changes (or when the proxy is dropped).
    generation: watch::Sender<u64>,
    accept: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards every connection to `target`.
    pub async fn start(target: SocketAddr) -> io::Result<FaultProxy> {
        let listener = TokioListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (paused, _) = watch::channel(false);
        let (generation, _) = watch::channel(0u64);
        let (paused_rx, generation_rx) = (paused.subscribe(), generation.subscribe());
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let paused = paused_rx.clone();
                let mut cut = generation_rx.clone();
                cut.mark_unchanged();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(target).await else { return };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    // Cut first: a `cut` followed at once by `resume` must not let bytes
                    // held during the pause through.
                    tokio::select! {
                        biased;
                        _ = cut.changed() => {}
                        _ = pump(client_read, server_write, paused.clone()) => {}
                        _ = pump(server_read, client_write, paused) => {}
                    }
                });
            }
        });
        Ok(FaultProxy { addr, paused, generation, accept })
    }

    /// The proxy's endpoint URL.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops all traffic (both directions, all connections, new ones too) without closing
    /// anything: a network partition as the client sees it.
    pub fn pause(&self) {
        self.paused.send_replace(true);
    }

    /// Lets traffic flow again.
    pub fn resume(&self) {
        self.paused.send_replace(false);
    }

    /// Closes every connection open now (new ones are accepted).
    pub fn cut(&self) {
        self.generation.send_modify(|g| *g += 1);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut paused: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if paused.wait_for(|p| !*p).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // Data read just before a pause is held back until the resume.
        if paused.wait_for(|p| !*p).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_proxy_holds_traffic_while_paused_and_cuts() {
        let echo = TokioListener::bind("127.0.0.1:0").await.unwrap();
        let target = echo.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let proxy = FaultProxy::start(target).await.unwrap();
        let mut conn = TcpStream::connect(proxy.addr).await.unwrap();
        let mut buf = [0u8; 16];
        conn.write_all(b"one").await.unwrap();
        conn.read_exact(&mut buf[..3]).await.unwrap();
        proxy.pause();
        conn.write_all(b"two").await.unwrap();
        let held = timeout(Duration::from_millis(300), conn.read(&mut buf)).await;
        assert!(held.is_err(), "nothing may pass while paused: {held:?}");
        proxy.resume();
        timeout(Duration::from_secs(5), conn.read_exact(&mut buf[..3])).await.unwrap().unwrap();
        assert_eq!(&buf[..3], b"two");
        proxy.cut();
        let end = timeout(Duration::from_secs(5), conn.read(&mut buf)).await.unwrap();
        assert!(matches!(end, Ok(0) | Err(_)), "the connection is closed: {end:?}");
        let mut again = TcpStream::connect(proxy.addr).await.unwrap();
        again.write_all(b"new").await.unwrap();
        timeout(Duration::from_secs(5), again.read_exact(&mut buf[..3])).await.unwrap().unwrap();
    }
}
