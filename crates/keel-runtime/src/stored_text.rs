//! Keel's records as the text a store keeps: the versioned stored-JSON envelope
//! ([`keel_core::stored`]) written as a string, and read back with an error that says which
//! backend held bad data and where, so an operator can find it.

use keel_core::{stored, AgentError, AgentResult, Task, TaskEvent, TaskId, ThreadId};
use serde::{de::DeserializeOwned, Serialize};
use serde_json::value::{to_raw_value, RawValue};
use serde_json::{Map, Value};

use crate::{RunRecord, TaskRecord};

/// `record` (a task snapshot, an event, a message, ...) as stored-JSON text.
pub fn encode_record<T: Serialize>(record: &T) -> AgentResult<String> {
    serde_json::to_string(&stored::encode(record)?).map_err(AgentError::internal)
}

/// Decode stored-JSON `text` that `backend` read while doing `operation` (which names where
/// the text was, e.g. ``reading key `k` `` or `reading stored task t-1`). Text that is not
/// JSON, or not an envelope Keel can read, is [`AgentError::Storage`] naming both.
///
/// ```
/// use keel_core::{AgentError, Message};
/// use keel_runtime::{decode_record, encode_record};
/// let text = encode_record(&Message::user("hi")).unwrap();
/// let back: Message = decode_record("sqlite", "reading stored message 1", &text).unwrap();
/// assert_eq!(back.text(), "hi");
/// let err = decode_record::<Message>("redis", "reading key `k`", "garbage").unwrap_err();
/// assert!(matches!(err, AgentError::Storage { backend: "redis", .. }));
/// ```
pub fn decode_record<T: DeserializeOwned>(
    backend: &'static str,
    operation: &str,
    text: &str,
) -> AgentResult<T> {
    decode_envelope(backend, operation, parse(backend, operation, text)?)
}

/// `text` as JSON, or [`AgentError::Storage`] naming where it was read.
fn parse(backend: &'static str, operation: &str, text: &str) -> AgentResult<Value> {
    serde_json::from_str(text).map_err(|e| {
        AgentError::storage_source(
            backend,
            format!("{operation}, which does not hold Keel's stored JSON"),
            e,
        )
    })
}

/// The stored-JSON format of an envelope (0 when it names none, which decoding refuses).
fn format_of(envelope: &Value) -> u64 {
    envelope.get("format").and_then(Value::as_u64).unwrap_or(0)
}

/// [`stored::decode`], its error naming `backend` and `operation`.
fn decode_envelope<T: DeserializeOwned>(
    backend: &'static str,
    operation: &str,
    value: Value,
) -> AgentResult<T> {
    stored::decode(value).map_err(|e| match e {
        AgentError::Storage { source, .. } => AgentError::Storage {
            backend,
            operation: operation.to_owned(),
            source,
        },
        other => other,
    })
}

/// An entry of `task_id`'s log as stored-JSON text, without the ids the log already holds
/// (decision 269): the task's id, and its thread's when the writer knows it (`thread_id`),
/// are left out of the entry and of the message it carries wherever they are the log's. A
/// message that names no task or thread says so with `null`, since a missing id reads back
/// as the log's. [`decode_task_event`] fills them in again.
///
/// ```
/// use keel_core::{Message, Task, TaskEvent};
/// use keel_runtime::{decode_task_event, encode_task_event};
/// let task = Task::create(Message::user("hi"));
/// let event = TaskEvent::Message { message: task.history[0].clone() };
/// let text = encode_task_event(&event, &task.id, Some(&task.thread_id))?;
/// assert!(!text.contains(task.id.as_str()) && !text.contains(task.thread_id.as_str()));
/// let back = decode_task_event("sqlite", "reading an event", &text, &task.id, Some(&task.thread_id))?;
/// assert_eq!(back, event);
/// # Ok::<(), keel_core::AgentError>(())
/// ```
pub fn encode_task_event(
    event: &TaskEvent,
    task_id: &TaskId,
    thread_id: Option<&ThreadId>,
) -> AgentResult<String> {
    let mut value = stored::encode(event)?;
    let log = [
        ("task_id", Some(task_id.as_str())),
        ("thread_id", thread_id.map(ThreadId::as_str)),
    ];
    let Some(data) = value.get_mut("data") else {
        return Err(AgentError::internal("a stored envelope without its data"));
    };
    for_each_id_holder(data, |holder| stored::leave_out_ids(holder, &log));
    serde_json::to_string(&value).map_err(AgentError::internal)
}

/// [`encode_task_event`] for each of `events`, in order.
pub fn encode_task_events(
    events: &[TaskEvent],
    task_id: &TaskId,
    thread_id: Option<&ThreadId>,
) -> AgentResult<Vec<String>> {
    events
        .iter()
        .map(|event| encode_task_event(event, task_id, thread_id))
        .collect()
}

/// Decode an entry of the log of `task_id` (whose thread is `thread_id`, when the store
/// knows it) that `backend` read while doing `operation`, filling in the ids
/// [`encode_task_event`] left out. An entry written by an earlier Keel, with every id, reads
/// as it was written; one that left out a thread the store does not know is
/// [`AgentError::Storage`].
pub fn decode_task_event(
    backend: &'static str,
    operation: &str,
    text: &str,
    task_id: &TaskId,
    thread_id: Option<&ThreadId>,
) -> AgentResult<TaskEvent> {
    let mut value = parse(backend, operation, text)?;
    // Format 1 wrote every id, and no id there means none.
    let leaves_ids_out = format_of(&value) >= 2;
    if let Some(data) = value.get_mut("data").filter(|_| leaves_ids_out) {
        let log = [
            ("task_id", Some(task_id.as_str())),
            ("thread_id", thread_id.map(ThreadId::as_str)),
        ];
        for_each_id_holder(data, |holder| stored::fill_in_ids(holder, &log));
    }
    decode_envelope(backend, operation, value)
}

/// A task's snapshot (without its history, which its log holds) as stored-JSON text, without
/// what the snapshot says twice (decision 269): its status message's task and thread ids
/// when they are the task's, its run context's thread when it is the task's, and each state
/// transition's previous state when it is the state the transition before left (the first's:
/// `submitted`), and its status's state and time when they are the last transition's (format
/// 3). [`decode_task_snapshot`] puts them back.
///
/// ```
/// use keel_core::{Message, RunContext, Task};
/// use keel_runtime::{decode_task_snapshot, encode_task_snapshot};
/// let mut task = Task::create(Message::user("hi"));
/// RunContext::new().attach_to_task(&mut task)?;
/// task.complete("done")?;
/// let text = encode_task_snapshot(&task)?;
/// assert_eq!(text.matches(task.thread_id.as_str()).count(), 1);
/// let back = decode_task_snapshot("sqlite", "reading a task", &text)?;
/// assert_eq!(back, task.clone_without_history());
/// # Ok::<(), keel_core::AgentError>(())
/// ```
pub fn encode_task_snapshot(task: &Task) -> AgentResult<String> {
    let mut value = stored::encode(&task.clone_without_history())?;
    let log = [
        ("task_id", Some(task.id.as_str())),
        ("thread_id", Some(task.thread_id.as_str())),
    ];
    if let Some(data) = value.get_mut("data") {
        for_each_snapshot_copy(data, |holder, ids| stored::leave_out_ids(holder, &log[ids]));
        let mut before = Value::from("submitted");
        for transition in transitions(data) {
            let new_state = transition.get("new_state").cloned().unwrap_or(Value::Null);
            if transition.get("previous_state") == Some(&before) {
                transition.remove("previous_state");
            }
            before = new_state;
        }
        if let Some((status, last)) = status_and_last_transition(data) {
            stored::leave_out_given(status, &last, |own, last| own == last);
        }
        leave_out_answer_parts(data);
    }
    serde_json::to_string(&value).map_err(AgentError::internal)
}

/// Decode a task snapshot that `backend` read while doing `operation`, putting back what
/// [`encode_task_snapshot`] left out. A snapshot of format 1 reads as it was written.
pub fn decode_task_snapshot(
    backend: &'static str,
    operation: &str,
    text: &str,
) -> AgentResult<Task> {
    let mut value = parse(backend, operation, text)?;
    let format = format_of(&value);
    if let Some(data) = value.get_mut("data").filter(|_| format >= 2) {
        let id = |key: &str| data.get(key).and_then(Value::as_str).map(str::to_owned);
        let (task_id, thread_id) = (id("id"), id("thread_id"));
        let log = [
            ("task_id", task_id.as_deref()),
            ("thread_id", thread_id.as_deref()),
        ];
        for_each_snapshot_copy(data, |holder, ids| stored::fill_in_ids(holder, &log[ids]));
        let mut before = Value::from("submitted");
        for transition in transitions(data) {
            let new_state = transition.get("new_state").cloned().unwrap_or(Value::Null);
            transition.entry("previous_state").or_insert(before);
            before = new_state;
        }
        if let Some((status, last)) = status_and_last_transition(data).filter(|_| format >= 3) {
            stored::fill_in_given(status, &last, Value::clone);
        }
        if format >= 4 {
            fill_in_answer_parts(data);
        }
    }
    decode_envelope(backend, operation, value)
}

/// A record of the [`RunStore`](crate::RunStore) as the text a store keeps, and back. It is
/// also the text [`RunQuery::contains`](crate::RunQuery) searches, on every backend.
pub trait RecordText: Sized {
    /// The record as stored-JSON text.
    fn to_text(&self) -> AgentResult<String>;
    /// The record in `text`, which `backend` read while doing `operation`; text that is not
    /// a record Keel can read is [`AgentError::Storage`] naming both.
    fn from_text(backend: &'static str, operation: &str, text: &str) -> AgentResult<Self>;
}

impl RecordText for TaskRecord {
    fn to_text(&self) -> AgentResult<String> {
        encode_record(self)
    }

    fn from_text(backend: &'static str, operation: &str, text: &str) -> AgentResult<Self> {
        decode_record(backend, operation, text)
    }
}

/// A run record names its run, task, thread, trace and agent once (decision 271): its report
/// (the stored run `keel-events` writes) names them at its top, so the record leaves out
/// each of its own that is the report's, and writes `null` for one it does not have that the
/// report names. A record of format 1 or 2, with all of them, reads as it was written.
///
/// ```
/// use keel_core::RunId;
/// use keel_runtime::{RecordText, RunRecord};
/// let report = serde_json::json!({"run_id": "r-1", "agent_name": "a", "events": []});
/// let record = RunRecord {
///     run_id: RunId::from("r-1"),
///     task_id: None,
///     thread_id: None,
///     trace_id: None,
///     agent_name: Some("a".into()),
///     recorded_at: chrono::Utc::now(),
///     report,
/// };
/// let text = record.to_text()?;
/// assert_eq!(text.matches("r-1").count(), 1);
/// assert_eq!(RunRecord::from_text("sqlite", "reading a run", &text)?, record);
/// # Ok::<(), keel_core::AgentError>(())
/// ```
impl RecordText for RunRecord {
    fn to_text(&self) -> AgentResult<String> {
        let mut value = stored::encode(self)?;
        if let Some(Value::Object(data)) = value.get_mut("data") {
            stored::leave_out_ids(data, &report_ids(&self.report));
        }
        serde_json::to_string(&value).map_err(AgentError::internal)
    }

    fn from_text(backend: &'static str, operation: &str, text: &str) -> AgentResult<Self> {
        let mut value = parse(backend, operation, text)?;
        let leaves_out = format_of(&value) >= 3;
        if let Some(Value::Object(data)) = value.get_mut("data").filter(|_| leaves_out) {
            let report = data.remove("report").unwrap_or(Value::Null);
            stored::fill_in_ids(data, &report_ids(&report));
            data.insert("report".to_owned(), report);
        }
        decode_envelope(backend, operation, value)
    }
}

impl RunRecord {
    /// What [`RecordText::to_text`] writes of this record with `report` as its report (the
    /// record's own `report` is not read), without building the report's JSON tree to write
    /// it out again: the report's text goes into the record's as it is, and of it only the
    /// ids at its top are read. The run's ending saves its report this way on the stores
    /// that keep text.
    ///
    /// ```
    /// use keel_core::{stored::JsonText, RunId};
    /// use keel_runtime::{RecordText, RunRecord};
    /// let report = JsonText::of(&serde_json::json!({"run_id": "r-1", "events": []}))?;
    /// let record = RunRecord {
    ///     run_id: RunId::from("r-1"),
    ///     task_id: None,
    ///     thread_id: None,
    ///     trace_id: None,
    ///     agent_name: None,
    ///     recorded_at: chrono::Utc::now(),
    ///     report: serde_json::Value::Null,
    /// };
    /// let text = record.text_with_report(&report)?;
    /// let read = RunRecord::from_text("sqlite", "reading a run", &text)?;
    /// assert_eq!(read.report, report.to_value()?);
    /// # Ok::<(), keel_core::AgentError>(())
    /// ```
    pub fn text_with_report(&self, report: &stored::JsonText) -> AgentResult<String> {
        self.text_with_report_text(report.as_str())
    }

    /// [`RunRecord::text_with_report`] of a report's JSON text.
    pub(crate) fn text_with_report_text(&self, report: &str) -> AgentResult<String> {
        /// The ids at a report's top; serde skips the rest of its text without building it.
        /// A report that is not an object has none.
        #[derive(serde::Deserialize, Default)]
        struct Top {
            run_id: Option<Value>,
            task_id: Option<Value>,
            thread_id: Option<Value>,
            trace_id: Option<Value>,
            agent_name: Option<Value>,
        }
        /// The stored envelope with the record's fields as text (keys in the order
        /// `to_text` writes them: a map's, sorted).
        #[derive(Serialize)]
        struct Envelope {
            data: std::collections::BTreeMap<String, Box<RawValue>>,
            format: Value,
        }
        let top: Top = serde_json::from_str(report).unwrap_or_default();
        let top = serde_json::json!({
            "run_id": top.run_id,
            "task_id": top.task_id,
            "thread_id": top.thread_id,
            "trace_id": top.trace_id,
            "agent_name": top.agent_name,
        });
        let Value::Object(mut envelope) = stored::encode(&self.clone_without_report())? else {
            return Err(AgentError::internal("a stored envelope is a JSON object"));
        };
        let Some(Value::Object(mut data)) = envelope.remove("data") else {
            return Err(AgentError::internal("a run record is a JSON object"));
        };
        stored::leave_out_ids(&mut data, &report_ids(&top));
        let mut fields = data
            .into_iter()
            .filter(|(key, _)| key != "report")
            .map(|(key, value)| Ok((key, to_raw_value(&value).map_err(AgentError::internal)?)))
            .collect::<AgentResult<std::collections::BTreeMap<_, _>>>()?;
        fields.insert(
            "report".to_owned(),
            RawValue::from_string(report.to_owned()).map_err(AgentError::internal)?,
        );
        serde_json::to_string(&Envelope {
            data: fields,
            format: envelope.remove("format").unwrap_or(Value::Null),
        })
        .map_err(AgentError::internal)
    }
}

/// The ids a run record shares with its report, each with the report's value.
fn report_ids(report: &Value) -> [(&'static str, Option<&str>); 5] {
    ["run_id", "task_id", "thread_id", "trace_id", "agent_name"]
        .map(|key| (key, report.get(key).and_then(Value::as_str)))
}

/// Call `f` on each object of a snapshot's JSON that repeats the task's ids, with which of
/// (task id, thread id) it repeats: its status message both, its run context the thread.
fn for_each_snapshot_copy(
    data: &mut Value,
    mut f: impl FnMut(&mut Map<String, Value>, std::ops::Range<usize>),
) {
    if let Some(Value::Object(message)) = data
        .get_mut("status")
        .and_then(|status| status.get_mut("message"))
    {
        f(message, 0..2);
    }
    if let Some(Value::Object(context)) = data
        .get_mut("metadata")
        .and_then(|metadata| metadata.get_mut(keel_core::RUN_CONTEXT_KEY))
    {
        f(context, 1..2);
    }
}

/// Fields of a record's JSON, each with the value another part of the record gives it.
type Given = [(&'static str, Option<Value>); 2];

/// A snapshot's status, and what its last state transition says that the status repeats
/// (format 3): the state it entered and when. `None` for a task that never changed state.
fn status_and_last_transition(data: &mut Value) -> Option<(&mut Map<String, Value>, Given)> {
    let last = data.get("state_history")?.as_array()?.last()?;
    let said = |key: &str| last.get(key).cloned();
    let last = [
        ("state", said("new_state")),
        ("timestamp", said("timestamp")),
    ];
    let status = data.get_mut("status")?.as_object_mut()?;
    Some((status, last))
}

/// Where a snapshot's status message keeps its parts.
const STATUS_PARTS: &str = "/status/message/parts";

/// Write a snapshot's status message's parts, when they are the parts of one of its
/// artifacts (the engine's answer is both), as that artifact's index (format 4, decision
/// 282): an array of parts is never a number, so the index cannot be mistaken for parts.
fn leave_out_answer_parts(data: &mut Value) {
    let index = match (data.pointer(STATUS_PARTS), data.get("artifacts")) {
        (Some(Value::Array(parts)), Some(Value::Array(artifacts))) if !parts.is_empty() => {
            artifacts.iter().rposition(|artifact| {
                artifact.get("parts").and_then(Value::as_array) == Some(parts)
            })
        }
        _ => None,
    };
    if let (Some(index), Some(parts)) = (index, data.pointer_mut(STATUS_PARTS)) {
        *parts = Value::from(index);
    }
}

/// The reverse of [`leave_out_answer_parts`]: an index in place of the parts is the parts of
/// that artifact.
fn fill_in_answer_parts(data: &mut Value) {
    let Some(index) = data.pointer(STATUS_PARTS).and_then(Value::as_u64) else {
        return;
    };
    let parts = usize::try_from(index)
        .ok()
        .and_then(|index| data.get("artifacts")?.get(index)?.get("parts"))
        .cloned();
    if let (Some(parts), Some(slot)) = (parts, data.pointer_mut(STATUS_PARTS)) {
        *slot = parts;
    }
}

/// The state transitions of a snapshot's JSON, as objects.
fn transitions(data: &mut Value) -> impl Iterator<Item = &mut Map<String, Value>> {
    data.get_mut("state_history")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
}

/// Call `f` on each object of a task log entry's JSON that names its task and thread: the
/// message it carries, its status's message, and the entry itself unless it is a message
/// entry (whose ids are its message's).
fn for_each_id_holder(entry: &mut Value, mut f: impl FnMut(&mut Map<String, Value>)) {
    let Some(entry) = entry.as_object_mut() else {
        return;
    };
    if let Some(Value::Object(message)) = entry.get_mut("message") {
        f(message);
    }
    if let Some(Value::Object(message)) = entry
        .get_mut("status")
        .and_then(|status| status.get_mut("message"))
    {
        f(message);
    }
    if entry.get("type").and_then(Value::as_str) != Some("message") {
        f(entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_core::{Artifact, Message, Task};

    /// A completed task's log: its message, its final status (which carries the answer) and
    /// an artifact, each as the engine writes them.
    fn log_of(task: &Task) -> Vec<TaskEvent> {
        vec![
            TaskEvent::Message {
                message: task.history[0].clone(),
            },
            TaskEvent::status_of(task, true),
            TaskEvent::ArtifactUpdate {
                task_id: task.id.clone(),
                thread_id: task.thread_id.clone(),
                artifact: Artifact::text("answer"),
                append: false,
                last_chunk: true,
            },
        ]
    }

    #[test]
    fn a_log_entry_is_stored_without_its_logs_ids_and_reads_back_whole() {
        let mut task = Task::create(Message::user("hi"));
        task.complete("answer").unwrap();
        let (id, thread) = (&task.id, &task.thread_id);
        for event in log_of(&task) {
            let text = encode_task_event(&event, id, Some(thread)).unwrap();
            assert!(!text.contains(id.as_str()), "{text}");
            assert!(!text.contains(thread.as_str()), "{text}");
            assert!(text.contains(r#""format":4"#), "{text}");
            let back = decode_task_event("sqlite", "reading", &text, id, Some(thread)).unwrap();
            assert_eq!(back, event);
        }
    }

    #[test]
    fn ids_that_are_not_the_logs_are_kept_and_a_missing_one_stays_missing() {
        let mut task = Task::create(Message::user("hi"));
        task.complete("answer").unwrap();
        let other = Task::create(Message::user("elsewhere"));
        let mut unplaced = Message::agent("no ids");
        unplaced.task_id = None;
        unplaced.thread_id = None;
        let events = [
            // Another task's message, logged here.
            TaskEvent::Message {
                message: other.history[0].clone(),
            },
            TaskEvent::Message { message: unplaced },
        ];
        for event in events {
            // The writer does not know the thread: only the task's id is left out.
            let text = encode_task_event(&event, &task.id, None).unwrap();
            let back =
                decode_task_event("redis", "reading", &text, &task.id, Some(&task.thread_id))
                    .unwrap();
            assert_eq!(back, event, "{text}");
        }
    }

    #[test]
    fn an_entry_of_format_1_reads_as_written() {
        let task = Task::create(Message::user("hi"));
        let mut unplaced = Message::agent("no ids");
        unplaced.task_id = None;
        let event = TaskEvent::Message { message: unplaced };
        let mut value = stored::encode(&event).unwrap();
        value["format"] = 1.into();
        let text = value.to_string();
        let back =
            decode_task_event("sqlite", "reading", &text, &task.id, Some(&task.thread_id)).unwrap();
        assert_eq!(back, event, "no id in format 1 means none, not the log's");
    }

    #[test]
    fn an_entry_that_left_out_a_thread_the_store_does_not_know_is_a_storage_error() {
        let task = Task::create(Message::user("hi"));
        let event = TaskEvent::status_of(&task, false);
        let text = encode_task_event(&event, &task.id, Some(&task.thread_id)).unwrap();
        let err = decode_task_event("redis", "reading key `k`", &text, &task.id, None).unwrap_err();
        assert!(
            matches!(&err, AgentError::Storage { backend: "redis", operation, .. } if operation == "reading key `k`"),
            "{err:?}"
        );
    }

    /// `task` with `message` as its status message (a field only the task's own methods set).
    fn with_status_message(task: &Task, message: Message) -> Task {
        let mut value = serde_json::to_value(task).unwrap();
        value["status"]["message"] = serde_json::to_value(message).unwrap();
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_snapshot_says_each_id_and_state_once_and_reads_back_whole() {
        let mut task = Task::create(Message::user("hi"));
        keel_core::RunContext::new()
            .attach_to_task(&mut task)
            .unwrap();
        task.complete("answer").unwrap();
        let text = encode_task_snapshot(&task).unwrap();
        assert_eq!(text.matches(task.id.as_str()).count(), 1, "{text}");
        assert_eq!(text.matches(task.thread_id.as_str()).count(), 1, "{text}");
        assert!(!text.contains("previous_state"), "{text}");
        let entered = serde_json::to_string(&task.status().timestamp).unwrap();
        assert_eq!(text.matches(&entered).count(), 1, "{entered} in {text}");
        assert_eq!(text.matches(r#""completed""#).count(), 1, "{text}");
        let back = decode_task_snapshot("sqlite", "reading", &text).unwrap();
        assert_eq!(back, task.clone_without_history());

        // What is not the task's own stays as it was: another task's message, a context
        // with no thread, a history that does not start from `submitted`.
        let other = Task::create(Message::user("elsewhere"));
        let mut task = with_status_message(&task, other.history[0].clone());
        let mut context = keel_core::RunContext::from_task(&task).unwrap().unwrap();
        context.thread_id = None;
        let value = serde_json::to_value(&context).unwrap();
        task.metadata
            .insert(keel_core::RUN_CONTEXT_KEY.into(), value);
        task.state_history[0].previous_state = keel_core::TaskState::InputRequired;
        let mut value = serde_json::to_value(&task).unwrap();
        value["status"]["timestamp"] = serde_json::json!("2030-01-01T00:00:00Z");
        let task: Task = serde_json::from_value(value).unwrap();
        let text = encode_task_snapshot(&task).unwrap();
        let back = decode_task_snapshot("redis", "reading", &text).unwrap();
        assert_eq!(back, task.clone_without_history());
    }

    /// Decision 282: a status message whose parts are an artifact's names the artifact by
    /// its index and reads back whole; one whose parts are no artifact's keeps them.
    #[test]
    fn a_status_message_repeating_an_artifact_names_it_and_reads_back_whole() {
        let mut task = Task::create(Message::user("hi"));
        task.add_artifact(keel_core::Artifact::text("notes").named("notes"));
        task.add_artifact(keel_core::Artifact::text("the whole answer").named("answer"));
        task.complete("the whole answer").unwrap();
        let text = encode_task_snapshot(&task).unwrap();
        assert_eq!(text.matches("the whole answer").count(), 1, "{text}");
        let value: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["data"]["status"]["message"]["parts"], 1, "{text}");
        assert!(text.contains(r#""format":4"#), "{text}");
        let back = decode_task_snapshot("sqlite", "reading", &text).unwrap();
        assert_eq!(back, task.clone_without_history());

        let other = with_status_message(&task, Message::agent("something else"));
        let text = encode_task_snapshot(&other).unwrap();
        assert!(text.contains("something else"), "{text}");
        let back = decode_task_snapshot("redis", "reading", &text).unwrap();
        assert_eq!(back, other.clone_without_history());

        // Format 3 wrote the parts: such a snapshot reads as written.
        let mut old: Value = serde_json::from_str(&encode_task_snapshot(&other).unwrap()).unwrap();
        old["format"] = 3.into();
        let back = decode_task_snapshot("sqlite", "reading", &old.to_string()).unwrap();
        assert_eq!(back, other.clone_without_history());
    }

    #[test]
    fn a_snapshot_of_format_1_reads_as_written() {
        let mut unplaced = Message::agent("no ids");
        unplaced.task_id = None;
        let task = with_status_message(&Task::create(Message::user("hi")), unplaced);
        let mut value = stored::encode(&task.clone_without_history()).unwrap();
        value["format"] = 1.into();
        let back = decode_task_snapshot("sqlite", "reading", &value.to_string()).unwrap();
        assert_eq!(back, task.clone_without_history());
    }

    /// A run record whose ids are `ids` (run, task, thread, trace, agent) over `report`.
    fn run_record(ids: [Option<&str>; 5], report: Value) -> RunRecord {
        let [run, task, thread, trace, agent] = ids;
        RunRecord {
            run_id: keel_core::RunId::from(run.unwrap_or("r-1")),
            task_id: task.map(TaskId::from),
            thread_id: thread.map(ThreadId::from),
            trace_id: trace.map(keel_core::TraceId::from),
            agent_name: agent.map(str::to_owned),
            recorded_at: chrono::Utc::now(),
            report,
        }
    }

    #[test]
    fn a_run_record_names_its_reports_ids_once_and_reads_back_whole() {
        let ids = [
            Some("r-1"),
            Some("t-1"),
            Some("th-1"),
            Some("tr-1"),
            Some("agent-a"),
        ];
        let report = serde_json::json!({
            "run_id": "r-1", "task_id": "t-1", "thread_id": "th-1", "trace_id": "tr-1",
            "agent_name": "agent-a", "events": [],
        });
        let record = run_record(ids, report.clone());
        let text = record.to_text().unwrap();
        for id in ids.into_iter().flatten() {
            assert_eq!(
                text.matches(&format!("\"{id}\"")).count(),
                1,
                "{id}: {text}"
            );
        }
        assert!(text.contains(r#""format":4"#), "{text}");
        assert_eq!(
            RunRecord::from_text("sqlite", "reading", &text).unwrap(),
            record
        );

        // Ids that are not the report's stay, and one the record does not have stays none.
        let record = run_record([Some("r-1"), None, Some("th-2"), None, None], report);
        let text = record.to_text().unwrap();
        assert!(text.contains(r#""task_id":null"#), "{text}");
        assert!(text.contains(r#""thread_id":"th-2""#), "{text}");
        assert_eq!(
            RunRecord::from_text("redis", "reading", &text).unwrap(),
            record
        );
    }

    #[test]
    fn a_record_written_with_its_reports_text_is_the_record_to_text_writes() {
        let report = serde_json::json!({
            "run_id": "r-1", "task_id": "t-1", "thread_id": "th-1", "trace_id": "tr-1",
            "agent_name": "agent-a", "events": [{"type": "run.started", "payload": {"n": 1}}],
        });
        let text = stored::JsonText::of(&report).unwrap();
        for ids in [
            [
                Some("r-1"),
                Some("t-1"),
                Some("th-1"),
                Some("tr-1"),
                Some("agent-a"),
            ],
            // Ids that are not the report's, and ids the record does not have.
            [Some("r-1"), None, Some("th-2"), None, None],
        ] {
            let record = run_record(ids, report.clone());
            let written = record.text_with_report(&text).unwrap();
            let expected = record.to_text().unwrap();
            let parsed = |text: &str| serde_json::from_str::<Value>(text).unwrap();
            assert_eq!(parsed(&written), parsed(&expected), "{written}");
            assert_eq!(
                RunRecord::from_text("sqlite", "reading", &written).unwrap(),
                record
            );
        }
        // A report that is not an object names no ids, and is kept as it is all the same.
        for report in [Value::Null, serde_json::json!(["a", 1])] {
            let record = run_record([Some("r-1"), None, None, None, None], report.clone());
            let text = stored::JsonText::of(&report).unwrap();
            let written = record.text_with_report(&text).unwrap();
            let read = RunRecord::from_text("redis", "reading", &written).unwrap();
            assert_eq!(read, record, "{written}");
        }
    }

    #[test]
    fn a_run_record_of_format_2_reads_as_written() {
        let report = serde_json::json!({"run_id": "r-1", "task_id": "t-1", "events": []});
        let record = run_record([Some("r-1"), None, None, None, None], report);
        let mut value = stored::encode(&record).unwrap();
        value["format"] = 2.into();
        let back = RunRecord::from_text("sqlite", "reading", &value.to_string()).unwrap();
        assert_eq!(back, record);
        let err = RunRecord::from_text("postgres", "reading row 7", "{}").unwrap_err();
        assert!(
            matches!(&err, AgentError::Storage { backend: "postgres", operation, .. } if operation == "reading row 7"),
            "{err:?}"
        );
    }
}
