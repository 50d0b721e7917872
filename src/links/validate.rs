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
/// [`MAX_URL_BYTES`], both as given and once normalised, and returns its
/// normalised form ([`normalise`]): that form is what is stored and what
/// every redirect sends in `Location`.
///
/// # Errors
/// A message saying what is wrong, fit for the client.
pub fn url(url: &str) -> Result<String, String> {
    let too_long = || format!("url is longer than {MAX_URL_BYTES} bytes");
    if url.len() > MAX_URL_BYTES {
        return Err(too_long());
    }
    let normalised = normalise(url)?;
    if normalised.len() > MAX_URL_BYTES {
        return Err(format!("{} once normalised", too_long()));
    }
    Ok(normalised)
}

/// The form of `url` that can go into a `Location` header as is: the WHATWG
/// serialisation of the parsed URL (IDN hosts in punycode, default ports
/// dropped, spaces and non-ASCII percent-encoded), with whatever that
/// serialisation still leaves that RFC 3986 does not allow in a URI
/// percent-encoded too (`|`, `^`, `[`, `]` outside an IPv6 host, a `%` that
/// starts no escape, a second `#`, `{`, `}`, `` ` `` and `\` in a query).
/// The result is ASCII and a fixed point: normalising it again changes
/// nothing.
///
/// Control characters are refused rather than dropped: the url crate would
/// silently remove tabs and newlines, which is a guess at what the client
/// meant. [`url`] adds the length limit; redirects of links stored before
/// this rule use this function alone, so that no stored link that used to
/// redirect stops doing so for its length.
///
/// # Errors
/// A message saying what is wrong, fit for the client.
pub fn normalise(url: &str) -> Result<String, String> {
    if let Some(control) = url.chars().find(|c| c.is_control()) {
        return Err(format!(
            "url must not contain control characters (found U+{:04X})",
            u32::from(control)
        ));
    }
    let parsed =
        url::Url::parse(url).map_err(|error| format!("url is not an absolute URL: {error}"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err("url must use the http or https scheme".to_owned());
    }
    let host = match parsed.host() {
        Some(url::Host::Domain("")) => None,
        other => other,
    };
    let Some(host) = host else {
        return Err("url must have a host".to_owned());
    };
    if let url::Host::Domain(domain) = host {
        // WHATWG lets a few characters through that RFC 3986's reg-name
        // does not (`"`, `{`, `}`, `` ` ``); encoding them would change the
        // host a client looks up, so such a URL is refused.
        if let Some(bad) = domain.bytes().find(|&b| !is_reg_name_byte(b)) {
            return Err(format!(
                "url host must not contain '{}'",
                char::from(bad).escape_default()
            ));
        }
    }
    let mut normalised = String::with_capacity(parsed.as_str().len());
    // Scheme and userinfo: the url crate encodes userinfo strictly; this
    // pass only catches a stray '%'.
    encode_uri_part(&parsed[..url::Position::BeforeHost], false, &mut normalised);
    // The host is checked above; an IPv6 literal keeps its brackets.
    normalised.push_str(&parsed[url::Position::BeforeHost..url::Position::AfterHost]);
    let rest = &parsed[url::Position::AfterHost..];
    // The url crate encodes '#' in paths and queries, so the first one left
    // starts the fragment, where RFC 3986 allows no further '#'.
    let (before_fragment, fragment) = match rest.split_once('#') {
        Some((before, fragment)) => (before, Some(fragment)),
        None => (rest, None),
    };
    encode_uri_part(before_fragment, false, &mut normalised);
    if let Some(fragment) = fragment {
        normalised.push('#');
        encode_uri_part(fragment, true, &mut normalised);
    }
    Ok(normalised)
}

/// Whether RFC 3986 allows byte `b` in a reg-name (unreserved or
/// sub-delims; the url crate has already decoded any percent-escape).
fn is_reg_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=".contains(&b)
}

/// Appends `part` to `out`, percent-encoding every byte RFC 3986 does not
/// allow outside an IP literal: anything but unreserved characters,
/// sub-delims, `:/?@`, `#` (unless `in_fragment`) and a `%` that starts a
/// `%XX` escape.
fn encode_uri_part(part: &str, in_fragment: bool, out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let bytes = part.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        let allowed = match b {
            b'%' => bytes
                .get(i + 1..i + 3)
                .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit)),
            b'#' => !in_fragment,
            b':' | b'/' | b'?' | b'@' => true,
            _ => is_reg_name_byte(b),
        };
        if allowed {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        }
    }
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
    fn control_characters_anywhere_are_refused_with_a_reason() {
        for bad in [
            "https://example.com/a\r\nb",
            "https://example.com/a\tb",
            "https://example.com/\0",
            "https://example.com/\u{1}",
            "https://example.com/\u{b}",
            "https://example.com/\u{7f}",
            "https://example.com/\u{85}",
            "https://example.com/?q=\u{9f}",
            "https://example.com/#\n",
            "https://exa\nmple.com/",
            "\nhttps://example.com/",
            "https://example.com/\n",
        ] {
            let error = url(bad).expect_err(bad);
            assert!(error.contains("control characters"), "{bad:?}: {error}");
        }
        assert!(url("https://example.com/a\r\nb")
            .unwrap_err()
            .contains("U+000D"));
    }

    #[test]
    fn urls_are_stored_in_their_normalised_ascii_form() {
        let cases = [
            ("https://example.com/a b", "https://example.com/a%20b"),
            ("https://ÉXAMPLE.com/ä", "https://xn--xample-9ua.com/%C3%A4"),
            ("HTTPS://Example.COM:443/a/../b", "https://example.com/b"),
            ("http://example.com", "http://example.com/"),
            ("https://[::1]:8080/x", "https://[::1]:8080/x"),
            (" https://example.com/ ", "https://example.com/"),
            (
                "https://example.com/a|b^c{d}e`f[g]h\"i<j>k\\l",
                "https://example.com/a%7Cb%5Ec%7Bd%7De%60f%5Bg%5Dh%22i%3Cj%3Ek/l",
            ),
            (
                "https://example.com/?q=a b|c^d{e}f`g[h]i\\j'k",
                "https://example.com/?q=a%20b%7Cc%5Ed%7Be%7Df%60g%5Bh%5Di%5Cj%27k",
            ),
            (
                "https://example.com/#a b|c[d]#e{f}",
                "https://example.com/#a%20b%7Cc%5Bd%5D%23e%7Bf%7D",
            ),
            (
                "https://example.com/100%?50%25%zz#%",
                "https://example.com/100%25?50%25%25zz#%25",
            ),
            (
                "https://u[s]er:p|w%@example.com/",
                "https://u%5Bs%5Der:p%7Cw%25@example.com/",
            ),
        ];
        for (given, stored) in cases {
            assert_eq!(url(given).as_deref(), Ok(stored), "{given:?}");
            assert_eq!(url(stored).as_deref(), Ok(stored), "{stored:?} again");
        }
    }

    #[test]
    fn hosts_that_a_uri_cannot_carry_are_refused() {
        for bad in ["https://a{b}.com/", "https://a`b.com/", "https://a\"b.com/"] {
            let error = url(bad).expect_err(bad);
            assert!(error.contains("host"), "{bad:?}: {error}");
        }
        assert!(url("https://a!$&'()*+,;=b.com/").is_ok());
    }

    #[test]
    fn the_length_limit_holds_for_the_normalised_form_too() {
        // 700 two-byte characters: 1400 bytes given, 4200 once encoded.
        let wide = format!("https://example.com/{}", "é".repeat(700));
        assert!(wide.len() <= MAX_URL_BYTES);
        let error = url(&wide).unwrap_err();
        assert!(
            error.contains("2048") && error.contains("normalised"),
            "{error}"
        );
        // The redirect path normalises links stored before the rule without
        // the limit.
        assert!(normalise(&wide).is_ok_and(|n| n.len() > MAX_URL_BYTES));
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
