//! Media types: the common ones as named constants, any other still accepted as a string.

use std::borrow::Cow;
use std::fmt;

use serde::{Deserialize, Serialize};

/// A media (MIME) type such as `text/plain`. The types seed 001 lists are constants; any
/// other string converts too, so every API that takes `impl Into<MimeType>` still accepts a
/// plain `&str` or `String`. Serialized as the bare string.
///
/// ```
/// use keel_core::MimeType;
/// assert_eq!(MimeType::JSON.as_str(), "application/json");
/// assert_eq!(MimeType::from("text/csv").as_str(), "text/csv");
/// assert!(MimeType::PNG.is_image());
/// assert_eq!(MimeType::from("TEXT/Plain"), MimeType::TEXT);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct MimeType(Cow<'static, str>);

impl MimeType {
    /// `text/plain`.
    pub const TEXT: MimeType = MimeType::known("text/plain");
    /// `text/markdown`.
    pub const MARKDOWN: MimeType = MimeType::known("text/markdown");
    /// `text/html`.
    pub const HTML: MimeType = MimeType::known("text/html");
    /// `application/json`.
    pub const JSON: MimeType = MimeType::known("application/json");
    /// `image/png`.
    pub const PNG: MimeType = MimeType::known("image/png");
    /// `image/jpeg`.
    pub const JPEG: MimeType = MimeType::known("image/jpeg");
    /// `image/webp`.
    pub const WEBP: MimeType = MimeType::known("image/webp");
    /// `audio/wav`.
    pub const WAV: MimeType = MimeType::known("audio/wav");
    /// `audio/mpeg`.
    pub const MPEG_AUDIO: MimeType = MimeType::known("audio/mpeg");
    /// `audio/ogg`.
    pub const OGG: MimeType = MimeType::known("audio/ogg");
    /// `video/mp4`.
    pub const MP4: MimeType = MimeType::known("video/mp4");
    /// `video/webm`.
    pub const WEBM: MimeType = MimeType::known("video/webm");
    /// `application/pdf`.
    pub const PDF: MimeType = MimeType::known("application/pdf");

    /// Every type with a constant, in the seed's order.
    pub const COMMON: [MimeType; 13] = [
        Self::TEXT,
        Self::MARKDOWN,
        Self::HTML,
        Self::JSON,
        Self::PNG,
        Self::JPEG,
        Self::WEBP,
        Self::WAV,
        Self::MPEG_AUDIO,
        Self::OGG,
        Self::MP4,
        Self::WEBM,
        Self::PDF,
    ];

    const fn known(value: &'static str) -> Self {
        MimeType(Cow::Borrowed(value))
    }

    /// The type as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The top-level type (`image` of `image/png`).
    pub fn top_level(&self) -> &str {
        self.0.split('/').next().unwrap_or_default()
    }

    /// Whether this is one of the constants above.
    pub fn is_common(&self) -> bool {
        Self::COMMON.contains(self)
    }

    /// Whether this is an `image/*` type.
    pub fn is_image(&self) -> bool {
        self.top_level() == "image"
    }

    /// Whether this is a `text/*` type.
    pub fn is_text(&self) -> bool {
        self.top_level() == "text"
    }
}

/// Media types are case-insensitive; parameters (`; charset=utf-8`) are kept as written.
impl From<&str> for MimeType {
    fn from(value: &str) -> Self {
        let value = value.trim();
        match Self::COMMON
            .iter()
            .find(|known| known.as_str().eq_ignore_ascii_case(value))
        {
            Some(known) => known.clone(),
            None => MimeType(Cow::Owned(value.to_owned())),
        }
    }
}

impl From<String> for MimeType {
    fn from(value: String) -> Self {
        MimeType::from(value.as_str())
    }
}

impl From<&String> for MimeType {
    fn from(value: &String) -> Self {
        MimeType::from(value.as_str())
    }
}

impl From<MimeType> for String {
    fn from(value: MimeType) -> Self {
        value.0.into_owned()
    }
}

impl AsRef<str> for MimeType {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl PartialEq<str> for MimeType {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for MimeType {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl fmt::Display for MimeType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serializes_as_the_bare_string_and_reads_any_string_back() {
        assert_eq!(
            serde_json::to_value(MimeType::PDF).unwrap(),
            "application/pdf"
        );
        let back: MimeType = serde_json::from_value(serde_json::json!("text/csv")).unwrap();
        assert_eq!(back, "text/csv");
        assert!(!back.is_common());
    }

    #[test]
    fn common_types_are_recognised_whatever_their_case() {
        assert_eq!(MimeType::from("Image/PNG"), MimeType::PNG);
        assert!(MimeType::from(" application/json ").is_common());
        assert_eq!(MimeType::COMMON.len(), 13);
        assert!(MimeType::MARKDOWN.is_text());
    }
}
