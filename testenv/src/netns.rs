//! A second host for tests: a network namespace joined to this one by a veth
//! pair, so that the API server reaches a webhook at a pod-like address
//! instead of loopback (the Service path: Service, EndpointSlice, endpoint
//! address).
//!
//! Addresses: each pair gets its own /30 of `10.213.0.0/16`, the host side
//! `.1`, the namespace side `.2` (`10.213.0.1/30` and `10.213.0.2/30`, then
//! `10.213.0.5/30` and `10.213.0.6/30`, ...). Only those two addresses and
//! loopback are ever used. The /30 is chosen under a machine-wide file lock
//! and skips any /30 an interface already has an address in, so concurrent
//! test processes never share one.
//!
//! Names carry the owning process id (`testenv-<pid>-<n>` for the namespace,
//! `tev<pid>x<n>` for the host-side interface). Dropping a [`NetNs`] deletes
//! the namespace and the pair, also while a test panics; a pair left behind
//! by a process that was killed is deleted by the next [`NetNs::create`].
//!
//! Needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN) and `ip` from iproute2.

use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, Result, bail};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The first two octets of every address this module assigns.
const PREFIX: [u8; 2] = [10, 213];
/// Network namespace names start with this, then `<pid>-<n>`.
const NETNS_PREFIX: &str = "testenv-";
/// Host-side interface names start with this, then `<pid>x<n>` (at most 15
/// characters in all, the kernel's limit).
const LINK_PREFIX: &str = "tev";

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A network namespace with one veth pair to the host. Dropping it deletes
/// both.
pub struct NetNs {
    name: String,
    host_link: String,
    host_addr: Ipv4Addr,
    ns_addr: Ipv4Addr,
}

impl NetNs {
    /// Creates the namespace and the pair, assigns a free /30 of
    /// `10.213.0.0/16` and brings both ends (and the namespace's loopback) up.
    pub fn create() -> Result<Self> {
        let pid = std::process::id();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("{NETNS_PREFIX}{pid}-{n}");
        let host_link = format!("{LINK_PREFIX}{pid}x{n}");
        let ns_link = format!("{LINK_PREFIX}{pid}y{n}");
        if host_link.len() > 15 {
            bail!("interface name {host_link} is longer than 15 characters");
        }

        // Choosing the /30 and assigning it is one step for every process on
        // the machine: two concurrent tests never pick the same subnet.
        let lock_path = std::env::temp_dir().join("testenv-netns.lock");
        let lock = File::create(&lock_path)
            .with_context(|| format!("creating {}", lock_path.display()))?;
        lock.lock()
            .with_context(|| format!("locking {}", lock_path.display()))?;
        remove_orphans();
        let [host_addr, ns_addr] = free_subnet()?;

        ip(&["netns", "add", &name])?;
        // From here on, the namespace exists: Drop cleans up whatever
        // follows, even if a step fails.
        let netns = NetNs {
            name,
            host_link,
            host_addr,
            ns_addr,
        };
        ip(&[
            "link",
            "add",
            &netns.host_link,
            "type",
            "veth",
            "peer",
            "name",
            &ns_link,
            "netns",
            &netns.name,
        ])?;
        ip(&[
            "addr",
            "add",
            &format!("{host_addr}/30"),
            "dev",
            &netns.host_link,
        ])?;
        ip(&["link", "set", &netns.host_link, "up"])?;
        netns.exec_ip(&["addr", "add", &format!("{ns_addr}/30"), "dev", &ns_link])?;
        netns.exec_ip(&["link", "set", &ns_link, "up"])?;
        netns.exec_ip(&["link", "set", "lo", "up"])?;
        drop(lock);
        Ok(netns)
    }

    /// The namespace's name (`ip netns exec NAME ...`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The host side's address, reachable from inside the namespace.
    pub fn host_addr(&self) -> Ipv4Addr {
        self.host_addr
    }

    /// The namespace side's address, reachable from the host.
    pub fn ns_addr(&self) -> Ipv4Addr {
        self.ns_addr
    }

    /// A command that runs `program` inside the namespace. `ip netns exec`
    /// execs the program in place, so the child's pid is the program's and
    /// killing the child kills it.
    pub fn command(&self, program: impl AsRef<Path>) -> Command {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.name])
            .arg(program.as_ref());
        command
    }

    fn exec_ip(&self, args: &[&str]) -> Result<()> {
        let mut full = vec!["-n", &self.name];
        full.extend_from_slice(args);
        ip(&full)
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        // Deleting the namespace destroys the end inside it, and with it the
        // pair; the host end is deleted too in case a process still holds
        // the namespace open.
        let _ = quiet_ip(&["netns", "del", &self.name]);
        let _ = quiet_ip(&["link", "del", &self.host_link]);
    }
}

/// Runs `ip` with `args`; fails with its error output.
fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running `ip` (iproute2; the Service-path tests need root)")?;
    if !out.status.success() {
        bail!(
            "`ip {}` failed with {}: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn quiet_ip(args: &[&str]) -> std::io::Result<std::process::ExitStatus> {
    Command::new("ip")
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
}

/// Deletes the namespaces and host-side links of test processes that are
/// gone (killed before their Drop ran).
fn remove_orphans() {
    let dead = |pid: &str| pid.parse::<i32>().is_ok_and(|pid| !process_exists(pid));
    // `ip netns list`: one namespace a line, `NAME` or `NAME (id: N)`.
    for line in ip_output(&["netns", "list"]).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        if let Some(rest) = name.strip_prefix(NETNS_PREFIX)
            && let Some((pid, _)) = rest.split_once('-')
            && dead(pid)
        {
            let _ = quiet_ip(&["netns", "del", name]);
        }
    }
    // `ip -o link show`: `INDEX: NAME[@PEER]: <FLAGS> ...`.
    for line in ip_output(&["-o", "link", "show"]).lines() {
        let Some(name) = line
            .split(": ")
            .nth(1)
            .map(|n| n.split('@').next().unwrap_or(n))
        else {
            continue;
        };
        if let Some(rest) = name.strip_prefix(LINK_PREFIX)
            && let Some((pid, _)) = rest.split_once(['x', 'y'])
            && dead(pid)
        {
            let _ = quiet_ip(&["link", "del", name]);
        }
    }
}

/// `ip`'s standard output, empty if it fails.
fn ip_output(args: &[&str]) -> String {
    Command::new("ip")
        .args(args)
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
        .unwrap_or_default()
}

/// Whether a process `pid` exists (signal 0 checks without sending).
fn process_exists(pid: i32) -> bool {
    // SAFETY: kill with signal 0 sends nothing; it only reports whether the
    // process exists and may be signalled.
    let result = unsafe { libc::kill(pid, 0) };
    result == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// The host and namespace addresses of the first /30 of `10.213.0.0/16` in
/// which no interface of the host has an address.
fn free_subnet() -> Result<[Ipv4Addr; 2]> {
    let out = Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .output()
        .context("running `ip -o -4 addr show`")?;
    if !out.status.success() {
        bail!(
            "`ip -o -4 addr show` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let taken: Vec<Ipv4Addr> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            words.find(|w| *w == "inet")?;
            words.next()?.split('/').next()?.parse().ok()
        })
        .collect();
    for index in 0..(1u32 << 14) {
        let base = u32::from(Ipv4Addr::new(PREFIX[0], PREFIX[1], 0, 0)) + index * 4;
        if taken.iter().any(|a| u32::from(*a) & !3 == base) {
            continue;
        }
        return Ok([Ipv4Addr::from(base + 1), Ipv4Addr::from(base + 2)]);
    }
    bail!("every /30 of 10.213.0.0/16 is in use")
}

/// A TCP relay on a host address that forwards each connection to a
/// loopback address: lets a process inside a namespace reach a server that
/// listens on loopback only (the test API server) without that server
/// listening on any other interface. Stops when dropped.
pub struct Relay {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Relay {
    /// Listens on `listen` (port 0: any free port) and forwards every
    /// connection to `target`, byte for byte (TLS passes through untouched).
    pub async fn start(listen: SocketAddr, target: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding the relay on {listen}"))?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Ok(Relay { addr, task })
    }

    /// Where the relay listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}
