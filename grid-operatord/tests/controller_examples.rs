//! `grid-operatord controller` run as the example manifests deploy it, against a real
//! kube-apiserver (`grid_kit::kube_cluster`): two sites, each in a namespace of its own
//! with `docs/examples/kubernetes/rbac.yaml` and `resources.yaml` applied as they are but
//! for the site's names, addresses, pins and EPP; each operator runs as the example's
//! `ServiceAccount`, with the signals listener on the unspecified address as the default
//! `--signals-listen 0.0.0.0:9443` binds it. With no `signalTransport` the grid gossips,
//! and each site advertises the host and port of its own `GridSite`.
//!
//! The listeners bind the unspecified address (what the default does, and what hid the
//! missing advertised host while every test bound 127.0.0.1); every packet of the test
//! goes to 127.0.0.1 all the same.

use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::Path;
use std::time::Duration;

use grid_daemon::tls::Fingerprint;
use grid_kit::daemon_process::Daemon;
use grid_kit::epp_server::{Behaviour, FakeEpp};
use grid_kit::kube_cluster::{KubeTest, repo_dir};
use grid_kit::operator_harness::{Grid, Site, epp_body, eventually, get_signals};

/// The fingerprints the example pins, for sites a and b.
const EXAMPLE_PIN_A: &str = "5C:62:0B:E4:19:A7:3D:88:F1:06:C2:7B:94:DE:21:53:0A:BF:67:E8:3C:15:A9:72:D4:4E:81:B6:2F:C0:98:1D";
const EXAMPLE_PIN_B: &str = "3A:1F:9C:00:5B:77:E2:41:0D:6C:8A:93:F4:12:BE:55:07:C9:2E:68:AB:31:D0:4F:96:7E:15:C3:88:2A:B6:F0";

/// A port free on 127.0.0.1 for both TCP and UDP (the signals listener and SWIM share it).
fn free_pair() -> u16 {
    for _ in 0..32 {
        let tcp = TcpListener::bind("0.0.0.0:0").unwrap();
        let port = tcp.local_addr().unwrap().port();
        if UdpSocket::bind(("0.0.0.0", port)).is_ok() {
            return port;
        }
    }
    panic!("no port free for both TCP and UDP in 32 tries");
}

/// `resources.yaml` for `site`'s namespace: the same text with the example's addresses,
/// pins and EPP replaced by this test's.
fn resources_for(ns: &str, ports: (u16, u16), pins: (&str, &str), epp: SocketAddr) -> String {
    let text = std::fs::read_to_string(repo_dir().join("docs/examples/kubernetes/resources.yaml"))
        .unwrap();
    text.replace("namespace: grid-site-a", &format!("namespace: {ns}"))
        .replace("grid-a.example.com:9443", &format!("127.0.0.1:{}", ports.0))
        .replace("grid-b.example.com:9443", &format!("127.0.0.1:{}", ports.1))
        .replace(EXAMPLE_PIN_A, pins.0)
        .replace(EXAMPLE_PIN_B, pins.1)
        .replace(
            "http://llama-epp.grid-site-a.svc:9090",
            &format!("http://{epp}"),
        )
}

fn spawn(site: &Site, k: &KubeTest, port: u16) -> Daemon {
    let d = site.dir.path();
    let path = |f: &str| d.join(f).to_str().unwrap().to_owned();
    let (cert, key, ca) = (path("site.crt"), path("site.key"), path("ca.crt"));
    let listen = format!("0.0.0.0:{port}");
    let identity = format!("pod-{}", site.name);
    Daemon::spawn_with_env(
        Path::new(env!("CARGO_BIN_EXE_grid-operatord")),
        &[
            "controller",
            "--namespace",
            &k.ns,
            "--site",
            &site.name,
            "--cert",
            &cert,
            "--key",
            &key,
            "--ca",
            &ca,
            "--signals-listen",
            &listen,
            "--metrics-listen",
            "127.0.0.1:0",
            "--identity",
            &identity,
        ],
        &[("KUBECONFIG", &k.operator_kubeconfig)],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_with_the_example_manifests_and_no_signal_transport_starts_and_gossips() {
    let grid = Grid::new();
    let (a, b) = (grid.site("a"), grid.site("b"));
    let pins = (
        Fingerprint::of_der(&a.cert.cert).to_string(),
        Fingerprint::of_der(&b.cert.cert).to_string(),
    );
    let ports = (free_pair(), free_pair());
    let (epp_a, epp_b) = (
        FakeEpp::start(Behaviour::Body(epp_body(2, 1.0))).await,
        FakeEpp::start(Behaviour::Body(epp_body(3, 1.0))).await,
    );
    let (ka, kb) = (KubeTest::start().await, KubeTest::start().await);
    for (k, epp) in [(&ka, &epp_a), (&kb, &epp_b)] {
        let resources = resources_for(&k.ns, ports, (&pins.0, &pins.1), epp.addr);
        assert!(
            !resources.contains("  signalTransport:\n"),
            "the example gossips"
        );
        k.kubectl(&["apply", "--server-side", "-f", "-"], Some(&resources))
            .await
            .unwrap();
    }
    let mut op_a = spawn(&a, &ka, ports.0);
    let mut op_b = spawn(&b, &kb, ports.1);
    for op in [&mut op_a, &mut op_b] {
        op.wait_for_line("operator started", Duration::from_secs(20));
    }
    // Each site's gateway reads the other site's provider from its own operator: it
    // crossed by gossip (versions over SWIM, the batch pulled over mutual TLS).
    for (site, port, other) in [(&a, ports.0, "b"), (&b, ports.1, "a")] {
        let local = SocketAddr::from(([127, 0, 0, 1], port));
        let gateway = grid.client(&site.cert, &site.name, &site.name);
        let needle = format!("grid_site=\"{other}\"");
        eventually(
            &format!("{other}'s provider at {}'s gateway", site.name),
            30,
            || {
                let gateway = gateway.clone();
                let needle = needle.clone();
                async move {
                    get_signals(local, gateway).await.is_ok_and(|f| {
                        String::from_utf8_lossy(&f.body)
                            .lines()
                            .any(|l| l.contains(&needle) && l.contains("grid_provider=\"llama\""))
                    })
                }
            },
        )
        .await;
    }
    for op in [&mut op_a, &mut op_b] {
        op.signal("TERM");
        let status = op.wait_exit(Duration::from_secs(15)).expect("it exits");
        assert!(status.success(), "{status:?}\n{}", op.seen.join("\n"));
        assert!(
            op.loud_lines().is_empty(),
            "a healthy run warned:\n{}",
            op.seen.join("\n")
        );
    }
}
