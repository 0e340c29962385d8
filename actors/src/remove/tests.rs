use std::os::unix::fs::MetadataExt;

use super::*;

const BUDGET: Duration = Duration::from_secs(60);

/// A chain of `depth` nested directories under `top`, made through descriptors (a path this
/// deep is far over `PATH_MAX`, as a job's is).
fn chain(top: &Path, depth: usize) {
    std::fs::create_dir(top).unwrap();
    let mut fd = nix::fcntl::open(top, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty())
        .unwrap();
    for i in 0..depth {
        nix::sys::stat::mkdirat(&fd, "d", Mode::from_bits_truncate(0o755)).unwrap();
        if i % 1000 == 0 {
            let file = nix::fcntl::openat(
                &fd,
                "f",
                OFlag::O_CREAT | OFlag::O_WRONLY,
                Mode::from_bits_truncate(0o644),
            )
            .unwrap();
            drop(file);
        }
        fd = open_dir_at(&fd, OsStr::new("d")).unwrap();
    }
}

/// The job's attack: a tree deeper than any stack. The walk runs on a thread with a 128 KiB
/// stack (a recursive one needs about a frame a level and overflows within a few thousand).
#[test]
fn a_tree_deeper_than_any_stack_is_removed_on_a_small_one() {
    let tmp = tempfile::tempdir().unwrap();
    let top = tmp.path().join("deep");
    chain(&top, 20_000);
    let removed = std::thread::Builder::new()
        .stack_size(128 << 10)
        .spawn({
            let top = top.clone();
            move || remove_tree(&top, BUDGET)
        })
        .unwrap()
        .join()
        .expect("the walk overflowed its stack")
        .unwrap();
    assert_eq!(removed, 20_000 + 20 + 1, "every directory, every file, the top");
    assert!(!top.exists());
}

#[test]
fn a_wide_directory_goes_in_batches() {
    let tmp = tempfile::tempdir().unwrap();
    let top = tmp.path().join("wide");
    std::fs::create_dir(&top).unwrap();
    for i in 0..3000 {
        std::fs::write(top.join(format!("f{i}")), "x").unwrap();
        if i % 10 == 0 {
            std::fs::create_dir_all(top.join(format!("d{i}/inner"))).unwrap();
        }
    }
    assert_eq!(remove_tree(&top, BUDGET).unwrap(), 3000 + 300 * 2 + 1);
    assert!(!top.exists());
}

#[test]
fn links_inside_are_removed_never_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let (top, outside) = (tmp.path().join("job"), tmp.path().join("etc"));
    std::fs::create_dir_all(top.join("a/b")).unwrap();
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("passwd"), "root").unwrap();
    std::os::unix::fs::symlink(&outside, top.join("a/b/to-etc")).unwrap();
    std::os::unix::fs::symlink(&outside, top.join("to-etc")).unwrap();
    remove_tree(&top, BUDGET).unwrap();
    assert!(!top.exists());
    assert_eq!(std::fs::read_to_string(outside.join("passwd")).unwrap(), "root");
    // A symlink standing for the top is removed itself, its target left.
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(&outside, &link).unwrap();
    assert_eq!(remove_tree(&link, BUDGET).unwrap(), 1);
    assert!(outside.join("passwd").exists());
}

#[test]
fn a_missing_tree_is_removed_already_and_a_file_is_one_entry() {
    let tmp = tempfile::tempdir().unwrap();
    assert_eq!(remove_tree(&tmp.path().join("gone"), BUDGET).unwrap(), 0);
    assert_eq!(remove_tree(&tmp.path().join("gone/deeper"), BUDGET).unwrap(), 0);
    std::fs::write(tmp.path().join("f"), "x").unwrap();
    assert_eq!(remove_tree(&tmp.path().join("f"), BUDGET).unwrap(), 1);
}

/// Out of time: what was removed stays removed, the rest is named, and the next try ends it.
#[test]
fn the_deadline_stops_the_walk_and_the_next_try_finishes() {
    let tmp = tempfile::tempdir().unwrap();
    let top = tmp.path().join("deep");
    chain(&top, 2000);
    let err = remove_tree(&top, Duration::ZERO).unwrap_err();
    assert!(matches!(err, Unremoved::TimedOut { .. }), "{err}");
    assert!(err.to_string().contains("the next try"), "{err}");
    assert!(top.exists());
    remove_tree(&top, BUDGET).unwrap();
    assert!(!top.exists());
}

/// A mount point inside the tree (here a bind mount of a directory of the same filesystem,
/// which a device check alone misses) is left with what it holds; the rest goes.
#[test]
fn a_mount_point_inside_is_left_with_what_it_holds() {
    if !nix::unistd::geteuid().is_root() {
        return crate::test_support::skip("a mount inside a tree", "mounting needs root");
    }
    let tmp = tempfile::tempdir().unwrap();
    let (top, source) = (tmp.path().join("job"), tmp.path().join("precious"));
    std::fs::create_dir_all(top.join("a/mnt")).unwrap();
    std::fs::write(top.join("a/f"), "x").unwrap();
    std::fs::create_dir(&source).unwrap();
    std::fs::write(source.join("keep"), "mine").unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["--bind"])
        .arg(&source)
        .arg(top.join("a/mnt"))
        .status();
    if !mounted.is_ok_and(|s| s.success()) {
        return crate::test_support::skip("a mount inside a tree", "mount --bind failed here");
    }
    let err = remove_tree(&top, BUDGET).unwrap_err();
    let _ = std::process::Command::new("umount")
        .arg(top.join("a/mnt"))
        .status();
    assert!(err.to_string().contains("mount point"), "{err}");
    assert!(!top.join("a/f").exists(), "what is not the mount's went");
    assert_eq!(std::fs::read_to_string(source.join("keep")).unwrap(), "mine");
    remove_tree(&top, BUDGET).unwrap();
}

/// While root removes a tree, another user swaps a directory of it for a symlink to a place
/// holding a file: the file stays.
#[test]
fn a_directory_swapped_for_a_symlink_mid_walk_never_leads_the_walk_elsewhere() {
    let tmp = tempfile::tempdir().unwrap();
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::create_dir_all(elsewhere.join("d")).unwrap();
    let victim = elsewhere.join("d/victim");
    std::fs::write(&victim, "not the job's").unwrap();
    let until = Instant::now() + Duration::from_secs(1);
    let mut rounds = 0;
    while Instant::now() < until {
        let top = tmp.path().join(format!("job{rounds}"));
        std::fs::create_dir_all(top.join("a/b/c")).unwrap();
        let swap = crate::test_support::Swapper::start(
            top.join("a/b"),
            tmp.path().join(format!("parked{rounds}")),
            elsewhere.join("d"),
        );
        let _ = remove_tree(&top, BUDGET);
        drop(swap);
        assert!(victim.exists(), "the walk followed a swapped-in link");
        rounds += 1;
    }
    assert!(rounds > 10, "{rounds} rounds");
}

#[test]
fn owners_inside_do_not_matter_to_root() {
    if !nix::unistd::geteuid().is_root() {
        return crate::test_support::skip("another user's tree", "chown needs root");
    }
    let tmp = tempfile::tempdir().unwrap();
    let top = tmp.path().join("job");
    std::fs::create_dir_all(top.join("a/b")).unwrap();
    std::fs::write(top.join("a/b/f"), "x").unwrap();
    for p in ["a", "a/b", "a/b/f"] {
        std::os::unix::fs::chown(top.join(p), Some(65_534), Some(65_534)).unwrap();
    }
    // Not writable by anyone: root removes it anyway.
    std::fs::set_permissions(
        top.join("a/b"),
        std::os::unix::fs::PermissionsExt::from_mode(0o500),
    )
    .unwrap();
    assert_eq!(std::fs::metadata(top.join("a")).unwrap().uid(), 65_534);
    remove_tree(&top, BUDGET).unwrap();
    assert!(!top.exists());
}

#[test]
fn the_kernel_s_mount_table_is_read_with_its_escapes() {
    let table = "36 35 98:0 /mnt1 /mnt/parent\\040dir rw,noatime master:1 - ext3 /dev/root rw\n\
                 37 35 0:5 / /tmp rw - tmpfs tmpfs rw\n";
    assert_eq!(
        mount_points(table),
        vec![PathBuf::from("/mnt/parent dir"), PathBuf::from("/tmp")]
    );
}
