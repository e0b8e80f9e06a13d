//! A check of a fake's answers against a provider's published OpenAPI description (a subset
//! of it in `tests/fixtures/`): each call a route of it, each body fitting its schema.

use serde_json::Value;

/// A call a fake answered, for the check against its provider's OpenAPI description.
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

/// Each call the fake of `provider` answered is a route of its description (`fixture`, under
/// tests/fixtures/: its method, its query parameters, the status among its responses or a
/// `default` one), and each body fits that response's schema.
pub fn assert_answers_fit(provider: &str, fixture: &str, answered: &[Answered]) {
    let path = crate::util::fixtures_dir().join(fixture);
    let spec: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    assert!(!answered.is_empty());
    for a in answered {
        let parts: Vec<&str> = a.path.split('/').collect();
        let route = spec["paths"]
            .as_object()
            .unwrap()
            .iter()
            .find(|(template, _)| {
                let t: Vec<&str> = template.split('/').collect();
                t.len() == parts.len()
                    && t.iter()
                        .zip(&parts)
                        .all(|(t, p)| t == p || (t.starts_with('{') && !p.is_empty()))
            })
            .unwrap_or_else(|| {
                panic!(
                    "{} {}: not a route of {provider}'s description",
                    a.method, a.path
                )
            });
        let operation = &route.1[a.method.to_lowercase()];
        assert!(
            operation.is_object(),
            "{} {}: not a method of {}",
            a.method,
            a.path,
            route.0
        );
        let known: Vec<&str> = operation["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| deref(&spec, p))
            .filter(|p| p["in"] == "query")
            .filter_map(|p| p["name"].as_str())
            .collect();
        for (name, _) in url::form_urlencoded::parse(a.query.as_bytes()) {
            // A deepObject parameter is sent as `name[key]`.
            let name = name.split('[').next().unwrap_or_default();
            assert!(
                known.contains(&name),
                "{} {}: no query parameter {name}",
                a.method,
                route.0
            );
        }
        let responses = &operation["responses"];
        let response = match responses.get(a.status.to_string()) {
            Some(response) => deref(&spec, response),
            None => deref(&spec, &responses["default"]),
        };
        assert!(
            response.is_object(),
            "{} {}: {provider} does not answer {}",
            a.method,
            route.0,
            a.status
        );
        if let Some(schema) = response.pointer("/content/application~1json/schema") {
            if let Some(why) = misfit(&spec, schema, &a.body, "body") {
                panic!("{} {} answered {}: {why}", a.method, route.0, a.status);
            }
        }
    }
}
