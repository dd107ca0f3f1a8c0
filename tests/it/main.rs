//! One integration-test binary, a module per area, so it compiles once.

mod accounting;
mod cli;
mod cross_tenant;
mod demo;
mod enforce;
mod families;
mod hostile;
mod limits;
mod load;
mod proxy;
mod sdk;
mod semantic;
mod sim;
mod support;
mod tenant;
mod tls;
