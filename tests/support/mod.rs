//! Shared helpers for the integration tests, included by each test binary
//! with `mod support;`.

pub mod postgres;
