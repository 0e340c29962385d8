//! A job's egress, attacked from inside its namespace (as any kind's job would: a `local`
//! runner, a container or QEMU all sit in one): a stand-in "internet" serves DNS and a web
//! port at a TEST-NET-2 address, a second host nobody's answer names, a metadata service at
//! 169.254.169.254, and a service on this host. The job looks names up through whatever
//! resolver it names and connects; the daemon's forwarder and fence decide.

use std::{
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket},
    sync::Arc,
    time::Duration,
};

use ephemer_actors_core::{
    metrics::Metrics,
    netns::{Egress, JobNet},
};
use ephemer_decide::egress::{allow::Mode, dns, seen::Kind};

use crate::support::{self, netns::TestHost};

/// A TTL the stand-in's answers carry: shorter than any pin, so each pin lasts the floor.
const TTL: u32 = 1;

/// A DNS server at `host`'s address answering every A question with `answer`.
fn serve_dns(host: &TestHost, answer: Ipv4Addr) {
    let sock = host.bind_udp(53);
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = sock.recv_from(&mut buf) {
            let q = &buf[..n];
            let mut m = q.to_vec();
            m[2] = 0x81;
            m[3] = 0x80;
            m[6..8].copy_from_slice(&1u16.to_be_bytes());
            m.extend([0xC0, 0x0C, 0, 1, 0, 1]);
            m.extend(TTL.to_be_bytes());
            m.extend([0, 4]);
            m.extend(answer.octets());
            let _ = sock.send_to(&m, from);
        }
    });
}

/// A web port at `host` that says `hello` to whoever connects.
fn serve_web(host: &TestHost) {
    let listener = host.listen(80);
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let mut conn = conn;
            let _ = conn.write_all(b"hello");
        }
    });
}

/// What the job sees, from inside its namespace.
struct Inside(std::path::PathBuf);

impl Inside {
    /// `f`'s answer, from a thread that entered the namespace and ends (awaited: the daemon's
    /// forwarder serves on this test's runtime meanwhile).
    async fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = self.0.clone();
        tokio::task::spawn_blocking(move || support::netns::in_namespace(path, f))
            .await
            .unwrap()
    }

    /// The A records `resolver` gives for `name` (any resolver: the namespace sends every
    /// query to the forwarder), or its RCODE when it refuses.
    async fn lookup(
        &self,
        name: &'static str,
        resolver: &'static str,
    ) -> Result<Vec<Ipv4Addr>, u8> {
        self.run(move || {
            let sock = UdpSocket::bind("0.0.0.0:0").unwrap();
            sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            sock.send_to(&dns::query(7, name), (resolver, 53)).unwrap();
            let mut buf = [0u8; 512];
            let n = sock
                .recv(&mut buf)
                .unwrap_or_else(|e| panic!("no answer for {name} from {resolver}: {e}"));
            let rcode = buf[3] & 0x0F;
            if rcode != 0 {
                return Err(rcode);
            }
            Ok(dns::addresses(&buf[..n])
                .into_iter()
                .filter_map(|(ip, _)| match ip {
                    std::net::IpAddr::V4(a) => Some(a),
                    _ => None,
                })
                .collect())
        })
        .await
    }

    /// Whether a TCP connection to `addr` is made and says `hello` (or at least opens).
    async fn reaches(&self, addr: SocketAddr) -> bool {
        self.run(
            move || match TcpStream::connect_timeout(&addr, Duration::from_secs(3)) {
                Ok(mut s) => {
                    let _ = s.set_read_timeout(Some(Duration::from_secs(3)));
                    let mut got = [0u8; 5];
                    let _ = s.read(&mut got);
                    true
                }
                Err(_) => false,
            },
        )
        .await
    }
}

/// Dropped in this order: the metadata host before the lock that lets another test make one.
struct World {
    internet: TestHost,
    elsewhere: TestHost,
    _metadata: TestHost,
    host_port: u16,
    _host_listener: std::net::TcpListener,
    dir: tempfile::TempDir,
    _one_metadata_host: tokio::sync::MutexGuard<'static, ()>,
}

async fn world() -> Option<World> {
    let one_metadata_host = support::netns::METADATA.lock().await;
    let internet = TestHost::internet()?;
    let elsewhere = TestHost::internet()?;
    let metadata = TestHost::at_address("etm", Ipv4Addr::new(169, 254, 169, 254))?;
    serve_dns(&internet, internet.addr);
    serve_web(&internet);
    serve_web(&elsewhere);
    serve_web(&metadata);
    // A service of this host's, on every address (an admin API, say).
    let host_listener = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let host_port = host_listener.local_addr().unwrap().port();
    Some(World {
        internet,
        elsewhere,
        _metadata: metadata,
        host_port,
        _host_listener: host_listener,
        dir: tempfile::tempdir().unwrap(),
        _one_metadata_host: one_metadata_host,
    })
}

fn egress(mode: Mode, metrics: &Metrics, dir: &std::path::Path) -> Egress {
    let config = ephemer_actors_core::config::EgressConfig {
        mode,
        entries: vec!["allowed.test".into()],
        allow: ephemer_decide::egress::allow::AllowList::new(&["allowed.test".into()], None)
            .unwrap(),
        allow_private: Vec::new(),
    };
    Egress::of(
        &"egress-pool".into(),
        &config,
        Some(dir),
        Some(metrics.egress_refused.clone()),
    )
}

fn refused(metrics: &Metrics, kind: &str) -> f64 {
    metrics
        .registry()
        .gather()
        .iter()
        .filter(|f| f.name() == "ephemerd_egress_refused_total")
        .flat_map(|f| f.get_metric().iter())
        .filter(|m| {
            m.get_label()
                .iter()
                .any(|l| l.name() == "kind" && l.value() == kind)
        })
        .map(|m| m.get_counter().get_value())
        .sum()
}

/// The allow-list: an allowed name is answered and reached; a name not on it is refused
/// whatever resolver is asked; an address no allowed name resolved to is refused, as are the
/// metadata service and this host; an allowed name's address by literal after its pin ran out
/// is refused; each refusal is counted and told when the job is done.
#[actix_rt::test]
async fn an_allow_list_answers_and_pins_only_its_names_and_refuses_the_rest() {
    let Some(w) = world().await else { return };
    let metrics = Metrics::new();
    let upstreams = Arc::new(vec![SocketAddr::from((w.internet.addr, 53))]);
    let e = egress(Mode::AllowList, &metrics, w.dir.path());
    let mut net = match JobNet::create("egress-allow", w.dir.path(), e, upstreams).await {
        Ok(net) => net,
        Err(e) => return support::skip("egress", &e.to_string()),
    };
    let job = Inside(net.path());
    let web = |a: Ipv4Addr| SocketAddr::from((a, 80));

    assert_eq!(
        job.lookup("allowed.test", "127.0.0.53").await,
        Ok(vec![w.internet.addr])
    );
    assert!(
        job.reaches(web(w.internet.addr)).await,
        "an allowed name's address"
    );
    assert_eq!(
        job.lookup("blocked.test", "127.0.0.53").await,
        Err(5),
        "refused"
    );
    assert_eq!(
        job.lookup("blocked.test", "9.9.9.9").await,
        Err(5),
        "another resolver is the forwarder too"
    );
    assert!(
        !job.reaches(web(w.elsewhere.addr)).await,
        "an address no allowed name gave"
    );
    assert!(
        !job.reaches(web(Ipv4Addr::new(169, 254, 169, 254))).await,
        "the metadata service"
    );
    let gateway = net.slot().host_addr();
    assert!(
        !job.reaches(SocketAddr::from((gateway, w.host_port))).await,
        "this host"
    );
    assert!(
        !job.reaches(SocketAddr::from((Ipv4Addr::LOCALHOST, w.host_port)))
            .await,
        "loopback is the namespace's own"
    );

    // The pin lasts the floor (the answer's TTL is shorter); then the literal is refused.
    tokio::time::sleep(Duration::from_secs(
        ephemer_decide::egress::allow::PIN_MIN_SECS + 2,
    ))
    .await;
    assert!(
        !job.reaches(web(w.internet.addr)).await,
        "an allowed name's address after its pin ran out"
    );

    net.remove().await;
    let seen = net.seen();
    let what: Vec<(Kind, &str, bool)> = seen
        .rows()
        .iter()
        .map(|r| (r.kind, r.what.as_str(), r.audited))
        .collect();
    assert!(
        what.contains(&(Kind::Dns, "blocked.test", false)),
        "{what:?}"
    );
    let elsewhere = w.elsewhere.addr.to_string();
    assert!(
        what.contains(&(Kind::Connect, elsewhere.as_str(), false)),
        "{what:?}"
    );
    let internet = w.internet.addr.to_string();
    assert!(
        what.contains(&(Kind::Connect, internet.as_str(), false)),
        "the expired pin: {what:?}"
    );
    assert_eq!(refused(&metrics, "dns"), 2.0);
    assert!(refused(&metrics, "connect") >= 2.0);
    // Its chain and sets are gone with it.
    let table = std::process::Command::new("nft")
        .args(["list", "table", "inet", "ephemer"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        !table.contains(&format!("job_{} ", net.slot().0)),
        "{table}"
    );
}

/// Audit mode blocks nothing the fence does not, and records what the list would refuse: the
/// name in the pool's audit log and the job's timeline, the address it then reached too.
#[actix_rt::test]
async fn audit_mode_lets_a_refused_name_through_and_reports_it() {
    let Some(w) = world().await else { return };
    let metrics = Metrics::new();
    let upstreams = Arc::new(vec![SocketAddr::from((w.internet.addr, 53))]);
    let e = egress(Mode::Audit, &metrics, w.dir.path());
    let mut net = match JobNet::create("egress-audit", w.dir.path(), e, upstreams).await {
        Ok(net) => net,
        Err(e) => return support::skip("egress", &e.to_string()),
    };
    let job = Inside(net.path());
    assert_eq!(
        job.lookup("blocked.test", "127.0.0.53").await,
        Ok(vec![w.internet.addr])
    );
    assert!(
        job.reaches(SocketAddr::from((w.internet.addr, 80))).await,
        "the address a refused name gave is reached, unpinned"
    );
    assert!(
        job.reaches(SocketAddr::from((w.elsewhere.addr, 80))).await,
        "audit refuses nothing"
    );
    assert!(
        !job.reaches(SocketAddr::from((Ipv4Addr::new(169, 254, 169, 254), 80)))
            .await,
        "the fence still holds"
    );
    net.remove().await;
    let seen = net.seen();
    assert!(seen.rows().iter().all(|r| r.audited), "{seen}");
    assert!(
        seen.to_string()
            .contains("an allow-list would refuse dns blocked.test"),
        "{seen}"
    );
    assert!(
        seen.to_string().contains(&w.elsewhere.addr.to_string()),
        "{seen}"
    );
    assert!(
        seen.to_string().contains(&w.internet.addr.to_string()),
        "a refused name's answer takes no pin, so where it led is recorded: {seen}"
    );
    assert_eq!(refused(&metrics, "dns"), 0.0, "nothing was refused");
    let log = std::fs::read_to_string(w.dir.path().join("egress-pool.log")).unwrap();
    assert!(log.lines().any(|l| l.ends_with(" 1 blocked.test")), "{log}");
}

/// The host's allowances for the slot of the namespace at `path` (read back from `nft`).
fn allowances(path: &std::path::Path) -> Vec<String> {
    let slot = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(ephemer_decide::egress::Slot::of_netns)
        .expect("a job namespace");
    let out = std::process::Command::new("nft")
        .args(ephemer_decide::egress::LIST_ALLOWED_ARGS)
        .output()
        .expect("nft");
    ephemer_decide::egress::allowances_in(&String::from_utf8_lossy(&out.stdout), slot)
}

/// A pool's `allow_private` allowance ends with its job, even when the job's daemon did not
/// end it: a slot reaped after a crash takes every allowance it held away, and a slot taken
/// again after its namespace vanished (removed by hand) starts with none of the last job's.
#[actix_rt::test]
async fn a_private_allowance_does_not_outlive_its_job_across_a_crash() {
    let Some(w) = world().await else { return };
    let upstreams = Arc::new(vec![SocketAddr::from((w.internet.addr, 53))]);
    let private = |ranges: &[&str]| Egress {
        allow_private: ranges.iter().map(|r| r.to_string()).collect(),
        ..Egress::open(&"egress-pool".into())
    };
    let name = format!("egress-crash-{}", std::process::id());

    // A daemon that dies with its job's namespace standing; its owner gone, the reap runs.
    let owner = tempfile::tempdir().unwrap();
    let crashed = match JobNet::create(
        &name,
        owner.path(),
        private(&["10.20.0.0/16"]),
        upstreams.clone(),
    )
    .await
    {
        Ok(net) => net,
        Err(e) => return support::skip("egress", &e.to_string()),
    };
    let path = crashed.path();
    let slot = crashed.slot();
    assert_eq!(allowances(&path), ["10.20.0.0/16"]);
    drop(crashed);
    drop(owner);
    assert!(ephemer_actors_core::netns::reap_orphans().await >= 1);
    assert!(!path.exists());
    assert!(
        allowances(&path).is_empty(),
        "the reap forgot the slot's allowance"
    );
    // The kernel ends a namespace's links a moment after its last user.
    let link_gone = || async {
        for _ in 0..100 {
            let shown = std::process::Command::new("ip")
                .args(["link", "show", &slot.host_if()])
                .output()
                .unwrap();
            if !shown.status.success() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{} outlived its namespace", slot.host_if());
    };
    link_gone().await;

    // The namespace removed by hand, its allowance left: the next job on the slot has none.
    let first = JobNet::create(
        &name,
        w.dir.path(),
        private(&["10.20.0.0/16", "10.30.0.0/16"]),
        upstreams.clone(),
    )
    .await
    .unwrap();
    let path = first.path();
    drop(first);
    let gone = std::process::Command::new("ip")
        .args([
            "netns",
            "delete",
            path.file_name().unwrap().to_str().unwrap(),
        ])
        .status()
        .unwrap();
    assert!(gone.success());
    assert_eq!(
        allowances(&path).len(),
        2,
        "left behind, as a crash leaves it"
    );
    link_gone().await;
    let mut next = JobNet::create(&name, w.dir.path(), private(&[]), upstreams)
        .await
        .unwrap();
    assert_eq!(next.path(), path, "the same slot, taken again");
    assert!(
        allowances(&path).is_empty(),
        "a pool without allow_private gets none of the last job's"
    );
    next.remove().await;
}
