//! `keel runs list|show|export`: the run reports the engine kept in the configured store
//! (see docs/run-report.md), as a table, a timeline, or the report's JSON.

use std::sync::Arc;

use keel::agent::reads::Reads;
use keel::core::{Role, RunId, TaskId, TaskState};
use keel::events::{EventType, RedactionPolicy, RunReport};
use keel::services::{RunQuery, RunRecord};
use serde_json::{json, Value};

use crate::render::{colour_stderr, out, shorten, Styles};
use crate::run::{local_tenant, Source};

/// How much of a tool's arguments or result a timeline line shows.
const SHORT: usize = 120;

/// The most reports a store hands out at once (`RunQuery::limit`'s ceiling).
const MAX_LIMIT: usize = 1_000;

/// `keel runs list`.
pub(crate) async fn list(
    source: Source,
    thread: Option<String>,
    state: Option<String>,
    limit: usize,
    json: bool,
) -> Result<(), String> {
    let state = state
        .map(|s| {
            serde_json::from_value::<TaskState>(json!(s)).map_err(|_| {
                format!(
                    "--state `{s}` is not a task state (completed, failed, canceled, rejected, \
                     input-required, working, ...)"
                )
            })
        })
        .transpose()?;
    if limit == 0 || limit > MAX_LIMIT {
        return Err(format!("--limit must be 1 to {MAX_LIMIT}"));
    }
    let reads = reads(&source).await?;
    // A state is not indexed: read up to the ceiling and keep the first `limit` that match.
    let query = RunQuery {
        thread_id: thread.map(Into::into),
        limit: Some(if state.is_some() { MAX_LIMIT } else { limit }),
        ..RunQuery::default()
    };
    let records = reads
        .runs(&local_tenant(), &query)
        .await
        .map_err(|err| err.to_string())?;
    let rows: Vec<Value> = records
        .iter()
        .map(row)
        .filter(|r| state.is_none_or(|s| r["final_state"] == json!(s)))
        .take(limit)
        .collect();
    if json {
        out(json!({ "runs": rows }));
        return Ok(());
    }
    if rows.is_empty() {
        eprintln!("keel: no runs");
        return Ok(());
    }
    out(format!(
        "{:<38} {:<15} {:<14} {:>6} {:>9} {:>9}  {:<32}  FORKED FROM",
        "RUN", "STATE", "AGENT", "STEPS", "TOK IN", "TOK OUT", "RECORDED"
    ));
    for r in &rows {
        let text = |key: &str| r[key].as_str().unwrap_or("-").to_owned();
        out(format!(
            "{:<38} {:<15} {:<14} {:>6} {:>9} {:>9}  {:<32}  {}",
            text("run_id"),
            text("final_state"),
            text("agent_name"),
            r["steps"].to_string(),
            r["input_tokens"].to_string(),
            r["output_tokens"].to_string(),
            text("recorded_at"),
            forked_from(r),
        ));
    }
    Ok(())
}

/// One line of `keel runs list`: the record's index fields and its report's headline figures.
fn row(record: &RunRecord) -> Value {
    let report = &record.report;
    json!({
        "run_id": record.run_id,
        "task_id": record.task_id,
        "thread_id": record.thread_id,
        "agent_name": record.agent_name,
        "recorded_at": record.recorded_at,
        "final_state": report.get("final_state"),
        "steps": report.pointer("/budget/usage/steps").cloned().unwrap_or(json!(0)),
        "model_calls": report.pointer("/model/calls").cloned().unwrap_or(json!(0)),
        "input_tokens": report.pointer("/model/input_tokens").cloned().unwrap_or(json!(0)),
        "output_tokens": report.pointer("/model/output_tokens").cloned().unwrap_or(json!(0)),
        "forked_from": report
            .get("metadata")
            .and_then(|m| m.get(keel::agent::replay::FORKED_FROM))
            .cloned(),
    })
}

/// The FORKED FROM column: `RUN@N` (forked from run RUN at model call N), else `-`.
fn forked_from(row: &Value) -> String {
    match (
        row["forked_from"]["run_id"].as_str(),
        row["forked_from"]["step"].as_u64(),
    ) {
        (Some(run), Some(step)) => format!("{run}@{step}"),
        _ => "-".to_owned(),
    }
}

/// The engine's reads over the configured store (no agent runs here).
async fn reads(source: &Source) -> Result<Reads, String> {
    Ok(Reads::new(Arc::new(source.runtime().await?)))
}

/// The record of `id`: a run id, or else a task id (its newest run).
async fn find(source: &Source, id: &str) -> Result<RunRecord, String> {
    let reads = reads(source).await?;
    let auth = local_tenant();
    if let Some(record) = reads
        .run(&auth, &RunId::from(id.to_owned()))
        .await
        .map_err(|err| err.to_string())?
    {
        return Ok(record);
    }
    reads
        .latest_run(&auth, &TaskId::from(id.to_owned()))
        .await
        .map_err(|err| err.to_string())?
        .ok_or_else(|| format!("no run `{id}` in the store (`keel runs list` shows them)"))
}

/// `keel runs export ID [-o FILE]`: the run as [`exported`] makes it, on stdout or in `FILE`.
pub(crate) async fn export(
    source: Source,
    id: String,
    output: Option<std::path::PathBuf>,
) -> Result<(), String> {
    let exported = exported(&source, &id).await?;
    let text = serde_json::to_string_pretty(&exported).map_err(|err| err.to_string())?;
    match output {
        Some(path) => {
            std::fs::write(&path, text + "\n")
                .map_err(|err| format!("cannot write `{}`: {err}", path.display()))?;
            eprintln!("keel: wrote run {id} to {}", path.display());
        }
        None => out(text),
    }
    Ok(())
}

/// Run `id` (a run id, or a task id: its newest run) as a replay reads it: the run report,
/// redacted as the store keeps it, and under `input` the user's message that started the
/// run's task (a report's task snapshots carry no history, decision 4), masked by the same
/// redaction policy and without its task id (a replay starts a task of its own).
pub(crate) async fn exported(source: &Source, id: &str) -> Result<Value, String> {
    let record = find(source, id).await?;
    let mut exported = record.report;
    let Some(task_id) = record.task_id else {
        return Ok(exported);
    };
    let task = reads(source)
        .await?
        .task_with_history(&local_tenant(), &task_id, None)
        .await
        .map_err(|err| err.to_string())?;
    if let Some(mut input) = task.history.into_iter().find(|m| m.role == Role::User) {
        input.task_id = None;
        let input = RedactionPolicy::default()
            .redact_serializable(&input)
            .map_err(|err| err.to_string())?;
        if let Value::Object(fields) = &mut exported {
            fields.insert(
                "input".to_owned(),
                serde_json::to_value(input).map_err(|err| err.to_string())?,
            );
        }
    }
    Ok(exported)
}

/// `keel runs show ID`: the run as a timeline (`--json`: the report's summary and events).
pub(crate) async fn show(source: Source, id: String, json: bool) -> Result<(), String> {
    let record = find(&source, &id).await?;
    let report = RunReport::from_value(record.report.clone()).map_err(|err| err.to_string())?;
    if json {
        // The report as it is stored, which already names its ids as the API does.
        out(record.report);
        return Ok(());
    }
    out(timeline(&report, &Styles::new(colour_stderr())).trim_end());
    Ok(())
}

/// A run report as the lines `keel runs show` prints.
fn timeline(report: &RunReport, s: &Styles) -> String {
    let mut out = String::new();
    let id = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    out.push_str(&format!(
        "run {} · task {} · thread {} · agent {}\n",
        id(report.run_id.as_ref().map(ToString::to_string)),
        id(report.task_id.as_ref().map(ToString::to_string)),
        id(report.thread_id.as_ref().map(ToString::to_string)),
        id(report.agent_name.clone()),
    ));
    let start = report.started_at;
    // Streamed chunks are the model's answer in pieces; the call's line has its figures.
    for event in report
        .events
        .iter()
        .filter(|e| !e.is(EventType::LLM_STREAM.as_str()))
    {
        let at = start
            .map(|t| (event.timestamp - t).num_milliseconds())
            .map(|ms| format!("+{ms:>6}ms"))
            .unwrap_or_default();
        let step = event
            .step
            .map(|n| format!("step {n:<3}"))
            .unwrap_or_else(|| " ".repeat(8));
        let detail = detail(event);
        let line = format!(
            "{at} {step} {:<22} {}{detail}",
            event.event_type.as_str(),
            event.summary
        );
        let t = &event.event_type;
        let styled = if *t == EventType::ACTION_DENIED
            || *t == EventType::ACTION_FAILED
            || *t == EventType::BUDGET_EXCEEDED
        {
            s.bad.apply_to(line)
        } else if *t == EventType::APPROVAL_REQUIRED || *t == EventType::BUDGET_WARNING {
            s.warn.apply_to(line)
        } else if t.as_str().starts_with("action.") {
            s.tool.apply_to(line)
        } else {
            s.dim.apply_to(line)
        };
        out.push_str(&format!("{styled}\n"));
    }
    let m = &report.model;
    let u = &report.budget.usage;
    out.push_str(&format!(
        "final state: {}\nmodel: {} calls, {} tokens in, {} out, {} ms\nbudget used: {} steps, {} model calls, {} tool calls, {:.1} s\n",
        report
            .final_state
            .map(|s| s.to_string())
            .unwrap_or_else(|| "(not finished)".into()),
        m.calls,
        m.input_tokens,
        m.output_tokens,
        m.latency_ms,
        u.steps,
        u.llm_calls,
        u.tool_calls,
        u.runtime_seconds,
    ));
    out
}

/// What a timeline line adds to an event's summary: tokens and durations, tool arguments and
/// results, shortened.
fn detail(event: &keel::events::RunEvent) -> String {
    let p = &event.payload;
    let t = &event.event_type;
    if *t == EventType::LLM_CALL_COMPLETED {
        // The summary has the tokens.
        p["latency_ms"]
            .as_u64()
            .map(|ms| format!(" in {ms} ms"))
            .unwrap_or_default()
    } else if *t == EventType::ACTION_REQUESTED {
        format!(" {}", shorten(&p["action"]["payload"], SHORT))
    } else if *t == EventType::ACTION_COMPLETED {
        let ms = p["duration_ms"]
            .as_u64()
            .map(|ms| format!(" in {ms} ms"))
            .unwrap_or_default();
        format!("{ms}: {}", shorten(&p["output"], SHORT))
    } else {
        String::new()
    }
}
