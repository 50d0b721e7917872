//! The example's storage: one sqlx pool over SQLite (the zero-setup default)
//! or PostgreSQL (production), with portable SQL, so handlers never know
//! which one runs.
//!
//! Two lifecycle concerns live here:
//!
//! - **Cancellation**: a transaction that sees its request's token fire
//!   stops at the next safe point, asks PostgreSQL to cancel a statement
//!   that is blocked inside the server, rolls back explicitly and returns
//!   its connection to the pool clean.
//! - **The database misbehaving** ([`health`]): every call's error is
//!   sorted into what it says of the database — it answered, the pool is
//!   saturated ("busy", 503 with `Retry-After`), or it cannot be reached or
//!   is failing (counted by a circuit breaker that, once open, makes calls
//!   fail fast). None of it touches readiness.

pub mod health;

use std::future::Future;
use std::path::Path;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::SpanKind;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use sqlx::any::{AnyConnectOptions, AnyPoolOptions, AnyRow};
use sqlx::pool::PoolConnection;
use sqlx::Any;
use sqlx::{AnyConnection, AnyPool, ConnectOptions, Connection, Executor, Row};
use tokio_util::sync::CancellationToken;

use crate::telemetry::traces::ChildSpan;
use tracing::Instrument;

pub use health::{run_health_probe, DatabaseHealth, DatabaseState};

/// How long startup waits for the first database connection before it
/// gives up with a clear error.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a call waits for a pooled connection before it is answered
/// 503 "busy" with `Retry-After`: a full pool is back-pressure, not a
/// reason to queue forever, and not a sign that the database is down.
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

/// The `application_name` of the service's PostgreSQL sessions, so they can
/// be told apart in `pg_stat_activity`: the service's name.
pub const APPLICATION_NAME: &str = crate::NAME;

/// Appended to [`APPLICATION_NAME`] for the side connection that cancels
/// statements.
pub const CANCELLER_SUFFIX: &str = "-canceller";

/// Appended to [`APPLICATION_NAME`] for the health prober's own connection.
pub const PROBE_SUFFIX: &str = "-probe";

/// How long applied batch ids are remembered. A spill file replayed later
/// than this could count a batch twice; spills are replayed at the next
/// start, so a week is ample.
pub const BATCH_ID_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// Which database runs behind the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// Embedded SQLite file.
    Sqlite,
    /// PostgreSQL server.
    Postgres,
}

impl Backend {
    /// Its name in OpenTelemetry's conventions (`db.system.name`).
    pub fn system_name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgresql",
        }
    }
}

/// Errors at the storage boundary.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The URL names no supported database.
    #[error("unsupported database URL {0}: expected postgres:// or sqlite://")]
    UnsupportedUrl(String),
    /// The data directory could not be created.
    #[error("cannot create the data directory {path}")]
    DataDir {
        /// The directory.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The database did not accept a connection at startup.
    #[error("cannot connect to the database at {target}")]
    Connect {
        /// The URL with its password removed.
        target: String,
        /// Why.
        #[source]
        source: sqlx::Error,
    },
    /// The embedded migrations failed.
    #[error("database migrations failed")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A unique key is taken.
    #[error("already exists")]
    Conflict,
    /// The request's token fired; the work was rolled back.
    #[error("cancelled")]
    Cancelled,
    /// No pooled connection came within [`ACQUIRE_TIMEOUT`], or the database
    /// said it is saturated (too many connections, a locked SQLite file):
    /// retry later. Says nothing of the database's health.
    #[error("no database connection within the acquire timeout")]
    Busy,
    /// The database cannot be reached or is failing (refused, reset, I/O,
    /// TLS, protocol errors, a server shutting down): counted by the
    /// circuit breaker.
    #[error("database unavailable")]
    Unavailable(#[source] sqlx::Error),
    /// A commit was sent and its answer never came (the connection failed
    /// on the way back): the transaction may have committed or not.
    /// Counted by the circuit breaker like [`StorageError::Unavailable`].
    #[error("the database did not confirm the commit")]
    Unconfirmed(#[source] sqlx::Error),
    /// The circuit breaker is open: the call was not made, so that it fails
    /// fast rather than waits for a database that will not answer.
    #[error("database unavailable (circuit breaker open)")]
    Down,
    /// The pool is closed: the process is shutting down.
    #[error("the database pool is closed")]
    Closed,
    /// Any other database error: the database answered, with an error.
    #[error("database error")]
    Query(#[source] sqlx::Error),
}

/// What a call's outcome says about the database.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// It answered (with rows or with an error of the call's own).
    Answered,
    /// The pool or the database is saturated.
    Busy,
    /// It cannot be reached or is failing: counts toward "down".
    Failing,
    /// Nothing: the call never reached it (cancelled, refused by the
    /// breaker, the pool closed).
    Silent,
}

impl StorageError {
    /// A short, fixed name for the error's kind (a span's `error.type`).
    pub fn kind(&self) -> &'static str {
        match self {
            StorageError::UnsupportedUrl(_) => "unsupported_url",
            StorageError::DataDir { .. } => "data_dir",
            StorageError::Connect { .. } => "connect",
            StorageError::Migrate(_) => "migrate",
            StorageError::Conflict => "conflict",
            StorageError::Cancelled => "cancelled",
            StorageError::Busy => "busy",
            StorageError::Unavailable(_) => "unavailable",
            StorageError::Unconfirmed(_) => "unconfirmed",
            StorageError::Down => "down",
            StorageError::Closed => "closed",
            StorageError::Query(_) => "query",
        }
    }

    pub(crate) fn verdict(&self) -> Verdict {
        match self {
            StorageError::Conflict | StorageError::Query(_) => Verdict::Answered,
            StorageError::Busy => Verdict::Busy,
            StorageError::Unavailable(_) | StorageError::Unconfirmed(_) => Verdict::Failing,
            StorageError::Cancelled
            | StorageError::Down
            | StorageError::Closed
            | StorageError::UnsupportedUrl(_)
            | StorageError::DataDir { .. }
            | StorageError::Connect { .. }
            | StorageError::Migrate(_) => Verdict::Silent,
        }
    }
}

impl From<sqlx::Error> for StorageError {
    fn from(error: sqlx::Error) -> StorageError {
        if let sqlx::Error::Database(db) = &error {
            if db.is_unique_violation() {
                return StorageError::Conflict;
            }
        }
        match (&error, classify(&error)) {
            (sqlx::Error::PoolClosed, _) => StorageError::Closed,
            (_, Verdict::Busy) => StorageError::Busy,
            (_, Verdict::Failing) => StorageError::Unavailable(error),
            _ => StorageError::Query(error),
        }
    }
}

/// The error of a commit: the database's answer (a refusal) as any call's,
/// but a connection that failed once the `COMMIT` was sent leaves its
/// outcome unknown, [`StorageError::Unconfirmed`].
fn unconfirmed(error: sqlx::Error) -> StorageError {
    if matches!(error, sqlx::Error::Database(_)) {
        return error.into();
    }
    match StorageError::from(error) {
        StorageError::Unavailable(error) => StorageError::Unconfirmed(error),
        other => other,
    }
}

/// What a driver error says about the database. Only errors that say it
/// cannot be reached or is failing are [`Verdict::Failing`]. A pool that
/// gave no connection in time is [`Verdict::Busy`]: sqlx's pool keeps
/// retrying a refused connection until the acquire timeout, so a pool in
/// front of a dead database times out too, and the health prober, on its
/// own connection, tells the two apart.
pub(crate) fn classify(error: &sqlx::Error) -> Verdict {
    match error {
        sqlx::Error::PoolTimedOut => Verdict::Busy,
        sqlx::Error::PoolClosed => Verdict::Silent,
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed => Verdict::Failing,
        sqlx::Error::Database(db) => {
            let code = db.code();
            let code = code.as_deref().unwrap_or_default();
            if db
                .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                .is_some()
            {
                postgres_verdict(code)
            } else if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
                code.parse::<i32>()
                    .map_or(Verdict::Answered, sqlite_verdict)
            } else {
                Verdict::Answered
            }
        }
        _ => Verdict::Answered,
    }
}

/// A PostgreSQL SQLSTATE's verdict
/// (<https://www.postgresql.org/docs/current/errcodes-appendix.html>).
fn postgres_verdict(sqlstate: &str) -> Verdict {
    match sqlstate {
        // too_many_connections: the server is saturated, not down.
        "53300" => Verdict::Busy,
        // disk_full, out_of_memory; admin_shutdown, crash_shutdown,
        // cannot_connect_now (starting up or shutting down).
        "53100" | "53200" | "57P01" | "57P02" | "57P03" => Verdict::Failing,
        // connection_exception; system_error (I/O); internal_error
        // (corruption).
        _ if sqlstate.starts_with("08")
            || sqlstate.starts_with("58")
            || sqlstate.starts_with("XX") =>
        {
            Verdict::Failing
        }
        _ => Verdict::Answered,
    }
}

/// A SQLite result code's verdict (<https://www.sqlite.org/rescode.html>),
/// by its primary code (the low byte of an extended one).
fn sqlite_verdict(code: i32) -> Verdict {
    match code & 0xff {
        // SQLITE_BUSY, SQLITE_LOCKED: another writer holds the file.
        5 | 6 => Verdict::Busy,
        // SQLITE_IOERR, SQLITE_CORRUPT, SQLITE_FULL, SQLITE_CANTOPEN,
        // SQLITE_NOTADB.
        10 | 11 | 13 | 14 | 26 => Verdict::Failing,
        _ => Verdict::Answered,
    }
}

/// Counters of how pooled connections are treated.
#[derive(Clone, Debug, Default)]
pub struct StorageMetrics {
    connections_opened: Counter,
    connections_discarded: Counter,
    found_in_transaction: Counter,
    rollbacks_on_cancel: Counter,
    statements_cancelled: Counter,
}

impl StorageMetrics {
    /// Registers the series under `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "db_connections_opened",
            "Database connections opened by the pool",
            self.connections_opened.clone(),
        );
        registry.register(
            "db_connections_discarded",
            "Pooled connections closed because they could not be returned clean (should stay 0)",
            self.connections_discarded.clone(),
        );
        registry.register(
            "db_connections_in_transaction_at_release",
            "Connections found inside a transaction when returned to the pool (should stay 0)",
            self.found_in_transaction.clone(),
        );
        registry.register(
            "db_rollbacks_on_cancel",
            "Transactions rolled back because their request was cancelled",
            self.rollbacks_on_cancel.clone(),
        );
        registry.register(
            "db_statements_cancelled",
            "Statements cancelled inside PostgreSQL because their request was cancelled",
            self.statements_cancelled.clone(),
        );
    }

    /// Connections opened so far.
    pub fn connections_opened(&self) -> u64 {
        self.connections_opened.get()
    }

    /// Connections discarded so far.
    pub fn connections_discarded(&self) -> u64 {
        self.connections_discarded.get()
    }
}

/// A link as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredLink {
    /// Short code.
    pub code: String,
    /// Target URL.
    pub url: String,
    /// Persisted hit count.
    pub hits: i64,
    /// RFC 3339 creation time.
    pub created_at: String,
}

/// The pool, plus (on PostgreSQL) a one-connection side pool that cancels
/// blocked statements even when the main pool is exhausted, and what the
/// service knows of the database's health.
#[derive(Clone, Debug)]
pub struct Storage {
    // Cloned for every request that takes it as axum's `State`: each field
    // is a pointer or behind one, so a clone allocates nothing and counts up
    // five references.
    pool: AnyPool,
    backend: Backend,
    canceller: Option<AnyPool>,
    metrics: Arc<StorageMetrics>,
    /// Up, busy or down, and the circuit breaker that makes calls fail
    /// fast while it is down.
    health: DatabaseHealth,
    /// How the health prober opens its own connection, outside the pool.
    probe_options: Arc<AnyConnectOptions>,
}

// === impl Storage ===

impl Storage {
    /// Opens the database at `url` (default: SQLite at
    /// `data_dir/lameduck.db`), checks that it answers, and runs the
    /// embedded migrations.
    ///
    /// # Errors
    /// A [`StorageError`] naming what failed; it never contains the password.
    pub async fn open(
        url: Option<&str>,
        data_dir: &Path,
        max_connections: u32,
        metrics: StorageMetrics,
    ) -> Result<Storage, StorageError> {
        sqlx::any::install_default_drivers();
        let url = match url {
            Some(url) => url.to_owned(),
            None => {
                std::fs::create_dir_all(data_dir).map_err(|source| StorageError::DataDir {
                    path: data_dir.display().to_string(),
                    source,
                })?;
                format!(
                    "sqlite://{}?mode=rwc",
                    data_dir.join(format!("{}.db", crate::NAME)).display()
                )
            }
        };
        let backend = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Backend::Postgres
        } else if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else {
            return Err(StorageError::UnsupportedUrl(redact(&url)));
        };
        let target = redact(&url);
        let connect_error = |source| StorageError::Connect {
            target: target.clone(),
            source,
        };
        let parse = |url: &str| {
            url.parse::<AnyConnectOptions>()
                .map(|options| options.log_statements(tracing::log::LevelFilter::Debug))
                .map_err(connect_error)
        };
        let (options, canceller_options, probe_options) = match backend {
            Backend::Postgres => (
                parse(&with_application_name(&url, APPLICATION_NAME))?,
                Some(parse(&with_application_name(
                    &url,
                    &format!("{APPLICATION_NAME}{CANCELLER_SUFFIX}"),
                ))?),
                parse(&with_application_name(
                    &url,
                    &format!("{APPLICATION_NAME}{PROBE_SUFFIX}"),
                ))?,
            ),
            Backend::Sqlite => (parse(&url)?, None, parse(&url)?),
        };

        // One direct connection first: its error says what is wrong, where
        // a pool would only time out.
        tokio::time::timeout(CONNECT_TIMEOUT, AnyConnection::connect_with(&options))
            .await
            .map_err(|_elapsed| connect_error(sqlx::Error::PoolTimedOut))?
            .map_err(connect_error)?
            .close()
            .await
            .map_err(connect_error)?;

        let pool =
            pool_options(backend, max_connections, &metrics).connect_lazy_with(options.clone());
        let canceller = canceller_options.map(|options| {
            AnyPoolOptions::new()
                .max_connections(1)
                .min_connections(0)
                .acquire_timeout(ACQUIRE_TIMEOUT)
                .connect_lazy_with(options)
        });
        let storage = Storage {
            pool,
            backend,
            canceller,
            metrics: Arc::new(metrics),
            health: DatabaseHealth::default(),
            probe_options: Arc::new(probe_options),
        };
        storage.migrate().await?;
        Ok(storage)
    }

    async fn migrate(&self) -> Result<(), StorageError> {
        match self.backend {
            Backend::Postgres => {
                sqlx::migrate!("migrations/postgres")
                    .run(&self.pool)
                    .await?
            }
            Backend::Sqlite => sqlx::migrate!("migrations/sqlite").run(&self.pool).await?,
        }
        Ok(())
    }

    /// What the service knows of the database's health.
    pub fn health(&self) -> &DatabaseHealth {
        &self.health
    }

    /// Up, busy or down: reported by `/healthz` and `/readyz`, never
    /// deciding readiness.
    pub fn state(&self) -> DatabaseState {
        self.health.state()
    }

    /// A pooled connection, or [`StorageError::Down`] as soon as the breaker
    /// opens while this call waits for one: a call that began waiting just
    /// before an outage was noticed fails fast with the calls after it,
    /// instead of waiting out the acquire timeout for a connection that
    /// will not come. Giving up the wait is safe: no connection is held yet.
    async fn acquire(&self) -> Result<PoolConnection<Any>, StorageError> {
        let opened = self.health.breaker_opened();
        let mut opened = pin!(opened);
        opened.as_mut().enable();
        self.health.admit()?;
        tokio::select! {
            connection = self.pool.acquire() => Ok(connection?),
            () = opened => Err(self.health.failed_fast()),
        }
    }

    /// Runs `call` if the breaker allows it ([`StorageError::Down`] at once
    /// otherwise), and notes what its outcome says of the database. With
    /// traces on, the call is a span, `summary` its name.
    async fn call<T>(
        &self,
        summary: &'static str,
        call: impl Future<Output = Result<T, StorageError>>,
    ) -> Result<T, StorageError> {
        let mut span = self.span(summary);
        let unanswered = Unanswered(Some(|why: &str| {
            span.fail(StorageError::Cancelled.kind(), &why);
        }));
        let result = match self.health.admit() {
            Ok(()) => self.health.observe(call.await),
            Err(refused) => Err(refused),
        };
        unanswered.answered();
        if let Err(error) = &result {
            span.fail(error.kind(), error);
        }
        result
    }

    /// A database call's span, as OpenTelemetry's conventions describe it
    /// (`summary`: the operation and the table, `SELECT links`): a child of
    /// the request's server span, none with traces off or for a request
    /// not sampled.
    fn span(&self, summary: &'static str) -> ChildSpan {
        ChildSpan::start(summary, SpanKind::Client, |span| {
            span.text("db.system.name", self.backend.system_name());
            span.text("db.query.summary", summary);
        })
    }

    /// Which database runs.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The pool, for tests and tooling.
    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// The connection counters.
    pub fn metrics(&self) -> &StorageMetrics {
        &self.metrics
    }

    /// Closes the pool: waits for connections in use to come back, then
    /// closes them all.
    pub async fn close(&self) {
        self.pool.close().await;
        if let Some(canceller) = &self.canceller {
            canceller.close().await;
        }
    }

    /// Inserts `link` and its audit row in one transaction.
    ///
    /// `token` is checked at every safe point. If it fires while a statement
    /// runs inside PostgreSQL (blocked on a lock, say), the statement is
    /// cancelled server-side; either way the transaction is rolled back and
    /// the connection goes back to the pool clean.
    ///
    /// # Errors
    /// [`StorageError::Conflict`] if the code is taken,
    /// [`StorageError::Cancelled`] if the token fired, or the database error.
    ///
    /// # Cancel safety
    /// Not cancel safe: dropping the future mid-statement is exactly what
    /// leaves a connection inside a transaction. Run it to completion on a
    /// tracked task (`RequestScope::run`) and signal it through `token`.
    pub async fn insert_link(
        &self,
        link: &StoredLink,
        token: &CancellationToken,
    ) -> Result<(), StorageError> {
        self.call("INSERT links", self.insert_link_inner(link, token))
            .await
    }

    async fn insert_link_inner(
        &self,
        link: &StoredLink,
        token: &CancellationToken,
    ) -> Result<(), StorageError> {
        if token.is_cancelled() {
            return Err(StorageError::Cancelled);
        }
        let mut conn = self.acquire().await?;
        let backend_pid = self.backend_pid(&mut conn).await?;
        let mut tx = conn.begin_with(self.begin_statement()).await?;

        let statements = async {
            sqlx::query("INSERT INTO links (code, url, hits, created_at) VALUES ($1, $2, 0, $3)")
                .bind(&link.code)
                .bind(&link.url)
                .bind(&link.created_at)
                .execute(&mut *tx)
                .await?;
            if token.is_cancelled() {
                return Err(StorageError::Cancelled);
            }
            sqlx::query("INSERT INTO link_audit (code, action, at) VALUES ($1, 'created', $2)")
                .bind(&link.code)
                .bind(&link.created_at)
                .execute(&mut *tx)
                .await?;
            Ok(())
        };
        let result = self.cancel_on(token, backend_pid, statements).await;

        match result {
            Ok(()) if !token.is_cancelled() => tx.commit().await.map_err(unconfirmed),
            other => {
                tx.rollback().await?;
                if token.is_cancelled() {
                    self.metrics.rollbacks_on_cancel.inc();
                    return Err(StorageError::Cancelled);
                }
                other
            }
        }
    }

    /// Looks a link up by code.
    ///
    /// # Errors
    /// The database error.
    pub async fn find_link(&self, code: &str) -> Result<Option<StoredLink>, StorageError> {
        self.call("SELECT links", self.find_link_inner(code)).await
    }

    async fn find_link_inner(&self, code: &str) -> Result<Option<StoredLink>, StorageError> {
        let row = sqlx::query("SELECT code, url, hits, created_at FROM links WHERE code = $1")
            .bind(code)
            .fetch_optional(&mut *self.acquire().await?)
            .await?;
        row.as_ref()
            .map(stored_link)
            .transpose()
            .map_err(StorageError::from)
    }

    /// Looks a link up by code and, in the same statement (one snapshot),
    /// which of the hit batches `batch_ids` have been applied.
    ///
    /// # Errors
    /// The database error.
    pub async fn find_link_and_batches(
        &self,
        code: &str,
        batch_ids: &[&str],
    ) -> Result<Option<(StoredLink, Vec<bool>)>, StorageError> {
        if batch_ids.is_empty() {
            return Ok(self.find_link(code).await?.map(|link| (link, Vec::new())));
        }
        let find = self.find_link_and_batches_inner(code, batch_ids);
        self.call("SELECT links", find).await
    }

    async fn find_link_and_batches_inner(
        &self,
        code: &str,
        batch_ids: &[&str],
    ) -> Result<Option<(StoredLink, Vec<bool>)>, StorageError> {
        let mut sql = String::from("SELECT code, url, hits, created_at");
        for n in 0..batch_ids.len() {
            // Integers, not booleans: SQLite has no boolean type.
            sql.push_str(&format!(
                ", CAST(CASE WHEN EXISTS (SELECT 1 FROM hit_batches WHERE id = ${}) \
                 THEN 1 ELSE 0 END AS BIGINT)",
                n + 2
            ));
        }
        sql.push_str(" FROM links WHERE code = $1");
        let mut query = sqlx::query(&sql).bind(code);
        for id in batch_ids {
            query = query.bind(*id);
        }
        let Some(row) = query.fetch_optional(&mut *self.acquire().await?).await? else {
            return Ok(None);
        };
        let link = stored_link(&row)?;
        let landed = (0..batch_ids.len())
            .map(|n| row.try_get::<i64, _>(n + 4).map(|flag| flag != 0))
            .collect::<Result<Vec<bool>, _>>()?;
        Ok(Some((link, landed)))
    }

    /// Applies one batch of hit counts, exactly once: the batch id is
    /// recorded in the same transaction, so applying a batch that already
    /// landed (its commit unconfirmed, or replayed from a spill file) changes
    /// nothing. Returns `false` for such a repeat. Batch ids older than
    /// [`BATCH_ID_RETENTION`] are pruned on the way.
    ///
    /// The counts go in as one statement, whatever the number of links (a
    /// JSON object of code → hits; a code listed twice counts twice), so a
    /// batch costs the same few round trips on PostgreSQL for one link or a
    /// thousand. Batches applied at once — two replicas' flushes, a flush
    /// beside a spill replay — never deadlock: on PostgreSQL each locks its
    /// links in code order first, whatever the order of `hits`; on SQLite
    /// the transaction holds the database's one write lock.
    ///
    /// It is tried whether or not the circuit breaker is open (the flusher
    /// and the spill replay are how hits reach the database once it is
    /// back), and what it meets is noted like any other call's: a batch that
    /// lands closes the breaker at once, without waiting for the next probe.
    ///
    /// # Errors
    /// The database error; nothing was written.
    pub async fn apply_hits(
        &self,
        batch_id: &str,
        hits: &[(String, u64)],
    ) -> Result<bool, StorageError> {
        // A `tracing` span, not a [`ChildSpan`]: it belongs to the flush's
        // own span (the write-behind component's), a batch at a time.
        let span = lameduck_traces::traced_span!(
            "database",
            otel.name = "UPDATE links",
            otel.kind = "client",
            db.system.name = self.backend.system_name(),
            db.query.summary = "UPDATE links",
            error.type = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
        );
        let unanswered = Unanswered(Some(|why: &str| {
            crate::telemetry::traces::fail(&span, StorageError::Cancelled.kind(), &why);
        }));
        let applied = self
            .apply_hits_inner(batch_id, hits)
            .instrument(span.clone());
        let result = applied.await;
        unanswered.answered();
        if let Err(error) = &result {
            crate::telemetry::traces::fail(&span, error.kind(), error);
        }
        self.health.observe(result)
    }

    async fn apply_hits_inner(
        &self,
        batch_id: &str,
        hits: &[(String, u64)],
    ) -> Result<bool, StorageError> {
        let now = chrono::Utc::now();
        let mut tx = self.pool.begin_with(self.begin_statement()).await?;
        let recorded = sqlx::query(
            "INSERT INTO hit_batches (id, applied_at) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING",
        )
        .bind(batch_id)
        .bind(rfc3339(now))
        .execute(&mut *tx)
        .await?;
        if recorded.rows_affected() == 0 {
            tx.rollback().await?;
            return Ok(false);
        }
        let counts = counts_json(hits);
        if let Some(lock) = self.lock_links_statement() {
            sqlx::query(lock).bind(&counts).execute(&mut *tx).await?;
        }
        sqlx::query(self.add_hits_statement())
            .bind(&counts)
            .execute(&mut *tx)
            .await?;
        let horizon = now - chrono::Duration::from_std(BATCH_ID_RETENTION).unwrap_or_default();
        sqlx::query("DELETE FROM hit_batches WHERE applied_at < $1")
            .bind(rfc3339(horizon))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// The sum of every link's persisted hits.
    ///
    /// # Errors
    /// The database error.
    pub async fn total_hits(&self) -> Result<i64, StorageError> {
        Ok(
            sqlx::query_scalar("SELECT CAST(COALESCE(SUM(hits), 0) AS BIGINT) FROM links")
                .fetch_one(&self.pool)
                .await?,
        )
    }

    /// Locks the links of a JSON object of counts, in code order; `None`
    /// where the transaction already excludes every other writer.
    fn lock_links_statement(&self) -> Option<&'static str> {
        match self.backend {
            Backend::Sqlite => None,
            Backend::Postgres => Some(
                "SELECT code FROM links \
                 WHERE code IN (SELECT key FROM json_each_text($1::json)) \
                 ORDER BY code FOR UPDATE",
            ),
        }
    }

    /// Adds a JSON object of code → hits to the links' counts.
    fn add_hits_statement(&self) -> &'static str {
        match self.backend {
            Backend::Sqlite => {
                "UPDATE links SET hits = hits + counts.value \
                 FROM json_each($1) AS counts WHERE links.code = counts.key"
            }
            Backend::Postgres => {
                "UPDATE links SET hits = links.hits + counts.value::bigint \
                 FROM json_each_text($1::json) AS counts WHERE links.code = counts.key"
            }
        }
    }

    fn begin_statement(&self) -> &'static str {
        match self.backend {
            // Take the write lock up front: a deferred transaction that
            // upgrades later fails with SQLITE_BUSY instead of waiting.
            Backend::Sqlite => "BEGIN IMMEDIATE",
            Backend::Postgres => "BEGIN",
        }
    }

    async fn backend_pid(&self, conn: &mut AnyConnection) -> Result<Option<i32>, StorageError> {
        match self.backend {
            Backend::Postgres => Ok(Some(
                sqlx::query_scalar("SELECT pg_backend_pid()")
                    .fetch_one(conn)
                    .await?,
            )),
            Backend::Sqlite => Ok(None),
        }
    }

    /// Runs `work` to completion. If `token` fires first, asks PostgreSQL to
    /// cancel whatever the backend `pid` is executing, so a statement
    /// blocked on a lock returns at once with an error instead of whenever
    /// the lock clears. `work` is never dropped half-way.
    async fn cancel_on<T>(
        &self,
        token: &CancellationToken,
        pid: Option<i32>,
        work: impl Future<Output = Result<T, StorageError>>,
    ) -> Result<T, StorageError> {
        let mut work = pin!(work);
        tokio::select! {
            result = work.as_mut() => return result,
            () = token.cancelled() => {}
        }
        if let (Some(pid), Some(canceller)) = (pid, &self.canceller) {
            match sqlx::query("SELECT pg_cancel_backend($1)")
                .bind(pid)
                .execute(canceller)
                .await
            {
                Ok(_) => {
                    self.metrics.statements_cancelled.inc();
                }
                Err(error) => tracing::warn!(%error, pid, "could not cancel a blocked statement"),
            }
        }
        work.await
    }
}

/// The pool's options: connection setup, and the check that no connection
/// ever goes back into the pool inside a transaction.
fn pool_options(
    backend: Backend,
    max_connections: u32,
    metrics: &StorageMetrics,
) -> AnyPoolOptions {
    let opened = metrics.connections_opened.clone();
    let checked = metrics.clone();
    AnyPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .after_connect(move |conn, _meta| {
            let opened = opened.clone();
            Box::pin(async move {
                if backend == Backend::Sqlite {
                    conn.execute(
                        "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA busy_timeout = 5000;",
                    )
                    .await?;
                }
                opened.inc();
                Ok(())
            })
        })
        .after_release(move |conn, _meta| {
            let metrics = checked.clone();
            Box::pin(async move {
                if !conn.is_in_transaction() {
                    return Ok(true);
                }
                // The cancelled-`BEGIN` hole (sqlx #2054): never hand this
                // connection to the next request as it is.
                metrics.found_in_transaction.inc();
                tracing::error!("a pooled connection came back inside a transaction; rolling it back");
                let clean = conn.execute("ROLLBACK").await.is_ok();
                if !clean {
                    metrics.connections_discarded.inc();
                }
                Ok(clean)
            })
        })
}

/// A `links` row (`code, url, hits, created_at`) as a [`StoredLink`].
fn stored_link(row: &AnyRow) -> Result<StoredLink, sqlx::Error> {
    Ok(StoredLink {
        code: row.try_get("code")?,
        url: row.try_get("url")?,
        hits: row.try_get("hits")?,
        created_at: row.try_get("created_at")?,
    })
}

/// Hit counts as one JSON object, code → hits: a code listed twice is
/// summed, and a count beyond the column's range is cut to its largest.
fn counts_json(hits: &[(String, u64)]) -> String {
    let mut counts = serde_json::Map::with_capacity(hits.len());
    for (code, count) in hits {
        let count = i64::try_from(*count).unwrap_or(i64::MAX);
        let total = counts
            .get(code)
            .and_then(serde_json::Value::as_i64)
            .map_or(count, |before| before.saturating_add(count));
        counts.insert(code.clone(), total.into());
    }
    serde_json::Value::Object(counts).to_string()
}

/// A timestamp as stored: RFC 3339, UTC, milliseconds (sorts as text).
pub fn rfc3339(at: chrono::DateTime<chrono::Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// `url` with `application_name` set to `name`, unless it sets one already.
fn with_application_name(url: &str, name: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed)
            if !parsed
                .query_pairs()
                .any(|(key, _)| key == "application_name") =>
        {
            parsed
                .query_pairs_mut()
                .append_pair("application_name", name);
            parsed.to_string()
        }
        _ => url.to_owned(),
    }
}

/// `url` with its password replaced, for messages and logs.
pub fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            // Cannot fail for a URL that already has a password.
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        Ok(parsed) => parsed.to_string(),
        Err(_) => "<unparseable URL>".to_owned(),
    }
}

/// A database call's span until the call is answered: dropped before, the
/// call was given up on (its request's client hung up or its deadline
/// passed, the final flush's budget was spent while the database does not
/// answer), and `fail` marks the span so rather than let it end as if the
/// call had succeeded.
struct Unanswered<F: FnOnce(&str)>(Option<F>);

impl<F: FnOnce(&str)> Unanswered<F> {
    /// The call was answered: its span says how.
    fn answered(mut self) {
        self.0 = None;
    }
}

impl<F: FnOnce(&str)> Drop for Unanswered<F> {
    fn drop(&mut self) {
        if let Some(fail) = self.0.take() {
            fail("given up on before the database answered");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_json_sums_a_code_listed_twice_and_keeps_within_the_column() {
        let rows = [
            ("a\"b".to_owned(), 2),
            ("c".to_owned(), u64::MAX),
            ("a\"b".to_owned(), 3),
        ];
        let counts: serde_json::Value = serde_json::from_str(&counts_json(&rows)).expect("JSON");
        assert_eq!(counts, serde_json::json!({ "a\"b": 5, "c": i64::MAX }));
    }

    // The breaker is open (probes and calls met the database unreachable);
    // the flusher's next batch lands: reads stop failing fast at once, not
    // at the next probe.
    #[tokio::test]
    async fn a_batch_that_lands_closes_the_breaker() {
        let dir = tempfile::tempdir().expect("tempdir");
        let storage = Storage::open(None, dir.path(), 1, StorageMetrics::default())
            .await
            .expect("open SQLite");
        for _ in 0..health::FAILURE_THRESHOLD {
            storage.health.breaker().record_failure();
        }
        assert_eq!(storage.state(), DatabaseState::Down);
        assert!(matches!(
            storage.find_link("abc").await,
            Err(StorageError::Down)
        ));

        let applied = storage
            .apply_hits("batch-1", &[("abc".to_owned(), 1)])
            .await;
        assert!(applied.expect("the batch lands"));
        assert_eq!(storage.state(), DatabaseState::Up);
        assert!(storage.find_link("abc").await.expect("read").is_none());
    }

    // Gap: a call that began waiting for a pooled connection just before
    // the breaker opened waited out the whole acquire timeout (3 s) while
    // the calls after it failed at once.
    #[tokio::test]
    async fn a_call_waiting_for_a_connection_fails_fast_when_the_breaker_opens() {
        let dir = tempfile::tempdir().expect("tempdir");
        let storage = Storage::open(None, dir.path(), 1, StorageMetrics::default())
            .await
            .expect("open SQLite");
        let held = storage.pool().acquire().await.expect("the one connection");
        // From here the clock only moves when every task waits: the
        // acquire timeout would fire at once, so the call must be woken
        // before it can.
        tokio::time::pause();
        let started = tokio::time::Instant::now();
        let waiting = tokio::spawn({
            let storage = storage.clone();
            async move { storage.find_link("abc").await }
        });
        tokio::task::yield_now().await;
        assert!(
            !waiting.is_finished(),
            "the call waits for the held connection"
        );

        let refused = || {
            StorageError::from(sqlx::Error::Io(
                std::io::ErrorKind::ConnectionRefused.into(),
            ))
        };
        for _ in 0..health::FAILURE_THRESHOLD {
            let _ = storage.health.observe::<()>(Err(refused()));
        }
        let answer = waiting.await.expect("the call's task");
        assert!(matches!(answer, Err(StorageError::Down)), "{answer:?}");
        // Paused time moves only to a timer: had the call waited for the
        // pool, the clock would stand at the acquire timeout.
        assert!(
            started.elapsed() < ACQUIRE_TIMEOUT,
            "the call waited {:?} for the pool",
            started.elapsed()
        );
        drop(held);
    }

    #[test]
    fn redact_hides_the_password_and_keeps_the_rest() {
        let redacted = redact("postgres://app:s3cret@127.0.0.1:5432/links");
        assert!(!redacted.contains("s3cret"), "{redacted}");
        assert!(
            redacted.contains("app:***@127.0.0.1:5432/links"),
            "{redacted}"
        );
        assert_eq!(redact("not a url s3cret"), "<unparseable URL>");
    }
}
