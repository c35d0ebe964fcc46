//! The persistent run store: task snapshots and run reports, indexed by task, run, thread,
//! trace, agent and time, and searchable.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use keel_core::{
    AgentError, AgentResult, RunContext, RunId, Task, TaskId, TaskState, ThreadId, TraceId,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use keel_core::stored::JsonText;

use crate::{AuthContext, RecordText};

/// A task snapshot with the fields it is indexed by.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// The task.
    pub task_id: TaskId,
    /// Its thread.
    pub thread_id: ThreadId,
    /// Its state when recorded.
    pub state: TaskState,
    /// The run that recorded it.
    pub run_id: Option<RunId>,
    /// The trace.
    pub trace_id: Option<TraceId>,
    /// The agent.
    pub agent_name: Option<String>,
    /// When the record was written.
    pub recorded_at: DateTime<Utc>,
    /// The snapshot.
    pub task: Task,
}

impl TaskRecord {
    /// A record of `task`, indexed by its run context when it has one.
    pub fn of(task: &Task, agent_name: Option<&str>) -> AgentResult<TaskRecord> {
        let ctx = RunContext::from_task(task)?;
        Ok(TaskRecord::with_context(task, ctx.as_ref(), agent_name))
    }

    /// A record of `task` indexed by `ctx`: for a caller that has read the task's run
    /// context already (reading it parses the task's metadata).
    pub fn with_context(
        task: &Task,
        ctx: Option<&RunContext>,
        agent_name: Option<&str>,
    ) -> TaskRecord {
        TaskRecord {
            task_id: task.id.clone(),
            thread_id: task.thread_id.clone(),
            state: task.state(),
            run_id: ctx.map(|c| c.run_id.clone()),
            trace_id: ctx.map(|c| c.trace_id.clone()),
            agent_name: agent_name.map(str::to_owned),
            recorded_at: Utc::now(),
            task: task.clone(),
        }
    }
}

/// A run as stored (the JSON `keel-events` writes at a run's end, from which it renders the
/// run's report when read; decision 257) with the fields it is indexed by.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// The run.
    pub run_id: RunId,
    /// The task it ran.
    pub task_id: Option<TaskId>,
    /// The thread.
    pub thread_id: Option<ThreadId>,
    /// The trace.
    pub trace_id: Option<TraceId>,
    /// The agent.
    pub agent_name: Option<String>,
    /// When the report was written.
    pub recorded_at: DateTime<Utc>,
    /// The run's JSON: as stored, from the store; rendered into the documented report by
    /// `keel_agent::reads` and `keel_events::RunReport::from_value`.
    pub report: Value,
}

/// Which records to find. Every set field must match. Results are newest first.
///
/// # What `contains` searches
///
/// `contains` is a case-sensitive substring match over the record's *stored JSON*: the text
/// [`RecordText::to_text`] writes for the [`TaskRecord`] or [`RunRecord`], i.e.
/// `{"data":<the record>,"format":<version>}`, compact, with every object's keys in sorted
/// order (a task record exactly as `stored::encode(&record)?.to_string()` prints it; a run
/// record names the ids its report names only there, decision 271, and a report the engine
/// saved as text, [`RunStore::save_run_report_json`], keeps that text as it is:
/// [`RunRecord::text_with_report`]). Every backend matches against that same text, so a
/// query finds the same records everywhere. Consequences:
///
/// - the needle is matched against JSON, not against the plain values: a `"` or `\` inside
///   a string value must be written escaped, as JSON writes it (`\"`, `\\`); non-ASCII text is
///   matched as is (JSON text keeps it unescaped);
/// - `%` and `_` are plain characters (no SQL `LIKE` patterns);
/// - key names and the envelope are part of the text: `"format"` or `"state"` match every
///   record, so search for values, or for `"key":"value"` pairs.
///
/// ```
/// use keel_core::{stored, Message, Task};
/// use keel_runtime::TaskRecord;
/// let record = TaskRecord::of(&Task::create(Message::user("find me")), Some("alpha"))?;
/// let text = stored::encode(&record)?.to_string();
/// assert!(text.contains(r#""agent_name":"alpha""#));
/// assert!(text.contains("find me"));
/// # Ok::<(), keel_core::AgentError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunQuery {
    /// Only this task.
    pub task_id: Option<TaskId>,
    /// Only this run.
    pub run_id: Option<RunId>,
    /// Only this thread.
    pub thread_id: Option<ThreadId>,
    /// Only this trace.
    pub trace_id: Option<TraceId>,
    /// Only this agent.
    pub agent_name: Option<String>,
    /// Recorded at or after.
    pub since: Option<DateTime<Utc>>,
    /// Recorded strictly before (the bound is exclusive, so consecutive windows
    /// `[a, b)`, `[b, c)` never share a record).
    pub until: Option<DateTime<Utc>>,
    /// Text the record's stored JSON must contain (see [`RunQuery`] for exactly which text).
    pub contains: Option<String>,
    /// At most this many (default 100, at most 1,000).
    pub limit: Option<usize>,
}

impl RunQuery {
    /// The effective limit; zero is [`AgentError::InvalidInput`].
    pub fn effective_limit(&self) -> AgentResult<usize> {
        match self.limit {
            None => Ok(100),
            Some(0) => Err(AgentError::invalid_input("limit", "must be at least 1")),
            Some(n) => Ok(n.min(1000)),
        }
    }

    /// Whether a record with these index fields matches (the `contains` check is separate).
    pub fn matches(&self, record: &RecordIndex<'_>) -> bool {
        let mut ids = self.ids().into_iter().zip(record.ids());
        ids.all(|((_, want), (_, have))| want.is_none() || want == have)
            && self.since.is_none_or(|s| record.recorded_at >= s)
            && self.until.is_none_or(|u| record.recorded_at < u)
    }

    /// The ids the query asks for, by name and in the order of [`RecordIndex::ids`]; `None`
    /// where any is taken.
    ///
    /// ```
    /// use keel_runtime::RunQuery;
    /// let query = RunQuery { agent_name: Some("alpha".into()), ..Default::default() };
    /// assert_eq!(query.ids()[4], ("agent_name", Some("alpha")));
    /// ```
    pub fn ids(&self) -> [(&'static str, Option<&str>); 5] {
        [
            ("task_id", self.task_id.as_ref().map(|v| v.as_str())),
            ("run_id", self.run_id.as_ref().map(|v| v.as_str())),
            ("thread_id", self.thread_id.as_ref().map(|v| v.as_str())),
            ("trace_id", self.trace_id.as_ref().map(|v| v.as_str())),
            ("agent_name", self.agent_name.as_deref()),
        ]
    }
}

/// The fields a [`TaskRecord`] or [`RunRecord`] is found by: what a [`RunQuery`] matches
/// (besides `contains`), and what a backend indexes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordIndex<'a> {
    /// The task.
    pub task_id: Option<&'a TaskId>,
    /// The run.
    pub run_id: Option<&'a RunId>,
    /// The thread.
    pub thread_id: Option<&'a ThreadId>,
    /// The trace.
    pub trace_id: Option<&'a TraceId>,
    /// The agent.
    pub agent_name: Option<&'a str>,
    /// When the record was written.
    pub recorded_at: DateTime<Utc>,
}

impl<'a> RecordIndex<'a> {
    /// The record's ids by name, in one order (task, run, thread, trace, agent), each `None`
    /// where the record has none: what every backend indexes a record by, and the names the
    /// SQL stores give their index columns.
    pub fn ids(&self) -> [(&'static str, Option<&'a str>); 5] {
        [
            ("task_id", self.task_id.map(|v| v.as_str())),
            ("run_id", self.run_id.map(|v| v.as_str())),
            ("thread_id", self.thread_id.map(|v| v.as_str())),
            ("trace_id", self.trace_id.map(|v| v.as_str())),
            ("agent_name", self.agent_name),
        ]
    }
}

/// A record of the [`RunStore`], found by its [`RecordIndex`].
pub trait IndexedRecord {
    /// The fields the record is found by.
    fn index(&self) -> RecordIndex<'_>;
}

impl IndexedRecord for TaskRecord {
    fn index(&self) -> RecordIndex<'_> {
        RecordIndex {
            task_id: Some(&self.task_id),
            run_id: self.run_id.as_ref(),
            thread_id: Some(&self.thread_id),
            trace_id: self.trace_id.as_ref(),
            agent_name: self.agent_name.as_deref(),
            recorded_at: self.recorded_at,
        }
    }
}

impl IndexedRecord for RunRecord {
    fn index(&self) -> RecordIndex<'_> {
        RecordIndex {
            task_id: self.task_id.as_ref(),
            run_id: Some(&self.run_id),
            thread_id: self.thread_id.as_ref(),
            trace_id: self.trace_id.as_ref(),
            agent_name: self.agent_name.as_deref(),
            recorded_at: self.recorded_at,
        }
    }
}

/// Durable task snapshots and run reports.
#[async_trait]
pub trait RunStore: Send + Sync {
    /// Record a task snapshot (every call adds a record; the history of a task's snapshots is
    /// kept).
    async fn save_task_record(&self, auth: &AuthContext, record: &TaskRecord) -> AgentResult<()>;
    /// Task records matching `query`, newest first.
    async fn find_task_records(
        &self,
        auth: &AuthContext,
        query: &RunQuery,
    ) -> AgentResult<Vec<TaskRecord>>;
    /// Record (or replace) a run report. The default saves its stored text
    /// ([`RecordText::to_text`]) by [`save_run_text`](Self::save_run_text).
    async fn save_run_report(&self, auth: &AuthContext, record: &RunRecord) -> AgentResult<()> {
        self.save_run_text(auth, record, record.to_text()?).await
    }
    /// [`save_run_report`](Self::save_run_report) with the report given as JSON text
    /// (`record.report` is ignored): the engine writes its reports straight to text, which a
    /// store that keeps text takes as it is ([`JsonText`] is well-formed by construction, so
    /// it needs no check). The default puts it into the record's stored text unparsed
    /// ([`RunRecord::text_with_report`]) and saves that by
    /// [`save_run_text`](Self::save_run_text).
    async fn save_run_report_json(
        &self,
        auth: &AuthContext,
        record: RunRecord,
        report: JsonText,
    ) -> AgentResult<()> {
        let text = record.text_with_report(&report)?;
        self.save_run_text(auth, &record, text).await
    }
    /// Record (or replace) the run report `record`, whose stored text is `text` (what
    /// [`RecordText::to_text`] writes of it; `record.report` may be left `Null`, the report
    /// being in the text): what the two methods above come to on a store that keeps text.
    async fn save_run_text(
        &self,
        auth: &AuthContext,
        record: &RunRecord,
        text: String,
    ) -> AgentResult<()>;
    /// The report of a run, if recorded.
    async fn get_run_report(
        &self,
        auth: &AuthContext,
        run_id: &RunId,
    ) -> AgentResult<Option<RunRecord>>;
    /// Run reports matching `query`, newest first.
    async fn find_run_reports(
        &self,
        auth: &AuthContext,
        query: &RunQuery,
    ) -> AgentResult<Vec<RunRecord>>;
}

/// A [`RunStore`] in process memory, keeping at most `capacity` records of each kind per
/// store (oldest dropped first), so memory stays flat under load.
pub struct InMemoryRunStore {
    tasks: std::sync::Mutex<std::collections::VecDeque<(String, TaskRecord)>>,
    runs: std::sync::Mutex<RunIndex>,
    capacity: usize,
}

/// Run reports by (tenant, run id), with their insertion order for eviction: saving a report
/// is O(1) whatever the number of records held.
#[derive(Default)]
struct RunIndex {
    by_run: std::collections::HashMap<(String, RunId), HeldRun>,
    order: std::collections::VecDeque<(String, RunId)>,
}

/// A run record as held in memory: its index fields, and the report as JSON text. A report
/// as a `serde_json::Value` tree costs several times its text (a map node per object, an
/// allocation per key and string), and ten thousand of them made most of a busy in-memory
/// server's heap; the text is parsed again only when a record is read.
struct HeldRun {
    /// The record, its `report` left `Null`: what a query matches.
    without_report: RunRecord,
    report: Box<str>,
}

impl HeldRun {
    fn new(record: &RunRecord) -> Self {
        Self {
            without_report: record.clone_without_report(),
            report: record.report.to_string().into_boxed_str(),
        }
    }

    /// Whether the record's stored text contains `needle`: the text the stores that keep
    /// text write, its report's as it was given (see [`RunQuery`]).
    fn contains(&self, needle: Option<&str>) -> bool {
        needle.is_none_or(|needle| {
            self.without_report
                .text_with_report_text(&self.report)
                .is_ok_and(|text| text.contains(needle))
        })
    }

    fn record(&self) -> RunRecord {
        let mut record = self.without_report.clone();
        // The text was written from a `Value`, so it parses back to the same one.
        record.report = serde_json::from_str(&self.report).unwrap_or(Value::Null);
        record
    }
}

impl RunRecord {
    pub(crate) fn clone_without_report(&self) -> RunRecord {
        RunRecord {
            run_id: self.run_id.clone(),
            task_id: self.task_id.clone(),
            thread_id: self.thread_id.clone(),
            trace_id: self.trace_id.clone(),
            agent_name: self.agent_name.clone(),
            recorded_at: self.recorded_at,
            report: Value::Null,
        }
    }
}

impl Default for InMemoryRunStore {
    fn default() -> Self {
        Self::with_capacity(10_000)
    }
}

impl InMemoryRunStore {
    /// A store keeping the default 10,000 records of each kind.
    pub fn new() -> Self {
        Self::default()
    }

    /// A store keeping at most `capacity` records of each kind.
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            tasks: Default::default(),
            runs: Default::default(),
            capacity: capacity.max(1),
        }
    }
}

impl InMemoryRunStore {
    /// Keep a run record, replacing the run's earlier one, dropping the oldest beyond capacity.
    fn hold(&self, auth: &AuthContext, held: HeldRun) {
        let key = (auth.namespace(), held.without_report.run_id.clone());
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        if runs.by_run.insert(key.clone(), held).is_none() {
            runs.order.push_back(key);
            while runs.order.len() > self.capacity {
                if let Some(oldest) = runs.order.pop_front() {
                    runs.by_run.remove(&oldest);
                }
            }
        }
    }
}

/// Whether `record`'s stored JSON (see [`RunQuery`]) contains `needle`. The text is built per
/// search rather than kept beside each record: searches are rare, memory is bounded.
fn json_contains<T: RecordText>(record: &T, needle: Option<&str>) -> bool {
    needle.is_none_or(|needle| record.to_text().is_ok_and(|text| text.contains(needle)))
}

#[async_trait]
impl RunStore for InMemoryRunStore {
    async fn save_task_record(&self, auth: &AuthContext, record: &TaskRecord) -> AgentResult<()> {
        let mut tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        if tasks.len() >= self.capacity {
            tasks.pop_front();
        }
        tasks.push_back((auth.namespace(), record.clone()));
        Ok(())
    }

    async fn find_task_records(
        &self,
        auth: &AuthContext,
        query: &RunQuery,
    ) -> AgentResult<Vec<TaskRecord>> {
        let limit = query.effective_limit()?;
        let namespace = auth.namespace();
        let tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        Ok(tasks
            .iter()
            .rev()
            .filter(|(ns, _)| *ns == namespace)
            .map(|(_, r)| r)
            .filter(|r| query.matches(&r.index()) && json_contains(*r, query.contains.as_deref()))
            .take(limit)
            .cloned()
            .collect())
    }

    async fn save_run_report(&self, auth: &AuthContext, record: &RunRecord) -> AgentResult<()> {
        self.hold(auth, HeldRun::new(record));
        Ok(())
    }

    async fn save_run_text(
        &self,
        auth: &AuthContext,
        _record: &RunRecord,
        text: String,
    ) -> AgentResult<()> {
        // The two methods above hold records without this text; one given as text is read.
        let record = RunRecord::from_text("memory", "saving a run report", &text)?;
        self.save_run_report(auth, &record).await
    }

    async fn save_run_report_json(
        &self,
        auth: &AuthContext,
        mut record: RunRecord,
        report: JsonText,
    ) -> AgentResult<()> {
        // Kept as given: `JsonText` is well-formed, so it reads back as the report.
        record.report = Value::Null;
        self.hold(
            auth,
            HeldRun {
                without_report: record,
                report: report.into_string().into_boxed_str(),
            },
        );
        Ok(())
    }

    async fn get_run_report(
        &self,
        auth: &AuthContext,
        run_id: &RunId,
    ) -> AgentResult<Option<RunRecord>> {
        let runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        Ok(runs
            .by_run
            .get(&(auth.namespace(), run_id.clone()))
            .map(HeldRun::record))
    }

    async fn find_run_reports(
        &self,
        auth: &AuthContext,
        query: &RunQuery,
    ) -> AgentResult<Vec<RunRecord>> {
        let limit = query.effective_limit()?;
        let namespace = auth.namespace();
        let runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        let mut found: Vec<RunRecord> = runs
            .by_run
            .iter()
            .filter(|((ns, _), _)| *ns == namespace)
            .map(|(_, held)| held)
            .filter(|held| query.matches(&held.without_report.index()))
            .filter(|held| held.contains(query.contains.as_deref()))
            .map(HeldRun::record)
            .collect();
        found.sort_by_key(|r| std::cmp::Reverse(r.recorded_at));
        found.truncate(limit);
        Ok(found)
    }
}
