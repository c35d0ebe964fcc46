//! Delivery: one watcher per task follows its event log and POSTs every status and artifact
//! update to each config's webhook, claiming each delivery so that processes on one store
//! deliver it once.

use std::time::Duration;

use keel_core::{AgentError, AgentResult, RunContext, TaskEvent, TaskId, TraceParent, W3cTraceId};
use keel_runtime::AuthContext;
use serde_json::{json, Value};

use super::guard::{check_target, literal_ip};
use super::{
    claim_key, cursor_key, log_key, Active, Push, DELIVERY_LOG_LIMIT, DELIVERY_TIMEOUT,
    NOTIFICATION_TOKEN_HEADER,
};
use crate::push_config::PushConfig;
use crate::stream::{changed, StreamEvent, POLL_INTERVAL};
use crate::wire;

/// How long the record that an event was delivered to a config is kept: any watcher still
/// behind it (another process, a resumed server) has long caught up by then.
const DONE_TTL: Duration = Duration::from_secs(24 * 3600);

/// Who delivers one event to one config.
enum Claim {
    /// This process: deliver it.
    Mine,
    /// Someone delivered it already (or gave up on it): skip it.
    Done,
    /// Another process is delivering it now.
    Held,
}

impl Push {
    async fn finish(&self, entry: &Active) -> AgentResult<()> {
        let _writes = self.inner.writes.lock().await;
        let mut active = self.active().await?;
        active.retain(|a| a != entry);
        self.save_active(&active).await?;
        self.values()
            .delete(&entry.auth, &cursor_key(&entry.task_id))
            .await?;
        Ok(())
    }

    /// Start a watcher for every delivery that a previous process (or this one) left
    /// unfinished. Needs a tokio runtime; without one, nothing resumes.
    pub(crate) fn resume(&self) {
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let push = self.clone();
        tokio::spawn(async move {
            match push.active().await {
                Ok(active) => {
                    if !active.is_empty() {
                        tracing::info!(
                            count = active.len(),
                            "resuming pending push notification deliveries"
                        );
                    }
                    for entry in active {
                        push.watch(entry.auth, entry.task_id);
                    }
                }
                Err(err) => tracing::warn!(error = %err, "could not read pending push deliveries"),
            }
        });
    }

    /// Follow `task_id`'s log and deliver, unless a watcher in this process already does.
    pub(super) fn watch(&self, auth: AuthContext, task_id: TaskId) {
        let entry = Active { auth, task_id };
        {
            let Ok(mut watching) = self.inner.watching.lock() else {
                return;
            };
            if !watching.insert(entry.clone()) {
                return;
            }
        }
        let push = self.clone();
        tokio::spawn(async move {
            let span = tracing::info_span!("a2a.push", task_id = %entry.task_id);
            let _ = tracing::Instrument::instrument(push.run_watcher(&entry), span).await;
            if let Ok(mut watching) = push.inner.watching.lock() {
                watching.remove(&entry);
            }
        });
    }

    fn is_stopped(&self) -> bool {
        *self.inner.stopped.borrow()
    }

    async fn run_watcher(&self, entry: &Active) {
        let mut updates = self.inner.executor.task_updates();
        let mut stopped = self.inner.stopped.clone();
        loop {
            if self.is_stopped() {
                return;
            }
            match self.deliver_pending(entry).await {
                Ok(Progress::Finished) => {
                    if let Err(err) = self.finish(entry).await {
                        tracing::warn!(error = %err, "could not mark push deliveries finished");
                    }
                    return;
                }
                Ok(Progress::Stopped) => return,
                Ok(Progress::Waiting) => {}
                Err(err) => {
                    tracing::warn!(error = %err, "push delivery could not read the task; retrying")
                }
            }
            tokio::select! {
                () = changed(&mut updates) => {}
                () = changed(&mut stopped) => {}
                () = tokio::time::sleep(POLL_INTERVAL) => {}
            }
        }
    }

    /// Deliver every event after the cursor.
    async fn deliver_pending(&self, entry: &Active) -> AgentResult<Progress> {
        let Active { auth, task_id } = entry;
        let values = self.values();
        let events = match self.inner.reads.task_events(auth, task_id).await {
            Ok(events) => events,
            Err(AgentError::TaskNotFound { .. }) => return Ok(Progress::Finished),
            Err(err) => return Err(err),
        };
        let mut cursor: usize = values
            .load(auth, &cursor_key(task_id))
            .await?
            .and_then(|v| v.as_u64())
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(events.len());
        let configs = self.configs(auth, task_id).await?;
        if configs.is_empty() {
            return Ok(Progress::Finished);
        }
        // The posts carry the task's trace (W3C `traceparent`), under its run's span, so a
        // webhook's own spans join the run's trace.
        let trace = match self.inner.reads.task(auth, task_id).await {
            Ok(task) => RunContext::from_task(&task)
                .ok()
                .flatten()
                .map(|context| TraceParent {
                    trace_id: W3cTraceId::of(&context.trace_id),
                    span_id: keel_events::RunSpans::of(&context).run_span(),
                    sampled: true,
                }),
            Err(_) => None,
        };
        while cursor < events.len() {
            let index = cursor;
            if let Some(event) = StreamEvent::of_log(events[index].clone()) {
                let body = wire::encode_stream_event(&event);
                let kind = match event {
                    StreamEvent::ArtifactUpdate { .. } => "artifactUpdate",
                    _ => "statusUpdate",
                };
                for config in &configs {
                    match self.claim(auth, task_id, &config.id, index).await? {
                        Claim::Mine => {}
                        Claim::Done => continue,
                        // Another process is delivering it: wait for it to finish (or for
                        // its claim to lapse, should that process die) before going on, so
                        // that each config still receives the events in order.
                        Claim::Held => {
                            values
                                .save(auth, &cursor_key(task_id), json!(cursor))
                                .await?;
                            return Ok(Progress::Waiting);
                        }
                    }
                    let Some(outcome) = self.deliver(config, &body, trace).await else {
                        // Stopped mid-delivery: let the claim go, so another process (or the
                        // next server) delivers this event without waiting for it to lapse.
                        let _ = values
                            .delete(auth, &claim_key(task_id, &config.id, index))
                            .await;
                        return Ok(Progress::Stopped);
                    };
                    self.log(auth, task_id, config, kind, index, outcome)
                        .await?;
                    values
                        .save_with_ttl(
                            auth,
                            &claim_key(task_id, &config.id, index),
                            json!({"done": true}),
                            DONE_TTL,
                        )
                        .await?;
                }
            }
            cursor += 1;
            values
                .save(auth, &cursor_key(task_id), json!(cursor))
                .await?;
            if self.is_stopped() {
                return Ok(Progress::Stopped);
            }
        }
        let terminal = events.iter().any(
            |e| matches!(e, TaskEvent::StatusUpdate { status, .. } if status.state.is_terminal()),
        );
        Ok(if terminal {
            Progress::Finished
        } else {
            Progress::Waiting
        })
    }

    /// Claim the delivery of log event `index` to config `config_id` for this process.
    async fn claim(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
        config_id: &str,
        index: usize,
    ) -> AgentResult<Claim> {
        let values = self.values();
        let key = claim_key(task_id, config_id, index);
        let mine = json!({"owner": self.inner.owner});
        for _ in 0..2 {
            if values
                .claim(auth, &key, mine.clone(), self.claim_ttl())
                .await?
            {
                return Ok(Claim::Mine);
            }
            match values.load(auth, &key).await? {
                // Lapsed or released between the two calls: try once more.
                None => continue,
                Some(claim) if claim.get("done") == Some(&Value::Bool(true)) => {
                    return Ok(Claim::Done)
                }
                Some(claim) if claim == mine => return Ok(Claim::Mine),
                Some(_) => return Ok(Claim::Held),
            }
        }
        Ok(Claim::Held)
    }

    /// How long a claim holds before another process may take the delivery over: longer than
    /// every attempt of one delivery with its backoffs.
    fn claim_ttl(&self) -> Duration {
        let retry = self.inner.retry;
        (DELIVERY_TIMEOUT + retry.max_delay).saturating_mul(retry.max_attempts.max(1))
            + Duration::from_secs(30)
    }

    /// POST `body` to the config's webhook with retries; `None` when the server stopped first.
    async fn deliver(
        &self,
        config: &PushConfig,
        body: &Value,
        trace: Option<TraceParent>,
    ) -> Option<Outcome> {
        let mut waits = self.inner.retry.backoff();
        let mut stopped = self.inner.stopped.clone();
        let mut attempts = 0;
        loop {
            attempts += 1;
            let result = self.post(config, body, trace).await;
            let (retryable, outcome) = match result {
                Ok(status) if (200..300).contains(&status) => (
                    false,
                    Outcome {
                        delivered: true,
                        attempts,
                        http_status: Some(status),
                        error: None,
                    },
                ),
                Ok(status) => (
                    status == 408 || status == 429 || status >= 500,
                    Outcome {
                        delivered: false,
                        attempts,
                        http_status: Some(status),
                        error: Some(format!("the webhook answered {status}")),
                    },
                ),
                Err(Attempt::Refused(reason)) => (
                    false,
                    Outcome {
                        delivered: false,
                        attempts,
                        http_status: None,
                        error: Some(reason),
                    },
                ),
                Err(Attempt::Failed(reason)) => (
                    true,
                    Outcome {
                        delivered: false,
                        attempts,
                        http_status: None,
                        error: Some(reason),
                    },
                ),
            };
            // The waits run out with the attempts.
            let Some(wait) = waits.next().filter(|_| retryable) else {
                crate::observability::push_delivered(outcome.delivered);
                if !outcome.delivered {
                    tracing::warn!(config_id = %config.id, attempts, error = ?outcome.error, "push notification not delivered");
                }
                return Some(outcome);
            };
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = changed(&mut stopped) => return None,
            }
        }
    }

    async fn post(
        &self,
        config: &PushConfig,
        body: &Value,
        trace: Option<TraceParent>,
    ) -> Result<u16, Attempt> {
        let (url, pinned) = check_target(&config.url, &self.inner.targets)
            .await
            .map_err(Attempt::Refused)?;
        // Connect to the address that was checked, not to whatever DNS says a moment later.
        let domain = url.host_str().and_then(|h| literal_ip(h).err());
        let client = match (domain, pinned.first()) {
            (Some(domain), Some(address)) => reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .timeout(DELIVERY_TIMEOUT)
                .resolve(domain, *address)
                .build()
                .map_err(|e| Attempt::Failed(e.to_string()))?,
            _ => self.inner.http.clone(),
        };
        let mut request = client
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_string());
        if let Some(token) = &config.token {
            request = request.header(NOTIFICATION_TOKEN_HEADER, token);
        }
        if let Some(trace) = trace {
            request = request.header(TraceParent::HEADER, trace.to_string());
        }
        if let Some(auth) = &config.authentication {
            let value = match &auth.credentials {
                Some(credentials) => format!("{} {credentials}", auth.scheme),
                None => auth.scheme.clone(),
            };
            request = request.header(reqwest::header::AUTHORIZATION, value);
        }
        let response = request
            .send()
            .await
            .map_err(|e| Attempt::Failed(e.to_string()))?;
        Ok(response.status().as_u16())
    }

    async fn log(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
        config: &PushConfig,
        kind: &str,
        index: usize,
        outcome: Outcome,
    ) -> AgentResult<()> {
        let _writes = self.inner.writes.lock().await;
        let values = self.values();
        let mut log: Vec<Value> = values
            .load(auth, &log_key(task_id))
            .await?
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default();
        log.push(json!({
            "configId": config.id,
            "url": config.url,
            "event": kind,
            "logIndex": index,
            "delivered": outcome.delivered,
            "attempts": outcome.attempts,
            "httpStatus": outcome.http_status,
            "error": outcome.error,
            "at": chrono::Utc::now().to_rfc3339(),
        }));
        let excess = log.len().saturating_sub(DELIVERY_LOG_LIMIT);
        log.drain(..excess);
        values
            .save(auth, &log_key(task_id), Value::Array(log))
            .await
    }
}

enum Progress {
    /// Everything delivered; the task is terminal (or gone, or has no configs left).
    Finished,
    /// Everything delivered so far; more may come.
    Waiting,
    /// The server stopped.
    Stopped,
}

/// What became of one event for one config.
struct Outcome {
    delivered: bool,
    attempts: u32,
    http_status: Option<u16>,
    error: Option<String>,
}

enum Attempt {
    /// The SSRF guard refused the target (final).
    Refused(String),
    /// The request failed on the way (retried).
    Failed(String),
}
