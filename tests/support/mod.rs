//! Shared helpers for the integration tests, included by each test binary
//! with `mod support;`.

pub mod binary;
pub mod otlp;
pub mod postgres;
pub mod tls;
