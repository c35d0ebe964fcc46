//! The one handler layer behind every binding: JSON-RPC (v1.0 and the v0.3 compatibility
//! layer) and HTTP+JSON decode their requests into an [`Operation`] and its params (A2A v1.0
//! request JSON), call [`Handlers::handle`], and frame the [`Reply`] (v1.0 result JSON, or a
//! stream of v1.0 `StreamResponse` JSON) their own way. The typed operations underneath
//! (`send_message`, `list_tasks`, `subscribe`, ...) speak Keel's models; the `wire` module
//! converts. So the bindings cannot drift apart: they share everything but their framing.

use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::stream::{self, BoxStream, StreamExt};
use keel_agent::reads::{Reads, TaskQuery};
use keel_agent::{AgentExecutor, SendOptions, SendOutcome};
use keel_core::{AgentError, AgentResult, Message, RunContext, TaskEvent, TaskId, RUN_CONTEXT_KEY};
use keel_runtime::{AuthContext, TaskOrder};
use serde_json::Value;
use tokio::sync::watch;

use crate::idempotency::{self, Claim};
use crate::jsonrpc::{self, encode, Encoded, RpcError, UNSUPPORTED_OPERATION};
use crate::limits::{Admission, Limits};
use crate::push::Push;
use crate::security::{self, Denied, Security};
use crate::stream::{Follower, Start, StreamEvent};
use crate::task_list::{TaskList, TaskListQuery};
use crate::wire::{self, SendMessageCall};

/// An A2A operation, whatever binding or protocol version named it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Operation {
    SendMessage,
    SendStreamingMessage,
    GetTask,
    ListTasks,
    CancelTask,
    SubscribeToTask,
    CreatePushConfig,
    GetPushConfig,
    ListPushConfigs,
    DeletePushConfig,
    GetExtendedAgentCard,
}

impl Operation {
    /// The operation of an A2A v1.0 JSON-RPC method name.
    pub(crate) fn from_method(method: &str) -> Option<Self> {
        Some(match method {
            "SendMessage" => Self::SendMessage,
            "SendStreamingMessage" => Self::SendStreamingMessage,
            "GetTask" => Self::GetTask,
            "ListTasks" => Self::ListTasks,
            "CancelTask" => Self::CancelTask,
            "SubscribeToTask" => Self::SubscribeToTask,
            "CreateTaskPushNotificationConfig" => Self::CreatePushConfig,
            "GetTaskPushNotificationConfig" => Self::GetPushConfig,
            "ListTaskPushNotificationConfigs" => Self::ListPushConfigs,
            "DeleteTaskPushNotificationConfig" => Self::DeletePushConfig,
            "GetExtendedAgentCard" => Self::GetExtendedAgentCard,
            _ => return None,
        })
    }

    /// Whether the operation answers with a stream.
    pub(crate) fn is_streaming(self) -> bool {
        matches!(self, Self::SendStreamingMessage | Self::SubscribeToTask)
    }
}

/// A stream of v1.0 `StreamResponse` JSON values; an error ends it.
pub(crate) type ReplyStream = BoxStream<'static, Result<Value, RpcError>>;

/// What an operation answers, in A2A v1.0 JSON.
pub(crate) enum Reply {
    /// One result, as JSON text.
    Unary(Encoded),
    /// A stream of events.
    Stream(ReplyStream),
}

/// How a message was accepted.
enum Accepted {
    /// Now, by this request: what the engine answered.
    Now(SendOutcome),
    /// Before, by a request with the same `messageId`: the task it made or continued.
    Before(TaskId),
}

/// A stream of typed events; an error ends it.
pub(crate) type EventStream = BoxStream<'static, AgentResult<StreamEvent>>;

/// The operations, over one executor.
#[derive(Clone)]
pub(crate) struct Handlers {
    executor: AgentExecutor,
    /// The engine's reads (built once: the hot path takes no new handle per request).
    reads: Reads,
    /// Flips to true once the server is shutting down and its runs have stopped: open streams
    /// then read the log one last time and end.
    closing: watch::Receiver<bool>,
    /// The schemes callers must use; `None`: the runtime's auth service decides alone.
    security: Option<Security>,
    /// The extended card (A2A v1.0 JSON), for authenticated callers.
    extended_card: Option<Value>,
    /// Push notification configs and their deliverer.
    push: Push,
    /// The limits on one caller's requests.
    admission: Arc<Admission>,
}

fn rpc(err: AgentError) -> RpcError {
    RpcError::from_agent_error(&err)
}

impl Handlers {
    pub(crate) fn new(
        executor: AgentExecutor,
        closing: watch::Receiver<bool>,
        security: Option<Security>,
        extended_card: Option<Value>,
        push: Push,
        admission: Arc<Admission>,
    ) -> Self {
        Self {
            reads: executor.reads(),
            executor,
            closing,
            security,
            extended_card,
            push,
            admission,
        }
    }

    /// The executor these operations run on.
    pub(crate) fn executor(&self) -> &AgentExecutor {
        &self.executor
    }

    /// `SendMessage` from a front door beside A2A (the operator API): counted against the
    /// tenant's limit of requests in progress as [`Handlers::handle`] counts it.
    pub(crate) async fn send_admitted(
        &self,
        auth: &AuthContext,
        call: SendMessageCall,
    ) -> Result<SendOutcome, RpcError> {
        let _admitted = self.admission.admit(auth).map_err(rpc)?;
        self.send_message(auth, call).await
    }

    /// The limits on one caller's requests.
    pub(crate) fn limits(&self) -> &Limits {
        self.admission.limits()
    }

    /// A receiver of the server's closing flag (true once its runs have stopped).
    pub(crate) fn closing(&self) -> watch::Receiver<bool> {
        self.closing.clone()
    }

    /// The caller's tenant, from the request's credentials (and the tenant it routed to), or
    /// the HTTP 401 answer (`json_rpc` picks the body's shape).
    pub(crate) fn caller(
        &self,
        headers: &HeaderMap,
        tenant: Option<String>,
        json_rpc: bool,
    ) -> Result<AuthContext, Box<Response>> {
        match self.authenticate(headers, tenant) {
            Ok(context) => Ok(context),
            Err(Denied::Unauthenticated(reason)) => {
                tracing::debug!(reason, "request not authenticated");
                Err(Box::new(security::unauthorized(
                    self.security.as_ref(),
                    reason,
                    json_rpc,
                )))
            }
            Err(Denied::Failed(error)) => Err(Box::new(if json_rpc {
                (StatusCode::OK, Json(jsonrpc::failure(Value::Null, &error))).into_response()
            } else {
                crate::rest::error_response(&error)
            })),
        }
    }

    /// The caller's tenant, from the request's credentials (and the tenant it routed to), or
    /// why it was refused; each binding answers a refusal its own way.
    pub(crate) fn authenticate(
        &self,
        headers: &HeaderMap,
        tenant: Option<String>,
    ) -> Result<AuthContext, Denied> {
        let credentials = security::credentials(headers, self.security.as_ref(), tenant);
        security::authenticate(&self.reads, self.security.as_ref(), &credentials)
    }

    /// Run `operation` with its A2A v1.0 params, for the tenant `auth`, counted against the
    /// tenant's limit of requests in progress until it answers (a stream: until it starts).
    pub(crate) async fn handle(
        &self,
        auth: &AuthContext,
        operation: Operation,
        params: Value,
    ) -> Result<Reply, RpcError> {
        let _admitted = self.admission.admit(auth).map_err(rpc)?;
        self.run(auth, operation, params).await
    }

    async fn run(
        &self,
        auth: &AuthContext,
        operation: Operation,
        params: Value,
    ) -> Result<Reply, RpcError> {
        match operation {
            Operation::SendMessage => {
                let call = wire::decode_send_message(params).map_err(rpc)?;
                self.admission.check_message(&call.message).map_err(rpc)?;
                Ok(Reply::Unary(match self.send_message(auth, call).await? {
                    SendOutcome::Task(task) => {
                        tracing::debug!(task_id = %task.id, state = %task.state(), "SendMessage answered");
                        wire::encode_send_message_result(&task)
                    }
                    SendOutcome::Message(message) => {
                        tracing::debug!(message_id = %message.message_id, "SendMessage answered without a task");
                        wire::encode_send_message_reply(&message)
                    }
                }))
            }
            Operation::GetTask => {
                let (task_id, history_length) = wire::decode_get_task(params).map_err(rpc)?;
                let task = self.executor.get_task(auth, &task_id, history_length).await;
                Ok(Reply::Unary(wire::encode_task(&task.map_err(rpc)?)))
            }
            Operation::ListTasks => {
                let query = wire::decode_list_tasks(params).map_err(rpc)?;
                let list = self.list_tasks(auth, query).await.map_err(rpc)?;
                Ok(Reply::Unary(encode(&wire::encode_list_tasks_result(&list))))
            }
            Operation::CancelTask => {
                let (task_id, reason) = wire::decode_cancel_task(params).map_err(rpc)?;
                let task = self.executor.cancel_task(auth, &task_id, reason).await;
                Ok(Reply::Unary(wire::encode_task(&task.map_err(rpc)?)))
            }
            Operation::SendStreamingMessage => {
                let call = wire::decode_send_message(params).map_err(rpc)?;
                self.admission.check_message(&call.message).map_err(rpc)?;
                Ok(Reply::Stream(encode_stream(
                    self.send_streaming_message(auth, call).await?,
                )))
            }
            Operation::SubscribeToTask => {
                let task_id = wire::decode_subscribe(params).map_err(rpc)?;
                Ok(Reply::Stream(encode_stream(
                    self.subscribe(auth, &task_id).await?,
                )))
            }
            Operation::CreatePushConfig => {
                let config = wire::decode_create_push_config(params).map_err(rpc)?;
                let config = self.push.create(auth, config, None).await?;
                Ok(Reply::Unary(encode(&wire::encode_push_config(&config))))
            }
            Operation::GetPushConfig => {
                let (task_id, config_id) = wire::decode_push_config_ref(params).map_err(rpc)?;
                let config = self.push.get(auth, &task_id, &config_id).await?;
                Ok(Reply::Unary(encode(&wire::encode_push_config(&config))))
            }
            Operation::ListPushConfigs => {
                let task_id = wire::decode_list_push_configs(params).map_err(rpc)?;
                let configs = self.push.list(auth, &task_id).await?;
                Ok(Reply::Unary(encode(&wire::encode_list_push_configs(
                    &configs,
                ))))
            }
            Operation::DeletePushConfig => {
                let (task_id, config_id) = wire::decode_push_config_ref(params).map_err(rpc)?;
                self.push.delete(auth, &task_id, &config_id).await?;
                Ok(Reply::Unary(encode(&serde_json::Map::new())))
            }
            // The card says `extendedAgentCard: false`: A2A v1.0 (3.3.4) answers that with
            // UnsupportedOperationError; -32007 is for agents that declare one but lack it.
            Operation::GetExtendedAgentCard => match &self.extended_card {
                Some(card) => Ok(Reply::Unary(encode(card))),
                None => Err(RpcError::new(
                    UNSUPPORTED_OPERATION,
                    "this agent offers no extended agent card",
                )
                .with("extendedAgentCard", "false")),
            },
        }
    }

    /// Remote delegation: a delegating Keel agent sends its child run's context in the
    /// message's metadata under `run_context` (brief decision 2). Take it out of the message
    /// and adopt it for the run here: same trace, workspace, permissions, budget and
    /// `parent_run_id`, this agent appended to `agent_chain`. The run's thread is this task's
    /// own A2A context; the sender's thread is kept as `metadata.parent_thread_id`. A context
    /// that does not decode is InvalidParams naming the field
    /// (`message.metadata.run_context.budget.max_steps`). Permissions only narrow: they combine
    /// with this agent's policy by the most restrictive result (decision 13), and the engine
    /// refuses a context that would change a continuing task's permissions.
    ///
    /// A caller's W3C `traceparent` (any binding) puts the run of a new task in the caller's
    /// trace, under the caller's span; a carried context that names its parent span already
    /// (a Keel agent's delegation) keeps it.
    fn take_run_context(&self, message: &mut Message) -> Result<Option<RunContext>, RpcError> {
        let carried = self.carried_run_context(message)?;
        let caller = crate::observability::caller_trace();
        Ok(match (carried, caller) {
            (Some(ctx), Some((parent, state))) if ctx.parent_span_id.is_none() => {
                Some(ctx.continuing_trace(&parent, state))
            }
            (None, Some((parent, state))) if message.task_id.is_none() => Some(
                RunContext::new()
                    .with_agent(self.executor.agent().card().name.clone())
                    .continuing_trace(&parent, state),
            ),
            (carried, _) => carried,
        })
    }

    /// The run context a delegating Keel agent put in the message, adopted for this agent.
    fn carried_run_context(&self, message: &mut Message) -> Result<Option<RunContext>, RpcError> {
        let Some(value) = message.metadata.remove(RUN_CONTEXT_KEY) else {
            return Ok(None);
        };
        if value.is_null() {
            return Ok(None);
        }
        let mut ctx: RunContext = serde_path_to_error::deserialize(&value).map_err(|err| {
            let path = err.path().to_string();
            let field = if path == "." {
                format!("message.metadata.{RUN_CONTEXT_KEY}")
            } else {
                format!("message.metadata.{RUN_CONTEXT_KEY}.{path}")
            };
            rpc(AgentError::invalid_input(field, err.inner().to_string()))
        })?;
        // Cancellation is the sender's CancelTask, never a flag it sets on a new run.
        ctx.canceled = false;
        ctx.cancel_reason = None;
        if let Some(parent_thread) = ctx.thread_id.take() {
            ctx.metadata
                .entry("parent_thread_id")
                .or_insert_with(|| Value::String(parent_thread.as_str().to_owned()));
        }
        let agent = &self.executor.agent().card().name;
        if ctx.agent_chain.last() != Some(agent) {
            ctx.agent_chain.push(agent.clone());
        }
        Ok(Some(ctx))
    }

    /// `SendMessage`: blocking unless `return_immediately`. The answer is the task, or the
    /// agent's message when it answered without one. A repeat of a message already accepted
    /// (same `messageId`, see `idempotency`) answers with the task it made, in its current
    /// state (blocking: once the turn it started rests), and starts nothing.
    pub(crate) async fn send_message(
        &self,
        auth: &AuthContext,
        call: SendMessageCall,
    ) -> Result<SendOutcome, RpcError> {
        let message_id = call.message.message_id.clone();
        let history_length = call.history_length;
        let blocking = !call.return_immediately;
        let with_push = call.push_config.is_some();
        let task_id = match self.accept(auth, call, !blocking || with_push).await? {
            // With a push config the message was accepted without waiting: wait as a stream
            // would, from this turn on.
            Accepted::Now(SendOutcome::Task(task)) if blocking && with_push => task.id,
            Accepted::Now(outcome) => return Ok(outcome),
            Accepted::Before(task_id) if blocking => task_id,
            Accepted::Before(task_id) => {
                let task = self.executor.get_task(auth, &task_id, history_length).await;
                return Ok(SendOutcome::Task(Box::new(task.map_err(rpc)?)));
            }
        };
        let mut turn = self.follow(auth.clone(), task_id.clone(), None, Start::Turn(message_id));
        while let Some(event) = turn.next().await {
            event.map_err(rpc)?;
        }
        let task = self
            .executor
            .get_task(auth, &task_id, history_length)
            .await
            .map_err(rpc)?;
        Ok(SendOutcome::Task(Box::new(task)))
    }

    /// Accept a message once per `messageId`: hand it to the engine (waiting for its run
    /// unless `return_immediately`; with a push config, never), or find the task an earlier
    /// request with the same id made. An error after the new task was created names it.
    async fn accept(
        &self,
        auth: &AuthContext,
        mut call: SendMessageCall,
        return_immediately: bool,
    ) -> Result<Accepted, RpcError> {
        let message_id = call.message.message_id.clone();
        let continues = call.message.task_id.clone();
        let reserved = if continues.is_none() && !message_id.as_str().is_empty() {
            let agent = &self.executor.agent().card().name;
            match idempotency::claim(&self.reads, auth, agent, message_id.as_str())
                .await
                .map_err(rpc)?
            {
                Claim::Seen(task_id) => {
                    tracing::debug!(%task_id, "a repeated message id answered with its task");
                    return Ok(Accepted::Before(task_id));
                }
                Claim::Fresh(task_id) => Some(task_id),
            }
        } else {
            None
        };
        let accepted = match call.push_config.take() {
            Some(push_config) => {
                self.push.check_url(&push_config.url).await?;
                self.accept_with_push(auth, call, push_config, reserved.clone())
                    .await
            }
            None => {
                let options = SendOptions {
                    return_immediately,
                    history_length: call.history_length,
                    run_context: self.take_run_context(&mut call.message)?,
                    task_id: reserved.clone(),
                };
                self.executor
                    .send(auth, call.message, options)
                    .await
                    .map_err(rpc)
            }
        };
        match accepted {
            Ok(outcome) => {
                if let (SendOutcome::Message(_), Some(_)) = (&outcome, &reserved) {
                    // No task, nothing to return to a repeat: it is answered anew at once.
                    self.release_claim(auth, &message_id).await;
                }
                Ok(Accepted::Now(outcome))
            }
            // A repeated answer to a waiting task: the task has moved on, and its log holds
            // the message.
            Err(error) => match continues {
                Some(task_id)
                    if idempotency::holds_message(
                        &self.reads,
                        auth,
                        &task_id,
                        message_id.as_str(),
                    )
                    .await
                    .unwrap_or(false) =>
                {
                    Ok(Accepted::Before(task_id))
                }
                _ => Err(self
                    .name_created_task(auth, error, reserved, &message_id)
                    .await),
            },
        }
    }

    /// `error`, which ended a send whose new task was to take the id `reserved`, naming that
    /// task when it was created (or may have been: the store could not say), so that the
    /// caller neither believes nothing was done nor repeats a side effect by sending anew.
    async fn name_created_task(
        &self,
        auth: &AuthContext,
        error: RpcError,
        reserved: Option<TaskId>,
        message_id: &keel_core::MessageId,
    ) -> RpcError {
        let Some(task_id) = reserved else {
            return error;
        };
        let created = match self.reads.task(auth, &task_id).await {
            Ok(_) => Some(true),
            Err(AgentError::TaskNotFound { .. }) => Some(false),
            Err(_) => None,
        };
        let unavailable = error.code == jsonrpc::STORE_UNAVAILABLE;
        let mut named = match created {
            Some(false) => {
                // Refused before anything was stored (a full queue, an invalid message): a
                // repeat is a new attempt, answered at once rather than after the claim's
                // grace for a request still creating its task.
                self.release_claim(auth, message_id).await;
                return error;
            }
            Some(true) if unavailable => RpcError {
                message: format!(
                    "store unavailable: task {task_id} was created, but the answer could not be made; send the same messageId again (or GetTask {task_id}) for its state"
                ),
                ..error
            },
            None if unavailable => RpcError {
                message: format!(
                    "store unavailable: task {task_id} may have been created; send the same messageId again to get it (it never runs twice)"
                ),
                ..error
            },
            _ => error,
        };
        named.message = jsonrpc::bounded(named.message);
        named.with("taskId", task_id.as_str())
    }

    /// Drop this agent's claim of `message_id` (see `idempotency`); a failure only leaves a
    /// repeat to wait out the claim's grace.
    async fn release_claim(&self, auth: &AuthContext, message_id: &keel_core::MessageId) {
        let agent = &self.executor.agent().card().name;
        if let Err(error) =
            idempotency::release(&self.reads, auth, agent, message_id.as_str()).await
        {
            tracing::debug!(%error, "a message id's claim could not be released");
        }
    }

    /// Accept a message (without waiting for its run) and register its push config, which
    /// then delivers every update from the message on. An agent that answers without a task
    /// has nothing to push: the config is not kept.
    async fn accept_with_push(
        &self,
        auth: &AuthContext,
        mut call: SendMessageCall,
        mut push_config: crate::push_config::PushConfig,
        task_id: Option<TaskId>,
    ) -> Result<SendOutcome, RpcError> {
        let message_id = call.message.message_id.clone();
        let options = SendOptions {
            return_immediately: true,
            history_length: call.history_length,
            run_context: self.take_run_context(&mut call.message)?,
            task_id,
        };
        let task = match self
            .executor
            .send(auth, call.message, options)
            .await
            .map_err(rpc)?
        {
            SendOutcome::Task(task) => task,
            reply @ SendOutcome::Message(_) => return Ok(reply),
        };
        let events = self.reads.task_events(auth, &task.id).await.map_err(rpc)?;
        let from = events.iter().position(
            |e| matches!(e, TaskEvent::Message { message } if message.message_id == message_id),
        );
        push_config.task_id = task.id.clone();
        self.push.create(auth, push_config, from).await?;
        Ok(SendOutcome::Task(task))
    }

    /// `ListTasks`: most recently updated first (by status timestamp), as A2A requires.
    ///
    /// The store pages that order on its own index ([`TaskOrder::RecentlyUpdated`], with
    /// `statusTimestampAfter` as its bound), so a page costs the same however many tasks the
    /// tenant has; the page token is the store's. Only the page's tasks are read again, with
    /// their history.
    pub(crate) async fn list_tasks(
        &self,
        auth: &AuthContext,
        query: TaskListQuery,
    ) -> AgentResult<TaskList> {
        let page_size = query
            .page_size
            .unwrap_or(TaskListQuery::DEFAULT_PAGE_SIZE)
            .clamp(1, TaskListQuery::MAX_PAGE_SIZE);
        let filter = TaskQuery {
            thread_id: query.thread_id.clone(),
            state: query.state,
            page_size: Some(page_size),
            page_token: query.page_token,
            order: TaskOrder::RecentlyUpdated {
                since: query.status_timestamp_after,
            },
            ..TaskQuery::default()
        };
        let listed = self
            .reads
            .tasks(auth, &filter)
            .await
            .map_err(|err| match err {
                AgentError::InvalidInput { field, reason } if field == "page_token" => {
                    AgentError::invalid_input("pageToken", reason)
                }
                other => other,
            })?;
        let mut page = Vec::with_capacity(listed.items.len());
        for task in &listed.items {
            let mut task = match self
                .executor
                .get_task(auth, &task.id, query.history_length)
                .await
            {
                Ok(task) => task,
                // Evicted between the listing and now: leave it out.
                Err(AgentError::TaskNotFound { .. }) => continue,
                Err(err) => return Err(err),
            };
            if !query.include_artifacts {
                task.artifacts.clear();
            }
            page.push(task);
        }
        Ok(TaskList {
            tasks: page,
            next_page_token: listed.next_page_token,
            page_size,
            total_size: listed.total_size,
        })
    }

    /// `SendStreamingMessage`: accept the message (the run goes on in the engine) and follow
    /// the task from this turn on; an agent that answers without a task streams its message
    /// as the one event. A repeat of a message already accepted follows the task it made,
    /// from that message's turn.
    pub(crate) async fn send_streaming_message(
        &self,
        auth: &AuthContext,
        mut call: SendMessageCall,
    ) -> Result<EventStream, RpcError> {
        let auth = auth.clone();
        let message_id = call.message.message_id.clone();
        let history_length = call.history_length;
        // The stream carries the history: the engine's answer needs none.
        call.history_length = None;
        let task_id = match self.accept(&auth, call, true).await? {
            Accepted::Now(SendOutcome::Task(task)) => task.id,
            Accepted::Now(SendOutcome::Message(message)) => {
                tracing::debug!(message_id = %message.message_id, "SendStreamingMessage answered without a task");
                return Ok(stream::iter([Ok(StreamEvent::Message(message))]).boxed());
            }
            Accepted::Before(task_id) => task_id,
        };
        tracing::debug!(%task_id, "SendStreamingMessage accepted");
        Ok(self.follow(auth, task_id, history_length, Start::Turn(message_id)))
    }

    /// `SubscribeToTask`: a terminal task is UnsupportedOperationError (A2A v1.0, 3.1.6).
    pub(crate) async fn subscribe(
        &self,
        auth: &AuthContext,
        task_id: &TaskId,
    ) -> Result<EventStream, RpcError> {
        let auth = auth.clone();
        let task = self.reads.task(&auth, task_id).await.map_err(rpc)?;
        if task.state().is_terminal() {
            return Err(RpcError::new(
                UNSUPPORTED_OPERATION,
                format!(
                    "task {task_id} is {} (terminal): there is nothing to subscribe to",
                    task.state()
                ),
            )
            .with("taskId", task_id.as_str())
            .with("state", wire::state_name(task.state())));
        }
        Ok(self.follow(auth, task_id.clone(), None, Start::Subscription))
    }

    fn follow(
        &self,
        auth: AuthContext,
        task_id: TaskId,
        history_length: Option<usize>,
        start: Start,
    ) -> EventStream {
        let follower = Follower::new(
            self.reads.clone(),
            auth,
            task_id,
            history_length,
            start,
            self.closing.clone(),
        );
        stream::unfold(follower, |mut follower| async move {
            follower.next().await.map(|item| (item, follower))
        })
        .boxed()
    }
}

fn encode_stream(events: EventStream) -> ReplyStream {
    events
        .map(|item| {
            item.map(|event| wire::encode_stream_event(&event))
                .map_err(rpc)
        })
        .boxed()
}
