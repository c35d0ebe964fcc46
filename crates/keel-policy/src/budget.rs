//! [`BudgetEnforcer`]: a run's [`RunBudget`] applied at the points where work is about to
//! happen.
//!
//! | limit | checked by | when |
//! |---|---|---|
//! | `max_steps` | [`check_step`](BudgetEnforcer::check_step) | before each step begins |
//! | `max_llm_calls` | [`check_llm_call`](BudgetEnforcer::check_llm_call) | before a model call |
//! | `max_input_tokens` | [`check_llm_call`](BudgetEnforcer::check_llm_call) | before a model call, with the call's [`ContextManifest`] estimate |
//! | `max_output_tokens` | [`check_output_tokens`](BudgetEnforcer::check_output_tokens) after [`record_llm_usage`](BudgetEnforcer::record_llm_usage); and before the next model call | once the call's output is known (the provider's usage, or the engine's local estimate of the answer when the provider reports none: `LlmResponse::output_tokens`) |
//! | `max_tool_calls` | [`check_tool_call`](BudgetEnforcer::check_tool_call) | before a tool executes |
//! | `max_runtime_seconds` | every check (and [`check_runtime`](BudgetEnforcer::check_runtime)) | always |
//! | `max_cost_micros` | [`check_llm_cost`](BudgetEnforcer::check_llm_cost), then [`record_llm_cost`](BudgetEnforcer::record_llm_cost) | before a priced model call, with its estimated cost (the context's tokens and the call's output limit at the model's price); the call's cost is counted once known |
//!
//! Counting: a check that passes also counts the operation it protects, so the check before
//! the (n+1)th operation fails when n == max; a failed check counts nothing. Token limits
//! are for the whole run (the sum over its model calls), like every other limit.
//!
//! [`BudgetPolicy`] is the same set of checkpoints as a trait: an application that wants
//! something else near or over a limit (allow a last call, compact first, ask for approval,
//! count in its own units) implements it, usually around a `BudgetEnforcer`, and gives the
//! agent a [`BudgetPolicyFactory`]; the enforcer is the default policy.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use keel_core::{AgentError, AgentResult, BudgetLimit, BudgetUsage, ContextManifest, RunBudget};
use serde::{Deserialize, Serialize};

/// The fraction of a limit at which a warning is raised, unless configured otherwise.
pub const DEFAULT_WARNING_FRACTION: f64 = 0.8;

/// Usage has reached the warning fraction of a limit. The payload of a `budget.warning`
/// event: `{"limit": "max_steps", "used": 4, "max": 5}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetWarning {
    /// Which limit.
    pub limit: BudgetLimit,
    /// How much is used, counting the operation just allowed (seconds for runtime,
    /// rounded up).
    pub used: u64,
    /// The configured maximum (whole seconds, rounded down, for runtime).
    pub max: u64,
}

/// Where the enforcer reads the time; injectable so tests need no sleep.
pub trait Clock: Send + Sync {
    /// The current instant.
    fn now(&self) -> Instant;
}

/// The process's monotonic clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that moves only when told to; for tests.
///
/// ```
/// use std::time::Duration;
/// use keel_policy::{Clock, ManualClock};
/// let clock = ManualClock::new();
/// let start = clock.now();
/// clock.advance(Duration::from_secs(3));
/// assert_eq!(clock.now() - start, Duration::from_secs(3));
/// ```
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<Mutex<Instant>>,
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl ManualClock {
    /// A clock stopped at the current instant.
    pub fn new() -> Self {
        Self {
            now: Arc::new(Mutex::new(Instant::now())),
        }
    }

    /// Move the clock forward. Clones share the same time.
    pub fn advance(&self, by: Duration) {
        let mut now = self
            .now
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *now += by;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        *self
            .now
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Applies a [`RunBudget`] to one run and keeps its [`BudgetUsage`].
///
/// Each check returns the warnings it raised (each limit warns at most once per enforcer)
/// or [`AgentError::BudgetExceeded`] *before* the protected operation would exceed its
/// limit. The engine emits `budget.warning` for each warning and `budget.exceeded` for the
/// error, then ends the task `failed` (decision 5).
///
/// ```
/// use keel_core::{AgentError, RunBudget};
/// use keel_policy::BudgetEnforcer;
/// let mut budget = BudgetEnforcer::new(RunBudget { max_steps: Some(2), ..Default::default() });
/// assert!(budget.check_step()?.is_empty());
/// assert_eq!(budget.check_step()?.len(), 1); // 2 of 2: a warning, once
/// let err = budget.check_step().unwrap_err(); // a third step would exceed
/// assert!(matches!(err, AgentError::BudgetExceeded { used: 2, max: 2, .. }));
/// # Ok::<(), AgentError>(())
/// ```
pub struct BudgetEnforcer {
    budget: RunBudget,
    usage: BudgetUsage,
    clock: Arc<dyn Clock>,
    started: Instant,
    /// Runtime already used before this enforcer started (a resumed run).
    prior_runtime: f64,
    /// The current model call's pre-call input estimate, replaced by the reported figure.
    pending_input_estimate: u64,
    warning_fraction: f64,
    warned: HashSet<BudgetLimit>,
}

impl std::fmt::Debug for BudgetEnforcer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BudgetEnforcer")
            .field("budget", &self.budget)
            .field("usage", &self.usage)
            .field("warning_fraction", &self.warning_fraction)
            .finish_non_exhaustive()
    }
}

impl BudgetEnforcer {
    /// An enforcer for `budget`, starting now with nothing used.
    pub fn new(budget: RunBudget) -> Self {
        Self::with_clock(budget, Arc::new(SystemClock))
    }

    /// An enforcer reading time from `clock`.
    pub fn with_clock(budget: RunBudget, clock: Arc<dyn Clock>) -> Self {
        let started = clock.now();
        Self {
            budget,
            usage: BudgetUsage::default(),
            clock,
            started,
            prior_runtime: 0.0,
            pending_input_estimate: 0,
            warning_fraction: DEFAULT_WARNING_FRACTION,
            warned: HashSet::new(),
        }
    }

    /// Continue from `usage` (a resumed run): counters and runtime carry on from there.
    #[must_use]
    pub fn resuming(mut self, usage: BudgetUsage) -> Self {
        self.prior_runtime = usage.runtime_seconds.max(0.0);
        self.usage = usage;
        self.started = self.clock.now();
        self
    }

    /// Warn when usage reaches `fraction` of a limit (clamped to `0.0..=1.0`; `1.0` warns
    /// only at the limit itself). A non-finite value keeps the default.
    #[must_use]
    pub fn with_warning_fraction(mut self, fraction: f64) -> Self {
        if fraction.is_finite() {
            self.warning_fraction = fraction.clamp(0.0, 1.0);
        }
        self
    }

    /// The budget enforced.
    pub fn budget(&self) -> &RunBudget {
        &self.budget
    }

    /// What the run has used so far, runtime included.
    pub fn usage(&self) -> BudgetUsage {
        BudgetUsage {
            runtime_seconds: self.elapsed_seconds(),
            ..self.usage.clone()
        }
    }

    fn elapsed_seconds(&self) -> f64 {
        let now = self.clock.now();
        self.prior_runtime + now.saturating_duration_since(self.started).as_secs_f64()
    }

    /// Check the runtime limit alone.
    pub fn check_runtime(&mut self) -> AgentResult<Vec<BudgetWarning>> {
        let mut warnings = Vec::new();
        self.runtime(&mut warnings)?;
        Ok(warnings)
    }

    /// Before a step begins: runtime and `max_steps`. Counts the step when it may begin.
    pub fn check_step(&mut self) -> AgentResult<Vec<BudgetWarning>> {
        let mut warnings = Vec::new();
        self.runtime(&mut warnings)?;
        let steps = u64::from(self.usage.steps);
        exceeded_by(
            BudgetLimit::MaxSteps,
            steps,
            1,
            self.budget.max_steps.map(u64::from),
        )?;
        self.usage.steps = self.usage.steps.saturating_add(1);
        self.warn_count(
            BudgetLimit::MaxSteps,
            steps + 1,
            self.budget.max_steps.map(u64::from),
            &mut warnings,
        );
        Ok(warnings)
    }

    /// Before a model call: runtime, `max_llm_calls`, `max_input_tokens` (run total so far
    /// plus this call's `manifest.total_estimated_tokens`) and `max_output_tokens` (a call
    /// when the output budget is already spent would exceed it). Counts the call and its
    /// estimated input when it may start.
    pub fn check_llm_call(
        &mut self,
        manifest: &ContextManifest,
    ) -> AgentResult<Vec<BudgetWarning>> {
        let mut warnings = Vec::new();
        self.runtime(&mut warnings)?;
        let calls = u64::from(self.usage.llm_calls);
        let max_calls = self.budget.max_llm_calls.map(u64::from);
        exceeded_by(BudgetLimit::MaxLlmCalls, calls, 1, max_calls)?;
        let estimate = manifest.total_estimated_tokens;
        exceeded_by(
            BudgetLimit::MaxInputTokens,
            self.usage.input_tokens,
            estimate,
            self.budget.max_input_tokens,
        )?;
        if let Some(max) = self.budget.max_output_tokens {
            if self.usage.output_tokens >= max {
                return Err(exceeded(
                    BudgetLimit::MaxOutputTokens,
                    self.usage.output_tokens,
                    max,
                ));
            }
        }
        self.usage.llm_calls = self.usage.llm_calls.saturating_add(1);
        self.usage.input_tokens = self.usage.input_tokens.saturating_add(estimate);
        self.pending_input_estimate = estimate;
        self.warn_count(
            BudgetLimit::MaxLlmCalls,
            calls + 1,
            max_calls,
            &mut warnings,
        );
        self.warn_count(
            BudgetLimit::MaxInputTokens,
            self.usage.input_tokens,
            self.budget.max_input_tokens,
            &mut warnings,
        );
        Ok(warnings)
    }

    /// After a model call: the provider's (or a local estimate of) usage. The reported
    /// input replaces the pre-call estimate counted by
    /// [`check_llm_call`](Self::check_llm_call); a report of `0` input keeps the estimate,
    /// since providers that report nothing did still read their input.
    pub fn record_llm_usage(&mut self, input_tokens: u64, output_tokens: u64) {
        if input_tokens > 0 {
            self.usage.input_tokens = self
                .usage
                .input_tokens
                .saturating_sub(self.pending_input_estimate)
                .saturating_add(input_tokens);
        }
        self.pending_input_estimate = 0;
        self.usage.output_tokens = self.usage.output_tokens.saturating_add(output_tokens);
    }

    /// After usage is recorded: runtime and `max_output_tokens`. Fails when the run's output
    /// already exceeds the limit (the call is done; no further work may start); reaching it
    /// exactly passes, and the next [`check_llm_call`](Self::check_llm_call) then fails.
    pub fn check_output_tokens(&mut self) -> AgentResult<Vec<BudgetWarning>> {
        let mut warnings = Vec::new();
        self.runtime(&mut warnings)?;
        exceeded_by(
            BudgetLimit::MaxOutputTokens,
            self.usage.output_tokens,
            0,
            self.budget.max_output_tokens,
        )?;
        self.warn_count(
            BudgetLimit::MaxOutputTokens,
            self.usage.output_tokens,
            self.budget.max_output_tokens,
            &mut warnings,
        );
        Ok(warnings)
    }

    /// Before a priced model call (made just before [`check_llm_call`](Self::check_llm_call)):
    /// fails when the run's cost so far plus `estimate_micros` (the call's context at the
    /// input price and its output limit at the output price) would pass `max_cost_micros`.
    /// Counts nothing: the call's cost is counted by [`record_llm_cost`](Self::record_llm_cost)
    /// once it is known. A model with no price is never checked (decision 186).
    pub fn check_llm_cost(&mut self, estimate_micros: u64) -> AgentResult<Vec<BudgetWarning>> {
        let mut warnings = Vec::new();
        exceeded_by(
            BudgetLimit::MaxCostMicros,
            self.usage.cost_micros,
            estimate_micros,
            self.budget.max_cost_micros,
        )?;
        self.warn_count(
            BudgetLimit::MaxCostMicros,
            self.usage.cost_micros.saturating_add(estimate_micros),
            self.budget.max_cost_micros,
            &mut warnings,
        );
        Ok(warnings)
    }

    /// After a priced model call: what it cost, from its usage at the model's price.
    pub fn record_llm_cost(&mut self, cost_micros: u64) {
        self.usage.cost_micros = self.usage.cost_micros.saturating_add(cost_micros);
    }

    /// Before a tool executes: runtime and `max_tool_calls`. Counts the call when it may run.
    pub fn check_tool_call(&mut self) -> AgentResult<Vec<BudgetWarning>> {
        let mut warnings = Vec::new();
        self.runtime(&mut warnings)?;
        let calls = u64::from(self.usage.tool_calls);
        let max = self.budget.max_tool_calls.map(u64::from);
        exceeded_by(BudgetLimit::MaxToolCalls, calls, 1, max)?;
        self.usage.tool_calls = self.usage.tool_calls.saturating_add(1);
        self.warn_count(BudgetLimit::MaxToolCalls, calls + 1, max, &mut warnings);
        Ok(warnings)
    }

    fn runtime(&mut self, warnings: &mut Vec<BudgetWarning>) -> AgentResult<()> {
        let Some(max) = self.budget.max_runtime_seconds else {
            return Ok(());
        };
        let elapsed = self.elapsed_seconds();
        self.usage.runtime_seconds = elapsed;
        // Whole seconds for the error's integer fields: used rounds up, max down, so the
        // message never reads "used 5 of 5" for a run that is over its limit.
        let used = elapsed.ceil() as u64;
        let max_whole = max.max(0.0).floor() as u64;
        if elapsed > max {
            return Err(exceeded(BudgetLimit::MaxRuntimeSeconds, used, max_whole));
        }
        if elapsed >= max * self.warning_fraction {
            self.warn_once(BudgetLimit::MaxRuntimeSeconds, used, max_whole, warnings);
        }
        Ok(())
    }

    fn warn_count(
        &mut self,
        limit: BudgetLimit,
        used: u64,
        max: Option<u64>,
        warnings: &mut Vec<BudgetWarning>,
    ) {
        if let Some(max) = max {
            // Compared in f64 so a fraction of a small limit (0.8 of 1) still warns.
            if used as f64 >= max as f64 * self.warning_fraction {
                self.warn_once(limit, used, max, warnings);
            }
        }
    }

    fn warn_once(
        &mut self,
        limit: BudgetLimit,
        used: u64,
        max: u64,
        warnings: &mut Vec<BudgetWarning>,
    ) {
        if self.warned.insert(limit) {
            warnings.push(BudgetWarning { limit, used, max });
        }
    }
}

/// A run's budget decisions, consulted by the engine at each checkpoint in the table above:
/// before a step, before a model call (with its [`ContextManifest`]), after a model call
/// (usage, then [`check_output_tokens`](Self::check_output_tokens)), before a tool runs.
///
/// A check answers the warnings it raises (each becomes a `budget.warning` event) or an
/// error that stops the protected operation: [`AgentError::BudgetExceeded`] ends the task
/// `failed` with a `budget.exceeded` event (decision 5); any other error ends the run as
/// that error does. [`BudgetEnforcer`] is the default; a policy of its own usually wraps
/// one and changes what happens at a limit.
///
/// ```
/// use keel_core::{AgentError, AgentResult, BudgetUsage, ContextManifest, RunBudget};
/// use keel_policy::{BudgetEnforcer, BudgetPolicy, BudgetWarning};
///
/// /// Allows one model call past the limit, once, for a last answer.
/// struct GraceCall { inner: BudgetEnforcer, grace_used: bool }
///
/// impl BudgetPolicy for GraceCall {
///     fn usage(&self) -> BudgetUsage { self.inner.usage() }
///     fn check_step(&mut self) -> AgentResult<Vec<BudgetWarning>> { self.inner.check_step() }
///     fn check_llm_call(&mut self, manifest: &ContextManifest) -> AgentResult<Vec<BudgetWarning>> {
///         match self.inner.check_llm_call(manifest) {
///             Err(AgentError::BudgetExceeded { limit, .. })
///                 if limit == "max_llm_calls" && !self.grace_used =>
///             {
///                 self.grace_used = true;
///                 Ok(Vec::new())
///             }
///             other => other,
///         }
///     }
///     fn record_llm_usage(&mut self, input: u64, output: u64) { self.inner.record_llm_usage(input, output) }
///     fn check_output_tokens(&mut self) -> AgentResult<Vec<BudgetWarning>> { self.inner.check_output_tokens() }
///     fn check_tool_call(&mut self) -> AgentResult<Vec<BudgetWarning>> { self.inner.check_tool_call() }
/// }
///
/// let budget = RunBudget { max_llm_calls: Some(1), ..Default::default() };
/// let mut policy = GraceCall { inner: BudgetEnforcer::new(budget), grace_used: false };
/// let manifest = ContextManifest::default();
/// policy.check_llm_call(&manifest)?;
/// policy.check_llm_call(&manifest)?; // the grace call
/// assert!(policy.check_llm_call(&manifest).is_err());
/// # Ok::<(), AgentError>(())
/// ```
pub trait BudgetPolicy: Send {
    /// What the run has used so far; the engine reports it with every budget event.
    fn usage(&self) -> BudgetUsage;
    /// Before a step begins.
    fn check_step(&mut self) -> AgentResult<Vec<BudgetWarning>>;
    /// Before a model call, with the estimate of the context it will read.
    fn check_llm_call(&mut self, manifest: &ContextManifest) -> AgentResult<Vec<BudgetWarning>>;
    /// After a model call: the tokens it used (the provider's figures, or local estimates).
    fn record_llm_usage(&mut self, input_tokens: u64, output_tokens: u64);
    /// After usage is recorded.
    fn check_output_tokens(&mut self) -> AgentResult<Vec<BudgetWarning>>;
    /// Before a tool executes.
    fn check_tool_call(&mut self) -> AgentResult<Vec<BudgetWarning>>;
    /// Before a model call whose model has a price, ahead of
    /// [`check_llm_call`](Self::check_llm_call): its estimated cost in micro-dollars. The
    /// default allows every call (a policy of its own that counts cost overrides it).
    fn check_llm_cost(&mut self, estimate_micros: u64) -> AgentResult<Vec<BudgetWarning>> {
        let _ = estimate_micros;
        Ok(Vec::new())
    }
    /// After a priced model call: what it cost, in micro-dollars. The default ignores it.
    fn record_llm_cost(&mut self, cost_micros: u64) {
        let _ = cost_micros;
    }
}

impl BudgetPolicy for BudgetEnforcer {
    fn usage(&self) -> BudgetUsage {
        BudgetEnforcer::usage(self)
    }
    fn check_step(&mut self) -> AgentResult<Vec<BudgetWarning>> {
        BudgetEnforcer::check_step(self)
    }
    fn check_llm_call(&mut self, manifest: &ContextManifest) -> AgentResult<Vec<BudgetWarning>> {
        BudgetEnforcer::check_llm_call(self, manifest)
    }
    fn record_llm_usage(&mut self, input_tokens: u64, output_tokens: u64) {
        BudgetEnforcer::record_llm_usage(self, input_tokens, output_tokens);
    }
    fn check_output_tokens(&mut self) -> AgentResult<Vec<BudgetWarning>> {
        BudgetEnforcer::check_output_tokens(self)
    }
    fn check_tool_call(&mut self) -> AgentResult<Vec<BudgetWarning>> {
        BudgetEnforcer::check_tool_call(self)
    }
    fn check_llm_cost(&mut self, estimate_micros: u64) -> AgentResult<Vec<BudgetWarning>> {
        BudgetEnforcer::check_llm_cost(self, estimate_micros)
    }
    fn record_llm_cost(&mut self, cost_micros: u64) {
        BudgetEnforcer::record_llm_cost(self, cost_micros);
    }
}

/// Makes each run's [`BudgetPolicy`] from the budget that run is under (the caller's
/// `RunContext.budget` narrowed by the agent's own limits). Any
/// `Fn(RunBudget) -> Box<dyn BudgetPolicy>` is one.
///
/// ```
/// use keel_core::RunBudget;
/// use keel_policy::{BudgetEnforcer, BudgetPolicy, BudgetPolicyFactory};
/// let warn_at_half = |budget: RunBudget| -> Box<dyn BudgetPolicy> {
///     Box::new(BudgetEnforcer::new(budget).with_warning_fraction(0.5))
/// };
/// let mut policy = warn_at_half.policy_for(RunBudget { max_steps: Some(2), ..Default::default() });
/// assert_eq!(policy.check_step().unwrap().len(), 1);
/// ```
pub trait BudgetPolicyFactory: Send + Sync {
    /// The policy for one run under `budget`.
    fn policy_for(&self, budget: RunBudget) -> Box<dyn BudgetPolicy>;
}

impl<F> BudgetPolicyFactory for F
where
    F: Fn(RunBudget) -> Box<dyn BudgetPolicy> + Send + Sync,
{
    fn policy_for(&self, budget: RunBudget) -> Box<dyn BudgetPolicy> {
        self(budget)
    }
}

/// The default [`BudgetPolicyFactory`]: a [`BudgetEnforcer`] per run.
#[derive(Debug, Clone, Copy, Default)]
pub struct EnforceBudget;

impl BudgetPolicyFactory for EnforceBudget {
    fn policy_for(&self, budget: RunBudget) -> Box<dyn BudgetPolicy> {
        Box::new(BudgetEnforcer::new(budget))
    }
}

/// Fails when adding `next` to `used` would pass `max`.
fn exceeded_by(limit: BudgetLimit, used: u64, next: u64, max: Option<u64>) -> AgentResult<()> {
    match max {
        Some(max) if used.saturating_add(next) > max => Err(exceeded(limit, used, max)),
        _ => Ok(()),
    }
}

fn exceeded(limit: BudgetLimit, used: u64, max: u64) -> AgentError {
    AgentError::BudgetExceeded {
        limit: limit.as_str().to_owned(),
        used,
        max,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An enforcer of a budget that has only the limits `set` sets.
    fn limited(set: impl FnOnce(&mut RunBudget)) -> BudgetEnforcer {
        let mut budget = RunBudget::default();
        set(&mut budget);
        BudgetEnforcer::new(budget)
    }

    /// Like [`limited`], on a clock the test moves by hand.
    fn clocked(set: impl FnOnce(&mut RunBudget)) -> (ManualClock, BudgetEnforcer) {
        let clock = ManualClock::new();
        let mut budget = RunBudget::default();
        set(&mut budget);
        let enforcer = BudgetEnforcer::with_clock(budget, Arc::new(clock.clone()));
        (clock, enforcer)
    }

    fn manifest(tokens: u64) -> ContextManifest {
        ContextManifest {
            total_estimated_tokens: tokens,
            ..Default::default()
        }
    }

    /// Asserts that `checked` is the refusal of `limit` with `used` of `max`.
    #[track_caller]
    fn assert_refused<T: std::fmt::Debug>(
        checked: AgentResult<T>,
        limit: &str,
        used: u64,
        max: u64,
    ) {
        match checked.unwrap_err() {
            AgentError::BudgetExceeded {
                limit: refused,
                used: was,
                max: of,
            } => assert_eq!((refused.as_str(), was, of), (limit, used, max)),
            other => panic!("expected BudgetExceeded, got {other:?}"),
        }
    }

    #[test]
    fn max_steps_stops_the_step_after_the_last_allowed() {
        let mut b = limited(|l| l.max_steps = Some(3));
        for _ in 0..3 {
            b.check_step().unwrap();
        }
        assert_refused(b.check_step(), "max_steps", 3, 3);
        // A refused step is not counted.
        assert_eq!(b.usage().steps, 3);
    }

    #[test]
    fn max_llm_calls_is_checked_before_the_call() {
        let mut b = limited(|l| l.max_llm_calls = Some(2));
        b.check_llm_call(&manifest(1)).unwrap();
        b.check_llm_call(&manifest(1)).unwrap();
        assert_refused(b.check_llm_call(&manifest(1)), "max_llm_calls", 2, 2);
    }

    #[test]
    fn max_input_tokens_uses_the_manifest_before_the_call() {
        let mut b = limited(|l| l.max_input_tokens = Some(1000));
        // A single oversized context is refused before any call is made.
        assert_refused(
            b.check_llm_call(&manifest(1001)),
            "max_input_tokens",
            0,
            1000,
        );
        assert_eq!(b.usage().llm_calls, 0);
        b.check_llm_call(&manifest(600)).unwrap();
        // The provider reports 500 real input tokens: they replace the 600 estimate.
        b.record_llm_usage(500, 10);
        assert_eq!(b.usage().input_tokens, 500);
        b.check_llm_call(&manifest(500)).unwrap(); // exactly 1000: allowed
        assert_refused(
            b.check_llm_call(&manifest(1)),
            "max_input_tokens",
            1000,
            1000,
        );
    }

    #[test]
    fn max_output_tokens_is_checked_once_usage_is_known() {
        let mut b = limited(|l| l.max_output_tokens = Some(100));
        b.check_llm_call(&manifest(1)).unwrap();
        b.record_llm_usage(1, 100);
        b.check_output_tokens().unwrap(); // at the limit: this call is fine ...
                                          // ... but another call could only exceed it.
        assert_refused(
            b.check_llm_call(&manifest(1)),
            "max_output_tokens",
            100,
            100,
        );
        let mut b = limited(|l| l.max_output_tokens = Some(100));
        b.check_llm_call(&manifest(1)).unwrap();
        b.record_llm_usage(1, 150);
        assert_refused(b.check_output_tokens(), "max_output_tokens", 150, 100);
    }

    #[test]
    fn max_tool_calls_is_checked_before_the_tool_runs() {
        let mut b = limited(|l| l.max_tool_calls = Some(1));
        b.check_tool_call().unwrap();
        assert_refused(b.check_tool_call(), "max_tool_calls", 1, 1);
    }

    #[test]
    fn max_cost_refuses_a_call_whose_estimate_would_pass_it_and_counts_what_calls_cost() {
        let mut b = limited(|l| l.max_cost_micros = Some(1000));
        // An estimate alone over the limit is refused before anything is spent.
        assert_refused(b.check_llm_cost(1001), "max_cost_micros", 0, 1000);
        b.check_llm_cost(600).unwrap();
        // The check counts nothing: the call's real cost does.
        assert_eq!(b.usage().cost_micros, 0);
        b.record_llm_cost(700);
        assert_eq!(b.usage().cost_micros, 700);
        b.check_llm_cost(300).unwrap(); // exactly 1000: allowed
        assert_refused(b.check_llm_cost(301), "max_cost_micros", 700, 1000);
    }

    #[test]
    fn runtime_is_checked_on_every_check() {
        let (clock, mut b) = clocked(|l| l.max_runtime_seconds = Some(10.0));
        b.check_step().unwrap();
        clock.advance(Duration::from_secs(11));
        assert_refused(b.check_step(), "max_runtime_seconds", 11, 10);
        assert!(b.check_tool_call().is_err());
        assert!(b.check_llm_call(&manifest(0)).is_err());
        assert!(b.check_output_tokens().is_err());
        assert!(b.check_runtime().is_err());
        assert!((b.usage().runtime_seconds - 11.0).abs() < 1e-9);
    }

    #[test]
    fn resumed_run_carries_its_runtime_and_counters() {
        let prior = BudgetUsage {
            steps: 2,
            runtime_seconds: 9.5,
            ..Default::default()
        };
        let (clock, b) = clocked(|l| {
            l.max_steps = Some(3);
            l.max_runtime_seconds = Some(10.0);
        });
        let mut b = b.resuming(prior);
        b.check_step().unwrap();
        assert!(b.check_step().is_err());
        clock.advance(Duration::from_secs(1));
        // 10.5 seconds: used rounds up.
        assert_refused(b.check_runtime(), "max_runtime_seconds", 11, 10);
    }

    #[test]
    fn warnings_are_raised_once_per_limit_near_the_limit() {
        let (clock, mut b) = clocked(|l| {
            l.max_steps = Some(5);
            l.max_tool_calls = Some(10);
            l.max_runtime_seconds = Some(100.0);
        });
        let mut seen = Vec::new();
        for _ in 0..5 {
            seen.extend(b.check_step().unwrap());
        }
        assert_eq!(
            seen,
            [BudgetWarning {
                limit: BudgetLimit::MaxSteps,
                used: 4,
                max: 5
            }]
        );
        clock.advance(Duration::from_secs(80));
        let w = b.check_tool_call().unwrap();
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].limit, BudgetLimit::MaxRuntimeSeconds);
        clock.advance(Duration::from_secs(5));
        assert!(b.check_tool_call().unwrap().is_empty());
    }

    #[test]
    fn warning_fraction_is_configurable() {
        let mut b = limited(|l| l.max_tool_calls = Some(10)).with_warning_fraction(0.5);
        let counts: Vec<usize> = (0..10)
            .map(|_| b.check_tool_call().unwrap().len())
            .collect();
        assert_eq!(counts, [0, 0, 0, 0, 1, 0, 0, 0, 0, 0]);
        let json = serde_json::to_value(BudgetWarning {
            limit: BudgetLimit::MaxToolCalls,
            used: 5,
            max: 10,
        })
        .unwrap();
        assert_eq!(
            json,
            serde_json::json!({"limit": "max_tool_calls", "used": 5, "max": 10})
        );
    }

    #[test]
    fn unlimited_budget_never_fails_or_warns() {
        let mut b = BudgetEnforcer::new(RunBudget::default());
        for _ in 0..100 {
            assert!(b.check_step().unwrap().is_empty());
            assert!(b.check_llm_call(&manifest(1_000_000)).unwrap().is_empty());
            b.record_llm_usage(0, 1_000_000);
            assert!(b.check_output_tokens().unwrap().is_empty());
            assert!(b.check_tool_call().unwrap().is_empty());
        }
    }
}
