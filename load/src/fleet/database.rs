//! The throwaway PostgreSQL a run's replicas share, and the harness's own
//! pool on it: emptied before the traffic, counted after the replicas have
//! exited.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use crate::postgres::PgCluster;

/// A throwaway PostgreSQL cluster and the harness's connections to it.
pub struct Database {
    cluster: Arc<PgCluster>,
    pool: PgPool,
}

impl Database {
    /// Starts the cluster and connects a small pool whose calls wait up to
    /// `acquire_timeout` for a connection (longer where the run itself
    /// stops or locks the database).
    ///
    /// # Errors
    /// If the cluster does not start or does not accept the pool.
    pub async fn start(acquire_timeout: Duration) -> anyhow::Result<Database> {
        eprintln!("load: starting a throwaway PostgreSQL");
        let cluster = Arc::new(
            tokio::task::spawn_blocking(PgCluster::start)
                .await
                .context("the PostgreSQL cluster failed to start")?,
        );
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(acquire_timeout)
            .connect(&cluster.url())
            .await;
        match pool {
            Ok(pool) => Ok(Database { cluster, pool }),
            Err(error) => {
                drop_cluster(cluster).await;
                Err(error).context("cannot connect to the throwaway PostgreSQL")
            }
        }
    }

    /// The URL the replicas connect to.
    pub fn url(&self) -> String {
        self.cluster.url()
    }

    /// The cluster, for a run that stops, restarts or relays it.
    pub fn cluster(&self) -> &Arc<PgCluster> {
        &self.cluster
    }

    /// The harness's own pool (not through any relay).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Empties the links table (and its audit) before a run seeds its own.
    ///
    /// # Errors
    /// If the database does not answer.
    pub async fn empty_links(&self) -> anyhow::Result<()> {
        sqlx::query("TRUNCATE links, link_audit")
            .execute(&self.pool)
            .await
            .context("cannot empty the links table")?;
        Ok(())
    }

    /// `SUM(links.hits)`: the hits stored, once the replicas have flushed.
    ///
    /// # Errors
    /// If the database does not answer.
    pub async fn hits_stored(&self) -> anyhow::Result<i64> {
        Ok(
            sqlx::query_scalar("SELECT COALESCE(SUM(hits), 0)::BIGINT FROM links")
                .fetch_one(&self.pool)
                .await?,
        )
    }

    /// The number of links, the seeded ones included.
    ///
    /// # Errors
    /// If the database does not answer.
    pub async fn links(&self) -> anyhow::Result<i64> {
        Ok(sqlx::query_scalar("SELECT COUNT(*) FROM links")
            .fetch_one(&self.pool)
            .await?)
    }

    /// Closes the pool and removes the cluster.
    pub async fn stop(self) {
        self.pool.close().await;
        drop_cluster(self.cluster).await;
    }
}

/// Drops the cluster (`pg_ctl stop`, its folder removed) off the runtime.
async fn drop_cluster(cluster: Arc<PgCluster>) {
    tokio::task::spawn_blocking(move || drop(cluster))
        .await
        .ok();
}
