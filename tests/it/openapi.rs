//! A check of a fake's answers against a provider's published OpenAPI description (a subset
//! of it in `tests/fixtures/`): each call a route of it, each body fitting its schema.

use serde_json::Value;

/// A call the fake answered, for the check against GitHub's OpenAPI description.
#[derive(Clone, Debug)]
pub struct Answered {
    pub method: String,
    pub path: String,
    pub query: String,
    pub status: u16,
    pub body: Value,
}

/// `node` with its `$ref` followed, in `spec`.
pub fn deref<'a>(spec: &'a Value, node: &'a Value) -> &'a Value {
    match node["$ref"].as_str() {
        Some(r) => deref(
            spec,
            spec.pointer(r.trim_start_matches('#'))
                .unwrap_or(&Value::Null),
        ),
        None => node,
    }
}

/// Why `value` does not fit `schema` (types, `nullable`, `required`, properties and items,
/// `oneOf`/`anyOf`), if it does not.
pub fn misfit(spec: &Value, schema: &Value, value: &Value, at: &str) -> Option<String> {
    let schema = deref(spec, schema);
    if value.is_null() && schema["nullable"] == true {
        return None;
    }
    for key in ["oneOf", "anyOf"] {
        if let Some(options) = schema[key].as_array() {
            return options
                .iter()
                .all(|o| misfit(spec, o, value, at).is_some())
                .then(|| format!("{at}: fits none of its {key}"));
        }
    }
    let fits = match schema["type"].as_str() {
        Some("object") => value.is_object(),
        Some("array") => value.is_array(),
        Some("string") => value.is_string(),
        Some("integer") => value.is_i64() || value.is_u64(),
        Some("number") => value.is_number(),
        Some("boolean") => value.is_boolean(),
        _ => true,
    };
    if !fits {
        return Some(format!("{at}: {value} is not a {}", schema["type"]));
    }
    if let Some(object) = value.as_object() {
        for key in schema["required"].as_array().into_iter().flatten() {
            let key = key.as_str().unwrap_or_default();
            if !object.contains_key(key) {
                return Some(format!("{at}: no required {key}"));
            }
        }
        for (key, field) in object {
            if let Some(property) = schema["properties"].get(key) {
                if let Some(why) = misfit(spec, property, field, &format!("{at}.{key}")) {
                    return Some(why);
                }
            }
        }
    }
    if let (Some(items), Some(list)) = (schema.get("items"), value.as_array()) {
        for (i, item) in list.iter().enumerate() {
            if let Some(why) = misfit(spec, items, item, &format!("{at}[{i}]")) {
                return Some(why);
            }
        }
    }
    None
}
