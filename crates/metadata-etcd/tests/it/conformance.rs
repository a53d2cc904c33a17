//! The metadata conformance suite (`magnetar_metadata::conformance`) against `EtcdStore` on
//! a 1-member and a 3-member etcd cluster, both on loopback and shared by every case of this
//! binary (each case gets its own root prefix, which also exercises the root mapping).
//! Skipped with a notice when etcd is not installed, unless MAGNETAR_REQUIRE_ETCD=1.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use magnetar_etcd_testing::{etcd_or_skip, EtcdCluster};
use magnetar_metadata::conformance::{Hooks, Subject, WATCH_CAPACITY};
use magnetar_metadata::MetadataStore;
use magnetar_metadata_etcd::{EtcdStore, EtcdStoreConfig};
use tokio::sync::OnceCell;

static ONE_MEMBER: OnceCell<&'static EtcdCluster> = OnceCell::const_new();
static THREE_MEMBERS: OnceCell<&'static EtcdCluster> = OnceCell::const_new();

async fn shared(
    cell: &'static OnceCell<&'static EtcdCluster>,
    size: usize,
) -> Option<&'static EtcdCluster> {
    let binary = etcd_or_skip("etcd conformance")?;
    let cluster = cell
        .get_or_init(|| async move {
            EtcdCluster::start(&binary, size).await.expect("start the etcd cluster").into_static()
        })
        .await;
    Some(cluster)
}

fn config(cluster: &EtcdCluster) -> EtcdStoreConfig {
    static CASES: AtomicU64 = AtomicU64::new(0);
    let case = CASES.fetch_add(1, Ordering::Relaxed);
    let mut config = EtcdStoreConfig::new(cluster.endpoints(), &format!("conformance-{case}"));
    config.watch_capacity = WATCH_CAPACITY;
    config.session_ttl = Duration::from_secs(5);
    config
}

struct EtcdHooks {
    store: Arc<EtcdStore>,
    config: EtcdStoreConfig,
}

#[async_trait]
impl Hooks for EtcdHooks {
    async fn settle(&self) {
        self.store.settle_watches().await;
    }

    async fn expire_session(&self) {
        self.store.expire_session().await.expect("revoke the session lease");
    }

    /// Another process: a second connection with the same root.
    async fn observer(&self) -> Arc<dyn MetadataStore> {
        Arc::new(EtcdStore::connect(self.config.clone()).await.expect("connect an observer"))
    }
}

async fn subject(cluster: Option<&'static EtcdCluster>) -> Option<Subject> {
    let config = config(cluster?);
    let store = Arc::new(EtcdStore::connect(config.clone()).await.expect("connect to etcd"));
    Some(Subject { store: store.clone(), hooks: Box::new(EtcdHooks { store, config }) })
}

fn one_member() -> Pin<Box<dyn Future<Output = Option<Subject>>>> {
    Box::pin(async { subject(shared(&ONE_MEMBER, 1).await).await })
}

fn three_members() -> Pin<Box<dyn Future<Output = Option<Subject>>>> {
    Box::pin(async { subject(shared(&THREE_MEMBERS, 3).await).await })
}

magnetar_metadata::conformance_tests!(etcd_1_member, super::one_member);
magnetar_metadata::conformance_tests!(etcd_3_members, super::three_members);
