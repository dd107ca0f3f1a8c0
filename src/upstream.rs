//! The upstream client: pooled HTTP/1.1 and HTTP/2 (h2 through ALPN for
//! https, h2c by configuration), rustls for TLS, connect and response-head
//! timeouts, and errors mapped to the status a client should see.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::uri::{PathAndQuery, Scheme};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

use crate::body::BoxError;
use crate::config::UpstreamConfig;
use crate::error::{ErrorSource, Rejection, StartError};

pub type RequestBody = UnsyncBoxBody<Bytes, BoxError>;

#[derive(Clone)]
pub struct Upstream {
    client: Client<HttpsConnector<HttpConnector>, RequestBody>,
    scheme: Scheme,
    authority: http::uri::Authority,
    /// The URL's path without its trailing `/` (often empty).
    base_path: Arc<str>,
    response_timeout: Duration,
}

impl Upstream {
    pub fn new(config: &UpstreamConfig) -> Result<Self, StartError> {
        let uri: Uri = config
            .url
            .parse()
            .map_err(|e| StartError::Tls(format!("upstream.url: {e}")))?;
        let scheme = uri.scheme().cloned().unwrap_or(Scheme::HTTP);
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| StartError::Tls("upstream.url has no host".to_string()))?;
        let base_path: Arc<str> = Arc::from(uri.path().trim_end_matches('/'));

        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        if let Some(path) = &config.ca_file {
            let certs = CertificateDer::pem_file_iter(path).map_err(|e| {
                StartError::Tls(format!("upstream.ca-file {}: {e}", path.display()))
            })?;
            for cert in certs {
                let cert = cert.map_err(|e| {
                    StartError::Tls(format!("upstream.ca-file {}: {e}", path.display()))
                })?;
                roots.add(cert).map_err(|e| {
                    StartError::Tls(format!("upstream.ca-file {}: {e}", path.display()))
                })?;
            }
        }
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| StartError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();

        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(config.connect_timeout));
        http.set_keepalive(Some(Duration::from_secs(60)));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(config.pool_idle_timeout)
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .http2_only(config.h2c && scheme == Scheme::HTTP)
            .build(connector);
        Ok(Upstream {
            client,
            scheme,
            authority,
            base_path,
            response_timeout: config.response_timeout,
        })
    }

    /// The upstream URI for a request's path and query.
    pub fn uri_for(&self, path_and_query: Option<&PathAndQuery>) -> Uri {
        let pq = path_and_query.map(|p| p.as_str()).unwrap_or("/");
        let full = format!("{}{}", self.base_path, pq);
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(full)
            .build()
            .unwrap_or_else(|_| {
                Uri::builder()
                    .scheme(self.scheme.clone())
                    .authority(self.authority.clone())
                    .path_and_query("/")
                    .build()
                    .expect("scheme, authority and / make a URI. This is a bug.")
            })
    }

    /// Sends a request and waits for the response head, at most
    /// `response-timeout`.
    pub async fn send(&self, req: Request<RequestBody>) -> Result<Response<Incoming>, Rejection> {
        match tokio::time::timeout(self.response_timeout, self.client.request(req)).await {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(e)) => Err(classify(&e)),
            Err(_) => Err(Rejection::new(
                StatusCode::GATEWAY_TIMEOUT,
                "upstream_timeout",
                ErrorSource::Upstream,
                format!(
                    "the upstream sent no response head within {:?}",
                    self.response_timeout
                ),
            )),
        }
    }
}

/// Maps a client error to what the client should see: a timeout is 504,
/// anything else the upstream did is 502.
fn classify(e: &hyper_util::client::legacy::Error) -> Rejection {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    let mut timed_out = false;
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::TimedOut {
                timed_out = true;
            }
        }
        source = err.source();
    }
    if timed_out {
        return Rejection::new(
            StatusCode::GATEWAY_TIMEOUT,
            "upstream_timeout",
            ErrorSource::Upstream,
            "connecting to the upstream timed out",
        );
    }
    let detail = error_chain(e);
    if e.is_connect() {
        Rejection::new(
            StatusCode::BAD_GATEWAY,
            "upstream_unreachable",
            ErrorSource::Upstream,
            format!("cannot connect to the upstream: {detail}"),
        )
    } else {
        Rejection::new(
            StatusCode::BAD_GATEWAY,
            "upstream_error",
            ErrorSource::Upstream,
            format!("the upstream failed: {detail}"),
        )
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut parts = vec![e.to_string()];
    let mut source = e.source();
    while let Some(err) = source {
        let s = err.to_string();
        if !parts.contains(&s) {
            parts.push(s);
        }
        source = err.source();
    }
    parts.join(": ")
}
