//! Context assembly (Standard Agents §4): the thread history as the model sees it, the
//! system prompt, and the persist points that grow the history.

use std::sync::Arc;

use chrono::Utc;
use keel_core::{AgentResult, Message, Part, Role, Task, TaskEvent};
use keel_llm::{LlmMessage, LlmRole, ToolCall};
use serde_json::{json, Value};

use super::run::RunLoop;
use super::state::*;

/// How many history entries one backward read of a thread takes.
const HISTORY_PAGE: usize = 256;

impl Inner {
    /// The part of the thread's history a run works on (decision 250): see
    /// [`history_window`]. The whole history when the agent's `max_session_turns` counts
    /// the thread's turns.
    pub(super) async fn read_history(
        &self,
        flow: &Flow,
        first_message: Option<&str>,
    ) -> AgentResult<Vec<LlmMessage>> {
        let store = self.runtime.thread_store();
        if self.agent.stop_rules().max_session_turns.is_some() {
            return Ok(store
                .read_history(&flow.auth, &flow.thread_id, 0, usize::MAX)
                .await?
                .into_iter()
                .map(|entry| entry.message)
                .collect());
        }
        history_window(store.as_ref(), &flow.auth, &flow.thread_id, first_message).await
    }

    /// Persist to the thread history under the lease; answers the entries as written
    /// (marked with this agent's side).
    pub(super) async fn append_history(
        &self,
        flow: &Flow,
        mut messages: Vec<LlmMessage>,
    ) -> AgentResult<Vec<LlmMessage>> {
        self.mark_side(&mut messages);
        self.runtime
            .thread_store()
            .append_history(&flow.auth, &flow.lease(), &messages)
            .await?;
        Ok(messages)
    }

    /// Mark the entries this agent speaks (assistant messages, tool results) with its side.
    pub(super) fn mark_side(&self, messages: &mut [LlmMessage]) {
        for message in messages {
            if matches!(message.role, LlmRole::Assistant | LlmRole::Tool) {
                message
                    .metadata
                    .insert(META_SIDE.into(), json!(self.agent.card().name));
            }
        }
    }

    /// Write `message`, stamped with `task`'s ids, to the task's log together with the history
    /// `entries` it shows ([`Self::write_point`]); gives it back as logged.
    pub(super) async fn write_message(
        &self,
        flow: &Flow,
        entries: &[LlmMessage],
        task: &Task,
        mut message: Message,
    ) -> AgentResult<Message> {
        message.task_id = Some(task.id.clone());
        message.thread_id = Some(task.thread_id.clone());
        // Moved into the event and back out, so that a large tool output is not copied.
        let event = TaskEvent::Message { message };
        self.write_point(flow, entries, task, &event).await?;
        let TaskEvent::Message { message } = event else {
            unreachable!("built as a message above")
        };
        Ok(message)
    }

    /// Write history entries (already marked) and the task log's `event` that matches them
    /// together: one step-store write, so that a crash cannot leave one without the other
    /// (a `tool_call` without its `tool_output` in the task's A2A history, or the reverse).
    /// A runtime without a step store gets the two writes one after the other.
    pub(super) async fn write_point(
        &self,
        flow: &Flow,
        messages: &[LlmMessage],
        task: &Task,
        event: &TaskEvent,
    ) -> AgentResult<()> {
        match self.runtime.step_store() {
            Some(steps) => {
                steps
                    .persist_step(
                        &flow.auth,
                        &flow.lease(),
                        messages,
                        task,
                        keel_runtime::TaskWrite::LogOnly,
                        std::slice::from_ref(event),
                    )
                    .await?
            }
            None => {
                self.runtime
                    .thread_store()
                    .append_history(&flow.auth, &flow.lease(), messages)
                    .await?;
                self.runtime
                    .task_manager()
                    .add_task_event(&flow.auth, &task.id, event)
                    .await?;
            }
        }
        self.notices.task_changed();
        Ok(())
    }
}

/// The newest part of a thread's history, read backward from its end a page at a time
/// (decision 250): back to the newest compaction checkpoint, before which the model sees
/// nothing ([`keel_llm::compacted_view`]), and, when `first_message` names a task's first
/// user message, back to that message's entry too, so that all of the task's own entries
/// (its steps, tool calls and results, its input) are there. A thread without a checkpoint
/// is read whole: the model is sent all of it. So a run's reads grow with what the model is
/// sent and the task's own length, not with the thread's.
pub(super) async fn history_window(
    store: &dyn keel_runtime::ThreadStore,
    auth: &keel_runtime::AuthContext,
    thread_id: &keel_core::ThreadId,
    first_message: Option<&str>,
) -> AgentResult<Vec<LlmMessage>> {
    let (mut checkpoint, mut found) = (false, first_message.is_none());
    let entries = read_back(store, auth, thread_id, |page| {
        checkpoint |= page
            .iter()
            .any(|e| keel_llm::is_compaction_checkpoint(&e.message));
        found |= page.iter().any(|e| is_input(&e.message, first_message));
        checkpoint && found
    })
    .await?;
    Ok(entries.into_iter().map(|entry| entry.message).collect())
}

/// Whether `entry` is the history entry of the user message `message_id`.
pub(crate) fn is_input(entry: &LlmMessage, message_id: Option<&str>) -> bool {
    message_id.is_some() && entry.metadata.get(META_MESSAGE).and_then(Value::as_str) == message_id
}

/// A thread's history read backward from its end, [`HISTORY_PAGE`] entries at a time,
/// until `enough` says so of the page just read (it sees every page, newest first) or the
/// start is reached; answered oldest first.
pub(crate) async fn read_back(
    store: &dyn keel_runtime::ThreadStore,
    auth: &keel_runtime::AuthContext,
    thread_id: &keel_core::ThreadId,
    mut enough: impl FnMut(&[keel_runtime::HistoryEntry]) -> bool,
) -> AgentResult<Vec<keel_runtime::HistoryEntry>> {
    let mut pages = Vec::new();
    let mut before = u64::MAX;
    loop {
        let page = store
            .read_history_before(auth, thread_id, before, HISTORY_PAGE)
            .await?;
        let Some(oldest) = page.first() else {
            break;
        };
        before = oldest.seq;
        let whole = page.len() < HISTORY_PAGE || before <= 1;
        let done = enough(&page);
        pages.push(page);
        if whole || done {
            break;
        }
    }
    Ok(pages.into_iter().rev().flatten().collect())
}

impl RunLoop<'_> {
    /// Persist to the thread history under the lease, and mirror in the run's history.
    pub(super) async fn append(&mut self, messages: Vec<LlmMessage>) -> AgentResult<()> {
        let written = self.inner.append_history(self.flow, messages).await?;
        self.history.extend(written);
        Ok(())
    }

    pub(super) async fn persist_tool_result(
        &mut self,
        call: &ToolCall,
        output: Value,
        is_error: bool,
    ) -> AgentResult<()> {
        let mut result = LlmMessage::tool_result(call, render(&output));
        tag(&mut result, &self.task.id);
        if is_error {
            result.metadata.insert(META_IS_ERROR.into(), json!(true));
        }
        let mut parts = vec![Part::tool_output(&call.id, &call.name, output, is_error)];
        // Files the tool attached: references into the thread's store, beside the output.
        if let Some(files) = self
            .attached
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&call.id)
        {
            parts.extend(files.iter().cloned().map(Part::file));
            result.attachments = files;
        }
        self.persist_point(vec![result], parts).await.map(drop)
    }

    /// One persist point of a step: history entries under the lease and the matching agent
    /// message in the task's log, in one round trip when the runtime has a step store. Gives
    /// back the message as logged, for a final status that says it again.
    pub(super) async fn persist_point(
        &mut self,
        mut messages: Vec<LlmMessage>,
        parts: Vec<Part>,
    ) -> AgentResult<Message> {
        self.inner.mark_side(&mut messages);
        let message = self
            .inner
            .write_message(
                self.flow,
                &messages,
                &self.task,
                Message::new(Role::Agent, parts),
            )
            .await?;
        self.history.extend(messages);
        Ok(message)
    }

    /// The agent's instructions with their placeholders filled: the built-in names, then
    /// the thread's key-value store.
    pub(super) async fn system_prompt(&self) -> String {
        let agent = &self.inner.agent;
        let ctx = &self.ctx;
        let mut prompt = agent.instructions().to_owned();
        if !prompt.contains("{{") {
            return prompt;
        }
        let builtins = [
            ("agent_name", agent.card().name.clone()),
            ("thread_id", ctx.thread_id.to_string()),
            ("task_id", ctx.task_id.to_string()),
            ("date", Utc::now().format("%Y-%m-%d").to_string()),
        ];
        for (name, value) in builtins {
            prompt = prompt.replace(&format!("{{{{{name}}}}}"), &value);
        }
        // Remaining placeholders come from the thread's key-value store.
        let mut rest = prompt.clone();
        while let Some(start) = rest.find("{{") {
            let Some(len) = rest[start + 2..].find("}}") else {
                break;
            };
            let name = rest[start + 2..start + 2 + len].trim().to_owned();
            if let Ok(Some(value)) = ctx.thread.get_value(&name).await {
                prompt = prompt.replace(&format!("{{{{{name}}}}}"), &render(&value));
            }
            rest = rest[start + 2 + len + 2..].to_owned();
        }
        prompt
    }
}

/// A history entry as a model request carries it: everything but Keel's own bookkeeping
/// metadata (`keel.*`: side, task, queue item; the messageId stays), which no provider sends and which would
/// otherwise be copied, entry by entry, into every step's request.
pub(super) fn request_copy(entry: &LlmMessage) -> LlmMessage {
    // Destructured in full, so a new field cannot be left out silently.
    let LlmMessage {
        id,
        role,
        content,
        name,
        tool_calls,
        tool_call_id,
        tool_name,
        attachments,
        metadata,
        created_at,
    } = entry;
    LlmMessage {
        id: id.clone(),
        role: *role,
        content: content.clone(),
        name: name.clone(),
        tool_calls: tool_calls.clone(),
        tool_call_id: tool_call_id.clone(),
        tool_name: tool_name.clone(),
        attachments: attachments.clone(),
        metadata: application_metadata(metadata),
        created_at: *created_at,
    }
}

/// `metadata` without Keel's `keel.*` keys, except the A2A `messageId` a user entry came
/// from ([`META_MESSAGE`]): it is the caller's, and a model that decides by the incoming
/// message (a scripted one, as the conformance agent's) reads it there.
pub(super) fn application_metadata(metadata: &keel_core::Metadata) -> keel_core::Metadata {
    metadata
        .iter()
        .filter(|(key, _)| !key.starts_with("keel.") || *key == META_MESSAGE)
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect()
}

/// The model's view of a thread during one run: the messages of the last request, kept so
/// the next step adds only what the history gained since (its model call and tool results)
/// instead of assembling and copying the whole history again. The request shares them (an
/// `Arc`): once the model has answered and dropped its request, the view is the only owner
/// again and grows in place.
#[derive(Default)]
pub(super) struct ModelView {
    /// The system prompt (when there is one), then the assembled history.
    messages: Arc<Vec<LlmMessage>>,
    /// Whether `messages` starts with the system prompt.
    system: bool,
    /// How many history entries `messages` holds, and the id of the last: a history that
    /// is not the one assembled plus new entries is assembled again from the start.
    seen: usize,
    last_id: Option<String>,
    /// Cleared when an assembled message read a file from the attachment store (the file
    /// may change before the next step) or the view had to be reshaped for a late
    /// asynchronous result: such a view is assembled again at each step, as it used to be.
    reusable: bool,
}

impl ModelView {
    /// The messages of this step's request: `system` then the thread's history as the agent
    /// `side` sees it (see [`assemble_context`]), with stored files' bytes loaded and late
    /// asynchronous results reshaped (see [`crate::async_tools::model_view`]).
    pub(super) async fn messages(
        &mut self,
        system: String,
        history: &[LlmMessage],
        side: &str,
        vision: bool,
        thread: &crate::ThreadState,
    ) -> Arc<Vec<LlmMessage>> {
        let mut continues = self.reusable
            && self.seen <= history.len()
            && self.system != system.is_empty()
            && (self.seen == 0
                || history[self.seen - 1].id.as_str()
                    == self.last_id.as_deref().unwrap_or_default());
        // A compaction checkpoint (decision 124) replaces what came before it: the view
        // starts again from the newest one, with the compacted history it holds.
        let scan_from = if continues { self.seen } else { 0 };
        let checkpoint = history[scan_from..]
            .iter()
            .rposition(keel_llm::is_compaction_checkpoint)
            .map(|at| scan_from + at);
        continues &= checkpoint.is_none();
        if !continues {
            *self = ModelView {
                messages: Arc::new(Vec::with_capacity(history.len() + 1)),
                system: !system.is_empty(),
                seen: 0,
                last_id: None,
                reusable: true,
            };
        }
        // A request still held elsewhere (a model that keeps what it was sent) is copied
        // here, once; otherwise this is the view's own vector.
        let messages = Arc::make_mut(&mut self.messages);
        if self.system {
            // A view that goes on starts with the previous step's prompt; it changes only
            // when a variable it names did.
            match messages.first_mut() {
                Some(first) if first.content == system => {}
                Some(first) => *first = LlmMessage::system(system),
                None => messages.push(LlmMessage::system(system)),
            }
        }
        let start = messages.len();
        let mut from = self.seen;
        if let Some(at) = checkpoint {
            if let Some(compacted) = keel_llm::checkpoint_history(&history[at]) {
                assemble_context(&compacted, side, vision, messages);
                from = at + 1;
            }
        }
        assemble_context(&history[from..], side, vision, messages);
        let added = &mut messages[start..];
        // Stored files are references no provider can fetch: the request carries bytes.
        if added
            .iter()
            .flat_map(|m| &m.attachments)
            .any(|file| file.bytes.is_none() && file.uri.is_some())
        {
            self.reusable = false;
            thread.load_attachment_bytes(added).await;
        }
        self.seen = history.len();
        self.last_id = history.last().map(|m| m.id.clone());
        if crate::async_tools::reshaped(messages) {
            self.reusable = false;
            let assembled = Arc::unwrap_or_clone(std::mem::take(&mut self.messages));
            return Arc::new(crate::async_tools::model_view(assembled));
        }
        Arc::clone(&self.messages)
    }
}

/// Context assembly (Standard Agents §4): the model's view of the thread history for the
/// agent `side`, appended to `out`. Entries another agent spoke on this thread (dual_ai) are
/// the other side: its assistant text appears as `user`, and its tool calls and tool results
/// are left out. Without vision, image attachments are replaced by a note at request time;
/// the stored history keeps them.
pub(super) fn assemble_context(
    history: &[LlmMessage],
    side: &str,
    vision: bool,
    out: &mut Vec<LlmMessage>,
) {
    for entry in history {
        let other = entry
            .metadata
            .get(META_SIDE)
            .and_then(Value::as_str)
            .is_some_and(|s| s != side);
        let mut message = if !other {
            request_copy(entry)
        } else if entry.role == LlmRole::Assistant && !entry.content.is_empty() {
            let mut said = LlmMessage::user(entry.content.clone());
            said.id.clone_from(&entry.id);
            said.created_at = entry.created_at;
            said.attachments.clone_from(&entry.attachments);
            said.metadata = application_metadata(&entry.metadata);
            said
        } else {
            continue;
        };
        if !vision {
            message.drop_images();
        }
        out.push(message);
    }
}
