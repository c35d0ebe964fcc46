//! The environment an agent reads its flags and scoped variables from (Standard Agents §7.3,
//! §7.5), and the sealing of scoped variables at rest.
//!
//! An [`Environment`] is a map of variables that falls back to the process environment, so an
//! application (or a test) can inject values without touching the global process state.
//! Scoped variables handed to a subagent are stored in the child thread's key-value store
//! sealed with ChaCha20-Poly1305 under the key in [`SECRETS_KEY_VAR`]; they never enter a
//! prompt.

use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine as _;
use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use keel_core::{AgentError, AgentResult};

/// The variable holding the 32-byte key that seals scoped variables at rest: 64 hex digits or
/// standard base64. Parent and child agents must see the same key.
pub const SECRETS_KEY_VAR: &str = "KEEL_SECRETS_KEY";

/// Sealed values start with this tag, so a later scheme can be told apart.
const SEALED_PREFIX: &str = "keel-sealed-v1:";
const NONCE_LEN: usize = 12;

/// Where an agent reads environment variables: its own map first, then (unless isolated) the
/// process environment.
///
/// ```
/// use keel_agent::Environment;
/// let env = Environment::isolated().with_var("RESEARCH_ENABLED", "yes");
/// assert!(env.flag("RESEARCH_ENABLED"));
/// assert!(!env.flag("OTHER_FLAG"));
/// assert_eq!(env.var("RESEARCH_ENABLED").as_deref(), Some("yes"));
/// ```
#[derive(Clone, Default)]
pub struct Environment {
    vars: Arc<HashMap<String, String>>,
    isolated: bool,
}

impl std::fmt::Debug for Environment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Values may be secrets: only the names are shown.
        let mut names: Vec<&String> = self.vars.keys().collect();
        names.sort();
        f.debug_struct("Environment")
            .field("vars", &names)
            .field("isolated", &self.isolated)
            .finish()
    }
}

impl Environment {
    /// The process environment only.
    pub fn process() -> Self {
        Self::default()
    }

    /// An empty environment that never reads the process environment.
    pub fn isolated() -> Self {
        Self {
            vars: Arc::default(),
            isolated: true,
        }
    }

    /// Set a variable (it wins over the process environment).
    #[must_use]
    pub fn with_var(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        Arc::make_mut(&mut self.vars).insert(name.into(), value.into());
        self
    }

    /// A variable's value.
    pub fn var(&self, name: &str) -> Option<String> {
        if let Some(value) = self.vars.get(name) {
            return Some(value.clone());
        }
        if self.isolated {
            return None;
        }
        std::env::var(name).ok()
    }

    /// Whether a flag is on: its value is `true`, `1` or `yes`, in any case (§7.3).
    pub fn flag(&self, name: &str) -> bool {
        self.var(name).is_some_and(|v| {
            let v = v.trim();
            v == "1" || v.eq_ignore_ascii_case("true") || v.eq_ignore_ascii_case("yes")
        })
    }

    fn cipher(&self) -> AgentResult<ChaCha20Poly1305> {
        let raw = self
            .var(SECRETS_KEY_VAR)
            .ok_or_else(|| AgentError::Unsupported {
                what: format!("scoped variables need a sealing key in `{SECRETS_KEY_VAR}`"),
            })?;
        let key = decode_key(raw.trim()).ok_or_else(|| {
            AgentError::invalid_input(
                SECRETS_KEY_VAR,
                "must be 32 bytes as 64 hex digits or standard base64",
            )
        })?;
        Ok(ChaCha20Poly1305::new(Key::from_slice(&key)))
    }

    /// Seal `value`; `context` (where the value is stored) is authenticated with it, so a
    /// sealed value moved to another slot does not open.
    pub(crate) fn seal(&self, context: &str, value: &str) -> AgentResult<String> {
        let cipher = self.cipher()?;
        let nonce = ChaCha20Poly1305::generate_nonce(&mut OsRng);
        let sealed = cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: value.as_bytes(),
                    aad: context.as_bytes(),
                },
            )
            .map_err(|_| AgentError::internal("sealing a scoped variable failed"))?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&sealed);
        Ok(format!(
            "{SEALED_PREFIX}{}",
            base64::engine::general_purpose::STANDARD.encode(out)
        ))
    }

    /// Open a value [`Environment::seal`] made for the same `context`.
    pub(crate) fn open(&self, context: &str, sealed: &str) -> AgentResult<String> {
        let cipher = self.cipher()?;
        let broken = || {
            AgentError::storage(
                "a sealed scoped variable could not be opened (wrong key or damaged)",
            )
        };
        let body = sealed.strip_prefix(SEALED_PREFIX).ok_or_else(broken)?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(body)
            .map_err(|_| broken())?;
        if bytes.len() < NONCE_LEN {
            return Err(broken());
        }
        let (nonce, sealed) = bytes.split_at(NONCE_LEN);
        let plain = cipher
            .decrypt(
                Nonce::from_slice(nonce),
                Payload {
                    msg: sealed,
                    aad: context.as_bytes(),
                },
            )
            .map_err(|_| broken())?;
        String::from_utf8(plain).map_err(|_| broken())
    }
}

fn decode_key(raw: &str) -> Option<[u8; 32]> {
    let bytes = if raw.len() == 64 && raw.chars().all(|c| c.is_ascii_hexdigit()) {
        (0..32)
            .map(|i| u8::from_str_radix(&raw[2 * i..2 * i + 2], 16).ok())
            .collect::<Option<Vec<u8>>>()?
    } else {
        base64::engine::general_purpose::STANDARD.decode(raw).ok()?
    };
    bytes.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    #[test]
    fn flags_are_true_one_or_yes_in_any_case() {
        let env = Environment::isolated()
            .with_var("A", "TRUE")
            .with_var("B", "1")
            .with_var("C", "Yes")
            .with_var("D", "no")
            .with_var("E", "2");
        assert!(env.flag("A") && env.flag("B") && env.flag("C"));
        assert!(!env.flag("D") && !env.flag("E") && !env.flag("F"));
    }

    #[test]
    fn a_sealed_value_opens_only_in_its_own_slot_and_never_shows_the_plaintext() {
        let env = Environment::isolated().with_var(SECRETS_KEY_VAR, KEY);
        let sealed = env.seal("thread-1/TOKEN", "s3cret-value").unwrap();
        assert!(!sealed.contains("s3cret"));
        assert_eq!(env.open("thread-1/TOKEN", &sealed).unwrap(), "s3cret-value");
        assert!(env.open("thread-2/TOKEN", &sealed).is_err());
        let other = Environment::isolated().with_var(SECRETS_KEY_VAR, "A".repeat(64));
        assert!(other.open("thread-1/TOKEN", &sealed).is_err());
    }

    #[test]
    fn sealing_without_a_key_is_a_typed_error() {
        let err = Environment::isolated().seal("x", "y").unwrap_err();
        assert!(matches!(err, AgentError::Unsupported { .. }), "{err:?}");
        let bad = Environment::isolated().with_var(SECRETS_KEY_VAR, "short");
        assert!(matches!(
            bad.seal("x", "y").unwrap_err(),
            AgentError::InvalidInput { .. }
        ));
    }
}
