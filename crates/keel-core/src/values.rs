//! Value types shared by policy, events and models (decision 8 of the design brief): context
//! manifests, actions, approvals and budget figures. They live here so that `keel-policy`,
//! `keel-events` and `keel-llm` can share them without depending on each other.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{ActionId, Artifact, Metadata, RunId, ThreadId};

/// One section of a prepared model context with its estimated size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContextItem {
    /// `system`, `tools`, `history` or `user`.
    pub section: String,
    /// Estimated tokens.
    pub tokens: u64,
}

/// An estimate of what is about to enter a model, prepared before every call.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ContextManifest {
    /// The run.
    pub run_id: Option<RunId>,
    /// The thread.
    #[serde(alias = "session_id")]
    pub thread_id: Option<ThreadId>,
    /// The agent.
    pub agent_name: Option<String>,
    /// Model provider.
    pub provider: Option<String>,
    /// Model name.
    pub model: Option<String>,
    /// System instructions.
    pub system_tokens: u64,
    /// Tool and delegation declarations.
    pub tool_prompt_tokens: u64,
    /// Prior conversation.
    pub history_tokens: u64,
    /// The current query.
    pub user_tokens: u64,
    /// Sum of the sections; what input-token budgets check.
    pub total_estimated_tokens: u64,
    /// The model's context window, when known.
    pub context_window: Option<u64>,
    /// Per-section records.
    #[serde(default)]
    pub context_items: Vec<ContextItem>,
}

/// One concrete side-effecting operation, prepared for policy before it runs.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunAction {
    /// Stable id, correlating events, approvals and artifacts.
    pub id: ActionId,
    /// Extensible kind: `tool_call`, `delegation`, ...
    pub kind: String,
    /// What runs (the tool's name, the target agent).
    pub name: String,
    /// What the action does, in words an approver reads (a tool call's defaults to the
    /// tool's description).
    pub description: Option<String>,
    /// The complete input.
    #[serde(default)]
    pub payload: Value,
    /// Capabilities the action needs (`records.write`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
    /// Previews shown before execution (a diff, the message to be sent, the rows to be
    /// written): descriptive only, safe to render in an approval screen. Reads the single
    /// `preview` object that records written before the list existed carry.
    #[serde(
        default,
        alias = "preview",
        deserialize_with = "one_or_many",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub previews: Vec<Artifact>,
    /// What the action produced.
    pub result: Option<Artifact>,
    /// The action this one is part of.
    pub parent_action_id: Option<ActionId>,
    /// Application metadata.
    #[serde(default, skip_serializing_if = "Metadata::is_empty")]
    pub metadata: Metadata,
}

impl RunAction {
    /// A tool-call action.
    pub fn tool_call(name: impl Into<String>, payload: Value) -> Self {
        Self {
            id: ActionId::new(),
            kind: "tool_call".into(),
            name: name.into(),
            description: None,
            payload,
            capabilities: Vec::new(),
            previews: Vec::new(),
            result: None,
            parent_action_id: None,
            metadata: Metadata::new(),
        }
    }
}

/// A list, or the single value older records hold in its place.
fn one_or_many<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany<T> {
        Many(Vec<T>),
        One(T),
    }
    Ok(match OneOrMany::deserialize(deserializer)? {
        OneOrMany::Many(many) => many,
        OneOrMany::One(one) => vec![one],
    })
}

/// A request for an application to approve an action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRequest {
    /// Correlates the decision.
    pub request_id: String,
    /// The action awaiting approval.
    pub action: RunAction,
    /// Why approval is needed.
    pub reason: String,
    /// The run asking.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<RunId>,
    /// When it was asked.
    pub requested_at: DateTime<Utc>,
}

/// What an approver decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalOutcome {
    /// Run the action.
    Approved,
    /// Do not run it.
    Denied,
}

/// An approver's answer to an [`ApprovalRequest`].
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalDecision {
    /// The request answered.
    pub request_id: String,
    /// The outcome.
    pub outcome: ApprovalOutcome,
    /// Why.
    pub reason: Option<String>,
    /// Who decided.
    pub decided_by: Option<String>,
    /// When.
    pub decided_at: DateTime<Utc>,
}

/// Which budget limit a figure refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BudgetLimit {
    /// `max_steps`.
    MaxSteps,
    /// `max_llm_calls`.
    MaxLlmCalls,
    /// `max_tool_calls`.
    MaxToolCalls,
    /// `max_input_tokens`.
    MaxInputTokens,
    /// `max_output_tokens`.
    MaxOutputTokens,
    /// `max_runtime_seconds`.
    MaxRuntimeSeconds,
    /// `max_cost_micros`.
    MaxCostMicros,
}

impl BudgetLimit {
    /// The limit's field name in [`RunBudget`](crate::RunBudget).
    pub fn as_str(self) -> &'static str {
        match self {
            BudgetLimit::MaxSteps => "max_steps",
            BudgetLimit::MaxLlmCalls => "max_llm_calls",
            BudgetLimit::MaxToolCalls => "max_tool_calls",
            BudgetLimit::MaxInputTokens => "max_input_tokens",
            BudgetLimit::MaxOutputTokens => "max_output_tokens",
            BudgetLimit::MaxRuntimeSeconds => "max_runtime_seconds",
            BudgetLimit::MaxCostMicros => "max_cost_micros",
        }
    }
}

/// What a run has used so far.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BudgetUsage {
    /// Steps begun.
    pub steps: u32,
    /// Model calls made.
    pub llm_calls: u32,
    /// Tool calls made.
    pub tool_calls: u32,
    /// Input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Seconds elapsed.
    pub runtime_seconds: f64,
    /// What the priced model calls cost, in micro-dollars (millionths of the prices'
    /// currency; decision 185). Absent from JSON when nothing was priced.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cost_micros: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What a model's tokens cost, in micro-dollars per million tokens: an integer, so that
/// the cost of a run adds up exactly (decision 185). `keel.toml` gives the price in dollars
/// per million tokens (`input = 2.5` is 2_500_000 here, 2.5 micro-dollars a token).
///
/// ```
/// use keel_core::ModelPrice;
/// let price = ModelPrice::per_million(2.5, 10.0).unwrap();
/// // 1000 input tokens at $2.50/M and 200 output tokens at $10/M: $0.0025 + $0.002.
/// assert_eq!(price.cost_micros(1000, 200), 4500);
/// assert!(ModelPrice::per_million(-1.0, 1.0).is_none());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ModelPrice {
    /// Micro-dollars per million input tokens.
    pub input_micros_per_million: u64,
    /// Micro-dollars per million output tokens.
    pub output_micros_per_million: u64,
}

impl ModelPrice {
    /// The price of `input` and `output` dollars per million tokens; `None` when either is
    /// negative or not finite. Prices are kept to the micro-dollar per million tokens.
    pub fn per_million(input: f64, output: f64) -> Option<Self> {
        let micros = |dollars: f64| {
            (dollars.is_finite() && dollars >= 0.0 && dollars * 1e6 <= u64::MAX as f64)
                .then(|| (dollars * 1e6).round() as u64)
        };
        Some(Self {
            input_micros_per_million: micros(input)?,
            output_micros_per_million: micros(output)?,
        })
    }

    /// What `input` and `output` tokens cost, in micro-dollars, rounded up to the next whole
    /// micro-dollar (a call is never counted as cheaper than it was; saturating).
    pub fn cost_micros(&self, input: u64, output: u64) -> u64 {
        let total = u128::from(input) * u128::from(self.input_micros_per_million)
            + u128::from(output) * u128::from(self.output_micros_per_million);
        u64::try_from(total.div_ceil(1_000_000)).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_action_carries_a_description_and_a_list_of_previews() {
        let mut action = RunAction::tool_call("publish", json!({"id": "42"}));
        action.description = Some("Publish a record".into());
        action.previews = vec![Artifact::text("diff"), Artifact::text("notice")];
        let value = serde_json::to_value(&action).unwrap();
        assert_eq!(value["description"], "Publish a record");
        assert_eq!(value["previews"].as_array().map(Vec::len), Some(2));
        assert_eq!(serde_json::from_value::<RunAction>(value).unwrap(), action);

        let bare = serde_json::to_value(RunAction::tool_call("read", json!({}))).unwrap();
        assert!(bare.get("description").is_none() && bare.get("previews").is_none());
    }

    #[test]
    fn an_action_stored_with_one_preview_reads_as_a_list_of_one() {
        let preview = Artifact::text("will write record 7");
        let mut stored = serde_json::to_value(RunAction::tool_call("write", json!({}))).unwrap();
        stored["preview"] = serde_json::to_value(&preview).unwrap();

        let action: RunAction = serde_json::from_value(stored).unwrap();

        assert_eq!(action.previews, vec![preview]);
    }

    #[test]
    fn shared_values_round_trip() {
        let action = RunAction::tool_call("write", json!({"path": "/x"}));
        let request = ApprovalRequest {
            request_id: "r1".into(),
            action: action.clone(),
            reason: "records.write requires approval".into(),
            run_id: Some(RunId::from("run")),
            requested_at: Utc::now(),
        };
        let decision = ApprovalDecision {
            request_id: "r1".into(),
            outcome: ApprovalOutcome::Denied,
            reason: Some("no".into()),
            decided_by: Some("ops".into()),
            decided_at: Utc::now(),
        };
        let manifest = ContextManifest {
            system_tokens: 10,
            user_tokens: 5,
            total_estimated_tokens: 15,
            context_items: vec![ContextItem {
                section: "system".into(),
                tokens: 10,
            }],
            ..Default::default()
        };
        let usage = BudgetUsage {
            steps: 2,
            runtime_seconds: 0.5,
            ..Default::default()
        };
        assert_eq!(
            serde_json::from_value::<RunAction>(serde_json::to_value(&action).unwrap()).unwrap(),
            action
        );
        assert_eq!(
            serde_json::from_value::<ApprovalRequest>(serde_json::to_value(&request).unwrap())
                .unwrap(),
            request
        );
        assert_eq!(
            serde_json::from_value::<ApprovalDecision>(serde_json::to_value(&decision).unwrap())
                .unwrap(),
            decision
        );
        assert_eq!(
            serde_json::from_value::<ContextManifest>(serde_json::to_value(&manifest).unwrap())
                .unwrap(),
            manifest
        );
        assert_eq!(
            serde_json::from_value::<BudgetUsage>(serde_json::to_value(&usage).unwrap()).unwrap(),
            usage
        );
        assert_eq!(
            serde_json::to_value(BudgetLimit::MaxSteps).unwrap(),
            "max_steps"
        );
    }
}
