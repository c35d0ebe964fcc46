//! What the database's writers committed, heard at once: PostgreSQL's LISTEN/NOTIFY on one
//! connection of its own per store, so that a process learns of another's task events and
//! cancel flags without waiting for its next poll.
//!
//! A write that appends to a task's log, or saves a memory value (a cancel flag is one), is
//! announced by [`Announcer`] once it has committed, never for one that rolled back. Notifications are a hint, never the record:
//! followers still read the log by sequence, and a notification that was lost (the listening
//! connection dropped, a receiver lagged) is reported as [`StoreChange::Missed`] so that they
//! read everything they follow again.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_core::TaskId;
use keel_core::{AgentError, AgentResult};
use keel_runtime::{AuthContext, StoreChange};
use tokio::sync::{broadcast, oneshot, watch};
use tokio_postgres::AsyncMessage;

use crate::error::BACKEND;

/// Announce each payload of `$1` on the schema's channel (named after the connection's schema,
/// so that stores in separate schemas of one database do not hear each other).
const ANNOUNCE: &str =
    "SELECT pg_notify(left('keel.' || current_schema(), 63), p) FROM unnest($1::text[]) AS p";
/// PostgreSQL's limit on a payload is 8000 bytes; a longer one is sent as `["?"]`, which
/// listeners take as "something changed".
const MAX_PAYLOAD: usize = 7900;
/// The most payloads one announcement carries.
const MAX_BATCH: usize = 256;

/// What the store's writes tell listeners, sent after the write committed, from a task of
/// its own, on a pooled connection, in batches.
///
/// Why not `pg_notify` in the writing statement, which would send it exactly at the commit:
/// PostgreSQL serializes the commits of every transaction that notified (it holds one lock
/// per database from the notification queue's update through the commit's WAL flush), so
/// concurrent writers that notify cannot share a flush. Sent apart, a write commits as any
/// write does, and an announcement (a transaction that writes no WAL) holds that lock only
/// for an instant. The price: an announcement comes a moment after its commit, and one is
/// lost when the process dies in between; listeners read the log by sequence and poll, so
/// notifications stay a hint.
pub(crate) struct Announcer {
    sender: tokio::sync::mpsc::UnboundedSender<String>,
    /// The sending task's pool and queue, until the first announcement starts it on its
    /// runtime (a store may be made outside one).
    pending: Mutex<Option<(deadpool_postgres::Pool, AnnouncementQueue)>>,
    started: std::sync::Once,
}

type AnnouncementQueue = tokio::sync::mpsc::UnboundedReceiver<String>;

impl Announcer {
    pub(crate) fn new(pool: deadpool_postgres::Pool) -> Self {
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
        Self {
            sender,
            pending: Mutex::new(Some((pool, receiver))),
            started: std::sync::Once::new(),
        }
    }

    /// Announce that task `task_id`'s log grew.
    pub(crate) fn task_events(&self, tenant: &str, task_id: &str) {
        self.announce("t", tenant, task_id);
    }

    /// Announce that memory value `key` was saved.
    pub(crate) fn memory(&self, tenant: &str, key: &str) {
        self.announce("m", tenant, key);
    }

    fn announce(&self, kind: &str, tenant: &str, id: &str) {
        self.started.call_once(|| {
            let pending = self
                .pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            if let Some((pool, receiver)) = pending {
                tokio::spawn(send_announcements(pool, receiver));
            }
        });
        let payload = serde_json::to_string(&[kind, tenant, id])
            .ok()
            .filter(|payload| payload.len() < MAX_PAYLOAD)
            .unwrap_or_else(|| "[\"?\"]".to_owned());
        // The task ends only when the store does, with this sender.
        let _ = self.sender.send(payload);
    }
}

/// Send what `receiver` gets, each batch what has queued since the last (duplicates once),
/// until the store is gone. A failure is logged and the batch dropped: listeners poll.
async fn send_announcements(pool: deadpool_postgres::Pool, mut receiver: AnnouncementQueue) {
    let mut batch = Vec::new();
    while receiver.recv_many(&mut batch, MAX_BATCH).await > 0 {
        batch.sort_unstable();
        batch.dedup();
        let sent = match pool.get().await {
            Ok(client) => crate::codec::execute(&client, ANNOUNCE, &[&batch], "announcing")
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(error) = sent {
            tracing::debug!(%error, "a change announcement was not sent; listeners find it by polling");
        }
        batch.clear();
    }
}

/// How many changes a slow receiver may fall behind before it is told it missed some.
const BUFFER: usize = 1024;
/// The longest wait between two attempts to connect the listener again.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The backend process ids of a store's pooled connections (PostgreSQL names the sender of
/// each notification by it), so that the store can tell its own writes from another
/// process's. A pid the server reuses later for another process's connection would make that
/// connection's writes look like this store's: its waiters then find them at their next poll.
pub(crate) type OwnSessions = Arc<Mutex<HashSet<i32>>>;

/// The change a notification's payload names, `own_write` when one of this store's
/// connections sent it; one this code does not know is [`StoreChange::Missed`], which makes
/// listeners look at everything.
fn parse(payload: &str, own_write: bool) -> StoreChange {
    let parsed: Option<(String, String, String)> = serde_json::from_str(payload).ok();
    let Some((kind, tenant, id)) = parsed else {
        return StoreChange::Missed;
    };
    let Some(auth) = AuthContext::from_namespace(&tenant) else {
        return StoreChange::Missed;
    };
    match kind.as_str() {
        "t" => StoreChange::TaskEvents {
            auth,
            task_id: TaskId::from(id),
            own_write,
        },
        "m" => StoreChange::Memory { auth, key: id },
        _ => StoreChange::Missed,
    }
}

/// A receiver of a store's changes: [`Changes::recv`] turns a lag into
/// [`StoreChange::Missed`], so a slow receiver is told rather than silently skipped.
#[derive(Debug)]
pub struct Changes {
    receiver: broadcast::Receiver<StoreChange>,
}

impl Changes {
    /// The next change, waiting for it; `None` once the store (every clone of it) is gone.
    pub async fn recv(&mut self) -> Option<StoreChange> {
        match self.receiver.recv().await {
            Ok(change) => Some(change),
            Err(broadcast::error::RecvError::Lagged(_)) => Some(StoreChange::Missed),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }

    /// These changes as a stream, ending with the store.
    pub fn into_stream(self) -> futures::stream::BoxStream<'static, StoreChange> {
        Box::pin(futures::stream::unfold(self, |mut changes| async move {
            changes.recv().await.map(|change| (change, changes))
        }))
    }
}

/// The store's listener: started by the first [`Listener::subscribe`], stopped when the last
/// clone of the store is dropped.
pub(crate) struct Listener {
    config: tokio_postgres::Config,
    /// The store's own connections, filled as the pool opens them.
    own: OwnSessions,
    sender: broadcast::Sender<StoreChange>,
    /// Whether the listening connection is in place now.
    listening: watch::Sender<bool>,
    /// Taken by the task the first subscription starts; the sender half is dropped with the
    /// listener, which ends that task.
    stop: Mutex<Option<oneshot::Receiver<()>>>,
    _stop: oneshot::Sender<()>,
}

impl Listener {
    pub(crate) fn new(config: tokio_postgres::Config) -> Self {
        let (stop_tx, stop_rx) = oneshot::channel();
        Self {
            config,
            own: OwnSessions::default(),
            sender: broadcast::channel(BUFFER).0,
            listening: watch::channel(false).0,
            stop: Mutex::new(Some(stop_rx)),
            _stop: stop_tx,
        }
    }

    /// Where the pool records the backend process id of each connection it opens.
    pub(crate) fn own_sessions(&self) -> OwnSessions {
        self.own.clone()
    }

    /// A receiver of every change heard from now on, once the listening connection is in
    /// place (the task keeping it is spawned on the current tokio runtime the first time).
    /// Waits at most `timeout` for it: a server that does not answer is
    /// [`AgentError::StoreUnavailable`].
    pub(crate) async fn subscribe(
        &self,
        server: Arc<str>,
        timeout: Duration,
    ) -> AgentResult<Changes> {
        let receiver = self.sender.subscribe();
        let stop = self.stop.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(stop) = stop {
            let task = Session {
                config: self.config.clone(),
                own: self.own.clone(),
                sender: self.sender.clone(),
                listening: self.listening.clone(),
                server,
            };
            tokio::spawn(task.run(stop));
        }
        let mut listening = self.listening.subscribe();
        let up = tokio::time::timeout(timeout, listening.wait_for(|up| *up))
            .await
            .is_ok_and(|up| up.is_ok());
        if up {
            Ok(Changes { receiver })
        } else {
            Err(AgentError::store_unavailable(
                BACKEND,
                "listening for changes",
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the notification listener did not connect in time",
                ),
            ))
        }
    }
}

/// What the listening task holds.
struct Session {
    config: tokio_postgres::Config,
    own: OwnSessions,
    sender: broadcast::Sender<StoreChange>,
    listening: watch::Sender<bool>,
    server: Arc<str>,
}

impl Session {
    /// Keep a connection that LISTENs to the schema's channel, forwarding what it hears,
    /// until `stop` fires (the store is gone); a lost connection is opened again, with
    /// backoff. Every LISTEN put in place is announced as [`StoreChange::Missed`]: what was
    /// committed while no connection listened was not heard.
    async fn run(self, mut stop: oneshot::Receiver<()>) {
        let mut backoff = Duration::from_millis(50);
        loop {
            let ended = tokio::select! {
                _ = &mut stop => return,
                ended = self.hear() => ended,
            };
            self.listening.send_replace(false);
            if ended.listened {
                backoff = Duration::from_millis(50);
            }
            tracing::warn!(server = %self.server, error = %ended.error,
                "the PostgreSQL notification listener is down; changes are found by polling until it is back");
            tokio::select! {
                _ = &mut stop => return,
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// One listening session: connect, LISTEN, forward notifications until the connection
    /// ends (it always does, in the end).
    async fn hear(&self) -> Ended {
        let mut config = self.config.clone();
        if config.get_application_name().is_none() {
            config.application_name("keel-listener");
        }
        let tls = match crate::tls() {
            Ok(tls) => tls,
            Err(e) => return Ended::before_listening(e),
        };
        let (client, mut connection) = match config.connect(tls).await {
            Ok(connected) => connected,
            Err(e) => return Ended::before_listening(e),
        };
        // Notifications arrive on the connection, which its own task drives; it ends when
        // the server closes it or `client` is dropped.
        let (heard_tx, mut heard_rx) = tokio::sync::mpsc::unbounded_channel();
        let own = self.own.clone();
        let driver = tokio::spawn(async move {
            loop {
                match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                    Some(Ok(AsyncMessage::Notification(note))) => {
                        let own_write = own
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .contains(&note.process_id());
                        let _ = heard_tx.send(parse(note.payload(), own_write));
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return e.to_string(),
                    None => return "the server closed the connection".to_owned(),
                }
            }
        });
        let listen = async {
            let channel: String = client
                .query_one("SELECT left('keel.' || current_schema(), 63)", &[])
                .await?
                .get(0);
            client
                .batch_execute(&format!("LISTEN \"{}\"", channel.replace('"', "\"\"")))
                .await
        };
        if let Err(e) = listen.await {
            driver.abort();
            return Ended::before_listening(e);
        }
        let _ = self.sender.send(StoreChange::Missed);
        self.listening.send_replace(true);
        while let Some(change) = heard_rx.recv().await {
            let _ = self.sender.send(change);
        }
        drop(client);
        Ended {
            listened: true,
            error: driver.await.unwrap_or_else(|e| e.to_string()),
        }
    }
}

/// Why a listening session ended, and whether it had been listening.
struct Ended {
    listened: bool,
    error: String,
}

impl Ended {
    fn before_listening(error: impl ToString) -> Self {
        Self {
            listened: false,
            error: error.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_name_their_change() {
        let auth = AuthContext::new("app", "user");
        let ns = auth.namespace();
        assert_eq!(
            parse(&serde_json::json!(["t", ns, "task-1"]).to_string(), true),
            StoreChange::TaskEvents {
                auth: auth.clone(),
                task_id: TaskId::from("task-1"),
                own_write: true,
            }
        );
        assert_eq!(
            parse(&serde_json::json!(["m", ns, "k"]).to_string(), false),
            StoreChange::Memory {
                auth,
                key: "k".into()
            }
        );
        assert_eq!(parse("[\"?\"]", false), StoreChange::Missed);
        assert_eq!(parse("not json", false), StoreChange::Missed);
    }
}
