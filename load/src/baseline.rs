//! The servers lameduck is measured against. Each binary in `src/bin/` is a
//! thin `main` around one of these.
//!
//! - [`minimal_axum`]: what a user writes from axum's README, and the
//!   baseline of the headline ratios: the routes the benchmarks use
//!   (`/healthz`, `/readyz`, `POST /api/links`, `GET /{code}`) over an
//!   in-memory map, no middleware, on
//!   `axum::serve(listener, router).with_graceful_shutdown(sigterm)`.
//! - [`axum_stack`]: the same app with the layers users copy from the axum
//!   and tower-http examples: `TraceLayer` with a `tracing_subscriber` fmt
//!   at `info`, `x-request-id` set (UUID) and propagated, `TimeoutLayer`,
//!   and a Prometheus counter and histogram by route and status with
//!   `/metrics`.
//! - [`plain_axum`]: lameduck's own app (same router, same middleware, same
//!   database code) served the way most axum services are:
//!   `axum::serve(listener, router).with_graceful_shutdown(sigterm)`. No
//!   readiness flip, no lame-duck period, no deadline.
//! - [`bare_hyper`]: a hyper-util server answering `GET /healthz` with
//!   200 `ok`: the floor of what serving HTTP costs. At SIGTERM it either
//!   exits at once, leaving its connections to the kernel, or, with
//!   [`OnSigterm::Graceful`], follows hyper-util's own recipe
//!   (`GracefulShutdown`): every connection is told to close, and the
//!   process exits when the last one has.
//! - [`redirect_uncounted`]: lameduck itself with hit counting switched off
//!   (`HitCounter::set_recording(false)`), to price the counting.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::extract::{MatchedPath, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt as _;
use axum::{Extension, Json, Router};
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use lameduck::config::{Cli, Command, ServerConfig};
use lameduck::http::stack::Steps;
use lameduck::lifecycle::{Lifecycle, RequestScope};
use lameduck::{telemetry, App};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::signal::unix::{signal as unix_signal, SignalKind};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;

/// Parses lameduck's own command line (`NAME server --listen …`), so the
/// harness starts every flavor with the same arguments.
///
/// # Errors
/// Exit code 2 with clap's message for a bad command line.
pub fn server_config() -> Result<ServerConfig, ExitCode> {
    use clap::Parser;
    match Cli::try_parse() {
        Ok(Cli {
            command: Command::Server(config),
        }) => Ok(config),
        Ok(_) => {
            eprintln!("only the `server` subcommand is supported");
            Err(ExitCode::from(2))
        }
        Err(error) => {
            let _ = error.print();
            Err(ExitCode::from(if error.use_stderr() { 2 } else { 0 }))
        }
    }
}

/// Runs `serve` on a multi-threaded runtime and maps its error to exit 1.
pub fn run<F>(serve: F) -> ExitCode
where
    F: std::future::Future<Output = anyhow::Result<()>>,
{
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(serve);
    runtime.shutdown_background();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn sigterm() {
    match unix_signal(SignalKind::terminate()) {
        Ok(mut terminate) => {
            terminate.recv().await;
        }
        Err(error) => {
            tracing::error!(%error, "cannot install the SIGTERM handler");
            std::future::pending::<()>().await;
        }
    }
}

/// lameduck's app on `axum::serve(..).with_graceful_shutdown(sigterm)`.
/// After serving, the app's workers stop and its finalizers run (the final
/// hit flush, closing the pool), so hits are not lost for lack of a flush:
/// what the baseline lacks is only the lifecycle.
///
/// # Errors
/// If the app cannot be built.
pub async fn plain_axum(config: ServerConfig) -> anyhow::Result<()> {
    telemetry::init(config.serve.log_format, None);
    // The shutdown handle is never triggered: readiness stays 200 until the
    // process is gone, as in a service that has no lame-duck logic.
    let parts = App::build(config, Lifecycle::new())
        .await
        .context("startup failed")?
        .into_parts();
    let addr = parts.listener.local_addr()?;
    tracing::info!("listening on http://{addr}");
    let router = parts.router.layer(Extension(RequestScope::detached()));
    axum::serve(parts.listener, router)
        .with_graceful_shutdown(sigterm())
        .await
        .context("axum::serve failed")?;
    let (_shutdown, workers) = parts.lifecycle.into_parts();
    let stop = workers.stop().await;
    tracing::info!(stop = %stop.summary(), "drained; workers stopped");
    Ok(())
}

/// What [`bare_hyper`] does at SIGTERM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnSigterm {
    /// Return at once: the kernel closes every connection at exit.
    Exit,
    /// Stop accepting, `graceful_shutdown()` every connection through
    /// hyper-util's `GracefulShutdown`, and return when all have closed.
    Graceful,
}

/// A hyper-util server on `listen` answering `GET /healthz` with 200 `ok`
/// (404 otherwise), until SIGTERM; then as `on_sigterm` says.
///
/// # Errors
/// If it cannot bind.
pub async fn bare_hyper(listen: SocketAddr, on_sigterm: OnSigterm) -> anyhow::Result<()> {
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    println!("listening on http://{}", listener.local_addr()?);
    let builder = auto::Builder::new(TokioExecutor::new());
    let service = hyper::service::service_fn(|request: Request<Incoming>| async move {
        let ok = request.method() == Method::GET && request.uri().path() == "/healthz";
        let response = if ok {
            hyper::Response::new(Full::new(Bytes::from_static(b"ok")))
        } else {
            let mut response = hyper::Response::new(Full::new(Bytes::new()));
            *response.status_mut() = hyper::StatusCode::NOT_FOUND;
            response
        };
        Ok::<_, Infallible>(response)
    });
    // Only the graceful flavor watches its connections: the one that exits
    // at once stays the bare floor of serving.
    let graceful = (on_sigterm == OnSigterm::Graceful).then(GracefulShutdown::new);
    let terminate = sigterm();
    tokio::pin!(terminate);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                let builder = builder.clone();
                let watcher = graceful.as_ref().map(GracefulShutdown::watcher);
                tokio::spawn(async move {
                    let connection = builder.serve_connection(TokioIo::new(stream), service);
                    let _ = match watcher {
                        Some(watcher) => watcher.watch(connection).await,
                        None => connection.await,
                    };
                });
            }
            () = &mut terminate => break,
        }
    }
    if let Some(graceful) = graceful {
        drop(listener);
        graceful.shutdown().await;
    }
    Ok(())
}

/// lameduck itself, with hit counting switched off: the redirect path
/// minus `hits.record`, everything else identical.
///
/// # Errors
/// If the app cannot be built.
pub async fn redirect_uncounted(config: ServerConfig) -> anyhow::Result<()> {
    run_app(config, |app| app.hits().set_recording(false)).await
}

/// `lameduck server` as its `main` runs it, with `adjust` applied to the
/// built app before it serves.
async fn run_app(config: ServerConfig, adjust: impl FnOnce(&App)) -> anyhow::Result<()> {
    telemetry::init(config.serve.log_format, None);
    let lifecycle = Lifecycle::new()
        .with_signals()
        .context("cannot install signal handlers")?;
    let app = App::build(config, lifecycle)
        .await
        .context("startup failed")?;
    adjust(&app);
    let report = app.run().await;
    tracing::info!(outcome = ?report.drain.outcome, stop = %report.stop.summary(), "drained; workers stopped");
    Ok(())
}

/// The environment variable naming the step `lameduck-without` switches
/// off.
pub const WITHOUT_ENV: &str = "LOAD_WITHOUT";

/// The steps of lameduck's middleware `lameduck-without` can switch off,
/// by the names `LOAD_WITHOUT` takes.
pub const STEPS: [&str; 7] = [
    "request-id",
    "span",
    "metrics",
    "host-check",
    "json-errors",
    "catch-panic",
    "timeout",
];

/// The name `LOAD_WITHOUT` takes for every step at once: what is left is
/// the stack's own service and future, axum's route level for its layer,
/// and the lifecycle.
pub const EVERY_STEP: &str = "every-step";

/// Every step but `name` ([`STEPS`]), or none for [`EVERY_STEP`].
///
/// # Errors
/// If `name` is neither.
pub fn steps_without(name: &str) -> anyhow::Result<Steps> {
    if name == EVERY_STEP {
        return Ok(Steps::NONE);
    }
    let mut steps = Steps::ALL;
    let step = match name {
        "request-id" => &mut steps.request_id,
        "span" => &mut steps.span,
        "metrics" => &mut steps.metrics,
        "host-check" => &mut steps.host_check,
        "json-errors" => &mut steps.json_errors,
        "catch-panic" => &mut steps.catch_panic,
        "timeout" => &mut steps.timeout,
        other => anyhow::bail!(
            "no step {other:?}; the steps: {}, or {EVERY_STEP}",
            STEPS.join(", ")
        ),
    };
    *step = false;
    Ok(steps)
}

/// lameduck with the step named by `LOAD_WITHOUT` switched off in its
/// middleware; everything else as `lameduck server`.
///
/// # Errors
/// If the step is unknown or the app cannot start.
pub async fn lameduck_without(config: ServerConfig) -> anyhow::Result<()> {
    let name = std::env::var(WITHOUT_ENV).with_context(|| format!("{WITHOUT_ENV} is not set"))?;
    lameduck::http::stack::set_steps_for_benchmark(steps_without(&name)?);
    run_app(config, |_| {}).await
}

/// The listening address in a command line: `--listen ADDR` or
/// `--listen=ADDR`, `127.0.0.1:0` without one. Everything else (`server`,
/// `--data-dir …`, `--max-connections …`, the `--admin-listen` the harness
/// adds) is ignored, so [`minimal_axum`] and [`axum_stack`] take the
/// command line the harness gives lameduck.
///
/// # Errors
/// A message if `--listen` has no value or a bad one.
pub fn listen_arg(args: impl IntoIterator<Item = String>) -> Result<SocketAddr, String> {
    let mut listen = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let value = if arg == "--listen" {
            args.next().ok_or("--listen needs an address")?
        } else if let Some(value) = arg.strip_prefix("--listen=") {
            value.to_owned()
        } else {
            continue;
        };
        listen = value
            .parse()
            .map_err(|error| format!("bad --listen address {value:?}: {error}"))?;
    }
    Ok(listen)
}

/// The minimal app's links: code → URL, in memory.
type Links = Arc<RwLock<HashMap<String, String>>>;

/// The body of `POST /api/links`, as lameduck takes it.
#[derive(Deserialize)]
struct NewLink {
    url: String,
    code: Option<String>,
}

/// The answer to `POST /api/links`, as lameduck gives it.
#[derive(Serialize)]
struct LinkCreated {
    code: String,
    url: String,
    created_at: String,
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz() -> StatusCode {
    StatusCode::OK
}

async fn create_link(
    State(links): State<Links>,
    Json(new): Json<NewLink>,
) -> Result<(StatusCode, Json<LinkCreated>), StatusCode> {
    let code = new
        .code
        .unwrap_or_else(|| format!("{:08x}", rand::random::<u32>()));
    {
        let mut links = links.write().unwrap_or_else(PoisonError::into_inner);
        if links.contains_key(&code) {
            return Err(StatusCode::CONFLICT);
        }
        links.insert(code.clone(), new.url.clone());
    }
    let created = LinkCreated {
        code,
        url: new.url,
        created_at: chrono::Utc::now().to_rfc3339(),
    };
    Ok((StatusCode::CREATED, Json(created)))
}

async fn redirect(
    State(links): State<Links>,
    Path(code): Path<String>,
) -> Result<Redirect, StatusCode> {
    let links = links.read().unwrap_or_else(PoisonError::into_inner);
    let url = links.get(&code).ok_or(StatusCode::NOT_FOUND)?;
    Ok(Redirect::temporary(url))
}

/// The minimal app's router: `GET /healthz` (200 `ok`), `GET /readyz`
/// (200), `POST /api/links` (201 with `{"code","url","created_at"}`, 409
/// for a code taken), `GET /{code}` (307 to the URL, 404 if unknown). No
/// middleware.
pub fn minimal_router() -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/api/links", post(create_link))
        .route("/{code}", get(redirect))
        .with_state(Links::default())
}

/// Serves `router` on `listen` with
/// `axum::serve(..).with_graceful_shutdown(sigterm)`, after printing
/// `listening on http://ADDR`.
async fn serve_until_sigterm(listen: SocketAddr, router: Router) -> anyhow::Result<()> {
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    println!("listening on http://{}", listener.local_addr()?);
    if std::env::var_os(NODELAY_ENV).is_some() {
        // As axum's documentation sets it, and as lameduck does.
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        axum::serve(listener, router)
            .with_graceful_shutdown(sigterm())
            .await
            .context("axum::serve failed")
    } else {
        axum::serve(listener, router)
            .with_graceful_shutdown(sigterm())
            .await
            .context("axum::serve failed")
    }
}

/// Set (to anything) in the environment of `minimal-axum` or `axum-stack`
/// to have `TCP_NODELAY` set on every connection, as lameduck does.
pub const NODELAY_ENV: &str = "LOAD_TCP_NODELAY";

/// The minimal axum app ([`minimal_router`]) on `listen` until SIGTERM,
/// then axum's graceful shutdown.
///
/// # Errors
/// If it cannot bind.
pub async fn minimal_axum(listen: SocketAddr) -> anyhow::Result<()> {
    serve_until_sigterm(listen, minimal_router()).await
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: String,
    route: String,
    status: u16,
}

/// A request counter and a latency histogram by method, route and status,
/// the way a user adds Prometheus to an axum app.
#[derive(Clone)]
struct HttpMetrics {
    requests: Family<RequestLabels, Counter>,
    duration: Family<RequestLabels, Histogram>,
    registry: Arc<Registry>,
}

impl HttpMetrics {
    fn new() -> HttpMetrics {
        let requests = Family::<RequestLabels, Counter>::default();
        let duration = Family::<RequestLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0005, 2.0, 16))
        });
        let mut registry = Registry::default();
        registry.register("http_requests", "HTTP requests", requests.clone());
        registry.register(
            "http_request_duration_seconds",
            "HTTP request latency",
            duration.clone(),
        );
        HttpMetrics {
            requests,
            duration,
            registry: Arc::new(registry),
        }
    }
}

/// `from_fn` middleware: counts and times every request by route and status.
async fn track_metrics(
    State(metrics): State<HttpMetrics>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let started = Instant::now();
    let method = request.method().to_string();
    let route = request.extensions().get::<MatchedPath>().map_or_else(
        || request.uri().path().to_owned(),
        |path| path.as_str().to_owned(),
    );
    let response = next.run(request).await;
    let labels = RequestLabels {
        method,
        route,
        status: response.status().as_u16(),
    };
    metrics.requests.get_or_create(&labels).inc();
    metrics
        .duration
        .get_or_create(&labels)
        .observe(started.elapsed().as_secs_f64());
    response
}

async fn render_metrics(State(metrics): State<HttpMetrics>) -> Response {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &metrics.registry) {
        Ok(()) => (
            [(
                axum::http::header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// [`minimal_router`] with the usual tower-http stack: a Prometheus
/// `from_fn` middleware on the routes (and `/metrics`), then
/// `SetRequestIdLayer::x_request_id(MakeRequestUuid)`,
/// `TraceLayer::new_for_http()`, `TimeoutLayer` (10 s, 408) and
/// `PropagateRequestIdLayer::x_request_id()`, outermost first.
pub fn stack_router() -> Router {
    let metrics = HttpMetrics::new();
    let metrics_route = Router::new()
        .route("/metrics", get(render_metrics))
        .with_state(metrics.clone());
    minimal_router()
        .merge(metrics_route)
        .route_layer(axum::middleware::from_fn_with_state(metrics, track_metrics))
        .layer(
            tower::ServiceBuilder::new()
                .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
                .layer(TraceLayer::new_for_http())
                .layer(TimeoutLayer::with_status_code(
                    StatusCode::REQUEST_TIMEOUT,
                    Duration::from_secs(10),
                ))
                .layer(PropagateRequestIdLayer::x_request_id()),
        )
}

/// [`stack_router`] on `listen` until SIGTERM, with a `tracing_subscriber`
/// fmt subscriber at `info` (or what `RUST_LOG` says).
///
/// # Errors
/// If it cannot bind.
pub async fn axum_stack(listen: SocketAddr) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    serve_until_sigterm(listen, stack_router()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn a_step_is_switched_off_alone_and_every_step_at_once() {
        // In the order of `STEPS`.
        let on = |steps: Steps| {
            [
                steps.request_id,
                steps.span,
                steps.metrics,
                steps.host_check,
                steps.json_errors,
                steps.catch_panic,
                steps.timeout,
            ]
        };
        for (index, name) in STEPS.iter().enumerate() {
            let steps = on(steps_without(name).expect("a step"));
            let off: Vec<usize> = (0..steps.len()).filter(|&i| !steps[i]).collect();
            assert_eq!(off, [index], "{name}");
        }
        let every = steps_without(EVERY_STEP).expect("every step");
        assert_eq!(every, Steps::NONE);
        assert_eq!(on(every), [false; 7]);
        assert!(steps_without("tracing").is_err());
    }

    #[test]
    fn the_listen_address_is_taken_and_the_rest_ignored() {
        let line = "server --listen 127.0.0.1:4242 --log-format text --data-dir /tmp/x \
                    --max-connections 11000 --admin-listen 127.0.0.1:0";
        assert_eq!(
            listen_arg(args(line)),
            Ok(SocketAddr::from(([127, 0, 0, 1], 4242)))
        );
        assert_eq!(
            listen_arg(args("server --listen=127.0.0.1:4243")),
            Ok(SocketAddr::from(([127, 0, 0, 1], 4243)))
        );
        assert_eq!(
            listen_arg(args("server")),
            Ok(SocketAddr::from(([127, 0, 0, 1], 0)))
        );
        assert!(listen_arg(args("server --listen")).is_err());
        assert!(listen_arg(args("server --listen nowhere")).is_err());
    }

    async fn call(router: &Router, request: axum::extract::Request) -> Response {
        use tower::ServiceExt;
        match router.clone().oneshot(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        }
    }

    fn request(method: &str, uri: &str, body: &str) -> axum::extract::Request {
        axum::http::Request::builder()
            .method(method)
            .uri(uri)
            .header("content-type", "application/json")
            .body(axum::body::Body::from(body.to_owned()))
            .unwrap_or_else(|_| unreachable!("a valid request"))
    }

    #[tokio::test]
    async fn both_apps_answer_the_routes_the_benchmarks_use() {
        for (router, stack) in [(minimal_router(), false), (stack_router(), true)] {
            let ok = call(&router, request("GET", "/healthz", "")).await;
            assert_eq!(ok.status(), StatusCode::OK);
            assert_eq!(
                ok.headers().contains_key("x-request-id"),
                stack,
                "request id only on the stack"
            );
            let ready = call(&router, request("GET", "/readyz", "")).await;
            assert_eq!(ready.status(), StatusCode::OK);
            let body = r#"{"url":"https://example.com/a","code":"bench-0"}"#;
            let created = call(&router, request("POST", "/api/links", body)).await;
            assert_eq!(created.status(), StatusCode::CREATED);
            let again = call(&router, request("POST", "/api/links", body)).await;
            assert_eq!(again.status(), StatusCode::CONFLICT);
            let found = call(&router, request("GET", "/bench-0", "")).await;
            assert_eq!(found.status(), StatusCode::TEMPORARY_REDIRECT);
            assert_eq!(
                found
                    .headers()
                    .get("location")
                    .and_then(|v| v.to_str().ok()),
                Some("https://example.com/a")
            );
            let missing = call(&router, request("GET", "/bench-1", "")).await;
            assert_eq!(missing.status(), StatusCode::NOT_FOUND);
        }
        let router = stack_router();
        let _ = call(&router, request("GET", "/healthz", "")).await;
        let metrics = call(&router, request("GET", "/metrics", "")).await;
        assert_eq!(metrics.status(), StatusCode::OK);
        let body = axum::body::to_bytes(metrics.into_body(), 1 << 20)
            .await
            .unwrap_or_default();
        let text = String::from_utf8_lossy(&body);
        assert!(text.contains(r#"route="/healthz",status="200""#), "{text}");
    }
}
