//! Helpers shared by the workspace's tests. Only ever a dev-dependency (or behind a crate's
//! `testing` feature).

pub mod tls;

use std::io;
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};

/// Lowest port handed out: below it live well-known services.
const LOWEST: u64 = 10_000;

/// A loopback TCP port nobody listens on, below the kernel's ephemeral range when it can.
///
/// A port the kernel picks (bind to 0) is from the range it also gives every outgoing
/// connection, so some client socket can take it before the server a test starts binds it
/// (CI saw etcd fail with "address already in use"). Ports below that range are only ever
/// taken by a listener that asks for one; each is handed out once per test process.
pub fn free_port() -> io::Result<u16> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<u64>().ok())
        .filter(|low| *low > LOWEST + 2_000 && *low <= 65_536);
    if let Some(low) = ephemeral_low {
        let span = low - LOWEST;
        // Processes start at different offsets so parallel test binaries rarely collide.
        let start = u64::from(std::process::id()).wrapping_mul(7_919) % span;
        for _ in 0..500 {
            let step = NEXT.fetch_add(1, Ordering::Relaxed);
            let port = LOWEST + (start + step.wrapping_mul(131)) % span;
            let port = u16::try_from(port).expect("below the ephemeral range");
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return Ok(port);
            }
        }
    }
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_bindable_and_below_the_ephemeral_range() {
        let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|t| t.split_whitespace().next()?.parse::<u16>().ok());
        let ports: Vec<u16> = (0..50).map(|_| free_port().expect("a port")).collect();
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len(), "a port was handed out twice");
        for port in ports {
            if let Some(low) = low.filter(|&low| u64::from(low) > LOWEST + 2_000) {
                assert!(port < low && u64::from(port) >= LOWEST, "port {port} out of range");
            }
            TcpListener::bind(("127.0.0.1", port)).expect("still free");
        }
    }
}
