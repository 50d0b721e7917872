//! The service itself, wired to the lifecycle: one JSON route, one
//! background worker, one finalizer, and requests per route kept through
//! the write-behind component (`counts`). This is the part you replace.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::middleware;
use axum::routing::{get, post};
use axum::{Json, Router};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};

use lameduck_handoff::Listeners;
use lameduck_lifecycle::{Lifecycle, Report, LOG_TARGET};
use lameduck_service::listen::{BindError, Listening};
use lameduck_service::metrics::LifecycleCollector;
use lameduck_service::{http, ServeArgs, Service, Start};
use lameduck_writebehind::{OpenError, ReplayError};

use crate::config::ServerConfig;
use crate::counts::{self, Counts, CountsFile};

/// How often the background worker logs that the service is alive.
const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(30);

/// How long the finalizer may take.
const FAREWELL_BUDGET: Duration = Duration::from_secs(1);

/// How long the final flush of the request counts, after the last request,
/// may retry `counts.json` before it spills them to the state directory
/// (a local file takes milliseconds). Part of the shutdown budget.
const FINAL_FLUSH_BUDGET: Duration = Duration::from_secs(2);

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StartupError {
    /// A listen address could not be bound.
    #[error(transparent)]
    Bind(#[from] BindError),
    /// The state directory cannot take a file.
    #[error("cannot keep state")]
    State(#[from] OpenError),
    /// What an earlier run left in the state directory could not be
    /// applied: serving without it would count from less than was counted.
    #[error("cannot apply the state an earlier run left")]
    Replay(#[from] ReplayError),
}

/// A built service: listeners bound, workers running, routers ready.
#[derive(Debug)]
pub(crate) struct App {
    listening: Listening,
    router: Router,
    admin_router: Router,
    lifecycle: Lifecycle,
    config: ServerConfig,
}

/// What the template's `main` ([`lameduck_service::main`]) runs.
impl Service for App {
    type Config = ServerConfig;
    type Error = StartupError;

    /// Binds the listeners (or serves the `inherited` ones, passed down by
    /// systemd or a predecessor), starts the worker, registers the
    /// finalizer and builds the routers.
    async fn build(start: Start<ServerConfig>) -> Result<App, StartupError> {
        let Start {
            config,
            mut lifecycle,
            inherited,
        } = start;
        let mut registry = Registry::with_prefix(env!("CARGO_CRATE_NAME"));
        LifecycleCollector::register(lifecycle.watch().metrics(), &mut registry);
        let greetings = Counter::<u64>::default();
        registry.register("greetings", "Greetings sent", greetings.clone());
        let mut state = lameduck_writebehind::Config::new("counts", &config.state_dir);
        state.durability = config.state_durability.into();
        state.final_flush_budget = FINAL_FLUSH_BUDGET;
        let counts = Counts::open(state)?;
        counts.register(&mut registry);

        let listening = Listening::bind(&config.serve, inherited).await?;

        let workers = lifecycle.workers();
        // Cancelled when the drain starts.
        workers.spawn_background("heartbeat", {
            let greetings = greetings.clone();
            move |token| async move {
                let mut ticks = tokio::time::interval(HEARTBEAT_INTERVAL);
                ticks.tick().await;
                while token.run_until_cancelled(ticks.tick()).await.is_some() {
                    tracing::info!(greetings = greetings.get(), "still serving");
                }
                Ok(())
            }
        });
        // Runs after the last request, within its budget.
        workers.on_shutdown("farewell", FAREWELL_BUDGET, {
            let greetings = greetings.clone();
            move || async move {
                tracing::info!(target: LOG_TARGET, greetings = greetings.get(), "goodbye");
                Ok(())
            }
        });

        // Applies what earlier runs left (the journal of a killed process,
        // spill files) before serving; then the flusher, and the final
        // flush after the last request (it runs before the farewell).
        let file = CountsFile(config.state_dir.clone());
        counts.attach(workers, file.clone()).await?;

        let api = Router::new()
            .route("/api/greetings", post(greet))
            .with_state(greetings)
            .route("/api/counts", get(counts::show))
            .with_state(file)
            .route_layer(middleware::from_fn_with_state(counts, counts::count));
        let router = http::public(api, lifecycle.watch().clone());
        let admin_router = http::admin(lifecycle.watch().clone(), Arc::new(registry));
        Ok(App {
            listening,
            router,
            admin_router,
            lifecycle,
            config,
        })
    }

    fn serve_args(config: &ServerConfig) -> &ServeArgs {
        &config.serve
    }

    /// With traces on, the finalizers include their flush (registered
    /// before `build`), so it is counted in `workers().budget()`.
    fn shutdown_budget(&mut self) -> Duration {
        self.config.serve.shutdown_budget(self.lifecycle.workers())
    }

    /// Serves until shutdown, drains, stops the worker and runs the
    /// finalizer.
    async fn run(self) -> Report {
        let Listening {
            public,
            admin,
            files,
        } = self.listening;
        let report = self
            .lifecycle
            .serve(public, self.router)
            .config(self.config.serve.config())
            .admin(admin, self.admin_router)
            .run()
            .await;
        files.remove_after(&report);
        report
    }
}

#[derive(Debug, Deserialize)]
struct GreetingRequest {
    name: String,
}

#[derive(Debug, Serialize)]
struct Greeting {
    greeting: String,
    number: u64,
}

/// `POST /api/greetings` `{"name": "Ada"}` → `{"greeting": "hello, Ada",
/// "number": 1}`.
async fn greet(
    State(greetings): State<Counter>,
    Json(request): Json<GreetingRequest>,
) -> Json<Greeting> {
    let number = greetings.inc() + 1;
    Json(Greeting {
        greeting: format!("hello, {}", request.name),
        number,
    })
}
