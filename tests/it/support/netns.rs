//! Test hosts in network namespaces a test makes itself: a stand-in "internet" that a job's
//! namespace reaches through the host (as it would reach GitHub), at an address of a
//! documentation range (TEST-NET-2, 198.51.100.0/24: never anyone's, and not among the ranges
//! a job is denied) routed only to the test's namespace; or a host at any address the test
//! names (the metadata service's 169.254.169.254). Nothing is ever routed off this machine.
//!
//! A listener is bound inside a namespace by a thread that enters it and ends: the socket keeps
//! the namespace, the test serves it from anywhere.

use std::{
    net::Ipv4Addr,
    process::Command,
    sync::atomic::{AtomicU32, Ordering},
};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// An address is routed to one test host at a time: a test that makes the metadata service's
/// (169.254.169.254) holds this while it lives.
pub static METADATA: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A namespace of the test's, joined to the host by a veth pair.
#[derive(Debug)]
pub struct TestHost {
    name: String,
    /// The host side's interface.
    link: String,
    /// The address inside.
    pub addr: Ipv4Addr,
    /// The host side's address.
    pub gateway: Ipv4Addr,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl TestHost {
    /// A stand-in "internet" host at the next free /30 of TEST-NET-2; `None` (said loudly, a
    /// failure in CI) where namespaces cannot be made.
    pub fn internet() -> Option<TestHost> {
        let n = (std::process::id() * 7 + NEXT.fetch_add(1, Ordering::Relaxed)) % 64;
        let base = u32::from(Ipv4Addr::new(198, 51, 100, 0)) + n * 4;
        Self::at(
            &format!("eti{n}"),
            Ipv4Addr::from(base + 2),
            Ipv4Addr::from(base + 1),
            30,
        )
    }

    /// A host answering at `addr` (a /32 routed to it), its link named after `tag`.
    pub fn at_address(tag: &str, addr: Ipv4Addr) -> Option<TestHost> {
        // The host side borrows an address of TEST-NET-3 for the link.
        let n = (std::process::id() + NEXT.fetch_add(1, Ordering::Relaxed)) % 64;
        let gateway = Ipv4Addr::from(u32::from(Ipv4Addr::new(203, 0, 113, 0)) + n * 4 + 1);
        Self::at(&format!("{tag}{n}"), addr, gateway, 32)
    }

    fn at(name: &str, addr: Ipv4Addr, gateway: Ipv4Addr, prefix: u8) -> Option<TestHost> {
        if !nix::unistd::geteuid().is_root() || super::which("ip").is_none() {
            super::skip("test hosts", "network namespaces need root and iproute2");
            return None;
        }
        let link = format!("{name}h");
        // What an earlier, killed run left under these names.
        let _ = ip(&["netns", "delete", name]);
        let _ = ip(&["link", "delete", &link]);
        let made = (|| {
            ip(&["netns", "add", name])?;
            ip(&[
                "link", "add", &link, "type", "veth", "peer", "name", "eth0", "netns", name,
            ])?;
            ip(&["addr", "add", &format!("{gateway}/{prefix}"), "dev", &link])?;
            ip(&["link", "set", &link, "up"])?;
            if prefix == 32 {
                ip(&["route", "add", &format!("{addr}/32"), "dev", &link])?;
            }
            ip(&["-n", name, "link", "set", "lo", "up"])?;
            ip(&[
                "-n",
                name,
                "addr",
                "add",
                &format!("{addr}/{prefix}"),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", name, "link", "set", "eth0", "up"])?;
            if prefix == 32 {
                ip(&[
                    "-n",
                    name,
                    "route",
                    "add",
                    &format!("{gateway}/32"),
                    "dev",
                    "eth0",
                ])?;
            }
            ip(&[
                "-n",
                name,
                "route",
                "add",
                "default",
                "via",
                &gateway.to_string(),
            ])
        })();
        let host = TestHost {
            name: name.to_string(),
            link,
            addr,
            gateway,
        };
        match made {
            Ok(()) => Some(host),
            Err(why) => {
                drop(host);
                super::skip("test hosts", &why);
                None
            }
        }
    }

    /// A TCP listener on `port` (0: any) at the host's address, inside its namespace.
    pub fn listen(&self, port: u16) -> std::net::TcpListener {
        let addr = self.addr;
        self.inside(move || std::net::TcpListener::bind((addr, port)).unwrap())
    }

    /// A UDP socket on `port` at the host's address, inside its namespace.
    pub fn bind_udp(&self, port: u16) -> std::net::UdpSocket {
        let addr = self.addr;
        self.inside(move || std::net::UdpSocket::bind((addr, port)).unwrap())
    }

    /// What `make` makes, on a thread that entered the namespace and ends.
    fn inside<T: Send + 'static>(&self, make: impl FnOnce() -> T + Send + 'static) -> T {
        in_namespace(format!("/run/netns/{}", self.name).into(), make)
    }
}

/// What `make` makes, on a thread that entered the network namespace at `path` and ends.
pub fn in_namespace<T: Send + 'static>(
    path: std::path::PathBuf,
    make: impl FnOnce() -> T + Send + 'static,
) -> T {
    std::thread::spawn(move || {
        let ns = std::fs::File::open(path).unwrap();
        nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        make()
    })
    .join()
    .expect("made inside the namespace")
}

impl Drop for TestHost {
    fn drop(&mut self) {
        let _ = ip(&["netns", "delete", &self.name]);
        let _ = ip(&["link", "delete", &self.link]);
    }
}

/// The stand-in GitHub, also served on `internet` (port any), with its runners told to reach it
/// there: the daemon talks to it on loopback, runners in a job's namespace through the host.
pub fn standin_on(internet: &TestHost, job_ms: u64) -> github_standin::Standin {
    let listener = internet.listen(0);
    let port = listener.local_addr().unwrap().port();
    let standin = github_standin::Standin::start_also_on(
        github_standin::StandinConfig::default(),
        Some(listener),
    )
    .unwrap();
    standin.set_runner_url(&format!("http://{}:{port}", internet.addr));
    standin.set_behavior(github_standin::RunnerBehavior {
        job_ms,
        ..github_standin::RunnerBehavior::default()
    });
    standin
}
