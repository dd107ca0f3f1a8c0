//! The tenant chain as the proxy applies it.

use crate::support::{self, call, FakeUpstream, Reply};
use residue::tenant::{IdentitySource, JwtConfig};

const BODY: &str = r#"{"messages":[{"role":"user","content":"hi"}]}"#;

#[tokio::test]
async fn api_keys_become_keyed_hashes_and_headers_count_only_when_trusted() {
    let upstream = FakeUpstream::start(|_| Reply::json("{}")).await;
    let (residue, recorder) = support::start(support::config(&upstream.url())).await;

    call(
        residue.addr,
        "/v1/chat/completions",
        &[("authorization", "Bearer sk-alpha")],
        BODY,
    )
    .await;
    call(
        residue.addr,
        "/v1/chat/completions",
        &[("x-api-key", "sk-alpha")],
        BODY,
    )
    .await;
    call(
        residue.addr,
        "/v1/chat/completions",
        &[("api-key", "sk-beta"), ("x-tenant-id", "spoofed")],
        BODY,
    )
    .await;
    call(residue.addr, "/v1/chat/completions", &[], BODY).await;
    let seen = recorder.wait_for(4).await;
    assert_eq!(seen[0].tenant_source, "api-key");
    assert!(seen[0].tenant.starts_with("key:"));
    assert!(!seen[0].tenant.contains("alpha"));
    assert_eq!(seen[0].tenant, seen[1].tenant, "one key, one tenant");
    assert_ne!(seen[0].tenant, seen[2].tenant);
    assert_eq!(
        seen[2].tenant_source, "api-key",
        "an untrusted header is ignored"
    );
    assert_eq!(seen[3].tenant, "anonymous");
    // The upstream still gets the credentials it needs.
    assert_eq!(
        upstream.received.lock().unwrap()[0].headers["authorization"],
        "Bearer sk-alpha"
    );
    residue.shutdown().await.unwrap();
}

#[tokio::test]
async fn chain_order_is_respected() {
    let upstream = FakeUpstream::start(|_| Reply::json("{}")).await;
    let mut config = support::config(&upstream.url());
    config.tenant.trust_header = true;
    config.tenant.jwt = Some(JwtConfig {
        claim: "org_id".into(),
        ..JwtConfig::default()
    });
    // An unsigned-but-well-formed JWT: {"alg":"HS256"} . {"org_id":"acme"} . sig
    let jwt = "eyJhbGciOiJIUzI1NiJ9.eyJvcmdfaWQiOiJhY21lIn0.c2ln";
    let (residue, recorder) = support::start(config.clone()).await;
    call(
        residue.addr,
        "/v1/chat/completions",
        &[
            ("x-tenant-id", "team-red"),
            ("authorization", &format!("Bearer {jwt}")),
        ],
        BODY,
    )
    .await;
    call(
        residue.addr,
        "/v1/chat/completions",
        &[("authorization", &format!("Bearer {jwt}"))],
        BODY,
    )
    .await;
    let seen = recorder.wait_for(2).await;
    assert_eq!(
        (seen[0].tenant.as_str(), seen[0].tenant_source),
        ("team-red", "header")
    );
    assert_eq!(
        (seen[1].tenant.as_str(), seen[1].tenant_source),
        ("jwt:acme", "jwt")
    );
    residue.shutdown().await.unwrap();

    config.tenant.chain = vec![IdentitySource::ApiKey, IdentitySource::Header];
    let (residue, recorder) = support::start(config).await;
    call(
        residue.addr,
        "/v1/chat/completions",
        &[("x-tenant-id", "team-red"), ("x-api-key", "k1")],
        BODY,
    )
    .await;
    assert_eq!(recorder.one().await.tenant_source, "api-key");
    residue.shutdown().await.unwrap();
}
