//! What a job's network costs (root only): a namespace with its veth pair, its fence entries,
//! its chain and its forwarder made and removed, per job, open and allow-list; and the
//! forwarder's cost per lookup, from inside the namespace: a name refused (no upstream), an
//! allowed one (asked upstream, its address pinned with `nft` before the answer goes back),
//! and one in an open pool (asked upstream only). The upstream is a stub on this host's
//! loopback that answers at once, so the figures are the daemon's own.

use std::{
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    sync::Arc,
    time::{Duration, Instant},
};

use ephemer_actors_core::netns::{Egress, JobNet};
use ephemer_decide::egress::{
    allow::{AllowList, Mode},
    dns,
};

const JOBS: usize = 30;
const LOOKUPS: usize = 300;

/// p50 and p90 of `v`.
fn p50_p90(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |p: f64| v[((v.len() as f64 - 1.0) * p).round() as usize];
    (at(0.5), at(0.9))
}

fn egress(mode: Mode) -> Egress {
    let mut e = Egress::open(&"bench".into());
    e.mode = mode;
    e.allow = Arc::new(AllowList::new(&["allowed.test".into()], None).unwrap());
    e
}

/// A DNS stub on loopback answering every question with one A record.
fn stub() -> SocketAddr {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = sock.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = sock.recv_from(&mut buf) {
            let mut m = buf[..n].to_vec();
            m[2] = 0x81;
            m[3] = 0x80;
            m[6..8].copy_from_slice(&1u16.to_be_bytes());
            m.extend([0xC0, 0x0C, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 198, 51, 100, 7]);
            let _ = sock.send_to(&m, from);
        }
    });
    addr
}

/// `LOOKUPS` lookups of `name` from inside the namespace at `path`, each timed (ms).
async fn lookups(path: std::path::PathBuf, name: &'static str) -> Vec<f64> {
    tokio::task::spawn_blocking(move || {
        std::thread::spawn(move || {
            enter(&path);
            let sock = UdpSocket::bind("0.0.0.0:0").unwrap();
            sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut buf = [0u8; 512];
            (0..LOOKUPS)
                .map(|i| {
                    let t = Instant::now();
                    sock.send_to(
                        &dns::query(i as u16, name),
                        (Ipv4Addr::new(127, 0, 0, 1), 53),
                    )
                    .unwrap();
                    sock.recv(&mut buf).expect("an answer");
                    t.elapsed().as_secs_f64() * 1e3
                })
                .collect()
        })
        .join()
        .unwrap()
    })
    .await
    .unwrap()
}

/// Moves this thread into the namespace at `path`.
#[cfg(target_os = "linux")]
fn enter(path: &std::path::Path) {
    let ns = std::fs::File::open(path).unwrap();
    nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
}

/// Namespaces are Linux's: the section says so and measures nothing elsewhere.
#[cfg(not(target_os = "linux"))]
fn enter(_path: &std::path::Path) {
    unreachable!("the section returns before any lookup off Linux")
}

/// The section: prints its table rows.
pub async fn egress_costs() {
    println!("\n## A job's network\n");
    if !cfg!(target_os = "linux") || !nix::unistd::geteuid().is_root() {
        println!("(skipped: a job's namespace needs Linux and root)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let upstreams = Arc::new(vec![stub()]);
    println!("| per job, {JOBS} jobs one after another | p50 | p90 |");
    println!("|---|---|---|");
    for mode in [Mode::Open, Mode::AllowList] {
        let (mut made, mut gone) = (Vec::new(), Vec::new());
        for i in 0..JOBS {
            let t = Instant::now();
            let mut net = JobNet::create(
                &format!("bench-{i}"),
                dir.path(),
                egress(mode),
                upstreams.clone(),
            )
            .await
            .expect("a namespace");
            made.push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            net.remove().await;
            gone.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let ((m50, m90), (g50, g90)) = (p50_p90(made), p50_p90(gone));
        let mode = mode.as_str();
        println!(
            "| `{mode}`: namespace, veth, fence, chain and forwarder made (before the runner starts) | {m50:.1} ms | {m90:.1} ms |"
        );
        println!(
            "| `{mode}`: removed (refused addresses read first) | {g50:.1} ms | {g90:.1} ms |"
        );
    }
    println!(
        "\n| per lookup, {LOOKUPS} from inside the namespace, upstream a loopback stub | p50 | p90 |"
    );
    println!("|---|---|---|");
    for (mode, name, what) in [
        (
            Mode::AllowList,
            "blocked.test",
            "`allow-list`, a name not on the list (answered REFUSED)",
        ),
        (
            Mode::AllowList,
            "allowed.test",
            "`allow-list`, an allowed name (asked upstream, its address pinned first)",
        ),
        (
            Mode::Audit,
            "blocked.test",
            "`audit`, a name the list would refuse (asked and logged, not pinned)",
        ),
        (Mode::Open, "any.test", "`open` (asked upstream only)"),
    ] {
        let mut net = JobNet::create("bench-lookups", dir.path(), egress(mode), upstreams.clone())
            .await
            .expect("a namespace");
        let (p50, p90) = p50_p90(lookups(net.path(), name).await);
        net.remove().await;
        println!("| {what} | {p50:.2} ms | {p90:.2} ms |");
    }
}
