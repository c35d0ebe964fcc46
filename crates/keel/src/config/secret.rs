//! Values that may come from the environment: `${VAR}` in a `keel.toml` string is replaced by
//! the variable's value when the file is loaded, and such a value prints masked, so a secret
//! never sits in the file nor shows in `keel check` or a log line.

use std::fmt;

use serde::{Deserialize, Deserializer};

/// What a masked part of a value prints as.
pub const MASK: &str = "****";

/// A string from `keel.toml` in which every `${VAR}` was replaced by the environment
/// variable's value. It prints (`Display`, `Debug`) as written with each `${VAR}` masked, so
/// `Bearer ${TOKEN}` shows as `Bearer ****`; [`EnvString::value`] is the real value.
///
/// ```
/// use keel::config::EnvString;
/// let plain = EnvString::plain("http://127.0.0.1:9000/");
/// assert_eq!(plain.value(), "http://127.0.0.1:9000/");
/// assert!(!plain.is_secret());
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct EnvString {
    /// As written, with `${VAR}` references.
    template: String,
    /// With the references replaced.
    value: String,
    /// Whether any reference was replaced.
    secret: bool,
}

impl EnvString {
    /// A value with no environment references.
    pub fn plain(value: impl Into<String>) -> Self {
        let value = value.into();
        Self {
            template: value.clone(),
            value,
            secret: false,
        }
    }

    /// Replace every `${VAR}` of `template` with the value of `VAR` as `lookup` gives it; a
    /// variable `lookup` does not know is an error naming it. `$${` writes a literal `${`.
    pub fn expand(template: &str, lookup: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let mut value = String::with_capacity(template.len());
        let mut rest = template;
        let mut secret = false;
        while let Some(start) = rest.find('$') {
            value.push_str(&rest[..start]);
            let after = &rest[start + 1..];
            if let Some(literal) = after.strip_prefix("${") {
                value.push_str("${");
                rest = literal;
            } else if let Some(reference) = after.strip_prefix('{') {
                let end = reference
                    .find('}')
                    .ok_or_else(|| format!("`${{` without a closing `}}` in `{template}`"))?;
                let name = &reference[..end];
                if !is_variable_name(name) {
                    return Err(format!(
                        "`${{{name}}}` is not an environment variable name (letters, digits, `_`)"
                    ));
                }
                let found = lookup(name)
                    .ok_or_else(|| format!("the environment variable `{name}` is not set"))?;
                value.push_str(&found);
                secret = true;
                rest = &reference[end + 1..];
            } else {
                value.push('$');
                rest = after;
            }
        }
        value.push_str(rest);
        Ok(Self {
            template: template.to_owned(),
            value,
            secret,
        })
    }

    /// The value, environment references replaced. Never print it: print `self`.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// Whether any part of it came from the environment (and so prints masked).
    pub fn is_secret(&self) -> bool {
        self.secret
    }

    /// As written, every `${VAR}` replaced by [`MASK`].
    pub fn masked(&self) -> String {
        let mut out = String::with_capacity(self.template.len());
        let mut rest = self.template.as_str();
        while let Some(start) = rest.find("${") {
            if rest[..start].ends_with('$') {
                out.push_str(&rest[..start - 1]);
                out.push_str("${");
                rest = &rest[start + 2..];
                continue;
            }
            out.push_str(&rest[..start]);
            out.push_str(MASK);
            rest = rest[start..]
                .find('}')
                .map_or("", |end| &rest[start + end + 1..]);
        }
        out.push_str(rest);
        out
    }
}

fn is_variable_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Every `${VAR}` of the string values of a TOML document whose variable `lookup` does not
/// know, with the dotted path of the value that names it, in document order: so that a file
/// needing several variables names them all at once, not one per try.
pub(crate) fn missing_variables(
    document: &toml::Table,
    lookup: impl Fn(&str) -> Option<String>,
) -> Vec<(String, String)> {
    fn walk(
        value: &toml::Value,
        path: &str,
        lookup: &dyn Fn(&str) -> Option<String>,
        missing: &mut Vec<(String, String)>,
    ) {
        match value {
            toml::Value::String(template) => {
                let unknown = std::cell::RefCell::new(Vec::new());
                // Malformed references are the typed parse's to report, with their place.
                let _ = EnvString::expand(template, |name| {
                    lookup(name).or_else(|| {
                        unknown.borrow_mut().push(name.to_owned());
                        Some(String::new())
                    })
                });
                missing.extend(
                    unknown
                        .into_inner()
                        .into_iter()
                        .map(|name| (name, path.to_owned())),
                );
            }
            toml::Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    walk(item, &format!("{path}[{i}]"), lookup, missing);
                }
            }
            toml::Value::Table(table) => {
                for (key, item) in table {
                    let path = if path.is_empty() {
                        key.clone()
                    } else {
                        format!("{path}.{key}")
                    };
                    walk(item, &path, lookup, missing);
                }
            }
            _ => {}
        }
    }
    let mut missing = Vec::new();
    for (key, value) in document {
        walk(value, key, &lookup, &mut missing);
    }
    missing
}

impl fmt::Display for EnvString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.masked())
    }
}

impl fmt::Debug for EnvString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.masked())
    }
}

impl<'de> Deserialize<'de> for EnvString {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let template = String::deserialize(deserializer)?;
        EnvString::expand(&template, |name| std::env::var(name).ok())
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "TOKEN" => Some("s3cr3t".into()),
            "HOST" => Some("example.com".into()),
            _ => None,
        }
    }

    #[test]
    fn references_are_replaced_and_print_masked() {
        let value = EnvString::expand("Bearer ${TOKEN} for ${HOST}", env).unwrap();
        assert_eq!(value.value(), "Bearer s3cr3t for example.com");
        assert_eq!(value.to_string(), "Bearer **** for ****");
        assert!(!format!("{value:?}").contains("s3cr3t"));
        assert!(value.is_secret());
    }

    #[test]
    fn a_missing_variable_is_an_error_naming_it() {
        let err = EnvString::expand("${NOPE}", env).unwrap_err();
        assert!(err.contains("`NOPE` is not set"), "{err}");
        assert!(EnvString::expand("${TOKEN", env).is_err());
        assert!(EnvString::expand("${1X}", env).is_err());
    }

    #[test]
    fn a_doubled_dollar_writes_a_literal_reference() {
        let value = EnvString::expand("cost: $5, raw $${TOKEN}", env).unwrap();
        assert_eq!(value.value(), "cost: $5, raw ${TOKEN}");
        assert_eq!(value.to_string(), "cost: $5, raw ${TOKEN}");
        assert!(!value.is_secret());
    }
}
