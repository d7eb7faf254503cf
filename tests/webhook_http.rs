//! The webhook port as any HTTPS client meets it: bad input gets a clear
//! answer, plain HTTP and wrong certificates are refused, h2 works, metrics
//! count what happened, and SIGTERM drains before the process exits. What
//! happens on the webhook port alone runs against `serve` with no API server
//! behind it (`serve_offline`); readiness needs the real one.

use testsupport as common;

use std::time::{Duration, Instant};

use common::{
    Http1, Served, http_get, https, https_h2, make_certs, node_create, node_object, request,
    review, serve, serve_offline,
};
use serde_json::{Value, json};
use testenv::ControlPlane;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn post_json(served: &Served, body: Vec<u8>) -> common::Reply {
    https(served, "POST", "/mutate", Some("application/json"), body).await
}

#[tokio::test]
async fn a_node_create_gets_a_base64_json_patch_in_an_admission_review() {
    let served = serve_offline(&[]).await;
    let reply = post_json(&served, node_create("direct")).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let body = reply.json();
    assert_eq!(body["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(body["kind"], "AdmissionReview");
    let response = &body["response"];
    assert_eq!(response["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
    assert_eq!(response["allowed"], true);
    assert_eq!(response["patchType"], "JSONPatch");
    use base64::Engine;
    let patch = base64::engine::general_purpose::STANDARD
        .decode(
            response["patch"]
                .as_str()
                .expect("patch is a base64 string"),
        )
        .unwrap();
    let patch: Value = serde_json::from_slice(&patch).unwrap();
    assert_eq!(patch[0]["path"], "/metadata/annotations");
    assert_eq!(
        patch[0]["value"]["karpenter.sh/do-not-disrupt"], "true",
        "{patch}"
    );
}

#[tokio::test]
async fn bad_input_gets_a_clear_client_error_and_the_server_keeps_serving() {
    let served = serve_offline(&[]).await;
    let mut wrong_version = review("Node", "CREATE", node_object("n"));
    wrong_version["apiVersion"] = json!("admission.k8s.io/v1beta1");
    let mut wrong_kind = review("Node", "CREATE", node_object("n"));
    wrong_kind["kind"] = json!("ConversionReview");
    let no_request = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"});
    // (method, path, content type, body, status, message)
    type Case = (
        &'static str,
        &'static str,
        Option<&'static str>,
        Vec<u8>,
        u16,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (
            "POST",
            "/mutate",
            Some("application/json"),
            b"{not json".to_vec(),
            400,
            "the body is not an AdmissionReview",
        ),
        (
            "POST",
            "/mutate",
            Some("application/json"),
            b"[1,2,3]".to_vec(),
            400,
            "the body is not an AdmissionReview",
        ),
        (
            "POST",
            "/mutate",
            Some("application/json"),
            serde_json::to_vec(&wrong_version).unwrap(),
            400,
            "expected apiVersion admission.k8s.io/v1 and kind AdmissionReview, got apiVersion \"admission.k8s.io/v1beta1\"",
        ),
        (
            "POST",
            "/mutate",
            Some("application/json"),
            serde_json::to_vec(&wrong_kind).unwrap(),
            400,
            "kind \"ConversionReview\"",
        ),
        (
            "POST",
            "/mutate",
            Some("application/json"),
            serde_json::to_vec(&no_request).unwrap(),
            400,
            "the AdmissionReview has no request",
        ),
        (
            "POST",
            "/mutate",
            Some("text/plain"),
            node_create("n"),
            415,
            "expected Content-Type application/json, got \"text/plain\"",
        ),
        (
            "POST",
            "/mutate",
            None,
            node_create("n"),
            415,
            "expected Content-Type application/json",
        ),
        ("GET", "/mutate", None, Vec::new(), 405, ""),
        (
            "POST",
            "/validate",
            Some("application/json"),
            node_create("n"),
            404,
            "",
        ),
    ];
    for (method, path, content_type, body, status, message) in cases {
        let reply = https(&served, method, path, content_type, body).await;
        assert_eq!(
            reply.status,
            status,
            "{method} {path} {content_type:?}: {}",
            reply.text()
        );
        assert!(
            reply.text().contains(message),
            "{method} {path}: {:?} lacks {message:?}",
            reply.text()
        );
    }
    // Still serving, and the failures were logged with their reason.
    assert_eq!(post_json(&served, node_create("after")).await.status, 200);
    let refusals: Vec<serde_json::Value> = served
        .log_lines()
        .into_iter()
        .filter(|l| l["message"] == "webhook request refused")
        .collect();
    assert_eq!(refusals.len(), 7, "{}", served.log());
    // What was refused is a field of its own, not only in `detail`.
    assert!(
        refusals
            .iter()
            .any(|l| l["error"] == "not JSON" && l["content_type"] == "text/plain"),
        "{}",
        served.log()
    );
}

/// A client that declares a body over the limit and asks whether to send it
/// (`Expect: 100-continue`, curl's default for large bodies) gets `413` as
/// the first and only answer, never a `100 Continue` followed by a closed
/// connection; every time, not most times.
#[tokio::test]
async fn a_declared_body_over_the_limit_gets_413_before_any_100_continue() {
    let served = serve_offline(&[]).await;
    let declared = 7 * 1024 * 1024 + 1;
    for attempt in 0..20 {
        let mut tls = common::tls_connect(&served, &["http/1.1"]).await;
        let head = format!(
            "POST /mutate HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
             content-length: {declared}\r\nexpect: 100-continue\r\n\r\n"
        );
        tls.write_all(head.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        let mut buf = [0u8; 4096];
        while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = tokio::time::timeout(Duration::from_secs(30), tls.read(&mut buf))
                .await
                .expect("an answer without sending the body")
                .unwrap();
            assert!(n > 0, "attempt {attempt}: closed after {answer:?}");
            answer.extend_from_slice(&buf[..n]);
        }
        let text = String::from_utf8_lossy(&answer);
        assert!(
            text.starts_with("HTTP/1.1 413"),
            "attempt {attempt}: {text}"
        );
    }
    assert_eq!(post_json(&served, node_create("after")).await.status, 200);
    let refused = served
        .log_lines()
        .into_iter()
        .filter(|l| {
            l["message"] == "webhook request refused"
                && l["error"] == "body too large"
                && l["content_length"] == declared
        })
        .count();
    assert_eq!(refused, 20, "{}", served.log());
}

#[tokio::test]
async fn h2_is_negotiated_and_served() {
    let served = serve_offline(&[]).await;
    let reply = https_h2(&served, node_create("over-h2")).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["response"]["patchType"], "JSONPatch");
}

#[tokio::test]
async fn plain_http_on_the_tls_port_gets_a_readable_refusal() {
    let served = serve_offline(&[]).await;
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", served.webhook_port))
        .await
        .unwrap();
    tcp.write_all(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\n\r\n{}")
        .await
        .unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(5), tcp.read_to_string(&mut answer))
        .await
        .expect("the server closes the connection")
        .unwrap();
    assert!(answer.starts_with("HTTP/1.0 400 Bad Request"), "{answer}");
    assert!(
        answer.ends_with("Client sent an HTTP request to an HTTPS server.\n"),
        "{answer}"
    );
    // Garbage that is neither TLS nor HTTP: the connection just closes.
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", served.webhook_port))
        .await
        .unwrap();
    tcp.write_all(&[0x01, 0x02, 0x03, 0x04, 0x05, 0x06])
        .await
        .unwrap();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(15), tcp.read_to_end(&mut rest))
        .await
        .expect("the server closes the connection");
    assert!(
        read.is_err() || !rest.starts_with(b"HTTP"),
        "no HTTP answer to garbage: {rest:?}"
    );
    assert_eq!(post_json(&served, node_create("after")).await.status, 200);
}

#[tokio::test]
async fn a_client_that_does_not_trust_the_ca_cannot_complete_the_handshake() {
    let served = serve_offline(&[]).await;
    let other = tempfile::tempdir().unwrap();
    make_certs(other.path());
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", served.webhook_port))
        .await
        .unwrap();
    let err = common::tls_connector(&std::fs::read(other.path().join("ca.crt")).unwrap(), &[])
        .connect(
            rustls_pki_types::ServerName::try_from("localhost").unwrap(),
            tcp,
        )
        .await
        .expect_err("a certificate from another CA is not trusted");
    // Both CAs share a name, so rustls finds the issuer and the signature fails.
    assert!(
        err.to_string().contains("invalid peer certificate"),
        "{err}"
    );
}

#[tokio::test]
async fn a_slow_body_times_out_with_408_within_the_request_timeout() {
    let served = serve_offline(&["--request-timeout=1s"]).await;
    let mut tls = common::tls_connect(&served, &["http/1.1"]).await;
    tls.write_all(
        b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"apiVersion\"",
    )
    .await
    .unwrap();
    let started = Instant::now();
    let mut answer = vec![0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(5), tls.read(&mut answer))
        .await
        .expect("answered before the API server's timeout")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn metrics_count_requests_by_code_latency_in_flight_and_mutations() {
    let served = serve_offline(&[]).await;
    assert_eq!(post_json(&served, node_create("m1")).await.status, 200);
    assert_eq!(post_json(&served, node_create("m2")).await.status, 200);
    assert_eq!(post_json(&served, b"nope".to_vec()).await.status, 400);

    let (status, metrics) = http_get(served.admin_port, "/metrics").await.unwrap();
    assert_eq!(status, 200);
    for line in [
        "node_holder_webhook_requests_total{code=\"200\"} 2",
        "node_holder_webhook_requests_total{code=\"400\"} 1",
        "node_holder_webhook_latency_seconds_count 3",
        "node_holder_webhook_requests_in_flight 0",
        "node_holder_webhook_mutations_total 2",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} missing from\n{metrics}"
        );
    }
    assert!(metrics.contains("node_holder_webhook_latency_seconds_bucket{le="));
}

/// From SIGTERM on, each HTTP/1.1 response closes its connection (`Connection: close`): the
/// API server then drops a connection to a terminating replica at its next use instead of
/// pooling it for a call that would meet the close at the end of the grace. Only connections
/// left idle for the whole grace are closed then.
#[tokio::test]
async fn sigterm_turns_not_ready_serves_through_the_grace_closing_each_used_connection_then_drains()
{
    let cp = ControlPlane::start().await.unwrap();
    // Long enough that the grace cannot end while the requests below run, however busy the
    // machine: each step waits for its condition, none for the grace.
    let mut served = serve(&cp, &["--shutdown-grace=15s"]).await;
    let create = |name: &str| {
        request(
            "POST",
            "/mutate",
            Some("application/json"),
            node_create(name),
        )
    };
    let mut used = Http1::connect(&served).await;
    let mut idle = Http1::connect(&served).await;
    for connection in [&mut used, &mut idle] {
        let reply = connection.send(create("before")).await.unwrap();
        assert_eq!(reply.status, 200);
        assert_eq!(
            reply.headers.get("connection"),
            None,
            "keep-alive before SIGTERM"
        );
    }

    served.terminate();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Ok((503, _)) = http_get(served.admin_port, "/readyz").await {
            break;
        }
        assert!(Instant::now() < deadline, "still ready after SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // During the grace an open connection is served once more and then closed by the server.
    let reply = used.send(create("k2")).await.unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.headers.get("connection").map(|v| v.as_bytes()),
        Some(&b"close"[..])
    );
    let closed = tokio::time::timeout(Duration::from_secs(10), used.connection)
        .await
        .expect("the connection used during the grace is closed after its response");
    assert!(closed.unwrap().is_ok());
    // The grace has not ended: a new connection is still served, and closed the same way.
    let reply = post_json(&served, node_create("k3")).await;
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.headers.get("connection").map(|v| v.as_bytes()),
        Some(&b"close"[..])
    );
    assert!(
        !idle.connection.is_finished(),
        "an idle connection is closed only after the grace"
    );

    // After the grace the server closes the idle keep-alive connection and exits 0.
    let closed = tokio::time::timeout(Duration::from_secs(30), idle.connection)
        .await
        .expect("the idle keep-alive connection is closed by the server");
    let closed = closed.unwrap();
    assert!(closed.is_ok(), "{closed:?}");
    let exit = wait_exit(&mut served, Duration::from_secs(10));
    assert_eq!(exit.code(), Some(0), "{}", served.log());
    let log = served.log();
    assert!(log.contains("SIGTERM received"), "{log}");
    assert!(log.contains("all webhook connections drained"), "{log}");
}

fn wait_exit(served: &mut Served, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = served.child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "node-holder did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `serve` with the given certificate and key paths; it must refuse to start.
fn refused_start(cert: &std::path::Path, key: &std::path::Path) -> String {
    common::refused_start(cert, key, &[])
}

#[test]
fn serve_refuses_to_start_without_a_usable_certificate_and_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good");
    let other = dir.path().join("other");
    make_certs(&good);
    make_certs(&other);
    let (cert, key) = (good.join("tls.crt"), good.join("tls.key"));
    let missing = dir.path().join("missing.crt");
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate\n").unwrap();

    let stderr = refused_start(&missing, &key);
    assert!(
        stderr.contains(&format!(
            "reading certificate file {}: No such file",
            missing.display()
        )),
        "{stderr}"
    );
    let stderr = refused_start(&cert, &dir.path().join("missing.key"));
    assert!(stderr.contains("reading key file"), "{stderr}");
    let stderr = refused_start(dir.path(), &key);
    assert!(
        stderr.contains(&format!(
            "reading certificate file {}",
            dir.path().display()
        )),
        "a directory is not readable as a file: {stderr}"
    );
    let stderr = refused_start(&garbage, &key);
    assert!(
        stderr.contains(&format!(
            "certificate file {} holds no certificate",
            garbage.display()
        )),
        "{stderr}"
    );
    let stderr = refused_start(&cert, &garbage);
    assert!(
        stderr.contains(&format!(
            "key file {} holds no PEM private key",
            garbage.display()
        )),
        "{stderr}"
    );
    let stderr = refused_start(&cert, &other.join("tls.key"));
    assert!(
        stderr.contains("does not belong to certificate file"),
        "{stderr}"
    );
}

/// A minimal ClientHello of TLS `minor` version (1 = TLS 1.0, 2 = TLS 1.1)
/// with one cipher suite and no extensions, as an old client sends it.
fn old_client_hello(minor: u8) -> Vec<u8> {
    let mut body = vec![3, minor];
    body.extend([0u8; 32]); // random
    body.push(0); // session id
    body.extend([0, 2, 0xc0, 0x13]); // TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA
    body.extend([1, 0]); // no compression
    let mut handshake = vec![1, 0, 0, body.len() as u8];
    handshake.extend(body);
    let mut record = vec![0x16, 3, 1, 0, handshake.len() as u8];
    record.extend(handshake);
    record
}

#[tokio::test]
async fn tls_1_0_and_1_1_are_refused_with_a_fatal_alert_and_counted() {
    let served = serve_offline(&[]).await;
    for minor in [1u8, 2] {
        let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", served.webhook_port))
            .await
            .unwrap();
        tcp.write_all(&old_client_hello(minor)).await.unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut answer))
            .await
            .expect("the server answers and closes")
            .ok();
        // An alert record, fatal (2): rustls answers handshake_failure (40).
        assert!(answer.len() >= 7, "TLS 1.{}: {answer:?}", minor - 1);
        assert_eq!(answer[0], 0x15, "an alert record: {answer:?}");
        assert_eq!(
            &answer[5..7],
            &[2, 40],
            "fatal handshake_failure: {answer:?}"
        );
    }
    let (_, metrics) = http_get(served.admin_port, "/metrics").await.unwrap();
    assert!(
        metrics.lines().any(
            |l| l == "node_holder_tls_handshake_errors_total{reason=\"incompatible-client\"} 2"
        ),
        "{metrics}"
    );
    assert_eq!(post_json(&served, node_create("after")).await.status, 200);
}

#[tokio::test]
async fn connections_beyond_the_limit_wait_until_one_closes() {
    let served = serve_offline(&["--max-connections=1"]).await;
    let mut first = Http1::connect(&served).await;
    let reply = first
        .send(request(
            "POST",
            "/mutate",
            Some("application/json"),
            node_create("c1"),
        ))
        .await
        .unwrap();
    assert_eq!(reply.status, 200);
    // The second connection is accepted by the kernel but not served while
    // the first holds the only slot...
    let second = tokio::spawn({
        let body = node_create("c2");
        let port = served.webhook_port;
        let ca = served.ca_pem();
        async move {
            let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .unwrap();
            let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
            let tls = common::tls_connector(&ca, &["http/1.1"])
                .connect(name, tcp)
                .await
                .unwrap();
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                    .await
                    .unwrap();
            tokio::spawn(connection);
            let response = sender
                .send_request(request("POST", "/mutate", Some("application/json"), body))
                .await
                .unwrap();
            response.status().as_u16()
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!second.is_finished(), "served beyond the connection limit");
    // ...and is served once the first closes.
    drop(first);
    let status = tokio::time::timeout(Duration::from_secs(5), second)
        .await
        .expect("served after a slot freed")
        .unwrap();
    assert_eq!(status, 200);
}

#[tokio::test]
async fn idle_connections_are_closed_after_the_idle_timeout_silent_ones_included() {
    let served = serve_offline(&["--idle-timeout=2s"]).await;
    let idle = Duration::from_secs(2);
    // Well under the 10 s header timeout, so only the idle timeout explains it.
    let limit = Duration::from_secs(6);

    // A client that completes the handshake and then says nothing, on each
    // protocol: without a timeout on the first bytes it would keep its
    // connection slot forever.
    for alpn in ["http/1.1", "h2"] {
        // The lower bound's clock starts before the client's first step: the
        // server's idle clock cannot start earlier, whatever the scheduler
        // does to either side on a loaded machine.
        let opened = Instant::now();
        let mut tls = common::tls_connect(&served, &[alpn]).await;
        let mut buf = [0u8; 64];
        let closed = tokio::time::timeout(limit, async {
            // h2: the server's preface (SETTINGS) and its GOAWAY arrive
            // before the end of the stream.
            loop {
                match tls.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert!(
            closed.is_ok(),
            "{alpn}: silent connection still open after {limit:?}"
        );
        assert!(
            opened.elapsed() >= idle,
            "{alpn}: closed before the idle timeout"
        );
    }

    // An h2 connection that served a request and then idles gets a GOAWAY:
    // the client's connection ends without an error.
    let tls = common::tls_connect(&served, &["h2"]).await;
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tls),
    )
    .await
    .unwrap();
    let connection = tokio::spawn(connection);
    let mut req = request(
        "POST",
        "/mutate",
        Some("application/json"),
        node_create("idle"),
    );
    *req.uri_mut() = "https://localhost/mutate".parse().unwrap();
    // Taken before the request goes out: the server's idle clock starts when
    // it has answered, which the client may see later on a busy machine.
    let sent_at = Instant::now();
    let response = sender.send_request(req).await.unwrap();
    assert_eq!(response.status(), 200);
    let ended = tokio::time::timeout(limit, connection)
        .await
        .expect("the idle h2 connection was not closed");
    assert!(ended.unwrap().is_ok(), "closed gracefully");
    assert!(sent_at.elapsed() >= idle, "{:?}", sent_at.elapsed());

    // The server still serves new connections.
    assert_eq!(post_json(&served, node_create("after")).await.status, 200);
}

/// An HTTP/1.1 keep-alive connection that served a request stays open until `--idle-timeout`,
/// past the 10 s a request's head has from its first byte: hyper's own header timeout, which
/// runs from the last response, closed such connections after 10 s while the API server (90 s)
/// still pooled them, and a call written into that close failed open.
#[tokio::test]
async fn an_http1_connection_idle_after_a_request_stays_open_until_the_idle_timeout() {
    let idle = Duration::from_secs(15);
    let served = serve_offline(&["--idle-timeout=15s"]).await;
    let mut connection = Http1::connect(&served).await;
    // Before the request: the server's idle clock starts after its answer, never earlier.
    let sent_at = Instant::now();
    let create = request(
        "POST",
        "/mutate",
        Some("application/json"),
        node_create("kept"),
    );
    assert_eq!(connection.send(create).await.unwrap().status, 200);
    let ended = tokio::time::timeout(idle * 2, connection.connection)
        .await
        .expect("the idle connection is closed after the idle timeout");
    let ended = ended.unwrap();
    assert!(
        ended.is_ok(),
        "closed gracefully (TLS close_notify): {ended:?}"
    );
    assert!(
        sent_at.elapsed() >= idle,
        "closed after {:?}",
        sent_at.elapsed()
    );
}

/// Window flags a pass could not honour are refused at start, by name:
/// a zero hold, holds past a year (a typo, not a plan; deadlines would only
/// saturate at the end of time), a lease too short to renew.
#[test]
fn serve_refuses_window_flags_it_cannot_honour_and_names_them() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    for (flag, said) in [
        (
            "--hold-duration=0s",
            "--hold-duration must be longer than 0",
        ),
        (
            "--hold-duration=400000000y",
            "--hold-duration 400000000years is longer than a hold may last (1year)",
        ),
        (
            "--max-hold=2y",
            "--max-hold 2years is longer than a hold may last (1year)",
        ),
        (
            "--lease-duration=1s",
            "--lease-duration must be at least 2s",
        ),
    ] {
        let stderr = common::refused_start(&cert, &key, &[flag.to_string()]);
        assert!(stderr.contains(said), "{flag}: {stderr}");
    }
}
