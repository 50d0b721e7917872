//! HAProxy as a child process: the load balancer of the rollout, with a
//! generated configuration and its runtime API on a Unix socket. Its log
//! (`logs/haproxy.log`) has every server state change and every request
//! that did not end normally, with HAProxy's termination state (`SC--`:
//! the server refused or closed the connection before the request).
//!
//! It health-checks `/readyz` the way a Kubernetes readiness probe feeds the
//! endpoints controller: a replica that turns unready keeps receiving
//! traffic until `fall` checks in a row have failed, `inter` apart. That lag
//! is what a lame-duck period has to outlast.
//!
//! Replicas come and go through pre-declared slots (`server-template`),
//! filled and emptied with `set server … addr` and `set server … state`. In
//! [`Mode::Http`] (L7, the default) there are two backends: HTTP/1.1 to the
//! servers for the HTTP/1.1 frontend, HTTP/2 (prior knowledge) to the
//! servers for the HTTP/2 frontend. In [`Mode::Tcp`] (L4, as kube-proxy
//! balances a Service) one frontend passes every connection whole, TLS
//! included, to one replica picked round-robin, and never looks inside: a
//! client's keep-alive connection stays on its replica until one of them
//! closes it.
//!
//! The runtime API itself is the test kit's client
//! ([`lameduck_testkit::haproxy`]), which the container tests use too.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context};
use lameduck_testkit::haproxy::RuntimeApi;
use serde::Serialize;
use tokio::net::UnixStream;
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// The two backends of [`Mode::Http`], one per protocol towards the
/// servers.
pub const BACKENDS: [&str; 2] = ["be_h1", "be_h2"];

/// The one backend of [`Mode::Tcp`].
pub const TCP_BACKENDS: [&str; 1] = ["be_tcp"];

/// What the balancer forwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// L7: HTTP requests, each to a replica of its own, over the
    /// balancer's own connections to the replicas.
    Http,
    /// L4: TCP connections, each to one replica for its whole life; TLS
    /// passes through to the replica.
    Tcp,
}

impl Mode {
    fn backends(self) -> &'static [&'static str] {
        match self {
            Mode::Http => &BACKENDS,
            Mode::Tcp => &TCP_BACKENDS,
        }
    }
}

/// How long HAProxy may take to open its runtime API socket.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// How often the runtime API is polled while waiting for a state.
const STATUS_POLL: Duration = Duration::from_millis(25);

/// The balancer's health checking, the source of the endpoint-removal lag;
/// by default a Kubernetes Service's: a readiness probe every 500 ms, out
/// after 2 failures, in after 1, and no retry. The options of every
/// scenario with a balancer.
#[derive(Clone, Copy, Debug, clap::Args, Serialize)]
pub struct Checks {
    /// The balancer's health-check interval.
    #[arg(long = "check-inter", value_name = "DURATION", default_value = "500ms", value_parser = humantime::parse_duration)]
    #[serde(with = "crate::report::millis")]
    pub inter: Duration,
    /// Failed checks in a row before the balancer takes a replica out.
    #[arg(long = "check-fall", value_name = "N", default_value_t = 2)]
    pub fall: u32,
    /// Passed checks in a row before the balancer puts a replica back.
    #[arg(long = "check-rise", value_name = "N", default_value_t = 1)]
    pub rise: u32,
    /// Balancer retries of a failed connection to a replica (HAProxy's
    /// `retries`): 0 by default, like kube-proxy (an L4 Service does not
    /// retry); HAProxy's own default is 3, which hides part of the failures
    /// behind a delay.
    #[arg(long = "lb-retries", value_name = "N", default_value_t = 0)]
    pub retries: u32,
    /// Retries go to another replica (`option redispatch 1`) and only when
    /// the connection failed, so the request never reached a replica
    /// (`retry-on conn-failure`): an L7 balancer's way past a replica that
    /// died. Never a request a replica took and then died with, which it
    /// may have counted. Set by the scenarios that need it (`load crash`),
    /// not a flag: with `retries` 0 it changes nothing.
    #[arg(skip)]
    pub redispatch: bool,
}

impl Checks {
    /// The longest a server that turned unready can still be sent new
    /// requests: `fall` intervals plus the check in progress.
    pub fn worst_lag(&self) -> Duration {
        self.inter * (self.fall + 1)
    }
}

/// A running HAProxy.
#[derive(Debug)]
pub struct Haproxy {
    /// The HTTP/1.1 frontend; in [`Mode::Tcp`], the one L4 frontend.
    pub http1: SocketAddr,
    /// The HTTP/2 prior-knowledge frontend; in [`Mode::Tcp`], the one L4
    /// frontend too.
    pub http2: SocketAddr,
    /// Slots per backend.
    pub slots: usize,
    /// L7 or L4.
    pub mode: Mode,
    /// Its runtime API, on the Unix socket of its configuration.
    api: RuntimeApi,
    child: Child,
}

impl Haproxy {
    /// Writes a configuration into `dir` and starts `haproxy` on two free
    /// loopback ports, with `slots` empty server slots per backend. Its
    /// output goes to `log`.
    ///
    /// # Errors
    /// If haproxy is missing, rejects the configuration, or does not open its
    /// runtime socket in time.
    pub async fn start(
        checks: Checks,
        slots: usize,
        dir: &Path,
        log: &Path,
    ) -> anyhow::Result<Haproxy> {
        let socket = dir.join("haproxy.sock");
        let http1 = free_port()?;
        let http2 = free_port()?;
        let config = render_config(checks, slots, &socket, http1, http2);
        Haproxy::spawn(Mode::Http, (http1, http2), slots, config, dir, log).await
    }

    /// Starts `haproxy` in [`Mode::Tcp`] on one free loopback port (both
    /// [`Haproxy::http1`] and [`Haproxy::http2`]), with `slots` empty
    /// server slots, health-checked over HTTP as in [`Haproxy::start`].
    ///
    /// # Errors
    /// As [`Haproxy::start`].
    pub async fn start_tcp(
        checks: Checks,
        slots: usize,
        dir: &Path,
        log: &Path,
    ) -> anyhow::Result<Haproxy> {
        let socket = dir.join("haproxy.sock");
        let frontend = free_port()?;
        let config = render_tcp_config(checks, slots, &socket, frontend);
        Haproxy::spawn(Mode::Tcp, (frontend, frontend), slots, config, dir, log).await
    }

    /// Writes `config` into `dir` and starts `haproxy` on it, its output
    /// going to `log`; returns once its runtime socket answers.
    async fn spawn(
        mode: Mode,
        (http1, http2): (SocketAddr, SocketAddr),
        slots: usize,
        config: String,
        dir: &Path,
        log: &Path,
    ) -> anyhow::Result<Haproxy> {
        let socket = dir.join("haproxy.sock");
        let config_path = dir.join("haproxy.cfg");
        std::fs::write(&config_path, config)
            .with_context(|| format!("cannot write {}", config_path.display()))?;
        let log_file = std::fs::File::create(log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let mut child = Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .kill_on_drop(true)
            .spawn()
            .context("cannot start haproxy (scripts/install-test-deps.sh haproxy installs it)")?;
        let lb = Haproxy {
            http1,
            http2,
            slots,
            mode,
            api: RuntimeApi::unix(&socket),
            child: {
                let deadline = Instant::now() + START_TIMEOUT;
                loop {
                    if let Ok(Some(status)) = child.try_wait() {
                        bail!(
                            "haproxy exited at startup with {status} (see {})",
                            log.display()
                        );
                    }
                    if UnixStream::connect(&socket).await.is_ok() {
                        break child;
                    }
                    if Instant::now() > deadline {
                        bail!(
                            "haproxy did not open its socket in {START_TIMEOUT:?} (see {})",
                            log.display()
                        );
                    }
                    tokio::time::sleep(STATUS_POLL).await;
                }
            },
        };
        Ok(lb)
    }

    /// Runs one runtime API command and returns its answer.
    ///
    /// # Errors
    /// If the socket fails or HAProxy rejects the command.
    pub async fn command(&self, command: &str) -> anyhow::Result<String> {
        Ok(self.api.command(command).await?)
    }

    /// Points `slot` (1-based) of every backend at `addr` and takes it out
    /// of maintenance: the endpoints controller adding a ready pod.
    ///
    /// # Errors
    /// If HAProxy rejects a command.
    pub async fn enable(&self, slot: usize, addr: SocketAddr) -> anyhow::Result<()> {
        self.enable_checked_at(slot, addr, addr.port()).await
    }

    /// [`Haproxy::enable`], with the health checks sent to `check_port` on
    /// the same host: a replica's admin listener, which is where a
    /// Kubernetes readiness probe goes (the `admin` port of the manifests).
    ///
    /// # Errors
    /// If HAProxy rejects a command.
    pub async fn enable_checked_at(
        &self,
        slot: usize,
        addr: SocketAddr,
        check_port: u16,
    ) -> anyhow::Result<()> {
        for backend in self.mode.backends() {
            self.command(&format!(
                "set server {backend}/s{slot} addr {} port {}",
                addr.ip(),
                addr.port()
            ))
            .await?;
            self.command(&format!(
                "set server {backend}/s{slot} check-port {check_port}"
            ))
            .await?;
            self.command(&format!("set server {backend}/s{slot} state ready"))
                .await?;
        }
        Ok(())
    }

    /// Puts `slot` of every backend into maintenance: the endpoint removed.
    ///
    /// # Errors
    /// If HAProxy rejects a command.
    pub async fn disable(&self, slot: usize) -> anyhow::Result<()> {
        for backend in self.mode.backends() {
            self.command(&format!("set server {backend}/s{slot} state maint"))
                .await?;
        }
        Ok(())
    }

    /// The `status` column of `show stat` for `slot` in every backend
    /// (`UP`, `DOWN`, `MAINT`, `UP 1/2`, …).
    ///
    /// # Errors
    /// If the runtime API fails or the slot is not listed.
    pub async fn status(&self, slot: usize) -> anyhow::Result<Vec<String>> {
        let server = format!("s{slot}");
        let backends = self.mode.backends();
        let found: Vec<String> = (self.api.show_stat().await?.into_iter())
            .filter(|row| row.server == server && backends.contains(&row.proxy.as_str()))
            .map(|row| row.status)
            .collect();
        if found.len() != backends.len() {
            bail!("slot {slot} is not in `show stat`");
        }
        Ok(found)
    }

    /// Waits until `slot` is in a state accepted by `accept` in every
    /// backend; returns how long that took.
    ///
    /// # Errors
    /// If it does not happen within `timeout`.
    pub async fn wait_status(
        &self,
        slot: usize,
        what: &str,
        accept: impl Fn(&str) -> bool,
        timeout: Duration,
    ) -> anyhow::Result<Duration> {
        let started = Instant::now();
        loop {
            let status = self.status(slot).await?;
            if status.iter().all(|s| accept(s)) {
                return Ok(started.elapsed());
            }
            if started.elapsed() > timeout {
                bail!("slot {slot} not {what} within {timeout:?}: {status:?}");
            }
            tokio::time::sleep(STATUS_POLL).await;
        }
    }

    /// Stops HAProxy (SIGKILL: it holds no state worth keeping).
    pub async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
    }
}

/// The slot of the server that answered, from the `x-served-by` header the
/// balancer adds to every response (`s3` → 3) — its own errors too, which
/// name the server it gave the request to (a 502 when that server died
/// with it), or none (`<NOSRV>`).
pub fn served_by(value: &str) -> Option<u8> {
    value.strip_prefix('s')?.parse().ok()
}

/// `UP`, including `UP 1/2` (up, one check failed).
pub fn is_up(status: &str) -> bool {
    status.starts_with("UP")
}

/// `DOWN` or `MAINT`: no new requests go there.
pub fn is_out(status: &str) -> bool {
    status.starts_with("DOWN") || status.starts_with("MAINT")
}

fn render_config(
    checks: Checks,
    slots: usize,
    socket: &Path,
    http1: SocketAddr,
    http2: SocketAddr,
) -> String {
    let inter = checks.inter.as_millis();
    let (fall, rise, retries) = (checks.fall, checks.rise, checks.retries);
    let redispatch = if checks.redispatch {
        "\x20   option redispatch 1\n\x20   retry-on conn-failure\n"
    } else {
        ""
    };
    let socket = socket.display();
    let backend = |name: &str, extra: &str| {
        format!(
            "backend {name}\n\
             \x20   balance roundrobin\n\
             \x20   option httpchk\n\
             \x20   http-check send meth GET uri /readyz ver HTTP/1.1 hdr Host lb\n\
             \x20   http-check expect status 200\n\
             \x20   http-after-response set-header x-served-by %s\n\
             \x20   server-template s 1-{slots} 127.0.0.1:9 disabled check{extra}\n"
        )
    };
    format!(
        "# Generated by load/src/haproxy.rs for one rollout run.\n\
         global\n\
         \x20   maxconn 8000\n\
         \x20   stats socket {socket} mode 600 level admin\n\
         \x20   stats timeout 10s\n\
         \x20   log stdout format raw local0\n\
         \n\
         defaults\n\
         \x20   mode http\n\
         \x20   log global\n\
         \x20   option httplog\n\
         \x20   option dontlog-normal\n\
         \x20   option http-keep-alive\n\
         \x20   retries {retries}\n\
         {redispatch}\
         \x20   timeout connect 1s\n\
         \x20   timeout client 30s\n\
         \x20   timeout server 30s\n\
         \x20   timeout http-request 10s\n\
         \x20   timeout http-keep-alive 10s\n\
         \x20   timeout check 1s\n\
         \x20   default-server inter {inter}ms fastinter {inter}ms downinter {inter}ms fall {fall} rise {rise}\n\
         \n\
         frontend fe_h1\n\
         \x20   bind {http1}\n\
         \x20   default_backend be_h1\n\
         \n\
         frontend fe_h2\n\
         \x20   bind {http2} proto h2\n\
         \x20   default_backend be_h2\n\
         \n\
         {}\n\
         {}",
        backend("be_h1", ""),
        backend("be_h2", " proto h2 check-proto h1"),
    )
}

/// The configuration of [`Mode::Tcp`]: one frontend passing connections
/// whole, round-robin (IPVS's default; kube-proxy's iptables mode picks at
/// random, the same on average), to the slots of one backend, whose health
/// checks are HTTP `GET /readyz` as in [`Mode::Http`]. No `option
/// redispatch` retry on a refused connection: an L4 Service does not retry.
fn render_tcp_config(checks: Checks, slots: usize, socket: &Path, frontend: SocketAddr) -> String {
    let inter = checks.inter.as_millis();
    let (fall, rise, retries) = (checks.fall, checks.rise, checks.retries);
    let redispatch = if checks.redispatch {
        "\x20   option redispatch 1\n"
    } else {
        ""
    };
    let socket = socket.display();
    format!(
        "# Generated by load/src/haproxy.rs for one run, L4.\n\
         global\n\
         \x20   maxconn 8000\n\
         \x20   stats socket {socket} mode 600 level admin\n\
         \x20   stats timeout 10s\n\
         \x20   log stdout format raw local0\n\
         \n\
         defaults\n\
         \x20   mode tcp\n\
         \x20   log global\n\
         \x20   option tcplog\n\
         \x20   option dontlognull\n\
         \x20   option dontlog-normal\n\
         \x20   maxconn 8000\n\
         \x20   retries {retries}\n\
         {redispatch}\
         \x20   timeout connect 1s\n\
         \x20   timeout client 60s\n\
         \x20   timeout server 60s\n\
         \x20   timeout check 1s\n\
         \x20   default-server inter {inter}ms fastinter {inter}ms downinter {inter}ms fall {fall} rise {rise}\n\
         \n\
         frontend fe_tcp\n\
         \x20   bind {frontend}\n\
         \x20   default_backend be_tcp\n\
         \n\
         backend be_tcp\n\
         \x20   balance roundrobin\n\
         \x20   option httpchk\n\
         \x20   http-check send meth GET uri /readyz ver HTTP/1.1 hdr Host lb\n\
         \x20   http-check expect status 200\n\
         \x20   server-template s 1-{slots} 127.0.0.1:9 disabled check\n"
    )
}

/// A loopback port that was free a moment ago.
///
/// # Errors
/// If no port can be bound.
pub fn free_port() -> anyhow::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("no free loopback port")?;
    Ok(listener.local_addr()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tcp_mode_passes_connections_whole_and_checks_readiness_over_http() {
        let checks = Checks {
            inter: Duration::from_millis(200),
            fall: 2,
            rise: 1,
            retries: 0,
            redispatch: false,
        };
        let addr: SocketAddr = "127.0.0.1:8443".parse().expect("an address");
        let config = render_tcp_config(checks, 4, Path::new("/tmp/h.sock"), addr);
        for line in [
            "mode tcp",
            "bind 127.0.0.1:8443",
            "balance roundrobin",
            "http-check send meth GET uri /readyz",
            "server-template s 1-4 127.0.0.1:9 disabled check",
            "inter 200ms",
        ] {
            assert!(config.contains(line), "{line} missing from\n{config}");
        }
        assert!(!config.contains("mode http") && !config.contains("retry-on"));
        assert_eq!(Mode::Tcp.backends(), &TCP_BACKENDS);
    }
}
