//! The namespace the fault suite partitions a site in: reachable over its veth link,
//! cut off (silently, no reset) when the link is down, reachable again when it is up,
//! and gone after drop.

use std::net::SocketAddr;
use std::time::Duration;

use grid_kit::netns::Netns;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

const BOUND: Duration = Duration::from_secs(2);

/// An echo server inside `ns`, on its end of the link.
async fn echo_inside(ns: &Netns) -> SocketAddr {
    let ip = ns.ns_addr();
    ns.handle()
        .spawn(async move {
            let listener = TcpListener::bind((ip, 0)).await.unwrap();
            let addr = listener.local_addr().unwrap();
            tokio::spawn(async move {
                for _ in 0..16 {
                    let Ok((mut s, _)) = listener.accept().await else {
                        return;
                    };
                    tokio::spawn(async move {
                        let mut buf = [0u8; 64];
                        while let Ok(n) = s.read(&mut buf).await {
                            if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    });
                }
            });
            addr
        })
        .await
        .unwrap()
}

async fn round_trip(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 4];
    s.write_all(b"ping").await.is_ok()
        && matches!(
            tokio::time::timeout(BOUND, s.read_exact(&mut buf)).await,
            Ok(Ok(4))
        )
}

async fn connects(addr: SocketAddr) -> bool {
    matches!(
        tokio::time::timeout(BOUND, TcpStream::connect(addr)).await,
        Ok(Ok(_))
    )
}

fn namespaces() -> String {
    String::from_utf8(
        std::process::Command::new("ip")
            .args(["netns", "list"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_is_reached_over_its_link_cut_off_silently_when_it_is_down_and_removed_on_drop()
{
    let ns = Netns::create().expect("root with iproute2, as here and in CI");
    let (name, veth) = (ns.name().to_owned(), ns.host_interface().to_owned());
    assert!(namespaces().contains(&name));
    let addr = echo_inside(&ns).await;
    assert_eq!(std::net::IpAddr::V4(ns.ns_addr()), addr.ip());

    let mut open = TcpStream::connect(addr).await.unwrap();
    assert!(round_trip(&mut open).await, "the link carries traffic");

    ns.set_link(false).unwrap();
    assert!(!connects(addr).await, "a down link takes no connection");
    let mut buf = [0u8; 4];
    open.write_all(b"ping").await.unwrap();
    let heard = tokio::time::timeout(BOUND, open.read(&mut buf)).await;
    assert!(
        heard.is_err(),
        "an open connection hears nothing, not a reset: {heard:?}"
    );

    ns.set_link(true).unwrap();
    assert!(connects(addr).await, "the link carries traffic again");

    drop(open);
    drop(ns);
    assert!(!namespaces().contains(&name), "{}", namespaces());
    let link = std::process::Command::new("ip")
        .args(["link", "show", &veth])
        .output()
        .unwrap();
    assert!(!link.status.success(), "the veth pair {veth} went with it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_on_this_loopback_is_out_of_the_namespaces_reach() {
    let outside = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = outside.local_addr().unwrap();
    let ns = Netns::create().unwrap();
    let reached = ns.handle().spawn(connects(addr)).await.unwrap();
    assert!(!reached, "127.0.0.1 inside is the namespace's own loopback");
    let host = SocketAddr::from((ns.host_addr(), 0));
    let on_link = TcpListener::bind(host).await.unwrap();
    let on_link = on_link.local_addr().unwrap();
    assert!(
        ns.handle().spawn(connects(on_link)).await.unwrap(),
        "the outside end of the link is"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_made_side_by_side_get_links_of_their_own() {
    let made: Vec<Netns> = (0..3).map(|_| Netns::create().unwrap()).collect();
    let mut links: Vec<_> = made.iter().map(|n| (n.host_addr(), n.ns_addr())).collect();
    links.sort();
    links.dedup();
    assert_eq!(links.len(), 3, "{links:?}");
    for ns in &made {
        let addr = echo_inside(ns).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        assert!(
            round_trip(&mut s).await,
            "{} answers over its own link",
            ns.name()
        );
    }
}
