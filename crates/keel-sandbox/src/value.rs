//! Values that cross the sandbox boundary: a structured-clone tree, plus host functions.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde::{Serialize, Serializer};

/// A value copied across the sandbox boundary by structured clone (§13.3).
///
/// Every variant is a deep copy: nothing in it refers to memory inside an isolate, and
/// nothing inside an isolate refers to it. [`SandboxValue::Function`] travels only from
/// the host into the sandbox, where it becomes a callable proxy.
///
/// ```
/// use keel_sandbox::SandboxValue;
/// let v = SandboxValue::from(serde_json::json!({ "n": 1, "tags": ["a"] }));
/// assert_eq!(v.to_json(), serde_json::json!({ "n": 1.0, "tags": ["a"] }));
/// ```
#[derive(Clone, Default)]
pub enum SandboxValue {
    /// `undefined`.
    #[default]
    Undefined,
    /// `null`.
    Null,
    /// A boolean.
    Bool(bool),
    /// A number (IEEE 754 double, as in ECMAScript).
    Number(f64),
    /// A bigint, as its decimal digits (with a leading `-` when negative).
    BigInt(String),
    /// A string.
    String(String),
    /// An array (holes read as `undefined`).
    Array(Vec<SandboxValue>),
    /// A plain object: its own enumerable string-keyed properties, in order.
    Object(Vec<(String, SandboxValue)>),
    /// A `Map`, as its entries in insertion order.
    Map(Vec<(SandboxValue, SandboxValue)>),
    /// A `Set`, as its values in insertion order.
    Set(Vec<SandboxValue>),
    /// A `Date`, as milliseconds since the Unix epoch (NaN for an invalid date).
    Date(f64),
    /// A typed array (`Uint8Array`, `Float64Array`, ...) as its bytes in platform order.
    TypedArray {
        /// Which typed-array constructor.
        kind: TypedArrayKind,
        /// The bytes of the view (not of the whole underlying buffer).
        bytes: Vec<u8>,
    },
    /// An `ArrayBuffer`, as its bytes.
    ArrayBuffer(Vec<u8>),
    /// A host function; inside the sandbox it is an `async` callable proxy.
    Function(HostFunction),
}

/// The typed-array constructors that cross the boundary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TypedArrayKind {
    /// `Int8Array`.
    Int8,
    /// `Uint8Array`.
    Uint8,
    /// `Uint8ClampedArray`.
    Uint8Clamped,
    /// `Int16Array`.
    Int16,
    /// `Uint16Array`.
    Uint16,
    /// `Int32Array`.
    Int32,
    /// `Uint32Array`.
    Uint32,
    /// `Float32Array`.
    Float32,
    /// `Float64Array`.
    Float64,
    /// `BigInt64Array`.
    BigInt64,
    /// `BigUint64Array`.
    BigUint64,
}

impl TypedArrayKind {
    /// Every kind, in a fixed order.
    pub const ALL: [TypedArrayKind; 11] = [
        Self::Int8,
        Self::Uint8,
        Self::Uint8Clamped,
        Self::Int16,
        Self::Uint16,
        Self::Int32,
        Self::Uint32,
        Self::Float32,
        Self::Float64,
        Self::BigInt64,
        Self::BigUint64,
    ];

    /// The ECMAScript constructor name, e.g. `"Uint8Array"`.
    pub fn constructor_name(self) -> &'static str {
        match self {
            Self::Int8 => "Int8Array",
            Self::Uint8 => "Uint8Array",
            Self::Uint8Clamped => "Uint8ClampedArray",
            Self::Int16 => "Int16Array",
            Self::Uint16 => "Uint16Array",
            Self::Int32 => "Int32Array",
            Self::Uint32 => "Uint32Array",
            Self::Float32 => "Float32Array",
            Self::Float64 => "Float64Array",
            Self::BigInt64 => "BigInt64Array",
            Self::BigUint64 => "BigUint64Array",
        }
    }

    /// The kind for a constructor name, if it is one that crosses.
    pub fn from_constructor_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.constructor_name() == name)
    }
}

impl SandboxValue {
    /// Builds a plain object from `(key, value)` pairs.
    ///
    /// ```
    /// use keel_sandbox::SandboxValue;
    /// let v = SandboxValue::object([("a", SandboxValue::from(1.0))]);
    /// assert_eq!(v.get("a"), Some(&SandboxValue::Number(1.0)));
    /// ```
    pub fn object<K: Into<String>>(entries: impl IntoIterator<Item = (K, SandboxValue)>) -> Self {
        Self::Object(entries.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }

    /// The property `key` of a plain object, if this is one and has it.
    pub fn get(&self, key: &str) -> Option<&SandboxValue> {
        match self {
            Self::Object(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    /// The number, if this is one.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Self::Number(n) => Some(*n),
            _ => None,
        }
    }

    /// A JSON projection, as `JSON.stringify` would see the value after a structured clone,
    /// except that it is never lossy about containers:
    /// `undefined`, NaN and infinities become `null`; a bigint becomes its decimal string;
    /// a `Map` becomes an array of `[key, value]` pairs and a `Set` an array; a `Date`
    /// becomes its ISO-8601 string; typed arrays and buffers become arrays of numbers
    /// (bytes for buffers); a host function becomes `null`.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match self {
            Self::Undefined | Self::Null | Self::Function(_) => J::Null,
            Self::Bool(b) => J::Bool(*b),
            Self::Number(n) => serde_json::Number::from_f64(*n).map_or(J::Null, J::Number),
            Self::BigInt(s) | Self::String(s) => J::String(s.clone()),
            Self::Array(items) | Self::Set(items) => {
                J::Array(items.iter().map(Self::to_json).collect())
            }
            Self::Object(entries) => J::Object(
                entries
                    .iter()
                    .map(|(k, v)| (k.clone(), v.to_json()))
                    .collect(),
            ),
            Self::Map(entries) => J::Array(
                entries
                    .iter()
                    .map(|(k, v)| J::Array(vec![k.to_json(), v.to_json()]))
                    .collect(),
            ),
            Self::Date(ms) => iso_date(*ms).map_or(J::Null, J::String),
            Self::TypedArray { kind, bytes } => J::Array(typed_numbers(*kind, bytes)),
            Self::ArrayBuffer(bytes) => J::Array(bytes.iter().map(|b| J::from(*b)).collect()),
        }
    }
}

fn typed_numbers(kind: TypedArrayKind, bytes: &[u8]) -> Vec<serde_json::Value> {
    use serde_json::Value as J;
    /// Each native-endian element of `N` bytes, read by `read` and made JSON by `json`.
    fn each<const N: usize, T>(
        bytes: &[u8],
        read: fn([u8; N]) -> T,
        json: impl Fn(T) -> J,
    ) -> Vec<J> {
        bytes
            .chunks_exact(N)
            .filter_map(|c| c.try_into().ok())
            .map(|c| json(read(c)))
            .collect()
    }
    let num = |n: f64| serde_json::Number::from_f64(n).map_or(J::Null, J::Number);
    match kind {
        TypedArrayKind::Int8 => each(bytes, i8::from_ne_bytes, J::from),
        TypedArrayKind::Uint8 | TypedArrayKind::Uint8Clamped => {
            each(bytes, u8::from_ne_bytes, J::from)
        }
        TypedArrayKind::Int16 => each(bytes, i16::from_ne_bytes, J::from),
        TypedArrayKind::Uint16 => each(bytes, u16::from_ne_bytes, J::from),
        TypedArrayKind::Int32 => each(bytes, i32::from_ne_bytes, J::from),
        TypedArrayKind::Uint32 => each(bytes, u32::from_ne_bytes, J::from),
        TypedArrayKind::Float32 => each(bytes, f32::from_ne_bytes, |n| num(f64::from(n))),
        TypedArrayKind::Float64 => each(bytes, f64::from_ne_bytes, num),
        // 64-bit integers exceed what a JSON number holds exactly: they travel as strings.
        TypedArrayKind::BigInt64 => each(bytes, i64::from_ne_bytes, |n| J::String(n.to_string())),
        TypedArrayKind::BigUint64 => each(bytes, u64::from_ne_bytes, |n| J::String(n.to_string())),
    }
}

/// Formats epoch milliseconds as `Date.prototype.toISOString` does.
fn iso_date(ms: f64) -> Option<String> {
    if !ms.is_finite() || ms.abs() > 8.64e15 {
        return None;
    }
    let ms = ms as i64;
    let days = ms.div_euclid(86_400_000);
    let rem = ms.rem_euclid(86_400_000);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s, milli) = (
        rem / 3_600_000,
        rem / 60_000 % 60,
        rem / 1000 % 60,
        rem % 1000,
    );
    let year = if (0..=9999).contains(&year) {
        format!("{year:04}")
    } else {
        format!("{}{:06}", if year < 0 { '-' } else { '+' }, year.abs())
    };
    Some(format!(
        "{year}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{milli:03}Z"
    ))
}

impl PartialEq for SandboxValue {
    fn eq(&self, other: &Self) -> bool {
        use SandboxValue as V;
        match (self, other) {
            (V::Undefined, V::Undefined) | (V::Null, V::Null) => true,
            (V::Bool(a), V::Bool(b)) => a == b,
            (V::Number(a), V::Number(b)) | (V::Date(a), V::Date(b)) => {
                a == b || (a.is_nan() && b.is_nan())
            }
            (V::BigInt(a), V::BigInt(b)) | (V::String(a), V::String(b)) => a == b,
            (V::Array(a), V::Array(b)) | (V::Set(a), V::Set(b)) => a == b,
            (V::Object(a), V::Object(b)) => a == b,
            (V::Map(a), V::Map(b)) => a == b,
            (V::TypedArray { kind: ka, bytes: a }, V::TypedArray { kind: kb, bytes: b }) => {
                ka == kb && a == b
            }
            (V::ArrayBuffer(a), V::ArrayBuffer(b)) => a == b,
            (V::Function(a), V::Function(b)) => Arc::ptr_eq(&a.call, &b.call),
            _ => false,
        }
    }
}

impl fmt::Debug for SandboxValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use SandboxValue as V;
        match self {
            V::Undefined => f.write_str("undefined"),
            V::Null => f.write_str("null"),
            V::Bool(b) => write!(f, "{b}"),
            V::Number(n) => write!(f, "{n}"),
            V::BigInt(s) => write!(f, "{s}n"),
            V::String(s) => write!(f, "{s:?}"),
            V::Array(items) => f.debug_list().entries(items).finish(),
            V::Object(entries) => f
                .debug_map()
                .entries(entries.iter().map(|(k, v)| (k, v)))
                .finish(),
            V::Map(entries) => {
                f.write_str("Map ")?;
                f.debug_map()
                    .entries(entries.iter().map(|(k, v)| (k, v)))
                    .finish()
            }
            V::Set(items) => {
                f.write_str("Set ")?;
                f.debug_set().entries(items).finish()
            }
            V::Date(ms) => write!(f, "Date({ms})"),
            V::TypedArray { kind, bytes } => {
                write!(f, "{}({} bytes)", kind.constructor_name(), bytes.len())
            }
            V::ArrayBuffer(bytes) => write!(f, "ArrayBuffer({} bytes)", bytes.len()),
            V::Function(func) => write!(f, "[HostFunction {}]", func.name),
        }
    }
}

impl Serialize for SandboxValue {
    /// Serializes the JSON projection ([`SandboxValue::to_json`]).
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_json().serialize(serializer)
    }
}

impl From<serde_json::Value> for SandboxValue {
    fn from(value: serde_json::Value) -> Self {
        use serde_json::Value as J;
        match value {
            J::Null => Self::Null,
            J::Bool(b) => Self::Bool(b),
            J::Number(n) => Self::Number(n.as_f64().unwrap_or(f64::NAN)),
            J::String(s) => Self::String(s),
            J::Array(items) => Self::Array(items.into_iter().map(Self::from).collect()),
            J::Object(map) => Self::Object(map.into_iter().map(|(k, v)| (k, v.into())).collect()),
        }
    }
}

impl From<bool> for SandboxValue {
    fn from(value: bool) -> Self {
        Self::Bool(value)
    }
}

impl From<f64> for SandboxValue {
    fn from(value: f64) -> Self {
        Self::Number(value)
    }
}

impl From<i32> for SandboxValue {
    fn from(value: i32) -> Self {
        Self::Number(f64::from(value))
    }
}

impl From<&str> for SandboxValue {
    fn from(value: &str) -> Self {
        Self::String(value.to_owned())
    }
}

impl From<String> for SandboxValue {
    fn from(value: String) -> Self {
        Self::String(value)
    }
}

impl From<Vec<SandboxValue>> for SandboxValue {
    fn from(value: Vec<SandboxValue>) -> Self {
        Self::Array(value)
    }
}

impl From<HostFunction> for SandboxValue {
    fn from(value: HostFunction) -> Self {
        Self::Function(value)
    }
}

/// What a host function's future resolves to.
pub type HostResult = Result<SandboxValue, HostError>;

/// The boxed future a host function returns.
pub type HostFuture = Pin<Box<dyn Future<Output = HostResult> + Send>>;

type HostCall = dyn Fn(Vec<SandboxValue>) -> HostFuture + Send + Sync;

/// A host function offered to the sandbox (§13.3: functions cross as callable proxies).
///
/// Inside the sandbox it is a plain function that returns a `Promise`: its arguments are
/// structured-cloned out, the host future runs on the caller's tokio runtime (never on the
/// isolate's thread, so `terminate` stays prompt), and its value is cloned back in. The
/// proxy exposes neither a host `this` nor any host state beyond its arguments.
///
/// ```
/// use keel_sandbox::{HostFunction, SandboxValue};
/// let add = HostFunction::new("add", |args: Vec<SandboxValue>| async move {
///     let sum: f64 = args.iter().filter_map(SandboxValue::as_f64).sum();
///     Ok(SandboxValue::Number(sum))
/// });
/// assert_eq!(add.name(), "add");
/// ```
#[derive(Clone)]
pub struct HostFunction {
    name: Arc<str>,
    call: Arc<HostCall>,
}

impl HostFunction {
    /// Wraps an async closure.
    pub fn new<F, Fut>(name: impl Into<String>, f: F) -> Self
    where
        F: Fn(Vec<SandboxValue>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = HostResult> + Send + 'static,
    {
        let call = move |args: Vec<SandboxValue>| -> HostFuture { Box::pin(f(args)) };
        Self {
            name: Arc::from(name.into()),
            call: Arc::new(call),
        }
    }

    /// Wraps a synchronous closure; it still runs off the isolate's thread and the
    /// sandbox still sees a function returning a `Promise`.
    pub fn from_fn<F>(name: impl Into<String>, f: F) -> Self
    where
        F: Fn(Vec<SandboxValue>) -> HostResult + Send + Sync + 'static,
    {
        let f = Arc::new(f);
        Self::new(name, move |args| {
            let f = Arc::clone(&f);
            async move { f(args) }
        })
    }

    /// The name given at construction (used in diagnostics and as the proxy's `name`).
    pub fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn call(&self, args: Vec<SandboxValue>) -> HostFuture {
        (self.call)(args)
    }
}

impl fmt::Debug for HostFunction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostFunction")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// A failure reported by a host function; the sandbox sees a rejected promise with an
/// `Error` of this name and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostError {
    /// The error's `name` inside the sandbox (`"Error"` by default).
    pub name: String,
    /// The error's `message` inside the sandbox.
    pub message: String,
}

impl HostError {
    /// An `Error` with this message.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            name: "Error".to_owned(),
            message: message.into(),
        }
    }
}

impl fmt::Display for HostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.name, self.message)
    }
}

impl std::error::Error for HostError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso_date_matches_ecmascript() {
        assert_eq!(iso_date(0.0).as_deref(), Some("1970-01-01T00:00:00.000Z"));
        assert_eq!(
            iso_date(1_700_000_000_123.0).as_deref(),
            Some("2023-11-14T22:13:20.123Z")
        );
        assert_eq!(iso_date(-1.0).as_deref(), Some("1969-12-31T23:59:59.999Z"));
        assert_eq!(iso_date(f64::NAN), None);
    }

    #[test]
    fn json_projection_keeps_containers() {
        let v = SandboxValue::Map(vec![(
            SandboxValue::from("k"),
            SandboxValue::BigInt("12".into()),
        )]);
        assert_eq!(v.to_json(), serde_json::json!([["k", "12"]]));
    }
}
