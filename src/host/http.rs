//! [`HttpRouter`]: an HTTP request for a session answered where the session is owned,
//! forwarded once to its owner or redirected there, or refused with the status that says why.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use uuid::Uuid;

use super::SessionHost;
use super::route::Route;
use crate::directory::{Owner, OwnerDirectory};
use crate::rig::Rig;

/// The header a node sets, to its own name, on a request it forwards to a session's owner. A
/// request that carries it is never forwarded again: two nodes whose directories disagree for
/// a moment answer 503 rather than bounce it between them.
pub const FORWARDED_HEADER: &str = "x-leasehold-forwarded";

/// What [`HttpRouter::route`] made of a request.
#[derive(Debug)]
pub enum Routed<B> {
    /// The session is owned here with a valid lease: handle the request with its rig.
    Here(Arc<Rig>, Request<B>),
    /// The request is answered: the owner's answer relayed, a redirect to the owner, `404 Not
    /// Found` (no such session: [`Route::Unknown`]), `413 Payload Too Large` (a body to forward
    /// over [`HttpRouter::with_max_body`]), or `503 Service Unavailable` with `Retry-After: 1`
    /// (nobody can take it now, the owner advertises no address or did not answer, or a
    /// forwarded request reached a node that does not own the session).
    Answered(Response<Bytes>),
}

/// How a request for a session owned elsewhere is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Forward,
    Redirect,
}

/// Routes HTTP requests for sessions to their owners: a request for a session is answered
/// where the session is owned, forwarded once to its owner or redirected there, or refused
/// with the status that says why ([`route`](Self::route)). Cheap to clone (its directory and
/// its client are shared).
///
/// It works over the `http` crate's types, so axum and hyper services use it alike, in one
/// call per handler:
///
/// ```no_run
/// use std::sync::Arc;
///
/// use axum::body::Body;
/// use axum::extract::{Path, Request, State};
/// use axum::response::Response;
/// use leasehold::{HttpRouter, Routed, SessionHost, Uuid};
///
/// struct App {
///     host: SessionHost,
///     router: HttpRouter,
/// }
///
/// async fn append(
///     State(app): State<Arc<App>>,
///     Path(session): Path<Uuid>,
///     request: Request,
/// ) -> Response {
///     match app.router.route(&app.host, session, request).await {
///         Routed::Here(rig, request) => {
///             // The session is owned here: work with its rig.
///             # let _ = (rig, request);
///             Response::new(Body::from("appended\n"))
///         }
///         // Forwarded and relayed, redirected, 404 or 503: answer as it is.
///         Routed::Answered(response) => response.map(Body::from),
///     }
/// }
/// ```
#[derive(Clone, Debug)]
pub struct HttpRouter {
    directory: OwnerDirectory,
    client: Client<HttpConnector, Full<Bytes>>,
    mode: Mode,
    timeout: Duration,
    max_body: usize,
}

impl HttpRouter {
    /// How long a forwarded request may take unless set: an owner's append may be re-sent for
    /// as long as its lease is valid, a TTL at most (10 s by default).
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
    /// The largest request or answer body forwarded unless set, in bytes.
    pub const DEFAULT_MAX_BODY: usize = 4 << 20;

    /// A router that reads owners from `directory` and forwards requests for sessions owned
    /// elsewhere over HTTP/1.1 (`http://` advertised addresses).
    pub fn new(directory: OwnerDirectory) -> Self {
        Self {
            directory,
            client: Client::builder(TokioExecutor::new()).build_http(),
            mode: Mode::Forward,
            timeout: Self::DEFAULT_TIMEOUT,
            max_body: Self::DEFAULT_MAX_BODY,
        }
    }

    /// Answers a request for a session owned elsewhere with `307 Temporary Redirect` to the
    /// owner's advertised address (the same path and query) instead of forwarding it: the
    /// client sends it again, method and body unchanged.
    pub fn redirecting(mut self) -> Self {
        self.mode = Mode::Redirect;
        self
    }

    /// Sets how long a forwarded request may take before it is answered 503.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets the largest request body forwarded (larger: 413) and owner's answer relayed
    /// (larger: 503), in bytes.
    pub fn with_max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

    /// The directory it reads owners from.
    pub fn directory(&self) -> &OwnerDirectory {
        &self.directory
    }

    /// Routes `request` for `session`, which `host` may own ([`SessionHost::route`]):
    /// [`Here`](Routed::Here) with the rig if it owns it; else answered (see [`Routed`]). A
    /// request for a session owned elsewhere is forwarded to the owner's advertised address,
    /// marked with [`FORWARDED_HEADER`], once: its answer is relayed (status, body, and the
    /// headers that are not the hop's own), or, on a failure to reach it, 503.
    pub async fn route<B>(
        &self,
        host: &SessionHost,
        session: Uuid,
        request: Request<B>,
    ) -> Routed<B>
    where
        B: http_body::Body,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        match host.route(session, &self.directory) {
            Route::Here(rig) => Routed::Here(rig, request),
            Route::There(owner) if request.headers().contains_key(FORWARDED_HEADER) => {
                // Forwarded here, yet not owned here: one directory lags the other. A retry
                // lets them catch up.
                Routed::Answered(unavailable(&format!(
                    "forwarded, but owned by node {:?}",
                    owner.node.name
                )))
            }
            Route::There(owner) => Routed::Answered(self.elsewhere(host, &owner, request).await),
            Route::Nobody => Routed::Answered(unavailable("no node can take the session now")),
            Route::Unknown => Routed::Answered(answer(
                StatusCode::NOT_FOUND,
                format!("no such session: {session}"),
            )),
        }
    }

    /// The answer to a request for a session `owner` owns: forwarded, or a redirect.
    async fn elsewhere<B>(
        &self,
        host: &SessionHost,
        owner: &Owner,
        request: Request<B>,
    ) -> Response<Bytes>
    where
        B: http_body::Body,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let Some(base) = owner.node.advertise.as_deref() else {
            return unavailable(&format!(
                "node {:?} owns the session and advertises no address",
                owner.node.name
            ));
        };
        let Some(uri) = at(base, request.uri()) else {
            return unavailable(&format!(
                "node {:?} advertises {base:?}, not an http:// address",
                owner.node.name
            ));
        };
        if self.mode == Mode::Redirect {
            let mut redirect = answer(
                StatusCode::TEMPORARY_REDIRECT,
                format!("owned by node {:?}", owner.node.name),
            );
            if let Ok(location) = HeaderValue::try_from(uri.to_string()) {
                redirect.headers_mut().insert(header::LOCATION, location);
            }
            return redirect;
        }
        let (mut parts, body) = request.into_parts();
        let body = match Limited::new(body, self.max_body).collect().await {
            Ok(body) => body.to_bytes(),
            Err(error) if error.is::<http_body_util::LengthLimitError>() => {
                return answer(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("a forwarded body is at most {} bytes", self.max_body),
                );
            }
            Err(error) => {
                return answer(
                    StatusCode::BAD_REQUEST,
                    format!("reading the body: {error}"),
                );
            }
        };
        strip_hop_headers(&mut parts.headers);
        if let Ok(node) = HeaderValue::try_from(host.inner.store.node()) {
            parts.headers.insert(FORWARDED_HEADER, node);
        }
        parts.uri = uri;
        let forwarded = Request::from_parts(parts, Full::new(body));
        let send = async {
            let (parts, body) = self.client.request(forwarded).await?.into_parts();
            let body = Limited::new(body, self.max_body).collect().await?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>((parts, body.to_bytes()))
        };
        match tokio::time::timeout(self.timeout, send).await {
            Ok(Ok((mut parts, body))) => {
                strip_hop_headers(&mut parts.headers);
                Response::from_parts(parts, body)
            }
            Ok(Err(error)) => unavailable(&format!(
                "forwarding to node {:?}: {error}",
                owner.node.name
            )),
            Err(_) => unavailable(&format!(
                "forwarding to node {:?}: no answer within {:?}",
                owner.node.name, self.timeout
            )),
        }
    }
}

/// `uri`'s path and query at `base`, an advertised `http://` address that may carry a path of
/// its own (`http://n1.internal:8080/svc/`).
fn at(base: &str, uri: &Uri) -> Option<Uri> {
    let base: Uri = base.parse().ok()?;
    if base.scheme_str() != Some("http") {
        return None;
    }
    let prefix = base.path().trim_end_matches('/');
    let path = uri.path_and_query().map_or("/", |path| path.as_str());
    Uri::builder()
        .scheme("http")
        .authority(base.authority()?.clone())
        .path_and_query(format!("{prefix}{path}"))
        .build()
        .ok()
}

/// Removes the headers that belong to one hop (RFC 9110, 7.6.1), and `Host`, which the next
/// hop's address sets.
fn strip_hop_headers(headers: &mut HeaderMap) {
    // The headers `Connection` names are the hop's own too.
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|name| HeaderName::try_from(name.trim()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        header::HOST,
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::CONTENT_LENGTH,
    ] {
        headers.remove(name);
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
}

/// An answer with `status` and a one-line plain-text body.
fn answer(status: StatusCode, text: String) -> Response<Bytes> {
    let mut response = Response::new(Bytes::from(text + "\n"));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// `503 Service Unavailable` with `Retry-After: 1`: to be retried in a second.
fn unavailable(why: &str) -> Response<Bytes> {
    let mut response = answer(StatusCode::SERVICE_UNAVAILABLE, why.to_owned());
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_is_joined_to_the_advertised_address_and_its_own_path() {
        let uri: Uri = "/sessions/1?x=2".parse().unwrap();
        let joined = |base: &str| at(base, &uri).map(|uri| uri.to_string());
        assert_eq!(
            joined("http://10.0.0.7:31501").as_deref(),
            Some("http://10.0.0.7:31501/sessions/1?x=2")
        );
        assert_eq!(
            joined("http://n1.internal:8080/svc/").as_deref(),
            Some("http://n1.internal:8080/svc/sessions/1?x=2")
        );
        assert_eq!(joined("https://n1:8443"), None, "only http:// is forwarded");
        assert_eq!(joined("not a url"), None);
    }

    #[test]
    fn the_hop_headers_are_not_forwarded_nor_relayed() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("connection", "keep-alive, x-hop"),
            ("x-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("host", "a:1"),
            ("transfer-encoding", "chunked"),
            ("content-length", "5"),
            ("content-type", "application/json"),
            ("x-request-id", "7"),
        ] {
            headers.insert(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        strip_hop_headers(&mut headers);
        let mut kept: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        kept.sort_unstable();
        assert_eq!(kept, ["content-type", "x-request-id"]);
    }
}
