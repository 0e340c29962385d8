//! A `vm_macos` pool's warm VMs, against the stand-in `tart` and `ssh` with a 2 s boot: a VM
//! booted and reachable before the claim, the runner started in it over ssh with its config on
//! stdin at the claim, the VM (under its own name) stopped and deleted at the end.

use std::{
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use actix::{Actor, Context, Handler};
use ephemer_actors_core::{
    config::{HostKeys, WarmConfig},
    provision::{
        Provision, RunnerEventKind,
        warm::{WarmSettings, WarmStatus},
    },
};

/// Keeps the pool's latest count of warm VMs ready for a claim.
struct Ready(Arc<AtomicUsize>);

impl Actor for Ready {
    type Context = Context<Self>;
}

impl Handler<WarmStatus> for Ready {
    type Result = ();
    fn handle(&mut self, m: WarmStatus, _: &mut Context<Self>) {
        self.0.store(m.view.available, Ordering::SeqCst);
    }
}

use crate::{
    provision::fake_runner,
    support::provision::{eventually, spec, supervise_warm, wait_clean_exit},
    tart::{GUEST, calls, tart_fixture},
};

/// The stand-in `tart` of `dir`, whose VMs take `boot` to report an address.
fn slow_boot(dir: &Path, boot: Duration) {
    let tart = dir.join("tart");
    let text = std::fs::read_to_string(&tart).unwrap().replace(
        "  ip) if",
        &format!("  ip) sleep {}; if", boot.as_secs_f64()),
    );
    std::fs::write(&tart, text).unwrap();
}

/// Provision to runner started, with `warm` VMs kept (after letting them boot).
async fn pickup(dir: &Path, warm: usize, runner: &str) -> Duration {
    let backend = tart_fixture(dir, &GUEST, HostKeys::Image);
    slow_boot(dir, Duration::from_secs(2));
    let settings = WarmSettings {
        config: WarmConfig {
            min: warm,
            ..WarmConfig::default()
        },
        max: 2,
        prefix: "ephemer-vm-macos-abc".into(),
        report: None,
    };
    let ready = Arc::new(AtomicUsize::new(0));
    let watch = Ready(ready.clone()).start();
    let settings = WarmSettings {
        report: Some(watch.downgrade().recipient()),
        ..settings
    };
    let (sup, events) = supervise_warm(backend, None, Some(settings));
    if warm > 0 {
        // Ready for a claim: booted, reachable and its host key pinned.
        eventually("a warm VM ready", Duration::from_secs(20), || {
            ready.load(Ordering::SeqCst) >= 1
        })
        .await;
    } else {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let runner = fake_runner(runner);
    let asked = std::time::Instant::now();
    sup.send(Provision::now(spec(&runner, 1))).await.unwrap();
    events
        .wait_for(&runner.name, Duration::from_secs(20), |k| {
            matches!(k, RunnerEventKind::Started { .. })
        })
        .await;
    let took = asked.elapsed();
    wait_clean_exit(&events, &runner.name, Duration::from_secs(20)).await;
    took
}

#[actix_rt::test]
async fn a_warm_vm_takes_the_runner_at_once_and_goes_under_its_own_name() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let warm = pickup(dir, 1, "ephemer-vm-macos-warm1234").await;
    let c = calls(dir);
    let vm = c
        .iter()
        .find_map(|l| l.strip_prefix("tart clone ghcr.io/cirruslabs/macos-base:latest "))
        .expect("a VM cloned")
        .to_string();
    assert!(vm.starts_with("ephemer-vm-macos-abc-warm-"), "{vm}");
    let ssh = c.iter().position(|l| l.starts_with("ssh ")).unwrap();
    let booted = c
        .iter()
        .position(|l| *l == format!("tart ip --wait 120 {vm}"))
        .unwrap();
    assert!(booted < ssh, "booted before the claim: {c:#?}");
    assert!(
        !c.iter()
            .any(|l| l.contains("clone") && l.contains("warm1234")),
        "no VM cloned for the runner itself: {c:#?}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("ssh-stdin")).unwrap(),
        "\njit",
        "the JIT config on stdin at the claim"
    );
    eventually(
        "the VM is stopped and deleted",
        Duration::from_secs(10),
        || {
            let c = calls(dir);
            c.contains(&format!("tart stop --timeout 30 {vm}"))
                && c.contains(&format!("tart delete {vm}"))
        },
    )
    .await;

    let tmp = tempfile::tempdir().unwrap();
    let cold = pickup(tmp.path(), 0, "ephemer-vm-macos-cold1234").await;
    println!("tart pickup (2 s boot): warm {warm:?}, cold {cold:?}");
    assert!(cold >= Duration::from_secs(2), "{cold:?}");
    assert!(warm < cold, "warm {warm:?} against cold {cold:?}");
}
