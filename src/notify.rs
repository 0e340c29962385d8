//! The service manager's notification protocol (`sd_notify(3)`): one datagram per message to
//! the socket `NOTIFY_SOCKET` names (a path, or `@name` in the abstract namespace). Without
//! the variable every call is a no-op, so `serve` runs the same under any supervisor.
//!
//! `serve` says `READY=1` once its listeners and pools are up, `STOPPING=1` and `STATUS=` lines
//! while it drains, `EXTEND_TIMEOUT_USEC=` so a long drain never runs into the unit's stop
//! timeout, and `WATCHDOG=1` (when the unit sets `WatchdogSec=`) while its core actors live.

use std::{os::unix::net::UnixDatagram, time::Duration};

/// Where notifications go, if anywhere.
#[derive(Debug)]
pub struct Notifier {
    target: Option<(UnixDatagram, String)>,
}

impl Notifier {
    /// From `NOTIFY_SOCKET`; a no-op notifier without it (or when it cannot be used, logged).
    pub fn from_env() -> Notifier {
        let target = std::env::var("NOTIFY_SOCKET")
            .ok()
            .filter(|s| !s.is_empty())
            .and_then(|addr| match UnixDatagram::unbound() {
                Ok(socket) => Some((socket, addr)),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot open a socket for NOTIFY_SOCKET");
                    None
                }
            });
        Notifier { target }
    }

    /// Whether a service manager listens.
    pub fn enabled(&self) -> bool {
        self.target.is_some()
    }

    /// Sends one message (`KEY=value` lines); failures are logged, never fatal.
    pub fn send(&self, message: &str) {
        let Some((socket, addr)) = &self.target else {
            return;
        };
        let sent = match addr.strip_prefix('@') {
            Some(name) => send_abstract(socket, name, message),
            None => socket.send_to(message.as_bytes(), addr).map(drop),
        };
        if let Err(e) = sent {
            tracing::debug!(error = %e, "cannot notify the service manager");
        }
    }

    /// The watchdog interval the unit asked for (`WATCHDOG_USEC`, for this process).
    pub fn watchdog() -> Option<Duration> {
        let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
        if let Ok(pid) = std::env::var("WATCHDOG_PID")
            && pid.parse::<u32>().ok()? != std::process::id()
        {
            return None;
        }
        (usec > 0).then(|| Duration::from_micros(usec))
    }
}

/// To a socket in Linux's abstract namespace (`@name`, as systemd sets it).
#[cfg(target_os = "linux")]
fn send_abstract(socket: &UnixDatagram, name: &str, message: &str) -> std::io::Result<()> {
    use std::os::linux::net::SocketAddrExt;
    std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
        .and_then(|a| socket.send_to_addr(message.as_bytes(), &a))
        .map(drop)
}

/// Other systems have no abstract namespace (launchd sets no `NOTIFY_SOCKET`): an `@name`
/// there is an error, logged like any failed notification.
#[cfg(not(target_os = "linux"))]
fn send_abstract(_socket: &UnixDatagram, name: &str, _message: &str) -> std::io::Result<()> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        format!("NOTIFY_SOCKET @{name}: this OS has no abstract socket namespace"),
    ))
}
