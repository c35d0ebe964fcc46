//! Artifacts: durable outputs or previews produced during a run.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::{ActionId, ArtifactId, Metadata, Part};

/// A structured output or preview: a result, a resource, a diagnostic, an action preview.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Artifact {
    /// The artifact's id.
    pub id: ArtifactId,
    /// Extensible category; `result` by default.
    pub kind: String,
    /// Display or resource name.
    pub name: Option<String>,
    /// Human description.
    pub description: Option<String>,
    /// URI of the represented resource.
    pub uri: Option<String>,
    /// MIME type.
    pub media_type: Option<String>,
    /// The runtime action it belongs to.
    pub action_id: Option<ActionId>,
    /// Content.
    #[serde(default)]
    pub parts: Vec<Part>,
    /// Application metadata.
    #[serde(default, skip_serializing_if = "Metadata::is_empty")]
    pub metadata: Metadata,
    /// When it was created.
    pub timestamp: DateTime<Utc>,
}

impl Default for Artifact {
    fn default() -> Self {
        Self {
            id: ArtifactId::new(),
            kind: "result".into(),
            name: None,
            description: None,
            uri: None,
            media_type: None,
            action_id: None,
            parts: Vec::new(),
            metadata: Metadata::new(),
            timestamp: Utc::now(),
        }
    }
}

impl Artifact {
    /// An empty `result` artifact.
    pub fn new() -> Self {
        Self::default()
    }

    /// A `result` artifact holding one text part.
    ///
    /// ```
    /// let artifact = keel_core::Artifact::text("42").named("answer");
    /// assert_eq!(artifact.kind, "result");
    /// ```
    pub fn text(text: impl Into<String>) -> Self {
        Self::new().with_part(Part::text(text))
    }

    /// Add a part.
    #[must_use]
    pub fn with_part(mut self, part: Part) -> Self {
        self.parts.push(part);
        self
    }

    /// Set the name.
    #[must_use]
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Set the kind.
    #[must_use]
    pub fn of_kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = kind.into();
        self
    }

    /// Set the media type: a [`MimeType`](crate::MimeType) constant or any string.
    ///
    /// ```
    /// use keel_core::{Artifact, MimeType};
    /// assert_eq!(Artifact::new().with_media_type(MimeType::JSON).media_type.as_deref(), Some("application/json"));
    /// assert_eq!(Artifact::new().with_media_type("text/csv").media_type.as_deref(), Some("text/csv"));
    /// ```
    #[must_use]
    pub fn with_media_type(mut self, media_type: impl Into<crate::MimeType>) -> Self {
        self.media_type = Some(media_type.into().into());
        self
    }

    /// Associate the artifact with a runtime action.
    #[must_use]
    pub fn for_action(mut self, action_id: ActionId) -> Self {
        self.action_id = Some(action_id);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn artifact_round_trips_with_extras() {
        let mut artifact = Artifact::text("report")
            .named("analysis")
            .of_kind("diagnostic")
            .for_action(ActionId::from("a-1"));
        artifact.uri = Some("file:///tmp/report.json".into());
        artifact.media_type = Some("application/json".into());
        let back: Artifact =
            serde_json::from_value(serde_json::to_value(&artifact).unwrap()).unwrap();
        assert_eq!(back, artifact);
    }
}
