//! [`RedactionPolicy`]: masks credentials in JSON before it is persisted or leaves the
//! process. Apply it to every run report, approval request, context manifest or telemetry
//! payload that is stored — Keel's own persistence does so, and applications should too.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

use keel_core::{AgentError, AgentResult, ApprovalRequest};

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedactionPolicy {
    // Shared among clones (the engine makes a policy per run), copied when one is changed.
    keys: Arc<Vec<String>>,
    prefixes: Arc<Vec<String>>,
    /// Which ASCII bytes some prefix starts with (bit `b`), or all bits when a prefix is
    /// empty or starts with a non-ASCII character: most values are told apart by their first
    /// byte alone, and every string of every persisted event is checked.
    prefix_starts: u128,
    allowed_keys: Arc<Vec<String>>,
    verdicts: KeyVerdicts,
    /// The verdicts for the event envelope's field names ([`ENVELOPE_FIELDS`]): fixed by
    /// the keys, so masking an event looks none of them up.
    envelope: [bool; ENVELOPE_FIELDS.len()],
}

/// Answers of `key_is_sensitive` already worked out. The keys of persisted events come
/// mostly from a small vocabulary (Keel's payload fields, a tool's argument names), and
/// looking one up costs far less than matching it against every fragment again, event after
/// event. The default policy (the one the engine makes for every run) keeps its answers per
/// thread, so a lookup takes no lock; a configured policy shares its answers among its clones.
/// At most [`KeyVerdicts::CAPACITY`] keys are kept per cache, so keys made of data (ids as
/// keys) cannot grow it without bound; past that, keys are matched as before.
#[derive(Clone)]
enum KeyVerdicts {
    /// The default policy's answers, in a thread-local map.
    Default,
    /// A configured policy's answers, shared by its clones.
    Shared(Arc<RwLock<VerdictMap>>),
}

type VerdictMap = HashMap<Box<str>, bool, foldhash::fast::RandomState>;

thread_local! {
    static DEFAULT_VERDICTS: std::cell::RefCell<VerdictMap> = std::cell::RefCell::default();
    /// The default policy's verdicts on struct field names, by the address of the name:
    /// a payload struct's fields are the same `&'static str`s event after event, so one
    /// comparison of address and length finds the verdict, with no hashing of the text.
    static FIELD_VERDICTS: std::cell::RefCell<[(usize, usize, bool); FIELD_SLOTS]> =
        const { std::cell::RefCell::new([(0, 0, false); FIELD_SLOTS]) };
}

/// Slots of the field-name cache (a power of two).
const FIELD_SLOTS: usize = 256;

impl KeyVerdicts {
    const CAPACITY: usize = 4096;

    /// A fresh cache for a policy whose rules differ from the default's.
    fn configured() -> KeyVerdicts {
        KeyVerdicts::Shared(Arc::default())
    }

    fn get_or_insert_with(&self, key: &str, verdict: impl FnOnce() -> bool) -> bool {
        fn remember(map: &mut VerdictMap, key: &str, verdict: bool) {
            if map.len() < KeyVerdicts::CAPACITY {
                map.insert(key.into(), verdict);
            }
        }
        match self {
            KeyVerdicts::Default => DEFAULT_VERDICTS.with(|map| {
                if let Some(&known) = map.borrow().get(key) {
                    return known;
                }
                let verdict = verdict();
                remember(&mut map.borrow_mut(), key, verdict);
                verdict
            }),
            KeyVerdicts::Shared(map) => {
                if let Some(&known) = map.read().unwrap_or_else(PoisonError::into_inner).get(key) {
                    return known;
                }
                let verdict = verdict();
                remember(
                    &mut map.write().unwrap_or_else(PoisonError::into_inner),
                    key,
                    verdict,
                );
                verdict
            }
        }
    }
}

impl std::fmt::Debug for KeyVerdicts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyVerdicts")
    }
}

/// A cache says nothing about what a policy masks: policies are equal by their rules.
impl PartialEq for KeyVerdicts {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for KeyVerdicts {}

/// An event's envelope field, as masking sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Envelope {
    Summary,
    AgentName,
    SpanId,
    ParentSpanId,
    DelegationId,
    Payload,
    /// Ids, type, sequence, times: Keel's own, never masked.
    Kept,
}

/// The envelope fields [`RedactionPolicy::redact_event`] judges by name, in the order of
/// [`RedactionPolicy::envelope`]'s verdicts.
const ENVELOPE_FIELDS: [&str; 6] = [
    "summary",
    "agent_name",
    "span_id",
    "parent_span_id",
    "delegation_id",
    "payload",
];

/// The default policy, built once: a clone shares its lists.
static DEFAULT_POLICY: std::sync::LazyLock<RedactionPolicy> = std::sync::LazyLock::new(|| {
    RedactionPolicy {
        keys: Arc::new(
            DEFAULT_SENSITIVE_KEYS
                .iter()
                .map(|k| (*k).to_owned())
                .collect(),
        ),
        prefixes: Arc::new(
            DEFAULT_SENSITIVE_PREFIXES
                .iter()
                .map(|p| (*p).to_owned())
                .collect(),
        ),
        prefix_starts: 0,
        allowed_keys: Arc::default(),
        verdicts: KeyVerdicts::Default,
        envelope: [false; ENVELOPE_FIELDS.len()],
    }
    .with_envelope_verdicts()
    .with_prefix_starts()
});

impl Default for RedactionPolicy {
    fn default() -> Self {
        DEFAULT_POLICY.clone()
    }
}

impl RedactionPolicy {
    /// The default policy.
    pub fn new() -> Self {
        Self::default()
    }

    /// Also mask values under keys containing `fragment` (case-insensitive).
    #[must_use]
    pub fn with_key(mut self, fragment: impl Into<String>) -> Self {
        Arc::make_mut(&mut self.keys).push(fragment.into().to_lowercase());
        self.verdicts = KeyVerdicts::configured();
        self.with_envelope_verdicts()
    }

    /// Also mask string values starting with `prefix` (case-insensitive).
    #[must_use]
    pub fn with_value_prefix(mut self, prefix: impl Into<String>) -> Self {
        Arc::make_mut(&mut self.prefixes).push(prefix.into().to_lowercase());
        self.with_prefix_starts()
    }

    /// Never mask values under exactly this key (case-insensitive), e.g. `token_type`.
    #[must_use]
    pub fn allow_key(mut self, key: impl Into<String>) -> Self {
        Arc::make_mut(&mut self.allowed_keys).push(key.into().to_lowercase());
        self.verdicts = KeyVerdicts::configured();
        self.with_envelope_verdicts()
    }

    /// Work out [`prefix_starts`](Self::prefix_starts) again, after the prefixes changed.
    fn with_prefix_starts(mut self) -> Self {
        self.prefix_starts =
            self.prefixes
                .iter()
                .fold(0, |starts, prefix| match prefix.as_bytes().first() {
                    Some(&first) if first.is_ascii() => starts | (1u128 << first),
                    _ => u128::MAX,
                });
        self
    }

    /// Judge the envelope's field names again, after the keys changed.
    fn with_envelope_verdicts(mut self) -> Self {
        self.envelope = ENVELOPE_FIELDS.map(|field| self.match_key(field));
        self
    }

    // Redaction walks every key and string of every persisted report, so the common case
    // (ASCII keys and values) compares without allocating; anything else takes the general
    // Unicode path, which gives the same answers.
    /// [`key_is_sensitive`](Self::key_is_sensitive) for a name that lives for the whole
    /// program (a struct's field name), which the default policy looks up by address.
    pub(crate) fn field_is_sensitive(&self, key: &'static str) -> bool {
        if !matches!(self.verdicts, KeyVerdicts::Default) {
            return self.key_is_sensitive(key);
        }
        let address = key.as_ptr() as usize;
        // Names are at least byte-aligned and mostly sit apart; mixing in the length keeps
        // two names at nearby addresses out of one slot.
        let slot = (address ^ (address >> 8) ^ key.len()) & (FIELD_SLOTS - 1);
        FIELD_VERDICTS.with(|cache| {
            let (cached_address, cached_len, verdict) = cache.borrow()[slot];
            if cached_address == address && cached_len == key.len() {
                return verdict;
            }
            let verdict = self.key_is_sensitive(key);
            cache.borrow_mut()[slot] = (address, key.len(), verdict);
            verdict
        })
    }

    pub(crate) fn key_is_sensitive(&self, key: &str) -> bool {
        self.verdicts
            .get_or_insert_with(key, || self.match_key(key))
    }

    fn match_key(&self, key: &str) -> bool {
        if key.is_ascii() {
            return !self
                .allowed_keys
                .iter()
                .any(|k| k.as_bytes().eq_ignore_ascii_case(key.as_bytes()))
                && contains_any_ignore_ascii_case(key, &self.keys);
        }
        let key = key.to_lowercase();
        !self.allowed_keys.contains(&key) && self.keys.iter().any(|k| key.contains(k.as_str()))
    }

    pub(crate) fn value_is_sensitive(&self, value: &str) -> bool {
        // An ASCII first byte that starts no prefix (in either case) settles it.
        if let Some(&first) = value.as_bytes().first() {
            if first.is_ascii() && self.prefix_starts & (1u128 << first.to_ascii_lowercase()) == 0 {
                return false;
            }
        }
        self.prefixes.iter().any(|p| {
            // Most values differ from the prefix at once: an ASCII first byte that is not the
            // prefix's settles it (a non-ASCII one may lowercase to ASCII, so it goes on).
            if let (Some(&first), Some(&wanted)) = (value.as_bytes().first(), p.as_bytes().first())
            {
                if first.is_ascii() && wanted.is_ascii() && first.to_ascii_lowercase() != wanted {
                    return false;
                }
            }
            // When the first `p.len()` bytes are ASCII, their lowercase is exactly what the
            // general path would compare against the prefix.
            match value.as_bytes().get(..p.len()) {
                Some(head) if head.is_ascii() => {
                    p.chars().count() <= 64 && head.eq_ignore_ascii_case(p.as_bytes())
                }
                Some(_) => {
                    let head: String = value.chars().take(64).collect::<String>().to_lowercase();
                    head.starts_with(p.as_str())
                }
                // Shorter than the prefix: only a non-ASCII value could grow when lowercased.
                None if value.is_ascii() => false,
                None => {
                    let head: String = value.chars().take(64).collect::<String>().to_lowercase();
                    head.starts_with(p.as_str())
                }
            }
        })
    }

    pub(crate) fn is_token_count_key(key: &str) -> bool {
        if key.is_ascii() {
            let tail = "tokens".len();
            return key.len() >= tail
                && key.as_bytes()[key.len() - tail..].eq_ignore_ascii_case(b"tokens");
        }
        key.to_lowercase().ends_with("tokens")
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
    /// configured extra keys, their key) is sensitive. Ids, type, sequence and times are
    /// Keel's own and kept. [`RunRecorder::redacting`](crate::RunRecorder::redacting) applies
    /// it to each event as it is recorded.
    pub fn redact_event(&self, event: &mut RunEvent) {
        let [summary, agent_name, span_id, parent_span_id, delegation_id, payload] = self.envelope;
        let mask = |key_is_sensitive: bool, text: &mut String| {
            if key_is_sensitive || self.value_is_sensitive(text) {
                REDACTED.clone_into(text);
            }
        };
        mask(summary, &mut event.summary);
        for (key_is_sensitive, field) in [
            (agent_name, &mut event.agent_name),
            (span_id, &mut event.span_id),
            (parent_span_id, &mut event.parent_span_id),
            (delegation_id, &mut event.delegation_id),
        ] {
            if let Some(text) = field {
                mask(key_is_sensitive, text);
            }
        }
        if payload && !event.payload.is_null() {
            event.payload = Value::String(REDACTED.to_owned());
        } else {
            self.redact_value(&mut event.payload);
        }
    }

    /// Whether an envelope field of an event is masked, as [`redact_event`](Self::redact_event)
    /// decides: by its name or its text; the payload by its name only (its content is walked).
    pub(crate) fn envelope_field_is_sensitive(&self, field: Envelope, text: &str) -> bool {
        let [summary, agent_name, span_id, parent_span_id, delegation_id, payload] = self.envelope;
        let by_name = match field {
            Envelope::Kept => return false,
            Envelope::Payload => return payload,
            Envelope::Summary => summary,
            Envelope::AgentName => agent_name,
            Envelope::SpanId => span_id,
            Envelope::ParentSpanId => parent_span_id,
            Envelope::DelegationId => delegation_id,
        };
        by_name || self.value_is_sensitive(text)
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

/// Whether an ASCII `key` contains any of `fragments` (lowercase), ignoring ASCII case: one
/// pass over the key, comparing a fragment only where its first byte matches. Every key of
/// every persisted event goes through this, most of them matching nothing.
fn contains_any_ignore_ascii_case(key: &str, fragments: &[String]) -> bool {
    let hay = key.as_bytes();
    if fragments.iter().any(String::is_empty) {
        return true;
    }
    (0..hay.len()).any(|start| {
        let first = hay[start].to_ascii_lowercase();
        let rest = &hay[start..];
        fragments.iter().any(|fragment| {
            let fragment = fragment.as_bytes();
            fragment[0] == first
                && rest.len() >= fragment.len()
                && rest[..fragment.len()].eq_ignore_ascii_case(fragment)
        })
    })
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
    fn the_allocation_free_checks_agree_with_unicode_lowercasing() {
        let policy = RedactionPolicy::default()
            .with_key("Stra\u{df}e")
            .allow_key("Token_Type");
        let slow_key = |key: &str| {
            let key = key.to_lowercase();
            !policy.allowed_keys.contains(&key)
                && policy.keys.iter().any(|k| key.contains(k.as_str()))
        };
        let slow_value = |value: &str| {
            let head: String = value.chars().take(64).collect::<String>().to_lowercase();
            policy.prefixes.iter().any(|p| head.starts_with(p.as_str()))
        };
        let samples = [
            "",
            "k",
            "KEY",
            "my_Api_Key",
            "token_type",
            "TOKEN_TYPE",
            "monkey",
            "input_tokens",
            "name",
            "\u{212a}ey",
            "stra\u{df}e",
            "STRA\u{df}E",
            "Bearer abc",
            "bearer",
            "BEARER x",
            "bear",
            "\u{130}bearer x",
            "Be\u{301}arer",
            "caf\u{e9}",
        ];
        for sample in samples {
            assert_eq!(
                policy.key_is_sensitive(sample),
                slow_key(sample),
                "key {sample:?}"
            );
            assert_eq!(
                policy.value_is_sensitive(sample),
                slow_value(sample),
                "value {sample:?}"
            );
            assert_eq!(
                RedactionPolicy::is_token_count_key(sample),
                sample.to_lowercase().ends_with("tokens"),
                "{sample:?}"
            );
        }
        // The first-byte shortcut, under prefixes that start with other letters, with a
        // non-ASCII letter, and an empty one (which masks every string).
        for extra in ["SK-", "\u{e9}t\u{e9}", "k", ""] {
            let policy = RedactionPolicy::default().with_value_prefix(extra);
            for sample in samples
                .iter()
                .chain(&["sk-123", "Sk-9", "\u{c9}T\u{c9} x", "\u{e9}"])
            {
                let head: String = sample.chars().take(64).collect::<String>().to_lowercase();
                let slow = policy.prefixes.iter().any(|p| head.starts_with(p.as_str()));
                assert_eq!(
                    policy.value_is_sensitive(sample),
                    slow,
                    "value {sample:?} with prefix {extra:?}"
                );
            }
        }
    }
}
