//! Tenant identity: an ordered, configurable chain of sources.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use crate::hash::HashKey;

/// One step of the identity chain.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum IdentitySource {
    /// A header carrying the tenant id; used only when `trust-header = true`.
    Header,
    /// A claim of a JWT bearer token; used only when `[tenant.jwt]` is set.
    Jwt,
    /// The API key (`Authorization: Bearer`, `x-api-key`, `api-key`), reduced
    /// to a keyed hash.
    ApiKey,
}

impl IdentitySource {
    /// The name used in the config file.
    pub fn as_str(&self) -> &'static str {
        match self {
            IdentitySource::Header => "header",
            IdentitySource::Jwt => "jwt",
            IdentitySource::ApiKey => "api-key",
        }
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct TenantConfig {
    pub chain: Vec<IdentitySource>,
    pub header: String,
    pub trust_header: bool,
    pub jwt: Option<JwtConfig>,
}

impl Default for TenantConfig {
    fn default() -> Self {
        TenantConfig {
            chain: vec![
                IdentitySource::Header,
                IdentitySource::Jwt,
                IdentitySource::ApiKey,
            ],
            header: "x-tenant-id".to_string(),
            trust_header: false,
            jwt: None,
        }
    }
}

/// `[tenant.jwt]`. With `hs256-secret` or `rs256-public-key-file` tokens are
/// verified; with neither, claims are read unverified (identity only, trust
/// the gateway in front).
#[derive(Clone, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct JwtConfig {
    pub claim: String,
    pub hs256_secret: Option<String>,
    pub rs256_public_key_file: Option<PathBuf>,
}

impl Default for JwtConfig {
    fn default() -> Self {
        JwtConfig {
            claim: "sub".to_string(),
            hs256_secret: None,
            rs256_public_key_file: None,
        }
    }
}

impl std::fmt::Debug for JwtConfig {
    // Hand-written so that a config dump never shows the HS256 secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtConfig")
            .field("claim", &self.claim)
            .field(
                "hs256_secret",
                &self.hs256_secret.as_ref().map(|_| "<redacted>"),
            )
            .field("rs256_public_key_file", &self.rs256_public_key_file)
            .finish()
    }
}

/// How a tenant was identified.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TenantSource {
    Header,
    Jwt,
    ApiKey,
    Anonymous,
}

impl TenantSource {
    pub fn as_str(&self) -> &'static str {
        match self {
            TenantSource::Header => "header",
            TenantSource::Jwt => "jwt",
            TenantSource::ApiKey => "api-key",
            TenantSource::Anonymous => "anonymous",
        }
    }
}

/// A resolved tenant. For API keys `id` is `key:` and a keyed hash; the raw
/// key is never kept.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Tenant {
    pub id: Arc<str>,
    pub source: TenantSource,
}

impl Tenant {
    pub fn anonymous() -> Self {
        Tenant {
            id: Arc::from("anonymous"),
            source: TenantSource::Anonymous,
        }
    }
}

/// Resolves tenants from request headers, following the configured chain.
pub struct TenantResolver {
    config: TenantConfig,
    header_name: http::HeaderName,
    jwt: Option<JwtVerifier>,
    key: HashKey,
}

impl TenantResolver {
    /// Validates the config (reading the RS256 key file); every problem is
    /// returned, each naming its field.
    ///
    /// All problems are collected rather than stopping at the first, so an
    /// operator fixes a config in one round instead of one error per restart.
    /// Messages name config values (paths, header names) but never the HS256
    /// secret.
    pub fn new(config: &TenantConfig, key: HashKey) -> Result<Self, Vec<String>> {
        let mut errors = Vec::new();

        if config.chain.is_empty() {
            errors.push("tenant.chain: must name at least one source".to_string());
        }
        for (i, source) in config.chain.iter().enumerate() {
            // Report each duplicated source once, at its second occurrence.
            if config.chain[..i].contains(source) && !config.chain[i + 1..].contains(source) {
                errors.push(format!(
                    "tenant.chain: `{}` is listed more than once",
                    source.as_str()
                ));
            }
        }

        let header_name = match http::HeaderName::from_bytes(config.header.as_bytes()) {
            Ok(name) => Some(name),
            Err(_) => {
                errors.push(format!(
                    "tenant.header: {:?} is not a valid header name",
                    config.header
                ));
                None
            }
        };

        let jwt = match &config.jwt {
            None => None,
            Some(jwt) => JwtVerifier::new(jwt, &mut errors),
        };

        match header_name {
            Some(header_name) if errors.is_empty() => Ok(TenantResolver {
                config: config.clone(),
                header_name,
                jwt,
                key,
            }),
            _ => Err(errors),
        }
    }

    /// Walks the chain in order; the first source that yields an id wins, and
    /// a request nothing identifies is [`Tenant::anonymous`].
    ///
    /// Never fails and never panics: headers are client input, and a request
    /// that cannot be attributed is still proxied (as anonymous).
    pub fn resolve(&self, headers: &http::HeaderMap) -> Tenant {
        for source in &self.config.chain {
            let found = match source {
                IdentitySource::Header => self.by_header(headers),
                IdentitySource::Jwt => self.by_jwt(headers),
                IdentitySource::ApiKey => self.by_api_key(headers),
            };
            if let Some(tenant) = found {
                return tenant;
            }
        }
        Tenant::anonymous()
    }

    /// The tenant's id as a keyed hash, for incidents: an incident names
    /// tenants without carrying their ids (or the API-key hashes those ids
    /// embed) to wherever incidents are shipped.
    pub fn hashed_id(&self, tenant: &Tenant) -> String {
        self.key.short_hex("tenant", tenant.id.as_bytes())
    }

    /// The configured header, when trusted. A header sent more than once is
    /// ambiguous (a client value next to a gateway's) and is ignored rather
    /// than guessed at.
    fn by_header(&self, headers: &http::HeaderMap) -> Option<Tenant> {
        if !self.config.trust_header {
            return None;
        }
        let mut values = headers.get_all(&self.header_name).iter();
        let value = values.next()?;
        if values.next().is_some() {
            return None;
        }
        let id = std::str::from_utf8(value.as_bytes()).ok()?.trim();
        if id.is_empty() || id.len() > MAX_ID_BYTES {
            return None;
        }
        Some(Tenant {
            id: Arc::from(id),
            source: TenantSource::Header,
        })
    }

    fn by_jwt(&self, headers: &http::HeaderMap) -> Option<Tenant> {
        let verifier = self.jwt.as_ref()?;
        let token = bearer_token(headers)?;
        let token = std::str::from_utf8(token).ok()?;
        if !looks_like_jwt(token) {
            return None;
        }
        let value = verifier.claim(token)?;
        Some(Tenant {
            id: Arc::from(format!("jwt:{value}")),
            source: TenantSource::Jwt,
        })
    }

    /// The API key reduced to a keyed hash: the id is stable for a key (so a
    /// tenant's requests group together) while the key itself is never kept.
    fn by_api_key(&self, headers: &http::HeaderMap) -> Option<Tenant> {
        let key = bearer_token(headers)
            .or_else(|| non_empty_header(headers, "x-api-key"))
            .or_else(|| non_empty_header(headers, "api-key"))?;
        Some(Tenant {
            id: Arc::from(format!("key:{}", self.key.short_hex("api-key", key))),
            source: TenantSource::ApiKey,
        })
    }
}

impl std::fmt::Debug for TenantResolver {
    // Hand-written so that the HS256 secret can never reach a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantResolver")
            .field("chain", &self.config.chain)
            .field("header", &self.header_name)
            .field("trust_header", &self.config.trust_header)
            .field("jwt", &self.jwt)
            .field("key", &self.key)
            .finish()
    }
}

/// The longest tenant id taken from a header or a JWT claim. Ids are
/// identifiers, not documents: a longer value is more likely garbage or an
/// attempt to bloat per-tenant state than a real tenant.
const MAX_ID_BYTES: usize = 256;

/// How a JWT is checked.
enum JwtMode {
    /// HMAC with the configured secret.
    Hs256,
    /// RSA signature with the configured public key.
    Rs256,
    /// Identity only, trust the gateway in front: claims are read without
    /// checking the signature. Meant for deployments where an authenticating
    /// gateway has already verified the token; anyone who can reach residue
    /// directly can claim any identity.
    Unverified,
}

struct JwtVerifier {
    claim: String,
    mode: JwtMode,
    key: DecodingKey,
    validation: Validation,
}

impl std::fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mode = match self.mode {
            JwtMode::Hs256 => "hs256",
            JwtMode::Rs256 => "rs256",
            JwtMode::Unverified => "unverified",
        };
        f.debug_struct("JwtVerifier")
            .field("claim", &self.claim)
            .field("mode", &mode)
            .finish_non_exhaustive()
    }
}

impl JwtVerifier {
    /// Builds the verifier, pushing every problem onto `errors`; `None` when
    /// there was one.
    fn new(config: &JwtConfig, errors: &mut Vec<String>) -> Option<JwtVerifier> {
        let before = errors.len();
        if config.claim.is_empty() {
            errors.push("tenant.jwt.claim: must not be empty".to_string());
        }
        if config.hs256_secret.is_some() && config.rs256_public_key_file.is_some() {
            errors.push(
                "tenant.jwt: set at most one of `hs256-secret` and `rs256-public-key-file`"
                    .to_string(),
            );
        }
        if config.hs256_secret.as_deref() == Some("") {
            errors.push("tenant.jwt.hs256-secret: must not be empty".to_string());
        }
        let rsa_key = config.rs256_public_key_file.as_ref().and_then(|path| {
            let pem = match std::fs::read(path) {
                Ok(pem) => pem,
                Err(e) => {
                    errors.push(format!(
                        "tenant.jwt.rs256-public-key-file: cannot read {}: {e}",
                        path.display()
                    ));
                    return None;
                }
            };
            // jsonwebtoken accepts a private-key PEM here too (verification
            // then fails on every token); catch the mix-up at load instead,
            // and keep private keys out of a process that has no use for one.
            if pem.windows(16).any(|w| w == b"PRIVATE KEY-----") {
                errors.push(format!(
                    "tenant.jwt.rs256-public-key-file: {} holds a private key; give the public key",
                    path.display()
                ));
                return None;
            }
            match DecodingKey::from_rsa_pem(&pem) {
                Ok(key) => Some(key),
                Err(e) => {
                    errors.push(format!(
                        "tenant.jwt.rs256-public-key-file: {} is not an RSA public key in PEM form: {e}",
                        path.display()
                    ));
                    None
                }
            }
        });
        if errors.len() != before {
            return None;
        }

        let (mode, key, algorithm) = match (&config.hs256_secret, rsa_key) {
            (Some(secret), _) => (
                JwtMode::Hs256,
                DecodingKey::from_secret(secret.as_bytes()),
                Algorithm::HS256,
            ),
            (None, Some(key)) => (JwtMode::Rs256, key, Algorithm::RS256),
            (None, None) => (
                JwtMode::Unverified,
                DecodingKey::from_secret(&[]),
                Algorithm::HS256,
            ),
        };
        let mut validation = Validation::new(algorithm);
        // Tokens without `exp` are accepted (many gateways mint them); an
        // `exp` that is present is enforced, with jsonwebtoken's 60 s leeway
        // for clock skew. Audiences are the gateway's business, not ours.
        validation.required_spec_claims = HashSet::new();
        validation.validate_aud = false;
        if let JwtMode::Unverified = mode {
            // Without a verified signature `exp` proves nothing, and the
            // gateway in front has already applied its own policy.
            validation.insecure_disable_signature_validation();
            validation.validate_exp = false;
        }
        Some(JwtVerifier {
            claim: config.claim.clone(),
            mode,
            key,
            validation,
        })
    }

    /// The configured claim as a string: a string claim as is, a number in
    /// decimal. Any failure (bad signature, expired, malformed, claim missing
    /// or of another type) is `None`, so the chain falls through.
    fn claim(&self, token: &str) -> Option<String> {
        let data = jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(
            token,
            &self.key,
            &self.validation,
        )
        .ok()?;
        let claims = data.claims;
        if !matches!(self.mode, JwtMode::Unverified) {
            // jsonwebtoken silently skips an `exp` it cannot parse as an
            // integer; a verified token must not dodge expiry that way.
            if let Some(exp) = claims.get("exp") {
                exp.as_u64()?;
            }
        }
        let value = match claims.get(&self.claim)? {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Number(n) => n.to_string(),
            _ => return None,
        };
        if value.is_empty() || value.len() > MAX_ID_BYTES {
            return None;
        }
        Some(value)
    }
}

/// The credential of `Authorization: Bearer <token>`. The scheme is matched
/// case-insensitively (RFC 9110 §11.1), so `bearer` works too.
fn bearer_token(headers: &http::HeaderMap) -> Option<&[u8]> {
    let value = headers
        .get(http::header::AUTHORIZATION)?
        .as_bytes()
        .trim_ascii();
    let (scheme, rest) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"bearer")
        || !rest.first().is_some_and(|b| *b == b' ' || *b == b'\t')
    {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

fn non_empty_header<'a>(headers: &'a http::HeaderMap, name: &str) -> Option<&'a [u8]> {
    let value = headers.get(name)?.as_bytes().trim_ascii();
    (!value.is_empty()).then_some(value)
}

/// Three non-empty base64url segments separated by dots: a JWS in compact
/// form. Anything else in a bearer header is an opaque API key.
fn looks_like_jwt(token: &str) -> bool {
    let mut segments = 0;
    for segment in token.split('.') {
        segments += 1;
        if segment.is_empty()
            || !segment
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return false;
        }
    }
    segments == 3
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderValue};
    use jsonwebtoken::{EncodingKey, Header as JwtHeader};
    use serde_json::json;

    const SECRET: &str = "test-hs256-secret";

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/jwt")
            .join(name)
    }

    fn key() -> HashKey {
        HashKey::new([42; 32])
    }

    fn resolver(config: TenantConfig) -> TenantResolver {
        TenantResolver::new(&config, key()).expect("valid config")
    }

    fn config(
        chain: &[IdentitySource],
        trust_header: bool,
        jwt: Option<JwtConfig>,
    ) -> TenantConfig {
        TenantConfig {
            chain: chain.to_vec(),
            trust_header,
            jwt,
            ..TenantConfig::default()
        }
    }

    fn hs256() -> JwtConfig {
        JwtConfig {
            hs256_secret: Some(SECRET.to_string()),
            ..JwtConfig::default()
        }
    }

    fn rs256() -> JwtConfig {
        JwtConfig {
            rs256_public_key_file: Some(fixture("rs256-public.pem")),
            ..JwtConfig::default()
        }
    }

    fn unverified() -> JwtConfig {
        JwtConfig::default()
    }

    fn headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                http::HeaderName::from_bytes(name.as_bytes()).expect("test header name"),
                HeaderValue::from_bytes(value).expect("test header value"),
            );
        }
        map
    }

    fn bearer(token: &str) -> HeaderMap {
        headers(&[("authorization", format!("Bearer {token}").as_bytes())])
    }

    fn now() -> u64 {
        jsonwebtoken::get_current_timestamp()
    }

    fn sign_hs256(claims: &serde_json::Value, secret: &str) -> String {
        jsonwebtoken::encode(
            &JwtHeader::new(Algorithm::HS256),
            claims,
            &EncodingKey::from_secret(secret.as_bytes()),
        )
        .expect("encode")
    }

    fn sign_rs256(claims: &serde_json::Value) -> String {
        let pem = std::fs::read(fixture("rs256-private.pem")).expect("fixture");
        let key = EncodingKey::from_rsa_pem(&pem).expect("private key");
        jsonwebtoken::encode(&JwtHeader::new(Algorithm::RS256), claims, &key).expect("encode")
    }

    fn api_key_id(k: &str) -> String {
        format!("key:{}", key().short_hex("api-key", k.as_bytes()))
    }

    fn assert_tenant(t: &Tenant, id: &str, source: TenantSource) {
        assert_eq!((&*t.id, t.source), (id, source));
    }

    #[test]
    fn each_source_alone() {
        use IdentitySource::*;
        let cases: Vec<(&str, TenantConfig, HeaderMap, String, TenantSource)> = vec![
            (
                "trusted header",
                config(&[Header], true, None),
                headers(&[("x-tenant-id", b"  acme  ")]),
                "acme".to_string(),
                TenantSource::Header,
            ),
            (
                "custom header name, any case",
                TenantConfig {
                    header: "X-Org".to_string(),
                    ..config(&[Header], true, None)
                },
                headers(&[("x-org", b"globex")]),
                "globex".to_string(),
                TenantSource::Header,
            ),
            (
                "hs256 jwt",
                config(&[Jwt], false, Some(hs256())),
                bearer(&sign_hs256(
                    &json!({"sub": "alice", "exp": now() + 3600}),
                    SECRET,
                )),
                "jwt:alice".to_string(),
                TenantSource::Jwt,
            ),
            (
                "hs256 jwt without exp",
                config(&[Jwt], false, Some(hs256())),
                bearer(&sign_hs256(&json!({"sub": "bob"}), SECRET)),
                "jwt:bob".to_string(),
                TenantSource::Jwt,
            ),
            (
                "rs256 jwt",
                config(&[Jwt], false, Some(rs256())),
                bearer(&sign_rs256(&json!({"sub": "carol", "exp": now() + 3600}))),
                "jwt:carol".to_string(),
                TenantSource::Jwt,
            ),
            (
                "unverified jwt, wrong key and expired",
                config(&[Jwt], false, Some(unverified())),
                bearer(&sign_hs256(&json!({"sub": "dave", "exp": 1000}), "other")),
                "jwt:dave".to_string(),
                TenantSource::Jwt,
            ),
            (
                "numeric claim",
                config(
                    &[Jwt],
                    false,
                    Some(JwtConfig {
                        claim: "org_id".to_string(),
                        ..hs256()
                    }),
                ),
                bearer(&sign_hs256(&json!({"org_id": 12345}), SECRET)),
                "jwt:12345".to_string(),
                TenantSource::Jwt,
            ),
            (
                "lowercase bearer",
                config(&[Jwt], false, Some(hs256())),
                headers(&[(
                    "authorization",
                    format!("bearer {}", sign_hs256(&json!({"sub": "erin"}), SECRET)).as_bytes(),
                )]),
                "jwt:erin".to_string(),
                TenantSource::Jwt,
            ),
            (
                "api key in authorization",
                config(&[ApiKey], false, None),
                bearer("sk-live-abc"),
                api_key_id("sk-live-abc"),
                TenantSource::ApiKey,
            ),
            (
                "api key, lowercase bearer",
                config(&[ApiKey], false, None),
                headers(&[("authorization", b"bearer sk-live-abc")]),
                api_key_id("sk-live-abc"),
                TenantSource::ApiKey,
            ),
            (
                "api key in x-api-key",
                config(&[ApiKey], false, None),
                headers(&[("x-api-key", b"sk-ant-1")]),
                api_key_id("sk-ant-1"),
                TenantSource::ApiKey,
            ),
            (
                "api key in api-key",
                config(&[ApiKey], false, None),
                headers(&[("api-key", b"azure-1")]),
                api_key_id("azure-1"),
                TenantSource::ApiKey,
            ),
            (
                "authorization wins over x-api-key",
                config(&[ApiKey], false, None),
                headers(&[("authorization", b"Bearer first"), ("x-api-key", b"second")]),
                api_key_id("first"),
                TenantSource::ApiKey,
            ),
            (
                "non-bearer authorization falls to x-api-key",
                config(&[ApiKey], false, None),
                headers(&[
                    ("authorization", b"Basic dXNlcjpwYXNz"),
                    ("x-api-key", b"second"),
                ]),
                api_key_id("second"),
                TenantSource::ApiKey,
            ),
            (
                "empty x-api-key falls to api-key",
                config(&[ApiKey], false, None),
                headers(&[("x-api-key", b"  "), ("api-key", b"third")]),
                api_key_id("third"),
                TenantSource::ApiKey,
            ),
            (
                "nothing at all",
                TenantConfig {
                    trust_header: true,
                    jwt: Some(hs256()),
                    ..TenantConfig::default()
                },
                HeaderMap::new(),
                "anonymous".to_string(),
                TenantSource::Anonymous,
            ),
        ];
        for (name, config, headers, id, source) in cases {
            let t = resolver(config).resolve(&headers);
            assert_eq!((&*t.id, t.source), (id.as_str(), source), "{name}");
        }
    }

    #[test]
    fn chain_order_decides() {
        use IdentitySource::*;
        let both = headers(&[("x-tenant-id", b"acme"), ("x-api-key", b"sk-1")]);
        let t = resolver(config(&[Header, ApiKey], true, None)).resolve(&both);
        assert_tenant(&t, "acme", TenantSource::Header);
        let t = resolver(config(&[ApiKey, Header], true, None)).resolve(&both);
        assert_tenant(&t, &api_key_id("sk-1"), TenantSource::ApiKey);

        // A JWT that fails verification falls through to the API key, which
        // then is the bearer token itself.
        let forged = sign_hs256(&json!({"sub": "mallory"}), "not-the-secret");
        let t = resolver(config(&[Jwt, ApiKey], false, Some(hs256()))).resolve(&bearer(&forged));
        assert_tenant(&t, &api_key_id(&forged), TenantSource::ApiKey);
    }

    #[test]
    fn header_ignored_unless_trusted() {
        use IdentitySource::*;
        let h = headers(&[("x-tenant-id", b"acme"), ("x-api-key", b"sk-1")]);
        let t = resolver(config(&[Header, ApiKey], false, None)).resolve(&h);
        assert_tenant(&t, &api_key_id("sk-1"), TenantSource::ApiKey);
        let t = resolver(config(&[Header], false, None)).resolve(&h);
        assert_eq!(t, Tenant::anonymous());
    }

    #[test]
    fn jwt_verification_failures_fall_through() {
        use IdentitySource::*;
        let rs_token = sign_rs256(&json!({"sub": "carol"}));
        let mut tampered = rs_token.split('.').map(str::to_string).collect::<Vec<_>>();
        // Same signature, different payload (base64url of {"sub":"admin"}).
        tampered[1] = "eyJzdWIiOiJhZG1pbiJ9".to_string();
        let tampered = tampered.join(".");
        let cases: Vec<(&str, JwtConfig, String)> = vec![
            (
                "hs256 wrong secret",
                hs256(),
                sign_hs256(&json!({"sub": "x"}), "wrong"),
            ),
            (
                "hs256 expired",
                hs256(),
                sign_hs256(&json!({"sub": "x", "exp": now() - 3600}), SECRET),
            ),
            (
                "hs256 exp not a number",
                hs256(),
                sign_hs256(&json!({"sub": "x", "exp": "tomorrow"}), SECRET),
            ),
            ("rs256 tampered payload", rs256(), tampered),
            (
                "rs256 expired",
                rs256(),
                sign_rs256(&json!({"sub": "x", "exp": now() - 3600})),
            ),
            (
                "hs256 token for an rs256 resolver",
                rs256(),
                sign_hs256(&json!({"sub": "x"}), SECRET),
            ),
            (
                "rs256 token for an hs256 resolver",
                hs256(),
                sign_rs256(&json!({"sub": "x"})),
            ),
            (
                "claim missing",
                hs256(),
                sign_hs256(&json!({"iss": "x"}), SECRET),
            ),
            (
                "claim is an array",
                hs256(),
                sign_hs256(&json!({"sub": ["a", "b"]}), SECRET),
            ),
            (
                "claim is an object",
                hs256(),
                sign_hs256(&json!({"sub": {"a": 1}}), SECRET),
            ),
            (
                "claim is a bool",
                hs256(),
                sign_hs256(&json!({"sub": true}), SECRET),
            ),
            (
                "claim is null",
                hs256(),
                sign_hs256(&json!({"sub": null}), SECRET),
            ),
            (
                "claim is empty",
                hs256(),
                sign_hs256(&json!({"sub": ""}), SECRET),
            ),
            (
                "claims are an array",
                hs256(),
                sign_hs256(&json!(["sub", "x"]), SECRET),
            ),
            (
                "unverified, claims are an array",
                unverified(),
                sign_hs256(&json!([1, 2]), SECRET),
            ),
            (
                "claim too long",
                hs256(),
                sign_hs256(&json!({"sub": "x".repeat(MAX_ID_BYTES + 1)}), SECRET),
            ),
        ];
        for (name, jwt, token) in cases {
            let t = resolver(config(&[Jwt], false, Some(jwt))).resolve(&bearer(&token));
            assert_eq!(t, Tenant::anonymous(), "{name}");
        }
    }

    #[test]
    fn jwt_step_skipped_without_jwt_config() {
        let token = sign_hs256(&json!({"sub": "alice"}), SECRET);
        let t = resolver(config(&[IdentitySource::Jwt], false, None)).resolve(&bearer(&token));
        assert_eq!(t, Tenant::anonymous());
    }

    #[test]
    fn hostile_headers_never_panic() {
        use IdentitySource::*;
        let big = vec![b'a'; 10 * 1024];
        let big_jwt = format!("{0}.{0}.{0}", "A".repeat(4000));
        let cases: Vec<(&str, HeaderMap)> = vec![
            (
                "non-utf8 tenant header",
                headers(&[("x-tenant-id", &[0xff, 0xfe, 0x80])]),
            ),
            ("10 KB tenant header", headers(&[("x-tenant-id", &big)])),
            (
                "bearer without token",
                headers(&[("authorization", b"Bearer")]),
            ),
            (
                "bearer with only spaces",
                headers(&[("authorization", b"Bearer    ")]),
            ),
            (
                "scheme glued to token",
                headers(&[("authorization", b"Bearerabc.def.ghi")]),
            ),
            (
                "two segments",
                bearer("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0"),
            ),
            (
                "four segments",
                bearer("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln.ZXh0cmE"),
            ),
            ("empty segments", bearer("..")),
            ("base64 garbage", bearer("abc.def.ghi")),
            ("not base64 at all", bearer("!!!.@@@.###")),
            (
                "non-utf8 bearer",
                headers(&[("authorization", b"Bearer \xff\xfe.\x80.\x81")]),
            ),
            (
                "10 KB bearer",
                bearer(&String::from_utf8(big.clone()).expect("ascii")),
            ),
            ("huge jwt-shaped token", bearer(&big_jwt)),
            (
                "header json that is an array",
                bearer("WzFd.eyJzdWIiOiJ4In0.c2ln"),
            ),
            ("10 KB x-api-key", headers(&[("x-api-key", &big)])),
            (
                "non-utf8 x-api-key",
                headers(&[("x-api-key", &[0xff, 0xfe])]),
            ),
            (
                "duplicated tenant header",
                headers(&[("x-tenant-id", b"a"), ("x-tenant-id", b"b")]),
            ),
        ];
        for jwt in [hs256(), rs256(), unverified()] {
            let with_key = resolver(config(&[Header, Jwt, ApiKey], true, Some(jwt.clone())));
            let without_key = resolver(config(&[Header, Jwt], true, Some(jwt)));
            for (name, h) in &cases {
                let t = with_key.resolve(h);
                assert!(!t.id.is_empty(), "{name}");
                // Nothing here is a valid trusted header or a valid JWT.
                assert_eq!(without_key.resolve(h), Tenant::anonymous(), "{name}");
            }
        }
        // Oversized and non-UTF-8 values still identify by API key, hashed.
        let r = resolver(config(&[ApiKey], false, None));
        let t = r.resolve(&headers(&[("x-api-key", &big)]));
        assert_eq!(t.source, TenantSource::ApiKey);
        assert_eq!(t.id.len(), "key:".len() + 16);
    }

    #[test]
    fn api_key_ids_are_stable_distinct_and_opaque() {
        let r = resolver(config(&[IdentitySource::ApiKey], false, None));
        let raw = "sk-proj-SECRET-1234567890";
        let a = r.resolve(&bearer(raw));
        let b = r.resolve(&headers(&[("x-api-key", raw.as_bytes())]));
        let c = r.resolve(&bearer("sk-proj-SECRET-1234567891"));
        assert_eq!(a, b, "same key, same id whichever header carries it");
        assert_ne!(a.id, c.id);
        for t in [&a, &c] {
            assert!(t.id.starts_with("key:"));
            assert!(!t.id.contains("SECRET"), "raw key leaked into {}", t.id);
        }
        // Another hash key gives other ids: ids are not a plain hash of the key.
        let other = TenantResolver::new(
            &config(&[IdentitySource::ApiKey], false, None),
            HashKey::new([1; 32]),
        )
        .expect("valid");
        assert_ne!(other.resolve(&bearer(raw)).id, a.id);
        // And the resolver's Debug shows neither keys nor secrets.
        let r = resolver(config(&[IdentitySource::Jwt], false, Some(hs256())));
        let debug = format!("{r:?}");
        assert!(!debug.contains(SECRET), "{debug}");
        assert!(!format!("{:?}", hs256()).contains(SECRET));
    }

    #[test]
    fn hashed_id_is_keyed_and_stable() {
        let r = resolver(TenantConfig::default());
        let t = Tenant {
            id: Arc::from("acme"),
            source: TenantSource::Header,
        };
        assert_eq!(r.hashed_id(&t), key().short_hex("tenant", b"acme"));
        assert_eq!(r.hashed_id(&t), r.hashed_id(&t.clone()));
        assert_ne!(r.hashed_id(&t), r.hashed_id(&Tenant::anonymous()));
        assert!(!r.hashed_id(&t).contains("acme"));
    }

    #[test]
    fn default_config_is_valid() {
        assert!(TenantResolver::new(&TenantConfig::default(), key()).is_ok());
        for jwt in [hs256(), rs256(), unverified()] {
            let c = TenantConfig {
                jwt: Some(jwt),
                ..TenantConfig::default()
            };
            assert!(TenantResolver::new(&c, key()).is_ok());
        }
    }

    #[test]
    fn validation_reports_every_problem() {
        let dir = std::env::temp_dir().join(format!("residue-tenant-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let garbage = dir.join("garbage.pem");
        std::fs::write(
            &garbage,
            b"-----BEGIN PUBLIC KEY-----\nnope\n-----END PUBLIC KEY-----\n",
        )
        .expect("write");
        let missing = dir.join("missing.pem");

        let bad = TenantConfig {
            chain: vec![
                IdentitySource::ApiKey,
                IdentitySource::Jwt,
                IdentitySource::ApiKey,
            ],
            header: "bad header\n".to_string(),
            trust_header: true,
            jwt: Some(JwtConfig {
                claim: String::new(),
                hs256_secret: Some(SECRET.to_string()),
                rs256_public_key_file: Some(missing.clone()),
            }),
        };
        let errors = TenantResolver::new(&bad, key()).expect_err("invalid");
        let prefixes = [
            "tenant.chain: `api-key`",
            "tenant.header:",
            "tenant.jwt.claim:",
            "tenant.jwt: set at most one",
            "tenant.jwt.rs256-public-key-file: cannot read",
        ];
        assert_eq!(errors.len(), prefixes.len(), "{errors:#?}");
        for (e, p) in errors.iter().zip(prefixes) {
            assert!(e.starts_with(p), "{e:?} should start with {p:?}");
        }
        assert!(errors[4].contains("missing.pem"));
        assert!(
            errors.iter().all(|e| !e.contains(SECRET)),
            "secret leaked: {errors:#?}"
        );

        let cases: Vec<(&str, TenantConfig, &str)> = vec![
            (
                "empty chain",
                TenantConfig {
                    chain: vec![],
                    ..TenantConfig::default()
                },
                "tenant.chain: must name",
            ),
            (
                "empty header",
                TenantConfig {
                    header: String::new(),
                    ..TenantConfig::default()
                },
                "tenant.header:",
            ),
            (
                "unparseable pem",
                TenantConfig {
                    jwt: Some(JwtConfig {
                        rs256_public_key_file: Some(garbage.clone()),
                        ..JwtConfig::default()
                    }),
                    ..TenantConfig::default()
                },
                "tenant.jwt.rs256-public-key-file: ",
            ),
            (
                "a private key is not a public key",
                TenantConfig {
                    jwt: Some(JwtConfig {
                        rs256_public_key_file: Some(fixture("rs256-private.pem")),
                        ..JwtConfig::default()
                    }),
                    ..TenantConfig::default()
                },
                "tenant.jwt.rs256-public-key-file: ",
            ),
            (
                "empty secret",
                TenantConfig {
                    jwt: Some(JwtConfig {
                        hs256_secret: Some(String::new()),
                        ..JwtConfig::default()
                    }),
                    ..TenantConfig::default()
                },
                "tenant.jwt.hs256-secret:",
            ),
        ];
        for (name, config, prefix) in cases {
            let errors = TenantResolver::new(&config, key()).expect_err(name);
            assert_eq!(errors.len(), 1, "{name}: {errors:#?}");
            assert!(errors[0].starts_with(prefix), "{name}: {errors:?}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
