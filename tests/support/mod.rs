//! Shared helpers for the integration tests, included by each test binary
//! with `mod support;`.

pub mod binary;
pub mod postgres;
pub mod tls;
