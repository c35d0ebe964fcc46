//! Asynchronous tools in the engine: dispatch a call, resume a run with its result or its
//! timeout, and accept a callback's delivery.

use chrono::Utc;
use keel_core::{
    AgentError, AgentResult, Message, Part, Role, RunContext, StatusKind, TaskEvent, TaskId,
    TaskState, TaskStatus, ThreadId,
};
use keel_events::payload::{
    ToolAsyncAcknowledgedPayload, ToolAsyncDeadlinePayload, ToolAsyncProgressPayload,
    ToolAsyncResultPayload,
};
use keel_events::RunEvent;
use keel_llm::ToolCall;
use keel_runtime::AuthContext;
use serde_json::{json, Value};

use super::run::RunLoop;
use super::state::*;
use crate::async_tools::{self as at, PendingCall};
use crate::task_meta::EngineMeta;

impl Inner {
    /// Queue `task_id` again if it still rests waiting for the asynchronous call `call_id`.
    pub(super) async fn requeue_if_waiting_for(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        task_id: &TaskId,
        call_id: &str,
    ) -> AgentResult<()> {
        let Some(task) = self.runtime.task_manager().get_task(auth, task_id).await? else {
            return Ok(());
        };
        let meta = EngineMeta::of(&task.metadata);
        let waiting = task.state() == TaskState::Working
            && meta.stop_reason.as_deref() == Some("awaiting_tool")
            && meta.awaiting_tool_call.as_deref() == Some(call_id);
        if waiting {
            self.enqueue_task(auth, thread_id, task_id).await?;
        }
        Ok(())
    }

    /// Best effort in this process: at `deadline` the task runs again and a call still pending
    /// ends as a timeout. Armed at dispatch and again whenever a run finds the call still
    /// pending (so a process that starts after the dispatching one exited times it out too);
    /// any later run of the task sees the deadline as well.
    pub(super) fn arm_deadline(
        &self,
        auth: &AuthContext,
        thread_id: &ThreadId,
        task_id: &TaskId,
        deadline: chrono::DateTime<Utc>,
    ) {
        let Some(me) = self.me.upgrade() else {
            return;
        };
        let wait = (deadline - Utc::now()).to_std().unwrap_or_default();
        let (auth, thread_id, task_id) = (auth.clone(), thread_id.clone(), task_id.clone());
        let stop = self.driver.shutting_down.clone();
        self.driver.tracker.spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = stop.cancelled() => return,
            }
            let _ = me
                .enqueue(&auth, &thread_id, QueuedWork::Task { task_id })
                .await;
        });
    }
}

impl RunLoop<'_> {
    /// Dispatch an asynchronous call: persist the pending call and its link from the model's
    /// tool call (before the tool can call back), send the invocation, and arm a local timer
    /// for the deadline.
    pub(super) async fn dispatch_async(
        &self,
        call: &ToolCall,
        dispatch: &dyn crate::AsyncDispatch,
    ) -> ToolRun {
        let inner = self.inner;
        use keel_runtime::{AsyncCall, AsyncCallState};
        let failed = |message: String| ToolRun::Done {
            output: json!(message),
            is_error: true,
        };
        let Some(callbacks) = inner.config.callbacks.as_deref() else {
            return failed(format!(
                "`{}` is asynchronous but no callback URL is configured",
                call.name
            ));
        };
        let (auth, ctx) = (&self.flow.auth, &self.ctx);
        let secret = at::new_secret();
        let call_id = at::new_call_id();
        let timeout = dispatch
            .timeout()
            .unwrap_or(inner.config.async_tool_timeout);
        // A timeout too long to represent never ends (rather than overflowing the clock).
        let deadline = chrono::Duration::from_std(timeout)
            .ok()
            .and_then(|t| Utc::now().checked_add_signed(t))
            .unwrap_or(chrono::DateTime::<Utc>::MAX_UTC);
        let record = PendingCall {
            task_id: ctx.task_id.clone(),
            tool_call_id: call.id.clone(),
            tool: call.name.clone(),
            secret_sha256: at::hash_secret(&secret),
            deadline,
            output: None,
            is_error: false,
        };
        let calls = inner.runtime.async_call_store();
        let store = inner.runtime.thread_store();
        let persisted = async {
            let pending = AsyncCall {
                call_id: call_id.clone(),
                auth: auth.clone(),
                thread_id: ctx.thread_id.clone(),
                state: AsyncCallState::Pending,
                record: serde_json::to_value(&record).map_err(AgentError::internal)?,
            };
            calls.put_async_call(&pending).await?;
            store
                .kv_set(
                    auth,
                    &ctx.thread_id,
                    &at::link_key(&call.id),
                    json!({ "call_id": call_id }),
                )
                .await
        }
        .await;
        if let Err(err) = persisted {
            return failed(format!("cannot record the pending call: {err}"));
        }
        let invocation = crate::AsyncInvocation {
            tool: call.name.clone(),
            call_id: call_id.clone(),
            arguments: call.arguments.clone(),
            callback_url: callbacks.callback_url(&call_id),
            callback_secret: secret,
            group_id: ctx.thread_id.as_str().to_owned(),
            user_id: Some(auth.user_name.clone()),
        };
        self.obs
            .emit(RunEvent::tool_async_dispatched(ToolAsyncDeadlinePayload {
                call_id: call_id.clone(),
                tool_call_id: call.id.clone(),
                tool: call.name.clone(),
                deadline,
            }))
            .await;
        if let Err(err) = dispatch.dispatch(&invocation, callbacks).await {
            // Not acknowledged: the call is over (a callback for it is late) and the model
            // sees the failure now.
            let _ = calls
                .transition_async_call(
                    auth,
                    &call_id,
                    AsyncCallState::Pending,
                    AsyncCallState::Expired,
                    serde_json::to_value(&record).unwrap_or(Value::Null),
                )
                .await;
            let _ = store
                .kv_set(auth, &ctx.thread_id, &at::link_key(&call.id), Value::Null)
                .await;
            return failed(err.to_string());
        }
        self.obs
            .emit(RunEvent::tool_async_acknowledged(
                ToolAsyncAcknowledgedPayload {
                    call_id: call_id.clone(),
                    tool_call_id: call.id.clone(),
                    tool: call.name.clone(),
                },
            ))
            .await;
        inner.arm_deadline(auth, &ctx.thread_id, &ctx.task_id, deadline);
        ToolRun::Pending { call_id }
    }

    /// The state of an asynchronous call on resume: `None` when it is not one; `Pending`
    /// while it waits; its result when delivered (event `tool.async.result`); a timeout error
    /// past its deadline (event `tool.async.timed_out`).
    pub(super) async fn async_result(&self, call: &ToolCall) -> AgentResult<Option<ToolRun>> {
        use keel_runtime::AsyncCallState;
        let (inner, flow) = (self.inner, self.flow);
        let link = inner
            .runtime
            .thread_store()
            .kv_get(&flow.auth, &flow.thread_id, &at::link_key(&call.id))
            .await?;
        let Some(call_id) = link
            .as_ref()
            .and_then(|v| v.get("call_id"))
            .and_then(Value::as_str)
        else {
            return Ok(None);
        };
        let calls = inner.runtime.async_call_store();
        let Some(mut pending) = calls.find_async_call(call_id).await? else {
            return Ok(None);
        };
        let record = pending_record(&pending)?;
        if pending.state == AsyncCallState::Pending && Utc::now() >= record.deadline {
            // Expire with the same compare-and-set a delivery uses: if a result won the race,
            // it is the one the model sees.
            let expired = calls
                .transition_async_call(
                    &flow.auth,
                    call_id,
                    AsyncCallState::Pending,
                    AsyncCallState::Expired,
                    pending.record.clone(),
                )
                .await?;
            if !expired {
                pending = calls.find_async_call(call_id).await?.ok_or_else(|| {
                    AgentError::storage(format!("asynchronous call `{call_id}` vanished"))
                })?;
            } else {
                pending.state = AsyncCallState::Expired;
            }
        }
        let run = match pending.state {
            AsyncCallState::Pending => {
                inner.arm_deadline(
                    &flow.auth,
                    &flow.thread_id,
                    &record.task_id,
                    record.deadline,
                );
                ToolRun::Pending {
                    call_id: call_id.to_owned(),
                }
            }
            AsyncCallState::Delivered => {
                let delivered = pending_record(&pending)?;
                self.obs
                    .emit(RunEvent::tool_async_result(ToolAsyncResultPayload {
                        call_id: call_id.to_owned(),
                        tool_call_id: call.id.clone(),
                        tool: call.name.clone(),
                        is_error: delivered.is_error,
                    }))
                    .await;
                ToolRun::Done {
                    output: delivered.output.unwrap_or(Value::Null),
                    is_error: delivered.is_error,
                }
            }
            AsyncCallState::Expired => {
                self.obs
                    .emit(RunEvent::tool_async_timed_out(ToolAsyncDeadlinePayload {
                        call_id: call_id.to_owned(),
                        tool_call_id: call.id.clone(),
                        tool: call.name.clone(),
                        deadline: record.deadline,
                    }))
                    .await;
                ToolRun::Done {
                    output: json!(format!(
                        "asynchronous tool `{}` timed out: no result arrived by {}",
                        call.name, record.deadline
                    )),
                    is_error: true,
                }
            }
        };
        Ok(Some(run))
    }
}

impl AgentExecutor {
    /// The asynchronous call `call_id` and its record, once `secret` proves the caller may
    /// deliver to it: the check every callback passes first. The call is found by its id
    /// alone, in whichever tenant dispatched it; the secret is checked before anything about
    /// the call's state is answered, so without it a caller learns nothing.
    async fn authenticated_call(
        &self,
        call_id: &str,
        secret: &str,
    ) -> Result<(keel_runtime::AsyncCall, PendingCall), crate::CallbackError> {
        use crate::CallbackError;
        let Some(call) = self
            .inner
            .runtime
            .async_call_store()
            .find_async_call(call_id)
            .await?
        else {
            return Err(CallbackError::UnknownCall {
                call_id: call_id.to_owned(),
            });
        };
        let record = pending_record(&call)?;
        if !at::same(&at::hash_secret(secret), &record.secret_sha256) {
            return Err(CallbackError::Forbidden {
                call_id: call_id.to_owned(),
            });
        }
        Ok((call, record))
    }

    /// Asynchronous tools: deliver a callback's result for the call `call_id`, in whichever
    /// tenant dispatched it: the call is found by its id alone and the secret, the one sent
    /// with the invocation, is the credential. An unknown call, a wrong secret, a late result
    /// (past the deadline, or the task already ended) and a second delivery are refused with a
    /// [`CallbackError`](crate::CallbackError) and change nothing; of concurrent deliveries
    /// exactly one is accepted (a compare-and-set in the store). An accepted one is recorded
    /// and its task queued on its thread, where it resumes in order.
    pub async fn deliver_tool_result(
        &self,
        call_id: &str,
        secret: &str,
        output: Value,
        is_error: bool,
    ) -> Result<crate::AcceptedCallback, crate::CallbackError> {
        use crate::CallbackError;
        use keel_runtime::AsyncCallState;
        let inner = &self.inner;
        let calls = inner.runtime.async_call_store();
        let (call, mut record) = self.authenticated_call(call_id, secret).await?;
        let late = || CallbackError::Late {
            call_id: call_id.to_owned(),
        };
        let refusal = |state: AsyncCallState| match state {
            AsyncCallState::Delivered => CallbackError::Duplicate {
                call_id: call_id.to_owned(),
            },
            _ => late(),
        };
        if call.state != AsyncCallState::Pending {
            if call.state == AsyncCallState::Delivered {
                // A process that accepted the result may have died before it queued the
                // task; the tool's retry (same secret) queues it again. Harmless otherwise.
                inner
                    .requeue_if_waiting_for(&call.auth, &call.thread_id, &record.task_id, call_id)
                    .await?;
            }
            return Err(refusal(call.state));
        }
        if Utc::now() >= record.deadline {
            return Err(late());
        }
        let task = inner
            .runtime
            .task_manager()
            .get_task(&call.auth, &record.task_id)
            .await?;
        if task.is_none_or(|t| t.state().is_terminal()) {
            return Err(late());
        }
        record.output = Some(output);
        record.is_error = is_error;
        let moved = calls
            .transition_async_call(
                &call.auth,
                call_id,
                AsyncCallState::Pending,
                AsyncCallState::Delivered,
                serde_json::to_value(&record).map_err(AgentError::internal)?,
            )
            .await?;
        if !moved {
            // Another delivery (or the timeout) got there first; say which.
            let now = calls
                .find_async_call(call_id)
                .await?
                .map_or(AsyncCallState::Expired, |c| c.state);
            return Err(refusal(now));
        }
        inner
            .enqueue_task(&call.auth, &call.thread_id, &record.task_id)
            .await?;
        Ok(crate::AcceptedCallback {
            auth: call.auth,
            thread_id: call.thread_id,
            task_id: record.task_id,
        })
    }

    /// Accept a subscription event of the asynchronous call `call_id` (seed 004: tool
    /// results, subscription events and user messages all arrive through the same input
    /// channel). Checked as a result is (an unknown call, a wrong secret refused the same
    /// way), and taken while the call waits for its result or after it (a subscription's
    /// events follow its acknowledgement); a call past its deadline, or timed out, is
    /// [`CallbackError::Late`](crate::CallbackError::Late). An accepted event is queued
    /// durably on the call's thread as a user message (the event as text, strings bare;
    /// `metadata.tool` and `metadata.subscription_call` name where it came from) and wakes the
    /// model: a run in its step loop takes it before its next model call, an idle thread
    /// starts a turn with it. Unlike a progress report, the model sees it.
    pub async fn deliver_subscription_event(
        &self,
        call_id: &str,
        secret: &str,
        event: Value,
    ) -> Result<crate::AcceptedCallback, crate::CallbackError> {
        use keel_runtime::AsyncCallState;
        let (call, record) = self.authenticated_call(call_id, secret).await?;
        let open = match call.state {
            AsyncCallState::Pending => Utc::now() < record.deadline,
            AsyncCallState::Delivered => true,
            AsyncCallState::Expired => false,
        };
        if !open {
            return Err(crate::CallbackError::Late {
                call_id: call_id.to_owned(),
            });
        }
        let mut message = Message::user(render(&event)).in_thread(call.thread_id.clone());
        message.metadata.insert("tool".into(), json!(record.tool));
        message
            .metadata
            .insert("subscription_call".into(), json!(call_id));
        self.thread(&call.auth, call.thread_id.clone())
            .queue(QueuedWork::Message { message })
            .await?;
        Ok(crate::AcceptedCallback {
            auth: call.auth,
            thread_id: call.thread_id,
            task_id: record.task_id,
        })
    }

    /// Accept a progress report of the asynchronous call `call_id` (RAP's callbacks of kind
    /// "event"), checked as [`AgentExecutor::deliver_tool_result`] checks a result: an unknown
    /// call, a wrong secret and a late report are refused the same way, and a report after
    /// the call's result is [`CallbackError::AfterResult`](crate::CallbackError::AfterResult).
    /// An accepted report is appended to the task's log as a `working` status update (its
    /// message: `progress` as a data part, `metadata.status_kind = tool_progress`), which the
    /// task's stream and push subscribers see, and is emitted as `tool.async.progress` to the
    /// executor's event sinks under the task's run. It does not wake the task: only the
    /// result does, once.
    pub async fn deliver_tool_progress(
        &self,
        call_id: &str,
        secret: &str,
        progress: Value,
    ) -> Result<crate::AcceptedCallback, crate::CallbackError> {
        use crate::CallbackError;
        use keel_runtime::AsyncCallState;
        let inner = &self.inner;
        let (call, record) = self.authenticated_call(call_id, secret).await?;
        let late = || CallbackError::Late {
            call_id: call_id.to_owned(),
        };
        match call.state {
            AsyncCallState::Pending => {}
            AsyncCallState::Delivered => {
                return Err(CallbackError::AfterResult {
                    call_id: call_id.to_owned(),
                })
            }
            _ => return Err(late()),
        }
        if Utc::now() >= record.deadline {
            return Err(late());
        }
        let tasks = inner.runtime.task_manager();
        let Some(task) = tasks.get_task(&call.auth, &record.task_id).await? else {
            return Err(late());
        };
        if task.state().is_terminal() {
            return Err(late());
        }
        let mut message = Message::new(Role::Agent, vec![Part::data(progress.clone())])
            .with_status_kind(StatusKind::ToolProgress);
        message.task_id = Some(task.id.clone());
        message.thread_id = Some(task.thread_id.clone());
        message.metadata.insert("tool".into(), json!(record.tool));
        tasks
            .add_task_event(
                &call.auth,
                &task.id,
                &TaskEvent::StatusUpdate {
                    task_id: task.id.clone(),
                    thread_id: task.thread_id.clone(),
                    status: TaskStatus {
                        state: task.state(),
                        message: Some(message),
                        timestamp: Utc::now(),
                    },
                    is_final: false,
                },
            )
            .await?;
        inner.notices.task_changed();
        if let Some(context) = RunContext::from_task(&task).map_err(CallbackError::Agent)? {
            // The report is the run's one sequence (decision 141): the report saved at the
            // pause is continued, and saved again with this event, so the resumed run finds it.
            let obs = inner
                .resumed_run_obs(&call.auth, &context, &task.id)
                .await
                .map_err(CallbackError::Agent)?;
            obs.emit(RunEvent::tool_async_progress(ToolAsyncProgressPayload {
                call_id: call_id.to_owned(),
                tool_call_id: record.tool_call_id.clone(),
                tool: record.tool.clone(),
                progress,
            }))
            .await;
            inner.save_records(&call.auth, &obs, &task).await;
        }
        Ok(crate::AcceptedCallback {
            auth: call.auth,
            thread_id: call.thread_id,
            task_id: record.task_id,
        })
    }
}

/// The engine's record of an asynchronous call, as its store keeps it.
fn pending_record(call: &keel_runtime::AsyncCall) -> AgentResult<PendingCall> {
    serde_json::from_value(call.record.clone()).map_err(|e| {
        AgentError::storage(format!(
            "asynchronous call `{}` is malformed: {e}",
            call.call_id
        ))
    })
}
