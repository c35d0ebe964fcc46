//! `keel replay` and `keel test`: recorded runs re-driven through the agents as `keel.toml`
//! defines them now, with the recorded model answers and tool results (docs/replay.md), and
//! the first divergence from the recording reported.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use keel::agent::replay::{exported_runs, Divergence, Recording, Replay, ReplayOutcome};
use keel::agent::AgentBuilder;
use keel::config::{AgentSetBuilder, LoadedConfig};
use keel::DefaultRuntime;
use serde_json::{json, Value};

use crate::render::out;
use crate::run::Source;

/// The exit status of a replay that did what the recording did.
const PASSED: u8 = 0;
/// The exit status of a replay that diverged (or called a tool the recording never did).
const DIVERGED: u8 = 1;
/// The exit status when a run could not be replayed at all (unreadable file, unknown run or
/// agent, a report of another format).
const NOT_REPLAYED: u8 = 2;

/// Where the current agent definitions come from: the file's agents (its MCP servers
/// started once, for their tools' declarations), else the demo agent.
struct Definitions<'a> {
    file: Option<(&'a LoadedConfig, AgentSetBuilder<'a>)>,
}

impl<'a> Definitions<'a> {
    async fn new(loaded: Option<&'a LoadedConfig>) -> Result<Self, String> {
        let file = match loaded {
            Some(loaded) => Some((
                loaded,
                loaded
                    .agents()
                    .connected()
                    .await
                    .map_err(|err| err.to_string())?,
            )),
            None => None,
        };
        Ok(Self { file })
    }

    /// The definition to replay `recording` through, and its name: agent `named`, else the
    /// agent the recording names when the file declares it, else the file's default agent.
    /// Subagents are built on an offline in-memory runtime: nothing is stored anywhere.
    fn agent(
        &self,
        named: Option<&str>,
        recording: &Recording,
    ) -> Result<(String, AgentBuilder), String> {
        self.agent_on(named, recording, Arc::new(DefaultRuntime::offline()))
    }

    /// As [`Definitions::agent`], its subagents built on `runtime`.
    fn agent_on(
        &self,
        named: Option<&str>,
        recording: &Recording,
        runtime: Arc<dyn keel::services::Runtime>,
    ) -> Result<(String, AgentBuilder), String> {
        let Some((loaded, agents)) = &self.file else {
            if let Some(name) = named.filter(|n| *n != keel::demo::card().name) {
                return Err(format!(
                    "no agent `{name}`: there is no keel.toml here (give --config FILE)"
                ));
            }
            return Ok((keel::demo::card().name, keel::demo::builder()));
        };
        let recorded = recording.report.agent_name.as_deref();
        let name = named
            .or(recorded.filter(|name| loaded.agent(name).is_some()))
            .unwrap_or_else(|| loaded.default_agent().name());
        let builder = agents
            .agent_builder(Some(name), runtime)
            .map_err(|err| err.to_string())?;
        Ok((name.to_owned(), builder))
    }
}

/// One replay's verdict, as printed.
struct Verdict {
    /// The file or run id it was given.
    given: String,
    /// The agent it was replayed through.
    agent: String,
    outcome: ReplayOutcome,
    /// The recording's events, to say what a divergence's event was about.
    recorded: Vec<keel::events::RunEvent>,
}

impl Verdict {
    fn passed(&self) -> bool {
        self.outcome.passed()
    }

    /// What part of the model's input a divergence in `context.prepared` is in: the section
    /// the differing `context_items` entry names (`system`: the instructions, `tools`: the
    /// tool declarations, `history`, `user`).
    fn model_input_section(&self) -> Option<String> {
        let divergence = self.outcome.divergence.as_ref()?;
        let index: usize = divergence
            .field
            .strip_prefix("payload.manifest.context_items.")?
            .split('.')
            .next()?
            .parse()
            .ok()?;
        let event = self
            .recorded
            .get(usize::try_from(divergence.sequence).ok()? - 1)?;
        event.payload["manifest"]["context_items"][index]["section"]
            .as_str()
            .map(str::to_owned)
    }

    fn json(&self) -> Value {
        let o = &self.outcome;
        json!({
            "given": self.given,
            "run_id": o.source_run_id,
            "agent": self.agent,
            "passed": self.passed(),
            "divergence": o.divergence,
            "model_input_section": self.model_input_section(),
            "unrecorded_tools": o.unrecorded_tools,
            "final_state": o.task.state(),
        })
    }

    fn text(&self) -> String {
        let o = &self.outcome;
        let head = format!("run {} through agent `{}`", o.source_run_id, self.agent);
        let mut text = match &o.divergence {
            None => format!(
                "no divergence: {head} ({} model calls, final state {})",
                o.model_inputs.len(),
                o.task.state()
            ),
            Some(divergence) => format!("diverged: {head}\n{}", self.divergence_text(divergence)),
        };
        if !o.unrecorded_tools.is_empty() {
            text.push_str(&format!(
                "\ncalled tools the recording never called (not run): {}",
                o.unrecorded_tools.join(", ")
            ));
        }
        text
    }

    fn divergence_text(&self, divergence: &Divergence) -> String {
        let mut text = divergence.to_string();
        if let Some(section) = self.model_input_section() {
            let what = match section.as_str() {
                "system" => "the instructions",
                "tools" => "the tool declarations",
                "history" => "the history",
                "user" => "the user's input",
                _ => "it",
            };
            text.push_str(&format!(
                "\n  (what the model is sent differs: its `{section}` section, {what})"
            ));
        }
        text
    }
}

/// Replay `recording` through the definition `definitions` give.
async fn replay(
    definitions: &Definitions<'_>,
    agent: Option<&str>,
    given: String,
    recording: Recording,
) -> Result<Verdict, String> {
    let (agent, builder) = definitions.agent(agent, &recording)?;
    let recorded = recording.events().to_vec();
    let outcome = Replay::new(recording)
        .run_recorded(builder)
        .await
        .map_err(|err| err.to_string())?;
    Ok(Verdict {
        given,
        agent,
        outcome,
        recorded,
    })
}

/// The recording `target` names: an exported file when there is one by that name, else a run
/// (or task) of the store.
async fn recording_of(source: &Source, target: &str) -> Result<Recording, String> {
    if Path::new(target).is_file() {
        Recording::read(Path::new(target))
    } else {
        Recording::from_json(&crate::runs::exported(source, target).await?)
    }
    .map_err(|err| err.to_string())
}

/// `keel replay RUN|FILE`: an exported file when `target` names one, else a run (or task) of
/// the store. Exit status 0 no divergence, 1 diverged, 2 not replayed.
pub(crate) async fn replay_one(
    source: Source,
    target: String,
    agent: Option<String>,
    json: bool,
) -> ExitCode {
    let verdict = async {
        let recording = recording_of(&source, &target).await?;
        let loaded = source.loaded()?;
        let definitions = Definitions::new(loaded.as_ref()).await?;
        replay(&definitions, agent.as_deref(), target.clone(), recording).await
    }
    .await;
    match verdict {
        Ok(verdict) => {
            if json {
                out(verdict.json());
            } else {
                out(verdict.text());
            }
            ExitCode::from(if verdict.passed() { PASSED } else { DIVERGED })
        }
        Err(message) => {
            if json {
                out(json!({ "given": target, "passed": false, "error": message }));
            }
            eprintln!("keel: cannot replay `{target}`: {message}");
            ExitCode::from(NOT_REPLAYED)
        }
    }
}

/// `keel test DIR`: every exported run in `dir` replayed, a summary printed. Exit status 0
/// when every one replayed without divergence, 1 when one diverged or could not be
/// replayed, 2 when the folder or the agents could not be read.
pub(crate) async fn test_dir(
    source: Source,
    dir: PathBuf,
    agent: Option<String>,
    json: bool,
) -> ExitCode {
    let summary = async {
        let files = exported_runs(&dir).map_err(|err| err.to_string())?;
        if files.is_empty() {
            eprintln!("keel: no exported runs (*.json) in {}", dir.display());
        }
        let loaded = source.loaded()?;
        let definitions = Definitions::new(loaded.as_ref()).await?;
        let mut results = Vec::with_capacity(files.len());
        for file in files {
            let given = file.display().to_string();
            let verdict = match Recording::read(&file) {
                Ok(recording) => {
                    replay(&definitions, agent.as_deref(), given.clone(), recording).await
                }
                Err(err) => Err(err.to_string()),
            };
            results.push((given, verdict));
        }
        Ok::<_, String>(results)
    }
    .await;
    let results = match summary {
        Ok(results) => results,
        Err(message) => {
            eprintln!("keel: cannot test `{}`: {message}", dir.display());
            return ExitCode::from(NOT_REPLAYED);
        }
    };
    let passed = results
        .iter()
        .filter(|(_, v)| v.as_ref().is_ok_and(Verdict::passed))
        .count();
    let diverged = results
        .iter()
        .filter(|(_, v)| v.as_ref().is_ok_and(|v| !v.passed()))
        .count();
    let failed = results.len() - passed - diverged;
    if json {
        let runs: Vec<Value> = results
            .iter()
            .map(|(given, verdict)| match verdict {
                Ok(verdict) => verdict.json(),
                Err(message) => json!({ "given": given, "passed": false, "error": message }),
            })
            .collect();
        out(json!({
            "passed": passed,
            "diverged": diverged,
            "not_replayed": failed,
            "runs": runs,
        }));
    } else {
        for (given, verdict) in &results {
            match verdict {
                Ok(verdict) if verdict.passed() => out(format!("ok       {given}")),
                Ok(verdict) => out(format!("DIVERGED {given}\n{}", indent(&verdict.text()))),
                Err(message) => out(format!("ERROR    {given}\n    cannot replay: {message}")),
            }
        }
        let runs = match results.len() {
            1 => "1 run".to_owned(),
            n => format!("{n} runs"),
        };
        out(format!(
            "{runs}: {passed} passed, {diverged} diverged, {failed} not replayed"
        ));
    }
    ExitCode::from(if passed == results.len() {
        PASSED
    } else {
        DIVERGED
    })
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|line| format!("    {line}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `keel replay RUN|FILE --fork-at N`: the recorded answers before model call `step`, then the
/// agent goes on live (its own model; the demo agent's is `--llm`) with its real tools, as a
/// new run of the store whose report names the run and step it forked from (`keel runs`
/// shows it). Exit status 0 when the fork ran, 2 when it could not.
pub(crate) async fn fork(
    source: Source,
    target: String,
    agent: Option<String>,
    step: u32,
    json: bool,
) -> ExitCode {
    let forked = async {
        if step == 0 {
            return Err("--fork-at counts model calls from 1".to_owned());
        }
        let recording = recording_of(&source, &target).await?;
        let loaded = source.loaded()?;
        let demo_llm = match &loaded {
            Some(_) => None,
            None => Some(keel::llm::llm_from_spec(&source.llm).map_err(|err| err.to_string())?),
        };
        let store = source.store(loaded.as_ref())?;
        let runtime = Arc::new(crate::open_runtime(&store, demo_llm.clone(), Vec::new()).await?);
        let definitions = Definitions::new(loaded.as_ref()).await?;
        let (agent, builder) =
            definitions.agent_on(agent.as_deref(), &recording, runtime.clone())?;
        let live = builder
            .model()
            .cloned()
            .or(demo_llm)
            .ok_or_else(|| format!("agent `{agent}` names no model to go on with"))?;
        let input = recording
            .input
            .clone()
            .ok_or("the export does not carry the user's message under `input`")?;
        let outcome = Replay::new(recording)
            .fork_at(step, live)
            .run_on(runtime, builder, input)
            .await
            .map_err(|err| err.to_string())?;
        Ok::<_, String>((agent, outcome))
    }
    .await;
    match forked {
        Ok((agent, outcome)) => {
            let run_id = outcome
                .events
                .first()
                .map(|e| e.run_id.to_string())
                .unwrap_or_default();
            let answer = outcome
                .task
                .status()
                .message
                .as_ref()
                .map(keel::core::Message::text)
                .unwrap_or_default();
            if json {
                out(json!({
                    "given": target,
                    "forked_from": { "run_id": outcome.source_run_id, "step": step },
                    "run_id": run_id,
                    "task_id": outcome.task.id,
                    "agent": agent,
                    "final_state": outcome.task.state(),
                    "answer": answer,
                }));
            } else {
                out(format!(
                    "forked run {run_id} from run {} at model call {step}, through agent \
                     `{agent}`: final state {}\n{answer}",
                    outcome.source_run_id,
                    outcome.task.state()
                ));
            }
            ExitCode::from(PASSED)
        }
        Err(message) => {
            if json {
                out(json!({ "given": target, "error": message }));
            }
            eprintln!("keel: cannot fork `{target}`: {message}");
            ExitCode::from(NOT_REPLAYED)
        }
    }
}
