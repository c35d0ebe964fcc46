//! How a run looks in the terminal: a live view of its normalized events (`keel-events`) on
//! stderr, with a spinner while the model thinks, or the events as JSON lines on stdout.

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use console::Style;
use indicatif::{ProgressBar, ProgressStyle};
use keel::core::{AgentResult, ApprovalRequest};
use keel::events::payload::{
    ActionCompletedPayload, ActionDeniedPayload, ActionFailedPayload, ActionPayload,
    ActionPolicyPayload, ApprovalDecidedPayload, ApprovalRequiredPayload, BudgetPayload,
    LlmCallCompletedPayload, LlmCallStartedPayload, LlmStreamPayload,
};
use keel::events::{EventSink, EventType, RunEvent};
use serde_json::Value;

/// How much of a tool's arguments or result one line shows.
const SHORT: usize = 160;

/// One line of results on stdout. A reader that went away (`keel runs list | head -1`) ends
/// the output, not the command: the line is dropped rather than the process panicking.
pub(crate) fn out(line: impl std::fmt::Display) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{line}");
    let _ = stdout.flush();
}

/// Whether to colour what goes to stderr: only on a terminal, never with `NO_COLOR` set.
pub(crate) fn colour_stderr() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// `value` on one line, cut to about `max` characters.
pub(crate) fn shorten(value: &Value, max: usize) -> String {
    let text = match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let line = text.replace(['\n', '\r'], " ");
    if line.chars().count() <= max {
        return line;
    }
    let cut: String = line.chars().take(max.saturating_sub(1)).collect();
    format!("{cut}…")
}

/// The styles of the human view (plain when colour is off).
pub(crate) struct Styles {
    pub dim: Style,
    pub tool: Style,
    pub warn: Style,
    pub bad: Style,
    pub good: Style,
}

impl Styles {
    /// Styles that colour only when `colour` is true.
    pub(crate) fn new(colour: bool) -> Self {
        let style = |s: Style| s.force_styling(colour);
        Self {
            dim: style(Style::new().dim()),
            tool: style(Style::new().cyan()),
            warn: style(Style::new().yellow()),
            bad: style(Style::new().red()),
            good: style(Style::new().green()),
        }
    }
}

/// What the run used so far, added up from its events.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Usage {
    pub model_calls: u64,
    pub tool_calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// A run's events, rendered as they happen.
pub(crate) struct Renderer {
    json: bool,
    styles: Styles,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    spinner: Option<ProgressBar>,
    /// Whether streamed text left the cursor mid-line.
    mid_line: bool,
    /// Whether model text was streamed since the last answer was printed.
    streamed: bool,
    usage: Usage,
}

impl Renderer {
    /// A renderer: JSON lines on stdout when `json`, else the human view on stderr.
    pub(crate) fn new(json: bool) -> Arc<Self> {
        Arc::new(Self {
            json,
            styles: Styles::new(colour_stderr()),
            state: Mutex::new(State::default()),
        })
    }

    /// The styles of the human view.
    pub(crate) fn styles(&self) -> &Styles {
        &self.styles
    }

    /// What the run used since the last call (a chat shows each turn's own figures).
    pub(crate) fn take_usage(&self) -> Usage {
        std::mem::take(&mut self.lock().usage)
    }

    /// Whether model text was streamed since the last call (which starts the count anew).
    pub(crate) fn take_streamed(&self) -> bool {
        std::mem::take(&mut self.lock().streamed)
    }

    /// Stop the spinner, if one turns (before prompting or printing the answer).
    pub(crate) fn pause(&self) {
        let mut state = self.lock();
        if let Some(spinner) = state.spinner.take() {
            spinner.finish_and_clear();
        }
        if state.mid_line {
            eprintln!();
            state.mid_line = false;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One line on stderr, above the spinner when one turns.
    fn line(state: &mut State, text: String) {
        if state.mid_line {
            eprintln!();
            state.mid_line = false;
        }
        match &state.spinner {
            Some(spinner) => spinner.suspend(|| eprintln!("{text}")),
            None => eprintln!("{text}"),
        }
    }

    fn human(&self, event: &RunEvent) {
        let s = &self.styles;
        let mut state = self.lock();
        let t = &event.event_type;
        if *t == EventType::LLM_CALL_STARTED {
            let model = event
                .payload_as::<LlmCallStartedPayload>()
                .ok()
                .and_then(|p| p.model)
                .unwrap_or_else(|| "model".into());
            if std::io::stderr().is_terminal() {
                let spinner = ProgressBar::new_spinner();
                spinner.set_style(
                    ProgressStyle::with_template("{spinner} {msg}")
                        .unwrap_or_else(|_| ProgressStyle::default_spinner()),
                );
                spinner.set_message(format!("calling {model}"));
                spinner.enable_steady_tick(Duration::from_millis(100));
                state.spinner = Some(spinner);
            } else {
                Self::line(
                    &mut state,
                    s.dim.apply_to(format!("· calling {model}")).to_string(),
                );
            }
        } else if *t == EventType::LLM_STREAM {
            if let Ok(p) = event.payload_as::<LlmStreamPayload>() {
                if let Some(spinner) = state.spinner.take() {
                    spinner.finish_and_clear();
                }
                eprint!("{}", s.dim.apply_to(&p.delta));
                let _ = std::io::stderr().flush();
                state.mid_line = !p.delta.ends_with('\n');
                state.streamed = true;
            }
        } else if *t == EventType::LLM_CALL_COMPLETED {
            if let Some(spinner) = state.spinner.take() {
                spinner.finish_and_clear();
            }
            if let Ok(p) = event.payload_as::<LlmCallCompletedPayload>() {
                state.usage.model_calls += 1;
                state.usage.input_tokens += p.input_tokens;
                state.usage.output_tokens += p.output_tokens;
                let took = p
                    .latency_ms
                    .map(|ms| format!(", {ms} ms"))
                    .unwrap_or_default();
                let model = p.model.unwrap_or_else(|| "model".into());
                Self::line(
                    &mut state,
                    s.dim
                        .apply_to(format!(
                            "· {model}: {} tokens in, {} out{took}",
                            p.input_tokens, p.output_tokens
                        ))
                        .to_string(),
                );
            }
        } else if *t == EventType::ACTION_STARTED {
            // An approved action is requested twice (before and after the approval) but
            // starts once.
            state.usage.tool_calls += 1;
        } else if *t == EventType::ACTION_REQUESTED {
            if let Ok(p) = event.payload_as::<ActionPayload>() {
                let line = format!(
                    "→ {} {}",
                    s.tool.apply_to(&p.action.name),
                    shorten(&p.action.payload, SHORT)
                );
                Self::line(&mut state, line);
            }
        } else if *t == EventType::ACTION_POLICY {
            if let Ok(p) = event.payload_as::<ActionPolicyPayload>() {
                let why = p.reason.map(|r| format!(" ({r})")).unwrap_or_default();
                let style = if p.decision == "allow" {
                    &s.dim
                } else {
                    &s.warn
                };
                Self::line(
                    &mut state,
                    style
                        .apply_to(format!("  policy: {}{why}", p.decision))
                        .to_string(),
                );
            }
        } else if *t == EventType::ACTION_COMPLETED {
            if let Ok(p) = event.payload_as::<ActionCompletedPayload>() {
                Self::line(
                    &mut state,
                    format!("  {} {}", s.good.apply_to("←"), shorten(&p.output, SHORT)),
                );
            }
        } else if *t == EventType::ACTION_FAILED {
            if let Ok(p) = event.payload_as::<ActionFailedPayload>() {
                Self::line(
                    &mut state,
                    s.bad
                        .apply_to(format!(
                            "  ✗ failed: {}",
                            shorten(&Value::String(p.error), SHORT)
                        ))
                        .to_string(),
                );
            }
        } else if *t == EventType::ACTION_DENIED {
            if let Ok(p) = event.payload_as::<ActionDeniedPayload>() {
                Self::line(
                    &mut state,
                    s.warn
                        .apply_to(format!("  ✗ denied: {}", p.reason))
                        .to_string(),
                );
            }
        } else if *t == EventType::APPROVAL_REQUIRED {
            // The full request is shown where it is answered (`run::turn`).
            if let Ok(p) = event.payload_as::<ApprovalRequiredPayload>() {
                let text = format!("  approval required: request {}", p.request.request_id);
                Self::line(&mut state, s.warn.apply_to(text).to_string());
            }
        } else if *t == EventType::APPROVAL_DECIDED {
            if let Ok(p) = event.payload_as::<ApprovalDecidedPayload>() {
                let outcome = serde_json::to_value(p.decision.outcome).unwrap_or_default();
                Self::line(
                    &mut state,
                    s.dim
                        .apply_to(format!("  approval: {}", shorten(&outcome, SHORT)))
                        .to_string(),
                );
            }
        } else if *t == EventType::BUDGET_WARNING || *t == EventType::BUDGET_EXCEEDED {
            if let Ok(p) = event.payload_as::<BudgetPayload>() {
                let what = if *t == EventType::BUDGET_WARNING {
                    "near its limit"
                } else {
                    "exceeded"
                };
                Self::line(
                    &mut state,
                    s.warn
                        .apply_to(format!(
                            "  budget {} {what}: {} of {}",
                            p.limit, p.used, p.max
                        ))
                        .to_string(),
                );
            }
        }
    }
}

/// An approval request as the terminal shows it: the action, its arguments, its preview.
pub(crate) fn approval_text(request: &ApprovalRequest) -> String {
    let action = &request.action;
    let mut text = format!(
        "? approval needed: {} {} ({})",
        action.name,
        shorten(&action.payload, SHORT),
        request.reason
    );
    if let Some(description) = &action.description {
        text.push_str(&format!("\n  {description}"));
    }
    for preview in &action.previews {
        let shown = serde_json::to_value(&preview.parts).unwrap_or_default();
        text.push_str(&format!("\n  preview: {}", shorten(&shown, SHORT * 2)));
    }
    text
}

#[async_trait]
impl EventSink for Renderer {
    async fn emit(&self, event: &RunEvent) -> AgentResult<()> {
        if self.json {
            // One event per line; a closed pipe ends the output, not the run.
            let mut out = std::io::stdout().lock();
            if let Ok(line) = serde_json::to_string(event) {
                let _ = writeln!(out, "{line}");
                let _ = out.flush();
            }
        } else {
            self.human(event);
        }
        Ok(())
    }
}
