//! Checks the throwaway PostgreSQL cluster in `testkit/src/postgres.rs`
//! that the other integration tests build on.

use lameduck_testkit::postgres::PgCluster;
use sqlx::postgres::{PgConnection, PgPoolOptions};
use sqlx::{Connection, PgPool};
use std::time::Duration;

async fn connect(cluster: &PgCluster) -> PgPool {
    PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&cluster.url())
        .await
        .expect("connect to the throwaway cluster")
}

#[tokio::test]
async fn throwaway_cluster_starts_accepts_connections_and_restarts() {
    let cluster = PgCluster::start();
    assert!(cluster.is_running());
    assert!(cluster.url().contains(cluster.password()));
    assert!(cluster.url().contains(&format!(":{}/", cluster.port())));
    assert!(!format!("{cluster:?}").contains(cluster.password()));

    let pool = connect(&cluster).await;
    let one: i32 = sqlx::query_scalar("select 1")
        .fetch_one(&pool)
        .await
        .expect("select 1");
    assert_eq!(one, 1);
    sqlx::query("create table survivors (name text not null)")
        .execute(&pool)
        .await
        .expect("create table");
    sqlx::query("insert into survivors (name) values ($1)")
        .bind("lameduck")
        .execute(&pool)
        .await
        .expect("insert");
    pool.close().await;

    // A wrong password is refused over TCP.
    let wrong = cluster
        .url()
        .replace(cluster.password(), "not-the-password");
    assert!(PgConnection::connect(&wrong).await.is_err());

    cluster.stop();
    assert!(!cluster.is_running());
    let refused = tokio::time::timeout(
        Duration::from_secs(10),
        PgConnection::connect(&cluster.url()),
    )
    .await
    .expect("connecting to a stopped server fails fast");
    assert!(refused.is_err(), "connected to a stopped server");

    cluster.start_again();
    assert!(cluster.is_running());
    let pool = connect(&cluster).await;
    let names: Vec<String> = sqlx::query_scalar("select name from survivors")
        .fetch_all(&pool)
        .await
        .expect("select after restart");
    assert_eq!(names, ["lameduck"]);
    pool.close().await;
}
