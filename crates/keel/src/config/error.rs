//! [`ConfigError`]: what is wrong with a `keel.toml`, where, and what to write instead.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use keel_core::AgentError;

/// A `keel.toml` that cannot be served: the file, the line and column (1-based) where known,
/// the field path (`agents[0].model.id`), what is wrong, and a suggestion for a misspelt key
/// (its fields are those of [`ConfigProblem`], boxed to keep results small).
///
/// It prints as `FILE:LINE:COLUMN: FIELD: MESSAGE`, then the line with a caret under the
/// column, then `did you mean ...?` when there is a suggestion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(Box<ConfigProblem>);

/// What a [`ConfigError`] says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    /// The file.
    pub file: PathBuf,
    /// The line, from 1.
    pub line: Option<usize>,
    /// The column, from 1, in characters.
    pub column: Option<usize>,
    /// Where in the file's structure: `server.port`, `agents[1].tools.http[0].url`.
    pub field: String,
    /// What is wrong and what was expected.
    pub message: String,
    /// The key that was probably meant, for an unknown or misspelt one.
    pub suggestion: Option<String>,
    /// The offending line, for the printout.
    source_line: Option<String>,
}

impl ConfigError {
    /// An error at byte range `span` of `text` (no position when the span is empty).
    pub(crate) fn at(
        file: &Path,
        text: &str,
        span: Option<Range<usize>>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        let mut error = ConfigProblem {
            file: file.to_owned(),
            line: None,
            column: None,
            field: field.into(),
            message: message.into(),
            suggestion: None,
            source_line: None,
        };
        if let Some(span) = span.filter(|s| s.start < s.end || s.start > 0) {
            let start = span.start.min(text.len());
            let before = &text[..start];
            let line_start = before.rfind('\n').map_or(0, |i| i + 1);
            error.line = Some(before.matches('\n').count() + 1);
            error.column = Some(text[line_start..start].chars().count() + 1);
            let line_end = text[start..].find('\n').map_or(text.len(), |i| start + i);
            error.source_line = Some(text[line_start..line_end].trim_end().to_owned());
        }
        Self(Box::new(error))
    }

    /// An error about the file as a whole (it cannot be read, or an agent cannot be built).
    pub(crate) fn whole(file: &Path, field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::at(file, "", None, field, message)
    }

    /// Suggest the candidate closest to `wrong`, if any is close enough.
    pub(crate) fn suggest_from<'a>(
        mut self,
        wrong: &str,
        candidates: impl IntoIterator<Item = &'a str>,
    ) -> Self {
        self.suggestion = closest(wrong, candidates).map(str::to_owned);
        self
    }
}

/// The candidate most like `wrong`, when it is alike enough to be a misspelling.
pub(crate) fn closest<'a>(
    wrong: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|candidate| (strsim::jaro_winkler(wrong, candidate), candidate))
        .filter(|(score, _)| *score >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, candidate)| candidate)
}

/// From serde's "unknown field `x`, expected one of `a`, `b`" (or "unknown variant"): the
/// wrong name and the expected ones.
pub(crate) fn unknown_name(message: &str) -> Option<(&str, Vec<&str>)> {
    let rest = message
        .strip_prefix("unknown field `")
        .or_else(|| message.strip_prefix("unknown variant `"))?;
    let (wrong, expected) = rest.split_once('`')?;
    let names = expected
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|name| !name.is_empty())
        .collect();
    Some((wrong, names))
}

impl std::ops::Deref for ConfigError {
    type Target = ConfigProblem;
    fn deref(&self) -> &ConfigProblem {
        &self.0
    }
}

impl std::ops::DerefMut for ConfigError {
    fn deref_mut(&mut self) -> &mut ConfigProblem {
        &mut self.0
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let (Some(line), Some(column)) = (self.line, self.column) {
            write!(f, ":{line}:{column}")?;
        }
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.message)?;
        if let (Some(source), Some(column)) = (&self.source_line, self.column) {
            write!(f, "\n  | {source}\n  | {}^", " ".repeat(column - 1))?;
        }
        if let Some(suggestion) = &self.suggestion {
            write!(f, "\n  did you mean `{suggestion}`?")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

impl From<ConfigError> for AgentError {
    fn from(error: ConfigError) -> Self {
        AgentError::invalid_input("config", error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_names_and_their_expected_ones_are_read_from_serde_messages() {
        let (wrong, expected) =
            unknown_name("unknown field `modle`, expected one of `name`, `model`").unwrap();
        assert_eq!(wrong, "modle");
        assert_eq!(expected, ["name", "model"]);
        assert_eq!(closest(wrong, expected), Some("model"));
        let (wrong, expected) =
            unknown_name("unknown variant `alow`, expected `allow` or `deny`").unwrap();
        assert_eq!((wrong, expected), ("alow", vec!["allow", "deny"]));
        assert_eq!(closest("zzz", ["model", "name"]), None);
    }

    #[test]
    fn the_position_is_counted_in_lines_and_characters() {
        let text = "a = 1\nbé = 2\n";
        let error = ConfigError::at(Path::new("k.toml"), text, Some(11..12), "b", "bad");
        assert_eq!((error.line, error.column), (Some(2), Some(5)));
        assert!(error.to_string().starts_with("k.toml:2:5: b: bad"));
    }
}
