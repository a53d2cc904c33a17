//! Broker registration and readiness: the broker's ephemeral key in the metadata store
//! (`/brokers/{host}:{web-port}`, see `magnetar_model::keys::broker`) and what the broker does
//! when the metadata session that holds it changes.
//!
//! Two parts, as everywhere decisions meet I/O:
//! * [`RegistrationMachine`]: the pure decision core. Inputs are session events and the
//!   outcome of registration writes; outputs are [`Action`]s (write the key, retry later, log)
//!   and whether the broker is ready. No I/O, no clock, no tokio.
//! * [`Registration`]: the tokio shell. It subscribes to the store's session events, feeds
//!   them to the machine, performs its actions with `SessionStore::put_ephemeral`, and
//!   publishes the machine's readiness to the broker's [`Readiness`].
//!
//! Behaviour (Pulsar's, for a broker whose ZooKeeper/etcd session expires):
//! * `SessionLost`: the key is gone. The broker logs a warning, reports not ready (admin
//!   `ready` and `health` answer 503 with the reason) and refuses to *load* topics
//!   (`BrokerError::ServiceNotReady`, which clients retry). Topics already loaded keep
//!   serving: every write another owner could race is a compare-and-set (`fence.rs`).
//! * `SessionReestablished` (a new session): the broker writes its key again and, once that
//!   write succeeds, is ready again.
//! * `Lagged` (session events were missed): re-validate by writing the key again.
//! * `ConnectionLost` / `Reconnected`: logged only; the session, and the key, still exist.
//!
//! Invariants: the broker is ready only in [`Phase::Registered`], i.e. after a successful
//! registration write in the current session and before any later `SessionLost`; once
//! stopped, nothing changes any more.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use magnetar_metadata::{ExpectedVersion, MetadataError, SessionEvent, SessionStore};
use tokio::sync::watch;

use crate::error::BrokerError;

/// Where the broker's registration stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The key is being written (at start, after a new session, after `Lagged`).
    Registering,
    /// The key is written in the current session: the broker is ready.
    Registered,
    /// The session ended; waiting for the store's new one.
    SessionLost,
    /// The broker is shutting down (terminal).
    Stopped,
}

/// An input of the [`RegistrationMachine`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// A session event of the metadata store.
    Session(SessionEvent),
    /// The last registration write succeeded.
    RegisterSucceeded,
    /// The last registration write failed.
    RegisterFailed(String),
    /// The back-off after a failed write is over.
    RetryDue,
    /// The broker is shutting down.
    Stop,
}

/// What the shell must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Write the registration key (ephemeral, bound to the current session).
    Register,
    /// Feed [`Input::RetryDue`] after a back-off.
    RetryLater,
    /// Log a warning.
    Warn(String),
    /// Log an informational line.
    Info(String),
}

/// The pure decision core (see the module docs).
#[derive(Debug, Clone)]
pub struct RegistrationMachine {
    phase: Phase,
    /// Successful registration writes so far.
    registrations: u64,
    /// `SessionLost` events seen so far.
    sessions_lost: u64,
}

impl Default for RegistrationMachine {
    fn default() -> Self {
        Self::new()
    }
}

impl RegistrationMachine {
    /// A machine about to register: the shell performs [`Action::Register`] first.
    pub fn new() -> Self {
        RegistrationMachine { phase: Phase::Registering, registrations: 0, sessions_lost: 0 }
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Whether the broker may load topics and reports ready.
    pub fn is_ready(&self) -> bool {
        self.phase == Phase::Registered
    }

    /// Why the broker is not ready (`None` when it is).
    pub fn not_ready_reason(&self) -> Option<&'static str> {
        match self.phase {
            Phase::Registered => None,
            Phase::Registering if self.sessions_lost > 0 => {
                Some("metadata session re-established; registering the broker again")
            }
            Phase::Registering => Some("registering the broker in the metadata store"),
            Phase::SessionLost => {
                Some("metadata session lost; waiting for a new session (new topics refused)")
            }
            Phase::Stopped => Some("broker is shutting down"),
        }
    }

    /// Counters for observers: (successful registrations, sessions lost).
    pub fn counts(&self) -> (u64, u64) {
        (self.registrations, self.sessions_lost)
    }

    /// Applies one input; returns what to do, in order.
    pub fn on(&mut self, input: Input) -> Vec<Action> {
        if self.phase == Phase::Stopped {
            return Vec::new();
        }
        match input {
            Input::Stop => {
                self.phase = Phase::Stopped;
                Vec::new()
            }
            Input::RegisterSucceeded => match self.phase {
                Phase::Registering | Phase::Registered => {
                    let first = self.registrations == 0;
                    self.registrations += 1;
                    self.phase = Phase::Registered;
                    if first {
                        vec![Action::Info("broker registered in the metadata store".into())]
                    } else {
                        vec![Action::Info("broker registered again: ready".into())]
                    }
                }
                // A write that completed before a `SessionLost` handled since: its key went
                // with that session, so it changes nothing.
                Phase::SessionLost | Phase::Stopped => Vec::new(),
            },
            Input::RegisterFailed(why) => match self.phase {
                Phase::Registering => vec![
                    Action::Warn(format!("broker registration failed (will retry): {why}")),
                    Action::RetryLater,
                ],
                _ => Vec::new(),
            },
            Input::RetryDue => match self.phase {
                Phase::Registering => vec![Action::Register],
                _ => Vec::new(),
            },
            Input::Session(event) => self.on_session(event),
        }
    }

    fn on_session(&mut self, event: SessionEvent) -> Vec<Action> {
        match event {
            SessionEvent::SessionLost { session } => {
                self.sessions_lost += 1;
                self.phase = Phase::SessionLost;
                vec![Action::Warn(format!(
                    "metadata {session} lost: broker not ready, loading no new topics until a \
                     new session registers it again (loaded topics keep serving)"
                ))]
            }
            SessionEvent::SessionReestablished { session } => {
                self.phase = Phase::Registering;
                vec![
                    Action::Info(format!("metadata {session} established: registering again")),
                    Action::Register,
                ]
            }
            SessionEvent::Lagged => {
                self.phase = Phase::Registering;
                vec![
                    Action::Warn("missed metadata session events: registering again".into()),
                    Action::Register,
                ]
            }
            SessionEvent::ConnectionLost { session } => vec![Action::Warn(format!(
                "lost contact with the metadata store ({session} may still be alive)"
            ))],
            SessionEvent::Reconnected { session } => {
                vec![Action::Info(format!("metadata store reachable again ({session} kept)"))]
            }
        }
    }
}

/// What observers see of the registration: readiness plus counters (tests wait on them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadinessState {
    /// `None` when ready; otherwise why not.
    pub not_ready: Option<String>,
    /// Successful registration writes so far.
    pub registrations: u64,
    /// Metadata sessions lost so far.
    pub sessions_lost: u64,
}

/// The broker's readiness, shared by the registration shell (writer), topic loads and the
/// admin API (readers). Starts not ready ("starting"); a broker without registration (unit
/// tests, embedded uses) calls [`Readiness::ready`].
#[derive(Debug)]
pub struct Readiness {
    state: watch::Sender<ReadinessState>,
}

impl Default for Readiness {
    fn default() -> Self {
        Self::ready()
    }
}

impl Readiness {
    /// Not ready, with `reason`.
    pub fn not_ready(reason: &str) -> Self {
        let (state, _) = watch::channel(ReadinessState {
            not_ready: Some(reason.to_string()),
            registrations: 0,
            sessions_lost: 0,
        });
        Readiness { state }
    }

    /// Ready from the start (no registration).
    pub fn ready() -> Self {
        let (state, _) =
            watch::channel(ReadinessState { not_ready: None, registrations: 0, sessions_lost: 0 });
        Readiness { state }
    }

    /// `Ok` when ready; otherwise `ServiceNotReady` with the reason (clients retry it).
    pub fn check(&self) -> Result<(), BrokerError> {
        match &self.state.borrow().not_ready {
            None => Ok(()),
            Some(reason) => Err(BrokerError::ServiceNotReady(reason.clone())),
        }
    }

    /// The current state.
    pub fn state(&self) -> ReadinessState {
        self.state.borrow().clone()
    }

    /// A receiver of every later change (for tests and waiting callers).
    pub fn subscribe(&self) -> watch::Receiver<ReadinessState> {
        self.state.subscribe()
    }

    fn publish(&self, machine: &RegistrationMachine) {
        let (registrations, sessions_lost) = machine.counts();
        let next = ReadinessState {
            not_ready: machine.not_ready_reason().map(str::to_string),
            registrations,
            sessions_lost,
        };
        self.state.send_if_modified(|current| {
            let changed = *current != next;
            *current = next;
            changed
        });
    }
}

/// Back-off between failed registration writes: doubles from the first to the last.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// The tokio shell around [`RegistrationMachine`]: owns the broker's registration key.
pub struct Registration {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Registration {
    /// Subscribes to the store's session events, writes the registration (`key` = `value`,
    /// ephemeral) and, once that succeeds, marks `readiness` ready and keeps the key for as
    /// long as the returned handle runs. A failed first write fails the start (the caller
    /// reports it); later failures are retried.
    pub async fn start(
        store: Arc<dyn SessionStore>,
        key: String,
        value: Bytes,
        readiness: Arc<Readiness>,
    ) -> Result<Registration, MetadataError> {
        // Subscribe first, so no event after the first write is missed.
        let events = store.session_events();
        let mut machine = RegistrationMachine::new();
        store.put_ephemeral(&key, value.clone(), ExpectedVersion::Any).await?;
        perform_logs(machine.on(Input::RegisterSucceeded));
        readiness.publish(&machine);
        let (stop, stopped) = watch::channel(false);
        let shell = Shell { store, key, value, readiness, machine, retry_delay: RETRY_FIRST };
        let task = tokio::spawn(shell.run(events, stopped));
        Ok(Registration { stop, task })
    }

    /// Marks the broker not ready ("shutting down") and ends the shell. The key itself goes
    /// when the caller closes the store (which ends the session).
    pub async fn stop(self) {
        self.stop.send_replace(true);
        let _ = self.task.await;
    }
}

struct Shell {
    store: Arc<dyn SessionStore>,
    key: String,
    value: Bytes,
    readiness: Arc<Readiness>,
    machine: RegistrationMachine,
    retry_delay: Duration,
}

impl Shell {
    async fn run(
        mut self,
        mut events: magnetar_metadata::SessionEvents,
        mut stopped: watch::Receiver<bool>,
    ) {
        let mut retry_at: Option<tokio::time::Instant> = None;
        loop {
            let input = tokio::select! {
                biased;
                _ = stopped.changed() => Input::Stop,
                event = events.recv() => match event {
                    Some(event) => Input::Session(event),
                    None => Input::Stop, // the store was closed
                },
                _ = sleep_until(retry_at) => {
                    retry_at = None;
                    Input::RetryDue
                }
            };
            let stop = input == Input::Stop;
            let mut pending = self.machine.on(input);
            while !pending.is_empty() {
                let mut next = Vec::new();
                for action in pending {
                    match action {
                        Action::Register => {
                            let outcome = self
                                .store
                                .put_ephemeral(&self.key, self.value.clone(), ExpectedVersion::Any)
                                .await;
                            next.extend(self.machine.on(match outcome {
                                Ok(_) => {
                                    self.retry_delay = RETRY_FIRST;
                                    Input::RegisterSucceeded
                                }
                                Err(e) => Input::RegisterFailed(e.to_string()),
                            }));
                        }
                        Action::RetryLater => {
                            retry_at = Some(tokio::time::Instant::now() + self.retry_delay);
                            self.retry_delay = (self.retry_delay * 2).min(RETRY_MAX);
                        }
                        log => perform_logs(vec![log]),
                    }
                }
                pending = next;
            }
            self.readiness.publish(&self.machine);
            if stop {
                return;
            }
        }
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn perform_logs(actions: Vec<Action>) {
    for action in actions {
        match action {
            Action::Warn(line) => tracing::warn!("{line}"),
            Action::Info(line) => tracing::info!("{line}"),
            Action::Register | Action::RetryLater => {
                unreachable!("only log actions are passed here")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use magnetar_metadata::SessionId;

    fn lost(n: u64) -> Input {
        Input::Session(SessionEvent::SessionLost { session: SessionId(n) })
    }
    fn reestablished(n: u64) -> Input {
        Input::Session(SessionEvent::SessionReestablished { session: SessionId(n) })
    }
    fn has_register(actions: &[Action]) -> bool {
        actions.contains(&Action::Register)
    }

    #[test]
    fn registers_then_is_ready() {
        let mut m = RegistrationMachine::new();
        assert!(!m.is_ready());
        assert!(m.not_ready_reason().unwrap().contains("registering"));
        m.on(Input::RegisterSucceeded);
        assert!(m.is_ready());
        assert_eq!(m.not_ready_reason(), None);
        assert_eq!(m.counts(), (1, 0));
    }

    #[test]
    fn session_lost_then_reestablished() {
        let mut m = RegistrationMachine::new();
        m.on(Input::RegisterSucceeded);
        let actions = m.on(lost(1));
        assert!(matches!(actions.as_slice(), [Action::Warn(w)] if w.contains("lost")));
        assert!(!m.is_ready());
        assert_eq!(m.phase(), Phase::SessionLost);
        assert!(m.not_ready_reason().unwrap().contains("session lost"));
        // A retry timer left over from earlier does not write while the session is lost.
        assert!(m.on(Input::RetryDue).is_empty());
        let actions = m.on(reestablished(2));
        assert!(has_register(&actions));
        assert!(!m.is_ready(), "ready only once the key is written again");
        assert!(m.not_ready_reason().unwrap().contains("re-established"));
        m.on(Input::RegisterSucceeded);
        assert!(m.is_ready());
        assert_eq!(m.counts(), (2, 1));
    }

    #[test]
    fn a_write_finishing_after_session_lost_does_not_make_it_ready() {
        let mut m = RegistrationMachine::new();
        m.on(Input::RegisterSucceeded);
        m.on(lost(1));
        assert!(m.on(Input::RegisterSucceeded).is_empty());
        assert!(!m.is_ready());
    }

    #[test]
    fn failed_writes_retry_only_while_registering() {
        let mut m = RegistrationMachine::new();
        m.on(Input::RegisterSucceeded);
        m.on(lost(1));
        m.on(reestablished(2));
        let actions = m.on(Input::RegisterFailed("etcd unreachable".into()));
        assert!(actions.contains(&Action::RetryLater));
        assert!(!m.is_ready());
        assert_eq!(m.on(Input::RetryDue), vec![Action::Register]);
        // Lost again before the retry: no write, no retry.
        m.on(lost(2));
        assert!(m.on(Input::RegisterFailed("expired".into())).is_empty());
        assert!(m.on(Input::RetryDue).is_empty());
    }

    #[test]
    fn lagged_reregisters_and_connection_events_only_log() {
        let mut m = RegistrationMachine::new();
        m.on(Input::RegisterSucceeded);
        let conn = m.on(Input::Session(SessionEvent::ConnectionLost { session: SessionId(1) }));
        assert!(matches!(conn.as_slice(), [Action::Warn(_)]));
        assert!(m.is_ready(), "the session (and the key) may still be alive");
        m.on(Input::Session(SessionEvent::Reconnected { session: SessionId(1) }));
        assert!(m.is_ready());
        assert!(has_register(&m.on(Input::Session(SessionEvent::Lagged))));
        assert!(!m.is_ready());
        m.on(Input::RegisterSucceeded);
        assert!(m.is_ready());
    }

    #[test]
    fn stop_is_terminal() {
        let mut m = RegistrationMachine::new();
        m.on(Input::RegisterSucceeded);
        m.on(Input::Stop);
        assert_eq!(m.phase(), Phase::Stopped);
        assert!(m.not_ready_reason().unwrap().contains("shutting down"));
        for input in [reestablished(3), Input::RegisterSucceeded, Input::RetryDue, lost(3)] {
            assert!(m.on(input).is_empty());
            assert_eq!(m.phase(), Phase::Stopped);
        }
    }

    #[test]
    fn readiness_gate_maps_to_service_not_ready() {
        let gate = Readiness::not_ready("starting");
        assert!(matches!(gate.check(), Err(BrokerError::ServiceNotReady(r)) if r == "starting"));
        let mut m = RegistrationMachine::new();
        m.on(Input::RegisterSucceeded);
        gate.publish(&m);
        assert!(gate.check().is_ok());
        assert_eq!(gate.state().registrations, 1);
    }

    /// The shell against the in-memory store: a lost session makes the broker not ready and
    /// deletes its key; the new session gets the key back and the broker ready again.
    #[tokio::test]
    async fn shell_reregisters_after_the_session_is_lost() {
        let store = Arc::new(magnetar_metadata::MemoryStore::new());
        let readiness = Arc::new(Readiness::not_ready("starting"));
        let mut changes = readiness.subscribe();
        let key = "/brokers/127.0.0.1:8080".to_string();
        let registration = Registration::start(
            store.clone(),
            key.clone(),
            Bytes::from_static(b"{}"),
            readiness.clone(),
        )
        .await
        .expect("register");
        assert!(readiness.check().is_ok());
        let first = magnetar_metadata::MetadataStore::get(&*store, &key).await.unwrap();
        assert!(first.is_some(), "the key is written");
        store.expire_session().expect("expire");
        let back = |s: &ReadinessState| {
            s.sessions_lost == 1 && s.registrations == 2 && s.not_ready.is_none()
        };
        // `is_ok` drops the watch's read guard at once (holding it would block the shell).
        let reregistered =
            tokio::time::timeout(Duration::from_secs(10), changes.wait_for(back)).await.is_ok();
        assert!(reregistered, "re-registered within 10 s: {:?}", readiness.state());
        assert!(magnetar_metadata::MetadataStore::get(&*store, &key).await.unwrap().is_some());
        registration.stop().await;
        assert!(readiness.check().is_err(), "not ready once stopped");
    }
}
