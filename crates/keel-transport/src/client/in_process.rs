//! The in-process binding of the client (seed 001's `runtime` transport type): calls a local
//! [`AgentExecutor`] through the same handler layer the A2A server uses, with no HTTP, so its
//! answers and errors are those a remote [`A2aClient`](crate::A2aClient) gets.

use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt;
use keel_agent::{AgentExecutor, SendOutcome};
use keel_core::{AgentCard, AgentError, AgentResult, TaskId};
use keel_runtime::{AuthContext, Credentials};
use tokio::sync::watch;

use super::binding::{ClientBinding, Failure, Reply, Request, StreamRequest};
use crate::handlers::{EventStream, Handlers};
use crate::jsonrpc::{self, RpcError};
use crate::limits::{Admission, Limits};
use crate::push::{Push, RetryPolicy};
use crate::transport::TaskEventStream;
use crate::wire::SendMessageCall;

/// The in-process binding of [`A2aClient`](crate::A2aClient): every call goes through the
/// server's handler layer (the code both HTTP bindings share) straight to the
/// [`AgentExecutor`], so the semantics (blocking, `historyLength`, list order and paging,
/// cancel rules, stream framing and its end) and the typed errors are exactly the remote
/// client's, without HTTP or JSON.
///
/// Calls run as one tenant: by default the one the runtime's auth service grants a caller
/// without credentials (as the server does for an unauthenticated request), or the one given
/// with [`A2aClient::with_auth`](crate::A2aClient::with_auth).
#[derive(Clone)]
pub struct InProcessBinding {
    handlers: Handlers,
    executor: AgentExecutor,
    auth: AuthContext,
    /// Held so that streams never see the server closing: they end with their task.
    _closing: watch::Sender<bool>,
    /// Held so that push deliveries are never told to stop.
    _push_stop: watch::Sender<bool>,
}

impl std::fmt::Debug for InProcessBinding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcessBinding")
            .field("agent", &self.executor.agent().card().name)
            .field("auth", &self.auth)
            .finish_non_exhaustive()
    }
}

impl InProcessBinding {
    pub(crate) fn new(executor: AgentExecutor) -> AgentResult<Self> {
        let auth = executor
            .reads()
            .authenticate(&Credentials::default())?
            .ok_or_else(|| AgentError::Unsupported {
                what: "an anonymous caller (the runtime's auth service accepts none; use \
                       InProcessClient::with_auth)"
                    .into(),
            })?;
        Ok(Self::with_auth(executor, auth))
    }

    pub(crate) fn with_auth(executor: AgentExecutor, auth: AuthContext) -> Self {
        let (closing, closed) = watch::channel(false);
        let (push_stop, push_stopped) = watch::channel(false);
        let push = Push::new(
            executor.clone(),
            crate::push::TargetPolicy::default(),
            RetryPolicy::default(),
            push_stopped,
        );
        Self {
            handlers: Handlers::new(
                executor.clone(),
                closed,
                None,
                None,
                push,
                Arc::new(Admission::new(Limits::default())),
            ),
            executor,
            auth,
            _closing: closing,
            _push_stop: push_stop,
        }
    }

    pub(crate) fn executor(&self) -> &AgentExecutor {
        &self.executor
    }

    pub(crate) fn auth(&self) -> &AuthContext {
        &self.auth
    }
}

#[async_trait]
impl ClientBinding for InProcessBinding {
    async fn card(&self) -> Result<AgentCard, Failure> {
        Ok(self.executor.agent().card().clone())
    }

    async fn send(&self, request: Request) -> Result<Reply, Failure> {
        let auth = &self.auth;
        let handlers = &self.handlers;
        Ok(match request {
            Request::SendMessage { message, options } => {
                let task_id = message.task_id.clone();
                let call = SendMessageCall {
                    message,
                    return_immediately: options.return_immediately,
                    history_length: options.history_length,
                    push_config: None,
                };
                match handlers
                    .send_message(auth, call)
                    .await
                    .map_err(|e| typed(&e, task_id.as_ref()))?
                {
                    SendOutcome::Task(task) => Reply::Task(task),
                    // The client's calls answer tasks; a reply without one has no place yet.
                    SendOutcome::Message(_) => {
                        return Err(Failure::from(AgentError::Unsupported {
                            what: "a reply without a task, in this client".into(),
                        }))
                    }
                }
            }
            Request::GetTask {
                task_id,
                history_length,
            } => Reply::Task(Box::new(
                handlers
                    .executor()
                    .get_task(auth, &task_id, history_length)
                    .await
                    .map_err(|e| retyped(&e, Some(&task_id)))?,
            )),
            Request::ListTasks(query) => Reply::Tasks(
                handlers
                    .list_tasks(auth, query)
                    .await
                    .map_err(|e| retyped(&e, None))?,
            ),
            Request::CancelTask { task_id, reason } => Reply::Task(Box::new(
                handlers
                    .executor()
                    .cancel_task(auth, &task_id, reason)
                    .await
                    .map_err(|e| retyped(&e, Some(&task_id)))?,
            )),
        })
    }

    async fn open_stream(&self, request: StreamRequest) -> AgentResult<TaskEventStream> {
        let auth = &self.auth;
        match request {
            StreamRequest::SendStreamingMessage(message) => {
                let task_id = message.task_id.clone();
                let call = SendMessageCall {
                    message,
                    return_immediately: false,
                    history_length: None,
                    push_config: None,
                };
                let events = self
                    .handlers
                    .send_streaming_message(auth, call)
                    .await
                    .map_err(|e| typed(&e, task_id.as_ref()))?;
                Ok(retyped_stream(events, task_id))
            }
            StreamRequest::Subscribe(task_id) => {
                let events = self
                    .handlers
                    .subscribe(auth, &task_id)
                    .await
                    .map_err(|e| typed(&e, Some(&task_id)))?;
                Ok(retyped_stream(events, Some(task_id)))
            }
        }
    }
}

/// An A2A error as the remote client types it (through its JSON-RPC error object), so both
/// clients answer the same [`AgentError`] variants.
fn typed(error: &RpcError, task_id: Option<&TaskId>) -> AgentError {
    jsonrpc::agent_error_from_rpc(&error.to_json(), task_id)
}

/// An engine error as the remote client types it: the same variant, keeping the engine's own
/// error (and its message) when the wire would not change its variant.
fn retyped(error: &AgentError, task_id: Option<&TaskId>) -> AgentError {
    let remote = typed(&RpcError::from_agent_error(error), task_id);
    if std::mem::discriminant(&remote) == std::mem::discriminant(error) {
        error.clone()
    } else {
        remote
    }
}

fn retyped_stream(events: EventStream, task_id: Option<TaskId>) -> TaskEventStream {
    events
        .map(move |item| item.map_err(|e| retyped(&e, task_id.as_ref())))
        .boxed()
}
