# lameduck container image.
#
#   docker build -t lameduck .
#   docker run -p 8080:8080 lameduck
#
# Three stages: a Rust build stage whose dependency layer is cached apart from
# the project's own code; `debuginfo`, the binary's line tables alone, to
# symbolize a backtrace later; and a distroless runtime with nothing in it but
# the binary (symbols kept, line tables split off), the C runtime it links
# against, and CA certificates; it runs as the non-root user 65532.
#
# Works with the classic builder and with BuildKit alike: the dependency layer
# is built from the manifests and empty stand-in sources, so it is rebuilt only
# when Cargo.toml or Cargo.lock change (no RUN --mount cache, which the classic
# builder refuses).
#
# Base images are arguments, e.g. for a Debian slim runtime:
#   docker build --build-arg RUNTIME_IMAGE=debian:bookworm-slim .
# With no registry reachable, scripts/docker-base-images.sh makes local
# stand-ins under the default names.

ARG RUST_IMAGE=rust:1.95-slim-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot

# --- build --------------------------------------------------------------------
FROM ${RUST_IMAGE} AS build
WORKDIR /src
ENV CARGO_TERM_COLOR=never \
    CARGO_INCREMENTAL=0

# 1. Dependencies only: the workspace's manifests and empty targets.
COPY Cargo.toml Cargo.lock ./
COPY lifecycle/Cargo.toml lifecycle/Cargo.toml
COPY handoff/Cargo.toml handoff/Cargo.toml
COPY service/Cargo.toml service/Cargo.toml
COPY traces/Cargo.toml traces/Cargo.toml
COPY writebehind/Cargo.toml writebehind/Cargo.toml
COPY load/Cargo.toml load/Cargo.toml
COPY testkit/Cargo.toml testkit/Cargo.toml
RUN mkdir -p src lifecycle/src handoff/src service/src traces/src writebehind/src load/src testkit/src \
    && printf '//! Stand-in.\nfn main() {}\n' > src/main.rs \
    && printf '//! Stand-in.\n' > src/lib.rs \
    && printf '//! Stand-in.\n' > lifecycle/src/lib.rs \
    && printf '//! Stand-in.\n' > handoff/src/lib.rs \
    && printf '//! Stand-in.\n' > service/src/lib.rs \
    && printf '//! Stand-in.\n' > traces/src/lib.rs \
    && printf '//! Stand-in.\n' > writebehind/src/lib.rs \
    && printf 'fn main() {}\n' > load/src/main.rs \
    && printf '//! Stand-in.\n' > testkit/src/lib.rs \
    && cargo build --release --locked -p lameduck \
    && cargo clean --release --locked -p lameduck -p lameduck-lifecycle -p lameduck-handoff -p lameduck-service -p lameduck-traces -p lameduck-writebehind \
    && rm -rf src lifecycle/src handoff/src service/src traces/src writebehind/src

# 2. The project itself (sqlx embeds migrations/ at compile time).
COPY migrations migrations
COPY lifecycle lifecycle
COPY handoff handoff
COPY service service
COPY traces traces
COPY writebehind writebehind
COPY src src
# COPY keeps the files' times, which may be older than the stand-ins built
# above: touch them so cargo cannot mistake them for already built.
# 3. The line tables (`debug = "line-tables-only"`, about 90 MB of the
#    binary) go to lameduck.debug, an artifact of their own (the `debuginfo`
#    stage below); the binary keeps its symbol table, so a panic's backtrace
#    in the container still names its functions, and a `.gnu_debuglink` to
#    the artifact, so that the backtrace can be given its files and lines
#    later (docs/deployment.md).
RUN find src lifecycle handoff service traces writebehind migrations -type f -exec touch {} + \
    && cargo build --release --locked -p lameduck --bin lameduck \
    && mkdir -p /out/data /out/spill \
    && objcopy --only-keep-debug target/release/lameduck /out/lameduck.debug \
    && objcopy --strip-debug --add-gnu-debuglink=/out/lameduck.debug \
        target/release/lameduck /out/lameduck \
    && chmod 0755 /out/lameduck && chmod 0644 /out/lameduck.debug

# --- debuginfo ----------------------------------------------------------------
# The line tables alone, to keep with the image they belong to:
#   docker build --target debuginfo --output type=local,dest=debuginfo .
# (BuildKit; with the classic builder: build it with --tag, then
# `docker create` it and `docker cp` /lameduck.debug out).
FROM scratch AS debuginfo
COPY --from=build /out/lameduck.debug /lameduck.debug

# --- runtime ------------------------------------------------------------------
FROM ${RUNTIME_IMAGE}

COPY --from=build /out/lameduck /usr/local/bin/lameduck
# The SQLite database, and the spill files (hits the database could not take
# at exit); owned by the user the server runs as. Give /spill a named volume
# that the next container mounts too (`-v lameduck-spill:/spill`), or its
# spills leave with the container's anonymous volume.
COPY --from=build --chown=65532:65532 /out/data /data
COPY --from=build --chown=65532:65532 /out/spill /spill

ENV LAMEDUCK_LISTEN=0.0.0.0:8080 \
    LAMEDUCK_ADMIN_LISTEN=0.0.0.0:9090 \
    LAMEDUCK_DATA_DIR=/data \
    LAMEDUCK_SPILL_DIR=/spill
USER 65532:65532
WORKDIR /data
VOLUME ["/data", "/spill"]
# 8080: the service; 9090: the admin listener (/healthz, /readyz, /metrics)
# for probes and Prometheus, outside the service's connection cap and load
# shedding. Publish it only where probes and scrapers live.
EXPOSE 8080 9090

# readyz on the admin listener (LAMEDUCK_ADMIN_LISTEN): 200 while serving,
# 503 from the moment SIGTERM arrives.
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 \
    CMD ["/usr/local/bin/lameduck", "healthcheck"]

# SIGTERM starts the graceful shutdown: readiness 503, lame-duck delay,
# drain, exit 0. Exec form so that the signal reaches the server as PID 1.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/lameduck"]
CMD ["server"]
