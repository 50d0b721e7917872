//! The HTTP surface: the router, health and readiness, metrics, and the
//! JSON error boundary.

pub mod admission;
pub mod body;
pub mod metrics;
pub mod middleware;
pub mod stack;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::{FromRef, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderValue, StatusCode};
use std::time::Duration;

use axum::handler::Handler;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use prometheus_client::registry::Registry;
use serde_json::json;

pub use crate::error::ApiError;
pub use admission::Admission;
pub use metrics::HttpMetrics;
pub use middleware::GuardMetrics;
pub use stack::Stack;

use crate::lifecycle::Watch;
use crate::links;
use crate::links::cache::LinkCache;
use crate::links::hits::HitCounter;
use crate::links::live::LiveHits;
use crate::storage::{DatabaseState, Storage};

/// Whether startup has finished its work (migrations, recovery); `/readyz`
/// stays 503 until it has.
#[derive(Clone, Debug, Default)]
pub struct Startup(Arc<AtomicBool>);

impl Startup {
    /// Marks startup complete.
    pub fn complete(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// `true` once startup is complete.
    pub fn is_complete(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// What readiness depends on besides the process's own timeline.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReadinessPolicy {
    /// `/readyz` answers 503 while the database is down
    /// (`--readiness-follows-database`; off by default: see
    /// [`crate::storage::health`] for why).
    pub follows_database: bool,
}

/// Everything the handlers share, behind one `Arc`: a request clones one
/// pointer, and a handler's `State<Part>` clones only the part it takes.
#[derive(Clone, Debug)]
pub struct AppState(Arc<StateParts>);

impl AppState {
    /// The state made of `parts`.
    pub fn new(parts: StateParts) -> AppState {
        AppState(Arc::new(parts))
    }
}

impl std::ops::Deref for AppState {
    type Target = StateParts;

    fn deref(&self) -> &StateParts {
        &self.0
    }
}

/// Each part is a handler's `State<Part>`.
macro_rules! parts_of_the_state {
    ($($field:ident: $part:ty),* $(,)?) => {
        $(impl FromRef<AppState> for $part {
            fn from_ref(state: &AppState) -> $part {
                state.0.$field.clone()
            }
        })*
    };
}

parts_of_the_state!(
    shutdown: Watch,
    startup: Startup,
    readiness: ReadinessPolicy,
    registry: Arc<Registry>,
    http_metrics: HttpMetrics,
    guard_metrics: GuardMetrics,
    storage: Storage,
    hits: HitCounter,
    links: LinkCache,
    live: LiveHits,
);

/// The parts of [`AppState`].
#[derive(Debug)]
pub struct StateParts {
    /// The shutdown timeline, watched only (readiness turns false when it
    /// starts).
    pub shutdown: Watch,
    /// Whether startup has finished.
    pub startup: Startup,
    /// What else readiness follows (nothing, by default).
    pub readiness: ReadinessPolicy,
    /// Every metric, for `/metrics`.
    pub registry: Arc<Registry>,
    /// Request counts and latencies.
    pub http_metrics: HttpMetrics,
    /// Requests shed, timed out, panicked.
    pub guard_metrics: GuardMetrics,
    /// The example's database.
    pub storage: Storage,
    /// The example's write-behind hit counters.
    pub hits: HitCounter,
    /// Code → URL, so redirects need no database round trip.
    pub links: LinkCache,
    /// Live hit counts for streams and websockets.
    pub live: LiveHits,
}

/// The limits the router enforces, each answering with a clear JSON error.
#[derive(Clone, Copy, Debug)]
pub struct HttpLimits {
    /// Largest request body, in bytes: 413 past it, at once and before any
    /// of the body is read if its size is announced.
    pub max_body_bytes: usize,
    /// Time to produce a response head (503 past it; the request's token
    /// fires).
    pub request_timeout: Duration,
    /// Requests the API routes handle at once (503 with `Retry-After` past
    /// it, at once; health, readiness and metrics are never shed). A request
    /// takes a slot only once its body is in: see [`body`].
    pub max_concurrent_requests: usize,
    /// Time to receive a request's whole body (408 past it), outside the
    /// concurrency limit: what a slow upload may hold a connection for.
    pub body_read_timeout: Duration,
}

/// The public router with its production middleware: the API, and
/// liveness and readiness for load balancers that probe the service port
/// (HAProxy, most cloud balancers). `/metrics` is not here: it is served
/// on the admin listener only ([`admin_router`]).
pub fn router(state: AppState, limits: HttpLimits) -> Router {
    with_middleware(probes(), links::routes(), state, limits)
}

/// The admin listener's router: liveness, readiness and metrics, with the
/// same middleware (request ids, metrics, JSON errors) but no shedding.
pub fn admin_router(state: AppState, limits: HttpLimits) -> Router {
    with_middleware(operational_routes(), Router::new(), state, limits)
}

/// Liveness and readiness: never shed, never body-limited.
pub fn probes() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
}

/// Liveness, readiness and metrics: never shed, never body-limited.
pub fn operational_routes() -> Router<AppState> {
    probes().route("/metrics", get(metrics::render))
}

/// One router of `open` routes and `api` routes, each route wrapped in the
/// [`Stack`] every request goes through (request id, span, metrics, the
/// Host check, JSON errors, panics, the request timeout; with traces on,
/// the `open` routes are left out of them); the API routes
/// also under [`Admission`] (an announced body over the limit refused
/// before it is read, the body read before the request takes a slot under
/// the shared concurrency limit, shedding past it). JSON 404 and 405
/// fallbacks, through the stack too.
///
/// Each route is layered once: axum boxes a route again, and clones the
/// box on every request, for each `Router::layer`, so the API routes get
/// the stack and admission as one layer.
///
/// The Host check applies to requests built in process too: a test that
/// sends an HTTP/1.1 request (the default version of `Request::builder`)
/// through this router must give it a `Host` header.
pub fn with_middleware(
    open: Router<AppState>,
    api: Router<AppState>,
    state: AppState,
    limits: HttpLimits,
) -> Router {
    let stack = Stack::new(
        state.http_metrics.clone(),
        state.guard_metrics.clone(),
        limits.request_timeout,
    );
    let admission = Admission::new(limits, state.guard_metrics.clone());
    let api = api.layer(
        tower::ServiceBuilder::new()
            .layer(stack.clone())
            .layer(admission),
    );
    // Probes and scrapes: in the logs, never in the traces.
    open.layer(stack.untraced())
        .merge(api)
        .fallback(not_found.layer(stack.for_handler()))
        .method_not_allowed_fallback(method_not_allowed.layer(stack.for_handler()))
        .with_state(state)
}

/// Liveness: 200 for as long as the process runs, draining included, with
/// the database's state (`up`, `busy`, `down`) beside it: a report, not a
/// verdict.
async fn healthz(State(storage): State<Storage>) -> impl IntoResponse {
    // One fixed body per state: written once, not serialized per probe.
    let body = match storage.state() {
        DatabaseState::Up => r#"{"status":"ok","database":"up"}"#,
        DatabaseState::Busy => r#"{"status":"ok","database":"busy"}"#,
        DatabaseState::Down => r#"{"status":"ok","database":"down"}"#,
    };
    (
        [(CONTENT_TYPE, HeaderValue::from_static("application/json"))],
        body,
    )
}

/// Readiness — should this replica get new traffic? — is about this
/// process only: 200 once startup is complete, 503 from the instant
/// shutdown starts, so load balancers stop sending new work. The
/// database's state is reported beside it and does not decide it (unless
/// [`ReadinessPolicy::follows_database`]): a database that is down is down
/// for every replica, and withdrawing them all would leave the balancer
/// nothing, not even what the replicas serve without it.
async fn readyz(
    State(shutdown): State<Watch>,
    State(startup): State<Startup>,
    State(policy): State<ReadinessPolicy>,
    State(storage): State<Storage>,
) -> impl IntoResponse {
    let database = storage.state();
    let (status, body) = if shutdown.is_triggered() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({ "status": "shutting down", "phase": shutdown.phase().as_str() }),
        )
    } else if !startup.is_complete() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({ "status": "starting" }),
        )
    } else if policy.follows_database && database == DatabaseState::Down {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({ "status": "database unavailable" }),
        )
    } else {
        (StatusCode::OK, json!({ "status": "ready" }))
    };
    let mut body = body;
    body["database"] = database.as_str().into();
    (status, Json(body))
}

async fn not_found() -> ApiError {
    ApiError::NotFound("no such route".to_owned())
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}
