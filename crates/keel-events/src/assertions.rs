//! Assertion helpers for applications' tests. They panic, by design, with a message that
//! shows what was expected and what the run did.

use keel_core::{ApprovalOutcome, BudgetLimit};

use crate::payload::{ActionPolicyPayload, ApprovalDecidedPayload};
use crate::{EventSource, EventType, RunReport};

/// How [`assert_run_events`] compares the expected types with the run's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Match {
    /// The run's event types are exactly the expected list.
    Exact,
    /// The expected types appear in the run in this order, possibly with others between.
    Subsequence,
}

/// Assert that the run's event types match `expected`.
///
/// # Panics
///
/// When they do not, listing both sequences.
///
/// ```
/// use keel_events::{assert_run_events, Match, RunEvent};
/// # let events: Vec<RunEvent> = Vec::new();
/// assert_run_events(&events, &[], Match::Exact);
/// ```
#[track_caller]
pub fn assert_run_events<S: EventSource + ?Sized>(source: &S, expected: &[&str], mode: Match) {
    let actual: Vec<&str> = source
        .run_events()
        .iter()
        .map(|e| e.event_type.as_str())
        .collect();
    let ok = match mode {
        Match::Exact => actual == expected,
        Match::Subsequence => {
            let mut remaining = actual.iter();
            expected
                .iter()
                .all(|want| remaining.by_ref().any(|have| have == want))
        }
    };
    assert!(
        ok,
        "run events do not match ({mode:?}):\n  expected: {expected:?}\n  actual:   {actual:?}"
    );
}

/// Assert that no runtime work was denied: no `action.denied` event, no `action.policy`
/// deciding `deny`, and no `approval.decided` with a denied outcome. (A budget stop is a
/// different fact; check it with [`assert_budget_under`].)
///
/// # Panics
///
/// At the first denial, naming its sequence number and summary.
#[track_caller]
pub fn assert_no_denied_actions<S: EventSource + ?Sized>(source: &S) {
    for event in source.run_events() {
        let denied = if event.event_type == EventType::ACTION_DENIED {
            true
        } else if event.event_type == EventType::ACTION_POLICY {
            event
                .payload_as::<ActionPolicyPayload>()
                .map(|p| p.decision == "deny")
                .unwrap_or(false)
        } else if event.event_type == EventType::APPROVAL_DECIDED {
            event
                .payload_as::<ApprovalDecidedPayload>()
                .map(|p| p.decision.outcome == ApprovalOutcome::Denied)
                .unwrap_or(false)
        } else {
            false
        };
        assert!(
            !denied,
            "run denied an action: event #{} {} — {}",
            event.sequence, event.event_type, event.summary
        );
    }
}

/// Assert that the run's usage of `limit` is at most `max`, using the usage a
/// [`RunReport`] derives from the events (see [`BudgetReport::usage`](crate::BudgetReport)).
/// Runtime compares in seconds.
///
/// # Panics
///
/// When the usage is above `max`.
#[track_caller]
pub fn assert_budget_under<S: EventSource + ?Sized>(source: &S, limit: BudgetLimit, max: u64) {
    let report = RunReport::from_events(source.run_events());
    let usage = &report.budget.usage;
    let used = match limit {
        BudgetLimit::MaxSteps => f64::from(usage.steps),
        BudgetLimit::MaxLlmCalls => f64::from(usage.llm_calls),
        BudgetLimit::MaxToolCalls => f64::from(usage.tool_calls),
        BudgetLimit::MaxInputTokens => usage.input_tokens as f64,
        BudgetLimit::MaxOutputTokens => usage.output_tokens as f64,
        BudgetLimit::MaxRuntimeSeconds => usage.runtime_seconds,
        BudgetLimit::MaxCostMicros => usage.cost_micros as f64,
        // BudgetLimit may grow; an unknown limit cannot be checked, which is a test bug.
        #[allow(unreachable_patterns)]
        _ => panic!(
            "assert_budget_under: limit {} is not supported",
            limit.as_str()
        ),
    };
    assert!(
        used <= max as f64,
        "run used {used} of {} but the test allows at most {max}",
        limit.as_str()
    );
}
