//! Loopback ports for the processes a test starts, reserved for the life of
//! the test's process.
//!
//! A port is drawn at random from below the kernel's ephemeral range: a port
//! the kernel hands out for a probe is just as likely to be handed next to an
//! outgoing connection (any client on the machine), which then holds it when
//! the caller's child binds it ("Address already in use"). Below that range
//! only a process that names the port can take it.
//!
//! Probing that a port is free is not enough: between the probe and the
//! child's bind (seconds, for a kube-apiserver on a busy machine) another
//! test's probe finds the same port free too, and one of the two children
//! fails to bind (seen in a cold run: `node-holder serve` lost its admin port
//! to another test's process). So each port handed out is also reserved: a
//! lock file per port in one directory that every test process shares, held
//! (`flock`) until the process that took it exits, and skipped by every
//! other draw, in that process too.

use std::fs::{self, File};
use std::net::TcpListener;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{Context, Result};

/// The reservations this process holds: each lock lasts until it exits.
static RESERVED: Mutex<Vec<File>> = Mutex::new(Vec::new());

/// A loopback port free right now and reserved for this process (for a
/// process the caller starts).
pub fn free_port() -> Result<u16> {
    Ok(free_ports::<1>()?[0])
}

/// `N` different loopback ports, each free right now and reserved for this
/// process. On a host whose ephemeral range leaves too few ports below it,
/// the kernel picks the candidates, as it always did.
pub(crate) fn free_ports<const N: usize>() -> Result<[u16; N]> {
    let range = ports_outside_ephemeral_range()?;
    let dir = reservations_dir()?;
    let candidate = || -> Option<u16> {
        let Some(range) = &range else {
            let probe = TcpListener::bind("127.0.0.1:0").ok()?;
            return Some(probe.local_addr().ok()?.port());
        };
        Some(fastrand::u16(range.clone()))
    };
    let mut ports = [0; N];
    for port in &mut ports {
        *port = (0..1000)
            .find_map(|_| reserve(&dir, candidate()?))
            .with_context(|| format!("no free loopback port (of {range:?}) after 1000 tries"))?;
    }
    Ok(ports)
}

/// Reserves `port` when no test process holds it and nothing is bound to it.
fn reserve(dir: &Path, port: u16) -> Option<u16> {
    let lock = File::create(dir.join(port.to_string())).ok()?;
    // Held by a test process (this one included), or unlockable: not this port.
    lock.try_lock().ok()?;
    // Bound by something outside the tests: the lock goes with `lock`.
    drop(TcpListener::bind(("127.0.0.1", port)).ok()?);
    RESERVED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(lock);
    Some(port)
}

/// The directory of the reservations, shared by every test process of the
/// machine (concurrent suites of different checkouts included).
fn reservations_dir() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join("testenv-ports");
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// Ports from 20000 up to the kernel's ephemeral range or Kubernetes'
/// NodePort range (30000), whichever starts first; `None` when that leaves
/// fewer than 1000.
fn ports_outside_ephemeral_range() -> Result<Option<Range<u16>>> {
    let path = "/proc/sys/net/ipv4/ip_local_port_range";
    let text = fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    let ephemeral_low: u16 = text
        .split_whitespace()
        .next()
        .and_then(|low| low.parse().ok())
        .with_context(|| format!("{path} reads {text:?}"))?;
    let range = 20000..ephemeral_low.min(30000);
    Ok((range.len() >= 1000).then_some(range))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_differ_are_bindable_and_lie_below_the_ephemeral_range() {
        let range = ports_outside_ephemeral_range().unwrap();
        let ports = free_ports::<3>().unwrap();
        for port in ports {
            assert!(
                range.as_ref().is_none_or(|range| range.contains(&port)),
                "{port} outside {range:?}"
            );
            TcpListener::bind(("127.0.0.1", port)).unwrap();
        }
        assert!(ports[0] != ports[1] && ports[1] != ports[2] && ports[0] != ports[2]);
    }

    #[test]
    fn a_reserved_port_is_never_handed_out_again_while_its_holder_lives() {
        let dir = reservations_dir().unwrap();
        let port = free_port().unwrap();
        // Another process's draw (here: another open file, which `flock`
        // treats the same) finds the port taken.
        assert_eq!(reserve(&dir, port), None);
        // However often this process draws again, the port is not among them.
        let again: Vec<u16> = (0..200).map(|_| free_port().unwrap()).collect();
        assert!(!again.contains(&port), "{port} handed out twice");
    }
}
