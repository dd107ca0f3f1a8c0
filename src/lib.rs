//! residue: a reverse proxy for LLM endpoints that watches the *content* of
//! answers for data that belongs to another tenant.
//!
//! The path of one request reads from the module names:
//! `server → tenant → protocol (request side) → upstream → body (tap) →
//! observe → detect → incident + metrics`.

pub mod encoding;
pub mod hash;
pub mod protocol;
pub mod tenant;
pub mod tokens;
