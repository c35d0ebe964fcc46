//! [`RunReplay`]: a read-only view over a recorded run. It never re-executes a tool or a
//! model call; it only reads events.

use keel_core::{AgentError, AgentResult};
use serde_json::Value;

use crate::{EventType, RunEvent, RunReport};

/// Anything that holds a run's events in sequence order: a slice or `Vec` of events, a
/// [`RunReplay`], a [`RunReport`]. The assertion helpers accept any of them.
pub trait EventSource {
    /// The events, in sequence order.
    fn run_events(&self) -> &[RunEvent];
}

impl EventSource for [RunEvent] {
    fn run_events(&self) -> &[RunEvent] {
        self
    }
}

impl EventSource for Vec<RunEvent> {
    fn run_events(&self) -> &[RunEvent] {
        self
    }
}

impl EventSource for RunReport {
    fn run_events(&self) -> &[RunEvent] {
        &self.events
    }
}

impl EventSource for RunReplay {
    fn run_events(&self) -> &[RunEvent] {
        &self.events
    }
}

/// A recorded run, for inspection and tests.
///
/// ```
/// use keel_events::{RunEvent, RunReplay};
/// # let events: Vec<RunEvent> = Vec::new();
/// let replay = RunReplay::from_events(events);
/// for event in replay.find_events("action.denied") {
///     println!("{}: {}", event.sequence, event.summary);
/// }
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunReplay {
    events: Vec<RunEvent>,
}

impl RunReplay {
    /// A replay of `events`, put in sequence order.
    pub fn from_events(mut events: Vec<RunEvent>) -> Self {
        events.sort_by_key(|e| e.sequence);
        Self { events }
    }

    /// A replay of the events a report was built from.
    pub fn from_report(report: &RunReport) -> Self {
        Self::from_events(report.events.clone())
    }

    /// A replay of persisted JSON: either a report (an object with `events`) or an array
    /// of events. Malformed input, or a report of another version than
    /// [`RUN_REPORT_VERSION`](crate::RUN_REPORT_VERSION), is [`AgentError::InvalidInput`].
    pub fn from_json(json: &Value) -> AgentResult<Self> {
        let invalid =
            |e: serde_json::Error| AgentError::invalid_input("run_replay.events", e.to_string());
        match json {
            Value::Array(_) => {
                let events: Vec<RunEvent> =
                    serde_json::from_value(json.clone()).map_err(invalid)?;
                Ok(Self::from_events(events))
            }
            Value::Object(map) if !map.contains_key("events") => Err(AgentError::invalid_input(
                "run_replay",
                "a report object has no `events`",
            )),
            Value::Object(_) => Ok(Self::from_events(
                RunReport::from_value(json.clone())?.events,
            )),
            _ => Err(AgentError::invalid_input(
                "run_replay",
                "expected a report object or an array of events",
            )),
        }
    }

    /// The events, in sequence order.
    pub fn events(&self) -> &[RunEvent] {
        &self.events
    }

    /// Iterate the events in sequence order.
    pub fn iter(&self) -> std::slice::Iter<'_, RunEvent> {
        self.events.iter()
    }

    /// How many events.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The type of each event, in order.
    pub fn event_types(&self) -> Vec<&EventType> {
        self.events.iter().map(|e| &e.event_type).collect()
    }

    /// The events of one type, in order.
    pub fn find_events(&self, event_type: &str) -> Vec<&RunEvent> {
        self.events.iter().filter(|e| e.is(event_type)).collect()
    }

    /// The last event marking a final boundary, if the run reached one.
    pub fn final_event(&self) -> Option<&RunEvent> {
        self.events.iter().rev().find(|e| e.is_final)
    }

    /// The report these events make.
    pub fn report(&self) -> RunReport {
        RunReport::from_events(&self.events)
    }
}

impl<'a> IntoIterator for &'a RunReplay {
    type Item = &'a RunEvent;
    type IntoIter = std::slice::Iter<'a, RunEvent>;

    fn into_iter(self) -> Self::IntoIter {
        self.events.iter()
    }
}
