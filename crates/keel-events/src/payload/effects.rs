//! The life of a scheduled effect: scheduled, then fired, canceled or dropped.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::{EventType, RunEvent, RunEventBuilder};

impl EventType {
    /// An effect was scheduled on a thread.
    pub const EFFECT_SCHEDULED: EventType = EventType::known("effect.scheduled");
    /// A scheduled effect fired (its handler ran).
    pub const EFFECT_FIRED: EventType = EventType::known("effect.fired");
    /// A scheduled effect was canceled before it fired.
    pub const EFFECT_CANCELED: EventType = EventType::known("effect.canceled");
    /// A due effect was dropped without running.
    pub const EFFECT_DROPPED: EventType = EventType::known("effect.dropped");
}

/// `effect.scheduled`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EffectScheduledPayload {
    /// The effect's timer.
    pub timer_id: String,
    /// The effect's name.
    pub name: String,
    /// When it is due.
    pub due_at: DateTime<Utc>,
}

/// `effect.fired`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EffectFiredPayload {
    /// The effect's timer.
    pub timer_id: String,
    /// The effect's name.
    pub name: String,
    /// When it was due.
    pub due_at: DateTime<Utc>,
    /// How its handler failed, or `null` when it succeeded.
    #[serde(default)]
    pub error: Option<String>,
}

/// `effect.canceled`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EffectCanceledPayload {
    /// The effect's timer.
    pub timer_id: String,
    /// The effect's name.
    pub name: String,
}

/// `effect.dropped`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EffectDroppedPayload {
    /// The effect's timer.
    pub timer_id: String,
    /// The effect's name.
    pub name: String,
    /// Why it was dropped.
    pub reason: String,
}

impl RunEvent {
    /// `effect.scheduled`.
    pub fn effect_scheduled(payload: EffectScheduledPayload) -> RunEventBuilder {
        RunEvent::builder(
            EventType::EFFECT_SCHEDULED,
            format!(
                "effect `{}` scheduled for {}",
                payload.name,
                payload.due_at.to_rfc3339()
            ),
        )
        .payload_from(payload)
    }

    /// `effect.fired`.
    pub fn effect_fired(payload: EffectFiredPayload) -> RunEventBuilder {
        RunEvent::builder(
            EventType::EFFECT_FIRED,
            format!("effect `{}` fired", payload.name),
        )
        .payload_from(payload)
    }

    /// `effect.canceled`.
    pub fn effect_canceled(payload: EffectCanceledPayload) -> RunEventBuilder {
        RunEvent::builder(
            EventType::EFFECT_CANCELED,
            format!("effect `{}` canceled", payload.name),
        )
        .payload_from(payload)
    }

    /// `effect.dropped`.
    pub fn effect_dropped(payload: EffectDroppedPayload) -> RunEventBuilder {
        RunEvent::builder(
            EventType::EFFECT_DROPPED,
            format!("effect `{}` dropped: {}", payload.name, payload.reason),
        )
        .payload_from(payload)
    }
}
