//! TLS against the real binary, with real clients: curl and `openssl
//! s_client` from outside, a rustls client from inside that tells which
//! certificate the server presented. Certificates are made by the tests
//! (`lameduck_testkit::tls`); rotation swaps a `..data` symlink the way the kubelet
//! updates a Secret volume.

use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use lameduck_testkit::binary::{
    begin_slow_post, binary, finish_slow_post, read_response, request, run, server_command,
    tempdir, LameduckProcess, Lineage, Process, LINK,
};
use lameduck_testkit::tls::{write_pair, SecretVolume, TestCa};

/// Bound on anything that should take well under a second, and on a
/// certificate reload (polled every second). Reaching it is a failure.
const PATIENCE: Duration = Duration::from_secs(15);

/// `lameduck server --tls-cert CERT --tls-key KEY ARGS`.
fn start_tls(cert: &Path, key: &Path, args: &[&str]) -> LameduckProcess {
    let cert = cert.to_str().expect("utf-8 path");
    let key = key.to_str().expect("utf-8 path");
    let mut all = vec!["--tls-cert", cert, "--tls-key", key];
    all.extend_from_slice(args);
    LameduckProcess::start(&all, &[])
}

/// The value of the first `/metrics` line that starts with `series`.
fn metric(server: &LameduckProcess, series: &str) -> Option<f64> {
    let response = request(server.admin_addr(), "GET", "/metrics", None).expect("GET /metrics");
    let text = String::from_utf8_lossy(&response.body).into_owned();
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}

/// Connects new TLS clients until one is presented the certificate
/// `serial`, for up to [`PATIENCE`].
fn wait_for_serial(ca: &TestCa, addr: SocketAddr, serial: &str) -> bool {
    let deadline = Instant::now() + PATIENCE;
    while Instant::now() < deadline {
        let client = ca.connect(addr).expect("TLS connection");
        if client.serial() == serial {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

fn curl(args: &[&str]) -> String {
    let output = Command::new("curl")
        .args(["--silent", "--show-error", "--max-time", "10"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run curl");
    assert!(output.status.success(), "curl {args:?}: {output:?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

// Outsiders' clients: curl verifies the chain against the test CA over
// HTTP/1.1 and HTTP/2 (ALPN), and `openssl s_client` sees `h2` negotiated
// and the chain verified. A clean SIGTERM still exits 0.
#[test]
fn curl_and_openssl_speak_tls_with_alpn_to_the_real_binary() {
    let dir = tempdir("lameduck-tls-");
    let ca = TestCa::new();
    let leaf = ca.leaf(1001);
    let (cert, key, ca_file) = (
        dir.path().join("tls.crt"),
        dir.path().join("tls.key"),
        dir.path().join("ca.pem"),
    );
    write_pair(&leaf, &cert, &key);
    std::fs::write(&ca_file, ca.pem()).expect("write the CA");
    let mut server = start_tls(&cert, &key, &[]);
    assert!(
        server.has_logged(&format!("listening on https://{}", server.addr())),
        "{}",
        server.log_text()
    );
    let loaded = server.expect_log("TLS certificate loaded", PATIENCE);
    assert!(
        loaded.contains(&leaf.serial) && loaded.contains("lameduck test 1001"),
        "{loaded}"
    );

    let url = format!("https://localhost:{}/healthz", server.addr().port());
    let resolve = format!("localhost:{}:127.0.0.1", server.addr().port());
    let ca_path = ca_file.to_str().expect("utf-8 path");
    for (flag, version) in [("--http1.1", "1.1"), ("--http2", "2")] {
        let out = curl(&[
            flag,
            "--cacert",
            ca_path,
            "--resolve",
            &resolve,
            "--output",
            "/dev/null",
            "--write-out",
            "%{http_code} %{http_version}",
            &url,
        ]);
        assert_eq!(out, format!("200 {version}"), "curl {flag}");
    }

    let s_client = Command::new("openssl")
        .args(["s_client", "-connect"])
        .arg(server.addr().to_string())
        .args([
            "-servername",
            "localhost",
            "-alpn",
            "h2",
            "-CAfile",
            ca_path,
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run openssl s_client");
    let text = String::from_utf8_lossy(&s_client.stdout);
    assert!(text.contains("ALPN protocol: h2"), "{text}");
    assert!(text.contains("Verify return code: 0 (ok)"), "{text}");

    server.signal(Signal::SIGTERM);
    assert_eq!(server.exit_code(PATIENCE), 0, "{}", server.log_text());
}

// Gap: plain HTTP sent to the TLS port got a TLS alert, which curl shows
// as "HTTP/0.9 when not allowed" and a browser as garbage. It is a client
// that misbehaves like any other: a 400 with a JSON body saying what went
// wrong, the connection closed cleanly, and TLS clients served meanwhile.
#[test]
fn plain_http_on_the_tls_port_is_answered_400_in_json() {
    let dir = tempdir("lameduck-tls-");
    let ca = TestCa::new();
    let leaf = ca.leaf(1501);
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    write_pair(&leaf, &cert, &key);
    let mut server = start_tls(&cert, &key, &[]);
    let addr = server.addr();

    let response = request(addr, "POST", "/api/links", Some(LINK)).expect("a plain answer");
    assert_eq!(response.status, 400, "{response:?}");
    assert!(response.closes_connection(), "{response:?}");
    assert_eq!(
        response.header("content-type"),
        Some("application/json"),
        "{response:?}"
    );
    let error = response.json()["error"].as_str().map(str::to_owned);
    assert!(
        error.as_deref().is_some_and(|e| e.contains("HTTPS")),
        "{response:?}"
    );

    let out = curl(&[
        "--output",
        "/dev/null",
        "--write-out",
        "%{http_code}",
        &format!("http://{addr}/healthz"),
    ]);
    assert_eq!(out, "400", "curl over plain HTTP");

    let mut client = ca.connect(addr).expect("TLS still works");
    assert_eq!(client.get("/healthz").expect("GET").status, 200);
    drop(client);
    assert!(
        !server.log_text().contains("ERROR"),
        "{}",
        server.log_text()
    );
    server.signal(Signal::SIGTERM);
    assert_eq!(server.exit_code(PATIENCE), 0, "{}", server.log_text());
}

// Gap: reload the way Kubernetes updates a mounted Secret. The kubelet
// never rewrites `tls.crt`: it writes a new directory and swaps the
// `..data` symlink that `tls.crt` points through. A new connection gets the
// new certificate within a few seconds, while a connection opened before
// the swap keeps its certificate and finishes the request it had begun.
#[test]
fn a_secret_volume_update_reaches_new_connections_while_an_old_one_finishes() {
    let dir = tempdir("lameduck-tls-");
    let ca = TestCa::new();
    let (first, second) = (ca.leaf(2001), ca.leaf(2002));
    let mut volume = SecretVolume::new(dir.path(), &first);
    let mut server = start_tls(&volume.cert(), &volume.key(), &[]);
    let addr = server.addr();

    let mut old = ca.connect(addr).expect("TLS connection");
    assert_eq!(old.serial(), first.serial);
    begin_slow_post(&mut old.stream, LINK);
    server.wait_in_flight(1);

    volume.update(&second);
    assert!(
        wait_for_serial(&ca, addr, &second.serial),
        "new connections never got the new certificate:\n{}",
        server.log_text()
    );
    let reloaded = server.expect_log("TLS certificate reloaded", PATIENCE);
    assert!(reloaded.contains(&second.serial), "{reloaded}");

    finish_slow_post(&mut old.stream);
    let response = read_response(&mut old.stream).expect("the old connection's answer");
    assert_eq!(response.status, 201, "{response:?}");
    assert_eq!(old.serial(), first.serial);

    let expiry = "lameduck_tls_certificate_expiry_timestamp_seconds ";
    assert_eq!(metric(&server, expiry), Some(second.not_after as f64));
    let reloads = r#"lameduck_tls_certificate_reloads_total{result="ok"} "#;
    assert_eq!(metric(&server, reloads), Some(1.0));

    server.signal(Signal::SIGTERM);
    assert_eq!(server.exit_code(PATIENCE), 0, "{}", server.log_text());
}

// A pair rewritten in place that does not match, then one that does not
// parse, is refused with an error and a metric while the old certificate
// keeps serving; a good pair written in place (one file, then the other)
// is then taken.
#[test]
fn a_bad_pair_is_refused_and_the_old_certificate_keeps_serving() {
    let dir = tempdir("lameduck-tls-");
    let ca = TestCa::new();
    let (first, other, third) = (ca.leaf(3001), ca.leaf(3002), ca.leaf(3003));
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    write_pair(&first, &cert, &key);
    let mut server = start_tls(&cert, &key, &[]);
    let addr = server.addr();
    let errors = r#"lameduck_tls_certificate_reloads_total{result="error"} "#;

    std::fs::write(&key, &other.key_pem).expect("a key of another certificate");
    let refused = server.expect_log("TLS certificate reload refused", PATIENCE);
    assert!(refused.contains("does not match"), "{refused}");
    assert_eq!(metric(&server, errors), Some(1.0));
    assert_eq!(ca.connect(addr).expect("TLS").serial(), first.serial);

    std::fs::write(&cert, "-----BEGIN CERTIFICATE-----\nnot base64\n").expect("garbage");
    let deadline = Instant::now() + PATIENCE;
    while metric(&server, errors) != Some(2.0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(metric(&server, errors), Some(2.0), "{}", server.log_text());
    let mut client = ca.connect(addr).expect("TLS");
    assert_eq!(client.serial(), first.serial);
    assert_eq!(client.get("/healthz").expect("GET /healthz").status, 200);

    write_pair(&third, &cert, &key);
    assert!(
        wait_for_serial(&ca, addr, &third.serial),
        "{}",
        server.log_text()
    );

    server.signal(Signal::SIGTERM);
    assert_eq!(server.exit_code(PATIENCE), 0, "{}", server.log_text());
}

// An unusable certificate or key at startup is a configuration error: exit
// 2 and one line naming the file and the problem.
#[test]
fn an_unusable_certificate_or_key_at_startup_is_exit_2_naming_the_file() {
    let dir = tempdir("lameduck-tls-");
    let ca = TestCa::new();
    let (leaf, other) = (ca.leaf(4001), ca.leaf(4002));
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    write_pair(&leaf, &cert, &key);
    let (garbage, other_key, missing) = (
        dir.path().join("garbage.pem"),
        dir.path().join("other.key"),
        dir.path().join("missing.pem"),
    );
    std::fs::write(&garbage, "hello\n").expect("write");
    std::fs::write(&other_key, &other.key_pem).expect("write");
    let path = |p: &Path| p.to_str().expect("utf-8 path").to_owned();

    let cases = [
        (path(&missing), path(&key), path(&missing), "cannot read it"),
        (path(&garbage), path(&key), path(&garbage), "no certificate"),
        (path(&cert), path(&garbage), path(&garbage), "private key"),
        (
            path(&cert),
            path(&other_key),
            path(&other_key),
            "does not match",
        ),
    ];
    for (cert, key, named, problem) in cases {
        let finished = run(&["--tls-cert", &cert, "--tls-key", &key], &[], PATIENCE);
        let output = finished.output();
        assert_eq!(finished.status.code(), Some(2), "{output}");
        let errors: Vec<&str> = output.lines().filter(|l| l.contains("ERROR")).collect();
        assert_eq!(errors.len(), 1, "{output}");
        assert!(
            errors[0].contains(&named) && errors[0].contains(problem),
            "{output}"
        );
    }

    let finished = run(&["--tls-cert", &path(&cert)], &[], PATIENCE);
    assert_eq!(finished.status.code(), Some(2), "{}", finished.output());
    assert!(
        finished.output().contains("--tls-key"),
        "{}",
        finished.output()
    );
}

// Gap: a handshake done in the accept loop lets clients that open TCP and
// never send a ClientHello stop everyone else. A thousand of them are held
// open while a normal client connects and is served; then the head
// deadline closes them.
#[test]
fn clients_that_never_say_hello_do_not_keep_a_normal_client_out() {
    let dir = tempdir("lameduck-tls-");
    let ca = TestCa::new();
    let leaf = ca.leaf(5001);
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    write_pair(&leaf, &cert, &key);
    let mut server = start_tls(&cert, &key, &["--header-read-timeout", "5s"]);
    let addr = server.addr();

    let silent: Vec<TcpStream> = (0..1000)
        .map(|_| TcpStream::connect(addr).expect("a silent client connects"))
        .collect();
    let mut client = ca.connect(addr).expect("a normal client's handshake");
    let response = client.get("/healthz").expect("GET /healthz");
    assert_eq!(response.status, 200, "{response:?}");

    // The head deadline covers the handshake: the silent ones are closed.
    for mut stream in silent.into_iter().step_by(100) {
        stream
            .set_read_timeout(Some(PATIENCE))
            .expect("read timeout");
        let mut byte = [0; 1];
        let read = std::io::Read::read(&mut stream, &mut byte);
        assert!(
            matches!(read, Ok(0))
                || read.is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
            "a silent client was not closed by the head deadline"
        );
    }

    server.signal(Signal::SIGTERM);
    assert_eq!(server.exit_code(PATIENCE), 0, "{}", server.log_text());
}

// The shutdown timeline over TLS: a request in flight at SIGTERM is
// answered (with `Connection: close`), an idle keep-alive connection is
// closed with `close_notify`, and the process exits 0.
#[test]
fn sigterm_answers_tls_requests_in_flight_and_closes_idle_ones_with_close_notify() {
    let dir = tempdir("lameduck-tls-");
    let ca = TestCa::new();
    let leaf = ca.leaf(6001);
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    write_pair(&leaf, &cert, &key);
    let mut server = start_tls(&cert, &key, &["--drain-delay", "500ms"]);
    let addr = server.addr();

    let mut idle = ca.connect(addr).expect("TLS");
    assert_eq!(idle.get("/healthz").expect("GET").status, 200);
    let mut busy = ca.connect(addr).expect("TLS");
    begin_slow_post(&mut busy.stream, LINK);
    server.wait_in_flight(1);

    server.signal(Signal::SIGTERM);
    server.expect_log("listener closed; draining", PATIENCE);
    assert!(
        idle.closed_cleanly(PATIENCE)
            .expect("the idle connection closes"),
        "an idle TLS connection was closed without close_notify"
    );
    finish_slow_post(&mut busy.stream);
    let response = read_response(&mut busy.stream).expect("the answer");
    assert_eq!(response.status, 201, "{response:?}");
    assert!(response.closes_connection(), "{response:?}");
    assert_eq!(server.exit_code(PATIENCE), 0, "{}", server.log_text());
}

// HTTP/2 over TLS (ALPN h2): served, and told to go away at the signal — the
// connection ends by itself and the process exits 0.
#[test]
fn h2_over_tls_is_served_and_told_to_go_away_at_the_signal() {
    let dir = tempdir("lameduck-tls-");
    let ca = TestCa::new();
    let leaf = ca.leaf(7001);
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    write_pair(&leaf, &cert, &key);
    let mut server = start_tls(&cert, &key, &[]);
    let addr = server.addr();

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let config = ca.client_config(&[b"h2"]);
    let (mut sender, connection) = runtime.block_on(async {
        let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
        let tls = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .expect("handshake");
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
        hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(tls),
        )
        .await
        .expect("h2 handshake")
    });
    let connection = runtime.spawn(connection);
    runtime.block_on(async {
        let request = hyper::Request::get(format!("https://localhost:{}/healthz", addr.port()))
            .body(http_body_util::Empty::<hyper::body::Bytes>::new())
            .expect("request");
        let response = sender.send_request(request).await.expect("response");
        assert_eq!(response.status(), 200);
        assert_eq!(response.version(), hyper::Version::HTTP_2);
    });

    server.signal(Signal::SIGTERM);
    let ended = runtime.block_on(async { tokio::time::timeout(PATIENCE, connection).await });
    let ended = ended.expect("the server ended the h2 connection (GOAWAY)");
    ended
        .expect("the connection task")
        .expect("a clean h2 close");
    assert_eq!(server.exit_code(PATIENCE), 0, "{}", server.log_text());
}

// The in-place upgrade passes the listening socket as over plain HTTP; the
// successor loads the certificate itself (from the files as they are now)
// and serves new handshakes, and the retiring process exits 0.
#[test]
fn an_upgrade_over_tls_hands_the_socket_over_and_the_successor_loads_the_certificate() {
    nix::sys::prctl::set_child_subreaper(true).expect("become a child subreaper");
    let dir = tempdir("lameduck-tls-");
    let ca = TestCa::new();
    let leaf = ca.leaf(8001);
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    write_pair(&leaf, &cert, &key);
    let pid_file = dir.path().join("lameduck.pid");
    let mut command = server_command(Path::new(binary()), "127.0.0.1:0");
    command
        .args(["--listen", "127.0.0.1:0", "--tls-cert"])
        .arg(&cert)
        .arg("--tls-key")
        .arg(&key)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--pid-file")
        .arg(&pid_file);
    let mut lineage = Lineage::start(Process::spawn_group(&mut command), pid_file);
    let addr = lineage.first.listening_addr();
    let mut before = ca.connect(addr).expect("TLS");
    assert_eq!(before.get("/healthz").expect("GET").status, 200);

    lineage.upgrade();
    let loads = lineage
        .first
        .logs()
        .iter()
        .filter(|line| line.contains("TLS certificate loaded") && line.contains(&leaf.serial))
        .count();
    assert_eq!(loads, 2, "{}", lineage.first.log_text());
    let mut after = ca.connect(addr).expect("a handshake with the successor");
    assert_eq!(after.get("/healthz").expect("GET").status, 200);
    assert_eq!(lineage.stop(), 0, "{}", lineage.first.log_text());
}
