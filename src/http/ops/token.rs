//! Who may read and change through the admin routes: the layers [`reads`] and [`changes`],
//! put on each route by the router.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;

use super::html;
use super::state::Admin;

/// The layer of every route that reads the ledger for people or scrapers: refused as
/// [`read_refusal`] says, else `next`.
pub(super) async fn reads(
    State(admin): State<Arc<Admin>>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(refused) = read_refusal(&admin, request.headers()) {
        return refused;
    }
    next.run(request).await
}

/// The layer of every route that changes data: refused without the admin token (the form's
/// `token` field or a bearer token, never basic auth, which a browser would send by itself
/// for another site's form); else `next`, with the same body.
pub(super) async fn changes(
    State(admin): State<Arc<Admin>>,
    request: Request,
    next: Next,
) -> Response {
    let (parts, body) = request.into_parts();
    // Read as the handler's own `Bytes` would be: the same body limit, the same rejection.
    let form = match Bytes::from_request(Request::from_parts(parts.clone(), body), &()).await {
        Ok(form) => form,
        Err(rejected) => return rejected.into_response(),
    };
    let token = html::param(&form, "token");
    if let Some(refused) = refusal(
        &admin,
        &parts.headers,
        Auth::form_or_bearer(token.as_deref()),
    ) {
        return refused;
    }
    next.run(Request::from_parts(parts, Body::from(form))).await
}

/// The answer to a read (`/metrics`, the console's pages) that must show the token and does
/// not. Reads need none only on a loopback listener and for a request that names an IP
/// address or `localhost` as its `Host`: a web page that rebinds its own DNS name to
/// 127.0.0.1 cannot read them from a browser on this machine.
fn read_refusal(admin: &Admin, headers: &HeaderMap) -> Option<Response> {
    if !admin.reads_need_token && local_host(headers) {
        return None;
    }
    refusal(admin, headers, Auth::header_or_basic())
}

/// Whether `Host` is `localhost` or an IP address (with or without a port).
fn local_host(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        // [::1]:9090
        Some(rest) => {
            return rest
                .split_once(']')
                .is_some_and(|(ip, _)| ip.parse::<std::net::Ipv6Addr>().is_ok())
        }
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::Ipv4Addr>().is_ok()
}

/// Where a route takes the admin token from.
struct Auth<'a> {
    /// The `token` field of a form.
    form: Option<&'a str>,
    /// The password of basic auth: only for reads, since a browser sends it by itself.
    basic: bool,
}

impl<'a> Auth<'a> {
    /// Reads: a bearer token, or basic auth (a browser asks for it).
    fn header_or_basic() -> Auth<'static> {
        Auth {
            form: None,
            basic: true,
        }
    }

    /// Changes: the form's `token` field, or a bearer token.
    fn form_or_bearer(form: Option<&'a str>) -> Auth<'a> {
        Auth { form, basic: false }
    }
}

/// The answer to send when the request does not carry the admin token where `auth` says.
fn refusal(admin: &Admin, headers: &HeaderMap, auth: Auth<'_>) -> Option<Response> {
    let Some(token) = &admin.token else {
        return Some(
            (
                StatusCode::FORBIDDEN,
                "this needs the admin token, and none is set: start serve with --admin-token \
                 env:NAME (or admin_token in the config file)\n",
            )
                .into_response(),
        );
    };
    let offered = auth
        .form
        .map(str::to_string)
        .or_else(|| header_token(headers, auth.basic));
    match offered {
        Some(offered)
            if constant_time_eq::constant_time_eq(
                offered.as_bytes(),
                token.expose().as_bytes(),
            ) =>
        {
            None
        }
        _ if auth.basic => Some(
            (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Basic realm=\"hookledger admin\"")],
                "the admin token is missing or wrong\n",
            )
                .into_response(),
        ),
        _ => Some(
            (
                StatusCode::UNAUTHORIZED,
                "the admin token is missing or wrong\n",
            )
                .into_response(),
        ),
    }
}

/// The token of `Authorization: Bearer <token>`, or with `basic` of
/// `Basic base64(<any user>:<token>)`.
fn header_token(headers: &HeaderMap, basic: bool) -> Option<String> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    if let Some(token) = value.strip_prefix("Bearer ") {
        return Some(token.trim().to_string());
    }
    let encoded = value.strip_prefix("Basic ").filter(|_| basic)?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let pair = String::from_utf8(decoded).ok()?;
    pair.split_once(':').map(|(_, token)| token.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(authorization: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, authorization.parse().unwrap());
        h
    }

    #[test]
    fn the_token_is_read_from_bearer_and_for_reads_from_basic_auth() {
        for basic in [true, false] {
            assert_eq!(
                header_token(&headers("Bearer s3cret-token"), basic).as_deref(),
                Some("s3cret-token")
            );
        }
        let encoded = base64::engine::general_purpose::STANDARD.encode("admin:s3cret:token");
        let basic = headers(&format!("Basic {encoded}"));
        assert_eq!(header_token(&basic, true).as_deref(), Some("s3cret:token"));
        // Not where a browser would send it by itself.
        assert_eq!(header_token(&basic, false), None);
        assert_eq!(header_token(&headers("Basic !!!"), true), None);
        assert_eq!(header_token(&headers("Token s3cret"), true), None);
        assert_eq!(header_token(&HeaderMap::new(), true), None);
    }

    #[test]
    fn only_an_ip_address_or_localhost_is_a_local_host() {
        let host = |value: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::HOST, value.parse().unwrap());
            local_host(&h)
        };
        for local in [
            "127.0.0.1:9090",
            "127.0.0.1",
            "localhost:9090",
            "LOCALHOST",
            "[::1]:9090",
            "10.0.0.5:9090",
        ] {
            assert!(host(local), "{local}");
        }
        for other in [
            "evil.example:9090",
            "evil.example",
            "127.0.0.1.evil.example",
            "[::1",
            "[nope]:1",
        ] {
            assert!(!host(other), "{other}");
        }
        assert!(!local_host(&HeaderMap::new()));
    }
}
