//! [`RedactionPolicy`]: masks credentials in JSON before it is persisted or leaves the
//! process. Apply it to every run report, approval request, context manifest or telemetry
//! payload that is stored — Keel's own persistence does so, and applications should too.

use keel_core::{AgentError, AgentResult, ApprovalRequest};
use std::borrow::Cow;
use std::sync::{Arc, LazyLock};

use aho_corasick::{AhoCorasick, AhoCorasickKind};

use crate::RunEvent;
use serde::{de::DeserializeOwned, Serialize};
use serde_json::Value;

/// The text that replaces a masked value.
pub const REDACTED: &str = "[REDACTED]";

/// Key fragments masked by default (matched case-insensitively, as substrings).
pub const DEFAULT_SENSITIVE_KEYS: [&str; 10] = [
    "key",
    "token",
    "password",
    "secret",
    "authorization",
    "credential",
    "api_key",
    "apikey",
    "cookie",
    "passwd",
];

/// Value prefixes masked by default wherever they appear (case-insensitively).
pub const DEFAULT_SENSITIVE_PREFIXES: [&str; 1] = ["bearer "];

/// Which JSON values to mask.
///
/// - A value whose **key** contains a sensitive fragment (case-insensitive substring:
///   `key`, `token`, `password`, `secret`, `authorization`, `credential(s)`, `api_key`,
///   `apikey`, `cookie`, `passwd`, plus configured extras) is replaced by [`REDACTED`],
///   whatever it is (a string, an object, an array).
/// - **Exception, token counts:** a *number* under a key ending in `tokens`
///   (`input_tokens`, `total_estimated_tokens`) is kept — it is a count, not a secret, and
///   reports need it. A string or object under such a key is still masked.
/// - A **string value** starting with a sensitive prefix (`Bearer ...` by default, plus
///   configured extras) is masked wherever it appears, whatever its key.
/// - `null` stays `null` (there is nothing to hide), and keys listed with
///   [`allow_key`](Self::allow_key) are never masked.
///
/// Objects and arrays are walked recursively.
///
/// ```
/// use keel_events::RedactionPolicy;
/// use serde_json::json;
/// let mut value = json!({
///     "headers": {"Authorization": "Bearer abc"},
///     "calls": [{"api_key": "k-1", "input_tokens": 120}],
///     "note": "bearer xyz",
/// });
/// RedactionPolicy::default().redact_value(&mut value);
/// assert_eq!(value, json!({
///     "headers": {"Authorization": "[REDACTED]"},
///     "calls": [{"api_key": "[REDACTED]", "input_tokens": 120}],
///     "note": "[REDACTED]",
/// }));
/// ```
#[derive(Debug, Clone)]
pub struct RedactionPolicy {
    /// Key fragments, lowercase.
    keys: Vec<String>,
    /// Value prefixes, lowercase.
    prefixes: Vec<String>,
    /// Keys never masked, lowercase.
    allowed_keys: Vec<String>,
    /// `keys` as one automaton, rebuilt whenever they change: every key of every event is
    /// matched against all fragments, and one pass over the key beats a search per fragment.
    /// `None` only when the automaton could not be built (limits no sane list reaches);
    /// then each fragment is searched for in turn.
    key_matcher: Option<AhoCorasick>,
    /// Whether each free-text field of the event envelope is masked by its name, decided
    /// when the policy is built: the names are fixed, and every event asks.
    envelope: EnvelopeVerdicts,
}

/// [`RedactionPolicy::key_is_sensitive`] of each masked field name of a [`RunEvent`].
#[derive(Debug, Clone, Copy, Default)]
struct EnvelopeVerdicts {
    summary: bool,
    agent_name: bool,
    span_id: bool,
    parent_span_id: bool,
    delegation_id: bool,
    payload: bool,
}

impl PartialEq for RedactionPolicy {
    fn eq(&self, other: &Self) -> bool {
        // The matcher is derived from `keys`.
        self.keys == other.keys
            && self.prefixes == other.prefixes
            && self.allowed_keys == other.allowed_keys
    }
}

impl Eq for RedactionPolicy {}

/// How many characters of a string value are compared with the sensitive prefixes.
const VALUE_HEAD_CHARS: usize = 64;

/// `text` as sensitive keys are compared with it: an ASCII key as it is (the comparisons
/// ignore ASCII case), any other in Unicode lowercase, as `str::to_lowercase` gives it.
fn folded(text: &str) -> Cow<'_, str> {
    if text.is_ascii() {
        Cow::Borrowed(text)
    } else {
        Cow::Owned(text.to_lowercase())
    }
}

/// The first [`VALUE_HEAD_CHARS`] characters of `value`, in Unicode lowercase.
fn lowercased_head(value: &str) -> String {
    let end = value
        .char_indices()
        .nth(VALUE_HEAD_CHARS)
        .map_or(value.len(), |(at, _)| at);
    value[..end].to_lowercase()
}

/// The automaton finding any of `fragments` (lowercase) in a [`folded`] key.
fn key_matcher(fragments: &[String]) -> Option<AhoCorasick> {
    // Keys are short: a DFA without a prefilter walks one in a few instructions a byte.
    AhoCorasick::builder()
        .ascii_case_insensitive(true)
        .kind(Some(AhoCorasickKind::DFA))
        .prefilter(false)
        .build(fragments)
        .ok()
}

impl Default for RedactionPolicy {
    fn default() -> Self {
        // Built once: every run's report is masked with the default policy, and building
        // its automaton costs more than masking a run of ten steps.
        static DEFAULT: LazyLock<RedactionPolicy> = LazyLock::new(|| {
            let owned = |list: &[&str]| list.iter().map(|item| (*item).to_owned()).collect();
            RedactionPolicy::of(
                owned(&DEFAULT_SENSITIVE_KEYS),
                owned(&DEFAULT_SENSITIVE_PREFIXES),
                Vec::new(),
            )
        });
        DEFAULT.clone()
    }
}

impl RedactionPolicy {
    fn of(keys: Vec<String>, prefixes: Vec<String>, allowed_keys: Vec<String>) -> Self {
        RedactionPolicy {
            key_matcher: None,
            keys,
            prefixes,
            allowed_keys,
            envelope: EnvelopeVerdicts::default(),
        }
        .derived()
    }

    /// The policy with what is derived from its lists (the key matcher, the envelope's
    /// verdicts) made anew.
    fn derived(mut self) -> Self {
        self.key_matcher = key_matcher(&self.keys);
        self.envelope = EnvelopeVerdicts {
            summary: self.key_is_sensitive("summary"),
            agent_name: self.key_is_sensitive("agent_name"),
            span_id: self.key_is_sensitive("span_id"),
            parent_span_id: self.key_is_sensitive("parent_span_id"),
            delegation_id: self.key_is_sensitive("delegation_id"),
            payload: self.key_is_sensitive("payload"),
        };
        self
    }

    /// The default policy.
    pub fn new() -> Self {
        Self::default()
    }

    /// Also mask values under keys containing `fragment` (case-insensitive).
    #[must_use]
    pub fn with_key(mut self, fragment: impl Into<String>) -> Self {
        self.keys.push(fragment.into().to_lowercase());
        self.derived()
    }

    /// Also mask string values starting with `prefix` (case-insensitive).
    #[must_use]
    pub fn with_value_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefixes.push(prefix.into().to_lowercase());
        self
    }

    /// Never mask values under exactly this key (case-insensitive), e.g. `token_type`.
    #[must_use]
    pub fn allow_key(mut self, key: impl Into<String>) -> Self {
        self.allowed_keys.push(key.into().to_lowercase());
        self.derived()
    }

    /// Whether values under `key` are masked: it contains a sensitive fragment and is not
    /// an allowed key, both compared in Unicode lowercase.
    fn key_is_sensitive(&self, key: &str) -> bool {
        let key = folded(key);
        let sensitive = match &self.key_matcher {
            Some(matcher) => matcher.is_match(key.as_ref()),
            None => {
                let key = key.to_ascii_lowercase();
                self.keys.iter().any(|k| key.contains(k.as_str()))
            }
        };
        sensitive
            && !self
                .allowed_keys
                .iter()
                .any(|allowed| allowed.eq_ignore_ascii_case(&key))
    }

    /// Whether a string value is masked wherever it appears: its first 64 characters,
    /// lowercased, start with a sensitive prefix.
    fn value_is_sensitive(&self, value: &str) -> bool {
        let mut head = None;
        self.prefixes.iter().any(|prefix| {
            // Most values differ from every prefix in their first byte: an ASCII first byte
            // lowercases to itself or its ASCII lowercase, so a mismatch there decides.
            if let (Some(first), Some(wanted)) = (value.bytes().next(), prefix.bytes().next()) {
                if first.is_ascii() && wanted.is_ascii() && !first.eq_ignore_ascii_case(&wanted) {
                    return false;
                }
            }
            let start = &value.as_bytes()[..prefix.len().min(value.len())];
            // An ASCII start lowercases byte for byte, so it decides alone; a non-ASCII
            // character may lowercase to several, so then the lowercased head decides.
            if prefix.is_ascii() && prefix.len() <= VALUE_HEAD_CHARS && start.is_ascii() {
                start.eq_ignore_ascii_case(prefix.as_bytes())
            } else {
                head.get_or_insert_with(|| lowercased_head(value))
                    .starts_with(prefix.as_str())
            }
        })
    }

    /// Whether `key` names a token count (`input_tokens`), whose numbers are kept.
    fn is_token_count_key(key: &str) -> bool {
        let key = folded(key);
        let key = key.as_bytes();
        key.len() >= 6 && key[key.len() - 6..].eq_ignore_ascii_case(b"tokens")
    }

    /// Mask `value` in place.
    pub fn redact_value(&self, value: &mut Value) {
        match value {
            Value::Object(map) => {
                for (key, child) in map.iter_mut() {
                    let token_count = child.is_number() && Self::is_token_count_key(key);
                    if self.key_is_sensitive(key) && !child.is_null() && !token_count {
                        *child = Value::String(REDACTED.to_owned());
                    } else {
                        self.redact_value(child);
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|item| self.redact_value(item)),
            Value::String(s) if self.value_is_sensitive(s) => *s = REDACTED.to_owned(),
            _ => {}
        }
    }

    /// Mask one event in place, as masking it inside a report's JSON would: its payload is
    /// walked like any value, and its free-text envelope fields (`summary`, `agent_name`,
    /// `span_id`, `parent_span_id`, `delegation_id`) are masked when their value (or, with
    /// configured extra keys, their name) is sensitive. Ids, type, sequence and times are
    /// Keel's own and kept. [`RunRecorder::redacting`](crate::RunRecorder::redacting) applies
    /// it to each event as it is recorded.
    pub fn redact_event(&self, event: &mut RunEvent) {
        let verdicts = self.envelope;
        let mask = |sensitive_name: bool, text: &mut String| {
            if sensitive_name || self.value_is_sensitive(text) {
                REDACTED.clone_into(text);
            }
        };
        mask(verdicts.summary, &mut event.summary);
        for (sensitive_name, field) in [
            (verdicts.agent_name, &mut event.agent_name),
            (verdicts.delegation_id, &mut event.delegation_id),
        ] {
            if let Some(text) = field {
                mask(sensitive_name, text);
            }
        }
        for (sensitive_name, field) in [
            (verdicts.span_id, &mut event.span_id),
            (verdicts.parent_span_id, &mut event.parent_span_id),
        ] {
            if let Some(text) = field {
                if sensitive_name || self.value_is_sensitive(text) {
                    *text = Arc::from(REDACTED);
                }
            }
        }
        if verdicts.payload && !event.payload.is_null() {
            event.payload = Value::String(REDACTED.to_owned());
        } else {
            self.redact_value(&mut event.payload);
        }
    }

    /// A masked copy of `value`.
    pub fn redacted(&self, value: &Value) -> Value {
        let mut copy = value.clone();
        self.redact_value(&mut copy);
        copy
    }

    /// A masked copy of any serializable value of a type whose masked JSON still reads as
    /// that type. Fails (rather than returning something unmasked) when it does not.
    pub fn redact_serializable<T: Serialize + DeserializeOwned>(
        &self,
        value: &T,
    ) -> AgentResult<T> {
        let mut json = serde_json::to_value(value).map_err(AgentError::internal)?;
        self.redact_value(&mut json);
        serde_json::from_value(json).map_err(|e| {
            AgentError::internal(format!(
                "redaction masked a structural field, so the value no longer reads: {e}"
            ))
        })
    }

    /// A masked copy of an approval request (the action's payload, metadata and preview),
    /// for persisting it or sending it to an approval service.
    pub fn redact_approval_request(
        &self,
        request: &ApprovalRequest,
    ) -> AgentResult<ApprovalRequest> {
        self.redact_serializable(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_default_field_is_masked_at_depth_and_inside_arrays() {
        let keys = [
            "key",
            "access_token",
            "Password",
            "client_secret",
            "Authorization",
            "credentials",
            "credential",
            "api_key",
            "apiKey",
            "Set-Cookie",
        ];
        for key in keys {
            let mut value = json!({
                "outer": {"list": [{"inner": {key: "s3cr3t"}}, {key: {"nested": "x"}}]},
                key: ["a", "b"],
            });
            RedactionPolicy::default().redact_value(&mut value);
            assert_eq!(value["outer"]["list"][0]["inner"][key], REDACTED, "{key}");
            assert_eq!(value["outer"]["list"][1][key], REDACTED, "{key}");
            assert_eq!(value[key], REDACTED, "{key}");
            assert!(!value.to_string().contains("s3cr3t"), "{key}");
        }
    }

    #[test]
    fn bearer_values_are_masked_under_any_key() {
        let mut value = json!({"headers": [["x-auth", "Bearer abc.def"]], "msg": "hello"});
        RedactionPolicy::default().redact_value(&mut value);
        assert_eq!(
            value,
            json!({"headers": [["x-auth", REDACTED]], "msg": "hello"})
        );
    }

    #[test]
    fn token_counts_and_nulls_are_kept() {
        let mut value = json!({
            "input_tokens": 10, "total_estimated_tokens": 5, "token": 7,
            "access_tokens": ["t1"], "password": null,
        });
        RedactionPolicy::default().redact_value(&mut value);
        assert_eq!(
            value,
            json!({
                "input_tokens": 10, "total_estimated_tokens": 5, "token": REDACTED,
                "access_tokens": REDACTED, "password": null,
            })
        );
    }

    #[test]
    fn extra_keys_prefixes_and_allowed_keys_are_configurable() {
        let policy = RedactionPolicy::new()
            .with_key("SSN")
            .with_value_prefix("sk-")
            .allow_key("token_type");
        let mut value = json!({"user_ssn": "123", "note": "sk-live-1", "token_type": "bearer-ish"});
        policy.redact_value(&mut value);
        assert_eq!(
            value,
            json!({"user_ssn": REDACTED, "note": REDACTED, "token_type": "bearer-ish"})
        );
    }

    #[test]
    fn approval_requests_are_redacted_for_persistence() {
        let mut action = keel_core::RunAction::tool_call(
            "call_api",
            json!({"url": "https://x", "headers": {"Authorization": "Bearer t"}}),
        );
        action
            .metadata
            .insert("session_cookie".into(), json!("abc"));
        let request = ApprovalRequest {
            request_id: "r-1".into(),
            action,
            reason: "network".into(),
            run_id: None,
            requested_at: chrono::Utc::now(),
        };
        let safe = RedactionPolicy::default()
            .redact_approval_request(&request)
            .unwrap();
        assert_eq!(safe.action.payload["headers"]["Authorization"], REDACTED);
        assert_eq!(safe.action.payload["url"], "https://x");
        assert_eq!(safe.action.metadata["session_cookie"], REDACTED);
        assert_eq!(safe.request_id, "r-1");
    }

    #[test]
    fn masking_a_structural_field_is_an_error_not_a_leak() {
        let request = ApprovalRequest {
            request_id: "r-1".into(),
            action: keel_core::RunAction::tool_call("t", json!({})),
            reason: "why".into(),
            run_id: None,
            requested_at: chrono::Utc::now(),
        };
        let err = RedactionPolicy::new()
            .with_key("action")
            .redact_approval_request(&request)
            .unwrap_err();
        assert_eq!(err.kind(), keel_core::ErrorKind::Internal);
    }

    #[test]
    fn keys_and_values_are_compared_in_unicode_lowercase() {
        let policy = RedactionPolicy::default()
            .with_key("Stra\u{df}e")
            .allow_key("Token_Type");
        let keys = [
            ("", false),
            ("KEY", true),
            ("my_Api_Key", true),
            ("monkey", true),
            ("token_type", false),
            ("TOKEN_TYPE", false),
            ("input_tokens", true),
            ("name", false),
            // The Kelvin sign lowercases to an ASCII `k`.
            ("\u{212a}ey", true),
            ("STRA\u{df}E", true),
        ];
        for (key, sensitive) in keys {
            assert_eq!(policy.key_is_sensitive(key), sensitive, "key {key:?}");
        }
        let values = [
            ("", false),
            ("Bearer abc", true),
            ("BEARER x", true),
            ("bearer", false),
            ("\u{130}bearer x", false),
            ("Be\u{301}arer x", false),
        ];
        for (value, sensitive) in values {
            assert_eq!(
                policy.value_is_sensitive(value),
                sensitive,
                "value {value:?}"
            );
        }
        assert!(RedactionPolicy::is_token_count_key("INPUT_TOKENS"));
        assert!(!RedactionPolicy::is_token_count_key("tokens_used"));
        // A non-ASCII prefix matches whatever its case; an empty one masks every string.
        let accented = RedactionPolicy::default().with_value_prefix("\u{e9}t\u{e9}");
        assert!(accented.value_is_sensitive("\u{c9}T\u{c9} x"));
        assert!(!accented.value_is_sensitive("ete"));
        assert!(RedactionPolicy::default()
            .with_value_prefix("")
            .value_is_sensitive("name"));
    }

    #[test]
    fn the_key_automaton_agrees_with_a_search_per_fragment() {
        let policy = RedactionPolicy::default()
            .with_key("Stra\u{df}e")
            .allow_key("Token_Type");
        let mut plain = policy.clone();
        plain.key_matcher = None;
        for key in [
            "",
            "KEY",
            "my_Api_Key",
            "monkey",
            "token_type",
            "input_tokens",
            "name",
            "\u{212a}ey",
            "STRA\u{df}E",
            "Set-Cookie",
            "pass_wd",
            "PASSWD",
        ] {
            assert_eq!(
                policy.key_is_sensitive(key),
                plain.key_is_sensitive(key),
                "key {key:?}"
            );
        }
    }
}
