//! A network namespace joined to this one by a veth pair, with a tokio runtime whose
//! threads live inside it, so a site can run in-process yet behind a link the suite can
//! take down: the partition a WAN gives (packets dropped, no reset, no refusal), which a
//! relay on loopback can only imitate.
//!
//! Sockets belong to the namespace of the thread that creates them, and threads inherit
//! their creator's namespace; so everything spawned on [`Netns::handle`] (listeners,
//! connections, the blocking pool) lives in the namespace, and everything else stays
//! outside. The namespace is reached only at the veth's two addresses: traffic never
//! leaves the machine.
//!
//! Needs root and iproute2 (`ip netns`, veth). The namespace and both veth ends are
//! removed on drop.

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::Error;

/// Where the namespaces' /30 links are carved from (a private range, only ever on the
/// veth pairs this module creates).
pub const LINK_PREFIX: [u8; 2] = [10, 213];
/// How many /30 links fit under [`LINK_PREFIX`] (a /16).
pub const LINK_SLOTS: u16 = 1 << 14;
/// Held while a namespace's link is chosen and its outside address assigned.
pub const LINK_LOCK: &str = "/run/grid-netns.lock";
/// Worker threads of each namespace's runtime.
pub const NETNS_WORKERS: usize = 2;
/// How long the namespace's runtime is given to stop on drop.
pub const NETNS_STOP: Duration = Duration::from_secs(5);

static NEXT: AtomicU32 = AtomicU32::new(0);

/// One namespace, its veth link and its runtime.
#[derive(Debug)]
pub struct Netns {
    runtime: NsRuntime,
    ns_if: String,
    host_addr: Ipv4Addr,
    ns_addr: Ipv4Addr,
    /// Dropped last, after the runtime stopped: removes the namespace and the link.
    made: Made,
}

/// A tokio runtime whose threads live in a namespace; stopped (within [`NETNS_STOP`])
/// when dropped.
#[derive(Debug)]
pub struct NsRuntime {
    handle: tokio::runtime::Handle,
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl NsRuntime {
    /// Spawn on it what must live in the namespace.
    pub fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }

    /// Stops every thread of a single-threaded runtime for `d`, as `SIGSTOP` and
    /// `SIGCONT` `d` apart stop a process: nothing it runs makes progress (its timers
    /// included), while the kernel still completes handshakes into its listeners'
    /// backlogs. On a multi-threaded runtime only one worker would stop.
    pub fn freeze(&self, d: Duration) {
        drop(self.handle.spawn(async move { std::thread::sleep(d) }));
    }
}

impl Drop for NsRuntime {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What was made so far, removed on drop: a failed [`Netns::create`] leaves nothing.
#[derive(Debug)]
struct Made {
    name: String,
    host_if: String,
    /// The namespace the outside end lives in (`None`: this one).
    parent: Option<String>,
}

impl Drop for Made {
    fn drop(&mut self) {
        // Deleting the namespace destroys the inside end, and with it the pair; the
        // second command only matters when the inside end never got moved in.
        let _ = ip(&["netns", "del", &self.name]);
        let _ = ip(&in_parent(
            self.parent.as_deref(),
            &["link", "del", &self.host_if],
        ));
    }
}

/// `args` of `ip`, run in namespace `parent` when one is given (`ip -n <parent> ...`).
fn in_parent<'a>(parent: Option<&'a str>, args: &[&'a str]) -> Vec<&'a str> {
    let mut all = Vec::with_capacity(args.len() + 2);
    if let Some(p) = parent {
        all.extend_from_slice(&["-n", p]);
    }
    all.extend_from_slice(args);
    all
}

fn ip(args: &[&str]) -> Result<(), Error> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| Error::Request(format!("ip {}: {e}", args.join(" "))))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::Request(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// The first /30 under [`LINK_PREFIX`] no interface of namespace `parent` (`None`: this
/// one) has an address in: (outside end, inside end).
fn free_link(parent: Option<&str>) -> Result<(Ipv4Addr, Ipv4Addr), Error> {
    let out = Command::new("ip")
        .args(in_parent(parent, &["-4", "-o", "addr", "show"]))
        .output()
        .map_err(|e| Error::Request(format!("ip addr show: {e}")))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let prefix = format!("{}.{}.", LINK_PREFIX[0], LINK_PREFIX[1]);
    let used: std::collections::HashSet<u16> = text
        .split_whitespace()
        .filter_map(|w| w.strip_prefix(&prefix))
        .filter_map(|rest| {
            let addr = rest.split('/').next()?;
            let (third, fourth) = addr.split_once('.')?;
            let (third, fourth): (u16, u16) = (third.parse().ok()?, fourth.parse().ok()?);
            Some((third << 6) | (fourth >> 2))
        })
        .collect();
    let slot = (0..LINK_SLOTS)
        .find(|s| !used.contains(s))
        .ok_or_else(|| Error::Request(format!("every /30 under {prefix}0.0/16 is in use")))?;
    let (third, base) = ((slot >> 6) as u8, ((slot & 63) << 2) as u8);
    let at = |last| Ipv4Addr::new(LINK_PREFIX[0], LINK_PREFIX[1], third, last);
    Ok((at(base + 1), at(base + 2)))
}

/// Whether namespaces can be made here (root with iproute2), checked by making one.
pub fn available() -> bool {
    Netns::create().is_ok()
}

impl Netns {
    /// Creates a namespace unique to this process and call, its veth pair (one end
    /// inside, both up, a /30 between them) and its runtime.
    ///
    /// # Errors
    ///
    /// When `ip` fails (not root, no iproute2) or the runtime cannot start; whatever was
    /// made is removed again.
    pub fn create() -> Result<Self, Error> {
        Self::create_in(None)
    }

    /// [`Netns::create`], with the outside end of the link in namespace `parent` (`None`:
    /// this one): the new namespace is then reached from `parent` only, at
    /// [`Netns::ns_addr`], as a pod is reached from its node's other pods.
    ///
    /// # Errors
    ///
    /// As [`Netns::create`].
    pub fn create_in(parent: Option<&str>) -> Result<Self, Error> {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let name = format!("grid-{pid}-{n}");
        // Interface names are at most 15 bytes.
        let tag = format!("{:x}{n:x}", pid % 0x10_0000);
        let (host_if, ns_if) = (format!("gh{tag}"), format!("gn{tag}"));
        // The /30 is chosen and its outside address assigned under a machine-wide lock,
        // so two processes making namespaces at once never pick the same one.
        let lock = std::fs::File::create(LINK_LOCK)
            .and_then(|f| {
                rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive)?;
                Ok(f)
            })
            .map_err(|e| Error::Request(format!("{LINK_LOCK}: {e}")))?;
        let (host_addr, ns_addr) = free_link(parent)?;
        ip(&["netns", "add", &name])?;
        let mut made = Made {
            name,
            host_if,
            parent: None,
        };
        ip(&[
            "link",
            "add",
            &made.host_if,
            "type",
            "veth",
            "peer",
            "name",
            &ns_if,
        ])?;
        ip(&["link", "set", &ns_if, "netns", &made.name])?;
        if let Some(p) = parent {
            ip(&["link", "set", &made.host_if, "netns", p])?;
            made.parent = Some(p.to_owned());
        }
        let (host, ns) = (made.host_if.as_str(), ns_if.as_str());
        let outside = |args: &[&str]| ip(&in_parent(made.parent.as_deref(), args));
        outside(&["addr", "add", &format!("{host_addr}/30"), "dev", host])?;
        drop(lock);
        outside(&["link", "set", host, "up"])?;
        let inside = |args: &[&str]| {
            let mut all = vec!["netns", "exec", &made.name, "ip"];
            all.extend_from_slice(args);
            ip(&all)
        };
        inside(&["addr", "add", &format!("{ns_addr}/30"), "dev", ns])?;
        inside(&["link", "set", ns, "up"])?;
        inside(&["link", "set", "lo", "up"])?;
        let runtime = runtime_in(&made.name, Some(NETNS_WORKERS))?;
        Ok(Self {
            runtime,
            ns_if,
            host_addr,
            ns_addr,
            made,
        })
    }

    /// Another runtime in the namespace, on one thread (what [`NsRuntime::freeze`]
    /// stops whole): a process of its own, as far as its tasks can tell. It must be
    /// dropped before the namespace.
    ///
    /// # Errors
    ///
    /// When its thread cannot join the namespace or build the runtime.
    pub fn single_threaded(&self) -> Result<NsRuntime, Error> {
        runtime_in(&self.made.name, None)
    }
}

/// A runtime on a thread that joined namespace `name` before building it, so its
/// workers (created by that thread) live there too: `workers` of them, or the thread
/// itself for `None`.
fn runtime_in(name: &str, workers: Option<usize>) -> Result<NsRuntime, Error> {
    let path = format!("/run/netns/{name}");
    let file = std::fs::File::open(&path).map_err(|e| Error::Request(format!("{path}: {e}")))?;
    let (handle_tx, handle_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::Builder::new()
        .name(format!("netns-{name}"))
        .spawn(move || {
            use std::os::fd::AsFd as _;
            // setns(2): only this thread's network namespace (and that of the threads
            // it creates) changes.
            if let Err(e) = rustix::thread::move_into_link_name_space(
                file.as_fd(),
                Some(rustix::thread::LinkNameSpaceType::Network),
            ) {
                let _ = handle_tx.send(Err(e.to_string()));
                return;
            }
            drop(file);
            let built = match workers {
                Some(n) => tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(n)
                    .enable_all()
                    .build(),
                None => tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build(),
            };
            let runtime = match built {
                Ok(r) => r,
                Err(e) => {
                    let _ = handle_tx.send(Err(e.to_string()));
                    return;
                }
            };
            let _ = handle_tx.send(Ok(runtime.handle().clone()));
            if workers.is_some() {
                // Until dropped (or the owner is gone).
                let _ = stop_rx.recv();
            } else {
                // A current-thread runtime runs its tasks only inside block_on.
                runtime.block_on(async move {
                    let _ = tokio::task::spawn_blocking(move || stop_rx.recv()).await;
                });
            }
            runtime.shutdown_timeout(NETNS_STOP);
        })
        .map_err(|e| Error::Request(format!("netns thread: {e}")))?;
    let handle = handle_rx
        .recv()
        .map_err(|_| Error::Request("netns thread ended".into()))?
        .map_err(|e| Error::Request(format!("netns runtime: {e}")))?;
    Ok(NsRuntime {
        handle,
        stop: Some(stop_tx),
        thread: Some(thread),
    })
}

impl Netns {
    /// Its name, as `ip netns list` shows it.
    pub fn name(&self) -> &str {
        &self.made.name
    }

    /// The veth end outside, by name.
    pub fn host_interface(&self) -> &str {
        &self.made.host_if
    }

    /// A runtime whose threads live in the namespace: spawn on it what must.
    pub fn handle(&self) -> &tokio::runtime::Handle {
        self.runtime.handle()
    }

    /// The veth end outside, as seen from inside.
    pub fn host_addr(&self) -> Ipv4Addr {
        self.host_addr
    }

    /// The veth end inside, as seen from outside.
    pub fn ns_addr(&self) -> Ipv4Addr {
        self.ns_addr
    }

    /// Takes the inside end of the link down (`false`) or up again. Down, the outside
    /// end loses its carrier: packets either way are dropped with no reset or refusal,
    /// as on a partitioned WAN, and open connections simply hear nothing.
    ///
    /// # Errors
    ///
    /// When `ip` fails.
    pub fn set_link(&self, up: bool) -> Result<(), Error> {
        ip(&[
            "netns",
            "exec",
            &self.made.name,
            "ip",
            "link",
            "set",
            &self.ns_if,
            if up { "up" } else { "down" },
        ])
    }
}

/// The address block of a [`Lan`]: it exists only on the LAN's own veth ends, inside
/// its namespaces (a private range; never on this namespace's interfaces).
pub const LAN_PREFIX: [u8; 3] = [10, 214, 0];

/// Several namespaces on one switch: each site's namespace has one veth into a bridge
/// in a switch namespace of its own, so every site reaches every other at
/// `10.214.0.<i + 1>`, and nothing is reached from or routed to this namespace. Every
/// namespace and link is removed on drop; the sites' runtimes stop first.
#[derive(Debug)]
pub struct Lan {
    /// Each site: its namespace, address and runtime.
    pub sites: Vec<LanSite>,
    switch: String,
}

/// One namespace of a [`Lan`].
#[derive(Debug)]
pub struct LanSite {
    /// The namespace's name (`ip netns exec <name> ...` runs a program in it).
    pub name: String,
    /// Its address on the LAN.
    pub addr: Ipv4Addr,
    /// Its port on the switch (the veth end in the switch namespace).
    port: String,
    runtime: Option<NsRuntime>,
}

impl LanSite {
    /// A runtime whose threads live in the site's namespace.
    ///
    /// # Panics
    ///
    /// Never while the [`Lan`] lives.
    pub fn handle(&self) -> &tokio::runtime::Handle {
        self.runtime.as_ref().expect("a running namespace").handle()
    }
}

impl Lan {
    /// `n` site namespaces (at most 250) on a bridge, each with its loopback up.
    ///
    /// # Errors
    ///
    /// When `ip` fails (not root, no iproute2) or a runtime cannot start; whatever was
    /// made is removed again.
    pub fn create(n: usize) -> Result<Self, Error> {
        if n > 250 {
            return Err(Error::Request(format!(
                "{n} sites: a LAN holds at most 250"
            )));
        }
        sweep_stale_lans();
        let k = NEXT.fetch_add(1, Ordering::Relaxed);
        let tag = format!("{:x}{k:x}", std::process::id() % 0x10_0000);
        let switch = format!("grid-lan-{}-{k}", std::process::id());
        ip(&["netns", "add", &switch])?;
        let mut lan = Self {
            sites: Vec::with_capacity(n),
            switch,
        };
        let sw = lan.switch.clone();
        ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &sw, "link", "set", "br0", "up"])?;
        for i in 0..n {
            let name = format!("{sw}-{i}");
            ip(&["netns", "add", &name])?;
            // Names are at most 15 bytes; both ends are made here and moved at once.
            let (port, inside) = (format!("gl{tag}s{i}"), format!("gl{tag}n{i}"));
            let addr = Ipv4Addr::new(LAN_PREFIX[0], LAN_PREFIX[1], LAN_PREFIX[2], (i + 1) as u8);
            lan.sites.push(LanSite {
                name: name.clone(),
                addr,
                port: port.clone(),
                runtime: None,
            });
            ip(&[
                "link", "add", &port, "type", "veth", "peer", "name", &inside,
            ])?;
            ip(&["link", "set", &port, "netns", &sw])?;
            ip(&["link", "set", &inside, "netns", &name])?;
            ip(&["-n", &sw, "link", "set", &port, "master", "br0"])?;
            ip(&["-n", &sw, "link", "set", &port, "up"])?;
            ip(&[
                "-n",
                &name,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                &inside,
            ])?;
            ip(&["-n", &name, "link", "set", &inside, "up"])?;
            ip(&["-n", &name, "link", "set", "lo", "up"])?;
            lan.sites[i].runtime = Some(runtime_in(&name, Some(NETNS_WORKERS))?);
        }
        Ok(lan)
    }

    /// Takes site `i`'s port on the switch down (`false`) or up again: down, the site is
    /// partitioned from every other (packets dropped both ways, no reset, no refusal),
    /// while everything inside it (its API server on loopback) goes on.
    ///
    /// # Errors
    ///
    /// When `ip` fails.
    pub fn set_link(&self, i: usize, up: bool) -> Result<(), Error> {
        let port = &self.sites[i].port;
        ip(&[
            "-n",
            &self.switch,
            "link",
            "set",
            port,
            if up { "up" } else { "down" },
        ])
    }
}

/// Removes the LAN namespaces of earlier processes that are gone (a run killed before
/// its [`Lan`] was dropped): they are named `grid-lan-<pid>-...`.
fn sweep_stale_lans() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        let Some(pid) = name
            .strip_prefix("grid-lan-")
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", name]);
        }
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        for s in &mut self.sites {
            drop(s.runtime.take());
        }
        for s in &self.sites {
            let _ = ip(&["netns", "del", &s.name]);
        }
        let _ = ip(&["netns", "del", &self.switch]);
    }
}
