//! Creating a child thread, sending it a message, and delivering its result to the parent:
//! as the tool result when the parent waits, else queued on the parent thread.

use std::sync::{Arc, Weak};

use chrono::Utc;
use keel_core::{
    AgentError, AgentResult, FileContent, Message, Part, PartContent, RunContext, StatusKind, Task,
    TaskState, ThreadId,
};
use keel_events::payload::{SubagentCreatedPayload, SubagentEndedPayload, SubagentFile};
use keel_events::{RunEvent, RunEventBuilder};
use keel_runtime::{AuthContext, ChildThread, LogLevel};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::keys::*;
use super::spec::*;
use crate::attachments::{copy_attachment, parse_uri, references_in};
use crate::executor::config::SendOptions;
use crate::observe::RunObs;
use crate::thread_state::{mark_now, ThreadHost, ThreadState, TERMINATED_KEY};
use crate::tool::ToolContext;
use crate::work::QueuedWork;

/// Terminate every registered child of `parent` whose spec is known (best effort, failures
/// logged through `host`): called when the parent thread is terminated.
pub(crate) async fn terminate_children(
    host: &dyn ThreadHost,
    specs: &Specs,
    auth: &AuthContext,
    children: Vec<ChildThread>,
) {
    for child in children {
        if child.status == "terminated" {
            continue;
        }
        let Some(spec) = spec_of(specs, &child) else {
            continue;
        };
        if let Err(err) = spec
            .child()
            .thread(auth, child.thread_id.clone())
            .terminate()
            .await
        {
            host.log(
                LogLevel::Warn,
                &format!(
                    "could not terminate the subagent thread {}: {err}",
                    child.thread_id
                ),
            );
        }
    }
}

pub(super) fn tool_error(tool: &str, message: impl Into<String>) -> AgentError {
    AgentError::ToolFailed {
        tool: tool.to_owned(),
        message: message.into(),
    }
}

/// Where a delivery comes from: the parent's thread and run (a tool call, or the completion
/// of a scoped-variable request outside any run).
#[derive(Clone)]
pub(super) struct Origin {
    pub(super) auth: AuthContext,
    pub(super) run: RunContext,
    pub(super) parent: ThreadState,
    pub(super) cancel: CancellationToken,
    pub(super) events: Option<Arc<RunObs>>,
    /// The tool call that delivers, whose span the child's run hangs under.
    pub(super) call: Option<(keel_core::SpanId, keel_core::ActionId)>,
}

impl Origin {
    pub(super) fn from_ctx(ctx: &ToolContext) -> Self {
        Self {
            auth: ctx.auth.clone(),
            run: ctx.run.clone(),
            parent: ctx.thread.clone(),
            cancel: ctx.cancel.clone(),
            events: ctx.events.clone(),
            call: ctx.call.clone(),
        }
    }

    pub(super) async fn emit(&self, event: RunEventBuilder) {
        if let Some(events) = &self.events {
            events.emit(event).await;
        }
    }

    pub(super) fn runtime(&self) -> &dyn keel_runtime::Runtime {
        self.parent.host.runtime().as_ref()
    }
}

/// Live instances: registered and not terminated.
pub(super) async fn live_children(parent: &ThreadState) -> AgentResult<Vec<ChildThread>> {
    Ok(parent
        .children()
        .await?
        .into_iter()
        .filter(|c| c.status != "terminated")
        .collect())
}

/// Whether one more instance named `name` of `spec` may be created; the error tells the model
/// what to do instead.
pub(super) async fn check_room(
    spec: &SubagentSpec,
    parent: &ThreadState,
    name: &str,
) -> AgentResult<()> {
    let tool = SUBAGENT_CREATE_TOOL;
    let live = live_children(parent).await?;
    if let Some(existing) = live.iter().find(|c| c.name == name) {
        let hint = if existing.resumable {
            format!("send it a message with `{SUBAGENT_MESSAGE_TOOL}` instead")
        } else {
            "choose another name".to_owned()
        };
        return Err(tool_error(
            tool,
            format!("a subagent named `{name}` already exists; {hint}"),
        ));
    }
    let instances: Vec<&ChildThread> = live
        .iter()
        .filter(|c| c.metadata.get(META_SPEC).and_then(Value::as_str) == Some(&spec.name))
        .collect();
    if let Some(max) = spec.max_instances {
        if instances.len() >= max {
            let names: Vec<String> = instances.iter().map(|c| format!("`{}`", c.name)).collect();
            let instead = if spec.resumable {
                format!("send a message to one of them with `{SUBAGENT_MESSAGE_TOOL}` instead")
            } else {
                "wait for one of them to finish, or do the work yourself".to_owned()
            };
            return Err(tool_error(
                tool,
                format!(
                    "cannot create another `{}` subagent: at most {max} may exist at once, \
                     and these exist: {}; {instead}",
                    spec.name,
                    names.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

/// Create the child thread: copy its attachments and seal its scoped variables into it,
/// register it, and deliver its first message.
pub(super) async fn start_child(
    spec: &SubagentSpec,
    origin: &Origin,
    name: &str,
    text: String,
    attachments: &[String],
    scoped: &[(String, String)],
    wait: bool,
) -> AgentResult<(ChildThread, Value)> {
    let child_thread = ThreadId::new();
    // Everything the child needs is in its thread before it is registered or messaged.
    let message = child_message(origin, &child_thread, text, attachments).await?;
    let environment = origin.parent.host.environment();
    for (var, value) in scoped {
        let sealed = environment.seal(&scoped_context(&child_thread, var), value)?;
        origin
            .runtime()
            .thread_store()
            .kv_set(&origin.auth, &child_thread, &scoped_key(var), json!(sealed))
            .await?;
    }
    let mut metadata = keel_core::Metadata::default();
    metadata.insert(META_SPEC.into(), json!(spec.name));
    metadata.insert(
        META_PARENT_AGENT.into(),
        json!(origin.parent.host.agent_name()),
    );
    metadata.insert(
        META_COMMUNICATION.into(),
        json!(spec.parent_communication.as_str()),
    );
    let entry = ChildThread {
        resumable: spec.resumable,
        metadata,
        ..ChildThread::running(
            child_thread.clone(),
            origin.parent.thread_id.clone(),
            name,
            spec.child().agent_card().name.clone(),
        )
    };
    origin
        .runtime()
        .thread_store()
        .register_child(&origin.auth, &entry)
        .await?;
    origin
        .emit(RunEvent::subagent_created(SubagentCreatedPayload {
            subagent: spec.name.clone(),
            name: name.to_owned(),
            child_thread_id: child_thread.clone(),
            agent: entry.agent.clone(),
            attachments: file_uris(&message),
            wait,
        }))
        .await;
    let result = deliver(spec, origin, &entry, message, wait).await?;
    Ok((entry, result))
}

/// The message for the child: the parent's attachments copied into the child's store, the
/// text's references to them rewritten to the copies, and the copies listed in the text (so
/// the child's model sees their child-local references) and as file parts.
pub(super) async fn child_message(
    origin: &Origin,
    child_thread: &ThreadId,
    mut text: String,
    attachments: &[String],
) -> AgentResult<Message> {
    let mut files = Vec::new();
    for reference in attachments {
        let uri = match parse_uri(reference) {
            Some(_) => reference.clone(),
            None => crate::attachments::attachment_uri(&origin.parent.thread_id, reference),
        };
        let copy = copy_attachment(
            origin.runtime(),
            &origin.auth,
            &origin.parent.thread_id,
            child_thread,
            &uri,
        )
        .await
        .map_err(|e| tool_error(SUBAGENT_CREATE_TOOL, e.to_string()))?;
        if let Some(new_uri) = &copy.uri {
            text = text.replace(&uri, new_uri);
        }
        files.push(copy);
    }
    Ok(with_files(Message::user(text), files))
}

/// `message` with `files` listed at the end of its text and added as file parts.
pub(super) fn with_files(message: Message, files: Vec<FileContent>) -> Message {
    if files.is_empty() {
        return message;
    }
    let listed: Vec<String> = files
        .iter()
        .map(|f| {
            format!(
                "- {} ({})",
                f.uri.as_deref().unwrap_or_default(),
                f.name.as_deref().unwrap_or("file")
            )
        })
        .collect();
    let text = format!("{}\n\nAttachments:\n{}", message.text(), listed.join("\n"));
    let mut out = Message::new(message.role, vec![Part::text(text)]);
    out.message_id = message.message_id;
    out.metadata = message.metadata;
    for file in files {
        out = out.with_part(Part::file(file));
    }
    out
}

pub(super) fn file_uris(message: &Message) -> Vec<String> {
    message
        .parts
        .iter()
        .filter_map(|p| match &p.content {
            PartContent::File { file } => file.uri.clone(),
            _ => None,
        })
        .collect()
}

/// Where a background child's result goes (stored under [`META_DELIVERY`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct DeliveryMarker {
    pub(super) parent_thread_id: ThreadId,
    pub(super) subagent: String,
    pub(super) name: String,
    pub(super) communication: String,
}

/// Register the executor `host` as a parent on each of its kinds' executors, so that a
/// child's result queued on a parent thread wakes the executor that runs that thread.
pub(crate) fn link_parent(specs: &Specs, host: &Weak<dyn ThreadHost>) {
    for spec in specs.iter() {
        spec.child().add_parent(&spec.name, host.clone());
    }
}

/// Queue `message` on the parent thread of `child` (run by `child_host`), durably, and make
/// sure the parent's executor runs it: woken at once when it lives in this process, and in
/// any case through a wake timer of the parent's agent (decision 53), which that agent's
/// scheduler, in whatever process claims it, turns into a worker for the parent thread. The
/// parent's executor, never the child's, runs it.
pub(crate) async fn queue_on_parent(
    child_host: &dyn ThreadHost,
    auth: &AuthContext,
    child: &ChildThread,
    message: Message,
) -> AgentResult<keel_runtime::QueuedItem> {
    let parent_thread = &child.parent_thread_id;
    let kind = child
        .metadata
        .get(META_SPEC)
        .and_then(Value::as_str)
        .unwrap_or_default();
    let store = child_host.runtime().thread_store();
    if store
        .kv_get(auth, parent_thread, TERMINATED_KEY)
        .await?
        .is_some()
    {
        return Err(AgentError::ThreadTerminated {
            thread_id: parent_thread.clone(),
        });
    }
    let work = QueuedWork::Message {
        message: message.in_thread(parent_thread.clone()),
    };
    let payload = serde_json::to_value(&work).map_err(AgentError::internal)?;
    let item = store.push_queue(auth, parent_thread, payload).await?;
    let local = child_host.local_parent(kind);
    if let Some(parent) = &local {
        parent.schedule(auth, parent_thread);
    }
    // The registry names the parent's agent (written by the parent when it created the
    // child); a record from before that falls back to the local parent, if any.
    let parent_agent = child
        .metadata
        .get(META_PARENT_AGENT)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .or_else(|| local.as_ref().map(|p| p.agent_name().to_owned()));
    match parent_agent {
        // Woken here already: the wake only guards against this process stopping before the
        // parent ran it, so it is due when a dead holder's lease would have lapsed.
        Some(agent) => {
            let at = match &local {
                Some(parent) => {
                    Utc::now()
                        + chrono::Duration::from_std(parent.lease_ttl())
                            .unwrap_or_else(|_| chrono::Duration::seconds(30))
                }
                None => Utc::now(),
            };
            crate::effects::request_wake(child_host, auth, parent_thread, &agent, at).await;
        }
        None => child_host.log(
            LogLevel::Debug,
            &format!(
                "no parent agent known for thread {parent_thread}: the message waits for the \
                 next work on its thread"
            ),
        ),
    }
    Ok(item)
}

/// Called by the child's executor when one of its tasks rests: a task the parent did not
/// wait for delivers its result from here (registry status, attachments copied to the
/// parent, the message queued on the parent with auto communication, a non-resumable child
/// terminated). Failures are logged; the task's own state is persisted regardless.
pub(crate) async fn child_task_rested(
    host: &dyn ThreadHost,
    specs: &Specs,
    auth: &AuthContext,
    task: &Task,
) {
    let Ok(Some(run)) = RunContext::from_task(task) else {
        return;
    };
    let Some(marker) = run.metadata.get(META_DELIVERY) else {
        return;
    };
    let marker: DeliveryMarker = match serde_json::from_value(marker.clone()) {
        Ok(marker) => marker,
        Err(err) => {
            host.log(
                LogLevel::Warn,
                &format!(
                    "malformed subagent delivery marker on task {}: {err}",
                    task.id
                ),
            );
            return;
        }
    };
    if let Err(err) = deliver_from_child(host, specs, auth, task, &marker).await {
        host.log(
            LogLevel::Warn,
            &format!(
                "could not deliver the result of the subagent task {}: {err}",
                task.id
            ),
        );
    }
}

pub(super) async fn deliver_from_child(
    host: &dyn ThreadHost,
    specs: &Specs,
    auth: &AuthContext,
    task: &Task,
    marker: &DeliveryMarker,
) -> AgentResult<()> {
    let store = host.runtime().thread_store();
    // The registry, not the marker (which a caller could have put into a run context),
    // says who the parent is: a marker pointing elsewhere is ignored.
    let Some(child) = store.child(auth, &task.thread_id).await? else {
        return Ok(());
    };
    if child.parent_thread_id != marker.parent_thread_id {
        host.log(
            LogLevel::Warn,
            &format!(
                "the subagent delivery marker of task {} names another parent; ignored",
                task.id
            ),
        );
        return Ok(());
    }
    store
        .set_child_status(auth, &child.thread_id, &task.state().to_string())
        .await?;
    if marker.communication == ParentCommunication::Auto.as_str() {
        let result = bring_back(
            host.runtime().as_ref(),
            auth,
            &child.parent_thread_id,
            &child,
            task,
        )
        .await;
        let (verb, kind) = match task.state() {
            TaskState::Completed => ("completed", StatusKind::SubagentReturn),
            TaskState::Failed => ("failed", StatusKind::SubagentFailure),
            TaskState::Canceled => ("was canceled", StatusKind::SubagentFailure),
            TaskState::Rejected => ("was rejected", StatusKind::SubagentFailure),
            _ => ("needs input", StatusKind::SubagentStatus),
        };
        let message = with_files(
            Message::user(format!(
                "[subagent {}] {verb}: {}",
                marker.name, result.text
            ))
            .with_status_kind(kind),
            result.files,
        );
        // A parent that is gone (terminated) does not keep the child alive.
        if let Err(err) = queue_on_parent(host, auth, &child, message).await {
            host.log(
                LogLevel::Warn,
                &format!(
                    "could not queue the result of the subagent thread {} on its parent: {err}",
                    child.thread_id
                ),
            );
        }
    }
    if !child.resumable && task.state().is_terminal() {
        // The child's only run is ending here: mark the thread terminated without canceling
        // that run (ThreadState::terminate would).
        mark_now(&*store, auth, &child.thread_id, TERMINATED_KEY).await?;
        store
            .set_child_status(auth, &child.thread_id, "terminated")
            .await?;
        if !specs.is_empty() {
            let children = store.children(auth, &child.thread_id).await?;
            Box::pin(terminate_children(host, specs, auth, children)).await;
        }
    }
    Ok(())
}

/// Send `message` to the child and deliver its result: as the tool result when the parent
/// waits, else as a message queued on the parent thread by the child's own completion path
/// (auto communication; see [`child_task_rested`]).
pub(super) async fn deliver(
    spec: &SubagentSpec,
    origin: &Origin,
    child: &ChildThread,
    message: Message,
    wait: bool,
) -> AgentResult<Value> {
    let child_exec = spec.executor.clone();
    let mut run = origin.run.child(child.agent.clone());
    if let Some((span, action)) = &origin.call {
        run = run.delegated_from(span.to_hex(), action.as_str());
    }
    run.thread_id = Some(child.thread_id.clone());
    // A delivery marker is this child's alone, never inherited by its own children.
    run.metadata.remove(META_DELIVERY);
    if !wait {
        let marker = DeliveryMarker {
            parent_thread_id: origin.parent.thread_id.clone(),
            subagent: spec.name.clone(),
            name: child.name.clone(),
            communication: spec.parent_communication.as_str().to_owned(),
        };
        run.metadata.insert(
            META_DELIVERY.into(),
            serde_json::to_value(&marker).map_err(AgentError::internal)?,
        );
    }
    let message = message.in_thread(child.thread_id.clone());
    let submitted = child_exec
        .send_message(
            &origin.auth,
            message,
            SendOptions {
                return_immediately: true,
                run_context: Some(run),
                ..Default::default()
            },
        )
        .await?;
    let task_id = submitted.id.clone();
    // Canceling the parent's run cancels the child's task (the tool's own future may be
    // dropped at that moment, so the watch runs on its own).
    let cancel_watch = {
        let (exec, auth, token, task_id) = (
            child_exec.clone(),
            origin.auth.clone(),
            origin.cancel.clone(),
            task_id.clone(),
        );
        tokio::spawn(async move {
            token.cancelled().await;
            let _ = exec
                .cancel_task(&auth, &task_id, Some("parent canceled".into()))
                .await;
        })
    };
    if wait {
        let outcome = child_exec.wait_for_rest(&origin.auth, &task_id).await;
        cancel_watch.abort();
        let task = outcome?;
        let result = settle(spec, origin, child, &task).await?;
        return match task.state() {
            TaskState::Completed => {
                let mut answer = json!({"subagent": child.name, "result": result.text});
                if !result.files.is_empty() {
                    answer["attachments"] =
                        json!(result.files.iter().map(subagent_file).collect::<Vec<_>>());
                }
                Ok(answer)
            }
            state => Err(tool_error(
                SUBAGENT_CREATE_TOOL,
                format!("subagent `{}` ended {state}: {}", child.name, result.text),
            )),
        };
    }
    // Not waiting: the child's completion path delivers its end to the parent thread. This
    // watcher only marks it in the parent run's event stream while this process lives.
    let name = child.name.clone();
    let (spec, origin, child) = (spec.clone(), origin.clone(), child.clone());
    tokio::spawn(async move {
        let outcome = spec.executor.wait_for_rest(&origin.auth, &task_id).await;
        cancel_watch.abort();
        match outcome {
            Ok(task) => mark_end(&spec, &origin, &child, &task, summary(&task), &[]).await,
            Err(err) => origin.parent.host.log(
                LogLevel::Warn,
                &format!("lost track of the subagent task {task_id}: {err}"),
            ),
        }
    });
    Ok(json!({
        "subagent": name,
        "status": "started",
        "note": "the answer will arrive as a message"
    }))
}

/// A file of a child's result as its parent's tool result and events list it.
pub(super) fn subagent_file(file: &FileContent) -> SubagentFile {
    SubagentFile {
        uri: file.uri.clone(),
        name: file.name.clone(),
        media_type: file.media_type.clone(),
    }
}

/// A child's result as the parent receives it: the text with references rewritten to the
/// parent's copies, and those copies.
pub(super) struct ChildResult {
    pub(super) text: String,
    pub(super) files: Vec<FileContent>,
}

/// After the child's task rests, for a parent that waited: update the registry, bring the
/// result's attachments into the parent's store, mark it in the parent's event stream, and
/// terminate a non-resumable child.
pub(super) async fn settle(
    spec: &SubagentSpec,
    origin: &Origin,
    child: &ChildThread,
    task: &Task,
) -> AgentResult<ChildResult> {
    let child_state = spec.executor.thread(&origin.auth, child.thread_id.clone());
    child_state.set_status(&task.state().to_string()).await?;
    let result = bring_back(
        origin.runtime(),
        &origin.auth,
        &origin.parent.thread_id,
        child,
        task,
    )
    .await;
    mark_end(
        spec,
        origin,
        child,
        task,
        result.text.clone(),
        &result.files,
    )
    .await;
    if !spec.resumable && task.state().is_terminal() {
        child_state.terminate().await?;
    }
    Ok(result)
}

/// `subagent.returned` or `subagent.failed` in the parent run's event stream.
pub(super) async fn mark_end(
    spec: &SubagentSpec,
    origin: &Origin,
    child: &ChildThread,
    task: &Task,
    text: String,
    files: &[FileContent],
) {
    origin
        .emit(RunEvent::subagent_ended(SubagentEndedPayload {
            subagent: spec.name.clone(),
            name: child.name.clone(),
            child_thread_id: child.thread_id.clone(),
            task_id: task.id.clone(),
            state: task.state(),
            result: text,
            attachments: files.iter().map(subagent_file).collect(),
        }))
        .await;
}

/// Copy every attachment of the child's thread that its result refers to (in the answer's
/// text, or as file parts of the answer or the artifacts) into the parent's store, and
/// rewrite the text to refer to the copies. A reference that cannot be copied is left as it
/// is (and logged): the answer still reaches the parent.
pub(super) async fn bring_back(
    runtime: &dyn keel_runtime::Runtime,
    auth: &AuthContext,
    parent_thread: &ThreadId,
    child: &ChildThread,
    task: &Task,
) -> ChildResult {
    let mut text = summary(task);
    let mut references = references_in(&text, &child.thread_id);
    let parts = task
        .status()
        .message
        .iter()
        .flat_map(|m| m.parts.iter())
        .chain(task.artifacts.iter().flat_map(|a| a.parts.iter()));
    for part in parts {
        if let PartContent::File { file } = &part.content {
            if let Some(uri) = &file.uri {
                let ours = parse_uri(uri).is_some_and(|(thread, _)| thread == child.thread_id);
                if ours && !references.contains(uri) {
                    references.push(uri.clone());
                }
            }
        }
    }
    let mut files = Vec::new();
    for uri in references {
        match copy_attachment(runtime, auth, &child.thread_id, parent_thread, &uri).await {
            Ok(copy) => {
                if let Some(new_uri) = &copy.uri {
                    text = text.replace(&uri, new_uri);
                }
                files.push(copy);
            }
            Err(err) => runtime.logging_service().log(
                LogLevel::Warn,
                &format!("the subagent's attachment {uri} could not be copied: {err}"),
            ),
        }
    }
    ChildResult { text, files }
}

/// The child's answer or failure as text.
pub(super) fn summary(task: &Task) -> String {
    task.status()
        .message
        .as_ref()
        .map(Message::text)
        .unwrap_or_default()
}
