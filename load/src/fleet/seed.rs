//! The links a run's traffic picks among, created through one replica
//! before the traffic starts.

use std::future::Future;
use std::io;
use std::sync::Arc;

use anyhow::bail;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::raw::{self, RawConn};

/// Which links to create: `count` of them, coded `PREFIX-0`, `PREFIX-1`, …,
/// pointing at `https://example.com/PREFIX/SEED/N`.
#[derive(Clone, Copy, Debug)]
pub struct Links<'a> {
    /// The codes' and URLs' prefix.
    pub prefix: &'a str,
    /// How many.
    pub count: u32,
    /// The run's seed, in every URL.
    pub seed: u64,
}

/// Creates `links` over connections from `connect` (plain HTTP or TLS to
/// one replica), a new one whenever the replica closes; returns the codes.
///
/// # Errors
/// If a connection or creation fails, or a creation answers other than 201.
pub async fn create<S, F, Fut>(links: Links<'_>, connect: F) -> anyhow::Result<Arc<[String]>>
where
    S: AsyncRead + AsyncWrite + Unpin,
    F: Fn() -> Fut,
    Fut: Future<Output = io::Result<RawConn<S>>>,
{
    let Links {
        prefix,
        count,
        seed,
    } = links;
    let mut conn = connect().await?;
    let mut codes = Vec::new();
    for n in 0..count {
        let code = format!("{prefix}-{n}");
        let body =
            format!(r#"{{"url":"https://example.com/{prefix}/{seed}/{n}","code":"{code}"}}"#);
        let head = conn.exchange(&raw::post_json("/api/links", &body)).await?;
        if head.status != 201 {
            bail!("creating link {code} answered {}", head.status);
        }
        if head.close {
            conn = connect().await?;
        }
        codes.push(code);
    }
    Ok(codes.into())
}
