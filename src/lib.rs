//! residue: a reverse proxy for LLM endpoints that watches the *content* of
//! answers for data that belongs to another tenant.
//!
//! The path of one request reads from the module names:
//! `server → proxy (tenant, protocol request side) → upstream → body (tap) →
//! observe (protocol response side) → detect → incident + metrics`.

pub mod body;
pub mod config;
pub mod demo;
pub mod detect;
pub mod embed;
pub mod encoding;
pub mod enforce;
pub mod error;
pub mod fingerprint;
pub mod hash;
pub mod incident;
pub mod load;
pub mod metrics;
pub mod observe;
pub mod protocol;
pub mod proxy;
pub mod rules;
pub mod scenario;
pub mod scorecard;
pub mod server;
pub mod sim;
pub mod store;
pub mod telemetry;
pub mod tenant;
pub mod tokens;
pub mod upstream;

pub use config::Config;
pub use server::{Residue, Running};
