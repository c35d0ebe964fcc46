//! Structured clone across the isolate's boundary: sandbox values out to the host and host
//! values into the sandbox, bounded in depth and in the bytes a copy may take.

use rquickjs::object::Property;
use rquickjs::{Array, Ctx, Object, TypedArray, Value};

use super::{Bridge, Helpers};
use crate::bytes::copy_bytes;
use crate::value::{SandboxValue, TypedArrayKind};

/// How deep a structured clone may nest before it is refused.
const MAX_CLONE_DEPTH: usize = 256;

/// Structured clone sandbox → host.
///
/// `budget` is the number of bytes the copy may still take on the host (roughly: 16 per
/// value plus string and byte lengths); it starts at the isolate's memory limit, so a
/// value cheap inside the isolate (a sparse array of length 2^32 - 1, say) cannot become
/// an expensive one outside it.
pub(super) fn to_host<'js>(
    helpers: &Helpers<'js>,
    value: Value<'js>,
    depth: usize,
    budget: &mut usize,
) -> Result<SandboxValue, String> {
    if depth > MAX_CLONE_DEPTH {
        return Err(format!(
            "value nests deeper than {MAX_CLONE_DEPTH} levels (or is cyclic)"
        ));
    }
    spend(budget, 16)?;
    let fail = |e: rquickjs::Error| e.to_string();
    if value.is_undefined() {
        return Ok(SandboxValue::Undefined);
    }
    if value.is_null() {
        return Ok(SandboxValue::Null);
    }
    if let Some(b) = value.as_bool() {
        return Ok(SandboxValue::Bool(b));
    }
    if let Some(n) = value.as_number() {
        return Ok(SandboxValue::Number(n));
    }
    if let Some(s) = value.as_string() {
        let s = s.to_string().map_err(fail)?;
        spend(budget, s.len())?;
        return Ok(SandboxValue::String(s));
    }
    if value.is_big_int() {
        let digits: String = helpers.call_on("format", value)?;
        return Ok(SandboxValue::BigInt(
            digits.trim_end_matches('n').to_owned(),
        ));
    }
    if value.is_symbol() {
        return Err("a symbol is not transferable".to_owned());
    }
    if value.is_function() {
        return Err("a function defined in the sandbox is not transferable to the host".to_owned());
    }
    if value.is_promise() {
        return Err("a promise nested inside a value is not transferable".to_owned());
    }
    if value.is_proxy() {
        return Err("a Proxy is not transferable".to_owned());
    }
    let Some(object) = value.as_object().cloned() else {
        return Err(format!(
            "a value of type {} is not transferable",
            value.type_name()
        ));
    };
    if let Some(array) = object.clone().into_array() {
        let mut items = Vec::with_capacity(array.len().min(PREALLOCATE));
        for i in 0..array.len() {
            let item: Value = array.get(i).map_err(fail)?;
            items.push(to_host(helpers, item, depth + 1, budget)?);
        }
        return Ok(SandboxValue::Array(items));
    }
    let kind: String = helpers.call_on("classify", object.clone())?;
    match kind.as_str() {
        "object" => {
            let keys: Array = helpers.call_on("keys", object.clone())?;
            let mut entries = Vec::with_capacity(keys.len().min(PREALLOCATE));
            for key in keys.iter::<String>() {
                let key = key.map_err(fail)?;
                let item: Value = object.get(key.as_str()).map_err(fail)?;
                entries.push((key, to_host(helpers, item, depth + 1, budget)?));
            }
            Ok(SandboxValue::Object(entries))
        }
        "date" => {
            let ms: f64 = helpers.call_on("dateValue", object)?;
            Ok(SandboxValue::Date(ms))
        }
        "map" => {
            let pairs: Array = helpers.call_on("entries", object)?;
            let mut entries = Vec::with_capacity(pairs.len().min(PREALLOCATE));
            for pair in pairs.iter::<Array>() {
                let pair = pair.map_err(fail)?;
                let k: Value = pair.get(0).map_err(fail)?;
                let v: Value = pair.get(1).map_err(fail)?;
                entries.push((
                    to_host(helpers, k, depth + 1, budget)?,
                    to_host(helpers, v, depth + 1, budget)?,
                ));
            }
            Ok(SandboxValue::Map(entries))
        }
        "set" => {
            let items: Array = helpers.call_on("values", object)?;
            let mut out = Vec::with_capacity(items.len().min(PREALLOCATE));
            for item in items.iter::<Value>() {
                out.push(to_host(helpers, item.map_err(fail)?, depth + 1, budget)?);
            }
            Ok(SandboxValue::Set(out))
        }
        "typed" => {
            let pair: Array = helpers.call_on("typedBytes", object)?;
            let name: String = pair.get(0).map_err(fail)?;
            let bytes: TypedArray<u8> = pair.get(1).map_err(fail)?;
            let kind = TypedArrayKind::from_constructor_name(&name)
                .ok_or_else(|| format!("a {name} is not transferable"))?;
            spend(budget, bytes.len())?;
            let bytes = copy_bytes(&bytes).ok_or("the typed array's buffer is detached")?;
            Ok(SandboxValue::TypedArray { kind, bytes })
        }
        "arraybuffer" => {
            let bytes: TypedArray<u8> = helpers.call_on("bufferBytes", object)?;
            spend(budget, bytes.len())?;
            let bytes = copy_bytes(&bytes).ok_or("the ArrayBuffer is detached")?;
            Ok(SandboxValue::ArrayBuffer(bytes))
        }
        "error" => {
            let name: String = object.get("name").unwrap_or_else(|_| "Error".to_owned());
            let message: String = object.get("message").unwrap_or_default();
            Ok(SandboxValue::object([
                ("name", SandboxValue::String(name)),
                ("message", SandboxValue::String(message)),
            ]))
        }
        "weak" => Err("WeakMap, WeakSet and WeakRef are not transferable".to_owned()),
        "class" => Err("a class instance is not transferable (only plain objects are)".to_owned()),
        other => Err(format!("a {other} is not transferable")),
    }
}

/// Preallocation cap for containers whose length the sandbox controls.
pub(super) const PREALLOCATE: usize = 1024;

fn spend(budget: &mut usize, bytes: usize) -> Result<(), String> {
    match budget.checked_sub(bytes) {
        Some(rest) => {
            *budget = rest;
            Ok(())
        }
        None => Err("the value is too large to clone out of the sandbox".to_owned()),
    }
}

/// Structured clone host → sandbox.
pub(super) fn to_sandbox<'js>(
    ctx: &Ctx<'js>,
    helpers: &Helpers<'js>,
    bridge: &Bridge,
    value: &SandboxValue,
    depth: usize,
) -> rquickjs::Result<Value<'js>> {
    use rquickjs::IntoJs;
    if depth > MAX_CLONE_DEPTH {
        return Err(rquickjs::Error::new_into_js_message(
            "SandboxValue",
            "value",
            "nests too deep",
        ));
    }
    let recurse = |v: &SandboxValue| to_sandbox(ctx, helpers, bridge, v, depth + 1);
    Ok(match value {
        SandboxValue::Undefined => Value::new_undefined(ctx.clone()),
        SandboxValue::Null => Value::new_null(ctx.clone()),
        SandboxValue::Bool(b) => Value::new_bool(ctx.clone(), *b),
        SandboxValue::Number(n) => Value::new_number(ctx.clone(), *n),
        SandboxValue::String(s) => s.as_str().into_js(ctx)?,
        SandboxValue::BigInt(digits) => helpers.func("makeBigInt")?.call((digits.as_str(),))?,
        SandboxValue::Array(items) => {
            let array = Array::new(ctx.clone())?;
            for (i, item) in items.iter().enumerate() {
                array.set(i, recurse(item)?)?;
            }
            array.into_value()
        }
        SandboxValue::Object(entries) => {
            let object = Object::new(ctx.clone())?;
            for (key, item) in entries {
                // Defined, not assigned: a `__proto__` key stays an own property.
                object.prop(
                    key.as_str(),
                    Property::from(recurse(item)?)
                        .writable()
                        .enumerable()
                        .configurable(),
                )?;
            }
            object.into_value()
        }
        SandboxValue::Map(entries) => {
            let pairs = Array::new(ctx.clone())?;
            for (i, (k, v)) in entries.iter().enumerate() {
                let pair = Array::new(ctx.clone())?;
                pair.set(0, recurse(k)?)?;
                pair.set(1, recurse(v)?)?;
                pairs.set(i, pair)?;
            }
            helpers.func("makeMap")?.call((pairs,))?
        }
        SandboxValue::Set(items) => {
            let array = Array::new(ctx.clone())?;
            for (i, item) in items.iter().enumerate() {
                array.set(i, recurse(item)?)?;
            }
            helpers.func("makeSet")?.call((array,))?
        }
        SandboxValue::Date(ms) => helpers.func("makeDate")?.call((*ms,))?,
        SandboxValue::TypedArray { kind, bytes } => {
            let raw = TypedArray::<u8>::new_copy(ctx.clone(), bytes.as_slice())?;
            helpers
                .func("makeTyped")?
                .call((kind.constructor_name(), raw))?
        }
        SandboxValue::ArrayBuffer(bytes) => {
            let raw = TypedArray::<u8>::new_copy(ctx.clone(), bytes.as_slice())?;
            helpers.func("makeBuffer")?.call((raw,))?
        }
        SandboxValue::Function(function) => {
            let index = bridge.register(function);
            helpers
                .func("makeProxy")?
                .call((index as f64, function.name()))?
        }
    })
}
