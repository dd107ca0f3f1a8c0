//! One integration-test binary, a module per area, so it compiles once.

mod accounting;
mod families;
mod hostile;
mod proxy;
mod sdk;
mod support;
mod tenant;
mod tls;
