//! An https upstream: rustls with a private CA (`upstream.ca-file`), and
//! HTTP/2 chosen by ALPN.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, Version};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};

use crate::support::{self, call};

#[tokio::test]
async fn https_upstream_speaks_h2_through_alpn() {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let ca_file = std::env::temp_dir().join(format!("residue-test-{}-ca.pem", std::process::id()));
    std::fs::write(&ca_file, cert.cert.pem()).unwrap();

    let key = rustls_pki_types::PrivateKeyDer::Pkcs8(cert.key_pair.serialize_der().into());
    let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![cert.cert.der().clone()], key)
    .unwrap();
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let versions: Arc<Mutex<Vec<Version>>> = Arc::default();
    let seen = versions.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            let seen = seen.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else {
                    return;
                };
                let service = service_fn(move |req: Request<Incoming>| {
                    seen.lock().unwrap().push(req.version());
                    async move {
                        let _ = req.into_body().collect().await;
                        let mut resp = Response::new(Full::new(Bytes::from_static(
                            br#"{"choices":[{"message":{"content":"over tls"}}],"usage":{"prompt_tokens":2}}"#,
                        )));
                        resp.headers_mut()
                            .insert("content-type", "application/json".parse().unwrap());
                        Ok::<_, Infallible>(resp)
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });

    let mut config = support::config(&format!("https://localhost:{port}"));
    config.upstream.ca_file = Some(ca_file.clone());
    let (residue, recorder) = support::start(config).await;
    let (status, _, body) = call(
        residue.addr,
        "/v1/chat/completions",
        &[],
        r#"{"messages":[{"role":"user","content":"hi"}]}"#,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        &body[..],
        br#"{"choices":[{"message":{"content":"over tls"}}],"usage":{"prompt_tokens":2}}"#
    );
    assert_eq!(recorder.one().await.output, "over tls");
    assert_eq!(versions.lock().unwrap().as_slice(), &[Version::HTTP_2]);
    residue.shutdown().await.unwrap();

    // Without the private CA, the certificate is refused: a 502, not a leak
    // of the request to an unverified peer.
    let (residue, _) = support::start(support::config(&format!("https://localhost:{port}"))).await;
    let (status, headers, _) = call(residue.addr, "/v1/chat/completions", &[], "{}").await;
    assert_eq!(status, 502);
    assert_eq!(headers["x-residue-error-source"], "upstream");
    assert_eq!(versions.lock().unwrap().len(), 1);
    residue.shutdown().await.unwrap();
    let _ = std::fs::remove_file(ca_file);
}
