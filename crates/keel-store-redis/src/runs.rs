//! [`RunStore`] over Redis: records in a per-tenant hash, found through sorted-set indexes
//! (one per index field value, plus one per tenant) scored by `recorded_at` in microseconds.
//!
//! A query reads the most selective index it names, newest first within its `since`/`until`
//! window, in batches, and checks the rest client-side until `limit` records match: the
//! `contains` text on the stored JSON as read (exactly the text `RunQuery` documents), then the
//! other fields on the decoded record. That costs one decode per candidate that passes
//! `contains`, which is what the crate docs warn about.

use async_trait::async_trait;
use keel_core::{AgentResult, RunId};
use keel_runtime::{
    AuthContext, IndexedRecord, RecordIndex, RecordText, RunQuery, RunRecord, RunStore, TaskRecord,
};

use crate::encoding::{micros, reading};
use crate::keys::{fixed, kind, TenantKeys};
use crate::scripts;
use crate::RedisStore;

/// The record kinds a query can search, with where each keeps its data and indexes.
struct Family {
    data: &'static str,
    by_time: &'static str,
    by_task: &'static str,
    by_run: Option<&'static str>,
    by_thread: &'static str,
    by_trace: &'static str,
    by_agent: &'static str,
}

const TASK_RECORDS: Family = Family {
    data: fixed::TASK_RECORDS,
    by_time: fixed::TASK_RECORDS_BY_TIME,
    by_task: kind::TASK_RECORDS_BY_TASK,
    by_run: Some(kind::TASK_RECORDS_BY_RUN),
    by_thread: kind::TASK_RECORDS_BY_THREAD,
    by_trace: kind::TASK_RECORDS_BY_TRACE,
    by_agent: kind::TASK_RECORDS_BY_AGENT,
};

const RUN_REPORTS: Family = Family {
    data: fixed::RUN_REPORTS,
    by_time: fixed::RUN_REPORTS_BY_TIME,
    by_task: kind::RUN_REPORTS_BY_TASK,
    // A run's report is found by its run id directly: the data hash is keyed by it.
    by_run: None,
    by_thread: kind::RUN_REPORTS_BY_THREAD,
    by_trace: kind::RUN_REPORTS_BY_TRACE,
    by_agent: kind::RUN_REPORTS_BY_AGENT,
};

impl Family {
    /// The index of each id, in the order of [`RecordIndex::ids`]; `None` where the id has
    /// none.
    fn by_id(&self) -> [Option<&'static str>; 5] {
        [
            Some(self.by_task),
            self.by_run,
            Some(self.by_thread),
            Some(self.by_trace),
            Some(self.by_agent),
        ]
    }

    /// Every index key a record with these fields belongs to.
    fn index_keys(&self, keys: &TenantKeys, fields: &RecordIndex<'_>) -> Vec<String> {
        let ids = self.by_id().into_iter().zip(fields.ids());
        let by_id = ids.filter_map(|(kind, (_, id))| Some(keys.of(kind?, id?)));
        std::iter::once(keys.fixed(self.by_time))
            .chain(by_id)
            .collect()
    }

    /// The narrowest index `query` names. Exact ids (task, run) beat groups (thread, trace,
    /// agent), as [`RecordIndex::ids`] orders them; with none, the tenant's time index.
    fn index_for(&self, keys: &TenantKeys, query: &RunQuery) -> String {
        let mut ids = self.by_id().into_iter().zip(query.ids());
        ids.find_map(|(kind, (_, id))| Some(keys.of(kind?, id?)))
            .unwrap_or_else(|| keys.fixed(self.by_time))
    }
}

/// Where a run's record goes: the tenant's run records hash, and each index set the record
/// belongs to.
pub(crate) fn run_record_keys(keys: &TenantKeys, record: &RunRecord) -> (String, Vec<String>) {
    (
        keys.fixed(fixed::RUN_REPORTS),
        RUN_REPORTS.index_keys(keys, &record.index()),
    )
}

impl RedisStore {
    /// Records of `family` matching `query`, newest first: walk the chosen index in batches,
    /// match `contains` on the stored text (the stored JSON `RunQuery` documents, exactly as
    /// written), decode the rest, match their index fields, stop at the limit.
    async fn find<T: RecordText + IndexedRecord + Send>(
        &self,
        auth: &AuthContext,
        family: &Family,
        query: &RunQuery,
    ) -> AgentResult<Vec<T>> {
        let limit = query.effective_limit()?;
        let keys = self.keys(auth);
        let index = family.index_for(&keys, query);
        let data = keys.fixed(family.data);
        // The window is applied by score to narrow the walk; `matches` re-checks it exactly
        // (scores are microseconds, times are nanoseconds).
        let max = query
            .until
            .map_or_else(|| "+inf".to_owned(), |u| micros(u).to_string());
        let min = query
            .since
            .map_or_else(|| "-inf".to_owned(), |s| micros(s).to_string());
        let batch = (limit * 2).clamp(32, 1000);
        let operation = reading(&data);
        let mut found = Vec::new();
        let mut offset = 0usize;
        loop {
            let members: Vec<String> = redis::cmd("ZREVRANGEBYSCORE")
                .arg(&index)
                .arg(&max)
                .arg(&min)
                .arg("LIMIT")
                .arg(offset)
                .arg(batch)
                .query_async(&mut self.con())
                .await
                .map_err(|e| self.fail("read run-store index", &e))?;
            if members.is_empty() {
                break;
            }
            let texts: Vec<Option<String>> = redis::cmd("HMGET")
                .arg(&data)
                .arg(&members)
                .query_async(&mut self.con())
                .await
                .map_err(|e| self.fail("read run-store records", &e))?;
            // A member without data was removed between the two reads; nothing to return.
            for text in texts.into_iter().flatten() {
                if query
                    .contains
                    .as_deref()
                    .is_some_and(|needle| !text.contains(needle))
                {
                    continue;
                }
                let record = T::from_text("redis", &operation, &text)?;
                if query.matches(&record.index()) {
                    found.push(record);
                    if found.len() == limit {
                        return Ok(found);
                    }
                }
            }
            if members.len() < batch {
                break;
            }
            offset += members.len();
        }
        Ok(found)
    }
}

#[async_trait]
impl RunStore for RedisStore {
    // The text and its index entries in one `MULTI` pipeline.
    async fn save_run_text(
        &self,
        auth: &AuthContext,
        record: &RunRecord,
        text: String,
    ) -> AgentResult<()> {
        let (hash, index_keys) = run_record_keys(&self.keys(auth), record);
        let score = micros(record.recorded_at);
        let run = record.run_id.as_str();
        let mut pipe = redis::pipe();
        pipe.atomic().hset(hash, run, text).ignore();
        for key in &index_keys {
            pipe.zadd(key, run, score).ignore();
        }
        pipe.query_async::<()>(&mut self.con())
            .await
            .map_err(|e| self.fail("save run report", &e))
    }

    async fn save_task_record(&self, auth: &AuthContext, record: &TaskRecord) -> AgentResult<()> {
        let keys = self.keys(auth);
        let index_keys = TASK_RECORDS.index_keys(&keys, &record.index());
        // A script, because the record's id is a counter Redis assigns in the same step.
        let mut call = scripts::SAVE_TASK_RECORD.prepare_invoke();
        call.key(keys.fixed(fixed::TASK_RECORD_SEQ))
            .key(keys.fixed(fixed::TASK_RECORDS));
        for key in &index_keys {
            call.key(key);
        }
        call.arg(record.to_text()?).arg(micros(record.recorded_at));
        call.invoke_async::<i64>(&mut self.con())
            .await
            .map_err(|e| self.fail("save task record", &e))?;
        Ok(())
    }

    async fn find_task_records(
        &self,
        auth: &AuthContext,
        query: &RunQuery,
    ) -> AgentResult<Vec<TaskRecord>> {
        self.find(auth, &TASK_RECORDS, query).await
    }

    async fn get_run_report(
        &self,
        auth: &AuthContext,
        run_id: &RunId,
    ) -> AgentResult<Option<RunRecord>> {
        let data = self.keys(auth).fixed(fixed::RUN_REPORTS);
        let text = self
            .read_text("read run report", &data, Some(run_id.as_str()))
            .await?;
        text.map(|text| RunRecord::from_text("redis", &reading(&data), &text))
            .transpose()
    }

    async fn find_run_reports(
        &self,
        auth: &AuthContext,
        query: &RunQuery,
    ) -> AgentResult<Vec<RunRecord>> {
        let mut found: Vec<RunRecord> = self.find(auth, &RUN_REPORTS, query).await?;
        // Scores are microseconds; restore the exact newest-first order.
        found.sort_by_key(|r| std::cmp::Reverse(r.recorded_at));
        Ok(found)
    }
}
