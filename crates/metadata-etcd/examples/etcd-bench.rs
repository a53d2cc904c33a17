//! Compare-and-set throughput and latency of `EtcdStore` from one client, against a
//! 1-member and a 3-member etcd cluster that the benchmark starts itself on loopback (data on
//! /dev/shm, as in the tests).
//!
//! ```text
//! cargo run --release -p magnetar-metadata-etcd --example etcd-bench -- \
//!     [--seconds 5] [--value-bytes 128] [--inflight 1,32] [--members 1,3]
//! ```
//!
//! Each writer task owns one key and chains compare-and-set puts on it
//! (`ExpectedVersion::Exactly(previous)`), so every put is a real CAS txn and none conflicts;
//! `--inflight N` runs N such writers on one `EtcdStore`. Prints puts/s and latency
//! percentiles per (members, inflight). Needs the `etcd` binary (Debian: etcd-server).
//!
//! Figures of 2026-11-25 (2-core machine shared by client and etcd; etcd 3.4.23, 128 B values):
//!
//! ```text
//! members inflight     puts/s    p50 ms    p99 ms   p999 ms
//!       1        1       4381      0.20      0.75      2.66
//!       1       32      14555      1.75      7.35     10.85
//!       3        1       1914      0.48      2.12      4.91
//!       3       32       7245      3.44     15.77     21.39
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use bytes::Bytes;
use hdrhistogram::Histogram;
use magnetar_etcd_testing::{etcd_binary, EtcdCluster};
use magnetar_metadata::{ExpectedVersion, MetadataStore};
use magnetar_metadata_etcd::{EtcdStore, EtcdStoreConfig};

struct Args {
    seconds: u64,
    value_bytes: usize,
    inflight: Vec<usize>,
    members: Vec<usize>,
}

fn parse_list(value: &str) -> Vec<usize> {
    value.split(',').map(|v| v.trim().parse().expect("a number list like 1,32")).collect()
}

fn parse_args() -> Args {
    let mut args =
        Args { seconds: 5, value_bytes: 128, inflight: vec![1, 32], members: vec![1, 3] };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--seconds" => args.seconds = value().parse().expect("--seconds N"),
            "--value-bytes" => args.value_bytes = value().parse().expect("--value-bytes N"),
            "--inflight" => args.inflight = parse_list(&value()),
            "--members" => args.members = parse_list(&value()),
            other => panic!("unknown argument {other} (see the example's doc comment)"),
        }
    }
    args
}

/// One run: `inflight` writers for `seconds`; returns (puts, histogram of microseconds).
async fn run(store: Arc<EtcdStore>, inflight: usize, args: &Args) -> (u64, Histogram<u64>) {
    let stop = Arc::new(AtomicBool::new(false));
    let value = Bytes::from(vec![b'x'; args.value_bytes]);
    let writers: Vec<_> = (0..inflight)
        .map(|w| {
            let (store, stop, value) = (store.clone(), stop.clone(), value.clone());
            tokio::spawn(async move {
                let key = format!("/bench/{inflight}/{w}");
                let mut histogram = Histogram::<u64>::new(3).expect("histogram");
                let mut version =
                    store.put(&key, value.clone(), ExpectedVersion::Any).await.expect("first put");
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let expected = ExpectedVersion::Exactly(version);
                    version = store.put(&key, value.clone(), expected).await.expect("CAS put");
                    histogram.record(started.elapsed().as_micros() as u64).expect("record");
                }
                histogram
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut total = Histogram::<u64>::new(3).expect("histogram");
    for w in writers {
        total.add(w.await.expect("writer")).expect("merge");
    }
    (total.len(), total)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = parse_args();
    let binary = etcd_binary().expect("no etcd binary: apt-get install etcd-server");
    println!(
        "EtcdStore CAS puts from one client, {} B values, {} s per case (etcd on loopback, /dev/shm)",
        args.value_bytes, args.seconds
    );
    println!(
        "{:>7} {:>8} {:>10} {:>9} {:>9} {:>9} {:>9}",
        "members", "inflight", "puts/s", "p50 ms", "p99 ms", "p999 ms", "max ms"
    );
    for &members in &args.members {
        let cluster = EtcdCluster::start(&binary, members).await.expect("start etcd");
        let config = EtcdStoreConfig::new(cluster.endpoints(), "bench");
        let store = Arc::new(EtcdStore::connect(config).await.expect("connect"));
        for &inflight in &args.inflight {
            let (puts, h) = run(store.clone(), inflight, &args).await;
            let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
            println!(
                "{members:>7} {inflight:>8} {:>10.0} {:>9.2} {:>9.2} {:>9.2} {:>9.2}",
                puts as f64 / args.seconds as f64,
                ms(0.5),
                ms(0.99),
                ms(0.999),
                h.max() as f64 / 1000.0
            );
        }
        store.close().await.expect("close");
    }
}
