//! The rules for what a link may be. Pure functions, property-tested.

use rand::distr::{Alphanumeric, SampleString};

/// Longest accepted target URL, in bytes.
pub const MAX_URL_BYTES: usize = 2048;

/// Shortest and longest custom code, in characters.
pub const CODE_LENGTH: std::ops::RangeInclusive<usize> = 3..=32;

/// Length of generated codes: 62^8 ≈ 2.2e14, so collisions are rare and
/// retried.
pub const GENERATED_CODE_LENGTH: usize = 8;

/// Codes that would shadow the service's own routes.
const RESERVED: &[&str] = &["api", "healthz", "readyz", "metrics"];

/// Checks that `url` is an absolute http(s) URL of at most
/// [`MAX_URL_BYTES`], and returns it as given.
///
/// # Errors
/// A message saying what is wrong, fit for the client.
pub fn url(url: &str) -> Result<String, String> {
    if url.len() > MAX_URL_BYTES {
        return Err(format!("url is longer than {MAX_URL_BYTES} bytes"));
    }
    let parsed =
        url::Url::parse(url).map_err(|error| format!("url is not an absolute URL: {error}"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err("url must use the http or https scheme".to_owned());
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err("url must have a host".to_owned());
    }
    Ok(url.to_owned())
}

/// Checks a custom code: 3 to 32 characters from `[A-Za-z0-9_-]`, and not
/// one of the service's own path segments.
///
/// # Errors
/// A message saying what is wrong, fit for the client.
pub fn code(code: &str) -> Result<String, String> {
    let valid_chars = code
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !valid_chars || !CODE_LENGTH.contains(&code.len()) {
        return Err(format!(
            "code must be {} to {} characters from A-Z, a-z, 0-9, '_' and '-'",
            CODE_LENGTH.start(),
            CODE_LENGTH.end()
        ));
    }
    if RESERVED.contains(&code) {
        return Err(format!("code '{code}' is reserved"));
    }
    Ok(code.to_owned())
}

/// A random code that passes [`code`].
pub fn generate_code() -> String {
    Alphanumeric.sample_string(&mut rand::rng(), GENERATED_CODE_LENGTH)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_absolute_http_urls() {
        assert!(url("https://example.com/a?b=c#d").is_ok());
        assert!(url("http://127.0.0.1:8080/").is_ok());
    }

    #[test]
    fn rejects_other_urls_with_a_reason() {
        assert!(url("ftp://example.com").unwrap_err().contains("scheme"));
        assert!(url("/relative").unwrap_err().contains("absolute"));
        assert!(url("mailto:a@b.c").is_err());
        let long = format!("https://example.com/{}", "a".repeat(MAX_URL_BYTES));
        assert!(url(&long).unwrap_err().contains("2048"));
    }

    #[test]
    fn codes_follow_the_pattern() {
        assert!(code("abc").is_ok());
        assert!(code("A_b-9").is_ok());
        assert!(code(&"x".repeat(32)).is_ok());
        assert!(code("ab").is_err());
        assert!(code(&"x".repeat(33)).is_err());
        assert!(code("a b").is_err());
        assert!(code("ünï").is_err());
        assert!(code("healthz").unwrap_err().contains("reserved"));
    }

    #[test]
    fn generated_codes_are_valid() {
        for _ in 0..100 {
            let generated = generate_code();
            assert_eq!(code(&generated), Ok(generated.clone()));
        }
    }
}
